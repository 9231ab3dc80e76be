"""An nmtkit Transformer as a CTranslate2 model: the spec, the converter and what cannot be expressed.

Why CTranslate2's own public API (`ctranslate2.specs.TransformerSpec`, a
`ctranslate2.converters.Converter` subclass) rather than writing `model.bin` ourselves: the spec
validates every shape, and `Converter.convert` does the quantization, the aliasing of tied matrices
and the file layout exactly as the library's fairseq / OpenNMT converters do, so the directory
loads in any CTranslate2 4.x runtime.

The mapping (docs/export.md), one nmtkit module -> one spec entry:

    src_embed / tgt_embed                     encoder.embeddings[0] / decoder.embeddings (x sqrt(d_model))
    src_pos / tgt_pos (sinusoid table or       encoder/decoder.position_encodings.encodings: the table
      learned weight)                           itself, since CTranslate2's built-in sinusoids differ
                                                (positions from 1, [sin | cos] halves)
    layer.self_attn.qkv_proj  (fused q|k|v)   layer.self_attention.linear[0] (the same fused layout;
                                                d_k != d_v: per-head zero padding, see `_Heads`)
    layer.self_attn.out_proj                  layer.self_attention.linear[1]
    layer.cross_attn.q_proj / kv_proj (k|v)   layer.attention.linear[0] / linear[1] (fused k|v)
    layer.cross_attn.out_proj                 layer.attention.linear[2]
    layer.{self_attn,cross_attn,ffn}_norm     layer.{self_attention,attention,ffn}.layer_norm
    layer.ffn.fc1 / fc2 (with biases)         layer.ffn.linear_0 / linear_1
    encoder_norm / decoder_norm (pre-norm)    encoder.layer_norm / decoder.layer_norm
    out_proj (no bias)                        decoder.projection

The attention projections' biases (`attention_bias`, imported models) go to the same linears,
split and padded as their rows; `activation` is the spec's (relu, swish, gelu = CTranslate2's
erf GELU). `pre_norm` follows `normalize_before`; CTranslate2 applies each sub-layer's LayerNorm
before the sub-layer (pre-norm) or after the residual sum (post-norm), as nmtkit does. LayerNorm epsilon is
torch's 1e-5. The source gets `</s>` appended by the runtime (`add_source_eos`), the decoder starts
from `<s>`: the sequences of docs/internals.md.
"""

from __future__ import annotations

import numpy as np

from nmtkit.errors import UserError, first_line

INSTALL_HINT = "pip install -e '.[ctranslate2]' in the nmtkit checkout"
# an export's lexical shortlist (`nmtkit export --shortlist`): the file CTranslate2 reads from the
# model directory when a translation asks for `use_vmap`
SHORTLIST_FILE = "vmap.txt"
# Converter.convert's quantization names (`nmtkit export --quantization`).
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which nmtkit's model uses


