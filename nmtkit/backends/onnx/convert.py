"""An nmtkit Transformer as two ONNX graphs: the encoder, and one decoder step with its caches.

Why the graphs are built node by node (`onnx.helper`) rather than traced by `torch.onnx.export`:
decoding needs a step function whose caches are plain inputs and outputs, which a trace of the
model's Python-side `DecoderCache` cannot give, and the TorchScript exporter is deprecated while
its successor needs extra packages. Built here from the weights, each graph is what
docs/export.md documents, with stable input and output names that any ONNX Runtime binding
(C, C++, C#, Java, JavaScript, Rust) can feed.

The graphs (opset `OPSET`; B sentences, S source positions with `</s>`, N = M * g decoder rows,
g per sentence, T target positions decoded so far; L decoder layers, h heads):

    encoder.onnx   src_tokens (B, S) int64, each row `ids + [</s>]` right-padded with <pad>
                -> src_bias (B, 1, 1, S) float32   0 for a token, -inf for padding
                   cross_k_i (B, h, S, d_k), cross_v_i (B, h, S, d_v)   for i < L: each decoder
                   layer's encoder-decoder keys and values, computed once per sentence
    decoder.onnx   tokens (N, 1) int64 (the newest target token, `<s>` first), src_bias (M, 1, 1, S),
                   self_k_i (N, h, T, d_k), self_v_i (N, h, T, d_v) (T = 0 at the first step),
                   cross_k_i (M, h, S, d_k), cross_v_i (M, h, S, d_v)
                -> log_probs (N, V) float32 (log-softmax of the next token),
                   self_k_out_i (N, h, T + 1, d_k), self_v_out_i (N, h, T + 1, d_v)

An export made with `--shortlist FILE` has one more decoder input, last: `out_proj_weight`
(D, "vocab") float32, the output layer's weight (transposed), whose initializer is the whole
(D, V) matrix. Not fed, the step is the one above; fed the columns of C candidate ids (D, C), it
computes C logits instead of V and log_probs is (N, C), the log-softmax over those C only (as
Marian and CTranslate2 normalise a shortlist; the engine feeds every candidate but <pad>, which
`nmtkit.search.vocab` keeps at -inf). Only such an export has the input: ONNX Runtime does not
pre-pack a weight that can be fed (measured: the full-vocabulary step a little slower).

The token's position is T (read from self_k_0's shape). Decoder rows come in groups of g per
encoder row (rows r*g .. r*g + g - 1 read encoder row r: a sentence's beams share one copy of
its keys and values, as nmtkit's own cache does); g = 1 gives one encoder row per decoder row.
The queries are pre-scaled by 1/sqrt(d_k) in their projection weights. LayerNorm epsilon is
torch's 1e-5.

`--quantization int8` quantizes the weight matrices' products (MatMul with a constant weight)
with ONNX Runtime's dynamic quantization (`onnxruntime.quantization.quantize_dynamic`: int8
weights, activations quantized per call); the attention products stay float32, and so does a
shortlist export's output layer (its weight is an input, fed per batch).

The export checks itself before the directory is renamed into place: ONNX Runtime on the written
graphs, stepping through a few sentences with its caches, must give torch's teacher-forced
log-probabilities within `TOLERANCE` (float32), or `INT8_TOLERANCE` for int8 graphs; with a
shortlist, a step over some of the output layer's columns must also give the full step's
columns renormalised over them, within `TOLERANCE`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from nmtkit.backends.onnx.engine import (
    DECODER_FILE, ENCODER_FILE, INSTALL_HINT, OUTPUT_WEIGHT, Graphs, import_onnxruntime, read_output_weight,
)
from nmtkit.errors import UserError

SHORTLIST_FILE = "shortlist.txt"  # an export's lexical shortlist (`nmtkit export --shortlist`)
QUANTIZATIONS = ("float32", "int8")  # `nmtkit export --format onnx --quantization`
OPSET = 17  # LayerNormalization is an operator from opset 17
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which nmtkit's model uses
PAD, BOS, EOS = 0, 1, 2  # docs/internals.md: the Dictionary's reserved ids
# the self-check: the largest |log-prob difference| against torch on the check sentences
TOLERANCE = 1e-3
INT8_TOLERANCE = 1.0  # on the reference's own tokens (int8 weights move log-probs by a few tenths)

HANDLED_FIELDS = frozenset({
    "encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "d_k", "d_v", "normalize_before",
    "learned_pos", "share_embeddings", "max_source_positions", "max_target_positions",
    # imported models: the FFN's activation, biases on the attention projections, the sinusoid
    # table (exported as it is), decoding started from </s>
    "activation", "attention_bias", "sinusoid", "decoder_start",
    # the encoder layer without a residual around its self-attention
    "encoder_no_residual_layer",
    # training-only: no effect on the exported weights or on inference
    "dropout", "attention_dropout", "activation_dropout", "label_smoothing", "warmup_steps",
})


def import_runtime():
    """onnx (to write the graphs) and onnxruntime (to check and quantize them), or one line."""
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise UserError(f"the onnx package is not installed: {INSTALL_HINT}") from None
    return import_onnxruntime()


def check_representable(cfg) -> None:
    """Refuse, in one line naming the setting, an architecture the graphs cannot express (an
    `ArchConfig` field added later, unless it has its default value)."""
    from nmtkit.models.registry import refuse_unhandled

    refuse_unhandled(cfg, HANDLED_FIELDS, "ONNX")


# ---- the weights, as numpy ------------------------------------------------------------------------


def _np(t) -> np.ndarray:
    return t.detach().to("cpu").float().contiguous().numpy().copy()


def _norm(ln) -> tuple[np.ndarray, np.ndarray]:
    return _np(ln.weight), _np(ln.bias)


def _bias(linear, scaled_rows: int = 0, scale: float = 1.0) -> np.ndarray | None:
    """A projection's bias (`attention_bias`, imported models), its first rows scaled as the weight's."""
    if linear.bias is None:
        return None
    b = _np(linear.bias)
    b[:scaled_rows] *= np.float32(scale)
    return b


def _self_attention(attn, dk: int) -> dict:
    """Fused q|k|v (h*d_k | h*d_k | h*d_v, D) with the q rows (and their biases) scaled by 1/sqrt(d_k)."""
    scale = 1.0 / math.sqrt(dk)
    qkv = _np(attn.qkv_proj.weight)
    qkv[: attn.heads * dk] *= np.float32(scale)
    return {"qkv": (qkv, _bias(attn.qkv_proj, attn.heads * dk, scale)),
            "out": (_np(attn.out_proj.weight), _bias(attn.out_proj))}


def _layer(layer, dk: int, decoder: bool) -> dict:
    w = {**_self_attention(layer.self_attn, dk), "ln_self": _norm(layer.self_attn_norm),
         "fc1": (_np(layer.ffn.fc1.weight), _np(layer.ffn.fc1.bias)),
         "fc2": (_np(layer.ffn.fc2.weight), _np(layer.ffn.fc2.bias)), "ln_ffn": _norm(layer.ffn_norm)}
    if decoder:
        ca, scale = layer.cross_attn, 1.0 / math.sqrt(dk)
        w.update(q=(_np(ca.q_proj.weight) * np.float32(scale), _bias(ca.q_proj, ca.q_proj.out_features, scale)),
                 kv=(_np(ca.kv_proj.weight), _bias(ca.kv_proj)),
                 cross_out=(_np(ca.out_proj.weight), _bias(ca.out_proj)), ln_cross=_norm(layer.cross_attn_norm))
    return w


def weights(model) -> dict:
    """A loaded `Transformer`'s weights as float32 numpy arrays (torch's (out, in) layout); each
    projection of an attention is a (weight, bias or None) pair."""
    cfg = model.cfg
    dk = cfg.head_dim_k
    pos = [_np(p.weight if p.learned else p.table) for p in (model.src_pos, model.tgt_pos)]
    return {
        "src_embed": _np(model.src_embed.weight), "tgt_embed": _np(model.tgt_embed.weight),
        "out_proj": _np(model.out_proj.weight), "src_pos": pos[0], "tgt_pos": pos[1],
        "enc": [_layer(layer, dk, False) for layer in model.encoder_layers],
        "dec": [_layer(layer, dk, True) for layer in model.decoder_layers],
        "enc_norm": _norm(model.encoder_norm) if cfg.normalize_before else None,
        "dec_norm": _norm(model.decoder_norm) if cfg.normalize_before else None,
    }


# ---- building graphs ------------------------------------------------------------------------------


class _Graph:
    """Nodes and initializers of one graph, with the few layer shapes the model is made of."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.h, self.dk, self.dv = cfg.heads, cfg.head_dim_k, cfg.head_dim_v
        self.nodes: list = []
        self.inits: list = []
        self._n = 0
        self._scalars: dict[str, str] = {}

    def const(self, name: str, value) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def scalar(self, name: str, value: float) -> str:
        """A float32 scalar initializer, made once per name."""
        if name not in self._scalars:
            self._scalars[name] = self.const(name, np.float32(value))
        return self._scalars[name]

    def ints(self, *values: int) -> str:
        self._n += 1
        return self.const(f"ints_{self._n}", np.array(values, dtype=np.int64))

    def op(self, kind: str, *inputs: str, out: str | None = None, outs: int = 1, tag: str = "", **attrs):
        """Add one node; its output name(s) (`out` names a graph output)."""
        from onnx import helper

        self._n += 1
        name = f"{tag or kind}_{self._n}"
        names = [out or name] if outs == 1 else [f"{name}_{i}" for i in range(outs)]
        self.nodes.append(helper.make_node(kind, list(inputs), names, name=name, **attrs))
        return names[0] if outs == 1 else names

    def linear(self, x: str, w, name: str, bias: np.ndarray | None = None) -> str:
        """x (..., in) @ w.T (+ bias): w in torch's (out, in) layout, or a (weight, bias) pair."""
        if isinstance(w, tuple):
            w, bias = w
        y = self.op("MatMul", x, self.const(name, w.T), tag="proj")
        return y if bias is None else self.op("Add", y, self.const(name + ".bias", bias))

    def norm(self, x: str, ln, name: str) -> str:
        return self.op("LayerNormalization", x, self.const(name + ".weight", ln[0]),
                       self.const(name + ".bias", ln[1]), axis=-1, epsilon=LAYER_NORM_EPS)

    def heads(self, x: str, d: int, out: str | None = None) -> str:
        """(B, T, h*d) -> (B, h, T, d)."""
        return self.op("Transpose", self.op("Reshape", x, self.ints(0, 0, self.h, d)), perm=[0, 2, 1, 3], out=out)

    def attend(self, q: str, k: str, v: str, bias: str | None) -> str:
        """softmax(q k^T + bias) v over the last two axes (q already scaled): (.., Tq, d_v)."""
        scores = self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2]), tag="attn")
        if bias is not None:
            scores = self.op("Add", scores, bias)
        return self.op("MatMul", self.op("Softmax", scores, axis=-1), v, tag="attn")

    def sublayer(self, x: str, ln, name: str, body, residual: bool = True) -> str:
        """Residual around `body` (unless `residual` is False: `encoder_no_residual_layer`),
        LayerNorm after the sum (post-norm) or before body (pre-norm)."""
        if self.cfg.normalize_before:
            y = body(self.norm(x, ln, name))
            return self.op("Add", x, y) if residual else y
        y = body(x)
        return self.norm(self.op("Add", x, y) if residual else y, ln, name)

    def activation(self, x: str) -> str:
        """The FFN's activation (`ArchConfig.activation`): ReLU; SiLU = x sigmoid(x); exact GELU =
        x (1 + erf(x / sqrt 2)) / 2, as torch's (opset 17 has no Gelu operator)."""
        kind = self.cfg.activation
        if kind == "relu":
            return self.op("Relu", x)
        if kind == "swish":
            return self.op("Mul", x, self.op("Sigmoid", x))
        if kind == "gelu":
            erf = self.op("Erf", self.op("Mul", x, self.scalar("gelu.rsqrt2", 1.0 / math.sqrt(2.0))))
            return self.op("Mul", self.op("Mul", x, self.scalar("gelu.half", 0.5)),
                           self.op("Add", erf, self.scalar("gelu.one", 1.0)))
        raise UserError(f"--activation {kind}: the ONNX export does not represent this activation")

    def ffn(self, x: str, w: dict, name: str) -> str:
        hid = self.activation(self.linear(x, w["fc1"][0], name + ".fc1", w["fc1"][1]))
        return self.linear(hid, w["fc2"][0], name + ".fc2", w["fc2"][1])

    def split_qkv(self, x: str, w, name: str) -> list[str]:
        hk, hv = self.h * self.dk, self.h * self.dv
        return self.op("Split", self.linear(x, w, name), self.ints(hk, hk, hv), axis=-1, outs=3)

    def model(self, name: str, inputs: list, outputs: list):
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 producer_name="nmtkit")


