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
    unshuffled = EpochBatches(Sizes(src), Sizes(tgt), max_tokens=4_000_000, shuffle=False)  # ties by position
    assert [b.tolist() for b in unshuffled.batches(1)] == reference(src, tgt, rank=0, world_size=1, seed=2, epoch=1,
                                                                    max_tokens=4_000_000, shuffle=False)
    assert calls == [1, 1]


def test_a_key_one_bit_wider_than_64_is_not_packed():
    """Packing needs the four fields within 64 bits: at 65 (10 tie + 18 + 18 size + 19 length bits)
    the length's top bit would fall off a uint64; the plan still equals make_batches'."""
    src, tgt = corpus(6, 800)
    src[3], tgt[4] = 2**18 - 1, 2**18 - 1
    lim = B._Limits(4_000_000, None, None, None, 1)
    scan = B.scan_sizes(Sizes(src), Sizes(tgt), lim)
    widths = (B._bits(scan.kept - 1), B._bits(scan.max_src), B._bits(scan.max_tgt), B._bits(int(scan.length_values[-1])))
    assert widths == (10, 18, 18, 19)  # guard: 65 bits
    eb = EpochBatches(Sizes(src), Sizes(tgt), max_tokens=4_000_000, seed=2)
    assert [b.tolist() for b in eb.batches(1)] == reference(src, tgt, rank=0, world_size=1, seed=2, epoch=1,
                                                            max_tokens=4_000_000)
    assert B.BatchPlan(np.zeros(0, np.int32), np.zeros(1, np.int64)).padding == B.Padding()  # none measured: zeros


def test_empty_and_all_skipped_plans():
    eb = EpochBatches(Sizes([]), Sizes([]), max_tokens=10)
    assert len(eb) == 0 and list(eb.batches(1)) == [] and eb.filter.indices.tolist() == []
    eb = EpochBatches(Sizes([50, 60]), Sizes([1, 1]), max_tokens=10)
    assert (len(eb), eb.filter.skipped, eb.filter.skipped_over_max_tokens) == (0, 2, 2)
    with pytest.raises(IndexError):
        EpochBatches(Sizes([1, 2]), Sizes([1, 2]), max_tokens=10).batches(1)[5]


def test_batch_indexing_bounds_and_refusals():
    """A plan reads like a list: -n .. n - 1 index batches, anything else is an IndexError naming
    the batch and the count; the limits and the two sides are checked in one line each."""
    plan = EpochBatches(Sizes([1, 2, 3, 4]), Sizes([1, 2, 3, 4]), max_tokens=None, max_sentences=1,
                        shuffle=False).batches(1)
    assert len(plan) == 4
    assert plan[-4].tolist() == plan[0].tolist() and plan[3].tolist() == plan[-1].tolist()
    for bad in (4, -5):
        with pytest.raises(IndexError) as e:
            plan[bad]
        assert str(e.value) == f"batch {bad} out of range for 4 batches"
    with pytest.raises(ValueError) as e:
        EpochBatches(Sizes([1, 2]), Sizes([1, 2]), max_tokens=None).batches(1)
    assert str(e.value) == "need max_tokens or max_sentences"
    with pytest.raises(ValueError) as e:
        B.scan_sizes(Sizes([1, 2]), Sizes([1]), B._Limits(10, None, None, None, 1))
    assert str(e.value) == "source has 2 sentences but target has 1"


def test_positions_are_int32_below_2_to_the_31_pairs():
    """4 bytes per pair while a corpus has fewer than 2**31 pairs, 8 from there."""
    assert B._position_dtype(2**31 - 1) == np.int32
    assert B._position_dtype(2**31) == np.int64


def test_the_chunk_size_is_read_when_the_sizes_are_streamed(monkeypatch):
    """SIZE_CHUNK is read on each pass, not bound once when the module loads: a test that makes it
    small really streams the sizes in small chunks (it was once a default argument, and patching it
    changed nothing)."""
    monkeypatch.setattr(B, "SIZE_CHUNK", 7)
    reads = []
    real = B._read_sizes
    monkeypatch.setattr(B, "_read_sizes", lambda ds, a, b: reads.append((a, b)) or real(ds, a, b))
    src, tgt = corpus(3, 30)
    EpochBatches(Sizes(src), Sizes(tgt), max_tokens=100)
    assert reads == [(a, min(a + 7, 30)) for a in range(0, 30, 7) for _ in (0, 1)]