def import_ctranslate2():
    """The ctranslate2 module, or a one-line UserError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError(f"the CTranslate2 runtime is not installed: {INSTALL_HINT}") from None
    return ctranslate2


import_runtime = import_ctranslate2  # the name `nmtkit.backends.export` calls in every format


# ArchConfig fields the conversion handles (every one today). A field added later is refused
# unless it has its default value, until the conversion learns it: an export must never silently
# drop a setting that changes the model's output.
HANDLED_FIELDS = frozenset({
    "encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "d_k", "d_v", "normalize_before",
    "learned_pos", "share_embeddings", "max_source_positions", "max_target_positions",
    "activation", "attention_bias",
    # imported models: the sinusoid table is written as it is; fairseq's decoding from </s>
    "sinusoid", "decoder_start",
    # training-only: no effect on the exported weights or on inference
    "dropout", "attention_dropout", "activation_dropout", "label_smoothing", "warmup_steps",
})


def check_representable(cfg) -> None:
    """Refuse, in one line naming the setting, an architecture the conversion cannot express.

    Every field of today's `ArchConfig` maps onto the spec (d_k != d_v included, see `_heads`);
    this guards fields added later.
    """
    from nmtkit.models.registry import refuse_unhandled

    refuse_unhandled(cfg, HANDLED_FIELDS, "CTranslate2")


def _np(t) -> np.ndarray:
    """A float32 numpy copy of a tensor (the spec keeps it until `save`)."""
    return t.detach().to("cpu").float().contiguous().numpy().copy()


def _layer_norm(spec, norm) -> None:
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def _linear(spec, linear) -> None:
    spec.weight = _np(linear.weight)
    if linear.bias is not None:
        spec.bias = _np(linear.bias)


class _Heads:
    """Per-head sizes in CTranslate2's terms: one `head_dim` for queries, keys and values.

    nmtkit allows d_k != d_v (Table 3 row B: d_k 16 or 32, d_v 64). The smaller of the two is
    zero-padded per head to `head_dim = max(d_k, d_v)`: extra query/key dimensions that are zero
    add nothing to q.k, extra value dimensions that are zero give zero outputs that the (equally
    padded) output projection ignores; `queries_scale` keeps the scale 1/sqrt(d_k). The model's
    function is unchanged; its attention costs what a d_k = d_v = head_dim model's does.
    """

    def __init__(self, cfg):
        self.h, self.dk, self.dv = cfg.heads, cfg.head_dim_k, cfg.head_dim_v
        self.dim = max(self.dk, self.dv)
        # `head_dim` only when d_model / heads is not it (CTranslate2's default)
        self.head_dim = self.dim if self.dim * self.h != cfg.d_model else None
        self.queries_scale = np.float32(1.0 / np.sqrt(self.dk)) if self.dk != self.dim else None

    def rows(self, w: np.ndarray, d: int) -> np.ndarray:
        """(heads * d, D) projection rows -> (heads * dim, D), each head's rows zero-padded."""
        if d == self.dim:
            return w
        out = np.zeros((self.h, self.dim, w.shape[1]), dtype=w.dtype)
        out[:, :d] = w.reshape(self.h, d, -1)
        return out.reshape(self.h * self.dim, -1)

    def columns(self, w: np.ndarray) -> np.ndarray:
        """Output projection (D, heads * d_v) -> (D, heads * dim), each head's columns zero-padded."""
        if self.dv == self.dim:
            return w
        out = np.zeros((w.shape[0], self.h, self.dim), dtype=w.dtype)
        out[:, :, : self.dv] = w.reshape(w.shape[0], self.h, self.dv)
        return out.reshape(w.shape[0], -1)

    def biases(self, linear, spec, sizes: list[int]) -> None:
        """`attention_bias` (imported models): the projection's bias, split and padded like its rows."""
        if linear.bias is None:
            return
        b, parts, at = _np(linear.bias), [], 0
        for d in sizes:
            parts.append(self.rows(b[at : at + self.h * d, None], d)[:, 0])
            at += self.h * d
        spec.bias = np.concatenate(parts)

    def self_attention(self, spec, attn) -> None:
        hk = self.h * self.dk
        w = _np(attn.qkv_proj.weight)  # (h*d_k | h*d_k | h*d_v, D): fused q|k|v, as CTranslate2's
        q, k, v = w[:hk], w[hk : 2 * hk], w[2 * hk :]
        spec.linear[0].weight = np.concatenate([self.rows(q, self.dk), self.rows(k, self.dk), self.rows(v, self.dv)])
        spec.linear[1].weight = self.columns(_np(attn.out_proj.weight))
        self.biases(attn.qkv_proj, spec.linear[0], [self.dk, self.dk, self.dv])
        if attn.out_proj.bias is not None:
            spec.linear[1].bias = _np(attn.out_proj.bias)
        if self.queries_scale is not None:
            spec.queries_scale = self.queries_scale

    def cross_attention(self, spec, attn) -> None:
        hk = self.h * self.dk
        kv = _np(attn.kv_proj.weight)  # (h*d_k | h*d_v, D): fused k|v, as CTranslate2's
        spec.linear[0].weight = self.rows(_np(attn.q_proj.weight), self.dk)
        spec.linear[1].weight = np.concatenate([self.rows(kv[:hk], self.dk), self.rows(kv[hk:], self.dv)])
        spec.linear[2].weight = self.columns(_np(attn.out_proj.weight))
        self.biases(attn.q_proj, spec.linear[0], [self.dk])
        self.biases(attn.kv_proj, spec.linear[1], [self.dk, self.dv])
        if attn.out_proj.bias is not None:
            spec.linear[2].bias = _np(attn.out_proj.bias)
        if self.queries_scale is not None:
            spec.queries_scale = self.queries_scale


def _ffn(spec, layer) -> None:
    _layer_norm(spec.layer_norm, layer.ffn_norm)
    _linear(spec.linear_0, layer.ffn.fc1)
    _linear(spec.linear_1, layer.ffn.fc2)


def _positions(pos) -> np.ndarray:
    """(max_positions, d_model): row p is added at position p (0 = the first token, as in nmtkit)."""
    return _np(pos.weight if pos.learned else pos.table)


