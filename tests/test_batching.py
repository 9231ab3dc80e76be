"""Token-count batching: the greedy rule, per-epoch determinism, size filtering, sharding, collation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nmtkit.data.batching import (
    EpochBatches,
    collate,
    filter_by_size,
    make_batches,
    pair_cost_lengths,
    shard_batches,
)


class ListDataset:
    """A stand-in for a shard dataset: a list of id arrays plus their sizes."""

    def __init__(self, seqs):
        self.seqs = [np.asarray(s, dtype=np.int32) for s in seqs]
        self.sizes = np.array([len(s) for s in self.seqs], dtype=np.int64)

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i]


def greedy_reference(lengths_sorted, max_tokens, max_sentences):
    """Item-by-item greedy batching (fairseq's batch_by_size rule) over sorted lengths."""
    sizes, n, mx = [], 0, 0
    for length in lengths_sorted:
        new_mx = max(mx, length)
        if n > 0 and ((n + 1) * new_mx > max_tokens or (max_sentences and n + 1 > max_sentences)):
            sizes.append(n)
            n, new_mx = 0, length
        n, mx = n + 1, new_mx
    if n:
        sizes.append(n)
    return sizes


def random_sizes(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 40, n), rng.integers(0, 40, n)


def test_cost_is_max_side_plus_eos_and_rounded():
    assert pair_cost_lengths(np.array([3, 10]), np.array([5, 2])).tolist() == [6, 11]
    assert pair_cost_lengths(np.array([3, 10]), np.array([5, 2]), pad_multiple=8).tolist() == [8, 16]


@pytest.mark.parametrize("max_tokens,max_sentences", [(64, None), (100, 7), (1000, 3), (41, None)])
def test_batches_match_item_by_item_greedy_and_budget(max_tokens, max_sentences):
    src, tgt = random_sizes(500, 0)
    idx = np.arange(500)
    batches = make_batches(idx, src, tgt, max_tokens=max_tokens, max_sentences=max_sentences, shuffle=False)
    # every pair exactly once
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    lengths = pair_cost_lengths(src, tgt)
    for b in batches:
        assert len(b) * lengths[b].max() <= max_tokens
        if max_sentences:
            assert len(b) <= max_sentences
    ref = greedy_reference(np.sort(lengths).tolist(), max_tokens, max_sentences)
    assert [len(b) for b in batches] == ref


def test_shuffle_is_deterministic_per_seed_and_epoch():
    src, tgt = random_sizes(300, 1)
    idx = np.arange(300)
    kw = dict(max_tokens=80, shuffle=True)
    a = make_batches(idx, src, tgt, seed=3, epoch=2, **kw)
    b = make_batches(idx, src, tgt, seed=3, epoch=2, **kw)
    c = make_batches(idx, src, tgt, seed=3, epoch=3, **kw)
    d = make_batches(idx, src, tgt, seed=4, epoch=2, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    flat = lambda bs: np.concatenate(bs).tolist()
    assert flat(a) != flat(c) and flat(a) != flat(d)
    # same batch sizes multiset each epoch (only ties and order move)
    assert sorted(map(len, a)) == sorted(map(len, c))


def test_filter_counts_each_reason_once():
    src = np.array([5, 9, 3, 9, 2])
    tgt = np.array([5, 3, 9, 9, 30])
    f = filter_by_size(src, tgt, max_source_positions=9, max_target_positions=9, max_tokens=20)
    # pair 1: src+1=10 > 9; pair 2: tgt+1=10 > 9; pair 3: src (first reason); pair 4: tgt 31 > 9
    assert f.indices.tolist() == [0]
    assert (f.skipped_src_too_long, f.skipped_tgt_too_long, f.skipped_over_max_tokens) == (2, 2, 0)
    f2 = filter_by_size(src, tgt, max_source_positions=None, max_target_positions=None, max_tokens=10)
    # costs: 6, 10, 10, 10, 31 -> only the last is over budget
    assert f2.indices.tolist() == [0, 1, 2, 3] and f2.skipped_over_max_tokens == 1


def test_shard_equal_counts_every_nth():
    batches = [np.array([i]) for i in range(7)]
    r0 = shard_batches(batches, 0, 2)
    r1 = shard_batches(batches, 1, 2)
    assert [b[0] for b in r0] == [0, 2, 4] and [b[0] for b in r1] == [1, 3, 5]
    assert len(shard_batches(batches, 0, 1)) == 7


def test_collate_layout():
    src = ListDataset([[10, 11, 12], [20]])
    tgt = ListDataset([[30], [40, 41]])
    b = collate(src, tgt, np.array([0, 1]))
    assert b.src_tokens.tolist() == [[10, 11, 12, 2], [20, 2, 0, 0]]
    assert b.prev_output_tokens.tolist() == [[1, 30, 0], [1, 40, 41]]
    assert b.target.tolist() == [[30, 2, 0], [40, 41, 2]]
    assert (b.ntokens, b.src_ntokens, b.nsentences) == (5, 6, 2)
    assert b.src_tokens.dtype == torch.long
    b8 = collate(src, tgt, np.array([1, 0]), pad_multiple=8)
    assert b8.src_tokens.shape == (2, 8) and b8.target.shape == (2, 8)
    assert b8.target[0].tolist() == [40, 41, 2, 0, 0, 0, 0, 0]
    # empty target sentence: decoder sees <s>, must predict </s>
    e = collate(ListDataset([[]]), ListDataset([[]]), np.array([0]))
    assert e.src_tokens.tolist() == [[2]] and e.prev_output_tokens.tolist() == [[1]] and e.target.tolist() == [[2]]


def test_epoch_batches_resume_offset_and_skip():
    rng = np.random.default_rng(5)
    seqs_s = [rng.integers(4, 50, rng.integers(1, 12)) for _ in range(200)]
    seqs_t = [rng.integers(4, 50, rng.integers(1, 12)) for _ in range(200)]
    seqs_s[7] = np.arange(4, 40)  # too long for the encoder limit below
    eb = EpochBatches(ListDataset(seqs_s), ListDataset(seqs_t), max_tokens=60, max_source_positions=20,
                      max_target_positions=20, seed=9)
    assert eb.filter.skipped == 1 and 7 not in eb.filter.indices
    full = list(eb.iterate(2))
    tail = list(eb.iterate(2, offset=3))
    assert len(full) == len(eb) and len(tail) == len(full) - 3
    for x, y in zip(full[3:], tail):
        assert torch.equal(x.src_tokens, y.src_tokens) and torch.equal(x.target, y.target)
    # two ranks partition the batches of one process
    r = [EpochBatches(ListDataset(seqs_s), ListDataset(seqs_t), max_tokens=60, max_source_positions=20,
                      max_target_positions=20, seed=9, rank=k, world_size=2) for k in (0, 1)]
    one = eb.batches(2)
    assert [b.tolist() for b in r[0].batches(2)] == [b.tolist() for b in one[0:len(one) // 2 * 2:2]]
    assert [b.tolist() for b in r[1].batches(2)] == [b.tolist() for b in one[1:len(one) // 2 * 2:2]]


# ---- behaviour pinned down by the mutation benchmark (recipes/bench/mutation.sh batching) ----


def test_cost_rounding_to_multiples():
    # (max(src, tgt) + 1) rounded up to the multiple, by hand: 1 -> 2, 2 -> 2, 3 -> 4 (m = 2);
    # 8 -> 8, 9 -> 16 (m = 8); m = 1 leaves 7 and 9 as they are
    assert pair_cost_lengths(np.array([0, 1, 2]), np.array([0, 0, 0]), pad_multiple=2).tolist() == [2, 2, 4]
    assert pair_cost_lengths(np.array([7, 8]), np.array([0, 0]), pad_multiple=8).tolist() == [8, 16]
    assert pair_cost_lengths(np.array([6, 8]), np.array([0, 0]), pad_multiple=1).tolist() == [7, 9]
    assert pair_cost_lengths(np.array([6, 3]), np.array([0, 4]), pad_multiple=3).tolist() == [9, 6]
    assert pair_cost_lengths(np.array([6, 8]), np.array([0, 0]), pad_multiple=0).tolist() == [7, 9]  # <= 1: none


def test_filter_limits_are_inclusive_and_sizes_of_small_dtypes_do_not_wrap():
    # src + </s> may equal the limit: 8 + 1 = 9 <= 9 is kept, 9 + 1 = 10 is not; same for tgt
    f = filter_by_size(np.array([8, 9, 0, 0]), np.array([0, 0, 8, 9]), max_source_positions=9,
                       max_target_positions=9, max_tokens=None)
    assert f.indices.tolist() == [0, 2] and f.indices.dtype == np.int64
    assert (f.skipped_src_too_long, f.skipped_tgt_too_long, f.skipped_over_max_tokens) == (1, 1, 0)
    # uint8 sizes (what a small shard could hold): 255 + 1 = 256 must not wrap to 0
    u8 = np.array([255, 0], dtype=np.uint8)
    f = filter_by_size(u8, u8[::-1].copy(), max_source_positions=255, max_target_positions=255, max_tokens=None)
    assert f.indices.tolist() == [] and (f.skipped_src_too_long, f.skipped_tgt_too_long) == (1, 1)
    assert pair_cost_lengths(u8, u8).tolist() == [256, 1]


def test_filter_budget_uses_the_larger_side_and_the_rounded_cost():
    # costs: max(5, 1) + 1 = 6 and max(1, 5) + 1 = 6 > 5: both over, whichever side is longer
    f = filter_by_size(np.array([5, 1]), np.array([1, 5]), max_source_positions=None,
                       max_target_positions=None, max_tokens=5)
    assert f.indices.tolist() == [] and f.skipped_over_max_tokens == 2
    # src 8 -> 9 <= 10 by default (pad_multiple 1), 16 > 10 once rounded to 8; src 7 -> 8 either way
    src, tgt = np.array([8, 7]), np.array([0, 0])
    assert filter_by_size(src, tgt, max_source_positions=None, max_target_positions=None,
                          max_tokens=10).indices.tolist() == [0, 1]
    assert filter_by_size(src, tgt, max_source_positions=None, max_target_positions=None,
                          max_tokens=9).indices.tolist() == [0, 1]
    f8 = filter_by_size(src, tgt, max_source_positions=None, max_target_positions=None, max_tokens=10, pad_multiple=8)
    assert f8.indices.tolist() == [1] and f8.skipped_over_max_tokens == 1
    with pytest.raises(ValueError) as e:
        filter_by_size(np.array([1, 2]), np.array([1]), max_source_positions=None, max_target_positions=None,
                       max_tokens=None)
    assert str(e.value) == "source and target have different numbers of sentences: 2 vs 1"


def test_describe_names_each_reason():
    f = filter_by_size(np.array([9, 0, 0, 50, 1]), np.array([0, 9, 9, 0, 1]), max_source_positions=9,
                       max_target_positions=9, max_tokens=20)
    assert (f.skipped_src_too_long, f.skipped_tgt_too_long, f.skipped_over_max_tokens) == (2, 2, 0)
    assert f.describe() == "2 with the source over the encoder limit, 2 with the target over the decoder limit"
    g = filter_by_size(np.array([30, 1]), np.array([1, 1]), max_source_positions=None,
                       max_target_positions=None, max_tokens=20)
    assert g.describe() == "1 larger than --max-tokens alone" and g.skipped == 1
    assert filter_by_size(np.array([1]), np.array([1]), max_source_positions=None, max_target_positions=None,
                          max_tokens=None).describe() == ""


def test_make_batches_edge_cases_and_errors():
    src, tgt = np.array([3, 1, 2, 5]), np.array([1, 1, 1, 1])
    assert make_batches(np.array([], dtype=np.int64), src, tgt, max_tokens=10) == []
    one = make_batches(np.array([2]), src, tgt, max_tokens=10)
    assert [b.tolist() for b in one] == [[2]]
    # sentence cap only (no token budget): sorted by cost 2, 3, 4, 6 -> [1, 2], [0, 3]
    capped = make_batches(np.arange(4), src, tgt, max_tokens=None, max_sentences=2, shuffle=False)
    assert [b.tolist() for b in capped] == [[1, 2], [0, 3]]
    # indices of another integer dtype still come back as int64 positions
    b32 = make_batches(np.arange(4, dtype=np.int32), src, tgt, max_tokens=8, shuffle=False)
    assert all(b.dtype == np.int64 for b in b32) and [b.tolist() for b in b32] == [[1, 2], [0], [3]]
    with pytest.raises(ValueError) as e:
        make_batches(np.arange(4), src, tgt, max_tokens=None, max_sentences=None)
    assert str(e.value) == "need max_tokens or max_sentences"
    with pytest.raises(ValueError) as e:  # an unfiltered pair alone over the budget
        make_batches(np.arange(4), src, tgt, max_tokens=5)
    assert str(e.value) == "a pair of length 6 does not fit --max-tokens 5"


def test_make_batches_pads_costs_and_defaults_to_a_seeded_shuffle():
    # three pairs of cost 3: all fit 9 unpadded (3 * 3); rounded to 4, only 9 // 4 = 2 per batch
    src, tgt = np.array([2, 2, 2]), np.array([0, 0, 0])
    assert [len(b) for b in make_batches(np.arange(3), src, tgt, max_tokens=9, shuffle=False)] == [3]
    assert [len(b) for b in make_batches(np.arange(3), src, tgt, max_tokens=9, pad_multiple=4,
                                         shuffle=False)] == [2, 1]
    s, t = random_sizes(200, 2)
    explicit = make_batches(np.arange(200), s, t, max_tokens=80, shuffle=True, seed=1, epoch=1)
    default = make_batches(np.arange(200), s, t, max_tokens=80)
    assert [b.tolist() for b in default] == [b.tolist() for b in explicit]
    # the default shuffle is on: not the sorted order
    plain = make_batches(np.arange(200), s, t, max_tokens=80, shuffle=False)
    assert [b.tolist() for b in default] != [b.tolist() for b in plain]
    for seed, epoch in ((2, 1), (1, 2)):
        other = make_batches(np.arange(200), s, t, max_tokens=80, seed=seed, epoch=epoch)
        assert [b.tolist() for b in other] != [b.tolist() for b in default]


def test_collate_dtypes_indices_and_padding_multiple():
    src = ListDataset([[10, 11, 12], [20]])
    tgt = ListDataset([[30], [40, 41]])
    b = collate(src, tgt, np.array([1, 0], dtype=np.int32))
    assert b.prev_output_tokens.dtype == b.target.dtype == torch.long
    assert b.indices.dtype == np.int64 and b.indices.tolist() == [1, 0]
    e = collate(ListDataset([[]]), ListDataset([[]]), np.array([0]))
    assert e.target.dtype == e.prev_output_tokens.dtype == torch.long


def test_batch_to_and_pin_memory_carry_every_field(monkeypatch):
    b = collate(ListDataset([[10, 11], [20]]), ListDataset([[30], [40, 41, 42]]), np.array([0, 1]))
    calls = []
    real_to = torch.Tensor.to

    def spy_to(self, *a, **k):
        calls.append((a, k))
        return real_to(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "to", spy_to)
    for kwargs, flag in (({}, False), ({"non_blocking": True}, True)):
        calls.clear()
        m = b.to("meta", **kwargs)
        assert calls == [(("meta",), {"non_blocking": flag})] * 3
        for name in ("src_tokens", "prev_output_tokens", "target"):
            t, orig = getattr(m, name), getattr(b, name)
            assert t.device.type == "meta" and t.shape == orig.shape and t.dtype == orig.dtype
        assert (m.ntokens, m.src_ntokens, m.indices.tolist()) == (b.ntokens, b.src_ntokens, [0, 1])
    monkeypatch.undo()
    # pinning needs an accelerator; stand one in that moves tensors to the meta device
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: real_to(self, "meta"))
    p = b.pin_memory()
    for name in ("src_tokens", "prev_output_tokens", "target"):
        assert getattr(p, name).device.type == "meta" and getattr(p, name).shape == getattr(b, name).shape
    assert (p.ntokens, p.src_ntokens, p.indices.tolist()) == (b.ntokens, b.src_ntokens, [0, 1])
    assert (p.ntokens, p.src_ntokens) == (6, 5)


def test_epoch_batches_pass_every_setting_to_filter_and_batching():
    rng = np.random.default_rng(11)
    seqs_s = [rng.integers(4, 50, rng.integers(0, 12)) for _ in range(120)]
    seqs_t = [rng.integers(4, 50, rng.integers(0, 12)) for _ in range(120)]
    seqs_s[3] = np.arange(4, 30)  # 26 + 1 > 20: over the encoder limit
    seqs_t[5] = np.arange(4, 30)  # over the decoder limit
    seqs_s[9], seqs_t[9] = np.arange(4, 14), np.arange(4, 6)  # 10 + 1 = 11 <= 12, rounded to 8 -> 16 > 12
    S, T = ListDataset(seqs_s), ListDataset(seqs_t)
    kw = dict(max_tokens=12, max_sentences=3, max_source_positions=20, max_target_positions=20)
    eb = EpochBatches(S, T, **kw, pad_multiple=8, shuffle=True, seed=7)
    assert (eb.filter.skipped_src_too_long, eb.filter.skipped_tgt_too_long) == (1, 1)
    assert 9 not in eb.filter.indices and eb.filter.skipped_over_max_tokens >= 1
    ref = filter_by_size(S.sizes, T.sizes, max_source_positions=20, max_target_positions=20, max_tokens=12,
                         pad_multiple=8)
    assert eb.filter.indices.tolist() == ref.indices.tolist()
    for epoch in (2, 3, 2):  # a new epoch is not served from the previous epoch's cache
        expect = make_batches(ref.indices, S.sizes, T.sizes, max_tokens=12, max_sentences=3, pad_multiple=8,
                              shuffle=True, seed=7, epoch=epoch)
        assert [b.tolist() for b in eb.batches(epoch)] == [b.tolist() for b in expect]
    for batch in eb.iterate(2):
        assert batch.src_tokens.shape[1] % 8 == 0 and batch.target.shape[1] % 8 == 0
        assert batch.src_tokens.numel() <= 12 and batch.target.numel() <= 12
    # defaults: pad_multiple 1, shuffle on with seed 1
    d = EpochBatches(S, T, max_tokens=40)
    ref1 = filter_by_size(S.sizes, T.sizes, max_source_positions=None, max_target_positions=None, max_tokens=40)
    assert d.filter.indices.tolist() == ref1.indices.tolist()
    expect = make_batches(ref1.indices, S.sizes, T.sizes, max_tokens=40, shuffle=True, seed=1, epoch=1)
    assert [b.tolist() for b in d.batches(1)] == [b.tolist() for b in expect]
    widths = {int(x.src_tokens.shape[1]) for x in d.iterate(1)}
    assert any(w % 2 for w in widths)  # unpadded widths: some odd
    # a sentence cap below what the token budget allows
    c = EpochBatches(S, T, max_tokens=400, max_sentences=2)
    expect = make_batches(ref1.indices, S.sizes, T.sizes, max_tokens=400, max_sentences=2, seed=1, epoch=1)
    assert [b.tolist() for b in c.batches(1)] == [b.tolist() for b in expect] and max(map(len, expect)) == 2
    # no shuffle: the sorted order
    n = EpochBatches(S, T, max_tokens=40, shuffle=False)
    expect = make_batches(ref1.indices, S.sizes, T.sizes, max_tokens=40, shuffle=False)
    assert [b.tolist() for b in n.batches(4)] == [b.tolist() for b in expect]
    with pytest.raises(ValueError) as e:
        EpochBatches(S, ListDataset(seqs_t[:-1]), max_tokens=40)
    assert str(e.value) == "source has 120 sentences but target has 119"


# --- property tests (Hypothesis) ---

from hypothesis import given, strategies as st  # noqa: E402


@st.composite
def batching_cases(draw):
    """Sizes of the pairs that passed filter_by_size (some given indices only), and the limits."""
    n = draw(st.integers(0, 80))
    src = np.array(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)), np.int64)
    tgt = np.array(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)), np.int64)
    idx = np.array(sorted(draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n))) if n else [], np.int64)
    m = draw(st.sampled_from([1, 2, 8]))
    top = int(pair_cost_lengths(src[idx], tgt[idx], m).max()) if len(idx) else 1
    max_tokens = draw(st.none() | st.integers(top, 4 * top + 40))  # every given pair fits alone
    max_sentences = draw(st.integers(1, 9) if max_tokens is None else st.none() | st.integers(1, 9))
    return idx, src, tgt, dict(max_tokens=max_tokens, max_sentences=max_sentences, pad_multiple=m,
                               shuffle=draw(st.booleans()), seed=draw(st.integers(0, 99)),
                               epoch=draw(st.integers(1, 9)))


@pytest.mark.fuzz
@given(batching_cases())
def test_make_batches_property_greedy_partition_within_limits(case):
    """Every given pair exactly once, no batch over a limit, the batch sizes those of the
    item-by-item greedy rule, and the same batches when rebuilt from the same (seed, epoch)."""
    idx, src, tgt, kw = case
    batches = make_batches(idx, src, tgt, **kw)
    assert sorted(i for b in batches for i in b.tolist()) == idx.tolist()
    lengths = pair_cost_lengths(src, tgt, kw["pad_multiple"])
    for b in batches:
        assert len(b) and (kw["max_tokens"] is None or len(b) * lengths[b].max() <= kw["max_tokens"])
        assert kw["max_sentences"] is None or len(b) <= kw["max_sentences"]
    ref = greedy_reference(np.sort(lengths[idx]).tolist(), kw["max_tokens"] or 2**62, kw["max_sentences"])
    assert sorted(map(len, batches)) == sorted(ref)
    if not kw["shuffle"]:
        assert [len(b) for b in batches] == ref
    assert [b.tolist() for b in make_batches(idx, src, tgt, **kw)] == [b.tolist() for b in batches]
