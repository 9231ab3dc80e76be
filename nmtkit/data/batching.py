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

Each epoch's plan also measures how much of the tensors it will be collated into is padding
(`Padding`, the train log's `padding`): compute spent on nothing, which the bucketing keeps small.
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


class _SkipCounts:
    """How many pairs were skipped for which reason (shared by the filters below)."""

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


@dataclass(frozen=True)
class SizeFilter(_SkipCounts):
    """Which pairs survive the model's limits, and how many were skipped for which reason."""

    indices: np.ndarray  # (n_kept,) int64, ascending
    skipped_src_too_long: int
    skipped_tgt_too_long: int
    skipped_over_max_tokens: int


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
    return _batch_sizes_from_counts(values, counts, max_tokens, max_sentences)


def _batch_sizes_from_counts(values: np.ndarray, counts: np.ndarray, max_tokens: int | None,
                             max_sentences: int | None) -> list[int]:
    """_batch_sizes given the histogram of the lengths (distinct values ascending, their counts):
    the batch sizes depend on nothing else, so the plan knows them before it sorts any pair."""
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


# ---------------------------------------------------------------------------------------------
# the training batch plan: the batches of make_batches + shard_batches, in compact arrays
# ---------------------------------------------------------------------------------------------

SIZE_CHUNK = 1 << 18  # sentences per step of a pass over the size arrays (bounds its int64 temporaries: ~20 MB)
GATHER_STEP = 8192  # batches per step of gathering a plan's positions (bounds its int64 slot numbers)


def _read_sizes(ds: TokenDataset, start: int, stop: int) -> np.ndarray:
    """Lengths of sentences start .. stop - 1 as int64: from the shard indexes when the dataset
    can read them (ShardedDataset.sizes_between), else a slice of its `sizes`."""
    reader = getattr(ds, "sizes_between", None)
    if reader is not None:
        return np.asarray(reader(start, stop), dtype=np.int64)
    return np.asarray(ds.sizes[start:stop], dtype=np.int64)


@dataclass(frozen=True)
class _Limits:
    max_tokens: int | None
    max_sentences: int | None
    max_source_positions: int | None
    max_target_positions: int | None
    pad_multiple: int


def _kept_chunks(src_ds: TokenDataset, tgt_ds: TokenDataset, lim: _Limits):
    """One pass over the size arrays, SIZE_CHUNK sentences at a time: (first position, SizeFilter of
    the chunk with chunk-local indices, kept source sizes, kept target sizes, kept cost lengths), all
    int64. SIZE_CHUNK is read on each call, so a test can make the chunks small."""
    n, chunk = len(src_ds), SIZE_CHUNK
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        src, tgt = _read_sizes(src_ds, a, b), _read_sizes(tgt_ds, a, b)
        f = filter_by_size(src, tgt, max_source_positions=lim.max_source_positions,
                           max_target_positions=lim.max_target_positions, max_tokens=lim.max_tokens,
                           pad_multiple=lim.pad_multiple)
        src, tgt = src[f.indices], tgt[f.indices]
        yield a, f, src, tgt, pair_cost_lengths(src, tgt, lim.pad_multiple)


@dataclass(frozen=True)
class SizeScan(_SkipCounts):
    """What one pass over the size arrays tells the plan: skip counts, the histogram of the kept
    pairs' cost lengths (which alone fixes the batch sizes) and the largest sizes (key widths)."""

    kept: int
    skipped_src_too_long: int
    skipped_tgt_too_long: int
    skipped_over_max_tokens: int
    length_values: np.ndarray  # (n_distinct,) int64 ascending
    length_counts: np.ndarray  # (n_distinct,) int64
    max_src: int
    max_tgt: int


def scan_sizes(src_ds: TokenDataset, tgt_ds: TokenDataset, lim: _Limits) -> SizeScan:
    if len(src_ds) != len(tgt_ds):
        raise ValueError(f"source has {len(src_ds)} sentences but target has {len(tgt_ds)}")
    hist = np.zeros(0, np.int64)
    skips = np.zeros(3, np.int64)
    kept, max_src, max_tgt = 0, 0, 0
    for _, f, src, tgt, lengths in _kept_chunks(src_ds, tgt_ds, lim):
        skips += (f.skipped_src_too_long, f.skipped_tgt_too_long, f.skipped_over_max_tokens)
        kept += len(lengths)
        if len(lengths):
            h = np.bincount(lengths)
            hist = np.pad(hist, (0, max(0, len(h) - len(hist))))
            hist[: len(h)] += h
            max_src, max_tgt = max(max_src, int(src.max())), max(max_tgt, int(tgt.max()))
    values = np.flatnonzero(hist)
    return SizeScan(kept, int(skips[0]), int(skips[1]), int(skips[2]), values, hist[values], max_src, max_tgt)


@dataclass(frozen=True)
class Padding:
    """How much of a plan's collated tensors is padding, per side: `tokens` are the pairs' tokens
    with the </s> (source, target) or <s> (decoder input) collation adds, `slots` the tensors'
    entries, sentences x width (the longest + 1, rounded up to the pad multiple, as collate makes
    them). The padding fraction is 1 - tokens / slots."""

    src_tokens: int = 0
    tgt_tokens: int = 0
    src_slots: int = 0
    tgt_slots: int = 0

    def __add__(self, other: "Padding") -> "Padding":
        return Padding(self.src_tokens + other.src_tokens, self.tgt_tokens + other.tgt_tokens,
                       self.src_slots + other.src_slots, self.tgt_slots + other.tgt_slots)

    @staticmethod
    def _share(tokens: int, slots: int) -> float:
        return 1.0 - tokens / slots if slots else 0.0

    @property
    def fraction(self) -> float:
        """Padding over all slots, source and target together."""
        return self._share(self.src_tokens + self.tgt_tokens, self.src_slots + self.tgt_slots)

    def to_dict(self) -> dict:
        """The train log's `padding` entry: the fractions (both sides, source, target)."""
        return {"fraction": round(self.fraction, 5), "source": round(self._share(self.src_tokens, self.src_slots), 5),
                "target": round(self._share(self.tgt_tokens, self.tgt_slots), 5)}


def batch_padding(src: np.ndarray, tgt: np.ndarray, starts: np.ndarray, pad_multiple: int) -> Padding:
    """Padding of consecutive batches: src, tgt (n,) int64 sizes of their pairs in batch order,
    starts (n_batches,) each batch's first index (every batch non-empty)."""
    n = np.diff(np.append(starts, len(src)))  # (n_batches,) sentences
    width_s = _round_up(np.maximum.reduceat(src, starts) + 1, pad_multiple)  # (n_batches,)
    width_t = _round_up(np.maximum.reduceat(tgt, starts) + 1, pad_multiple)
    return Padding(int(src.sum() + len(src)), int(tgt.sum() + len(tgt)), int((n * width_s).sum()),
                   int((n * width_t).sum()))


class BatchPlan:
    """One rank's batches of one epoch: `positions` (pair indices, int32 below 2**31 pairs) cut at
    `bounds` (batch b is positions[bounds[b]:bounds[b + 1]]). A sequence of index arrays (views),
    so it reads like the list make_batches + shard_batches return, at 4 bytes per pair of this rank.
    `padding`: how much of these batches' tensors will be padding (Padding)."""

    def __init__(self, positions: np.ndarray, bounds: np.ndarray, padding: Padding | None = None):
        self.positions = positions  # (n_pairs_of_this_rank,) int32 / int64
        self.bounds = bounds  # (n_batches + 1,) int64
        self.padding = padding if padding is not None else Padding()

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"batch {i} out of range for {n} batches")
        i = i % n
        return self.positions[self.bounds[i] : self.bounds[i + 1]]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def nbytes(self) -> int:
        return int(self.positions.nbytes + self.bounds.nbytes)


