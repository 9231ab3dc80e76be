"""recipes/bench/gpu.sh, the one-sitting GPU benchmark, kept runnable: its `--device cpu --tiny` mode
runs every stage (environment and GEMM rate, tests/test_cuda.py, the training step eager and
compiled, the quickstart pipeline for a few seconds, the time to a BLEU target, generate's speed) on
transformer_tiny, and the JSON must hold each stage with its numbers; a stage's time limit stops it and is recorded, and
pytest's counts are read from its summary line. Subprocesses in temporary folders, one CPU thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, shared_file

pytestmark = pytest.mark.slow

STAGES = ("env", "train_step", "quickstart", "time_to_bleu", "generate_speed", "cuda_tests")


def _run(tmp_path: Path, *args: str, data: Path | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """gpu.sh --device cpu --tiny ARGS with this interpreter, one thread, private folders -> (process, JSON)."""
    env = dict(os.environ)
    env.update(GPU_BENCH_PYTHON=sys.executable, OMP_NUM_THREADS="1", GPU_BENCH_WORK=str(tmp_path / "work"))
    # the bench's own pytest runs the files given here in their order (a fake test file's passing
    # test before its hanging one), whatever order plugin the suite runs with
    env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " -p no:randomly").strip()
    if data is not None:
        env["NMTKIT_DATA"] = str(data)
    env.pop("OUT", None)
    env.pop("GPU_BENCH_OUT", None)
    out = tmp_path / "out"
    r = subprocess.run(["bash", "recipes/bench/gpu.sh", "--device", "cpu", "--tiny", "--out", str(out), *args],
                       check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    path = out / "gpu_bench.json"
    assert path.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads(path.read_text("utf-8"))


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


def test_tiny_mode_runs_every_stage_with_numbers(tmp_path):
    data = shared_file("multi30k", "train.de.gz").parent
    r, res = _run(tmp_path, data=data)
    assert r.returncode == 0, r.stdout[-4000:]
    st = res["stages"]
    assert set(STAGES) <= set(st), st.keys()
    for name in STAGES:
        assert _positive(st[name]["stage_wall_s"]) or name == "cuda_tests", (name, st[name])

    env = st["env"]
    assert env["status"] == "ok" and env["device"] == "cpu" and env["torch"], env
    assert env["gemm"]["dtype"] == "fp32" and _positive(env["gemm"]["tflops"]), env  # a CPU: not judged by bf16

    ct = st["cuda_tests"]
    assert ct["status"] in ("absent", "ok"), ct
    if ct["status"] == "ok":  # tests/test_cuda.py skips everything on a CPU machine
        assert all(isinstance(ct[k], int) for k in ("passed", "failed", "skipped", "errors")), ct
        assert ct["failed"] == 0 and ct["errors"] == 0, ct

    ts = st["train_step"]
    assert ts["status"] == "ok", ts
    kinds = {(run["arch"], run["compile"]) for run in ts["runs"]}
    assert kinds == {("transformer_tiny", False), ("transformer_tiny", True)}, kinds
    for run in ts["runs"]:
        assert run["status"] == "ok", run
        assert run["largest_fitting_max_tokens"] == 1024 and run["search_complete"], run
        for k in ("tgt_tok_per_s", "ms_per_step", "tflops", "mfu_measured"):
            assert _positive(run[k]), (k, run)
        assert [s["status"] for s in run["sizes"]] == ["ok", "ok"], run["sizes"]

    qs = st["quickstart"]
    assert qs["status"] == "ok", qs
    for step in ("data", "preprocess", "train", "average", "generate", "score"):
        assert qs["steps"][step]["status"] == "ok", (step, qs["steps"][step])
        assert _positive(qs["wall_s"][step]), (step, qs["wall_s"])
    train = qs["steps"]["train"]
    assert train["end_reason"] == "max_time" and train["updates"] > 0, train
    assert _positive(train["tgt_tok_per_s_mean"]) and train["checkpoint_saves"] >= 2, train
    assert qs["steps"]["average"]["checkpoints"] >= 2, qs["steps"]["average"]
    assert isinstance(qs["bleu"], float) and 0 <= qs["bleu"] <= 100, qs
    assert qs["steps"]["score"]["score_line"].startswith("BLEU = "), qs["steps"]["score"]

    tb = st["time_to_bleu"]  # a token target for transformer_tiny: reached or not, every step ran
    assert tb["status"] in ("ok", "not_reached") and tb["target_bleu"] == 0.1, tb
    assert tb["reached"] == (tb["status"] == "ok") == (tb["steps"]["train"]["end_reason"] == "target_bleu"), tb
    assert tb["valid_bleu"] and all(isinstance(b, float) for _, b in tb["valid_bleu"]), tb
    if tb["reached"]:  # stopped by the first validation at or above the target
        assert tb["valid_bleu"][-1][1] >= 0.1 > max([b for _, b in tb["valid_bleu"][:-1]] + [0.0]), tb
        assert _positive(tb["seconds_to_target"]) and tb["update_at_target"] == tb["valid_bleu"][-1][0], tb
    assert isinstance(tb["test_bleu_fairseq_decoding"], float), tb
    assert tb["steps"]["generate"]["status"] == tb["steps"]["score"]["status"] == "ok", tb

    gs = st["generate_speed"]
    assert gs["status"] == "ok", gs
    assert [run["precision"] for run in gs["runs"]] == ["fp32", "bf16"], gs
    for run in gs["runs"]:
        assert run["batch_size"] == 128 and run["sentences"] == gs["input_sentences"] == 100, run
        assert _positive(run["sentences_per_s"]) and _positive(run["search_sentences_per_s"]), run

    summary = res["summary"]
    assert summary["stage_status"]["quickstart"] == "ok" and _positive(summary["gemm_tflops"]), summary
    out = tmp_path / "out"
    for name in ("gpu_bench.log", "train_log.jsonl", "test.hyp.en"):
        assert (out / name).stat().st_size > 0, name
    assert "===== train: " in (out / "gpu_bench.log").read_text("utf-8")


def test_pytest_counts_and_failures_are_recorded(tmp_path):
    fake = tmp_path / "test_fake_cuda.py"
    fake.write_text(textwrap.dedent("""
        import pytest

        def test_passes():
            pass

        def test_fails():
            assert 1 == 2

        @pytest.mark.skip(reason="no GPU")
        def test_skipped():
            pass
    """))
    r, res = _run(tmp_path, "--skip", "env,train_step,quickstart,time_to_bleu,generate_speed", "--cuda-tests", str(fake))
    ct = res["stages"]["cuda_tests"]
    assert ct["status"] == "failed" and r.returncode == 1, ct
    assert (ct["passed"], ct["failed"], ct["skipped"], ct["errors"]) == (1, 1, 1, 0), ct
    assert any("test_fails" in f for f in ct["failures"]), ct
    assert res["stages"]["env"] == {"status": "skipped", "reason": "--skip"}


def test_a_stage_over_its_time_limit_is_stopped_and_recorded(tmp_path):
    fake = tmp_path / "test_hangs.py"
    fake.write_text("import time\n\ndef test_passes():\n    pass\n\ndef test_hangs():\n    time.sleep(300)\n")
    r, res = _run(tmp_path, "--skip", "env,train_step,quickstart,time_to_bleu,generate_speed", "--cuda-tests", str(fake),
                  "--budget", "12")
    ct = res["stages"]["cuda_tests"]
    assert ct["status"] == "timeout" and r.returncode == 1, ct
    assert ct["time_limit_s"] <= 12 and ct["stage_wall_s"] < 40, ct
    # the tests that finished before the limit are counted from pytest's -v lines
    assert (ct["passed"], ct["failed"]) == (1, 0) and "test_hangs" in ct["running_when_stopped"], ct
