"""Benchmark `nmtkit generate` against CTranslate2 on the same weights, in one sitting, on CPU.

The CTranslate2 model is made from the checkpoint by `nmtkit export --format ctranslate2` (float32
and int8), and run by recipes/bench/ct2_translate.py through CTranslate2's own API. Both sides
translate the same raw text (segmented with the data directory's subword model) with the same
search: beam 4, length penalty 0.6 in the |Y|^alpha form, fairseq's stopping rule
(`--early-stop beam`, what CTranslate2 does), output limit 256 tokens. For every thread count and
batch size the systems run in turn, in a rotating order, RUNS times (shared machines drift:
compare within a row). Reported: sentences/s of the decoding alone (nmtkit's "search only",
CTranslate2's translate_batch) and of the whole process, peak RSS of the process, sacreBLEU,
and how many output lines equal nmtkit fp32's; then the ratios, the start-up time on an empty
input, and the speed targets of docs/generate.md, each with its figure and whether it is met. Called by recipes/bench/generate.sh, which documents the variables.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The search's seconds are printed to 0.1 s, its sentences/s to 0.1 sentence/s (computed from the
# unrounded time): the decode time is taken from the rate, as 1.3 s would be +-4%.
SUMMARY = re.compile(
    r"translated ([\d,]+) sentences \(([\d,]+) target tokens\) in [\d.]+s: .* search only [\d.]+s: "
    r"([\d,.]+) sentences/s"
)
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]  # the checkout benchmarked (every nmtkit run imports it through PYTHONPATH)


# each route with the shortlist against itself without it, and nmtkit's against CTranslate2's vmap
SHORTLIST_PAIRS = (("nmtkit fp32 + shortlist", "nmtkit fp32"), ("nmtkit int8 + shortlist", "nmtkit int8"),
                   ("ONNX fp32 + shortlist", "ONNX fp32"), ("ONNX int8 + shortlist", "ONNX int8"),
                   ("CTranslate2 float32 + vmap", "CTranslate2 float32"),
                   ("CTranslate2 int8_float32 + vmap", "CTranslate2 int8_float32"),
                   ("nmtkit int8 + shortlist", "CTranslate2 int8_float32 + vmap"),
                   ("ONNX int8 + shortlist", "CTranslate2 int8_float32 + vmap"))


def search_flags(beam: int, lenpen: float) -> list[str]:
    """The search every bench runs, CTranslate2's own: |Y|^alpha length penalty, fairseq's stopping
    rule, output limit 256 tokens."""
    return ["--beam", str(beam), "--lenpen", str(lenpen), "--lenpen-form", "fairseq",
            "--early-stop", "beam", "--max-len-a", "0", "--max-len-b", "256"]


def parse_summary(err: str, who: str) -> tuple[int, int, float]:
    """(sentences, target tokens, search seconds) from `nmtkit generate`'s summary line on stderr."""
    m = SUMMARY.search(err)
    if not m:
        sys.exit(f"[bench] no summary line from {who}:\n{err[-3000:]}")
    sents, toks = int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))
    return sents, toks, sents / float(m.group(3).replace(",", ""))


