"""Benchmark nmtkit at paper scale: preprocessing, training start-up memory and time, resume.

Run through recipes/bench/scale.sh. For each corpus size N:
  1. builds N synthetic de-en pairs from real text (Multi30k train and WMT14 newstest de-en),
     each pair 1-8 aligned sentence pairs joined (geometric count, mean --mean-lines), so that
     the pairs average about 30 subword tokens with a long tail, as WMT's do;
  2. runs `nmtkit preprocess` (sentencepiece 8000 joint, --workers W), timing it and sampling the
     summed RSS of its process tree;
  3. for each code checkout given (--code; e.g. this one and an older one, measured in the same
     run on the same data), runs `nmtkit train` (transformer_tiny, CPU, fp32) as one process and
     as `torchrun --nproc_per_node 2` (gloo), and reports the time from launch to the first
     update and each rank's memory at that moment (VmRSS, of which RssAnon is private) and at its
     peak (VmHWM); bytes per pair per rank = (RSS at N - RSS at the small reference corpus) /
     (N - its pairs), so that the fixed cost (torch, the model) drops out;
  4. resumes a one-process run from its mid-epoch checkpoint and times it to its next update;
and prints the disk used. Removes what it made unless --keep. With --cold the page cache is
dropped before every training launch (the shards, and torch itself, come from disk), which
needs root; --reuse --keep measure a kept corpus again without preprocessing it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preprocess_bench import TreeRss  # noqa: E402  (the same process-tree RSS sampler)

TRAIN = ["--arch", "transformer_tiny", "--max-tokens", "4096", "--threads", "1", "--no-progress-bar",
         "--log-interval", "1", "--no-validate", "--no-epoch-checkpoints", "--seed", "1"]


def read_pool(data: Path) -> tuple[list[bytes], list[bytes]]:
    """Aligned German/English sentence pairs from the shared corpora."""
    pairs = [("multi30k/train.{}.gz", "de", "en"), ("wmt14/newstest2013.{}.gz", "de", "en"),
             ("wmt14/newstest2014-ende.{}.gz", "de", "en")]
    de, en = [], []
    for pattern, s, t in pairs:
        a, b = data / pattern.format(s), data / pattern.format(t)
        if not (a.is_file() and b.is_file()):
            sys.exit(f"bench: {a} or {b} not found (set NMTKIT_SHARED to the folder holding data/)")
        with gzip.open(a, "rb") as fa, gzip.open(b, "rb") as fb:
            la, lb = fa.read().splitlines(), fb.read().splitlines()
        if len(la) != len(lb):
            sys.exit(f"bench: {a} and {b} have different line counts")
        keep = [i for i in range(len(la)) if la[i].strip() and lb[i].strip()]
        de += [la[i].strip() for i in keep]
        en += [lb[i].strip() for i in keep]
    return de, en


def build_corpus(data: Path, prefix: Path, n: int, mean_lines: float, seed: int = 1) -> None:
    """N pairs, each k >= 1 random pool pairs joined (k geometric with mean `mean_lines`, at most 8)."""
    import numpy as np

    de, en = read_pool(data)
    rng = np.random.default_rng(seed)
    with open(f"{prefix}.de", "wb") as fd, open(f"{prefix}.en", "wb") as fe:
        for start in range(0, n, 200_000):
            m = min(200_000, n - start)
            k = np.minimum(rng.geometric(1.0 / mean_lines, m), 8)
            pick = rng.integers(0, len(de), int(k.sum())).tolist()
            cut = np.concatenate([[0], np.cumsum(k)]).tolist()
            for side, fh in ((de, fd), (en, fe)):
                fh.write(b"".join(b" ".join([side[j] for j in pick[cut[i]:cut[i + 1]]]) + b"\n" for i in range(m)))


def run_preprocess(prefix: Path, dest: Path, workers: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "nmtkit", "preprocess", "-s", "de", "-t", "en", "--trainpref", str(prefix),
           "--destdir", str(dest), "--workers", str(workers),
           *(extra or ["--bpe", "sentencepiece", "--vocab-size", "8000", "--joined-dictionary"])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeRss(proc.pid)
    out, err = proc.communicate()
    sampler.stop()
    if proc.returncode != 0:
        sys.exit(f"bench: preprocess failed ({proc.returncode}):\n{err[-3000:]}")
    m = json.loads((dest / "manifest.json").read_text())
    split = m["splits"]["train"]
    tokens, pairs = sum(split["tokens"].values()), split["sentences"]
    return {"wall": time.perf_counter() - t0, "peak_mb": sampler.peak_kb / 1024, "pairs": pairs,
            "tokens_per_side": tokens / 2 / max(pairs, 1), "summary": [x for x in out.strip().splitlines() if x.startswith("time:")]}


def proc_mem(pid: int) -> dict:
    """kB figures of one process from /proc (0 when it has gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM|RssAnon|RssFile):\s+(\d+) kB", text, re.M)}


