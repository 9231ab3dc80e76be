"""The Transformer encoder-decoder of Vaswani et al. (2017), section 3, and incremental decoding.

Faithful to the paper by default (see docs/model.md for every choice and its source):
- each sub-layer is wrapped as `LayerNorm(x + Dropout(Sublayer(x)))` (post-norm);
  `normalize_before=True` gives `x + Dropout(Sublayer(LayerNorm(x)))` plus a final LayerNorm per
  stack (pre-norm, a later variant);
- token embeddings are multiplied by sqrt(d_model), sinusoidal positions are added, and dropout is
  applied to the sum;
- the feed-forward network is `max(0, x W1 + b1) W2 + b2`;
- with `share_embeddings="all"` the source embedding, target embedding and pre-softmax projection
  are one matrix (needs a joint vocabulary).

The interface (docs/internals.md) is what training and beam search code against:
`forward` (with `features_only` and `output_projection` for the training loss), `encode`,
`new_cache`, `decode_step`, `EncoderOut.index_select`, `DecoderCache.index_select`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmtkit.errors import UserError
from nmtkit.models.attention import KVCache, MultiheadAttention, capture_attention, uninitialized
from nmtkit.models.registry import ArchConfig


# The three attentions of the model (docs/inspect.md): encoder self-attention, masked decoder
# self-attention, encoder-decoder ("cross") attention.
ATTENTION_KINDS = ("enc-self", "dec-self", "cross")

# the ids of <s> and </s> in every nmtkit dictionary (docs/internals.md, "Special symbols")
BOS_ID, EOS_ID = 1, 2


def sinusoid_table(max_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...); pos from 0.

    Returns (max_positions, d_model) float32. Computed in float64 so that long positions keep
    their precision before the cast.
    """
    pos = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), two_i / d_model)
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


# fairseq's first position: its padding_idx (1) + 1 (fairseq.utils.make_positions)
FAIRSEQ_FIRST_POSITION = 2


def fairseq_sinusoid_table(max_positions: int, d_model: int) -> Tensor:
    """fairseq's SinusoidalPositionalEmbedding, row p for nmtkit's position p (fairseq's p + 2).

    fairseq: half = d_model // 2, frequencies exp(-i log(10000) / (half - 1)) for i < half, the
    row [sin(pos f) | cos(pos f)] (halves, not interleaved), a zero column when d_model is odd,
    positions counted from padding_idx + 1 = 2. Computed in float32 as fairseq does, so that the
    imported model adds the very values it was trained with. -> (max_positions, d_model).
    """
    half = d_model // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))  # (half,)
    pos = torch.arange(FAIRSEQ_FIRST_POSITION, FAIRSEQ_FIRST_POSITION + max_positions, dtype=torch.float)
    angle = pos.unsqueeze(1) * freq.unsqueeze(0)  # (P, half)
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)  # (P, 2 * half)
    if d_model % 2:
        table = torch.cat([table, torch.zeros(max_positions, 1)], dim=1)
    return table


@functools.lru_cache(maxsize=8)
def _cached_sinusoid_table(max_positions: int, d_model: int, form: str = "paper") -> Tensor:
    if form == "fairseq":
        return fairseq_sinusoid_table(max_positions, d_model)
    return sinusoid_table(max_positions, d_model)


