#!/usr/bin/env python3
"""Print the padding of the training batch plan: how much of the collated tensors is padding.

    python recipes/bench/padding.py --data-dir DATA [--max-tokens 25000] [--seed 1]
    python recipes/bench/padding.py --synthetic 1000000 [--max-tokens 25000] [--seed 1]

For each pad multiple (1: a CPU run; 8: a CUDA run, whose widths are rounded up for the tensor
cores) it prints the plan of epoch 1 as `nmtkit train` builds it (nmtkit.data.batching.EpochBatches,
the train log's `padding`): batches, the padding fraction of source and target slots together and
per side, and the floor that rounding the widths alone would leave (every pair padded only up to
its own rounded length). It builds the plan twice and says whether the batches are the same.

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


def report(name: str, src, tgt, max_tokens: int, seed: int) -> None:
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
    a = ap.parse_args()
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
    report(name, src, tgt, a.max_tokens, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
