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