def _io(name: str, dtype, *dims):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.INT64 if dtype == "int64" else TensorProto.FLOAT,
                                         list(dims))


def _embed(g: _Graph, tokens: str, table: np.ndarray, name: str, positions: str) -> str:
    x = g.op("Gather", g.const(name, table), tokens)
    return g.op("Add", g.op("Mul", x, g.const(name + ".scale", np.float32(math.sqrt(g.cfg.d_model)))), positions)


def build_encoder(w: dict, cfg, pad: int):
    """encoder.onnx: src_tokens -> src_bias and every decoder layer's cross_k_i / cross_v_i."""
    g = _Graph(cfg)
    length = g.op("Slice", g.op("Shape", "src_tokens"), g.ints(1), g.ints(2))  # (1,) S
    pos = g.op("Slice", g.const("src_pos", w["src_pos"]), g.ints(0), length, g.ints(0))  # (S, D)
    x = _embed(g, "src_tokens", w["src_embed"], "src_embed", pos)  # (B, S, D)
    is_pad = g.op("Equal", "src_tokens", g.const("pad", np.array(pad, dtype=np.int64)))
    bias = g.op("Where", is_pad, g.const("neg_inf", np.float32(-np.inf)), g.const("zero", np.float32(0)))
    bias = g.op("Unsqueeze", bias, g.ints(1, 2), out="src_bias")  # (B, 1, 1, S)
    for i, lw in enumerate(w["enc"]):
        def self_attn(y, lw=lw, i=i):
            q, k, v = (g.heads(t, d) for t, d in zip(g.split_qkv(y, lw["qkv"], f"enc.{i}.qkv"), (g.dk, g.dk, g.dv)))
            o = g.op("Reshape", g.op("Transpose", g.attend(q, k, v, bias), perm=[0, 2, 1, 3]),
                     g.ints(0, 0, g.h * g.dv))
            return g.linear(o, lw["out"], f"enc.{i}.out")
        x = g.sublayer(x, lw["ln_self"], f"enc.{i}.ln_self", self_attn,
                       residual=i + 1 != cfg.encoder_no_residual_layer)
        x = g.sublayer(x, lw["ln_ffn"], f"enc.{i}.ln_ffn", lambda y, lw=lw, i=i: g.ffn(y, lw, f"enc.{i}"))
    if w["enc_norm"] is not None:
        x = g.norm(x, w["enc_norm"], "enc.norm")
    outputs = [_io("src_bias", "float", "batch", 1, 1, "src_len")]
    for i, lw in enumerate(w["dec"]):
        k, v = g.op("Split", g.linear(x, lw["kv"], f"dec.{i}.kv"), g.ints(g.h * g.dk, g.h * g.dv), axis=-1, outs=2)
        g.heads(k, g.dk, out=f"cross_k_{i}")
        g.heads(v, g.dv, out=f"cross_v_{i}")
        outputs += [_io(f"cross_k_{i}", "float", "batch", g.h, "src_len", g.dk),
                    _io(f"cross_v_{i}", "float", "batch", g.h, "src_len", g.dv)]
    return g.model("nmtkit_encoder", [_io("src_tokens", "int64", "batch", "src_len")], outputs)


