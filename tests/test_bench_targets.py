"""recipes/bench/generate_bench.py's summary of the issue's speed targets (docs/generate.md, Speed):
figures computed from the benchmark's rows by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "recipes" / "bench" / "generate_bench.py"


def _bench():
    spec = importlib.util.spec_from_file_location("generate_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(threads, bs, system, sent_s, rss, bleu):
    return {"threads": threads, "batch_size": bs, "system": system, "decode_sent_s": sent_s,
            "peak_rss_mib": rss, "bleu": bleu}


ROWS = [
    _row(1, 1, "nmtkit fp32", 44.0, 363, 25.66), _row(1, 1, "nmtkit int8", 60.5, 298, 25.50),
    _row(1, 1, "CTranslate2 float32", 88.0, 81, 25.66), _row(1, 1, "CTranslate2 int8_float32", 240.0, 64, 25.54),
    _row(1, 128, "nmtkit fp32", 185.0, 581, 25.66), _row(1, 128, "nmtkit int8", 277.0, 498, 25.60),
    _row(1, 128, "CTranslate2 float32", 218.0, 200, 25.66), _row(1, 128, "CTranslate2 int8_float32", 315.0, 224, 25.55),
    _row(2, 128, "nmtkit fp32", 300.0, 600, 25.66), _row(2, 128, "nmtkit int8", 290.0, 515, 25.53),
    _row(2, 128, "CTranslate2 float32", 352.0, 200, 25.66), _row(2, 128, "CTranslate2 int8_float32", 250.0, 226, 25.55),
]


def test_every_target_with_its_figure():
    lines = _bench().targets(ROWS, [("nmtkit fp32", 1.37), ("nmtkit fp32 (baseline)", 0.5)])
    assert lines == [
        # the faster of fp32 (300) and int8 (290) against CTranslate2 int8 (250)
        "batch 128, 2 threads: best nmtkit (nmtkit fp32) / CTranslate2 int8_float32 = 1.20x (target >= 1.0x: met)",
        "batch 1, 1 thread: nmtkit fp32 / CTranslate2 float32 = 0.50x; best nmtkit (nmtkit int8) 0.69x "
        "(target >= 1.0x: NOT met)",
        "start-up on an empty input: 1.37 s (target <= 1.0 s: NOT met)",
        # 600 / 200 at 2 threads is worse than 581 / 200 at 1
        "peak RSS at batch 128: nmtkit fp32 / CTranslate2 float32 = 3.00x (2 thread(s), the worst; "
        "target <= 1.5x: NOT met)",
        # 25.66 - 25.50 at batch 1 is the largest of 0.16, 0.06, 0.13
        "BLEU of --quantize int8: at most 0.16 below fp32 (target <= 0.3: met)",
    ]


def test_targets_without_their_rows_are_left_out():
    rows = [r for r in ROWS if r["batch_size"] == 1 and "int8" not in r["system"]]
    assert _bench().targets(rows, []) == [
        "batch 1, 1 thread: nmtkit fp32 / CTranslate2 float32 = 0.50x (target >= 1.0x: NOT met)"]
    assert _bench().targets([], []) == []


def test_a_target_at_its_bound_is_met():
    rows = [_row(2, 128, "nmtkit int8", 300.0, 300, 25.3), _row(2, 128, "CTranslate2 int8_float32", 300.0, 226, 25.5),
            _row(2, 128, "nmtkit fp32", 10.0, 300, 25.6), _row(2, 128, "CTranslate2 float32", 352.0, 200, 25.6)]
    lines = _bench().targets(rows, [("nmtkit fp32", 1.0)])
    assert lines[0].endswith("= 1.00x (target >= 1.0x: met)")
    assert lines[1] == "start-up on an empty input: 1.00 s (target <= 1.0 s: met)"
    assert lines[2].startswith("peak RSS at batch 128: nmtkit fp32 / CTranslate2 float32 = 1.50x") and lines[2].endswith(": met)")
    assert lines[3] == "BLEU of --quantize int8: at most 0.30 below fp32 (target <= 0.3: met)"


def test_a_missing_bleu_is_left_out():
    rows = [_row(1, 1, "nmtkit fp32", 44.0, 363, float("nan")), _row(1, 1, "nmtkit int8", 60.0, 298, 25.5)]
    assert not any(line.startswith("BLEU") for line in _bench().targets(rows, []))


def test_the_decode_time_comes_from_the_unrounded_rate():
    line = ("translated 1,000 sentences (12,345 target tokens) in 5.2s: 192.3 sentences/s, 2,374 tokens/s; "
            "search only 3.6s: 1,277.8 sentences/s, 3,429 tokens/s")
    m = _bench().SUMMARY.search(line)
    assert m.groups() == ("1,000", "12,345", "1,277.8")