def build_spec(model, src_tokens: list[str], tgt_tokens: list[str]):
    """The `ctranslate2.specs.TransformerSpec` of a loaded nmtkit `Transformer` (eval mode, any dtype).

    `src_tokens` / `tgt_tokens`: the dictionaries' symbols in id order (CTranslate2's vocabularies;
    identical lists are saved once as `shared_vocabulary.json`).
    """
    import_ctranslate2()
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    check_representable(cfg)
    from ctranslate2.specs.common_spec import Activation

    heads = _Heads(cfg)
    # torch's exact GELU is CTranslate2's GELU (erf); swish = SiLU
    act = {"relu": Activation.RELU, "swish": Activation.SWISH, "gelu": Activation.GELU}[cfg.activation]
    encoder = transformer_spec.TransformerEncoderSpec(
        cfg.encoder_layers, cfg.heads, pre_norm=cfg.normalize_before, head_dim=heads.head_dim, activation=act)
    decoder = transformer_spec.TransformerDecoderSpec(
        cfg.decoder_layers, cfg.heads, pre_norm=cfg.normalize_before, head_dim=heads.head_dim, activation=act)

    encoder.embeddings[0].weight = _np(model.src_embed.weight)
    encoder.scale_embeddings = True  # x sqrt(d_model), as nmtkit's embed_scale
    encoder.position_encodings.encodings = _positions(model.src_pos)
    for ls, layer in zip(encoder.layer, model.encoder_layers):
        heads.self_attention(ls.self_attention, layer.self_attn)
        _layer_norm(ls.self_attention.layer_norm, layer.self_attn_norm)
        _ffn(ls.ffn, layer)
    if cfg.normalize_before:
        _layer_norm(encoder.layer_norm, model.encoder_norm)

    decoder.embeddings.weight = _np(model.tgt_embed.weight)
    decoder.scale_embeddings = True
    decoder.position_encodings.encodings = _positions(model.tgt_pos)
    decoder.projection.weight = _np(model.out_proj.weight)
    for ls, layer in zip(decoder.layer, model.decoder_layers):
        heads.self_attention(ls.self_attention, layer.self_attn)
        _layer_norm(ls.self_attention.layer_norm, layer.self_attn_norm)
        heads.cross_attention(ls.attention, layer.cross_attn)
        _layer_norm(ls.attention.layer_norm, layer.cross_attn_norm)
        _ffn(ls.ffn, layer)
    if cfg.normalize_before:
        _layer_norm(decoder.layer_norm, model.decoder_norm)

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.config.add_source_eos = True  # source = tokens + </s>
    # decoder input = <s> + tokens; </s> + tokens for fairseq's models (`decoder_start`), as
    # CTranslate2's own fairseq converter sets it
    spec.config.decoder_start_token = "</s>" if cfg.decoder_start == "eos" else "<s>"
    spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = "<s>", "</s>", "<unk>"
    spec.register_source_vocabulary(list(src_tokens))
    spec.register_target_vocabulary(list(tgt_tokens))
    return spec


def make_converter(spec):
    """A `ctranslate2.converters.Converter` whose model is `spec` (built by `build_spec`)."""
    import_ctranslate2()
    from ctranslate2.converters import Converter

    class NmtkitConverter(Converter):
        """Converts an nmtkit checkpoint (already loaded into `spec`) to the CTranslate2 format."""

        def _load(self):
            return spec

    return NmtkitConverter()


def convert(spec, output_dir: str, quantization: str) -> None:
    """Validate, quantize and write `spec` into the new, empty-or-absent folder `output_dir`
    (model.bin, config.json, the vocabularies)."""
    if quantization not in QUANTIZATIONS:
        raise UserError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    try:
        make_converter(spec).convert(output_dir, quantization=quantization, force=True)
    except (ValueError, NotImplementedError) as e:  # the spec's own checks: a bug of ours or an odd model
        raise UserError(f"CTranslate2 refused the converted model: {first_line(e)}") from None


def prepare(model, src_tokens: list[str], tgt_tokens: list[str]):
    """The format's copy of a loaded nmtkit `Transformer` (its spec): the caller can then free
    the torch model before `write`, so that two copies of the weights never meet the one being
    written."""
    return build_spec(model, src_tokens, tgt_tokens)


def write(spec, folder, quantization: str, shortlist: bool = False) -> dict:
    """Write `spec` (from `prepare`) into the new folder `folder`; returns what nmtkit.json
    records of the runtime (its version). `shortlist` changes nothing: CTranslate2 restricts its
    output layer itself, from the vmap.txt that `nmtkit export` copies beside the model."""
    convert(spec, str(folder), quantization)
    return {"version": import_ctranslate2().__version__}