def run_timed(cmd: list[str], env: dict, cwd: Path, stdin=None) -> tuple[float, float, str, str]:
    """(wall seconds, peak RSS MiB (the process's own, from wait4), stdout, stderr) of one process.

    `cwd` is outside any checkout: `python -m nmtkit` puts the working directory first on the
    path, which would override PYTHONPATH's choice of checkout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=stdin or subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True, cwd=cwd)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"[bench] failed ({code}): {' '.join(cmd)}\n{err[-3000:]}")
    return wall, usage.ru_maxrss / 1024, out, err


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def size_mib(paths: list[Path]) -> float:
    """Size on disk of files, and of every file under directories, in MiB."""
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**20


def native_files(ckpt: str, data: str) -> list[Path]:
    """What nmtkit's own search loads to translate text: the checkpoint, and the data directory's
    manifest, dictionaries and subword model (what an export copies; not the binarized shards)."""
    from nmtkit.backends.directory import data_files

    manifest = Path(data) / "manifest.json"
    return [Path(ckpt), manifest] + [Path(data) / name for name in data_files(json.loads(manifest.read_text()))]


class System:
    """One thing to time: a command line for a batch size and a thread count."""

    def __init__(self, label: str, make, checkout: Path, weights: list[Path] | None = None):
        # weights: the files and export directory the system loads (its size on disk)
        self.label, self.make, self.checkout, self.weights = label, make, checkout, weights

    def env(self, threads: int | None = None) -> dict:
        env = dict(os.environ, PYTHONPATH=str(self.checkout))
        if threads is not None:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        return env

    def once(self, bs: int, threads: int, hyp: Path) -> dict:
        cmd, kind = self.make(bs, threads, hyp)
        wall, rss, out, err = run_timed(cmd, self.env(threads), hyp.parent)
        if kind == "nmtkit":
            sents, toks, decode = parse_summary(err, self.label)
        else:
            d = json.loads(out.strip().splitlines()[-1])
            sents, toks, decode = d["sentences"], d["tokens"], d["translate_s"]
        return {"wall_s": wall, "decode_s": decode, "sentences": sents, "tokens": toks, "peak_rss_mib": rss}


def best(by: dict, threads: int, bs: int) -> dict | None:
    """The faster of nmtkit fp32 and int8 in one (threads, batch) cell, or None."""
    cands = [by[k] for k in ((threads, bs, "nmtkit fp32"), (threads, bs, "nmtkit int8")) if k in by]
    return max(cands, key=lambda r: r["decode_sent_s"]) if cands else None


def targets(rows: list[dict], startup: list[tuple[str, float]]) -> list[str]:
    """The speed targets of docs/generate.md (Speed), one line each: the measured figure and
    whether it is met; a target whose rows were not run is left out."""
    by = {(r["threads"], r["batch_size"], r["system"]): r for r in rows}
    ok = lambda met: "met" if met else "NOT met"  # noqa: E731
    out = []
    b, c = best(by, 2, 128), by.get((2, 128, "CTranslate2 int8_float32"))
    if b and c:
        x = b["decode_sent_s"] / c["decode_sent_s"]
        out.append(f"batch 128, 2 threads: best nmtkit ({b['system']}) / CTranslate2 int8_float32 = {x:.2f}x "
                   f"(target >= 1.0x: {ok(x >= 1.0)})")
    n, c = by.get((1, 1, "nmtkit fp32")), by.get((1, 1, "CTranslate2 float32"))
    if n and c:
        x = n["decode_sent_s"] / c["decode_sent_s"]
        b = best(by, 1, 1)
        also = (f"; best nmtkit ({b['system']}) {b['decode_sent_s'] / c['decode_sent_s']:.2f}x"
                if b is not n else "")
        out.append(f"batch 1, 1 thread: nmtkit fp32 / CTranslate2 float32 = {x:.2f}x{also} (target >= 1.0x: {ok(x >= 1.0)})")
    for label, wall in startup:
        if label == "nmtkit fp32":
            out.append(f"start-up on an empty input: {wall:.2f} s (target <= 1.0 s: {ok(wall <= 1.0)})")
    rss = [(by[k]["peak_rss_mib"] / by[(k[0], k[1], "CTranslate2 float32")]["peak_rss_mib"], k[0])
           for k in by if k[1] == 128 and k[2] == "nmtkit fp32" and (k[0], k[1], "CTranslate2 float32") in by]
    if rss:
        x, threads = max(rss)
        out.append(f"peak RSS at batch 128: nmtkit fp32 / CTranslate2 float32 = {x:.2f}x ({threads} thread(s), "
                   f"the worst; target <= 1.5x: {ok(x <= 1.5)})")
    drops = [by[k]["bleu"] - by[(k[0], k[1], "nmtkit int8")]["bleu"]
             for k in by if k[2] == "nmtkit fp32" and (k[0], k[1], "nmtkit int8") in by]
    drops = [x for x in drops if not math.isnan(x)]  # a run with missing lines has no BLEU
    if drops:
        x = round(max(drops), 2)  # BLEU as reported (two decimals): 25.6 - 25.3 is 0.30000000000000071
        out.append(f"BLEU of --quantize int8: at most {x:.2f} below fp32 (target <= 0.3: {ok(x <= 0.3)})")
    return out


def onnx_targets(rows: list[dict], startup: list[tuple[str, float]]) -> list[str]:
    """The ONNX export's targets (docs/export.md), one line each: figure and whether it is met."""
    by = {(r["threads"], r["batch_size"], r["system"]): r for r in rows}
    ok = lambda met: "met" if met else "NOT met"  # noqa: E731
    out = []
    for (threads, bs, label), r in sorted(by.items()):
        if label == "ONNX fp32" and (threads, bs, "nmtkit fp32") in by:
            out.append(f"{threads} thread(s), batch {bs}: ONNX fp32 output lines equal to nmtkit fp32: "
                       f"{r['same_as_first']} of {r['sentences']} (target >= 99.5%: "
                       f"{ok(r['same_as_first'] >= 0.995 * r['sentences'])})")
    o, c = by.get((1, 1, "ONNX fp32")), by.get((1, 1, "CTranslate2 float32"))
    if o and c:
        x = o["decode_sent_s"] / c["decode_sent_s"]
        out.append(f"batch 1, 1 thread: ONNX fp32 / CTranslate2 float32 = {x:.2f}x (target >= 1.0x: {ok(x >= 1.0)})")
    cands = [by[k] for k in ((2, 128, "ONNX fp32"), (2, 128, "ONNX int8")) if k in by]
    c = by.get((2, 128, "CTranslate2 int8_float32"))
    if cands and c:
        b = max(cands, key=lambda r: r["decode_sent_s"])
        x = b["decode_sent_s"] / c["decode_sent_s"]
        out.append(f"batch 128, 2 threads: best ONNX ({b['system']}) / CTranslate2 int8_float32 = {x:.2f}x "
                   f"(target >= 1.0x: {ok(x >= 1.0)})")
    for label, wall in startup:
        if label.startswith("ONNX"):
            out.append(f"start-up on an empty input, {label}: {wall:.2f} s (target <= 0.5 s: {ok(wall <= 0.5)})")
    for label in ("ONNX fp32", "ONNX int8"):
        rss = [(by[k]["peak_rss_mib"] / by[(k[0], 128, "CTranslate2 float32")]["peak_rss_mib"], k[0])
               for k in by if k[1] == 128 and k[2] == label and (k[0], 128, "CTranslate2 float32") in by]
        if rss:
            x, threads = max(rss)
            out.append(f"peak RSS at batch 128: {label} / CTranslate2 float32 = {x:.2f}x ({threads} thread(s), the "
                       f"worst; target <= 1.5x: {ok(x <= 1.5)})")
    drops = [by[k]["bleu"] - by[(k[0], k[1], "ONNX int8")]["bleu"]
             for k in by if k[2] == "ONNX fp32" and (k[0], k[1], "ONNX int8") in by]
    drops = [x for x in drops if not math.isnan(x)]
    if drops:
        x = round(max(drops), 2)
        out.append(f"BLEU of the ONNX int8 export: at most {x:.2f} below ONNX fp32 (target <= 0.3: {ok(x <= 0.3)})")
    return out


