"""The batch plan's padding figures (nmtkit.data.batching.Padding) and where training reports them.

Why: the share of padding in the collated tensors is compute spent on nothing; the plan measures it
once per epoch (the train log's `start` and `epoch` records, and a console line) so that a
bucketing or --max-tokens that wastes it shows. Each test counts the same slots another way:
by hand, from the collated tensors themselves, or from the sizes batch by batch.
"""

from __future__ import annotations

import numpy as np
import pytest

import nmtkit.data.batching as B
import nmtkit.data.sampling as SP
from nmtkit.data.batching import PAD, EpochBatches, Padding, batch_padding, collate
from nmtkit.data.shards import IndexedShard, ShardedDataset, ShardSetWriter
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.report import read_log

from conftest import word_mapping_data_dir


class Tokens:
    """One side of a corpus: sentence i is sizes[i] copies of id 5 (what collation reads)."""

    def __init__(self, sizes):
        self.sizes = np.asarray(sizes, dtype=np.int64)

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        return np.full(int(self.sizes[i]), 5, np.int64)


def corpus(seed: int, n: int, high: int = 40):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, high, n)
    tgt = np.clip(src + rng.integers(-6, 7, n), 0, None)  # correlated, as translations are
    return src, tgt


def counted_by_size(plan, src, tgt, m: int) -> Padding:
    """The plan's padding, batch by batch from the sizes: n x rounded (longest + 1) slots per side."""
    out = Padding()
    for b in plan:
        s, t = src[b], tgt[b]
        width_s, width_t = -(-(int(s.max()) + 1) // m) * m, -(-(int(t.max()) + 1) // m) * m
        out += Padding(int((s + 1).sum()), int((t + 1).sum()), len(b) * width_s, len(b) * width_t)
    return out


def counted_in_tensors(batches) -> Padding:
    """Padding as the collated tensors hold it: non-pad entries and all entries of source and target."""
    out = Padding()
    for b in batches:
        out += Padding(int((b.src_tokens != PAD).sum()), int((b.target != PAD).sum()), b.src_tokens.numel(),
                       b.target.numel())
    return out


def test_batch_padding_by_hand():
    """Batches [3, 1] and [2] of sizes src (3, 1, 2), tgt (0, 4, 4): widths are longest + 1."""
    src, tgt, starts = np.array([3, 1, 2]), np.array([0, 4, 4]), np.array([0, 2])
    p = batch_padding(src, tgt, starts, 1)
    assert p == Padding(src_tokens=4 + 2 + 3, tgt_tokens=1 + 5 + 5, src_slots=2 * 4 + 3, tgt_slots=2 * 5 + 5)
    assert p.fraction == pytest.approx(1 - 20 / 26)
    assert p.to_dict() == {"fraction": round(1 - 20 / 26, 5), "source": round(1 - 9 / 11, 5),
                           "target": round(1 - 11 / 15, 5)}
    r = batch_padding(src, tgt, starts, 4)  # widths rounded up to 4: source 4 and 4, target 8 and 8
    assert (r.src_slots, r.tgt_slots, r.src_tokens, r.tgt_tokens) == (2 * 4 + 4, 2 * 8 + 8, 9, 11)
    assert Padding().fraction == 0.0 and Padding().to_dict() == {"fraction": 0.0, "source": 0.0, "target": 0.0}


@pytest.mark.parametrize("m, world_size", [(1, 1), (8, 1), (1, 3), (8, 2)])
def test_the_plan_padding_is_that_of_its_collated_tensors(m, world_size):
    """For every rank: the plan's figures equal the non-pad and total entries of the source and
    target tensors collate builds from its batches (2000 pairs, several gather steps)."""
    src, tgt = corpus(1, 2000)
    for rank in range(world_size):
        eb = EpochBatches(Tokens(src), Tokens(tgt), max_tokens=300, pad_multiple=m, seed=3, rank=rank,
                          world_size=world_size)
        plan = eb.batches(2)
        assert plan.padding == counted_in_tensors(eb.iterate(2)) == counted_by_size(plan, src, tgt, m)
        assert 0.0 < plan.padding.fraction < 1.0


def test_the_padding_across_gather_steps_and_with_wide_sizes(monkeypatch):
    """Gathered a batch at a time, and on the lexsort path of wide (22-bit) sizes: the same figures
    as counted batch by batch."""
    src, tgt = corpus(2, 600)
    monkeypatch.setattr(B, "GATHER_STEP", 1)
    plan = EpochBatches(Tokens(src), Tokens(tgt), max_tokens=200, seed=1).batches(1)
    assert plan.padding == counted_by_size(plan, src, tgt, 1)
    monkeypatch.undo()
    src[3], tgt[4] = 3_000_000, 2_500_000  # 3 x 22 + 10 tie bits > 64: the keys do not fit, lexsort
    calls = []
    real = B._SortedPairs._lexsort
    monkeypatch.setattr(B._SortedPairs, "_lexsort", lambda self, *a: calls.append(1) or real(self, *a))
    plan = EpochBatches(Tokens(src), Tokens(tgt), max_tokens=10_000_000, pad_multiple=8, seed=1).batches(1)
    assert calls == [1] and plan.padding == counted_by_size(plan, src, tgt, 8)


def test_the_same_seed_gives_the_same_batches_and_padding():
    src, tgt = corpus(4, 1500)
    a, b = (EpochBatches(Tokens(src), Tokens(tgt), max_tokens=250, seed=7).batches(1) for _ in range(2))
    assert np.array_equal(a.positions, b.positions) and np.array_equal(a.bounds, b.bounds)
    assert a.padding == b.padding
    assert EpochBatches(Tokens(src), Tokens(tgt), max_tokens=250, seed=7).batches(1).padding == a.padding


def test_an_empty_plan_has_no_padding():
    plan = EpochBatches(Tokens([50, 60]), Tokens([1, 2]), max_tokens=10, seed=1).batches(1)  # both too long
    assert len(plan) == 0 and plan.padding == Padding() and plan.padding.fraction == 0.0


def test_multilingual_plans_carry_their_padding(tmp_path):
    """SampledEpochBatches: the epoch's plan over the sampled sentences keeps the figures, which
    are those of the tensors collated from its batches."""
    pairs = []
    for p, (n, seed) in enumerate(((300, 1), (40, 2))):
        src, tgt = corpus(seed, n, high=20)
        sides = []
        for lang, sizes in (("src", src), ("tgt", tgt)):
            w = ShardSetWriter(tmp_path, f"train{p}", lang, np.dtype("u1"), shard_size=64)
            w.add(np.full(int(sizes.sum()), 5, np.int64), sizes)
            sides.append(ShardedDataset([IndexedShard(tmp_path / s.bin, tmp_path / s.idx, s.dtype)
                                         for s in w.close()]))
        pairs.append(tuple(sides))
    b = SP.SampledEpochBatches(pairs, temperature=5.0, max_tokens=120, seed=2)
    plan = b.batches(2)
    assert plan.padding == counted_in_tensors(b.iterate(2)) and plan.padding.src_slots > 0


# ----------------------------------------------------------------------------------------------
# where training reports it


def test_training_logs_each_epochs_padding_once(tmp_path_factory):
    """The start record holds the first epoch's figures, an `epoch` record each later epoch's:
    those of the plan the epoch trains on."""
    data = word_mapping_data_dir(tmp_path_factory.mktemp("corpus"), 200, 12, 20, seed=1)
    save = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(data_dir=str(data), save_dir=str(save), arch="transformer_tiny", max_tokens=256, lr=3e-3,
                      lr_scheduler="inverse_sqrt", warmup_updates=5, log_interval=5, progress_bar=False, threads=1,
                      no_epoch_checkpoints=True, no_validate=True, device="cpu", max_epoch=3, update_freq=4)
    t = T.Trainer(cfg)
    plans = {e: EpochBatches(t.train_src, t.train_tgt, max_tokens=256, seed=1).batches(e) for e in (1, 2, 3)}
    res = t.run()
    assert res.reason == "max_epoch"
    recs = read_log(save / "train_log.jsonl")
    start = next(r for r in recs if r["type"] == "start")
    epochs = [r for r in recs if r["type"] == "epoch"]
    assert start["padding"] == plans[1].padding.to_dict()
    assert [(r["epoch"], r["batches"], r["padding"]) for r in epochs] == [
        (e, len(plans[e]), plans[e].padding.to_dict()) for e in (2, 3)]
    assert all(0.0 < r["padding"]["fraction"] < 0.5 for r in epochs)


def test_the_console_line_of_the_padding():
    p = Padding(src_tokens=90, tgt_tokens=95, src_slots=100, tgt_slots=100)
    assert T.padding_text(p) == "padding 7.5% of the token slots (source 10.0%, target 5.0%)"


def _padding_bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "recipes" / "bench" / "padding.py"
    spec = importlib.util.spec_from_file_location("padding_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("seed", range(6))
def test_the_benchs_best_cuts_equal_a_brute_force_over_every_cutting(seed):
    """recipes/bench/padding.py --best-cuts (the docs' figure of what any cutting of the plan's
    order could reach) finds the cheapest cutting: every one of 2^(n-1) cuttings of 11 pairs,
    each batch within max_tokens, weighed as padding slots + price x batches."""
    import itertools

    bench = _padding_bench()
    g = np.random.default_rng(seed)
    src, tgt = g.integers(1, 9, 11), g.integers(1, 9, 11)  # with </s>
    max_tokens, price = 30, float(g.integers(0, 12))
    best = None
    for mask in itertools.product((0, 1), repeat=len(src) - 1):
        ends = [i + 1 for i, m in enumerate(mask) if m] + [len(src)]
        starts = [0] + ends[:-1]
        if any((b - a) * max(src[a:b].max(), tgt[a:b].max()) > max_tokens for a, b in zip(starts, ends)):
            continue
        value = sum((b - a) * (src[a:b].max() + tgt[a:b].max()) - src[a:b].sum() - tgt[a:b].sum() + price
                    for a, b in zip(starts, ends))
        best = value if best is None else min(best, value)
    ends = bench.cuts(src, tgt, max_tokens, price)
    starts = [0] + ends[:-1]
    assert all((b - a) * max(src[a:b].max(), tgt[a:b].max()) <= max_tokens for a, b in zip(starts, ends))
    got = sum((b - a) * (src[a:b].max() + tgt[a:b].max()) - src[a:b].sum() - tgt[a:b].sum() + price
              for a, b in zip(starts, ends))
    assert got == pytest.approx(best)
    pad, _ = bench.cut_padding(src, tgt, ends)
    slots = sum((b - a) * (src[a:b].max() + tgt[a:b].max()) for a, b in zip(starts, ends))
    assert pad == pytest.approx(1 - (src.sum() + tgt.sum()) / slots)
