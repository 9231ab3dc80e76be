"""Label-smoothed cross-entropy (the paper's eps_ls), with the per-token reporting figures.

Which smoothing: the target distribution puts 1 - eps on the gold token and eps / (V - 1) on each
of the other V - 1 tokens, so it sums to 1. That is what both reference implementations do
(tensor2tensor's `smoothing_cross_entropy`: low_confidence = (1 - confidence) / (V - 1); fairseq's
`label_smoothed_nll_loss`: eps_i = eps / (V - 1) with weight 1 - eps - eps_i on the gold nll),
so losses are comparable with both. (torch's `cross_entropy(label_smoothing=eps)` spreads eps / V
over all V tokens, gold included: the gold then gets 1 - eps + eps / V.) As in both references,
every vocabulary entry, <pad> included, receives its eps / (V - 1) share; padding *positions* of the
target are ignored entirely.

Per target position t with log-probabilities lp (V entries) and gold g:

    nll_t    = -lp[g]
    smooth_t = -sum_v lp[v]
    loss_t   = (1 - eps - eps/(V-1)) * nll_t + eps/(V-1) * smooth_t

The forward pass needs only logsumexp(z), sum_v z[v] and z[g] per position (lp[v] = z[v] - lse,
so nll_t = lse - z[g] and smooth_t = V * lse - sum_v z[v]); the backward pass is the closed form
d loss_t / d z = softmax(z) - q, written into one (N, V) buffer. This custom autograd function
avoids materializing log_softmax and the generic gather/sum backward passes (a zero-filled
(N, V) scatter among them), which made the loss about 15% of a CPU training step.

Training does not even build the (N, V) logits: `fused_label_smoothed_cross_entropy` takes the
decoder's final hidden states and the output projection and works through the target positions a
chunk at a time (logits in the matmul dtype, statistics in float32), turning each chunk's logits
into its share of the gradients of the hidden states, the weight and the bias before the next
chunk. The whole batch's logits, their float32 copy and their gradient grow with the batch (tens
of GiB at 131K target tokens and V = 37K); the chunks cost CHUNK_ELEMENTS entries at a time, for
the same three (N x d x V) matmuls.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


# Logits entries per chunk of the fused loss: rows = CHUNK_ELEMENTS // V (3627 rows at V = 37000).
# Its temporaries stay under 2 GiB whatever the batch; smaller chunks were slower on an H200
# (131K tokens, V = 37K, bf16: 2^25 1.2x, 2^27 1.0x the time of the whole-batch loss).
CHUNK_ELEMENTS = 2**27


def _row_losses(z: torch.Tensor, target: torch.Tensor, epsilon: float):
    """Per-position (smoothed loss, nll, logsumexp) of float logits z (n, V), gold ids target (n,)."""
    vocab = z.size(1)
    lse = torch.logsumexp(z, dim=1)  # (n,)
    nll = lse - z.gather(1, target.unsqueeze(1)).squeeze(1)  # (n,)
    if epsilon > 0:
        eps_i = epsilon / (vocab - 1)
        smooth = vocab * lse - z.sum(dim=1)  # (n,)
        return (1.0 - epsilon - eps_i) * nll + eps_i * smooth, nll, lse
    return nll, nll, lse


def _smoothing_share(epsilon: float, vocab: int) -> float:
    """eps / (V - 1), the target probability of each non-gold token (0 without smoothing)."""
    return epsilon / (vocab - 1) if epsilon > 0 else 0.0


def _grad_of_logits_(p: torch.Tensor, target: torch.Tensor, w: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Turn the softmax p (n, V) in place into (softmax - q) * w, the gradient of the loss with
    respect to the logits; w: (n, 1) or () upstream gradient. Returns p."""
    eps_i = _smoothing_share(epsilon, p.size(1))
    if eps_i:
        torch.addcmul(w * -eps_i, p, w, out=p)  # (softmax - eps_i) * w in one pass
    else:
        p.mul_(w)
    gold = (-(1.0 - epsilon - eps_i) * w).expand(p.size(0), 1)  # (n, 1)
    return p.scatter_add_(1, target.unsqueeze(1), gold)