def _decoder_layer(g: _Graph, x: str, lw: dict, i: int, group_shape: str) -> str:
    """One decoder layer for the newest position: x (N, 1, D) -> (N, 1, D); appends to the caches."""
    def self_attn(y):
        q, k, v = g.split_qkv(y, lw["qkv"], f"dec.{i}.qkv")
        k_all = g.op("Concat", f"self_k_{i}", g.heads(k, g.dk), axis=2, out=f"self_k_out_{i}")  # (N, h, T+1, d_k)
        v_all = g.op("Concat", f"self_v_{i}", g.heads(v, g.dv), axis=2, out=f"self_v_out_{i}")
        o = g.attend(g.heads(q, g.dk), k_all, v_all, None)  # (N, h, 1, d_v)
        return g.linear(g.op("Reshape", g.op("Transpose", o, perm=[0, 2, 1, 3]), g.ints(0, 0, g.h * g.dv)),
                        lw["out"], f"dec.{i}.out")

    def cross_attn(y):
        q = g.op("Transpose", g.op("Reshape", g.linear(y, lw["q"], f"dec.{i}.q"), group_shape),
                 perm=[0, 2, 1, 3])  # (M, h, g, d_k): the g rows of an encoder row as one query block
        o = g.attend(q, f"cross_k_{i}", f"cross_v_{i}", "src_bias")  # (M, h, g, d_v)
        o = g.op("Reshape", g.op("Transpose", o, perm=[0, 2, 1, 3]), g.ints(-1, 1, g.h * g.dv))  # (N, 1, h*d_v)
        return g.linear(o, lw["cross_out"], f"dec.{i}.cross_out")

    x = g.sublayer(x, lw["ln_self"], f"dec.{i}.ln_self", self_attn)
    x = g.sublayer(x, lw["ln_cross"], f"dec.{i}.ln_cross", cross_attn)
    return g.sublayer(x, lw["ln_ffn"], f"dec.{i}.ln_ffn", lambda y: g.ffn(y, lw, f"dec.{i}"))


