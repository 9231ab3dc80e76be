"""fairseq's Transformer as nmtkit's: the architecture (`arch_config`) and the weights (`weights`).

What differs and how it is bridged (docs/fairseq.md):
- fairseq's dictionaries put `<s> <pad> </s> <unk>` at ids 0-3, nmtkit's `<pad> <s> </s> <unk>`:
  every vocabulary-sized matrix has its first two rows swapped (`permute_rows`);
- fairseq starts decoding with `</s>` (`decoder_start="eos"`), has biases on its attention
  projections (`attention_bias`), and its sinusoids are its own table (`sinusoid="fairseq"`);
  its learned position tables start two rows later (padding_idx + 1), so rows 2.. are kept;
- Q, K, V are separate matrices in fairseq (fused `in_proj_weight` in checkpoints before 2019);
  nmtkit fuses Q|K|V for self-attention and K|V for encoder-decoder attention.
ReLU and GELU (`activation`) are imported; anything nmtkit's model cannot compute exactly (layer
drop, adaptive input or softmax, a tanh-approximated GELU, no embedding scale, ...) is refused in
one line naming the arch and the setting.
"""

from __future__ import annotations

from typing import Any

import torch

from nmtkit.errors import UserError
from nmtkit.models.registry import ArchConfig

# fairseq's registered architectures nmtkit imports and the defaults each sets (fairseq 0.12.2,
# fairseq/models/transformer/transformer_legacy.py); the checkpoint's own values win.
_BASE = {"encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6, "encoder_attention_heads": 8,
         "encoder_normalize_before": False, "encoder_learned_pos": False, "decoder_layers": 6,
         "decoder_attention_heads": 8, "decoder_normalize_before": False, "decoder_learned_pos": False,
         "attention_dropout": 0.0, "activation_dropout": 0.0, "activation_fn": "relu", "dropout": 0.1,
         "share_decoder_input_output_embed": False, "share_all_embeddings": False,
         "max_source_positions": 1024, "max_target_positions": 1024}
_BIG = {**_BASE, "encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096, "encoder_attention_heads": 16,
        "decoder_attention_heads": 16, "dropout": 0.3}
ARCHS: dict[str, dict[str, Any]] = {
    "transformer": _BASE,
    "transformer_wmt_en_de": _BASE,
    "transformer_iwslt_de_en": {**_BASE, "encoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4,
                                "decoder_attention_heads": 4},
    "transformer_vaswani_wmt_en_de_big": _BIG,
    "transformer_vaswani_wmt_en_fr_big": {**_BIG, "dropout": 0.1},
    "transformer_wmt_en_de_big": {**_BIG, "attention_dropout": 0.1},
    "transformer_wmt_en_de_big_t2t": {**_BIG, "encoder_normalize_before": True, "decoder_normalize_before": True,
                                      "attention_dropout": 0.1, "activation_dropout": 0.1},
}

# settings nmtkit's Transformer does not compute: (name, the value that it does, what it is)
_UNSUPPORTED = (
    ("encoder_layerdrop", 0, "layer drop"), ("decoder_layerdrop", 0, "layer drop"),
    ("encoder_layers_to_keep", None, "pruned layers"), ("decoder_layers_to_keep", None, "pruned layers"),
    ("adaptive_input", False, "adaptive input"), ("adaptive_softmax_cutoff", None, "adaptive softmax"),
    ("tie_adaptive_weights", False, "adaptive weights"), ("no_scale_embedding", False, "unscaled embeddings"),
    ("layernorm_embedding", False, "a layer norm on the embeddings"),
    ("no_token_positional_embeddings", False, "no positions"), ("no_cross_attention", False, "no cross-attention"),
    ("cross_self_attention", False, "cross+self attention"), ("no_decoder_final_norm", False, "no final layer norm"),
    ("encoder_embed_path", None, "pretrained embedding files"), ("char_inputs", False, "character inputs"),
)

# fairseq's activation_fn -> nmtkit's: its "gelu" is torch's exact (erf) GELU, as nmtkit's; the
# tanh approximations ("gelu_fast", "gelu_accurate"), "tanh" and "linear" are not computed
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}


def model_args(state: dict) -> dict[str, Any]:
    """The model's settings from a plain checkpoint: `args` (a Namespace, fairseq < 0.10) or
    `cfg["model"]` (a Namespace or a dict), with `arch`, and `source_lang` / `target_lang` when known."""
    args = state.get("args")
    if isinstance(args, dict) and args:
        return dict(args)
    cfg = state.get("cfg")
    if isinstance(cfg, dict) and isinstance(cfg.get("model"), dict):
        out = dict(cfg["model"])
        task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
        for key in ("source_lang", "target_lang"):
            if out.get(key) is None and task.get(key) is not None:
                out[key] = task[key]
        out.setdefault("arch", out.get("_name"))
        return out
    raise UserError("no model settings in the checkpoint (neither 'args' nor 'cfg.model'): "
                    "not a fairseq translation checkpoint")