def _position_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def _bits(x: int) -> int:
    return max(int(x), 0).bit_length()


class _SortedPairs:
    """The kept pairs in plan order, slot k -> pair position, without an int64 array per pair.

    The order is make_batches': by cost length, then target size, then source size, then a
    random tie rank from the generator (or the position itself without shuffling). All four fit
    one uint64 key when their bit widths add up to at most 64 (tie ranks need log2(#pairs) bits,
    sizes about 11 each): the keys are sorted in place and `owner[tie]` maps a key back to its
    pair (4 bytes per pair). Wider sizes fall back to np.lexsort on int64 columns.
    """

    def __init__(self, src_ds: TokenDataset, tgt_ds: TokenDataset, lim: _Limits, scan: SizeScan,
                 rng: np.random.Generator | None):
        n = scan.kept
        self.tie_bits = _bits(n - 1)
        self.src_bits, self.tgt_bits = _bits(scan.max_src), _bits(scan.max_tgt)
        len_bits = _bits(int(scan.length_values[-1])) if n else 0
        tie = None
        if rng is not None:  # the same draws as make_batches' rng.permutation(n), in 4 bytes per pair
            tie = np.arange(n, dtype=_position_dtype(n))
            rng.shuffle(tie)
        if self.tie_bits + self.src_bits + self.tgt_bits + len_bits <= 64:
            self._pack(src_ds, tgt_ds, lim, n, tie)
        else:
            self._lexsort(src_ds, tgt_ds, lim, tie)

    def _pack(self, src_ds, tgt_ds, lim, n, tie) -> None:
        self.keys = np.empty(n, np.uint64)  # (n_kept,) length | tgt | src | tie rank
        self.owner = np.empty(n, _position_dtype(max(len(src_ds), 1)))  # (n_kept,) tie rank -> pair
        s_shift, t_shift = self.tie_bits, self.tie_bits + self.src_bits
        l_shift = t_shift + self.tgt_bits
        p = 0
        for a, f, src, tgt, lengths in _kept_chunks(src_ds, tgt_ds, lim):
            k = len(lengths)
            ranks = tie[p : p + k] if tie is not None else np.arange(p, p + k)
            u = np.uint64
            self.keys[p : p + k] = ((lengths.astype(u) << u(l_shift)) | (tgt.astype(u) << u(t_shift))
                                    | (src.astype(u) << u(s_shift)) | ranks.astype(u))
            self.owner[ranks] = f.indices + a
            p += k
        del tie
        self.keys.sort()  # in place: the keys are unique, so any sort gives the one order
        self.rank_mask = np.uint64((1 << self.tie_bits) - 1)
        self.src_shift = s_shift  # a key's source size starts at this bit, its target size right above

    def _lexsort(self, src_ds, tgt_ds, lim, tie) -> None:
        idx, src, tgt, lengths = [], [], [], []
        for a, f, s, t, ln in _kept_chunks(src_ds, tgt_ds, lim):
            idx.append(f.indices + a), src.append(s), tgt.append(t), lengths.append(ln)
        idx, src, tgt, lengths = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in (idx, src, tgt, lengths))
        order = np.lexsort((tie if tie is not None else idx, src, tgt, lengths))
        self.keys, self.rank_mask = None, None
        self.owner = idx[order].astype(_position_dtype(max(len(src_ds), 1)))  # (n_kept,) slot -> pair
        self.src, self.tgt = src[order], tgt[order]  # (n_kept,) sizes in slot order

    def positions(self, slots: np.ndarray) -> np.ndarray:
        """Pair positions at plan slots `slots`."""
        if self.keys is None:
            return self.owner[slots]
        return self.owner[self.keys[slots] & self.rank_mask]

    def sizes(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source sizes, target sizes) (int64) of the pairs at plan slots `slots`: read off the keys."""
        if self.keys is None:
            return self.src[slots], self.tgt[slots]
        u = np.uint64
        keys = self.keys[slots]  # (n,) uint64, shifted in place: two arrays of 8 bytes per slot in all
        keys >>= u(self.src_shift)  # the source size in the lowest bits, the target size above it
        src = keys & u((1 << self.src_bits) - 1)
        keys >>= u(self.src_bits)
        keys &= u((1 << self.tgt_bits) - 1)
        return src.view(np.int64), keys.view(np.int64)  # values far below 2**63: the same bits


def build_plan(src_ds: TokenDataset, tgt_ds: TokenDataset, lim: _Limits, scan: SizeScan, *, shuffle: bool,
               seed: int, epoch: int, rank: int, world_size: int) -> BatchPlan:
    """This rank's share of make_batches(...) after shard_batches(...), the same batches in the same
    order, holding 4 bytes per pair of this rank once built (about 16 per kept pair while sorting)."""
    if not lim.max_tokens and not lim.max_sentences:
        raise ValueError("need max_tokens or max_sentences")
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    pairs = _SortedPairs(src_ds, tgt_ds, lim, scan, rng)  # draws the tie ranks first, as make_batches
    sizes = np.asarray(_batch_sizes_from_counts(scan.length_values, scan.length_counts, lim.max_tokens,
                                                lim.max_sentences), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # (n_batches + 1,)
    order = rng.permutation(len(sizes)) if rng is not None and len(sizes) else np.arange(len(sizes))
    if world_size > 1:
        order = order[rank : (len(order) // world_size) * world_size : world_size]
    mine = sizes[order]
    bounds = np.concatenate([[0], np.cumsum(mine)]).astype(np.int64)
    positions = np.empty(int(bounds[-1]), pairs.owner.dtype)
    padding = Padding()
    step = GATHER_STEP  # batches gathered per step: the slot numbers are int64, so a bounded number at a time
    for c in range(0, len(order), step):
        b, lens = order[c : c + step], mine[c : c + step]
        local = np.concatenate([[0], np.cumsum(lens)[:-1]])
        slots = np.repeat(starts[b] - local, lens) + np.arange(int(lens.sum()))
        positions[bounds[c] : bounds[c] + len(slots)] = pairs.positions(slots)
        padding += batch_padding(*pairs.sizes(slots), local, lim.pad_multiple)
    return BatchPlan(positions, bounds, padding)


class _PlanFilter(_SkipCounts):
    """EpochBatches.filter: the skip counts of the scan; the kept positions only when asked for."""

    def __init__(self, scan: SizeScan, indices):
        self.skipped_src_too_long = scan.skipped_src_too_long
        self.skipped_tgt_too_long = scan.skipped_tgt_too_long
        self.skipped_over_max_tokens = scan.skipped_over_max_tokens
        self._indices = indices

    @property
    def indices(self) -> np.ndarray:
        """(n_kept,) ascending positions of the kept pairs, computed on each call (not held)."""
        return self._indices()


class EpochBatches:
    """The training data stream: epoch e's batches for this rank, resumable at any batch offset.

    The exact data position is (epoch, offset): `iterate(epoch, offset)` yields the same batches an
    uninterrupted run would have seen after consuming `offset` of them.

    Memory: what stays resident is one BatchPlan (4 bytes per pair of this rank) and the length
    histogram; the size arrays are streamed from the shard indexes, once at start (the scan: skip
    counts and batches per epoch) and once per epoch plan.
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
        self.limits = _Limits(max_tokens, max_sentences, max_source_positions, max_target_positions, pad_multiple)
        self.shuffle, self.seed = shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.scan = scan_sizes(src_ds, tgt_ds, self.limits)
        self.filter = _PlanFilter(self.scan, self._kept_indices)
        self._cache: tuple[int, BatchPlan] | None = None

    def _kept_indices(self) -> np.ndarray:
        parts = [f.indices + a for a, f, *_ in _kept_chunks(self.src_ds, self.tgt_ds, self.limits)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def batches(self, epoch: int) -> BatchPlan:
        """This rank's batches (arrays of pair indices) for `epoch` (1-based), built once per epoch."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = None  # the previous epoch's plan goes before the next one is built
            self._cache = (epoch, build_plan(self.src_ds, self.tgt_ds, self.limits, self.scan, shuffle=self.shuffle,
                                             seed=self.seed, epoch=epoch, rank=self.rank,
                                             world_size=self.world_size))
        return self._cache[1]

    def __len__(self) -> int:
        """Batches per epoch for this rank: the same every epoch (only tie order and batch order
        change), known from the length histogram without building a plan."""
        s = self.scan
        n = len(_batch_sizes_from_counts(s.length_values, s.length_counts, self.limits.max_tokens,
                                         self.limits.max_sentences))
        return n // self.world_size if self.world_size > 1 else n

    def iterate(self, epoch: int, offset: int = 0) -> Iterator[Batch]:
        plan = self.batches(epoch)
        for i in range(offset, len(plan)):
            yield collate(self.src_ds, self.tgt_ds, plan[i], self.limits.pad_multiple)
