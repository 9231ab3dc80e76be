"""The one weight mapping between nmtkit's Transformer and `transformers`' MarianMTModel, both ways.

Why exact: the two models compute the same function up to a fixed permutation of the model
dimension. MarianMT is a post-norm Transformer with token embeddings scaled by sqrt(d_model) (or
by 1: `scale_embedding`, nmtkit's field of the same name) and sinusoidal positions counted from 0,
as nmtkit's; only the layout of the position table differs:
nmtkit interleaves (column 2i = sin, 2i+1 = cos of the same angle), MarianMT puts every sin first
(column i = sin, column ceil(D/2) + i = cos; `MarianSinusoidalPositionalEmbedding.create_weight`).
With `PERM = [0, 2, 4, ..., 1, 3, 5, ...]`, MarianMT's table is nmtkit's `table[:, PERM]`. Renaming
the coordinates of the residual stream by PERM everywhere keeps the function: every matrix that
reads the stream (q/k/v projections, fc1, the output projection) has its input columns permuted,
every one that writes to it (embeddings, attention output projections, fc2, with their biases)
its output rows, and LayerNorm (mean and variance are invariant under a permutation) its
gain and bias. What happens inside a head or inside the feed-forward layer is untouched.

Names, nmtkit -> MarianMT (`model.` prefix; E = encoder.layers.i, D = decoder.layers.i):

    src_embed / tgt_embed / out_proj      encoder.embed_tokens / decoder.embed_tokens / lm_head
                                          (shared: model.shared; lm_head tied)
    E/D.self_attn.qkv_proj (q|k|v rows)   E/D.self_attn.{q,k,v}_proj
    D.cross_attn.q_proj, kv_proj (k|v)    D.encoder_attn.q_proj, {k,v}_proj
    *.out_proj                            *.out_proj (its MarianMT bias zero unless attention_bias)
    self_attn_norm / cross_attn_norm      self_attn_layer_norm / encoder_attn_layer_norm
    ffn.fc1 / ffn.fc2 / ffn_norm          fc1 / fc2 / final_layer_norm
    (no output bias)                      final_logits_bias (zero)
"""

from __future__ import annotations

import torch
from torch import Tensor


