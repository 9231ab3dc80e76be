#!/usr/bin/env python3
"""Print the padding of the training batch plan: how much of the collated tensors is padding.

    python recipes/bench/padding.py --data-dir DATA [--max-tokens 25000] [--seed 1]
    python recipes/bench/padding.py --synthetic 1000000 [--max-tokens 25000] [--seed 1]

For each pad multiple (1: a CPU run; 8: a CUDA run, whose widths are rounded up for the tensor
cores) it prints the plan of epoch 1 as `nmtkit train` builds it (nmtkit.data.batching.EpochBatches,
the train log's `padding`): batches, the padding fraction of source and target slots together and
per side, and the floor that rounding the widths alone would leave (every pair padded only up to
its own rounded length). It builds the plan twice and says whether the batches are the same.

--best-cuts (at most 200,000 pairs) asks how much better any cutting of the plan's own order could
do: every cut of the pairs sorted as the plan sorts them (cost length, then target, then source) is
weighed by dynamic programming, the padding slots plus a price per batch, each batch within
--max-tokens, and the price is searched until the cuts give the plan's number of batches; then
until they give at most 5% padding, with how many batches (and so how few tokens each) that takes.

--data-dir reads the `train` split of a bilingual data directory (nmtkit preprocess). --synthetic N
draws N pairs of a WMT-like length distribution: target lengths log-normal with mean 27 and standard
deviation 15 subword tokens (--mean, --sd), source lengths the target's times exp(e), e normal with
standard deviation 0.169 (--ratio-sd: the log length ratio of Multi30k De-En, 8000 joint pieces),
both rounded and kept within 1 .. 250 (--cap). The plan takes sizes alone, so nothing is written.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from nmtkit.data.batching import EpochBatches


class Sizes:
    """One side of a corpus known by its sentence lengths only (all the plan reads)."""

    def __init__(self, sizes: np.ndarray):
        self.sizes = np.asarray(sizes, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.sizes)


def synthetic(n: int, mean: float, sd: float, ratio_sd: float, cap: int, seed: int) -> tuple[Sizes, Sizes]:
    """(source, target) sizes of n WMT-like pairs (see the module docstring)."""
    g = np.random.default_rng(seed)
    sigma2 = np.log(1.0 + (sd / mean) ** 2)  # the log-normal with this mean and standard deviation
    tgt = np.clip(np.rint(g.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)), 1, cap)
    src = np.clip(np.rint(tgt * np.exp(g.normal(0.0, ratio_sd, n))), 1, cap)
    return Sizes(src.astype(np.int64)), Sizes(tgt.astype(np.int64))


def rounding_floor(src: np.ndarray, tgt: np.ndarray, m: int) -> float:
    """The padding left if every pair were padded only to its own rounded width (1 - tokens / slots)."""
    def rounded(x):
        return -(-x // m) * m

    tokens = (src + 1).sum() + (tgt + 1).sum()
    return 1.0 - tokens / (rounded(src + 1).sum() + rounded(tgt + 1).sum())


def report(name: str, src, tgt, max_tokens: int, seed: int) -> int:
    """Print the plan's figures; -> its number of batches at pad multiple 1."""
    s, t = np.asarray(src.sizes, np.int64), np.asarray(tgt.sizes, np.int64)
    print(f"{name}: {len(s)} pairs, mean length source {s.mean():.2f}, target {t.mean():.2f} "
          f"(sd {s.std():.2f}, {t.std():.2f}); --max-tokens {max_tokens}, --seed {seed}")
    for m in (1, 8):
        t0 = time.perf_counter()
        plan = EpochBatches(src, tgt, max_tokens=max_tokens, pad_multiple=m, seed=seed).batches(1)
        seconds = time.perf_counter() - t0
        again = EpochBatches(src, tgt, max_tokens=max_tokens, pad_multiple=m, seed=seed).batches(1)
        same = np.array_equal(plan.positions, again.positions) and np.array_equal(plan.bounds, again.bounds)
        p = plan.padding.to_dict()
        print(f"  pad multiple {m}: {len(plan)} batches, padding {p['fraction']:.2%} "
              f"(source {p['source']:.2%}, target {p['target']:.2%}); rounding floor "
              f"{rounding_floor(s, t, m):.2%}; same batches when rebuilt: {same}; plan {seconds:.1f} s")
        if m == 1:
            batches = len(plan)
    return batches


def cuts(src: np.ndarray, tgt: np.ndarray, max_tokens: int, price: float) -> list[int]:
    """The batch ends (exclusive) that minimise padding slots + price x batches over pairs in this
    order (src, tgt: (n,) sizes with the collated </s>), each batch costing at most max_tokens."""
    n = len(src)
    cost = np.maximum(src, tgt)
    widest = max_tokens // int(cost.min())  # no batch holds more pairs than this
    tokens = np.concatenate([[0], np.cumsum(src + tgt)])  # (n + 1,)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    back = np.zeros(n + 1, np.int64)
    for i in range(1, n + 1):
        j0 = max(0, i - widest)
        ws = np.maximum.accumulate(src[j0:i][::-1])[::-1]  # (i - j0,) width of the batch [j, i) per start j
        wt = np.maximum.accumulate(tgt[j0:i][::-1])[::-1]
        count = i - np.arange(j0, i)
        slots = count * (ws + wt)
        value = np.where(count * np.maximum(ws, wt) <= max_tokens,
                         best[j0:i] + slots - (tokens[i] - tokens[j0:i]) + price, np.inf)
        k = int(np.argmin(value))
        best[i], back[i] = value[k], j0 + k
    ends, i = [], n
    while i > 0:
        ends.append(i)
        i = int(back[i])
    return ends[::-1]


