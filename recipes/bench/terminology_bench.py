"""Terminology benchmark: constraints from the references, on Multi30k's test set.

1. The test set is translated without constraints (beam BEAM, batch BATCH sentences).
2. A terminology set is built from the references: for each sentence, up to TERMS words of its
   reference that the unconstrained output misses (words of at least MIN_CHARS letters, not in a
   short stop list, not already in the output; chosen at random with a fixed seed), the way Post &
   Vilar (2018) simulate a user's terminology. Sentences without such a word keep no constraint.
3. The test set is translated again with those constraints (unordered), same settings.

Prints, and writes to WORK/terminology.json: the rate at which the terms appear in the
outputs (as substrings of the detokenized output, what the search guarantees, and as whole
words), sacreBLEU without and with constraints (all sentences, and the constrained ones alone),
and the decoding time of both runs with their ratio, as wall-clock time and as the process's CPU
time (user + system: on a shared machine, what the decoding itself cost, whatever its share of the
cores); the runs alternate RUNS times and the medians are reported, so that the machine's load
changes spread over both.

Called by recipes/bench/terminology.sh, which documents the variables.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

STOP = set("""a an the and or of in on at to with from by for is are was were be been his her their
its this that these those there here into onto over under while some very""".split())
WORD = re.compile(r"[^\W\d_]+(?:[-'][^\W\d_]+)*")


def read(path: str, limit: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh]
    return lines[:limit] if limit else lines


def words(text: str) -> list[str]:
    return WORD.findall(text)


def pick_terms(refs: list[str], hyps: list[str], n: int, min_chars: int, seed: int) -> list[list[str]]:
    """Per sentence up to n reference words the output misses (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for ref, hyp in zip(refs, hyps):
        have = set(words(hyp))
        cands = list(dict.fromkeys(w for w in words(ref)
                                   if len(w) >= min_chars and w.lower() not in STOP and w not in have))
        rng.shuffle(cands)
        out.append(cands[:n])
    return out


def use_rate(outs: list[str], terms: list[list[str]]) -> tuple[float, float, int]:
    """(substring rate, whole-word rate, terms) over every term of every sentence."""
    n = sub = whole = 0
    for out, ts in zip(outs, terms):
        ws = set(words(out))
        for t in ts:
            n += 1
            sub += t in out
            whole += t in ws
    return (sub / n if n else 1.0), (whole / n if n else 1.0), n


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--data", "--ckpt", "--src", "--ref", "--work"):
        ap.add_argument(name, required=True)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--terms", type=int, default=2)
    ap.add_argument("--min-chars", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    import sacrebleu

    from nmtkit import Translator

    srcs, refs = read(a.src, a.limit), read(a.ref, a.limit)
    tr = Translator.load(a.ckpt, a.data, device="cpu", threads=a.threads, batch_size=a.batch, beam=a.beam)
    tr.translate(srcs[:8])  # warm-up
    print(f"[terms] {len(srcs)} sentences, beam {a.beam}, batch {a.batch}, {a.threads} thread(s)", file=sys.stderr)
    plain = tr.translate(srcs)
    terms = pick_terms(refs, plain, a.terms, a.min_chars, a.seed)
    constraints = [t or None for t in terms]
    times: dict[str, list[float]] = {"plain": [], "constrained": []}
    cpu: dict[str, list[float]] = {"plain": [], "constrained": []}
    for r in range(a.runs):
        for name in (("plain", "constrained") if r % 2 == 0 else ("constrained", "plain")):
            t0, c0 = time.perf_counter(), time.process_time()
            got = tr.translate(srcs, constraints=constraints if name == "constrained" else None)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            print(f"[terms] run {r + 1} {name}: {times[name][-1]:.1f}s ({cpu[name][-1]:.1f}s CPU)", file=sys.stderr)
            if name == "constrained":
                cons = got
            else:
                assert got == plain, "the unconstrained output changed between runs"
    sub, whole, n = use_rate(cons, terms)
    base_sub, base_whole, _ = use_rate(plain, terms)
    with_terms = [i for i, t in enumerate(terms) if t]
    bleu = {
        "plain": sacrebleu.corpus_bleu(plain, [refs]).score,
        "constrained": sacrebleu.corpus_bleu(cons, [refs]).score,
        "plain_subset": sacrebleu.corpus_bleu([plain[i] for i in with_terms], [[refs[i] for i in with_terms]]).score,
        "constrained_subset": sacrebleu.corpus_bleu([cons[i] for i in with_terms], [[refs[i] for i in with_terms]]).score,
    }
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    result = {
        "sentences": len(srcs), "constrained_sentences": len(with_terms), "terms": n, "beam": a.beam,
        "batch": a.batch, "threads": a.threads, "runs": a.runs,
        "use_rate": sub, "use_rate_words": whole, "use_rate_unconstrained": base_sub,
        "use_rate_words_unconstrained": base_whole, "bleu": bleu, "seconds": med, "cpu_seconds": med_cpu,
        "slowdown": med["constrained"] / med["plain"], "slowdown_cpu": med_cpu["constrained"] / med_cpu["plain"],
    }
    Path(a.work).mkdir(parents=True, exist_ok=True)
    (Path(a.work) / "terminology.json").write_text(json.dumps(result, indent=1) + "\n")
    (Path(a.work) / "constraints.tsv").write_text(
        "".join("\t".join([s, *t]) + "\n" for s, t in zip(srcs, terms)), encoding="utf-8")
    print(f"terms: {n} in {len(with_terms)} of {len(srcs)} sentences (up to {a.terms} reference words the "
          f"unconstrained output misses)")
    print(f"term use rate: {sub:.1%} with constraints (as whole words {whole:.1%}); {base_sub:.1%} without "
          f"(words {base_whole:.1%})")
    print(f"sacreBLEU: {bleu['plain']:.2f} without, {bleu['constrained']:.2f} with constraints "
          f"(constrained sentences alone: {bleu['plain_subset']:.2f} -> {bleu['constrained_subset']:.2f})")
    print(f"decoding time (median of {a.runs}): {med['plain']:.1f}s without, {med['constrained']:.1f}s with "
          f"constraints: {result['slowdown']:.2f}x; CPU time {med_cpu['plain']:.1f}s and {med_cpu['constrained']:.1f}s: "
          f"{result['slowdown_cpu']:.2f}x (target: at most 2x)")


if __name__ == "__main__":
    main()