def permutation(d_model: int) -> Tensor:
    """PERM: MarianMT coordinate j is nmtkit coordinate PERM[j] (even ones first, then the odd)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def inverse(perm: Tensor) -> Tensor:
    out = torch.empty_like(perm)
    out[perm] = torch.arange(perm.numel())
    return out


def _layers(cfg):
    """Every layer's pieces as (kind, nmtkit name, MarianMT name), kind being self_attn,
    cross_attn, norm or ffn: the one walk both directions take."""
    for side, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        for i in range(n):
            ours, theirs = f"{side}_layers.{i}", f"model.{side}.layers.{i}"
            yield "self_attn", f"{ours}.self_attn", f"{theirs}.self_attn"
            yield "norm", f"{ours}.self_attn_norm", f"{theirs}.self_attn_layer_norm"
            if side == "decoder":
                yield "cross_attn", f"{ours}.cross_attn", f"{theirs}.encoder_attn"
                yield "norm", f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm"
            yield "ffn", ours, theirs
            yield "norm", f"{ours}.ffn_norm", f"{theirs}.final_layer_norm"


def to_marian(sd: dict[str, Tensor], cfg, d_model: int) -> dict[str, Tensor]:
    """nmtkit state dict -> MarianMTModel state dict (without the position tables, which
    `transformers` computes, and without tied copies: `model.shared` / `lm_head` follow the
    config's ties)."""
    p = permutation(d_model)
    rows = lambda t: t[p].contiguous()  # noqa: E731 - writes the stream
    cols = lambda t: t[:, p].contiguous()  # noqa: E731 - reads the stream
    zeros = lambda n: torch.zeros(n, dtype=sd["tgt_embed.weight"].dtype)  # noqa: E731
    out: dict[str, Tensor] = {}
    if cfg.share_embeddings == "all":
        out["model.shared.weight"] = cols(sd["tgt_embed.weight"])
    else:
        out["model.encoder.embed_tokens.weight"] = cols(sd["src_embed.weight"])
        out["model.decoder.embed_tokens.weight"] = cols(sd["tgt_embed.weight"])
    out["lm_head.weight"] = cols(sd["out_proj.weight"])
    out["final_logits_bias"] = zeros(sd["out_proj.weight"].shape[0]).unsqueeze(0)

    def linear(name: str, w: Tensor, b: Tensor | None, how) -> None:
        out[f"{name}.weight"] = how(w)
        out[f"{name}.bias"] = zeros(w.shape[0]) if b is None else (rows(b) if how is rows else b.clone())

    def norm(name: str, src: str) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = rows(sd[f"{src}.weight"]), rows(sd[f"{src}.bias"])

    def attention(src: str, dst: str, fused_self: bool) -> None:
        d = d_model
        if fused_self:
            w, b = sd[f"{src}.qkv_proj.weight"], sd.get(f"{src}.qkv_proj.bias")
            parts = [(w[i * d:(i + 1) * d], None if b is None else b[i * d:(i + 1) * d]) for i in range(3)]
        else:
            kv, kvb = sd[f"{src}.kv_proj.weight"], sd.get(f"{src}.kv_proj.bias")
            parts = [(sd[f"{src}.q_proj.weight"], sd.get(f"{src}.q_proj.bias")),
                     (kv[:d], None if kvb is None else kvb[:d]), (kv[d:], None if kvb is None else kvb[d:])]
        for name, (w, b) in zip(("q_proj", "k_proj", "v_proj"), parts):
            linear(f"{dst}.{name}", w, b, cols)
        linear(f"{dst}.out_proj", sd[f"{src}.out_proj.weight"], sd.get(f"{src}.out_proj.bias"), rows)

    for kind, ours, theirs in _layers(cfg):
        if kind == "norm":
            norm(theirs, ours)
        elif kind == "ffn":
            linear(f"{theirs}.fc1", sd[f"{ours}.ffn.fc1.weight"], sd[f"{ours}.ffn.fc1.bias"], cols)
            linear(f"{theirs}.fc2", sd[f"{ours}.ffn.fc2.weight"], sd[f"{ours}.ffn.fc2.bias"], rows)
        else:
            attention(ours, theirs, kind == "self_attn")
    return out


def from_marian(sd: dict[str, Tensor], cfg, d_model: int) -> dict[str, Tensor]:
    """MarianMTModel state dict (names as `to_marian` writes them; a shared matrix under
    `model.shared.weight`) -> nmtkit state dict for `cfg` (the inverse of `to_marian`)."""
    q = inverse(permutation(d_model))
    rows = lambda t: t[q].contiguous()  # noqa: E731
    cols = lambda t: t[:, q].contiguous()  # noqa: E731
    out: dict[str, Tensor] = {}
    if cfg.share_embeddings == "all":
        out["tgt_embed.weight"] = out["src_embed.weight"] = out["out_proj.weight"] = cols(sd["model.shared.weight"])
    else:
        out["src_embed.weight"] = cols(sd["model.encoder.embed_tokens.weight"])
        out["tgt_embed.weight"] = cols(sd["model.decoder.embed_tokens.weight"])
        out["out_proj.weight"] = (out["tgt_embed.weight"] if cfg.share_embeddings == "decoder"
                                  else cols(sd["lm_head.weight"]))
    bias = cfg.attention_bias

    def attention(src: str, dst: str, fused_self: bool) -> None:
        ws = [cols(sd[f"{src}.{n}_proj.weight"]) for n in ("q", "k", "v")]
        bs = [sd[f"{src}.{n}_proj.bias"] for n in ("q", "k", "v")]
        if fused_self:
            out[f"{dst}.qkv_proj.weight"] = torch.cat(ws)
            if bias:
                out[f"{dst}.qkv_proj.bias"] = torch.cat(bs)
        else:
            out[f"{dst}.q_proj.weight"], out[f"{dst}.kv_proj.weight"] = ws[0], torch.cat(ws[1:])
            if bias:
                out[f"{dst}.q_proj.bias"], out[f"{dst}.kv_proj.bias"] = bs[0].clone(), torch.cat(bs[1:])
        out[f"{dst}.out_proj.weight"] = rows(sd[f"{src}.out_proj.weight"])
        if bias:
            out[f"{dst}.out_proj.bias"] = rows(sd[f"{src}.out_proj.bias"])

    def norm(dst: str, src: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = rows(sd[f"{src}.weight"]), rows(sd[f"{src}.bias"])

    for kind, ours, theirs in _layers(cfg):
        if kind == "norm":
            norm(ours, theirs)
        elif kind == "ffn":
            out[f"{ours}.ffn.fc1.weight"], out[f"{ours}.ffn.fc1.bias"] = cols(sd[f"{theirs}.fc1.weight"]), sd[f"{theirs}.fc1.bias"].clone()
            out[f"{ours}.ffn.fc2.weight"], out[f"{ours}.ffn.fc2.bias"] = rows(sd[f"{theirs}.fc2.weight"]), rows(sd[f"{theirs}.fc2.bias"])
        else:
            attention(theirs, ours, kind == "self_attn")
    return out