def _output(g: _Graph, x: str, weight: np.ndarray, shortlist: bool) -> str:
    """x (N, 1, D) -> log_probs (N, V); with `shortlist`, over the columns fed as `OUTPUT_WEIGHT`."""
    if not shortlist:
        logits = g.op("Reshape", g.linear(x, weight, "out_proj"), g.ints(-1, weight.shape[0]))
    else:  # (a MatMul: the int8 pass turns a Gemm into a MatMul with a constant copy of the weight)
        states = g.op("Reshape", x, g.ints(-1, weight.shape[1]))  # (N, D)
        logits = g.op("MatMul", states, g.const(OUTPUT_WEIGHT, weight.T), tag="out_proj")  # (N, V | C)
    return g.op("LogSoftmax", logits, axis=-1, out="log_probs")


def build_decoder(w: dict, cfg, bos: int, eos: int, shortlist: bool = False):
    """decoder.onnx: one step (see the module docstring); with `shortlist`, its output layer's
    weight is also an input."""
    g = _Graph(cfg)
    step = g.op("Gather", g.op("Shape", "self_k_0"), g.const("time_axis", np.array(2, dtype=np.int64)))
    pos = g.op("Gather", g.const("tgt_pos", w["tgt_pos"]), step)  # (D,): position T
    tokens = "tokens"
    if cfg.decoder_start == "eos":  # (fairseq) <s> is read as </s>, as Transformer._start does
        tokens = g.op("Where", g.op("Equal", tokens, g.const("bos", np.array(bos, dtype=np.int64))),
                      g.const("eos", np.array(eos, dtype=np.int64)), tokens)
    x = _embed(g, tokens, w["tgt_embed"], "tgt_embed", pos)  # (N, 1, D)
    rows = g.op("Slice", g.op("Shape", "cross_k_0"), g.ints(0), g.ints(1))  # (1,) M
    group_shape = g.op("Concat", rows, g.ints(-1, g.h, g.dk), axis=0)  # (M, g, h, d_k)
    for i, lw in enumerate(w["dec"]):
        x = _decoder_layer(g, x, lw, i, group_shape)
    if w["dec_norm"] is not None:
        x = g.norm(x, w["dec_norm"], "dec.norm")
    _output(g, x, w["out_proj"], shortlist)
    inputs = [_io("tokens", "int64", "rows", 1), _io("src_bias", "float", "groups", 1, 1, "src_len")]
    outputs = [_io("log_probs", "float", "rows", "vocab" if shortlist else w["out_proj"].shape[0])]
    for i in range(len(w["dec"])):
        inputs += [_io(f"self_k_{i}", "float", "rows", g.h, "past", g.dk),
                   _io(f"self_v_{i}", "float", "rows", g.h, "past", g.dv)]
        outputs += [_io(f"self_k_out_{i}", "float", "rows", g.h, "steps", g.dk),
                    _io(f"self_v_out_{i}", "float", "rows", g.h, "steps", g.dv)]
    for i in range(len(w["dec"])):
        inputs += [_io(f"cross_k_{i}", "float", "groups", g.h, "src_len", g.dk),
                   _io(f"cross_v_{i}", "float", "groups", g.h, "src_len", g.dv)]
    if shortlist:  # the initializer is its default: the whole vocabulary when not fed
        inputs.append(_io(OUTPUT_WEIGHT, "float", cfg.d_model, "vocab"))
    return g.model("nmtkit_decoder_step", inputs, outputs)


