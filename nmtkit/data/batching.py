"""Length-bucketed token-count batches, per-epoch shuffling, DDP sharding and collation.

Why this module exists: the paper batches "sentence pairs by approximate sequence length" so that
each step holds about 25K source and 25K target tokens. Batching by a token budget instead of a
sentence count keeps the padded tensor size (and so memory and step time) nearly constant, and
sorting by length keeps padding small. Everything here is deterministic given (seed, epoch), which
is what makes training resumable mid-epoch: the data position is just (epoch, batch offset).

Batch cost (the `--max-tokens` rule, the same as fairseq's `batch_by_size`):

    cost(batch) = n_sentences * max over its pairs of max(src_len + 1, tgt_len + 1)

where `src_len`/`tgt_len` count shard tokens (without `</s>`) and the `+ 1` is the `</s>` (or
`<s>`) that collation adds. So `max_tokens` bounds the padded size of the larger side: both the
source tensor and the target tensor of a batch hold at most `max_tokens` tokens, padding included.
When collation pads lengths up to a multiple `m` (for tensor cores), the rounded length is used in
the cost, so the bound still holds for the tensors actually built.

A pair that cannot be used (source longer than the encoder's position limit, target longer than
the decoder's, or one pair alone over `max_tokens`) is skipped and counted, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np
import torch

PAD, BOS, EOS = 0, 1, 2  # docs/internals.md: <pad>=0 <s>=1 </s>=2


class TokenDataset(Protocol):
    """What batching needs from one side of a split (nmtkit.data.shards datasets satisfy it)."""

    sizes: np.ndarray

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> np.ndarray: ...


def _round_up(x: np.ndarray | int, m: int):
    return x if m <= 1 else ((x + m - 1) // m) * m


def pair_cost_lengths(src_sizes: np.ndarray, tgt_sizes: np.ndarray, pad_multiple: int = 1) -> np.ndarray:
    """Per-pair padded length that the batch cost multiplies by the sentence count."""
    lengths = np.maximum(np.asarray(src_sizes, dtype=np.int64), np.asarray(tgt_sizes, dtype=np.int64)) + 1
    return _round_up(lengths, pad_multiple)


@dataclass(frozen=True)
class SizeFilter:
    """Which pairs survive the model's limits, and how many were skipped for which reason."""

    indices: np.ndarray  # (n_kept,) int64, ascending
    skipped_src_too_long: int
    skipped_tgt_too_long: int
    skipped_over_max_tokens: int

    @property
    def skipped(self) -> int:
        return self.skipped_src_too_long + self.skipped_tgt_too_long + self.skipped_over_max_tokens

    def describe(self) -> str:
        parts = []
        if self.skipped_src_too_long:
            parts.append(f"{self.skipped_src_too_long} with the source over the encoder limit")
        if self.skipped_tgt_too_long:
            parts.append(f"{self.skipped_tgt_too_long} with the target over the decoder limit")
        if self.skipped_over_max_tokens:
            parts.append(f"{self.skipped_over_max_tokens} larger than --max-tokens alone")
        return ", ".join(parts)


def filter_by_size(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_source_positions: int | None,
    max_target_positions: int | None,
    max_tokens: int | None,
    pad_multiple: int = 1,
) -> SizeFilter:
    """Keep the pairs whose source+</s> and <s>+target fit the model and one batch.

    A pair is counted under the first reason that applies (source, then target, then budget).
    """
    src = np.asarray(src_sizes, dtype=np.int64)
    tgt = np.asarray(tgt_sizes, dtype=np.int64)
    if src.shape != tgt.shape:
        raise ValueError(f"source and target have different numbers of sentences: {src.shape[0]} vs {tgt.shape[0]}")
    bad_src = (src + 1 > max_source_positions) if max_source_positions else np.zeros(src.shape, bool)
    bad_tgt = (tgt + 1 > max_target_positions) if max_target_positions else np.zeros(src.shape, bool)
    bad_tgt &= ~bad_src
    if max_tokens:
        bad_tok = (pair_cost_lengths(src, tgt, pad_multiple) > max_tokens) & ~bad_src & ~bad_tgt
    else:
        bad_tok = np.zeros(src.shape, bool)
    keep = ~(bad_src | bad_tgt | bad_tok)
    return SizeFilter(
        indices=np.flatnonzero(keep).astype(np.int64),
        skipped_src_too_long=int(bad_src.sum()),
        skipped_tgt_too_long=int(bad_tgt.sum()),
        skipped_over_max_tokens=int(bad_tok.sum()),
    )