def arch_config(args: dict[str, Any], where: str) -> ArchConfig:
    """nmtkit's ArchConfig for fairseq's model `args`; a model it cannot compute exactly is
    refused in one line naming the arch."""
    arch = args.get("arch")
    if arch not in ARCHS:
        raise UserError(f"{where}: fairseq arch {arch!r} cannot be imported (nmtkit imports "
                        f"{', '.join(ARCHS)})")
    a = {**ARCHS[arch], **{k: v for k, v in args.items() if v is not None}}
    for key, default in (("decoder_embed_dim", "encoder_embed_dim"), ("decoder_ffn_embed_dim", "encoder_ffn_embed_dim"),
                         ("decoder_output_dim", "decoder_embed_dim"), ("decoder_input_dim", "decoder_embed_dim")):
        if a.get(key) is None:
            a[key] = a[default]
    for key, fine, what in _UNSUPPORTED:
        value = a.get(key)
        if value not in (fine, None, 0, False, "", []):
            raise UserError(f"{where}: fairseq arch {arch!r} with {what} ({key}={value!r}) cannot be imported: "
                            "nmtkit's Transformer does not compute it")
    activation = a.get("activation_fn") or "relu"
    if activation not in _ACTIVATIONS:
        raise UserError(f"{where}: fairseq arch {arch!r} with its activation (activation_fn={activation!r}) cannot be "
                        f"imported: nmtkit's Transformer computes {' and '.join(_ACTIVATIONS)}")
    _same(a, arch, where, ("encoder_embed_dim", "decoder_embed_dim", "decoder_output_dim", "decoder_input_dim"),
          ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"), ("encoder_attention_heads", "decoder_attention_heads"),
          ("encoder_normalize_before", "decoder_normalize_before"), ("encoder_learned_pos", "decoder_learned_pos"))
    share = "all" if a["share_all_embeddings"] else "decoder" if a["share_decoder_input_output_embed"] else "none"
    return ArchConfig(
        encoder_layers=int(a["encoder_layers"]), decoder_layers=int(a["decoder_layers"]),
        d_model=int(a["encoder_embed_dim"]), d_ff=int(a["encoder_ffn_embed_dim"]),
        heads=int(a["encoder_attention_heads"]), dropout=float(a["dropout"]),
        attention_dropout=float(a["attention_dropout"]), activation_dropout=float(a.get("activation_dropout") or 0.0),
        normalize_before=bool(a["encoder_normalize_before"]), learned_pos=bool(a["encoder_learned_pos"]),
        share_embeddings=share, max_source_positions=int(a["max_source_positions"]),
        max_target_positions=int(a["max_target_positions"]), sinusoid="fairseq", attention_bias=True,
        decoder_start="eos", label_smoothing=0.1 if a.get("label_smoothing") is None else float(a["label_smoothing"]),
        activation=_ACTIVATIONS[activation],
    ).validate()


def _same(a: dict, arch: str, where: str, *groups: tuple[str, ...]) -> None:
    """nmtkit has one width, FFN size, head count, norm placement and position kind for both stacks."""
    for group in groups:
        values = {a.get(k) for k in group}
        if len(values) > 1:
            detail = ", ".join(f"{k}={a.get(k)!r}" for k in group)
            raise UserError(f"{where}: fairseq arch {arch!r} with {detail} cannot be imported: nmtkit's "
                            "encoder and decoder share these sizes")


# ---- weights ---------------------------------------------------------------------------------------


def permute_rows(t: torch.Tensor) -> torch.Tensor:
    """fairseq's symbol order `<s> <pad> </s> <unk>` to nmtkit's `<pad> <s> </s> <unk>` (rows 0, 1 swapped)."""
    order = torch.arange(t.size(0))
    order[0], order[1] = 1, 0
    return t.index_select(0, order)


def _attention(sd: dict, prefix: str, where: str) -> dict[str, torch.Tensor]:
    """q, k, v, out (weight and bias) of one fairseq attention module, from the separate
    projections or the fused `in_proj_weight` of older checkpoints."""
    out = {}
    if f"{prefix}.in_proj_weight" in sd:
        for kind in ("weight", "bias"):
            q, k, v = sd[f"{prefix}.in_proj_{kind}"].chunk(3, dim=0)
            out.update({f"q.{kind}": q, f"k.{kind}": k, f"v.{kind}": v})
    else:
        for x in "qkv":
            for kind in ("weight", "bias"):
                out[f"{x}.{kind}"] = _get(sd, f"{prefix}.{x}_proj.{kind}", where)
    for kind in ("weight", "bias"):
        out[f"out.{kind}"] = _get(sd, f"{prefix}.out_proj.{kind}", where)
    return out