# ---- the self-check -------------------------------------------------------------------------------


def reference(model, pad: int, bos: int, eos: int) -> dict:
    """A few sentences (fixed random ids, padded, lengths 1..9) and torch's teacher-forced
    log-probabilities of fixed random targets: what ONNX Runtime must reproduce."""
    import torch

    rng = np.random.default_rng(0)
    first = max(pad, bos, eos) + 1  # ordinary symbols only
    lens = [5, 9, 1]
    src = np.full((len(lens), max(lens) + 1), pad, dtype=np.int64)
    for r, n in enumerate(lens):
        src[r, :n] = rng.integers(first, model.src_vocab_size, n)
        src[r, n] = eos
    steps = min(6, model.cfg.max_target_positions)
    prev = rng.integers(first, model.tgt_vocab_size, (len(lens), steps)).astype(np.int64)
    prev[:, 0] = bos
    with torch.inference_mode():
        logits = model(torch.from_numpy(src), torch.from_numpy(prev))  # (B, T, V)
        lp = torch.log_softmax(logits.float(), dim=-1).numpy()
    return {"src": src, "prev": prev, "log_probs": lp}


def check(folder: Path, ref: dict, tolerance: float, quantized: bool) -> float:
    """Step ONNX Runtime through `ref`'s sentences; UserError unless within `tolerance` of torch.
    Returns the largest difference (over every token, or the reference's own tokens for int8)."""
    graphs = Graphs.load(folder, threads=1)
    enc = graphs.encode(ref["src"])
    cache = graphs.empty_cache(len(ref["src"]))
    worst = 0.0
    for t in range(ref["prev"].shape[1]):
        lp, cache = graphs.step(ref["prev"][:, t], enc, cache)  # (B, V)
        want = ref["log_probs"][:, t]
        if quantized:  # the tokens that follow in the reference: int8 moves the tail of the distribution most
            nxt = ref["prev"][:, t + 1] if t + 1 < ref["prev"].shape[1] else want.argmax(1)
            diff = np.abs(np.take_along_axis(lp, nxt[:, None], 1) - np.take_along_axis(want, nxt[:, None], 1))
        else:
            diff = np.abs(lp - want)
        worst = max(worst, float(diff.max()))
    if not worst <= tolerance:
        raise UserError(f"the ONNX graphs in {folder} do not reproduce the model: log-probabilities differ from "
                        f"torch's by {worst:.3g} (tolerance {tolerance:g}); please report this model's architecture")
    return worst