def cut_padding(src: np.ndarray, tgt: np.ndarray, ends: list[int]) -> tuple[float, float]:
    """(padding fraction, mean tokens per batch incl. padding as --max-tokens counts them) of these cuts."""
    starts = np.array([0] + ends[:-1])
    n = np.diff(np.append(starts, len(src)))
    ws, wt = np.maximum.reduceat(src, starts), np.maximum.reduceat(tgt, starts)
    return 1.0 - (src.sum() + tgt.sum()) / (n * (ws + wt)).sum(), float((n * np.maximum(ws, wt)).mean())


def best_cuts(s: np.ndarray, t: np.ndarray, max_tokens: int, batches: int) -> None:
    """Print the best cuts of the plan's order: at its number of batches, and at 5% padding."""
    src, tgt = s + 1, t + 1
    if int(np.maximum(src, tgt).max()) > max_tokens:  # the plan filters such pairs; no cutting holds one
        print(f"  best cuts: a pair of {int(np.maximum(src, tgt).max())} tokens does not fit --max-tokens {max_tokens}")
        return
    order = np.lexsort((src, tgt, np.maximum(src, tgt)))
    src, tgt = src[order], tgt[order]

    def search(fits) -> list[int] | None:  # the largest price (fewest batches) whose cuts fit, if any
        lo, hi, found = 0.0, float(max_tokens) * 4, None
        for _ in range(16):
            price = (lo + hi) / 2
            ends = cuts(src, tgt, max_tokens, price)
            if fits(ends):
                lo, found = price, ends
            else:
                hi = price
        return found

    same = search(lambda e: len(e) <= batches)
    if same is None:
        print(f"  best cuts of the same order: none with {batches} batches or fewer")
    else:
        pad, mean = cut_padding(src, tgt, same)
        print(f"  best cuts of the same order: {len(same)} batches, padding {pad:.2%} "
              f"(mean {mean:,.0f} tokens per batch)")
    five = search(lambda e: cut_padding(src, tgt, e)[0] <= 0.05)
    if five is None:
        print("  at most 5% padding: not reached by any price searched")
    else:
        pad, mean = cut_padding(src, tgt, five)
        print(f"  at most 5% padding: reached with {len(five)} batches (the fewest the price search found), "
              f"padding {pad:.2%} (mean {mean:,.0f} tokens per batch)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--data-dir", help="a bilingual data directory of nmtkit preprocess")
    which.add_argument("--synthetic", type=int, metavar="N", help="N pairs of a WMT-like length distribution")
    ap.add_argument("--max-tokens", type=int, default=25000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mean", type=float, default=27.0)
    ap.add_argument("--sd", type=float, default=15.0)
    ap.add_argument("--ratio-sd", type=float, default=0.169)
    ap.add_argument("--cap", type=int, default=250)
    ap.add_argument("--best-cuts", action="store_true",
                    help="also the best cutting of the plan's order (dynamic programming; at most 200,000 pairs)")
    a = ap.parse_args()
    if a.synthetic is not None and a.synthetic < 1:
        ap.error(f"--synthetic takes a number of pairs >= 1, got {a.synthetic}")
    if a.data_dir:
        from nmtkit.data.manifest import load_manifest
        from nmtkit.data.shards import load_split

        manifest = load_manifest(a.data_dir)
        src = load_split(a.data_dir, "train", manifest["source_lang"])
        tgt = load_split(a.data_dir, "train", manifest["target_lang"])
        name = f"{a.data_dir} ({manifest['source_lang']}-{manifest['target_lang']})"
    else:
        src, tgt = synthetic(a.synthetic, a.mean, a.sd, a.ratio_sd, a.cap, a.seed)
        name = f"synthetic WMT-like (mean {a.mean:g}, sd {a.sd:g}, ratio sd {a.ratio_sd:g}, cap {a.cap})"
    if a.best_cuts and len(src) > 200_000:
        print(f"--best-cuts: {len(src):,} pairs; it weighs every cut, which takes too long above 200,000",
              file=sys.stderr)
        return 2
    batches = report(name, src, tgt, a.max_tokens, a.seed)
    if a.best_cuts:
        best_cuts(np.asarray(src.sizes, np.int64), np.asarray(tgt.sizes, np.int64), a.max_tokens, batches)
    return 0


if __name__ == "__main__":
    from nmtkit.errors import UserError

    try:
        sys.exit(main())
    except UserError as e:  # a data directory that is not one: its one line, no traceback
        sys.exit(f"padding.py: {e}")