def workers_of(pid: int, procs: int) -> list[int]:
    """The training processes: the launcher itself (one process) or its children (torchrun)."""
    if procs == 1:
        return [pid]
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                kids.append(int(d))
    return kids


COLD = False  # --cold: drop the page cache before every training launch


def drop_page_cache() -> None:
    """Write back dirty pages, then let the kernel drop the clean page cache (root only)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def first_update(code: Path, data: Path, save: Path, procs: int, extra: list[str], want_update: int) -> dict:
    """Launch training; at the first logged update >= want_update, sample every rank's memory."""
    if COLD:
        drop_page_cache()
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "nmtkit", "train", str(data), "--save-dir", str(save), *TRAIN, *extra]
    if procs > 1:
        base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs),
                *base[1:]]
    log = save / "train_log.jsonl"
    t0 = time.perf_counter()
    # cwd: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH, so a
    # checkout there would be imported instead of `code`
    proc = subprocess.Popen(base, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=save.parent)
    peak: dict[int, int] = {}  # VmHWM: the kernel's peak of all resident pages, mapped shard pages included
    peak_anon: dict[int, int] = {}  # the largest private (RssAnon) figure sampled every 50 ms
    at_first, seconds = None, None
    while proc.poll() is None:
        ranks = workers_of(proc.pid, procs)
        for r in ranks:
            m = proc_mem(r)
            peak[r] = max(peak.get(r, 0), m.get("VmHWM", 0))
            if at_first is None:
                peak_anon[r] = max(peak_anon.get(r, 0), m.get("RssAnon", 0))
        if at_first is None and log.is_file():
            recs = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
            if any(r["type"] == "train" and r["update"] >= want_update for r in recs):
                seconds = time.perf_counter() - t0
                at_first = [proc_mem(r) for r in ranks]
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0 or at_first is None:
        sys.exit(f"bench: train failed ({proc.returncode}) with {code}:\n{err[-3000:]}")
    return {"seconds": seconds, "ranks": at_first, "peak_kb": sorted(peak.values())[-procs:],
            "peak_anon_kb": sorted(peak_anon.values())[-procs:]}


def train_figures(code: Path, data: Path, work: Path, procs: int) -> dict:
    save = work / f"save_{procs}"
    shutil.rmtree(save, ignore_errors=True)
    r = first_update(code, data, save, procs, ["--max-update", "2", "--save-interval-updates", "2"], 1)
    shutil.rmtree(save, ignore_errors=True)
    return r


def resume_figures(code: Path, data: Path, work: Path) -> dict:
    save = work / "save_resume"
    shutil.rmtree(save, ignore_errors=True)
    first_update(code, data, save, 1, ["--max-update", "2"], 2)  # checkpoint_last at update 2, mid-epoch
    r = first_update(code, data, save, 1, ["--max-update", "3"], 3)
    shutil.rmtree(save, ignore_errors=True)
    return r


def mean_kb(r: dict, key: str) -> float:
    return sum(m.get(key, 0) for m in r["ranks"]) / max(len(r["ranks"]), 1)