def shortlist_ids(vocab: int, prev: np.ndarray) -> np.ndarray:
    """The check's candidates (C,) ascending: the special ids 0..3, every third id after them, and
    the reference's target tokens (fed back as positions among them)."""
    return np.union1d(np.r_[np.arange(min(4, vocab)), np.arange(4, vocab, 3)], prev).astype(np.int64)


def check_shortlist(folder: Path, ref: dict) -> float:
    """Step the graphs through `ref`'s target prefixes over the whole output layer and, from the
    same caches, over `shortlist_ids`' columns only (read back from the written graph, as the
    engine reads them); UserError unless the restricted log-probs are the full ones' columns
    renormalised over the candidates but <pad> (log-softmax over them; <pad> -inf) within
    `TOLERANCE`. Returns the largest difference."""
    graphs = Graphs.load(folder, threads=1)
    weight = read_output_weight(folder)  # (D, V)
    ids = shortlist_ids(weight.shape[1], ref["prev"])
    restricted = graphs.restricted(ids, weight)
    enc = graphs.encode(ref["src"])
    cache = graphs.empty_cache(len(ref["src"]))
    worst = 0.0
    for t in range(ref["prev"].shape[1]):
        lp, _ = restricted.step(np.searchsorted(ids, ref["prev"][:, t]), enc, cache)  # (B, C)
        full, cache = graphs.step(ref["prev"][:, t], enc, cache)  # (B, V)
        cols = full[:, ids[1:]].astype(np.float64)
        want = cols - np.logaddexp.reduce(cols, axis=1, keepdims=True)
        diff = float(np.abs(lp[:, 1:] - want).max()) if np.isneginf(lp[:, PAD]).all() else math.inf
        worst = max(worst, diff)
    if not worst <= TOLERANCE:
        raise UserError(f"the ONNX decoder in {folder} does not restrict its output layer correctly: log-probabilities "
                        f"over a shortlist differ from the renormalised full ones by {worst:.3g} "
                        f"(tolerance {TOLERANCE:g}); please report this model's architecture")
    return worst


