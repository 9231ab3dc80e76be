"""The training batch plan (EpochBatches / build_plan) against the straightforward construction.

The reference is make_batches over every kept pair (int64 arrays, a list of batches) followed by
shard_batches: the plan must give the same batches in the same order for every seed, epoch, rank
and world size, while holding only int32 positions and int64 batch bounds, and reading the sizes
from the shard indexes without keeping a per-pair int64 array.
"""

from __future__ import annotations

import numpy as np
import pytest

import nmtkit.data.batching as B
from nmtkit.data.batching import EpochBatches, filter_by_size, make_batches, shard_batches
from nmtkit.data.shards import ShardedDataset, ShardSetWriter, IndexedShard


class Sizes:
    """A dataset side known only by its sizes (what the plan reads)."""

    def __init__(self, sizes):
        self.sizes = np.asarray(sizes, dtype=np.int64)

    def __len__(self):
        return len(self.sizes)


def reference(src, tgt, *, rank, world_size, seed, epoch, shuffle=True, max_tokens=None, max_sentences=None,
              max_source_positions=None, max_target_positions=None, pad_multiple=1):
    f = filter_by_size(src, tgt, max_source_positions=max_source_positions, max_target_positions=max_target_positions,
                       max_tokens=max_tokens, pad_multiple=pad_multiple)
    batches = make_batches(f.indices, src, tgt, max_tokens=max_tokens, max_sentences=max_sentences,
                           pad_multiple=pad_multiple, shuffle=shuffle, seed=seed, epoch=epoch)
    return [b.tolist() for b in shard_batches(batches, rank, world_size)]


def corpus(seed, n, high=40):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, high, n)
    tgt = np.clip(src + rng.integers(-5, 6, n), 0, None)  # correlated, many ties
    return src, tgt


@pytest.mark.parametrize("seed,world_size,kw", [
    (1, 1, dict(max_tokens=120)),
    (2, 2, dict(max_tokens=120, max_source_positions=30, max_target_positions=33)),
    (3, 3, dict(max_tokens=64, max_sentences=5, pad_multiple=8)),
    (4, 8, dict(max_tokens=None, max_sentences=7)),
    (5, 2, dict(max_tokens=200, shuffle=False)),
])
def test_plan_equals_reference_for_seeds_epochs_and_ranks(seed, world_size, kw):
    src, tgt = corpus(seed, 3000)
    lim = {k: v for k, v in kw.items() if k != "shuffle"}
    for epoch in (1, 2):
        for rank in range(world_size):
            eb = EpochBatches(Sizes(src), Sizes(tgt), seed=seed, rank=rank, world_size=world_size, **kw)
            want = reference(src, tgt, rank=rank, world_size=world_size, seed=seed, epoch=epoch, **kw)
            plan = eb.batches(epoch)
            assert [b.tolist() for b in plan] == want
            assert len(eb) == len(want) == len(plan)
            assert [b.tolist() for b in plan[1:4]] == want[1:4] and plan[-1].tolist() == want[-1]
            f = filter_by_size(src, tgt, max_source_positions=lim.get("max_source_positions"),
                               max_target_positions=lim.get("max_target_positions"),
                               max_tokens=lim.get("max_tokens"), pad_multiple=lim.get("pad_multiple", 1))
            assert eb.filter.indices.tolist() == f.indices.tolist() and eb.filter.skipped == f.skipped


def test_plan_across_chunks_and_shards_reads_the_indexes(tmp_path, monkeypatch):
    """Sizes streamed in chunks smaller than a shard and across shard boundaries; the plan holds
    int32 positions and int64 bounds only, and never builds the int64 `sizes` of the datasets."""
    monkeypatch.setattr(B, "SIZE_CHUNK", 7)
    src, tgt = corpus(9, 500, high=30)
    src[11], tgt[12] = 0, 0  # empty sentences are pairs too
    ds = {}
    for lang, sizes in (("de", src), ("en", tgt)):
        w = ShardSetWriter(tmp_path, "train", lang, np.dtype("u1"), shard_size=64)
        w.add(np.full(int(sizes.sum()), 5, np.int64), sizes)
        shards = w.close()
        ds[lang] = ShardedDataset([IndexedShard(tmp_path / s.bin, tmp_path / s.idx, s.dtype) for s in shards])
    assert ds["de"].sizes_between(60, 70).tolist() == src[60:70].tolist()  # across a shard boundary
    for rank in (0, 1):
        eb = EpochBatches(ds["de"], ds["en"], max_tokens=90, max_source_positions=25, seed=4, rank=rank,
                          world_size=2)
        plan = eb.batches(3)
        assert [b.tolist() for b in plan] == reference(src, tgt, rank=rank, world_size=2, seed=4, epoch=3,
                                                       max_tokens=90, max_source_positions=25)
        assert plan.positions.dtype == np.int32 and plan.bounds.dtype == np.int64
        assert plan.nbytes == 4 * len(plan.positions) + 8 * (len(plan) + 1)
        assert len(plan.positions) < 500 * 0.6  # this rank's half of the pairs, not the corpus
        assert eb.scan.length_values.nbytes <= 8 * 60  # the histogram is bounded by the lengths, not the pairs
        batch = next(eb.iterate(3, offset=len(plan) - 1))
        assert batch.indices.tolist() == plan[-1].tolist()
        held = [v for obj in (eb, eb.scan, eb.filter, plan) for v in vars(obj).values() if isinstance(v, np.ndarray)]
        assert held and not [a for a in held if a.dtype.itemsize >= 8 and a.size >= len(plan.positions)]  # no per-pair int64
    for d in ds.values():  # the cached int64 size array was never built
        assert "sizes" not in vars(d)


def test_wide_keys_fall_back_to_lexsort_with_the_same_batches(monkeypatch):
    src, tgt = corpus(6, 800)
    src[3], tgt[4] = 3_000_000, 2_500_000  # 22 bits each: 3 x 22 + 10 tie bits > 64 -> the lexsort path
    calls = []
    real = B._SortedPairs._lexsort
    monkeypatch.setattr(B._SortedPairs, "_lexsort", lambda self, *a: calls.append(1) or real(self, *a))
    eb = EpochBatches(Sizes(src), Sizes(tgt), max_tokens=4_000_000, seed=2)
    assert [b.tolist() for b in eb.batches(1)] == reference(src, tgt, rank=0, world_size=1, seed=2, epoch=1,
                                                            max_tokens=4_000_000)
    assert calls == [1]  # the wide sizes took the lexsort path
    EpochBatches(Sizes(src[:10] % 50), Sizes(tgt[:10] % 50), max_tokens=200, seed=2).batches(1)
    assert calls == [1]  # narrow sizes: the packed keys


def test_empty_and_all_skipped_plans():
    eb = EpochBatches(Sizes([]), Sizes([]), max_tokens=10)
    assert len(eb) == 0 and list(eb.batches(1)) == [] and eb.filter.indices.tolist() == []
    eb = EpochBatches(Sizes([50, 60]), Sizes([1, 1]), max_tokens=10)
    assert (len(eb), eb.filter.skipped, eb.filter.skipped_over_max_tokens) == (0, 2, 2)
    with pytest.raises(IndexError):
        EpochBatches(Sizes([1, 2]), Sizes([1, 2]), max_tokens=10).batches(1)[5]