RESCORE = """
import json, sys
from nmtkit import Translator
a = json.loads(sys.argv[1])
native = Translator.load(a["ckpt"], a["data"], device="cpu", threads=1, **a["search"])
onnx = Translator.load(a["onnx"], threads=1, **a["search"])
n, o = native.translate_nbest(a["lines"]), onnx.translate_nbest(a["lines"])
print(json.dumps([[x[0].text, x[0].score, y[0].text, y[0].score] for x, y in zip(n, o)]))
"""


def differing_lines(rows: list[dict], work: Path, a, onnx_exports: dict) -> list[str]:
    """Every input line whose ONNX fp32 output differs from nmtkit fp32's (the largest batch
    run), with both scores: searched again, one sentence at a time, by both."""
    cells = sorted((r["threads"], r["batch_size"]) for r in rows if r["system"] == "ONNX fp32")
    if not cells or "float32" not in onnx_exports:
        return []
    threads, bs = cells[-1]
    name = lambda label: work / f"hyp.{re.sub(r'[^a-z0-9]+', '_', label.lower())}.t{threads}.b{bs}.txt"  # noqa: E731
    native = name("nmtkit fp32").read_text(encoding="utf-8").splitlines()
    mine = name("ONNX fp32").read_text(encoding="utf-8").splitlines()
    diff = [i for i, (x, y) in enumerate(zip(native, mine)) if x != y]
    out = [f"ONNX fp32 vs nmtkit fp32 ({threads} thread(s), batch {bs}): {len(diff)} line(s) differ"]
    if not diff:
        return out
    src = (work / "src.txt").read_text(encoding="utf-8").splitlines()
    args = {"ckpt": a.ckpt, "data": a.data, "onnx": str(onnx_exports["float32"]), "lines": [src[i] for i in diff],
            "search": {"beam": a.beam, "lenpen": a.lenpen, "lenpen_form": "fairseq", "early_stop": "beam",
                       "max_len_a": 0.0, "max_len_b": 256}}
    r = subprocess.run([sys.executable, "-c", RESCORE, json.dumps(args)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=work)
    if r.returncode != 0:
        return out + [f"(rescoring failed: {r.stderr.strip()[-300:]})"]
    for i, (nt, ns, ot, os_) in zip(diff, json.loads(r.stdout)):
        out.append(f"- line {i + 1}: native {ns:.6f} {nt!r} | ONNX {os_:.6f} {ot!r} | difference {os_ - ns:+.2e}")
    return out


def make_systems(a, wanted: list[str], work: Path, src: Path, search: list[str], ckpt: str, data: str,
                 prefix: str = "") -> tuple[list[System], dict, list[str]]:
    """The systems named in `wanted` for one checkpoint: nmtkit's search on it and its CTranslate2
    and ONNX exports, made once into `work` (`a`: the bench's options). Returns the systems, their
    labels prefixed with `prefix`; the ONNX exports by quantization (with a shortlist:
    (quantization, True)); and `wanted`, without the CTranslate2 systems when that export failed."""
    py = sys.executable

    def native(extra: list[str]):
        def make(bs, threads, hyp):
            return ([py, "-m", "nmtkit", "generate", data, "--path", ckpt, "--input", str(src),
                     "--output", str(hyp), "--device", "cpu", "--threads", str(threads), "--batch-size", str(bs),
                     *search, *extra, *a.extra.split()], "nmtkit")
        return make

    def export(fmt: str, q: str, shortlist: bool, pythonpath: str | None = None) -> Path | str:
        """`nmtkit export` of CKPT into the work folder: its directory, or the error's last lines."""
        out = work / f"{'ct2' if fmt == 'ctranslate2' else fmt}_{q}{'_sl' if shortlist else ''}"
        print(f"[bench] nmtkit export --format {fmt} --quantization {q}{' --shortlist' if shortlist else ''} -> {out}",
              flush=True)
        r = subprocess.run([py, "-m", "nmtkit", "export", data, "--path", ckpt, "--format", fmt, "--output", str(out),
                            "--quantization", q, "--force", *(["--shortlist", a.shortlist] if shortlist else [])],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=pythonpath or str(REPO)),
                           cwd=work)
        return out if r.returncode == 0 else (r.stderr or r.stdout).strip()[-500:]

    exports = {}  # (quantization, with a shortlist) -> CTranslate2 export
    for q in ("float32", "int8"):
        for sl in (False, True):
            if f"ct2{'-int8' if q == 'int8' else ''}{'-vmap' if sl else ''}" not in wanted:
                continue
            out = export("ctranslate2", q, sl, a.export_pythonpath)
            if isinstance(out, str):
                print(f"[bench] {prefix}no CTranslate2 side: `nmtkit export` failed: {out}", flush=True)
                wanted = [s for s in wanted if not s.startswith("ct2")]
                break
            exports[q, sl] = out

    onnx_exports = {}  # quantization -> ONNX export; with a shortlist: (quantization, True)
    for q in ("float32", "int8"):
        for sl in (False, True):
            if f"onnx{'-int8' if q == 'int8' else ''}{'-sl' if sl else ''}" not in wanted:
                continue
            out = export("onnx", q, sl)
            if isinstance(out, str):
                sys.exit(f"[bench] {prefix}nmtkit export --format onnx failed: {out}")
            onnx_exports[(q, True) if sl else q] = out

    def onnx(q: str, shortlist: bool = False):
        def make(bs, threads, hyp):
            folder = onnx_exports[(q, True) if shortlist else q]
            return ([py, "-m", "nmtkit", "generate", "--path", str(folder), "--input", str(src),
                     "--output", str(hyp), "--threads", str(threads), "--batch-size", str(bs),
                     *(["--shortlist", str(folder / "shortlist.txt")] if shortlist else []),
                     *search, *a.extra.split()], "nmtkit")
        return make

    def ct2(q: str, compute_type: str, vmap: bool = False):
        def make(bs, threads, hyp):
            return ([py, str(HERE / "ct2_translate.py"), "--model", str(exports[q, vmap]), "--data", data,
                     "--src-lang", a.src_lang, "--tgt-lang", a.tgt_lang, "--input", str(src), "--output", str(hyp),
                     "--compute-type", compute_type, "--threads", str(threads), "--batch-size", str(bs),
                     "--beam", str(a.beam), "--lenpen", str(a.lenpen), "--max-len", "256",
                     *(["--use-vmap"] if vmap else [])], "ct2")
        return make

    native_sl = ["--shortlist", a.shortlist]
    onnx_dir = lambda q, sl=False: onnx_exports[(q, True) if sl else q]  # noqa: E731
    catalog = {  # name -> (label, command maker, checkout, the weights on disk)
        "nmtkit": lambda: ("nmtkit fp32", native([]), REPO, ckpt),
        "nmtkit-int8": lambda: ("nmtkit int8", native(["--quantize", "int8"]), REPO, ckpt),
        "ct2": lambda: ("CTranslate2 float32", ct2("float32", "float32"), REPO, exports["float32", False]),
        "ct2-int8": lambda: ("CTranslate2 int8_float32", ct2("int8", "int8_float32"), REPO, exports["int8", False]),
        "baseline": lambda: ("nmtkit fp32 (baseline)", native([]), Path(a.baseline).resolve(), ckpt),
        "onnx": lambda: ("ONNX fp32", onnx("float32"), REPO, onnx_dir("float32")),
        "onnx-int8": lambda: ("ONNX int8", onnx("int8"), REPO, onnx_dir("int8")),
        # with the lexical shortlist --shortlist (docs/generate.md, "Lexical shortlists")
        "nmtkit-sl": lambda: ("nmtkit fp32 + shortlist", native(native_sl), REPO, ckpt),
        "nmtkit-int8-sl": lambda: ("nmtkit int8 + shortlist", native(["--quantize", "int8", *native_sl]), REPO, ckpt),
        "ct2-vmap": lambda: ("CTranslate2 float32 + vmap", ct2("float32", "float32", True), REPO,
                             exports["float32", True]),
        "ct2-int8-vmap": lambda: ("CTranslate2 int8_float32 + vmap", ct2("int8", "int8_float32", True), REPO,
                                  exports["int8", True]),
        "onnx-sl": lambda: ("ONNX fp32 + shortlist", onnx("float32", True), REPO, onnx_dir("float32", True)),
        "onnx-int8-sl": lambda: ("ONNX int8 + shortlist", onnx("int8", True), REPO, onnx_dir("int8", True)),
    }
    systems = []
    for name in wanted:
        label, make, checkout, weights = catalog[name]()
        files = native_files(ckpt, data) if weights == ckpt else [Path(weights)]
        if weights == ckpt and name.endswith("-sl"):
            files.append(Path(a.shortlist))
        systems.append(System(prefix + label, make, checkout, files))
    return systems, onnx_exports, wanted