# ---- the format's interface (nmtkit.backends.export) -------------------------------------------


@dataclasses.dataclass
class Prepared:
    """The format's copy of a model: its weights (the graphs are built by `write`, which knows
    whether the export has a shortlist), and the reference the written graphs must meet."""

    weights: dict  # `weights`
    cfg: object  # the model's ArchConfig
    reference: dict


def prepare(model, src_tokens: list[str], tgt_tokens: list[str]) -> Prepared:
    """The weights of a loaded nmtkit `Transformer` (eval mode) as numpy, and torch's reference
    log-probs; the caller then frees the torch model."""
    import_runtime()
    check_representable(model.cfg)
    return Prepared(weights(model), model.cfg, reference(model, PAD, BOS, EOS))


def quantize(folder: Path) -> None:
    """Replace both graphs by their int8 versions: MatMul with a constant weight (the
    projections, the feed-forward layers and the output layer), not the attention products, nor
    a shortlist export's output layer (its weight is an input: columns fed per batch)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.disable(logging.WARNING)  # its advice to pre-process image models, on the root logger
    try:
        for name in (ENCODER_FILE, DECODER_FILE):
            src = folder / name
            tmp = folder / f".{name}.int8"
            quantize_dynamic(src, tmp, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                             nodes_to_exclude=_float_nodes(src))
            tmp.replace(src)
    finally:
        logging.disable(logging.NOTSET)


def _float_nodes(path: Path) -> list[str]:
    """The nodes int8 leaves alone: the attention products and a shortlist export's output layer."""
    import onnx

    return [n.name for n in onnx.load(str(path)).graph.node if n.name.startswith(("attn_", "out_proj_"))]


def write(prepared: Prepared, folder, quantization: str, shortlist: bool = False) -> dict:
    """Build the graphs into the new folder `folder` (with `shortlist`, the decoder whose output
    layer can be restricted), check them against torch (and quantize them); what nmtkit.json
    records of the runtime."""
    import onnx

    ort = import_runtime()
    if quantization not in QUANTIZATIONS:
        raise UserError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    folder, w, cfg = Path(folder), prepared.weights, prepared.cfg
    onnx.save(build_encoder(w, cfg, PAD), str(folder / ENCODER_FILE))  # one graph in memory at a time
    onnx.save(build_decoder(w, cfg, BOS, EOS, shortlist), str(folder / DECODER_FILE))
    ref = prepared.reference
    record = {"version": ort.__version__, "onnx_version": onnx.__version__, "opset": OPSET,
              "check": {"float32_max_logprob_diff": check(folder, ref, TOLERANCE, False), "tolerance": TOLERANCE}}
    if shortlist:
        record["check"]["shortlist_max_logprob_diff"] = check_shortlist(folder, ref)
    if quantization == "int8":
        quantize(folder)
        record["check"]["int8_max_logprob_diff"] = check(folder, ref, INT8_TOLERANCE, True)
        record["check"]["int8_tolerance"] = INT8_TOLERANCE
        if shortlist:
            record["check"]["int8_shortlist_max_logprob_diff"] = check_shortlist(folder, ref)
    return record