def _batch_sizes(lengths: np.ndarray, max_tokens: int | None, max_sentences: int | None) -> list[int]:
    """Greedy batch sizes over `lengths` sorted ascending, one step per distinct length.

    Equivalent to the item-by-item greedy rule "add the next pair unless the batch would then cost
    more than max_tokens or hold more than max_sentences", but O(#distinct lengths) in Python:
    within a run of equal lengths L every batch holds exactly cap = min(max_tokens // L,
    max_sentences) pairs, and the open batch carried over from shorter pairs is topped up to cap
    (its earlier pairs now cost L each too, since L is the new maximum).
    """
    if len(lengths) == 0:
        return []
    values, counts = np.unique(lengths, return_counts=True)  # values ascending, as lengths is sorted
    big = np.iinfo(np.int64).max
    sizes: list[int] = []
    cur = 0
    for value, n in zip(values.tolist(), counts.tolist()):
        cap = min(max_tokens // value if max_tokens else big, max_sentences or big)
        if cap < 1:  # filter_by_size removes these; guard anyway
            raise ValueError(f"a pair of length {value} does not fit --max-tokens {max_tokens}")
        if cur >= cap:
            sizes.append(cur)
            cur = 0
        take = min(cap - cur, n)
        cur += take
        n -= take
        if n > 0:  # the open batch is full; the rest of this length fills whole batches
            sizes.append(cur)
            full, cur = divmod(n, cap)
            sizes.extend([cap] * full)
        elif cur == cap:
            sizes.append(cur)
            cur = 0
    if cur:
        sizes.append(cur)
    return sizes


def make_batches(
    indices: np.ndarray,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_tokens: int | None,
    max_sentences: int | None = None,
    pad_multiple: int = 1,
    shuffle: bool = True,
    seed: int = 1,
    epoch: int = 1,
) -> list[np.ndarray]:
    """Group `indices` into length-bucketed batches; with `shuffle`, a fresh order per epoch.

    Pairs are sorted by padded cost length, then target length, then source length (less padding on
    each side), ties broken randomly from (seed, epoch); batches are filled greedily in that order;
    with `shuffle` the batch order is then permuted from the same generator. The result depends only
    on the arguments, so a resumed run rebuilds exactly the batches it was consuming.
    """
    if not max_tokens and not max_sentences:
        raise ValueError("need max_tokens or max_sentences")
    indices = np.asarray(indices, dtype=np.int64)
    src = np.asarray(src_sizes, dtype=np.int64)[indices]
    tgt = np.asarray(tgt_sizes, dtype=np.int64)[indices]
    lengths = pair_cost_lengths(src, tgt, pad_multiple)
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        tie = rng.permutation(len(indices))
        order = np.lexsort((tie, src, tgt, lengths))
    else:
        rng = None
        order = np.lexsort((indices, src, tgt, lengths))
    sizes = _batch_sizes(lengths[order], max_tokens, max_sentences)
    batches = np.split(indices[order], np.cumsum(sizes)[:-1]) if sizes else []
    if rng is not None and batches:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def shard_batches(batches: Sequence[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    """This rank's share: every world_size-th batch, after dropping the remainder.

    Every rank gets the same number of batches (DDP needs the same number of backward passes on
    every rank); at most world_size - 1 batches per epoch are dropped, and since the batch order
    is reshuffled each epoch they are different pairs every epoch. With world_size 1 nothing is
    dropped.
    """
    if world_size <= 1:
        return list(batches)
    n = (len(batches) // world_size) * world_size
    return list(batches[rank:n:world_size])


@dataclass
class Batch:
    """A collated batch (right-padded with <pad>=0).

    src_tokens: (B, S) ids + </s>; prev_output_tokens: (B, T) <s> + ids; target: (B, T) ids + </s>.
    """

    src_tokens: torch.Tensor  # (batch, src_len)
    prev_output_tokens: torch.Tensor  # (batch, tgt_len)
    target: torch.Tensor  # (batch, tgt_len)
    ntokens: int  # target tokens incl. </s>, padding excluded
    src_ntokens: int  # source tokens incl. </s>, padding excluded
    indices: np.ndarray  # (batch,) the pairs' positions in the split

    @property
    def nsentences(self) -> int:
        return int(self.src_tokens.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.src_tokens.to(device, non_blocking=non_blocking),
            self.prev_output_tokens.to(device, non_blocking=non_blocking),
            self.target.to(device, non_blocking=non_blocking),
            self.ntokens,
            self.src_ntokens,
            self.indices,
        )

    def pin_memory(self) -> "Batch":
        return Batch(
            self.src_tokens.pin_memory(),
            self.prev_output_tokens.pin_memory(),
            self.target.pin_memory(),
            self.ntokens,
            self.src_ntokens,
            self.indices,
        )


def collate(
    src_ds: TokenDataset,
    tgt_ds: TokenDataset,
    indices: np.ndarray,
    pad_multiple: int = 1,
) -> Batch:
    """Build the padded source, decoder-input and target tensors for the pairs `indices`."""
    srcs = [np.asarray(src_ds[int(i)]) for i in indices]
    tgts = [np.asarray(tgt_ds[int(i)]) for i in indices]
    b = len(srcs)
    sl = np.fromiter((len(s) for s in srcs), dtype=np.int64, count=b)
    tl = np.fromiter((len(t) for t in tgts), dtype=np.int64, count=b)
    s_width = int(_round_up(int(sl.max()) + 1, pad_multiple))
    t_width = int(_round_up(int(tl.max()) + 1, pad_multiple))
    rows = np.arange(b)

    src = np.zeros((b, s_width), dtype=np.int64)  # (batch, src_len)
    src_mask = np.arange(s_width) < sl[:, None]
    if sl.sum():
        src[src_mask] = np.concatenate(srcs)
    src[rows, sl] = EOS

    tgt = np.zeros((b, t_width), dtype=np.int64)  # (batch, tgt_len)
    tgt_mask = np.arange(t_width) < tl[:, None]
    tgt_cat = np.concatenate(tgts) if tl.sum() else None
    if tgt_cat is not None:
        tgt[tgt_mask] = tgt_cat
    tgt[rows, tl] = EOS

    prev = np.zeros((b, t_width), dtype=np.int64)  # (batch, tgt_len)
    prev[:, 0] = BOS
    if tgt_cat is not None:
        prev[:, 1:][tgt_mask[:, : t_width - 1]] = tgt_cat

    return Batch(
        src_tokens=torch.from_numpy(src),
        prev_output_tokens=torch.from_numpy(prev),
        target=torch.from_numpy(tgt),
        ntokens=int(tl.sum() + b),
        src_ntokens=int(sl.sum() + b),
        indices=np.asarray(indices, dtype=np.int64),
    )


class EpochBatches:
    """The training data stream: epoch e's batches for this rank, resumable at any batch offset.

    The exact data position is (epoch, offset): `iterate(epoch, offset)` yields the same batches an
    uninterrupted run would have seen after consuming `offset` of them.
    """

    def __init__(
        self,
        src_ds: TokenDataset,
        tgt_ds: TokenDataset,
        *,
        max_tokens: int | None,
        max_sentences: int | None = None,
        max_source_positions: int | None = None,
        max_target_positions: int | None = None,
        pad_multiple: int = 1,
        shuffle: bool = True,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
    ):
        if len(src_ds) != len(tgt_ds):
            raise ValueError(f"source has {len(src_ds)} sentences but target has {len(tgt_ds)}")
        self.src_ds, self.tgt_ds = src_ds, tgt_ds
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.pad_multiple, self.shuffle, self.seed = pad_multiple, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.filter = filter_by_size(
            src_ds.sizes,
            tgt_ds.sizes,
            max_source_positions=max_source_positions,
            max_target_positions=max_target_positions,
            max_tokens=max_tokens,
            pad_multiple=pad_multiple,
        )
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches (arrays of pair indices) for `epoch` (1-based)."""
        if self._cache is None or self._cache[0] != epoch:
            all_batches = make_batches(
                self.filter.indices,
                self.src_ds.sizes,
                self.tgt_ds.sizes,
                max_tokens=self.max_tokens,
                max_sentences=self.max_sentences,
                pad_multiple=self.pad_multiple,
                shuffle=self.shuffle,
                seed=self.seed,
                epoch=epoch,
            )
            self._cache = (epoch, shard_batches(all_batches, self.rank, self.world_size))
        return self._cache[1]

    def __len__(self) -> int:
        """Batches per epoch for this rank: the same every epoch (only tie order and batch order change)."""
        return len(self.batches(self._cache[0] if self._cache is not None else 1))

    def iterate(self, epoch: int, offset: int = 0) -> Iterator[Batch]:
        for idx in self.batches(epoch)[offset:]:
            yield collate(self.src_ds, self.tgt_ds, idx, self.pad_multiple)