# --- property tests (Hypothesis) ---
#
# Generated corpora (sizes per pair, zeros and pairs over every limit among them), limits, world
# sizes, seeds and epochs, with the plan's chunk constants made small so that every pass crosses
# several chunks: every pair that fits lands in exactly one batch of one rank (less the at most
# world_size - 1 batches shard_batches drops), no batch breaks a limit, a rebuilt plan (a resumed
# run) is the same, and the skipped pairs are exactly those that cannot fit.

from hypothesis import event, example, given, strategies as st  # noqa: E402


@st.composite
def plan_cases(draw):
    """(chunk, gather step, src sizes, tgt sizes, EpochBatches keywords, world size, epoch)."""
    chunk = draw(st.integers(1, 9))
    gather = draw(st.integers(1, 4))
    n = draw(st.integers(3 * chunk + 1, 3 * chunk + 40))  # more than three chunks, always
    src, tgt = (np.array(draw(st.lists(st.integers(0, 45), min_size=n, max_size=n)), np.int64) for _ in "st")
    # sometimes sizes of 22 bits: the lexsort path when kept on both sides (a histogram of 2M lengths
    # per chunk: slow, so not always)
    hi = draw(st.sampled_from([300, 300, 2_100_000]))
    for side, i, size in draw(st.lists(st.tuples(st.sampled_from([src, tgt]), st.integers(0, n - 1),
                                                 st.integers(46, hi)), max_size=6)):
        side[i] = size  # a few long sentences: over most limits drawn below
    limit = st.none() | st.integers(30, 50) | st.integers(1, 50)  # mostly above the common sizes 0 .. 45
    budget = st.none() | st.integers(47, 300) | st.integers(1, 300)
    kw = dict(max_tokens=draw(budget), max_sentences=draw(st.none() | st.integers(1, 12)),
              max_source_positions=draw(limit), max_target_positions=draw(limit),
              pad_multiple=draw(st.sampled_from([1, 1, 2, 3, 8])), shuffle=draw(st.booleans()),
              seed=draw(st.integers(0, 2**32 - 1)))
    if kw["max_tokens"] is None and kw["max_sentences"] is None:
        kw["max_sentences"] = draw(st.integers(1, 12))
    return chunk, gather, src, tgt, kw, draw(st.integers(1, 4)), draw(st.integers(1, 5))


