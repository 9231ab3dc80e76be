"""Benchmark `nmtkit preprocess` against sentencepiece's own encoding speed (its upper limit).

Run through recipes/bench/preprocess.sh. Builds Multi30k train repeated to SIZE pairs, then for
each worker count W:
  1. runs `nmtkit preprocess --workers W` (sentencepiece 8000 joint, joined dictionary) as a child
     process, sampling the summed RSS of its whole process tree every 100 ms;
  2. measures sentencepiece alone encoding the same training text (both sides) with the model
     that run learned, `sp.encode(batch, num_threads=W)` on the same cores, lines preloaded,
     twice (before and after the run where possible, since the machine's load drifts);
and prints sentences/s, the ratio to the raw encoder, and peak memory.

Why the raw encoder is measured here rather than quoted: the machine's speed and load change,
and only a same-run measurement makes the ratio meaningful.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path


def build_corpus(data: Path, out: Path, size: int) -> tuple[Path, int]:
    """Multi30k train repeated (and cut) to `size` pairs, as plain text; cached by size."""
    out.mkdir(parents=True, exist_ok=True)
    prefix = out / f"multi30k_x{size}"
    stamp = Path(f"{prefix}.done")
    if stamp.is_file():
        return prefix, size
    for lang in ("de", "en"):
        src = data / f"train.{lang}.gz"
        if not src.is_file():
            sys.exit(f"bench: {src} not found (set NMTKIT_DATA to a folder with train.de.gz and train.en.gz)")
        with gzip.open(src, "rb") as fh:
            lines = fh.read().splitlines(keepends=True)
        tmp = Path(f"{prefix}.{lang}.tmp")
        with open(tmp, "wb") as fo:
            left = size
            while left > 0:
                chunk = lines[:left]
                fo.writelines(chunk)
                left -= len(chunk)
        os.replace(tmp, f"{prefix}.{lang}")
    stamp.write_text(str(size))
    return prefix, size


class TreeRss:
    """Samples the summed RSS (kB) of a process and all its descendants."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid, self.interval, self.peak_kb, self.peak_procs = pid, interval, 0, 0
        self.peak_single_kb = 0  # the largest single process seen
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            total, procs = 0, self._tree()
            for p in procs:
                try:
                    with open(f"/proc/{p}/status") as fh:
                        m = re.search(r"^VmRSS:\s+(\d+) kB", fh.read(), re.M)
                    kb = int(m.group(1)) if m else 0
                    total += kb
                    self.peak_single_kb = max(self.peak_single_kb, kb)
                except OSError:
                    pass
            if total > self.peak_kb:
                self.peak_kb, self.peak_procs = total, len(procs)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def run_preprocess(prefix: Path, dest: Path, workers: int) -> dict:
    cmd = ["nmtkit", "preprocess", "-s", "de", "-t", "en", "--trainpref", str(prefix), "--destdir", str(dest),
           "--bpe", "sentencepiece", "--vocab-size", "8000", "--joined-dictionary", "--workers", str(workers),
           "--force"]
    print("bench: $ " + " ".join(cmd), file=sys.stderr, flush=True)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeRss(proc.pid)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.stop()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the whole tree, once every process is reaped
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    if proc.returncode != 0:
        sys.exit(f"bench: nmtkit preprocess failed ({proc.returncode}):\n{err[-3000:]}")
    m = re.search(r"time: check ([\d.]+)s, learn ([\d.]+)s, binarize train ([\d.]+)s \([\d,]+ pairs/s, ([\d.]+) CPU s\)", out)
    if not m:
        sys.exit(f"bench: could not read the timings from the summary:\n{out}")
    check, learn, binarize, binarize_cpu = (float(x) for x in m.groups())
    return {"wall": wall, "cpu": cpu, "check": check, "learn": learn, "binarize": binarize, "binarize_cpu": binarize_cpu,
            "tree_peak_mb": sampler.peak_kb / 1024, "procs": sampler.peak_procs,
            "single_peak_mb": sampler.peak_single_kb / 1024, "summary": out}