def report(label: str, n: int, small: int, big: dict, ref: dict, procs: int) -> None:
    """One line: seconds to the first update and bytes per pair per rank (N against the reference)."""
    per = {k: (mean_kb(big, k) - mean_kb(ref, k)) * 1024 / (n - small) for k in ("VmRSS", "RssAnon")}
    peak = {k: (sum(big[k]) - sum(ref[k])) / procs * 1024 / (n - small) for k in ("peak_kb", "peak_anon_kb")}
    print(f"  {label}, {procs} process(es), {n:,} pairs: first update after {big['seconds']:.1f}s "
          f"(reference corpus {ref['seconds']:.1f}s); per rank there: {mean_kb(big, 'RssAnon') / 1024:.0f} MiB "
          f"private, {per['RssAnon']:.1f} bytes per pair (start-up peak {peak['peak_anon_kb']:.1f}); "
          f"all resident pages incl. mapped shards {mean_kb(big, 'VmRSS') / 1024:.0f} MiB, {per['VmRSS']:.1f} "
          f"bytes per pair (VmHWM {peak['peak_kb']:.1f})" + (" [page cache dropped before each launch]" if COLD else ""),
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the shared data folder (multi30k/, wmt14/)")
    ap.add_argument("--sizes", default="1000000", help="comma-separated corpus sizes in pairs")
    ap.add_argument("--small", type=int, default=20_000, help="pairs of the reference corpus (fixed costs)")
    ap.add_argument("--work", type=Path, required=True, help="scratch folder")
    ap.add_argument("--code", default=".", help="comma-separated nmtkit checkouts to train with (label=path)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mean-lines", type=float, default=1.6, help="mean sentences joined per pair")
    ap.add_argument("--keep", action="store_true", help="leave the scratch folder and the data directories")
    ap.add_argument("--reuse", action="store_true", help="use WORK/dataN and WORK/ref when they exist")
    ap.add_argument("--replicate", type=int, default=1,
                    help="also measure training on the largest size's shards linked K times (K x the pairs)")
    ap.add_argument("--replicate-only", action="store_true", help="with --replicate: skip the unlinked sizes' training")
    ap.add_argument("--cold", action="store_true",
                    help="drop the page cache before every training launch (needs root), so start-up reads from disk")
    args = ap.parse_args()
    if args.cold:
        global COLD
        try:
            drop_page_cache()
        except OSError as e:
            sys.exit(f"bench: --cold needs to write /proc/sys/vm/drop_caches (root): {e.strerror}")
        COLD = True
    codes = [(c.split("=", 1) if "=" in c else (c, c)) for c in args.code.split(",")]
    codes = [(label, Path(p).resolve()) for label, p in codes]
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        for n in sorted(int(x) for x in args.sizes.split(",")):
            run_size(args, n, codes)
    finally:
        du = subprocess.run(["du", "-sh", str(args.work)], capture_output=True, text=True).stdout.split()[:1]
        print(f"disk used at the end: {du[0] if du else '?'} in {args.work}")
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)


