"""Teacher-forced passes of nmtkit's own models: the token log-probabilities and cross-attention
of given targets (`nmtkit.forced` explains what they serve and the conventions).

Why a pass of its own, beside the search: the search's incremental decoder runs on SDPA, which
never exposes the attention weights, and it only scores what it finds. One forward pass over a
whole given target equals the incremental decoder within 1e-5 (docs/internals.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import torch


def collate_targets(targets: Sequence[Sequence[int]], bos: int, eos: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder inputs `<s> y` and outputs `y </s>`, right-padded: two (N, T) long, T = longest + 1."""
    T = max(len(t) for t in targets) + 1
    prev = np.full((len(targets), T), pad, dtype=np.int64)
    out = np.full((len(targets), T), pad, dtype=np.int64)
    for r, t in enumerate(targets):
        n = len(t)
        prev[r, 0] = bos
        prev[r, 1:n + 1] = t
        out[r, :n] = t
        out[r, n] = eos
    return torch.from_numpy(prev), torch.from_numpy(out)


def forced_pass(models: Sequence[torch.nn.Module], src: torch.Tensor, targets: Sequence[Sequence[int]], *,
                bos: int, eos: int, pad: int, cross_layer: int | None = None,
                want_scores: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Teacher-force `targets` (N lists of ids without </s>) on `src` (N, S) through every model.

    Returns (token log-probs (N, T) float32 on the CPU, 0 after each row's </s>; the ensemble's
    mean of the models' log-softmaxes, as the search computes it) and, when `cross_layer` is
    given (0-based; negative counts from the top), the encoder-decoder attention of that layer
    averaged over heads and models (N, T, S) float32 on the CPU (fairseq's alignment source).
    """
    device = src.device
    prev, out = collate_targets(targets, bos, eos, pad)
    prev, out = prev.to(device), out.to(device)  # (N, T)
    lp_sum = attn_sum = None
    with torch.inference_mode():
        for m in models:
            if cross_layer is None:
                logits = m(src, prev)  # (N, T, V)
            else:
                n_layers = len(m.attention_modules("cross"))
                layer = cross_layer % n_layers
                logits, w = m.forward_with_attention(src, prev, which={"cross": [layer]}, logits=want_scores)
                a = w["cross"][layer].mean(dim=1)  # (N, T, S) averaged over heads
                attn_sum = a if attn_sum is None else attn_sum + a
            if want_scores:
                lp = _target_logprobs(logits, out)  # (N, T)
                lp_sum = lp if lp_sum is None else lp_sum + lp
            del logits
    k = len(models)
    lp = None if lp_sum is None else (lp_sum / k if k > 1 else lp_sum).masked_fill(out.eq(pad), 0.0).cpu()
    attn = None if attn_sum is None else (attn_sum / k if k > 1 else attn_sum).cpu()
    return lp, attn


def _target_logprobs(logits: torch.Tensor, out: torch.Tensor, rows: int = 16) -> torch.Tensor:
    """log_softmax(logits.float())[out] per position: (N, T, V), (N, T) -> (N, T) float32.

    In chunks of `rows` sentences, so that the float32 log-softmax never holds more than
    rows x T x V values besides the logits (a 32k vocabulary and 640 hypotheses of 60 tokens
    would otherwise need 5 GB more).
    """
    parts = [torch.log_softmax(logits[i:i + rows].float(), dim=-1).gather(2, out[i:i + rows].unsqueeze(-1)).squeeze(-1)
             for i in range(0, logits.size(0), rows)]
    return torch.cat(parts) if parts else logits.new_zeros(out.shape, dtype=torch.float32)