class _LabelSmoothedCE(torch.autograd.Function):
    """Sum over non-pad positions of the smoothed loss; also returns the nll sum (no gradient)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int):
        # z: (N, V) float32 logits; target: (N,) long
        mask = (target != ignore_index).to(z.dtype)  # (N,)
        loss, nll, lse = _row_losses(z, target, epsilon)
        ctx.save_for_backward(z, lse, target, mask)
        ctx.eps = epsilon
        nll_sum = (nll * mask).sum()
        ctx.mark_non_differentiable(nll_sum)
        return (loss * mask).sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        z, lse, target, mask = ctx.saved_tensors
        w = (mask * grad_loss).unsqueeze(1)  # (N, 1) upstream gradient, 0 at padding
        grad = torch.sub(z, lse.unsqueeze(1)).exp_()  # (N, V) softmax, one buffer
        return _grad_of_logits_(grad, target, w, ctx.eps), None, None, None


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype F.linear(hidden, weight) computes in here: autocast's when autocast is on for
    this device (as for the model's own layers), else the inputs'. Read off an empty product, so
    that it follows autocast exactly on every torch version."""
    return F.linear(hidden[:0], weight[:0]).dtype


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One chunk's logits: h (r, d), weight (V, d), bias (V,), all in one dtype -> (r, V)."""
    return F.linear(h, weight, bias)


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def _grad_buffers(hidden: torch.Tensor, weight: torch.Tensor, need: tuple[bool, bool, bool]):
    """Zeroed float32 (at least) gradients of (hidden (n, d), weight (V, d), bias (V,)), None where
    `need` says no: summed over the chunks, scaled in the backward pass, then cast."""
    def buffer(shape, like, needed):
        dtype = torch.promote_types(like.dtype, torch.float32)
        return torch.zeros(shape, dtype=dtype, device=like.device) if needed else None

    return (buffer(hidden.shape, hidden, need[0]), buffer(weight.shape, weight, need[1]),
            buffer(weight.shape[:1], weight, need[2]))