def run_size(args, n: int, codes: list[tuple[str, Path]]) -> None:
    w = args.work
    data = w / f"data{n}"
    if args.reuse and (data / "manifest.json").is_file() and (w / "ref" / "manifest.json").is_file():
        pairs = json.loads((data / "manifest.json").read_text())["splits"]["train"]["sentences"]
        ref_pairs = json.loads((w / "ref" / "manifest.json").read_text())["splits"]["train"]["sentences"]
        print(f"reusing {data} ({pairs:,} pairs) and {w / 'ref'}", flush=True)
    else:
        pairs, ref_pairs = prepare(args, n)
    if not args.replicate_only:
        measure_training(data, pairs, w / "ref", ref_pairs, codes, w)
    if args.replicate > 1 and n == max(int(x) for x in args.sizes.split(",")):
        data, pairs = replicate(data, args.replicate), pairs * args.replicate
        print(f"{pairs:,} pairs: the shards above linked {args.replicate} times (hard links, not preprocessed)",
              flush=True)
        measure_training(data, pairs, w / "ref", ref_pairs, codes, w)
    if not args.keep:
        shutil.rmtree(w / f"data{n}", ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def prepare(args, n: int) -> tuple[int, int]:
    """The corpus of n pairs preprocessed into WORK/dataN, and the reference corpus into WORK/ref."""
    w = args.work
    t = time.perf_counter()
    build_corpus(args.data, w / f"corpus{n}", n, args.mean_lines)
    print(f"corpus: {n:,} pairs in {time.perf_counter() - t:.0f}s, "
          f"{sum((w / f'corpus{n}.{x}').stat().st_size for x in ('de', 'en')) / 2**30:.2f} GiB of text", flush=True)
    pre = run_preprocess(w / f"corpus{n}", w / f"data{n}", args.workers, [])
    # the reference corpus (fixed costs) shares the dictionary, so the two models are the same size
    build_corpus(args.data, w / "ref_corpus", args.small, args.mean_lines, seed=2)
    ref_pre = run_preprocess(w / "ref_corpus", w / "ref", args.workers,
                             ["--srcdict", str(w / f"data{n}"), "--tgtdict", str(w / f"data{n}"), "--force"])
    for x in ("de", "en"):
        (w / f"corpus{n}.{x}").unlink()
        (w / f"ref_corpus.{x}").unlink()
    du = subprocess.run(["du", "-sh", str(w / f"data{n}")], capture_output=True, text=True).stdout.split()[0]
    print(f"preprocess {n:,} pairs ({pre['pairs']:,} kept, {pre['tokens_per_side']:.1f} tokens per side on "
          f"average), --workers {args.workers}: "
          f"{pre['wall']:.0f}s ({pre['pairs'] / pre['wall']:,.0f} pairs/s), peak RSS {pre['peak_mb']:.0f} MiB; "
          f"data directory {du}", flush=True)
    for line in pre["summary"]:  # preprocess's own phases: check, learn, binarize train, valid/test
        print(f"  {line}", flush=True)
    return pre["pairs"], ref_pre["pairs"]


def replicate(data: Path, k: int) -> Path:
    """A data directory whose train split is `data`'s shards listed k times (hard links, no disk):
    k times the pairs for measuring training start-up, without preprocessing them."""
    out = data.parent / f"{data.name}x{k}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    m = json.loads((data / "manifest.json").read_text())
    for name in m["files"]:
        os.link(data / name, out / name)
    train, shards = m["splits"]["train"], []
    for copy in range(k):
        for shard in train["shards"]:
            new = {"sentences": shard["sentences"]}
            for lang in (m["source_lang"], m["target_lang"]):
                e = dict(shard[lang])
                for key in ("bin", "idx"):
                    e[key] = re.sub(r"\.(\d+)\.", f".{len(shards):03d}.", e[key]) if copy else e[key]
                    if copy:
                        os.link(data / shard[lang][key], out / e[key])
                        m["files"][e[key]] = m["files"][shard[lang][key]]
                new[lang] = e
            shards.append(new)
    train["shards"] = shards
    for key in ("lines", "sentences"):
        train[key] *= k
    train["tokens"] = {lang: v * k for lang, v in train["tokens"].items()}
    m["fingerprint"] = f"{m.get('fingerprint')}x{k}"
    (out / "manifest.json").write_text(json.dumps(m, indent=2))
    try:  # what preprocess leaves: the record of checked files (nmtkit versions that keep one)
        from nmtkit.data.manifest import remember_verified
    except ImportError:
        pass
    else:
        remember_verified(out, m["files"])
    return out


def measure_training(data: Path, pairs: int, ref: Path, ref_pairs: int, codes, w: Path) -> None:
    for label, code in codes:
        for procs in (1, 2):
            r0 = train_figures(code, ref, w, procs)
            big = train_figures(code, data, w, procs)
            report(label, pairs, ref_pairs, big, r0, procs)
        r = resume_figures(code, data, w)
        print(f"  {label}: resume mid-epoch (update 2 of an epoch) to its next update: {r['seconds']:.1f}s"
              + (" (page cache dropped before each launch)" if COLD else ""), flush=True)


if __name__ == "__main__":
    main()
