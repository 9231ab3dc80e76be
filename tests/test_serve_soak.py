"""recipes/bench/serve_soak.py kept runnable: an 8-second soak of `nmtkit serve` on the tiny model it
builds, whose printed figures must show every kind of client answered, no wrong answer, no 5xx
other than 503 and as many open descriptors at the end as after the warm-up, and whose JSON holds
the same figures. (The RSS criterion is for long runs: 8 s of load is too short for the server's
memory to settle, so it is not asserted here, and the exit status with it.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytestmark = pytest.mark.slow


def test_an_8_second_soak_answers_every_kind_correctly_and_keeps_no_descriptors(tmp_path):
    out = tmp_path / "soak.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "recipes/bench/serve_soak.py", "--seconds", "8", "--warmup", "2",
                        "--clients", "4", "--json", str(out)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    text = r.stdout
    answered = dict((k, int(n)) for k, n in re.findall(r"(\w+) (\d+)", text.splitlines()[0].split(";")[0]))
    assert set(answered) == {"valid", "invalid", "slow", "oversized", "page", "attention"}, text
    assert all(n > 0 for n in answered.values()), text
    assert int(re.search(r"; gone (\d+) ", text).group(1)) > 0, text
    assert re.search(r"^wrong answers: 0 of [1-9]\d* sentences", text, re.M), text
    assert re.search(r"^unexpected statuses: 0$", text, re.M), text
    assert re.search(r"^5xx other than 503: 0 answered, 0 in the server's log$", text, re.M), text
    fds = re.search(r"^open descriptors: (\d+) at start, (\d+) at end$", text, re.M)
    assert fds and fds.group(1) == fds.group(2), text
    assert re.search(r"^server: exit status 0, 0 traceback", text, re.M), text
    # the JSON says the same, and its verdict follows its criteria
    got = json.loads(out.read_text(encoding="utf-8"))
    assert {k: v for k, v in got["answered"].items() if k != "gone"} == answered
    assert got["wrong_answers"] == 0 and got["compared_sentences"] > 0 and got["fds"][0] == got["fds"][1]
    failed = [name for name, ok in got["criteria"].items() if not ok]
    assert set(failed) <= {"RSS flat within 5%"}, failed
    assert r.returncode == (1 if failed else 0)
    assert (text.splitlines()[-1] == "all criteria hold") == (not failed)


def test_the_comparison_with_generate_finds_a_wrong_answer(tmp_path, monkeypatch):
    """The check behind "wrong answers": generate's own rows pass, a changed text or score does
    not, and a blank sentence must give [("", 0.0)]."""
    monkeypatch.syspath_prepend(str(REPO / "recipes" / "bench"))
    from serve_soak import Stats, build, reference, wrong_answers

    s = build(tmp_path)
    sentences = ["w1 w2 w3", "w7 w9 w11 w2"]
    want = reference(str(s.data), str(s.ckpt), [], 3, 2, sentences, 1, tmp_path)
    assert all(1 <= len(rows) <= 2 for rows in want.values())
    stats = Stats()
    first, second = (tuple(want[x]) for x in sentences)
    stats.answer((sentences[0], 3, 2), first)
    stats.answer((sentences[0], 3, 2), first)
    stats.answer((sentences[1], 3, 2), ((second[0][0], second[0][1] + 1e-3),) + second[1:])  # a score off
    stats.answer((sentences[1], 3, 2), (("W99 W98", second[0][1]),) + second[1:])  # a text changed
    stats.answer(("", 3, 2), (("", 0.0),))
    stats.answer((" ", None, None), (("W1", 0.0),))
    wrong, total, examples = wrong_answers(stats, str(s.data), str(s.ckpt), [], 1, tmp_path)
    assert (wrong, total) == (3, 6), examples
    assert len(examples) == 3 and any("W99 W98" in x for x in examples)
