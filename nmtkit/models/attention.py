"""Multi-head scaled dot-product attention (paper section 3.2) and its incremental K/V cache.

Why `torch.nn.functional.scaled_dot_product_attention`: it computes exactly
`softmax(Q K^T / sqrt(d_k)) V` (its default scale is 1/sqrt of the query's last dimension, i.e.
1/sqrt(d_k)) and dispatches to the fused flash / memory-efficient kernels where the hardware has
them, falling back to the plain math on CPU. Masks are boolean, True = "may attend".

The projections have no bias, as in the paper's `Q W_i^Q`, `K W_i^K`, `V W_i^V`, `Concat(...) W^O`
(and tensor2tensor); `bias=True` (`ArchConfig.attention_bias`) adds biases, which the models that
nmtkit imports (MarianMT, fairseq) have. Self-attention uses one fused Q|K|V projection (one matmul instead of three);
encoder-decoder attention projects Q from the decoder and a fused K|V from the encoder output,
which decoding computes once per sentence. Per-head key size d_k and value size d_v may differ
(Table 3 row B changes d_k alone).

Attention weights on request (`capture_attention`): SDPA never returns the weights, so a module
whose `capture` list is set computes `softmax(Q K^T / sqrt(d_k) + mask)` explicitly, appends the
weights (post-softmax, before dropout) to that list, and multiplies them with V itself. Only the
modules asked for take that path, and only while asked; decoding and training run the same SDPA
call as ever (the one check is `self.capture is not None`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@functools.cache
def _without_default_init(module_cls: type[nn.Module]) -> type[nn.Module]:
    return type(module_cls.__name__, (module_cls,), {"reset_parameters": lambda self: None})


def uninitialized(module_cls: type[nn.Module], *args, **kwargs) -> nn.Module:
    """Construct without the default init (every caller initializes explicitly).

    Why: nn.Linear / nn.Embedding draw random weights that we overwrite at once; skipping that
    halves model construction time (seconds for the big model). Honors `with torch.device(...)`
    (e.g. the meta device for parameter counting). The module is built as a subclass whose
    `reset_parameters` does nothing, then given back its own class. (torch.nn.utils.skip_init
    does the same through the meta device, but there nn.Embedding's init imports torch._dynamo:
    1.4 s added to every `nmtkit generate` start, measured.)
    """
    module = _without_default_init(module_cls)(*args, **kwargs)
    module.__class__ = module_cls
    return module


class MultiheadAttention(nn.Module):
    """h heads of scaled dot-product attention followed by the output projection W^O."""

    # Set to a list by `capture_attention` (None: the SDPA fast path). A class attribute, not
    # module state: it is neither saved in checkpoints nor copied by `to()`.
    capture: list[Tensor] | None = None

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, dropout: float,
                 self_attention: bool, bias: bool = False):
        super().__init__()
        self.heads, self.d_k, self.d_v = heads, d_k, d_v
        self.dropout = dropout
        self.self_attention = self_attention
        # bias=True: fairseq's projections (`ArchConfig.attention_bias`); the paper's have none
        if self_attention:
            self.qkv_proj = uninitialized(nn.Linear, d_model, heads * (2 * d_k + d_v), bias=bias)
        else:
            self.q_proj = uninitialized(nn.Linear, d_model, heads * d_k, bias=bias)
            self.kv_proj = uninitialized(nn.Linear, d_model, heads * (d_k + d_v), bias=bias)
        self.out_proj = uninitialized(nn.Linear, heads * d_v, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-uniform per projection matrix (as if W^Q, W^K, W^V were separate Linears)."""
        hk, hv = self.heads * self.d_k, self.heads * self.d_v
        if self.self_attention:
            w = self.qkv_proj.weight  # (2*hk + hv, d_model)
            for a, b in ((0, hk), (hk, 2 * hk), (2 * hk, 2 * hk + hv)):
                nn.init.xavier_uniform_(w[a:b])
        else:
            nn.init.xavier_uniform_(self.q_proj.weight)
            w = self.kv_proj.weight  # (hk + hv, d_model)
            nn.init.xavier_uniform_(w[:hk])
            nn.init.xavier_uniform_(w[hk:])
        nn.init.xavier_uniform_(self.out_proj.weight)
        for m in self.children():  # `attention_bias` (imported models): biases start at zero
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    # ---- projections ---------------------------------------------------------------------------
    def _heads(self, x: Tensor, d: int) -> Tensor:
        """(B, T, h*d) -> (B, h, T, d) (a view; SDPA accepts the strides)."""
        b, t, _ = x.shape
        return x.view(b, t, self.heads, d).transpose(1, 2)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention inputs: x (B, T, D) -> q, k (B, h, T, d_k), v (B, h, T, d_v)."""
        hk = self.heads * self.d_k
        q, k, v = self.qkv_proj(x).split([hk, hk, self.heads * self.d_v], dim=-1)
        return self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)

    def project_q(self, x: Tensor) -> Tensor:
        """Encoder-decoder attention query: x (B, T, D) -> (B, h, T, d_k)."""
        return self._heads(self.q_proj(x), self.d_k)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder-decoder keys/values: memory (B, S, D) -> k (B, h, S, d_k), v (B, h, S, d_v)."""
        k, v = self.kv_proj(memory).split([self.heads * self.d_k, self.heads * self.d_v], dim=-1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    # ---- attention -----------------------------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
               is_causal: bool = False) -> Tensor:
        """softmax(q k^T / sqrt(d_k)) v over heads, then W^O: -> (B, T, D).

        attn_mask: bool, broadcastable to (B, h, T, S), True = may attend (padding: (B, 1, 1, S)).
        """
        p = self.dropout if self.training else 0.0
        if self.capture is not None:
            o = self._explicit_attention(q, k, v, attn_mask, is_causal, p)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p,
                                               is_causal=is_causal)  # (B, h, T, d_v)
        b, _, t, _ = o.shape
        return self.out_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.d_v))

    def _explicit_attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
                            is_causal: bool, dropout_p: float) -> Tensor:
        """What SDPA computes, step by step, keeping the weights: appends them to `self.capture`.

        q (B, h, T, d_k), k (B, h, S, d_k), v (B, h, S, d_v) -> (B, h, T, d_v). The weights
        (B, h, T, S) are float32 whatever the activations' dtype (softmax in float32, as the fused
        kernels accumulate), exactly 0 where the mask forbids (padding, the future: -inf before
        the softmax), and taken before dropout (what the model attends to, not one noisy sample).
        """
        scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, h, T, S)
        allowed = attn_mask
        if is_causal:  # SDPA's is_causal: query i sees keys 0..i (top-left aligned)
            t, s = scores.shape[-2:]
            causal = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril()
            allowed = causal if allowed is None else allowed & causal
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, h, T, S); rows sum to 1
        self.capture.append(weights.detach())
        if dropout_p > 0.0:
            weights = F.dropout(weights, dropout_p, True)
        return torch.matmul(weights.to(v.dtype), v)  # (B, h, T, d_v)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """Self-attention over the whole sequence x (B, T, D) -> (B, T, D)."""
        q, k, v = self.project_qkv(x)
        return self.attend(q, k, v, attn_mask=attn_mask, is_causal=is_causal)

    def forward_step(self, x: Tensor, cache: "KVCache") -> Tensor:
        """Self-attention for the newest position only: x (B, 1, D) -> (B, 1, D).

        Appends this position's key/value to `cache` and attends over every cached position; no
        mask is needed since the cache holds only the past and the present.
        """
        q, k, v = self.project_qkv(x)
        k_all, v_all = cache.append(k, v)
        return self.attend(q, k_all, v_all)