def skip_reason(s, t, kw):
    """Why one pair cannot be trained on (the first reason: "src", "tgt", "tokens"), or None when it
    can, by the rule of the module docstring written out: source + </s> and <s> + target within the
    positions, and the pair alone within --max-tokens at its padded length."""
    m = kw["pad_multiple"]
    cost = -(-(max(s, t) + 1) // m) * m
    if kw["max_source_positions"] is not None and s + 1 > kw["max_source_positions"]:
        return "src"
    if kw["max_target_positions"] is not None and t + 1 > kw["max_target_positions"]:
        return "tgt"
    return "tokens" if kw["max_tokens"] is not None and cost > kw["max_tokens"] else None


@pytest.mark.fuzz
@given(plan_cases())
@example((3, 2, np.arange(40) % 7, np.arange(40) % 5, dict(max_tokens=None, max_sentences=1, max_source_positions=None,
          max_target_positions=None, pad_multiple=1, shuffle=True, seed=1), 3, 2))  # many batches per gather step
@example((2, 1, np.r_[3_000_000, np.arange(12)], np.r_[np.arange(12), 2_500_000], dict(max_tokens=None,
          max_sentences=3, max_source_positions=None, max_target_positions=None, pad_multiple=8, shuffle=True,
          seed=5), 2, 1))  # 22-bit sizes: the lexsort path
def test_plan_property_every_fitting_pair_once_within_limits(case):
    with pytest.MonkeyPatch.context() as monkeypatch:  # undone after each example
        check_plan(monkeypatch, *case)


def check_plan(monkeypatch, chunk, gather, src, tgt, kw, world_size, epoch):
    monkeypatch.setattr(B, "SIZE_CHUNK", chunk)
    monkeypatch.setattr(B, "GATHER_STEP", gather)
    reads, gathers = [], []
    real_read, real_positions = B._read_sizes, B._SortedPairs.positions
    monkeypatch.setattr(B, "_read_sizes", lambda ds, a, b: reads.append(a) or real_read(ds, a, b))
    monkeypatch.setattr(B._SortedPairs, "positions",
                        lambda self, s: gathers.append(self.keys is None) or real_positions(self, s))
    n = len(src)
    reasons = [skip_reason(int(s), int(t), kw) for s, t in zip(src, tgt)]
    want = [i for i in range(n) if reasons[i] is None]

    whole = EpochBatches(Sizes(src), Sizes(tgt), **kw)  # world size 1: every batch
    assert len(set(reads)) == -(-n // chunk) >= 4  # the scan crossed several chunks of the patched size
    reads.clear()
    everything = [b.tolist() for b in whole.batches(epoch)]
    assert sorted(set(reads)) == list(range(0, n, chunk))  # so did the plan's own pass
    assert len(gathers) == -(-len(everything) // gather)  # the gather steps were the patched size
    assert sorted(i for b in everything for i in b) == want  # each pair that fits exactly once
    f = whole.filter
    assert f.indices.tolist() == want and f.skipped == n - len(want)
    assert (f.skipped_src_too_long, f.skipped_tgt_too_long, f.skipped_over_max_tokens) == tuple(
        reasons.count(r) for r in ("src", "tgt", "tokens"))
    assert len(whole) == len(everything)
    event(f"gather steps: {min(len(gathers), 3)}{'+' if len(gathers) >= 3 else ''}")
    event("packed keys" if not any(gathers) else "lexsort")
    event(f"world size {world_size}, {len(everything) % world_size} batches dropped")
    event(f"pairs that fit: {'none' if not want else 'all' if len(want) == n else 'some'}")
    for b in everything:
        cost = max(-(-(max(int(src[i]), int(tgt[i])) + 1) // kw["pad_multiple"]) * kw["pad_multiple"] for i in b)
        assert b and (kw["max_tokens"] is None or len(b) * cost <= kw["max_tokens"])
        assert kw["max_sentences"] is None or len(b) <= kw["max_sentences"]

    kept = len(everything) // world_size * world_size  # shard_batches drops the rest, < world_size
    seen = []
    for rank in range(world_size):
        eb = EpochBatches(Sizes(src), Sizes(tgt), rank=rank, world_size=world_size, **kw)
        plan = [b.tolist() for b in eb.batches(epoch)]
        assert plan == everything[rank:kept:world_size] and len(eb) == len(plan)
        if rank == world_size - 1:  # one rank suffices: they share the code
            check_resume(Tokens(src), Tokens(tgt), rank, world_size, kw, epoch, plan)
        seen += [i for b in plan for i in b]
    assert len(seen) == len(set(seen))  # no pair on two ranks
    assert sorted(seen) == sorted(i for b in everything[:kept] for i in b)
    assert everything == reference(src, tgt, rank=0, world_size=1, epoch=epoch, **kw)  # make_batches' batches


class Tokens(Sizes):
    """A dataset side whose sentence i is sizes[i] tokens (what collation reads)."""

    def __getitem__(self, i):
        return np.full(int(self.sizes[i]), 7, np.int64)


def check_resume(src_ds, tgt_ds, rank, world_size, kw, epoch, plan):
    """A resumed run (a new process, another epoch's plan built first) has the same plan, and at
    half the epoch collates the rest of it, every tensor within the limits."""
    eb = EpochBatches(src_ds, tgt_ds, rank=rank, world_size=world_size, **kw)
    eb.batches(epoch + 1)
    assert [b.tolist() for b in eb.batches(epoch)] == plan
    if max((max(src_ds.sizes[i], tgt_ds.sizes[i]) for b in plan for i in b), default=0) > 300:
        return  # the wide sizes of the lexsort path: millions of tokens, not collated
    offset = len(plan) // 2
    batches = list(eb.iterate(epoch, offset))
    assert [b.indices.tolist() for b in batches] == plan[offset:]
    for b in batches:
        for x in (b.src_tokens, b.prev_output_tokens, b.target):
            assert kw["max_tokens"] is None or x.numel() <= kw["max_tokens"]
            assert x.shape[1] % kw["pad_multiple"] == 0
        assert kw["max_source_positions"] is None or int((b.src_tokens != 0).sum(1).max()) <= kw["max_source_positions"]
        assert kw["max_target_positions"] is None or int((b.target != 0).sum(1).max()) <= kw["max_target_positions"]