def _normal_(weight: Tensor, std: float) -> None:
    """N(0, std^2) init, skipped on the meta device (`Transformer.from_state_dict`), where there
    is nothing to fill and torch routes normal_ through code that imports torch._dynamo (1.5 s
    added to every start, measured)."""
    if not weight.is_meta:
        nn.init.normal_(weight, mean=0.0, std=std)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """A boolean attention mask (True = may attend) as the float that attention adds to the
    scores (0 or -inf), or None when nothing is masked.

    Why: decoding attends to the same source at every step; given a bool mask, SDPA converts it
    to exactly this float tensor at every call (a `where` per layer and step), and with no
    padding (one sentence, or equal lengths) there is nothing to add at all. Same numbers.
    """
    if bool(mask.all()):
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class PositionalEncoding(nn.Module):
    """Position vectors for positions [offset, offset + length): sinusoidal or learned."""

    def __init__(self, max_positions: int, d_model: int, learned: bool, which: str, form: str = "paper"):
        super().__init__()
        self.max_positions, self.d_model, self.learned, self.which = max_positions, d_model, learned, which
        self.form = form  # the sinusoid table's ("paper" or "fairseq", ArchConfig.sinusoid)
        if learned:
            self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        else:
            # Not persistent: a function of the config, so checkpoints need not carry it.
            self.register_buffer("table", torch.empty(max_positions, d_model), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Learned: N(0, d^-1/2); sinusoidal: (re)fill the table (e.g. after `to_empty`)."""
        with torch.no_grad():
            if self.learned:
                _normal_(self.weight, std=self.d_model**-0.5)
            elif self.table.device.type != "meta":
                self.table.copy_(_cached_sinusoid_table(self.max_positions, self.d_model, self.form))

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """-> (length, d_model)."""
        if offset + length > self.max_positions:
            raise UserError(
                f"a {self.which} of {offset + length} tokens exceeds --max-{self.which}-positions "
                f"{self.max_positions} (filter long sentences or raise the limit)"
            )
        w = self.weight if self.learned else self.table
        return w[offset:offset + length]


# --activation: the paper's ReLU, or the smooth ones of imported models (torch's exact GELU, as
# transformers' "gelu"; swish = SiLU, as transformers' "swish" / "silu")
ACTIVATION_FUNCTIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """act(x W1 + b1) W2 + b2 (act = max(0, .) in the paper; optional dropout after it)."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float, activation: str = "relu"):
        super().__init__()
        self.act = ACTIVATION_FUNCTIONS[activation]
        self.fc1 = uninitialized(nn.Linear, d_model, d_ff)
        self.fc2 = uninitialized(nn.Linear, d_ff, d_model)
        self.activation_dropout = activation_dropout
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.fc1(x))  # (B, T, d_ff)
        if self.training:  # (an eval-mode dropout call is a no-op that still costs a dispatch)
            h = F.dropout(h, self.activation_dropout, self.training)
        return self.fc2(h)


class _Sublayers(nn.Module):
    """Shared residual wrapping for encoder and decoder layers."""

    normalize_before: bool
    dropout: float

    def _pre(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(x) if self.normalize_before else x

    def _post(self, residual: Tensor | None, y: Tensor, norm: nn.LayerNorm) -> Tensor:
        """residual None: the sub-layer's output alone goes on (`encoder_no_residual_layer`)."""
        if self.training:  # skipped in eval: a no-op call per sub-layer and decoding step
            y = F.dropout(y, self.dropout, self.training)
        x = y if residual is None else residual + y
        return x if self.normalize_before else norm(x)


class EncoderLayer(_Sublayers):
    """[self-attention, feed-forward], each wrapped with residual + dropout + LayerNorm.

    `residual=False` drops the self-attention's residual connection (Liu et al., 2021, "Improving
    zero-shot translation by disentangling positional information"): the residual carries each
    source token's own embedding and position up the stack, which ties the encoder's outputs to
    the source language's word order; without it in one middle layer, each output is a mix over
    the sentence, closer across languages, and zero-shot directions improve.
    """

    def __init__(self, cfg: ArchConfig, residual: bool = True):
        super().__init__()
        self.normalize_before, self.dropout, self.residual = cfg.normalize_before, cfg.dropout, residual
        self.self_attn = MultiheadAttention(cfg.d_model, cfg.heads, cfg.head_dim_k, cfg.head_dim_v,
                                            cfg.attention_dropout, self_attention=True, bias=cfg.attention_bias)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, attn_mask: Tensor) -> Tensor:
        """x (B, S, D), attn_mask (B, 1, 1, S) True = real key -> (B, S, D)."""
        x = self._post(x if self.residual else None,
                       self.self_attn(self._pre(x, self.self_attn_norm), attn_mask=attn_mask), self.self_attn_norm)
        return self._post(x, self.ffn(self._pre(x, self.ffn_norm)), self.ffn_norm)


