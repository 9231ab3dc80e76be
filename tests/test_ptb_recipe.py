"""recipes/ptb/run.sh end to end: `SMOKE=1` runs every stage (preprocess, train, average, generate,
score) on the NLTK treebank sample in ../shared/data/ptb with transformer_tiny on CPU, prints the
parseval line next to the paper's F1, and a second run finds every stage up to date. Settings are
checked before anything is written. Run as subprocesses in a temporary work directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED, shared_file

pytestmark = pytest.mark.slow

F1_LINE = re.compile(
    r"^Parseval F1 = \d+\.\d\d .*\| sentences: 118 valid, 0 error, 0 skipped \| lines: 118 "
    r"\| paper: 91\.3 \(Table 4, WSJ only\)$", re.M)


def _env(work: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = sys.prefix  # recipes/lib/env.sh uses the active environment as it is
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NMTKIT_SHARED"] = str(SHARED)
    env["WORK"] = str(work)
    env["OMP_NUM_THREADS"] = "1"
    for k in ("STAGE", "LAST_STAGE", "SMOKE", "SAMPLE", "PTB_DIR", "SILVER", "DEVICE", "BPE"):
        env.pop(k, None)
    env.update(extra)
    return env


def _run(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "recipes/ptb/run.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def test_ptb_smoke_runs_every_stage_then_is_up_to_date(tmp_path):
    shared_file("ptb", "treebank.zip")
    work = tmp_path / "ptb"
    env = _env(work, SMOKE="1")
    r = _run(env)
    assert r.returncode == 0, r.stderr[-3000:]
    for stage in ("preprocess", "train", "average", "generate", "score"):
        assert f"[ptb] {stage}: done" in r.stderr, (stage, r.stderr[-3000:])
    m = F1_LINE.search(r.stdout)
    assert m, r.stdout
    # what the score is about: one tree per test sentence, of the 2 averaged checkpoints
    hyp = (work / "results" / "test.hyp.trees").read_text(encoding="utf-8").split("\n")[:-1]
    gold = (work / "data" / "test.gold.trees").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyp) == len(gold) == 118 and all(h.startswith("(TOP") for h in hyp)
    assert (work / "checkpoints" / "average_last2.pt").is_file()
    assert "decoding: beam 4, lenpen 0.3, max length 1 * input + 300" in r.stderr

    r2 = _run(env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("up to date") == 5 and "running" not in r2.stderr, r2.stderr
    assert F1_LINE.search(r2.stdout).group(0) == m.group(0)


@pytest.mark.parametrize("shared", ["as found", "absent"])
def test_ptb_recipe_refuses_bad_settings(tmp_path, shared):
    """Settings are checked before the data: each mistake is named even on a fresh clone without
    ../shared (where SMOKE=1 would otherwise stop first at the missing treebank sample)."""
    env = _env(tmp_path / "w")
    if shared == "absent":
        env["NMTKIT_SHARED"] = str(tmp_path / "no-shared")
    for extra, msg in [
        ({}, "set PTB_DIR to the LDC Treebank-3 parsed/mrg/wsj folder (or SAMPLE=1 / SMOKE=1 for the NLTK sample)"),
        ({"PTB_DIR": str(tmp_path / "nope")}, f"PTB_DIR={tmp_path / 'nope'} is not a folder"),
        ({"SMOKE": "1", "POS_TAGS": "tags"}, "POS_TAGS must be keep or xx, got 'tags'"),
        ({"SMOKE": "1", "BEAM": "wide"}, "BEAM must be a non-negative integer, got 'wide'"),
        ({"SMOKE": "1", "STAGE": "prepare"}, "STAGE=prepare is not a stage; stages: preprocess train average generate score"),
        ({"SMOKE": "1", "SILVER": str(tmp_path / "silver.trees")}, "silver.trees: no such file"),
        ({"SMOKE": "1", "SAMPLE": "1"}, "SMOKE=1 and SAMPLE=1 exclude each other"),
        ({"SAMPLE": "1", "BPE": "wordpiece"}, "BPE must be sentencepiece or none, got 'wordpiece'"),
    ]:
        r = _run({**env, **extra})
        assert r.returncode == 2 and msg in r.stderr, (extra, r.stderr)
    assert not (tmp_path / "w").exists()  # refused before writing anything
    if shared == "absent":  # and the missing data itself is one clear line
        r = _run({**env, "SMOKE": "1"})
        assert r.returncode == 2 and f"need {tmp_path / 'no-shared'}/data/ptb/treebank.zip" in r.stderr, r.stderr
