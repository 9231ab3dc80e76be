"""Temperature sampling of the language pairs of a multilingual training set, epoch by epoch.

Why sampling at all: the pairs of a multilingual corpus differ in size by orders of magnitude.
Trained on their plain concatenation, a model sees the small pairs so rarely that it translates
them badly; trained on equal shares, it overfits the small pairs and underfits the large ones.
Arivazhagan et al. (2019, "Massively Multilingual Neural Machine Translation in the Wild") sample
pair p with probability

    q_p = n_p^(1/T) / sum_j n_j^(1/T)        (n_p: training sentences of pair p)

T = 1 is proportional to the data, T -> infinity uniform; T = 5, their choice, is the default.

What an epoch is here: N = sum_j n_j sentences, as in an epoch of the concatenation, of which
pair p contributes k_p = round(N * q_p) (round half to even): floor(k_p / n_p) full copies of its
sentences plus a random subset of k_p mod n_p of them, drawn without replacement from (seed,
epoch, p). The chosen sentences of all pairs are then batched together by the usual length
bucketing (nmtkit.data.batching), so a batch mixes directions: fairseq's and Marian's default,
and it keeps the bucketing's low padding, which per-direction batches of the small pairs would
lose. Everything depends only on (seed, epoch), so every process of a multi-process run sees the
same selection and a resumed run rebuilds the epoch it stopped in.

Memory: the pairs' shards are read through one concatenated dataset (no sentence is copied);
what stays resident is the sentence lengths (in the smallest unsigned type that holds them) and
one epoch's plan; the selection itself (4 bytes per chosen sentence) lives while the plan is built.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from nmtkit.data.batching import Batch, BatchPlan, EpochBatches, collate
from nmtkit.data.languages import split_name
from nmtkit.data.shards import ShardedDataset, load_split

_STREAM = 0x6C616E67  # the selection's own random stream, apart from the batch order's [seed, epoch]


def sampling_shares(counts: Sequence[int], temperature: float) -> np.ndarray:
    """q_p = n_p^(1/T) / sum_j n_j^(1/T) for each pair (float64, summing to 1); a pair without
    sentences gets 0."""
    if temperature <= 0:
        raise ValueError(f"the sampling temperature must be > 0, got {temperature}")
    n = np.asarray(counts, dtype=np.float64)
    if n.size == 0 or n.sum() <= 0:
        raise ValueError("no training sentences to sample from")
    w = np.where(n > 0, n ** (1.0 / temperature), 0.0)
    return w / w.sum()


def epoch_counts(counts: Sequence[int], temperature: float) -> np.ndarray:
    """k_p = round(N * q_p), the sentences of pair p in one epoch (int64); N = sum of the counts."""
    total = float(np.sum(np.asarray(counts, dtype=np.int64)))
    return np.rint(total * sampling_shares(counts, temperature)).astype(np.int64)


def pair_selection(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """k of the positions 0 .. n-1 (int64, ascending): floor(k / n) copies of each, and k mod n
    more drawn without replacement."""
    if n <= 0 or k <= 0:
        return np.zeros(0, np.int64)
    copies, rest = divmod(int(k), int(n))
    extra = rng.choice(n, size=rest, replace=False, shuffle=False) if rest else np.zeros(0, np.int64)
    return np.sort(np.concatenate([np.repeat(np.arange(n, dtype=np.int64), copies), extra]))


def epoch_selection(counts: Sequence[int], temperature: float, seed: int, epoch: int) -> np.ndarray:
    """The epoch's chosen sentences as positions in the pairs' concatenation (pair 0's sentences
    first), pair by pair; int32 below 2**31 sentences. Each pair's subset is drawn from a
    generator of its own, seeded with (seed, epoch, p)."""
    counts = [int(c) for c in counts]
    ks = epoch_counts(counts, temperature)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    dtype = np.int32 if starts[-1] < 2**31 else np.int64
    parts = [pair_selection(n, int(k), np.random.default_rng([seed, epoch, _STREAM, p])) + starts[p]
             for p, (n, k) in enumerate(zip(counts, ks))]
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def load_pair_split(data_dir, manifest: dict, kind: str, src: str, tgt: str) -> tuple[ShardedDataset, ShardedDataset]:
    """(source, target) datasets of pair src-tgt's split of `kind` (`train.de-en`), checksums verified."""
    name = split_name(kind, src, tgt)
    return load_split(data_dir, name, src, verify=True, manifest=manifest), \
        load_split(data_dir, name, tgt, verify=True, manifest=manifest)