def _add_chunk_grads_(grads: tuple, s: int, g: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> None:
    """Add one chunk's share to grads (hidden, weight, bias; see _grad_buffers): g (r, V) float32
    d loss / d logits of rows s .. s + r - 1, h (r, d) and w (V, d) in the matmul dtype."""
    grad_h, grad_w, grad_b = grads
    if grad_b is not None:
        grad_b += g.sum(0)  # (V,)
    g = g.to(h.dtype)
    if grad_h is not None:
        grad_h[s:s + g.size(0)] = g @ w  # (r, d)
    if grad_w is not None:
        _add_product_(grad_w, g.t(), h)  # += (V, r) @ (r, d)


def _add_product_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b; the product in a's dtype (the matmul dtype), the sum in acc's."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc += a @ b


class _FusedProjectionCE(torch.autograd.Function):
    """Sum of the smoothed loss of the logits hidden @ weight^T + bias, computed chunk by chunk;
    also returns the nll sum (no gradient). Every row of `target` counts (padding removed before).

    The loss is a scalar, so its gradients are those for an upstream gradient of 1 times the one
    the backward pass receives: they are formed in the forward pass, chunk by chunk while that
    chunk's logits exist, and only scaled in backward (`with_grads` False, e.g. under no_grad:
    not formed). Recomputing the logits in backward instead would cost a fourth (n x d x V) matmul
    (measured on CPU: projection and loss 1.27x slower).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, epsilon: float, rows: int, with_grads: bool):
        # hidden (n, d), weight (V, d), bias (V,) or None, target (n,) long
        dtype = _matmul_dtype(hidden, weight)
        stats = torch.promote_types(dtype, torch.float32)  # softmax statistics: float32 at least
        w, b = weight.to(dtype), _cast(bias, dtype)  # (V, d), (V,): cast once, not per chunk
        need = tuple(with_grads and n for n in ctx.needs_input_grad[:3])
        grads = _grad_buffers(hidden, weight, need)
        one = torch.ones((), dtype=stats, device=hidden.device)  # the upstream gradient, for now
        loss_sum, nll_sum = (torch.zeros((), dtype=torch.float64, device=hidden.device) for _ in range(2))
        for s in range(0, hidden.size(0), rows):
            h, t = hidden[s:s + rows].to(dtype), target[s:s + rows]  # (r, d), (r,)
            z = _logits(h, w, b).to(stats)  # (r, V)
            loss, nll, lse = _row_losses(z, t, epsilon)  # (r,) each
            loss_sum += loss.sum()  # the chunk's float32 sums, summed in float64
            nll_sum += nll.sum()
            if any(need):
                p = z.sub_(lse.unsqueeze(1)).exp_()  # (r, V) softmax, in z's buffer
                _add_chunk_grads_(grads, s, _grad_of_logits_(p, t, one, epsilon), h, w)
        ctx.save_for_backward(*grads)
        ctx.dtypes = (hidden.dtype, weight.dtype, weight.dtype)
        nll_sum = nll_sum.to(stats)
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum.to(stats), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        grads = [None if g is None else (g * grad_loss).to(dtype)  # hidden, weight, bias
                 for g, dtype in zip(ctx.saved_tensors, ctx.dtypes)]
        return (*grads, None, None, None, None)


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = 0
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Return (smoothed loss sum, nll sum, number of non-pad target tokens), sums in nats.

    logits: (batch, tgt_len, V) any float dtype (computed in float32); target: (batch, tgt_len).
    Sums (not means) so that gradient accumulation and DDP can divide by the total token count of
    the whole update. The nll sum carries no gradient (it is for reporting).
    """
    vocab = logits.size(-1)
    z = logits.reshape(-1, vocab).float()  # (N, V)
    tgt = target.reshape(-1)  # (N,)
    ntokens = int((tgt != ignore_index).sum())
    loss, nll = _LabelSmoothedCE.apply(z, tgt, float(epsilon), int(ignore_index))
    return loss, nll, ntokens


def nonpad_positions(target: torch.Tensor, ignore_index: int, ntokens: int) -> torch.Tensor:
    """The positions of the `ntokens` non-pad entries of target (N,), ascending: (ntokens,) long.

    Why not target != ignore_index as a boolean index: the size of that result is known only after
    reading the mask back from the device, and on CUDA the host waits for every queued kernel to get
    it. With the count known on the host (training counts the collated batch before it moves), the
    k-th position (k = 1 .. ntokens) is where the running count of non-pad entries first reaches k:
    a scan and a binary search on the device, nothing read back. `ntokens` must be the true count.
    """
    seen = (target != ignore_index).cumsum(0)  # (N,) non-pad entries up to and including each position
    return torch.searchsorted(seen, torch.arange(1, ntokens + 1, device=target.device))


def fused_label_smoothed_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int = 0,
    bias: torch.Tensor | None = None, chunk_elements: int = CHUNK_ELEMENTS, ntokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`label_smoothed_cross_entropy(F.linear(hidden, weight, bias), target, ...)`, without the logits.

    hidden: (batch, tgt_len, d) the decoder's final states; weight: (V, d) the output projection
    (the target embedding when tied), bias: (V,) or None; target: (batch, tgt_len).
    Returns (smoothed loss sum, nll sum, number of non-pad target tokens), as that function does.
    Only the non-pad positions are projected, `chunk_elements` // V of them at a time, so no
    (N, V) tensor, logits or gradient, is ever held. The projection runs in autocast's dtype when
    autocast is on (as the model's own output layer would), the softmax statistics in float32.
    `ntokens`: the number of non-pad positions of `target` when the caller knows it on the host;
    then nothing is read back from the device (see nonpad_positions). Without it they are counted
    here, which waits for the device.
    """
    d = hidden.size(-1)
    tgt = target.reshape(-1)  # (N,)
    if ntokens is None:
        ntokens = int((tgt != ignore_index).sum())
    keep = nonpad_positions(tgt, ignore_index, ntokens)  # (n,)
    h, tgt = hidden.reshape(-1, d).index_select(0, keep), tgt.index_select(0, keep)  # (n, d), (n,)
    rows = max(1, chunk_elements // weight.size(0))
    loss, nll = _FusedProjectionCE.apply(h, weight, bias, tgt, float(epsilon), rows, torch.is_grad_enabled())
    return loss, nll, ntokens


def bits_per_token(loss_sum: float, ntokens: int) -> float:
    """Loss per target token in bits (base 2), as fairseq reports it."""
    return loss_sum / max(ntokens, 1) / math.log(2)


def perplexity(bits: float) -> float:
    """2 ** bits, capped so a diverged run prints inf rather than raising OverflowError."""
    return 2.0 ** bits if bits < 1000 else math.inf