@contextlib.contextmanager
def capture_attention(modules: Sequence[MultiheadAttention]) -> Iterator[list[list[Tensor]]]:
    """Inside the block, `modules` take the explicit path and record their weights.

    Yields one list per module; each call of a module's attention appends its weights
    (B, h, T, S) float32 to that module's list (a teacher-forced forward pass calls each module
    once). The modules are back on the SDPA path when the block ends, whatever happens.
    """
    stores: list[list[Tensor]] = [[] for _ in modules]
    for m, store in zip(modules, stores):
        if m.capture is not None:
            raise RuntimeError("capture_attention: a module is captured twice (nested blocks)")
        m.capture = store
    try:
        yield stores
    finally:
        for m in modules:
            m.capture = None


class KVCache:
    """Self-attention keys/values of the positions decoded so far, for one decoder layer.

    Why a growing buffer rather than `torch.cat` each step: cat copies the whole history every
    step; appending into spare capacity copies one position, and capacity doubles when full (or is
    allocated once when the caller knows the maximum length). See docs/model.md for the timings.
    """

    SLACK = 1  # free positions a reordered buffer keeps: room for the next step's append

    def __init__(self, capacity: int | None = None):
        self.k: Tensor | None = None  # (B, h, capacity, d_k)
        self.v: Tensor | None = None  # (B, h, capacity, d_v)
        self.length = 0
        self._initial_capacity = capacity

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k (B, h, n, d_k), v (B, h, n, d_v); return views of all cached keys and values."""
        n = k.size(2)
        if self.k is None:
            cap = max(self._initial_capacity or 16, n)
            self.k = k.new_empty(k.size(0), k.size(1), cap, k.size(3))
            self.v = v.new_empty(v.size(0), v.size(1), cap, v.size(3))
        elif self.length + n > self.k.size(2):
            cap = max(2 * self.k.size(2), self.length + n)
            self.k = self._grow(self.k, cap)
            self.v = self._grow(self.v, cap)
        self.k[:, :, self.length:self.length + n] = k
        self.v[:, :, self.length:self.length + n] = v
        self.length += n
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def _grow(self, buf: Tensor, cap: int) -> Tensor:
        new = buf.new_empty(buf.size(0), buf.size(1), cap, buf.size(3))
        new[:, :, :self.length] = buf[:, :, :self.length]
        return new

    def index_select(self, new_order: Tensor) -> None:
        """Keep/reorder batch rows in place: row i becomes old row new_order[i]."""
        if self.k is not None:
            self.k = self._select(self.k, new_order)
            self.v = self._select(self.v, new_order)

    def _select(self, buf: Tensor, order: Tensor) -> Tensor:
        # Copy only the used prefix (beam search reorders every step: the spare capacity would
        # double the copy), into a new buffer with room for SLACK more positions: beam search
        # reorders after every step, so the buffer never has to grow and holds no unused
        # positions once the step's key is appended (a doubling buffer holds up to as many as it
        # uses: at batch 128 that was a third of the decoding memory; 8 spare positions instead
        # of 1 cost 80 MiB of peak RSS at batch 128, measured). Greedy search and sampling
        # reorder only when a sentence finishes; their buffer doubles at the second append after
        # it, as it would have after the eighth (greedy at batch 128: the same time, measured).
        # A capacity given up front is kept.
        cap = max(self._initial_capacity or 0, self.length + self.SLACK)
        new = buf.new_empty(order.size(0), buf.size(1), cap, buf.size(3))
        torch.index_select(buf[:, :, :self.length], 0, order, out=new[:, :, :self.length])
        return new