def raw_encode(model: Path, files: list[Path], threads: int) -> tuple[float, float, int]:
    """Run `_raw_encode` in a fresh process (so that this one stays small and its ~1 GB of
    preloaded lines never shows up in the memory figures of the preprocess runs it forks)."""
    out = subprocess.run([sys.executable, __file__, "--raw-encode", str(model), str(threads), *map(str, files)],
                         check=True, capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def _raw_encode(model: Path, files: list[Path], threads: int, batch: int = 100_000) -> tuple[float, float, int]:
    """Wall and CPU seconds sentencepiece alone needs to encode `files` (preloaded) with `threads`
    threads, and the number of lines."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    seconds, cpu, n = 0.0, 0.0, 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i in range(0, len(lines), batch):
            part = lines[i : i + batch]
            t, c = time.perf_counter(), time.process_time()
            sp.encode(part, num_threads=threads)
            seconds += time.perf_counter() - t
            cpu += time.process_time() - c
            n += len(part)
        del lines
    return seconds, cpu, n


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-encode":
        secs, cpu, n = _raw_encode(Path(sys.argv[2]), [Path(f) for f in sys.argv[4:]], int(sys.argv[3]))
        print(secs, cpu, n)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder with Multi30k train.{de,en}.gz")
    ap.add_argument("--size", type=int, default=3_000_000, help="sentence pairs in the benchmark corpus")
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (corpus and outputs)")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    args = ap.parse_args()

    prefix, size = build_corpus(args.data, args.work, args.size)
    mb = sum(Path(f"{prefix}.{lang}").stat().st_size for lang in ("de", "en")) / 1e6
    print(f"corpus: {size:,} pairs ({2 * size:,} lines, {mb:,.0f} MB): Multi30k train repeated; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    counts = [int(x) for x in args.workers.split(",")]
    text = [Path(f"{prefix}.de"), Path(f"{prefix}.en")]
    runs: dict[int, dict] = {}
    raw: dict[int, list[float]] = {w: [] for w in counts}
    raw_cpu: list[float] = []

    def measure_raw(w: int, model: Path) -> None:
        secs, cpu, n = raw_encode(model, text, w)
        raw[w].append(n / 2 / secs)
        raw_cpu.append(cpu)
        print(f"raw sentencepiece, {w} thread(s): {secs:.1f}s ({cpu:.1f} CPU s) for {n:,} lines "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)

    # The machine's load drifts, so each worker count's raw encoder speed is measured twice,
    # bracketing its own preprocess run as closely as possible, and averaged:
    #   pre(w1) raw(1) | raw(2) pre(w2) raw(2) | ... | raw(1)
    for i, w in enumerate(counts):
        dest = args.work / f"out_w{w}"
        model = args.work / f"out_w{counts[0]}" / "spm.model"
        if i > 0:
            measure_raw(w, model)
        r = run_preprocess(prefix, dest, w)
        runs[w] = r
        print(f"workers={w}: preprocess {r['wall']:.1f}s, {r['cpu']:.1f} CPU s (check {r['check']:.1f}s, learn {r['learn']:.1f}s, "
              f"binarize {r['binarize']:.1f}s, load average {os.getloadavg()[0]:.1f})", flush=True)
        if (dest / "spm.model").read_bytes() != model.read_bytes():
            sys.exit("bench: the runs learned different sentencepiece models; preprocess is not deterministic")
        measure_raw(w, model)
    if len(counts) > 1:
        measure_raw(counts[0], args.work / f"out_w{counts[0]}" / "spm.model")
    rows = []
    for w in counts:
        r = runs[w]
        r["raw_pairs_s"] = sum(raw[w]) / len(raw[w])
        r["raw_all"] = raw[w]
        r["bin_pairs_s"] = size / r["binarize"]
        r["e2e_pairs_s"] = size / r["wall"]
        rows.append((w, r))
    print()
    hdr = ("workers", "binarize pairs/s", "raw spm pairs/s (mean of)", "ratio", "end-to-end pairs/s", "e2e ratio",
           "peak RSS (tree)")
    print(" | ".join(hdr))
    for w, r in rows:
        print(" | ".join([
            f"{w}", f"{r['bin_pairs_s']:,.0f}",
            f"{r['raw_pairs_s']:,.0f} (" + ", ".join(f"{x:,.0f}" for x in r["raw_all"]) + ")",
            f"{r['bin_pairs_s'] / r['raw_pairs_s']:.2f}",
            f"{r['e2e_pairs_s']:,.0f}", f"{r['e2e_pairs_s'] / r['raw_pairs_s']:.2f}",
            f"{r['tree_peak_mb']:,.0f} MB ({r['procs']} processes; largest one {r['single_peak_mb']:,.0f} MB)",
        ]))
    mean_raw_cpu = sum(raw_cpu) / len(raw_cpu)
    print(f"CPU time (independent of the machine's load): raw sentencepiece encode {mean_raw_cpu:.1f} CPU s")
    for w, r in rows:
        print(f"  workers={w}: binarize {r['binarize_cpu']:.1f} CPU s (ratio {mean_raw_cpu / r['binarize_cpu']:.2f}); "
              f"whole command, all processes {r['cpu']:.1f} CPU s (ratio {mean_raw_cpu / r['cpu']:.2f})")
    print("targets: binarize ratio >= 0.70; peak RSS < 1500 MB for 3M pairs. "
          "binarize = encoding the training text, cleaning, counting and writing shards (the summary's "
          "'binarize train'); end-to-end also includes checking the inputs and learning sentencepiece. "
          "RSS of the tree sums every process (shared pages counted once per process: an upper bound).")


if __name__ == "__main__":
    main()
