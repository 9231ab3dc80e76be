"""Benchmark `nmtkit generate` on Multi30k test_2016_flickr (1,000 sentences), beam 4, on CPU.

For each batch size: sentences/s and target tokens/s of the whole process (start-up, model
loading and reading included) and of the search alone (the summary line `generate` prints),
the peak RSS of the process, and sacreBLEU against the raw reference. The median of RUNS runs.
Target tokens are the subword tokens of the hypotheses without </s> (as in
../shared/anchors/README.md). Called by recipes/bench/generate.sh, which documents the variables.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

SUMMARY = re.compile(
    r"translated ([\d,]+) sentences \(([\d,]+) target tokens\) in [\d.]+s: .* search only ([\d.]+)s"
)


def run_once(cmd: list[str], env: dict) -> dict:
    """Run one `nmtkit generate`; wall time, peak RSS (its own, from wait4) and its summary."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"[bench] generate failed ({proc.returncode}):\n{err}")
    m = SUMMARY.search(err)
    if not m:
        sys.exit(f"[bench] no summary line in generate's stderr:\n{err}")
    sents, toks, search_s = int(m.group(1).replace(",", "")), int(m.group(2).replace(",", "")), float(m.group(3))
    return {"wall_s": wall, "search_s": search_s, "sentences": sents, "tokens": toks,
            "peak_rss_mib": usage.ru_maxrss / 1024}


def read_ref(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="preprocessed Multi30k de-en data dir (test = test_2016_flickr)")
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--ref", required=True, help="raw reference (test_2016_flickr.en[.gz]) for BLEU")
    ap.add_argument("--work", required=True)
    ap.add_argument("--batch-sizes", default="1,16,128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    ap.add_argument("--lenpen-form", default="fairseq")
    ap.add_argument("--extra", default="", help="more generate flags, space-separated")
    a = ap.parse_args()

    import sacrebleu

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    refs = read_ref(Path(a.ref))
    rows = []
    outputs = {}
    for bs in [int(x) for x in a.batch_sizes.split(",")]:
        hyp = work / f"hyp.b{bs}.txt"
        cmd = [sys.executable, "-m", "nmtkit", "generate", a.data, "--path", a.ckpt, "--device", "cpu",
               "--threads", str(a.threads), "--batch-size", str(bs), "--beam", str(a.beam),
               "--lenpen", str(a.lenpen), "--lenpen-form", a.lenpen_form, "--max-len-a", "1",
               "--max-len-b", "50", "--output", str(hyp), *a.extra.split()]
        runs = []
        for r in range(a.runs):
            res = run_once(cmd, env)
            runs.append(res)
            print(f"[bench] batch {bs} run {r + 1}/{a.runs}: {res['wall_s']:.1f}s process, "
                  f"{res['search_s']:.1f}s search, {res['peak_rss_mib']:.0f} MiB", flush=True)
        med = lambda k: statistics.median(x[k] for x in runs)  # noqa: E731
        hyps = hyp.read_text(encoding="utf-8").splitlines()
        outputs[bs] = hyps
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score if len(hyps) == len(refs) else float("nan")
        n, toks = runs[0]["sentences"], runs[0]["tokens"]
        rows.append({"batch_size": bs, "sentences": n, "target_tokens": toks,
                     "process_s": med("wall_s"), "search_s": med("search_s"),
                     "process_sent_s": n / med("wall_s"), "search_sent_s": n / med("search_s"),
                     "process_tok_s": toks / med("wall_s"), "search_tok_s": toks / med("search_s"),
                     "peak_rss_mib": max(x["peak_rss_mib"] for x in runs), "bleu": bleu, "runs": runs})
    same = len({tuple(v) for v in outputs.values()}) == 1
    print()
    print(f"nmtkit generate, Multi30k test_2016_flickr de->en, beam {a.beam}, lenpen {a.lenpen} "
          f"({a.lenpen_form} form), {a.threads} threads, CPU; median of {a.runs} run(s)")
    print("| batch | sent/s process | sent/s search | tok/s process | tok/s search | peak RSS MiB | BLEU |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch_size']} | {r['process_sent_s']:.1f} | {r['search_sent_s']:.1f} | "
              f"{r['process_tok_s']:.0f} | {r['search_tok_s']:.0f} | {r['peak_rss_mib']:.0f} | {r['bleu']:.2f} |")
    print(f"outputs identical across batch sizes: {'yes' if same else 'NO'}")
    result = {"data": a.data, "ckpt": a.ckpt, "threads": a.threads, "beam": a.beam, "lenpen": a.lenpen,
              "lenpen_form": a.lenpen_form, "rows": rows, "identical_outputs": same}
    (work / "results.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
