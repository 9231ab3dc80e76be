"""recipes/bench/generate_bench.py's summary of the speed targets (docs/generate.md, Speed):
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


# recipes/bench/deploy_bench.py: the deployment table and its targets (docs/archs.md, Deployment)

DEPLOY = BENCH.parent / "deploy_bench.py"


def _deploy():
    spec = importlib.util.spec_from_file_location("deploy_bench", DEPLOY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _drow(model, threads, bs, route, sent_s, bleu, rss=100.0, size=10.0):
    return {"model": model, "threads": threads, "batch_size": bs, "route": route, "decode_sent_s": sent_s,
            "bleu": bleu, "peak_rss_mib": rss, "size_mib": size}


DEPLOY_ROWS = [
    _drow("teacher", 1, 1, "nmtkit int8", 20.0, 35.30), _drow("teacher", 1, 1, "ONNX int8", 30.0, 35.26),
    _drow("teacher", 2, 128, "nmtkit int8", 200.0, 35.30), _drow("teacher", 2, 128, "ONNX int8", 150.0, 35.26),
    _drow("teacher", 2, 128, "CTranslate2 int8_float32", 160.0, 35.10),
    _drow("teacher", 2, 128, "CTranslate2 int8_float32 + vmap", 210.0, 35.00),
    _drow("teacher", 2, 128, "ONNX int8 + shortlist", 195.0, 35.16),
    _drow("student", 1, 1, "nmtkit int8", 95.0, 34.40), _drow("student", 1, 1, "ONNX int8", 90.0, 34.50, rss=80.0),
    _drow("student", 2, 128, "nmtkit int8", 640.0, 34.20, rss=300.0),
    _drow("student", 2, 128, "nmtkit int8 + shortlist", 830.0, 34.00, rss=310.0, size=10.5),
]


def test_every_deployment_target_with_its_figure():
    assert _deploy().deploy_targets(DEPLOY_ROWS, ["teacher", "student"]) == [
        # the fastest int8 route of each model per cell: 95 / 30 and 640 / 200
        "student / teacher, batch 1 (1 thread(s)), the fastest int8 route of each (nmtkit int8, ONNX int8): "
        "3.167x (target >= 3x: met)",
        "student / teacher, batch 128 (2 thread(s)), the fastest int8 route of each (nmtkit int8, nmtkit int8): "
        "3.200x (target >= 3x: met)",
        # those routes at the largest batch: 34.20 - 35.30
        "BLEU of student (nmtkit int8) 34.20 against teacher's (nmtkit int8) 35.30: -1.10 (target >= -1.0: NOT met)",
        # 195 / 150, 35.16 - 35.26; 210 / 160, 35.00 - 35.10
        "teacher, batch 128 (2 thread(s)): CTranslate2 int8_float32 + vmap / CTranslate2 int8_float32 = 1.312x "
        "(target >= 1.3x: met), BLEU -0.10 (target >= -0.2: met)",
        "teacher, batch 128 (2 thread(s)): ONNX int8 + shortlist / ONNX int8 = 1.300x (target >= 1.3x: met), "
        "BLEU -0.10 (target >= -0.2: met)",
        "teacher, batch 128 (2 threads): ONNX int8 / CTranslate2 int8_float32 = 0.938x (target >= 1.0x: NOT met)",
        "teacher, batch 128 (2 threads): the fastest nmtkit route with the shortlist (ONNX int8 + shortlist) / "
        "CTranslate2 int8_float32 + vmap = 0.929x (target >= 1.0x: NOT met)",
        # 830 / 640 = 1.297: just under; 34.00 - 34.20 = -0.20: at the bound
        "student, batch 128 (2 thread(s)): nmtkit int8 + shortlist / nmtkit int8 = 1.297x (target >= 1.3x: NOT met), "
        "BLEU -0.20 (target >= -0.2: met)",
    ]


def test_deployment_targets_without_their_rows_are_left_out():
    teacher_only = [r for r in DEPLOY_ROWS if r["model"] == "teacher" and "CTranslate2" not in r["route"]]
    assert _deploy().deploy_targets(teacher_only, ["teacher"]) == [
        "teacher, batch 128 (2 thread(s)): ONNX int8 + shortlist / ONNX int8 = 1.300x (target >= 1.3x: met), "
        "BLEU -0.10 (target >= -0.2: met)"]
    assert _deploy().deploy_targets([], ["teacher", "student"]) == []


def test_a_student_is_compared_on_the_routes_both_models_ran_and_a_missing_bleu_is_said():
    # the teacher has no CTranslate2 row (its export failed): the student's faster CTranslate2 is not used
    rows = [_drow("teacher", 1, 1, "nmtkit int8", 100.0, 35.0), _drow("student", 1, 1, "nmtkit int8", 200.0, float("nan")),
            _drow("student", 1, 1, "CTranslate2 int8_float32", 320.0, 34.5),
            _drow("student", 1, 1, "nmtkit int8 + shortlist", 210.0, 34.4)]
    assert _deploy().deploy_targets(rows, ["teacher", "student"]) == [
        "student / teacher, batch 1 (1 thread(s)), the fastest int8 route of each (nmtkit int8, nmtkit int8): "
        "2.000x (target >= 3x: NOT met)",
        "BLEU of student (nmtkit int8) nan against teacher's (nmtkit int8) 35.00: no BLEU (missing lines)",
        "student, batch 1 (1 thread(s)): nmtkit int8 + shortlist / nmtkit int8 = 1.050x (target >= 1.3x: NOT met), "
        "BLEU unknown (missing lines)"]


def test_the_deployment_table_has_a_row_per_model_and_route():
    lines = _deploy().table(DEPLOY_ROWS, ["teacher", "student"])
    assert lines[0] == "| model | route | BLEU | sent/s batch 1 (1 thr.) | sent/s batch 128 (2 thr.) | peak RSS MiB | size MiB |"
    # a route run in one cell only leaves the other empty; RSS is the largest of the cells
    assert "| student | nmtkit int8 | 34.20 | 95.0 | 640.0 | 300 | 10.0 |" in lines
    assert "| student | ONNX int8 | 34.50 | 90.0 |  | 80 | 10.0 |" in lines
    assert "| student | nmtkit int8 + shortlist | 34.00 |  | 830.0 | 310 | 10.5 |" in lines
    assert len(lines) == 2 + len({(r["model"], r["route"]) for r in DEPLOY_ROWS})


def test_the_size_of_nmtkit_route_is_the_checkpoint_with_what_it_loads_from_the_data_directory(tmp_path):
    import json

    bench = _bench()
    data = tmp_path / "data"
    data.mkdir()
    manifest = {"source_lang": "de", "target_lang": "en",
                "dictionaries": {"de": {"file": "dict.de.txt"}, "en": {"file": "dict.en.txt"}},
                "subword": {"files": {"de": "spm.model", "en": "spm.model"}}}
    (data / "manifest.json").write_text(json.dumps(manifest))
    for name, size in (("dict.de.txt", 100), ("dict.en.txt", 200), ("spm.model", 2000), ("train.de.000.bin", 10**6),
                       ("train.de.000.idx", 1000), (".nmtkit-verified.json", 30), ("shortlist.txt", 5000)):
        (data / name).write_bytes(b"x" * size)
    ckpt = tmp_path / "m.pt"
    ckpt.write_bytes(b"x" * 2**20)
    files = bench.native_files(str(ckpt), str(data))
    # what an export copies: no shards, no shortlist that happens to lie there, the joint model once
    assert [f.name for f in files] == ["m.pt", "manifest.json", "dict.de.txt", "spm.model", "dict.en.txt"]
    assert bench.size_mib(files) == (2**20 + len(json.dumps(manifest)) + 2300) / 2**20
    export = tmp_path / "export"
    (export / "sub").mkdir(parents=True)
    (export / "model.bin").write_bytes(b"x" * 3000)
    (export / "sub" / "a").write_bytes(b"x" * 1000)
    assert bench.size_mib([export]) == 4000 / 2**20