def _compact(sizes: np.ndarray) -> np.ndarray:
    """`sizes` in the smallest unsigned type that holds its largest value."""
    top = int(sizes.max()) if len(sizes) else 0
    for t in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(t).max:
            return sizes.astype(t)
    return sizes.astype(np.int64)


def _read_all_sizes(ds, chunk: int = 1 << 18) -> np.ndarray:
    """Every sentence length of `ds`, read from its shard indexes a chunk at a time, compacted."""
    parts = [_compact(np.asarray(ds.sizes_between(a, min(len(ds), a + chunk)), dtype=np.int64))
             for a in range(0, len(ds), chunk)]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)  # the widest part's type


class _SizesView:
    """The lengths of chosen sentences (`selection`: positions, repeats allowed; None = all), as
    the batch plan reads them: `sizes_between` and `len` only."""

    def __init__(self, sizes: np.ndarray, selection: np.ndarray | None = None):
        self._sizes, self._selection = sizes, selection

    def __len__(self) -> int:
        return len(self._sizes if self._selection is None else self._selection)

    @property
    def sizes(self) -> np.ndarray:
        return self.sizes_between(0, len(self))

    def sizes_between(self, start: int, stop: int) -> np.ndarray:
        if self._selection is None:
            return self._sizes[start:stop].astype(np.int64)
        return self._sizes[self._selection[start:stop]].astype(np.int64)


class SampledEpochBatches:
    """The training data stream of a multilingual run: epoch e's temperature-sampled sentences of
    every pair, length-bucketed into batches for this rank (the interface of EpochBatches).

    `src_ds` / `tgt_ds` are the pairs' datasets concatenated in the given order; the plans'
    positions point into them. `filter` counts the sentences of all pairs that do not fit the
    model (each once, however often an epoch samples it).
    """

    def __init__(self, pairs: Sequence[tuple[ShardedDataset, ShardedDataset]], *, temperature: float,
                 max_tokens: int | None, max_sentences: int | None = None,
                 max_source_positions: int | None = None, max_target_positions: int | None = None,
                 pad_multiple: int = 1, seed: int = 1, rank: int = 0, world_size: int = 1):
        for i, (s, t) in enumerate(pairs):
            if len(s) != len(t):
                raise ValueError(f"pair {i}: source has {len(s)} sentences but target has {len(t)}")
        self.counts = [len(s) for s, _ in pairs]
        self.temperature, self.seed = temperature, seed
        self.src_ds = ShardedDataset([sh for s, _ in pairs for sh in s.shards])
        self.tgt_ds = ShardedDataset([sh for _, t in pairs for sh in t.shards])
        self._src_sizes, self._tgt_sizes = _read_all_sizes(self.src_ds), _read_all_sizes(self.tgt_ds)
        self._kw = dict(max_tokens=max_tokens, max_sentences=max_sentences, max_source_positions=max_source_positions,
                        max_target_positions=max_target_positions, pad_multiple=pad_multiple, shuffle=True,
                        seed=seed, rank=rank, world_size=world_size)
        self.pad_multiple = pad_multiple
        self.filter = EpochBatches(_SizesView(self._src_sizes), _SizesView(self._tgt_sizes), **self._kw).filter
        self._cache: tuple[int, BatchPlan] | None = None

    def shares(self) -> np.ndarray:
        return sampling_shares(self.counts, self.temperature)

    def per_epoch(self) -> np.ndarray:
        return epoch_counts(self.counts, self.temperature)

    def selection(self, epoch: int) -> np.ndarray:
        return epoch_selection(self.counts, self.temperature, self.seed, epoch)

    def batches(self, epoch: int) -> BatchPlan:
        """This rank's batches of `epoch` (positions in the concatenation), built once per epoch:
        the plan of EpochBatches over the epoch's selection, its positions mapped back."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = None  # the previous epoch's plan goes before the next one is built
            sel = self.selection(epoch)
            plan = EpochBatches(_SizesView(self._src_sizes, sel), _SizesView(self._tgt_sizes, sel),
                                **self._kw).batches(epoch)
            self._cache = (epoch, BatchPlan(sel[plan.positions], plan.bounds, plan.padding))
        return self._cache[1]

    def __len__(self) -> int:
        """Batches of the epoch planned last (epoch 1 before any): the number varies a little from
        epoch to epoch with the lengths of the sampled sentences."""
        return len(self.batches(self._cache[0] if self._cache is not None else 1))

    def iterate(self, epoch: int, offset: int = 0) -> Iterator[Batch]:
        plan = self.batches(epoch)
        for i in range(offset, len(plan)):
            yield collate(self.src_ds, self.tgt_ds, plan[i], self.pad_multiple)