def time_systems(systems: list[System], cells: list[tuple[int, int]], runs: int, work: Path,
                 refs: list[str]) -> list[dict]:
    """Every system in every (threads, batch size) cell, `runs` times in a rotating order (who goes
    first changes: a shared machine drifts); one row per cell and system with the medians, the
    largest peak RSS, sacreBLEU against `refs` and the lines equal to the first system's."""
    import sacrebleu

    rows = []
    for threads, bs in cells:
        by_label: dict[str, list[dict]] = {s.label: [] for s in systems}
        outputs = {}
        for r in range(runs):
            order = systems[r % len(systems):] + systems[: r % len(systems)]
            for s in order:
                hyp = work / f"hyp.{re.sub(r'[^a-z0-9]+', '_', s.label.lower())}.t{threads}.b{bs}.txt"
                res = s.once(bs, threads, hyp)
                by_label[s.label].append(res)
                outputs[s.label] = hyp.read_text(encoding="utf-8").splitlines()
                print(f"[bench] threads {threads} batch {bs} run {r + 1}/{runs} {s.label}: "
                      f"{res['decode_s']:.1f}s decode, {res['wall_s']:.1f}s process, {res['peak_rss_mib']:.0f} MiB",
                      flush=True)
        first = outputs[systems[0].label]
        for s in systems:
            rs = by_label[s.label]
            med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
            n = rs[0]["sentences"]
            hyps = outputs[s.label]
            rows.append({
                "threads": threads, "batch_size": bs, "system": s.label, "sentences": n,
                "target_tokens": rs[0]["tokens"], "decode_s": med("decode_s"), "process_s": med("wall_s"),
                "decode_sent_s": n / med("decode_s"), "process_sent_s": n / med("wall_s"),
                "peak_rss_mib": max(x["peak_rss_mib"] for x in rs),
                "size_mib": size_mib(s.weights) if s.weights else float("nan"),
                "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score if len(hyps) == len(refs) else float("nan"),
                "same_as_first": sum(x == y for x, y in zip(hyps, first)), "runs": rs,
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="preprocessed Multi30k de-en data dir")
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--src", required=True, help="raw source text (test_2016_flickr.de[.gz])")
    ap.add_argument("--ref", required=True, help="raw reference (test_2016_flickr.en[.gz]) for BLEU")
    ap.add_argument("--work", required=True)
    ap.add_argument("--src-lang", default="de")
    ap.add_argument("--tgt-lang", default="en")
    ap.add_argument("--batch-sizes", default="1,16,128")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cells", default="", help="only these THREADSxBATCH cells, e.g. 1x1,2x128 (default: every pair)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="only the first N sentences (0 = all)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    ap.add_argument("--systems", default="nmtkit,nmtkit-int8,ct2,ct2-int8,onnx,onnx-int8",
                    help="comma-separated: nmtkit, nmtkit-int8, ct2, ct2-int8, onnx, onnx-int8, baseline")
    ap.add_argument("--baseline", default="", help="another nmtkit checkout: its fp32 as system 'baseline'")
    ap.add_argument("--extra", default="", help="more `nmtkit generate` flags, space-separated")
    ap.add_argument("--shortlist", default="", help="a lexical shortlist (nmtkit shortlist) for the *-sl / *-vmap systems")
    ap.add_argument("--export-pythonpath", default=None,
                    help="PYTHONPATH for the `nmtkit export` step only (a checkout that has the command)")
    a = ap.parse_args()
    import sacrebleu  # noqa: F401  (scores the rows; missing, it stops here, before any export)

    # absolute: the runs start in the work folder (see run_timed)
    a.data, a.ckpt = str(Path(a.data).resolve()), str(Path(a.ckpt).resolve())
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    src_lines = read_lines(Path(a.src))
    refs = read_lines(Path(a.ref))
    if a.limit:
        src_lines, refs = src_lines[: a.limit], refs[: a.limit]
    src = work / "src.txt"
    src.write_text("".join(line + "\n" for line in src_lines), encoding="utf-8")
    py = sys.executable
    wanted = [s for s in a.systems.split(",") if s]
    if "baseline" in wanted and not a.baseline:
        sys.exit("[bench] system 'baseline' needs --baseline DIR (another nmtkit checkout)")

    search = search_flags(a.beam, a.lenpen)

    if any(s.endswith(("-sl", "-vmap")) for s in wanted) and not a.shortlist:
        sys.exit("[bench] the *-sl and *-vmap systems need --shortlist FILE (nmtkit shortlist DATA_DIR)")
    a.shortlist = str(Path(a.shortlist).resolve()) if a.shortlist else ""
    systems, onnx_exports, wanted = make_systems(a, wanted, work, src, search, a.ckpt, a.data)
    print(f"[bench] load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)

    cells = [(threads, bs) for threads in [int(x) for x in a.threads.split(",")]
             for bs in [int(x) for x in a.batch_sizes.split(",")]
             if not a.cells or f"{threads}x{bs}" in a.cells.split(",")]
    rows = time_systems(systems, cells, a.runs, work, refs)

    startup = []
    starts = {"nmtkit fp32": [a.data, "--path", a.ckpt], "nmtkit fp32 (baseline)": [a.data, "--path", a.ckpt],
              **{f"ONNX {'fp32' if q == 'float32' else q}": ["--path", str(d)] for q, d in onnx_exports.items()
                 if isinstance(q, str)}}
    for s in [s for s in systems if s.label in starts]:
        cmd = [py, "-m", "nmtkit", "generate", *starts[s.label], "--input", "-"]
        walls = []
        for _ in range(max(a.runs, 3)):
            with open(os.devnull) as devnull:
                walls.append(run_timed(cmd, s.env(), work, stdin=devnull)[0])
        startup.append((s.label, statistics.median(walls)))
    load_end = os.getloadavg()

    print()
    print(f"Multi30k test_2016_flickr de->en ({len(src_lines)} sentences), beam {a.beam}, lenpen {a.lenpen} "
          f"(|Y|^alpha), fairseq stopping, CPU; median of {a.runs} run(s), systems alternating")
    print("| threads | batch | system | sent/s decode | sent/s process | peak RSS MiB | BLEU | lines = first |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['threads']} | {r['batch_size']} | {r['system']} | {r['decode_sent_s']:.1f} | "
              f"{r['process_sent_s']:.1f} | {r['peak_rss_mib']:.0f} | {r['bleu']:.2f} | {r['same_as_first']} |")
    by = {(r["threads"], r["batch_size"], r["system"]): r for r in rows}
    labels = [s.label for s in systems]
    pairs = [(x, y) for x, y in (("nmtkit fp32", "CTranslate2 float32"), ("nmtkit int8", "CTranslate2 int8_float32"),
                                 ("nmtkit fp32", "nmtkit fp32 (baseline)"), ("ONNX fp32", "CTranslate2 float32"),
                                 ("ONNX int8", "CTranslate2 int8_float32"), ("ONNX int8", "CTranslate2 float32"),
                                 *SHORTLIST_PAIRS)
             if x in labels and y in labels]
    if pairs:
        print()
        print("| threads | batch | " + " | ".join(f"{x} / {y}" for x, y in pairs) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in pairs) + " |")
        for threads, bs in sorted({(r["threads"], r["batch_size"]) for r in rows}):
            cells = []
            for x, y in pairs:
                rx, ry = by[(threads, bs, x)], by[(threads, bs, y)]
                cells.append(f"{rx['decode_sent_s'] / ry['decode_sent_s']:.2f}x speed, "
                             f"{rx['peak_rss_mib'] / ry['peak_rss_mib']:.2f}x RSS")
            print(f"| {threads} | {bs} | " + " | ".join(cells) + " |")
    for label, wall in startup:
        what = "--path ONNX_DIR" if label.startswith("ONNX") else "DATA --path CKPT"
        print(f"start-up, empty input (`printf '' | nmtkit generate {what} --input -`), {label}: {wall:.2f} s")
    ct2_loads = [(r["system"], statistics.median(x["wall_s"] - x["decode_s"] for x in r["runs"]))
                 for r in rows if r["system"].startswith("CTranslate2") and r["batch_size"] == max(x["batch_size"] for x in rows)]
    for label, s in ct2_loads[:2]:
        print(f"{label}: process time outside translate_batch (start-up, load, I/O): {s:.2f} s")
    print(f"load average at start and end: see above; at end {' '.join(f'{x:.1f}' for x in load_end)}")
    lines = targets(rows, startup)
    if any(label.startswith("ONNX") for label in labels):
        lines += onnx_targets(rows, startup)
        for line in differing_lines(rows, work, a, onnx_exports):
            print(line)
    if lines:
        print()
        print("Speed targets (docs/generate.md), in this sitting:")
        for line in lines:
            print("- " + line)
    result = {"data": a.data, "ckpt": a.ckpt, "beam": a.beam, "lenpen": a.lenpen, "rows": rows,
              "startup": startup, "loadavg_end": load_end}
    (work / "results.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