def _get(sd: dict, name: str, where: str) -> torch.Tensor:
    t = sd.get(name)
    if not isinstance(t, torch.Tensor):
        raise UserError(f"{where}: the checkpoint has no tensor {name!r} (not a fairseq Transformer of this arch?)")
    return t


def _norm(sd: dict, names: tuple[str, ...], where: str) -> dict[str, torch.Tensor]:
    """A layer norm under the first of `names` present (newer name first, then fairseq's older one)."""
    for name in names:
        if f"{name}.weight" in sd:
            return {"weight": _get(sd, f"{name}.weight", where), "bias": _get(sd, f"{name}.bias", where)}
    return {"weight": _get(sd, f"{names[0]}.weight", where), "bias": _get(sd, f"{names[0]}.bias", where)}


def _layer(sd: dict, src: str, dst: str, decoder: bool, where: str) -> dict[str, torch.Tensor]:
    """One encoder or decoder layer's tensors under nmtkit's names."""
    out: dict[str, torch.Tensor] = {}
    a = _attention(sd, f"{src}.self_attn", where)
    for kind in ("weight", "bias"):
        out[f"{dst}.self_attn.qkv_proj.{kind}"] = torch.cat([a[f"q.{kind}"], a[f"k.{kind}"], a[f"v.{kind}"]])
        out[f"{dst}.self_attn.out_proj.{kind}"] = a[f"out.{kind}"]
    norms = {"self_attn_norm": (f"{src}.self_attn_layer_norm", f"{src}.layer_norms.0"),
             "ffn_norm": (f"{src}.final_layer_norm", f"{src}.layer_norms.1")}
    if decoder:
        c = _attention(sd, f"{src}.encoder_attn", where)
        for kind in ("weight", "bias"):
            out[f"{dst}.cross_attn.q_proj.{kind}"] = c[f"q.{kind}"]
            out[f"{dst}.cross_attn.kv_proj.{kind}"] = torch.cat([c[f"k.{kind}"], c[f"v.{kind}"]])
            out[f"{dst}.cross_attn.out_proj.{kind}"] = c[f"out.{kind}"]
        norms["cross_attn_norm"] = (f"{src}.encoder_attn_layer_norm",)
    for name, fairseq_names in norms.items():
        for kind, t in _norm(sd, fairseq_names, where).items():
            out[f"{dst}.{name}.{kind}"] = t
    for fc in ("fc1", "fc2"):
        for kind in ("weight", "bias"):
            out[f"{dst}.ffn.{fc}.{kind}"] = _get(sd, f"{src}.{fc}.{kind}", where)
    return out


def weights(sd: dict, cfg: ArchConfig, where: str) -> dict[str, torch.Tensor]:
    """fairseq's state dict as nmtkit's (float32, contiguous, tied matrices as one tensor)."""
    out: dict[str, torch.Tensor] = {}
    out["src_embed.weight"] = permute_rows(_get(sd, "encoder.embed_tokens.weight", where))
    out["tgt_embed.weight"] = (out["src_embed.weight"] if cfg.share_embeddings == "all"
                               else permute_rows(_get(sd, "decoder.embed_tokens.weight", where)))
    if cfg.share_embeddings == "none":
        name = "decoder.output_projection.weight" if "decoder.output_projection.weight" in sd else "decoder.embed_out"
        t = _get(sd, name, where)
        out["out_proj.weight"] = permute_rows(t)
    else:
        out["out_proj.weight"] = out["tgt_embed.weight"]
    if cfg.learned_pos:
        for side, fs, limit in (("src", "encoder", cfg.max_source_positions), ("tgt", "decoder", cfg.max_target_positions)):
            table = _get(sd, f"{fs}.embed_positions.weight", where)
            if table.size(0) < limit + 2:
                raise UserError(f"{where}: {fs}.embed_positions.weight has {table.size(0)} rows, fewer than "
                                f"max positions {limit} + 2")
            out[f"{side}_pos.weight"] = table[2:limit + 2]
    for i in range(cfg.encoder_layers):
        out.update(_layer(sd, f"encoder.layers.{i}", f"encoder_layers.{i}", False, where))
    for i in range(cfg.decoder_layers):
        out.update(_layer(sd, f"decoder.layers.{i}", f"decoder_layers.{i}", True, where))
    if cfg.normalize_before:
        for fs, name in (("encoder", "encoder_norm"), ("decoder", "decoder_norm")):
            for kind, t in _norm(sd, (f"{fs}.layer_norm",), where).items():
                out[f"{name}.{kind}"] = t
    cache: dict[int, torch.Tensor] = {}  # one copy per shared tensor: ties stay ties
    return {k: cache.setdefault(id(v), v.float().contiguous().clone()) for k, v in out.items()}
