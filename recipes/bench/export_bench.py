"""Native `nmtkit generate` against CTranslate2 float32 and int8 exports of the same checkpoint.

Exports CKPT (float32 and int8) with `nmtkit export`, then translates Multi30k test_2016_flickr
(raw text, 1,000 sentences) with each runtime at every batch size and thread count, the
configurations alternating within each round so that a drifting, shared machine affects all of
them alike. Prints, per configuration, sentences/s of the whole process and of the search alone
(the summary line of `generate`), peak RSS, sacreBLEU, and the lines identical to native's; and
the export check: CTranslate2 float32 (`--lenpen-form fairseq --max-len-a 0 --max-len-b 256`)
against native generate with the same flags, with the default and with fairseq's stopping rule.
Called by recipes/bench/export.sh, which documents the variables (docs/export.md has results).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_bench import parse_summary, read_lines, run_timed  # noqa: E402


def run_once(cmd: list[str], env: dict, cwd: Path) -> dict:
    """One `nmtkit generate` run: process and search seconds, sentences, peak RSS (MiB)."""
    wall, rss, _, err = run_timed(cmd, env, cwd)
    n, _, search_s = parse_summary(err, " ".join(cmd))
    return {"wall_s": wall, "search_s": search_s, "sentences": n, "peak_rss_mib": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--src", required=True, help="raw source (test_2016_flickr.de[.gz])")
    ap.add_argument("--ref", required=True, help="raw reference (test_2016_flickr.en[.gz])")
    ap.add_argument("--work", required=True)
    ap.add_argument("--batch-sizes", default="1,128")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    a = ap.parse_args()

    import sacrebleu

    # absolute: the runs start in the work folder (run_timed: a checkout's folder would shadow nmtkit)
    a.data, a.ckpt, a.src = (str(Path(x).resolve()) for x in (a.data, a.ckpt, a.src))
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    nmtkit = [sys.executable, "-m", "nmtkit"]
    exports = {}
    for q in ("float32", "int8"):
        exports[q] = work / f"ct2-{q}"
        subprocess.run([*nmtkit, "export", a.data, "--path", a.ckpt, "--output", str(exports[q]),
                        "--quantization", q, "--force"], check=True)
    refs = read_lines(Path(a.ref))
    search = ["--beam", str(a.beam), "--lenpen", str(a.lenpen), "--lenpen-form", "fairseq",
              "--max-len-a", "0", "--max-len-b", "256", "--device", "cpu", "--input", a.src]
    runtimes = {"native": [a.data, "--path", a.ckpt, "--early-stop", "beam"],
                "ct2-float32": ["--path", str(exports["float32"])],
                "ct2-int8": ["--path", str(exports["int8"])]}
    configs = [(bs, th, rt) for bs in map(int, a.batch_sizes.split(",")) for th in map(int, a.threads.split(","))
               for rt in runtimes]
    results: dict[tuple, list[dict]] = {c: [] for c in configs}
    for r in range(a.runs):
        for bs, th, rt in configs:
            out = work / f"hyp.{rt}.b{bs}.t{th}.txt"
            cmd = [*nmtkit, "generate", *runtimes[rt], *search, "--batch-size", str(bs), "--threads", str(th),
                   "--output", str(out)]
            env = dict(os.environ, OMP_NUM_THREADS=str(th), MKL_NUM_THREADS=str(th))
            res = run_once(cmd, env, work)
            results[(bs, th, rt)].append(res)
            print(f"[bench] round {r + 1}/{a.runs} batch {bs} threads {th} {rt}: {res['wall_s']:.1f}s process, "
                  f"{res['search_s']:.1f}s search", flush=True)

    native = {c: (work / f"hyp.native.b{c[0]}.t{c[1]}.txt").read_text(encoding="utf-8").splitlines()
              for c in configs if c[2] == "native"}
    rows = []
    for bs, th, rt in configs:
        runs = results[(bs, th, rt)]
        hyps = (work / f"hyp.{rt}.b{bs}.t{th}.txt").read_text(encoding="utf-8").splitlines()
        n = runs[0]["sentences"]
        wall, srch = statistics.median(x["wall_s"] for x in runs), statistics.median(x["search_s"] for x in runs)
        rows.append({"batch": bs, "threads": th, "runtime": rt, "process_sent_s": n / wall, "search_sent_s": n / srch,
                     "peak_rss_mib": max(x["peak_rss_mib"] for x in runs),
                     "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
                     "same_as_native": sum(x == y for x, y in zip(hyps, native[(bs, th, "native")])),
                     "runs": runs})
    print(f"\nMulti30k test_2016_flickr de->en ({len(refs)} sentences), beam {a.beam}, lenpen {a.lenpen} (fairseq "
          f"form), --max-len-a 0 --max-len-b 256, CPU; median of {a.runs} alternating run(s)")
    print("| batch | threads | runtime | sent/s process | sent/s search | x native (search) | peak RSS MiB | BLEU "
          "| lines = native |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {(r["batch"], r["threads"]): r for r in rows if r["runtime"] == "native"}
    for r in rows:
        ratio = r["search_sent_s"] / base[(r["batch"], r["threads"])]["search_sent_s"]
        print(f"| {r['batch']} | {r['threads']} | {r['runtime']} | {r['process_sent_s']:.1f} | "
              f"{r['search_sent_s']:.1f} | {ratio:.2f}x | {r['peak_rss_mib']:.0f} | {r['bleu']:.2f} | "
              f"{r['same_as_native']} |")

    # The export check: the export's output against native generate with the same flags.
    flags = ["--lenpen-form", "fairseq", "--max-len-a", "0", "--max-len-b", "256", "--input", a.src, "--quiet",
             "--threads", "1", "--device", "cpu"]
    outs = {}
    for name, args in (("ct2", ["--path", str(exports["float32"])]),
                       ("native", [a.data, "--path", a.ckpt]),
                       ("native-beam", [a.data, "--path", a.ckpt, "--early-stop", "beam"])):
        p = subprocess.run([*nmtkit, "generate", *args, *flags], check=True, capture_output=True, text=True)
        outs[name] = p.stdout.splitlines()
    check = {name: sum(x == y for x, y in zip(outs["ct2"], outs[name])) for name in ("native", "native-beam")}
    bleu = {name: sacrebleu.corpus_bleu(o, [refs]).score for name, o in outs.items()}
    print(f"\nexport check (float32 export, --lenpen-form fairseq --max-len-a 0 --max-len-b 256): identical lines "
          f"{check['native']}/{len(refs)} vs native generate (--early-stop bound, its default), "
          f"{check['native-beam']}/{len(refs)} vs native --early-stop beam; BLEU ct2 {bleu['ct2']:.2f}, native "
          f"{bleu['native']:.2f}, native-beam {bleu['native-beam']:.2f}")
    (work / "results.json").write_text(json.dumps({"rows": rows, "check": check, "bleu": bleu,
                                                   "ckpt": a.ckpt, "data": a.data}, indent=2) + "\n",
                                       encoding="utf-8")
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
