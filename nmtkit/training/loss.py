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
"""

from __future__ import annotations

import math

import torch


class _LabelSmoothedCE(torch.autograd.Function):
    """Sum over non-pad positions of the smoothed loss; also returns the nll sum (no gradient)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int):
        # z: (N, V) float32 logits; target: (N,) long
        vocab = z.size(1)
        keep = target != ignore_index  # (N,)
        mask = keep.to(z.dtype)
        lse = torch.logsumexp(z, dim=1)  # (N,)
        nll = lse - z.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
        if epsilon > 0:
            eps_i = epsilon / (vocab - 1)
            smooth = vocab * lse - z.sum(dim=1)  # (N,)
            loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
        else:
            eps_i = 0.0
            loss = nll
        ctx.save_for_backward(z, lse, target, mask)
        ctx.eps, ctx.eps_i = epsilon, eps_i
        ctx.mark_non_differentiable(nll)
        return (loss * mask).sum(), (nll * mask).sum()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        z, lse, target, mask = ctx.saved_tensors
        w = (mask * grad_loss).unsqueeze(1)  # (N, 1) upstream gradient, 0 at padding
        grad = torch.sub(z, lse.unsqueeze(1)).exp_()  # (N, V) softmax, one buffer
        if ctx.eps_i:
            torch.addcmul(w * -ctx.eps_i, grad, w, out=grad)  # (softmax - eps_i) * w in one pass
        else:
            grad.mul_(w)
        gold = -(1.0 - ctx.eps - ctx.eps_i) * w  # (N, 1)
        grad.scatter_add_(1, target.unsqueeze(1), gold)  # (softmax - q) * w
        return grad, None, None, None


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


def bits_per_token(loss_sum: float, ntokens: int) -> float:
    """Loss per target token in bits (base 2), as fairseq reports it."""
    return loss_sum / max(ntokens, 1) / math.log(2)


def perplexity(bits: float) -> float:
    """2 ** bits, capped so a diverged run prints inf rather than raising OverflowError."""
    return 2.0 ** bits if bits < 1000 else math.inf