class DecoderLayer(_Sublayers):
    """[masked self-attention, encoder-decoder attention, feed-forward], each wrapped."""

    def __init__(self, cfg: ArchConfig):
        super().__init__()
        self.normalize_before, self.dropout = cfg.normalize_before, cfg.dropout
        dk, dv = cfg.head_dim_k, cfg.head_dim_v
        self.self_attn = MultiheadAttention(cfg.d_model, cfg.heads, dk, dv, cfg.attention_dropout,
                                            self_attention=True, bias=cfg.attention_bias)
        self.self_attn_norm = nn.LayerNorm(cfg.d_model)
        self.cross_attn = MultiheadAttention(cfg.d_model, cfg.heads, dk, dv, cfg.attention_dropout,
                                             self_attention=False, bias=cfg.attention_bias)
        self.cross_attn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout, cfg.activation)
        self.ffn_norm = nn.LayerNorm(cfg.d_model)

    def _cross(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Encoder-decoder sub-layer: x (N, T, D) attends to k, v (M, h, S, d) with mask (M, 1, 1, S)
        (bool, True = may attend, or float added to the scores, or None).

        N must be a multiple of M: rows g*i ... g*i + g-1 of x (g = N / M; in beam search, the
        hypotheses of one sentence) attend to memory row i, as one batch of g*T queries, so the
        beams of a sentence read one copy of its K/V. Teacher forcing has N = M.
        """
        h = self._pre(x, self.cross_attn_norm)
        attn = self.cross_attn
        q = attn.q_proj(h).reshape(k.size(0), -1, attn.heads, attn.d_k).transpose(1, 2)  # (M, h, g*T, d_k)
        y = attn.attend(q, k, v, attn_mask=mask)  # (M, g*T, D)
        return self._post(x, y.reshape(x.shape), self.cross_attn_norm)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """Teacher forcing: x (B, T, D), memory (B, S, D), memory_mask (B, 1, 1, S) -> (B, T, D).

        Target padding needs no mask: it is on the right, so the causal mask already hides it from
        every real position, and every (pad) query still sees at least position 0.
        """
        x = self._post(x, self.self_attn(self._pre(x, self.self_attn_norm), is_causal=True),
                       self.self_attn_norm)
        k, v = self.cross_attn.project_kv(memory)
        x = self._cross(x, k, v, memory_mask)
        return self._post(x, self.ffn(self._pre(x, self.ffn_norm)), self.ffn_norm)

    def forward_step(self, x: Tensor, memory: Tensor, memory_mask: Tensor | None,
                     cache: "LayerCache") -> Tensor:
        """One new position: x (N, 1, D) -> (N, 1, D), using and growing `cache`.

        memory (M, S, D) and memory_mask (M, 1, 1, S) are read at the first step only, when the
        encoder-side K/V are computed and cached; later steps may run on N = M * g rows, g per
        memory row (see `_cross`), so that beams share one copy of the K/V.
        """
        x = self._post(x, self.self_attn.forward_step(self._pre(x, self.self_attn_norm), cache.self_kv),
                       self.self_attn_norm)
        if cache.cross_k is None:  # first step: the encoder-side K/V, once per memory row
            k, v = self.cross_attn.project_kv(memory)  # strided views of one projection
            cache.cross_k, cache.cross_v = k.contiguous(), v.contiguous()  # read every step
            cache.cross_mask = memory_mask
            cache.cross_bias = additive_mask(memory_mask, k.dtype)
        x = self._cross(x, cache.cross_k, cache.cross_v, cache.cross_bias)
        return self._post(x, self.ffn(self._pre(x, self.ffn_norm)), self.ffn_norm)


@dataclass
class EncoderOut:
    """Encoder output: out (B, S, D) and padding_mask (B, S) bool, True = pad."""

    out: Tensor
    padding_mask: Tensor

    @property
    def attn_mask(self) -> Tensor:
        """(B, 1, 1, S) bool, True = a real source token (may be attended)."""
        return ~self.padding_mask[:, None, None, :]

    def index_select(self, new_order: Tensor) -> "EncoderOut":
        """A new EncoderOut whose row i is old row new_order[i] (beam expansion/reordering)."""
        return EncoderOut(self.out.index_select(0, new_order),
                          self.padding_mask.index_select(0, new_order))


class LayerCache:
    """One decoder layer's incremental state: self-attention K/V and encoder-side K/V.

    The encoder-side K/V have one row per memory row (M, usually one per sentence), shared by
    the N = M * g decoder rows of its beam (DecoderLayer.forward_step).
    """

    def __init__(self, capacity: int | None):
        self.self_kv = KVCache(capacity)
        self.cross_k: Tensor | None = None  # (M, h, S, d_k)
        self.cross_v: Tensor | None = None  # (M, h, S, d_v)
        self.cross_mask: Tensor | None = None  # (M, 1, 1, S) bool, True = a real source token
        # what attention adds to the scores: 0 / -inf, or None when no row has padding
        self.cross_bias: Tensor | None = None  # (M, 1, 1, S) float


class DecoderCache:
    """Incremental decoding state of the whole decoder (one LayerCache per layer).

    `length` is the number of target positions decoded so far; it gives the next position.
    """

    def __init__(self, num_layers: int, capacity: int | None = None):
        self.layers = [LayerCache(capacity) for _ in range(num_layers)]
        self.length = 0

    def index_select(self, new_order: Tensor, include_encoder: bool = True) -> None:
        """Reorder/keep batch rows in place: row i becomes old row new_order[i].

        The encoder-side K/V follow at the level of memory rows: when the new rows still come in
        equal groups that each draw on one memory row (beam expansion, reordering within beams,
        finished sentences leaving), only those memory rows are kept; otherwise each new row gets
        its own copy. include_encoder=False leaves the encoder-side K/V alone: beam search may
        pass it when new_order only moves rows among the beams of one sentence.
        """
        first = self.layers[0]
        n_old = first.self_kv.k.size(0) if first.self_kv.k is not None else None
        for lc in self.layers:
            lc.self_kv.index_select(new_order)
        if not include_encoder or first.cross_k is None or n_old is None:
            return
        m_old = first.cross_k.size(0)
        row_memory = torch.div(new_order, n_old // m_old, rounding_mode="floor")  # (N_new,)
        memory_order = torch.unique_consecutive(row_memory)  # (M_new,)
        n, m = row_memory.numel(), memory_order.numel()
        if n % m != 0 or not bool((row_memory.view(m, n // m) == memory_order[:, None]).all()):
            memory_order = row_memory  # not grouped: one memory row per decoder row
        elif m == m_old and bool((memory_order == torch.arange(m, device=memory_order.device)).all()):
            return  # the same memory rows (e.g. a beam expansion): nothing to copy
        for lc in self.layers:
            lc.cross_k = lc.cross_k.index_select(0, memory_order)
            lc.cross_v = lc.cross_v.index_select(0, memory_order)
            lc.cross_mask = lc.cross_mask.index_select(0, memory_order)
            if lc.cross_bias is not None:
                lc.cross_bias = lc.cross_bias.index_select(0, memory_order)


class Transformer(nn.Module):
    """Encoder-decoder Transformer. See docs/internals.md for the interface, docs/model.md for why."""

    def __init__(self, cfg: ArchConfig, src_vocab_size: int, tgt_vocab_size: int, pad_idx: int = 0):
        super().__init__()
        cfg.validate()
        if src_vocab_size <= pad_idx or tgt_vocab_size <= pad_idx:
            raise UserError(f"vocabulary sizes ({src_vocab_size}, {tgt_vocab_size}) must exceed "
                            f"the padding index {pad_idx}")
        if cfg.share_embeddings == "all" and src_vocab_size != tgt_vocab_size:
            raise UserError(
                f"--share-embeddings all needs one joint vocabulary, but the source has "
                f"{src_vocab_size} symbols and the target {tgt_vocab_size} (preprocess with "
                f"--joined-dictionary, or use --share-embeddings decoder / none)"
            )
        self.cfg, self.pad_idx = cfg, pad_idx
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        d = cfg.d_model
        self.embed_scale = math.sqrt(d) if cfg.scale_embedding else 1.0  # imported models may have 1

        self.tgt_embed = self._embedding(tgt_vocab_size, d, pad_idx)
        self.src_embed = (self.tgt_embed if cfg.share_embeddings == "all"
                          else self._embedding(src_vocab_size, d, pad_idx))
        self.out_proj = uninitialized(nn.Linear, d, tgt_vocab_size, bias=False)
        if cfg.share_embeddings in ("all", "decoder"):
            self.out_proj.weight = self.tgt_embed.weight
        else:
            _normal_(self.out_proj.weight, std=d**-0.5)

        self.src_pos = PositionalEncoding(cfg.max_source_positions, d, cfg.learned_pos, "source", cfg.sinusoid)
        self.tgt_pos = PositionalEncoding(cfg.max_target_positions, d, cfg.learned_pos, "target", cfg.sinusoid)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, residual=i + 1 != cfg.encoder_no_residual_layer)
                                            for i in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm leaves the residual stream unnormalized: one final LayerNorm per stack.
        self.encoder_norm = nn.LayerNorm(d) if cfg.normalize_before else None
        self.decoder_norm = nn.LayerNorm(d) if cfg.normalize_before else None

    @classmethod
    def from_state_dict(cls, cfg: ArchConfig, src_vocab_size: int, tgt_vocab_size: int, state_dict: dict,
                        pad_idx: int = 0) -> "Transformer":
        """A model whose parameters are `state_dict`'s tensors themselves (no copy, no init).

        Why: building a model the usual way draws random weights that loading then overwrites,
        and `load_state_dict` copies every tensor once more; for inference both are wasted work
        at start-up (and a second copy of the weights in memory). The model is built on the meta
        device (no storage), the tensors are assigned, the tied matrices are tied again (the
        assignment gives each name its own Parameter) and the sinusoid tables, which checkpoints
        do not carry, are computed. Raises RuntimeError (from load_state_dict) when the tensors
        do not fit `cfg`.
        """
        with torch.device("meta"):
            model = cls(cfg, src_vocab_size, tgt_vocab_size, pad_idx=pad_idx)
        model.load_state_dict(state_dict, assign=True)
        if cfg.share_embeddings in ("all", "decoder"):
            model.out_proj.weight = model.tgt_embed.weight
        for pe in (model.src_pos, model.tgt_pos):
            if not pe.learned:
                pe.table = torch.empty(pe.max_positions, pe.d_model)
                pe.reset_parameters()
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if left:  # every tensor must have come from state_dict (strict loading ensures it)
            raise RuntimeError(f"tensors left without values: {', '.join(left)}")
        return model

    @staticmethod
    def _embedding(vocab: int, d: int, pad_idx: int) -> nn.Embedding:
        emb = uninitialized(nn.Embedding, vocab, d, padding_idx=pad_idx)
        # N(0, d^-1/2): after the sqrt(d) scaling the embeddings have unit variance, and as the
        # (shared) output projection the initial logits stay O(1) (tensor2tensor, fairseq).
        _normal_(emb.weight, std=d**-0.5)
        with torch.no_grad():
            emb.weight[pad_idx].zero_()
        return emb

    @property
    def max_source_positions(self) -> int:
        return self.cfg.max_source_positions

    @property
    def max_target_positions(self) -> int:
        return self.cfg.max_target_positions

    # ---- encoder -------------------------------------------------------------------------------
    def encode(self, src_tokens: Tensor) -> EncoderOut:
        """src_tokens (B, S) long, right-padded with pad_idx -> EncoderOut."""
        padding_mask = src_tokens.eq(self.pad_idx)  # (B, S) True = pad
        attn_mask = ~padding_mask[:, None, None, :]  # (B, 1, 1, S) True = attend
        x = self.src_embed(src_tokens) * self.embed_scale + self.src_pos(src_tokens.size(1))
        x = F.dropout(x, self.cfg.dropout, self.training)  # (B, S, D)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return EncoderOut(x, padding_mask)

    # ---- decoder -------------------------------------------------------------------------------
    def _start(self, prev_output_tokens: Tensor) -> Tensor:
        """The decoder's input ids with <s> read as </s> when `decoder_start` is "eos": fairseq
        starts decoding (and trains) with </s>, and its <s> row is an output like any other, so
        the row cannot simply be copied (docs/fairseq.md). (B, T) -> (B, T)."""
        if self.cfg.decoder_start == "eos":
            return prev_output_tokens.masked_fill(prev_output_tokens.eq(BOS_ID), EOS_ID)
        return prev_output_tokens

    def output_logits(self, h: Tensor) -> Tensor:
        """Pre-softmax projection: h (B, T, D) -> logits (B, T, V_tgt)."""
        return self.out_proj(h)

    def decode(self, prev_output_tokens: Tensor, enc: EncoderOut, logits: bool = True) -> Tensor:
        """Teacher-forced decoder: prev_output_tokens (B, T) -> logits (B, T, V_tgt), or with
        logits=False the final hidden states (B, T, D) (no output projection)."""
        x = self.tgt_embed(self._start(prev_output_tokens)) * self.embed_scale
        x = x + self.tgt_pos(prev_output_tokens.size(1))
        x = F.dropout(x, self.cfg.dropout, self.training)  # (B, T, D)
        mask = enc.attn_mask
        for layer in self.decoder_layers:
            x = layer(x, enc.out, mask)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.output_logits(x) if logits else x

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor, features_only: bool = False) -> Tensor:
        """(B, S) long, (B, T) long -> logits (B, T, V_tgt) (in the autocast dtype, if any), or with
        features_only=True the decoder's final hidden states (B, T, D), which the training loss
        projects itself (`output_projection`) a few positions at a time: the whole batch's
        (B, T, V_tgt) logits would be the largest tensors of a training step."""
        return self.decode(prev_output_tokens, self.encode(src_tokens), logits=not features_only)

    def restricted_output(self, ids: Tensor) -> Callable[[Tensor], Tensor]:
        """The output projection over the target ids `ids` (C,) long only (a lexical shortlist's
        candidates for one batch): h (B, T, D) -> logits (B, T, C), column c equal to the full
        projection's column ids[c]. Built once per batch; the CPU inference kernels slice their
        own rows (`nmtkit.models.quantize`)."""
        proj = self.out_proj
        if hasattr(proj, "rows"):
            return proj.rows(ids)
        weight = proj.weight.index_select(0, ids)  # (C, D)
        bias = None if proj.bias is None else proj.bias.index_select(0, ids)
        return lambda h: F.linear(h, weight, bias)

    def output_projection(self) -> tuple[Tensor, Tensor | None]:
        """(weight (V_tgt, D), bias (V_tgt,) or None) of the pre-softmax projection: the target
        embedding itself when tied. output_logits(h) == F.linear(h, weight, bias)."""
        return self.out_proj.weight, self.out_proj.bias

    # ---- attention weights on request ----------------------------------------------------------
    def attention_modules(self, kind: str) -> list[MultiheadAttention]:
        """The attention modules of one kind (ATTENTION_KINDS), one per layer, bottom first."""
        if kind == "enc-self":
            return [layer.self_attn for layer in self.encoder_layers]
        if kind == "dec-self":
            return [layer.self_attn for layer in self.decoder_layers]
        if kind == "cross":
            return [layer.cross_attn for layer in self.decoder_layers]
        raise ValueError(f"unknown attention kind {kind!r} (expected one of {', '.join(ATTENTION_KINDS)})")

    def forward_with_attention(self, src_tokens: Tensor, prev_output_tokens: Tensor,
                               which: dict[str, list[int] | None] | None = None, logits: bool = True
                               ) -> tuple[Tensor | None, dict[str, dict[int, Tensor]]]:
        """A teacher-forced forward pass that also returns attention weights.

        which: kind -> 0-based layer indices (None: every layer); default every layer of every
        kind. Only those modules leave the SDPA path (memory: B x h x rows x cols floats each).
        Returns (logits (B, T, V_tgt), or None with logits=False, which skips the output
        projection: alignments need no (B, T, V) tensor; {kind: {layer: weights}}) with weights float32 of
        enc-self (B, h, S, S), dec-self (B, h, T, T), cross (B, h, T, S): post-softmax, before
        dropout; row t of the decoder's is the query of input position t, which predicts output
        token t. Rows of padded queries are computed but meaningless; padded keys get exactly 0.
        """
        which = {k: None for k in ATTENTION_KINDS} if which is None else which
        picked: list[tuple[str, int]] = []
        modules: list[MultiheadAttention] = []
        for kind, layers in which.items():
            mods = self.attention_modules(kind)
            for i in range(len(mods)) if layers is None else layers:
                if not 0 <= i < len(mods):
                    raise ValueError(f"{kind} layer {i} out of range (the model has {len(mods)})")
                picked.append((kind, i))
                modules.append(mods[i])
        with capture_attention(modules) as stores:
            out_logits = self.decode(prev_output_tokens, self.encode(src_tokens), logits=logits)
        out: dict[str, dict[int, Tensor]] = {kind: {} for kind in which}
        for (kind, i), store in zip(picked, stores):
            out[kind][i] = store[0]
        return (out_logits if logits else None), out

    # ---- incremental decoding ------------------------------------------------------------------
    def new_cache(self, max_len: int | None = None) -> DecoderCache:
        """An empty decoding state. max_len (optional): allocate K/V for that many steps at once."""
        return DecoderCache(len(self.decoder_layers), max_len)

    def decode_step(self, prev_tokens_last: Tensor, enc: EncoderOut, cache: DecoderCache,
                    output: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """The newest target token (B, 1) -> logits for the next one (B, 1, V_tgt); grows cache.

        The token's position is `cache.length` (0 for the first input, <s>). enc and cache must
        have been reordered with the same new_order. `output`: the projection to use instead of
        the whole vocabulary's (`restricted_output`: (B, 1, C) logits).
        """
        pos = cache.length
        if pos == 0:
            prev_tokens_last = self._start(prev_tokens_last)
        x = self.tgt_embed(prev_tokens_last) * self.embed_scale + self.tgt_pos(1, offset=pos)
        if self.training:
            x = F.dropout(x, self.cfg.dropout, self.training)  # (B, 1, D)
        # the encoder mask is read at the first step only (then the cache holds what it needs)
        mask = enc.attn_mask if cache.layers and cache.layers[0].cross_k is None else None
        for layer, lc in zip(self.decoder_layers, cache.layers):
            x = layer.forward_step(x, enc.out, mask, lc)
        cache.length += 1
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.output_logits(x) if output is None else output(x)


def count_parameters(cfg: ArchConfig, src_vocab_size: int, tgt_vocab_size: int | None = None) -> int:
    """Number of distinct parameters (tied matrices counted once), without allocating them."""
    tgt = src_vocab_size if tgt_vocab_size is None else tgt_vocab_size
    if cfg.share_embeddings == "all" and tgt != src_vocab_size:
        raise UserError("share_embeddings 'all' needs equal source and target vocabulary sizes")
    with torch.device("meta"):
        model = Transformer(cfg, src_vocab_size, tgt)
    return sum(p.numel() for p in model.parameters())
