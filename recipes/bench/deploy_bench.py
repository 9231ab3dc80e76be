"""The deployment table: a teacher and its students, each through every engine, in one sitting.

Each model is a checkpoint with its data directory. Its CTranslate2 and ONNX exports are made from it
(fp32 and int8, and with the lexical shortlist: CTranslate2's vmap, ONNX's restricted output layer),
by recipes/bench/generate_bench.py's systems. Every system of every model runs in each cell (by
default batch 1 on 1 thread, the way Bergamot's students are measured, and batch 128 on 2 threads), in
a rotating order, RUNS times. Printed:
- one row per model and route: sacreBLEU (largest batch), the search's sentences/s per cell, the
  peak RSS of the process (largest over the cells) and the size on disk of what the route loads (the
  checkpoint with its data directory's subword model and dictionaries, or the export directory);
- the deployment targets, each with its figure and whether it is met (docs/archs.md, "Deployment").
Called by recipes/bench/deploy.sh, which documents the settings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate_bench as gb  # noqa: E402

ROUTES = ("nmtkit", "nmtkit-sl", "nmtkit-int8", "nmtkit-int8-sl", "ct2", "ct2-vmap", "ct2-int8", "ct2-int8-vmap",
          "onnx", "onnx-sl", "onnx-int8", "onnx-int8-sl")
INT8 = ("nmtkit int8", "CTranslate2 int8_float32", "ONNX int8")
# each route with the shortlist, after the same route without it
WITH_SHORTLIST = {"nmtkit fp32": "nmtkit fp32 + shortlist", "nmtkit int8": "nmtkit int8 + shortlist",
                  "CTranslate2 float32": "CTranslate2 float32 + vmap",
                  "CTranslate2 int8_float32": "CTranslate2 int8_float32 + vmap",
                  "ONNX fp32": "ONNX fp32 + shortlist", "ONNX int8": "ONNX int8 + shortlist"}
NMTKIT_SHORTLIST = ("nmtkit fp32 + shortlist", "nmtkit int8 + shortlist", "ONNX fp32 + shortlist",
                    "ONNX int8 + shortlist")


def _ok(met: bool) -> str:
    return "met" if met else "NOT met"


def deploy_targets(rows: list[dict], models: list[str]) -> list[str]:
    """The deployment targets, one line each with its figure; `models[0]` is the teacher, the rest
    its students. Rows carry "model", "route", "threads", "batch_size", "decode_sent_s", "bleu". A
    target whose rows were not run is left out."""
    by = {(r["model"], r["threads"], r["batch_size"], r["route"]): r for r in rows}
    cells = sorted({(r["threads"], r["batch_size"]) for r in rows}, key=lambda c: (c[1], c[0]))
    out = []

    def fastest(model: str, cell: tuple[int, int], routes) -> dict | None:
        cands = [by[(model, *cell, x)] for x in routes if (model, *cell, x) in by]
        return max(cands, key=lambda r: r["decode_sent_s"]) if cands else None

    def bleu_diff(a: dict, b: dict) -> float | None:
        """a's BLEU minus b's, as printed (two decimals); None when one has no BLEU (missing lines)."""
        if math.isnan(a["bleu"]) or math.isnan(b["bleu"]):
            return None
        return round(a["bleu"], 2) - round(b["bleu"], 2)

    teacher = models[0]
    for student in models[1:]:
        for cell in cells:
            # among the int8 routes both models ran (an export that failed for one is not compared)
            both = [x for x in INT8 if (student, *cell, x) in by and (teacher, *cell, x) in by]
            s, t = fastest(student, cell, both), fastest(teacher, cell, both)
            if s and t:
                x = s["decode_sent_s"] / t["decode_sent_s"]
                out.append(f"{student} / {teacher}, batch {cell[1]} ({cell[0]} thread(s)), the fastest int8 route of "
                           f"each ({s['route']}, {t['route']}): {x:.3f}x (target >= 3x: {_ok(x >= 3)})")
            if cell == cells[-1] and s and t:
                d = bleu_diff(s, t)
                out.append(f"BLEU of {student} ({s['route']}) {s['bleu']:.2f} against {teacher}'s ({t['route']}) "
                           f"{t['bleu']:.2f}: " + ("no BLEU (missing lines)" if d is None else
                                                   f"{d:+.2f} (target >= -1.0: {_ok(d >= -1.0 - 1e-9)})"))
    if not cells:
        return out
    big = cells[-1]
    for model in models:
        for plain, sl in WITH_SHORTLIST.items():
            p, q = by.get((model, *big, plain)), by.get((model, *big, sl))
            if p and q:
                x, d = q["decode_sent_s"] / p["decode_sent_s"], bleu_diff(q, p)
                out.append(f"{model}, batch {big[1]} ({big[0]} thread(s)): {sl} / {plain} = {x:.3f}x (target >= 1.3x: "
                           f"{_ok(x >= 1.3)}), BLEU " + ("unknown (missing lines)" if d is None else
                                                         f"{d:+.2f} (target >= -0.2: {_ok(d >= -0.2 - 1e-9)})"))
        o, c = by.get((model, 2, 128, "ONNX int8")), by.get((model, 2, 128, "CTranslate2 int8_float32"))
        if o and c:
            x = o["decode_sent_s"] / c["decode_sent_s"]
            out.append(f"{model}, batch 128 (2 threads): ONNX int8 / CTranslate2 int8_float32 = {x:.3f}x "
                       f"(target >= 1.0x: {_ok(x >= 1.0)})")
        b, c = fastest(model, (2, 128), NMTKIT_SHORTLIST), by.get((model, 2, 128, "CTranslate2 int8_float32 + vmap"))
        if b and c:
            x = b["decode_sent_s"] / c["decode_sent_s"]
            out.append(f"{model}, batch 128 (2 threads): the fastest nmtkit route with the shortlist ({b['route']}) / "
                       f"CTranslate2 int8_float32 + vmap = {x:.3f}x (target >= 1.0x: {_ok(x >= 1.0)})")
    return out


def table(rows: list[dict], models: list[str]) -> list[str]:
    """The deployment table in markdown: one row per model and route."""
    cells = sorted({(r["threads"], r["batch_size"]) for r in rows}, key=lambda c: (c[1], c[0]))
    by = {(r["model"], r["threads"], r["batch_size"], r["route"]): r for r in rows}
    routes = list(dict.fromkeys(r["route"] for r in rows))
    head = ["model", "route", "BLEU"] + [f"sent/s batch {b} ({t} thr.)" for t, b in cells] + [
        "peak RSS MiB", "size MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for model in models:
        for route in routes:
            rs = [by.get((model, *c, route)) for c in cells]
            if not any(rs):
                continue
            last = [r for r in rs if r][-1]
            lines.append("| " + " | ".join([model, route, f"{last['bleu']:.2f}"]
                                           + [f"{r['decode_sent_s']:.1f}" if r else "" for r in rs]
                                           + [f"{max(r['peak_rss_mib'] for r in rs if r):.0f}", f"{last['size_mib']:.1f}"])
                         + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", nargs=3, action="append", metavar=("NAME", "CKPT", "DATA"), required=True,
                    help="a model: its name in the table, checkpoint and data directory; the first is the teacher")
    ap.add_argument("--src", required=True, help="raw source text (test_2016_flickr.de[.gz])")
    ap.add_argument("--ref", required=True, help="raw reference for sacreBLEU")
    ap.add_argument("--work", required=True)
    ap.add_argument("--shortlist", default="", help="a lexical shortlist for every model (nmtkit shortlist)")
    ap.add_argument("--src-lang", default="de")
    ap.add_argument("--tgt-lang", default="en")
    ap.add_argument("--cells", default="1x1,2x128", help="THREADSxBATCH cells")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="only the first N sentences (0 = all)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    ap.add_argument("--systems", default=",".join(ROUTES), help="routes (default: all; those with -sl or -vmap "
                    "need --shortlist)")
    ap.add_argument("--extra", default="", help="more `nmtkit generate` flags, space-separated")
    a = ap.parse_args()
    a.baseline, a.export_pythonpath = "", None  # what generate_bench's systems read besides these

    names = [m[0] for m in a.model]
    # a name is a folder of the work directory and part of file names: plain, and distinct in any case
    if any(not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", n) for n in names) or \
            len({n.lower() for n in names}) != len(names):
        sys.exit(f"[bench] --model names: letters, digits, '_', '-', '.' (not first), distinct in any case; got {names}")
    wanted = [s for s in a.systems.split(",") if s]
    if unknown := [s for s in wanted if s not in ROUTES]:
        sys.exit(f"[bench] unknown system(s) {unknown}: choose from {','.join(ROUTES)}")
    if any(s.endswith(("-sl", "-vmap")) for s in wanted) and not a.shortlist:
        sys.exit("[bench] the *-sl and *-vmap systems need --shortlist FILE (nmtkit shortlist DATA_DIR)")
    try:
        cells = [(int(t), int(b)) for t, b in (c.split("x") for c in a.cells.split(","))]
    except ValueError:
        sys.exit(f"[bench] --cells: THREADSxBATCH,..., e.g. 1x1,2x128; got {a.cells!r}")
    # what is missing, said before hours of exports and runs
    for name, ckpt, data in a.model:
        if not Path(ckpt).is_file():
            sys.exit(f"[bench] --model {name}: no checkpoint {ckpt}")
        if not (Path(data) / "manifest.json").is_file():
            sys.exit(f"[bench] --model {name}: {data} is not a data directory (no manifest.json)")
    for flag, path in (("--src", a.src), ("--ref", a.ref), ("--shortlist", a.shortlist)):
        if path and not Path(path).is_file():
            sys.exit(f"[bench] {flag}: no file {path}")
    a.shortlist = str(Path(a.shortlist).resolve()) if a.shortlist else ""
    src_lines, refs = gb.read_lines(Path(a.src)), gb.read_lines(Path(a.ref))
    if a.limit:
        src_lines, refs = src_lines[: a.limit], refs[: a.limit]
    if not src_lines or len(src_lines) != len(refs):
        sys.exit(f"[bench] --src has {len(src_lines)} lines and --ref {len(refs)}: they must be as many, and some")
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src.txt"
    src.write_text("".join(line + "\n" for line in src_lines), encoding="utf-8")
    search = gb.search_flags(a.beam, a.lenpen)

    systems, owner = [], {}
    for name, ckpt, data in a.model:
        (work / name).mkdir(exist_ok=True)
        mine, _, _ = gb.make_systems(a, wanted, work / name, src, search, str(Path(ckpt).resolve()),
                                     str(Path(data).resolve()), prefix=f"{name}: ")
        for s in mine:
            owner[s.label] = (name, s.label[len(name) + 2:])
        systems += mine
    print(f"[bench] load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    rows = gb.time_systems(systems, cells, a.runs, work, refs)
    for r in rows:
        r["model"], r["route"] = owner[r["system"]]

    print()
    print(f"Multi30k test_2016_flickr de->en ({len(src_lines)} sentences), beam {a.beam}, lenpen {a.lenpen} "
          f"(|Y|^alpha), fairseq stopping, CPU; median of {a.runs} run(s), systems alternating; BLEU of the "
          f"largest batch; size: the checkpoint with its subword model and dictionaries, or the export directory")
    for line in table(rows, names):
        print(line)
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    lines = deploy_targets(rows, names)
    if lines:
        print()
        print("Deployment targets (docs/archs.md, \"Deployment\"), in this sitting:")
        for line in lines:
            print("- " + line)
    (work / "results.json").write_text(json.dumps({"models": a.model, "rows": rows}, indent=2) + "\n",
                                       encoding="utf-8")
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
