"""Shared test helpers: where ../shared/data is, and running the CLI in-process.

../shared (the real data: Multi30k, WMT, the treebank sample) sits beside the checkout, or where
NMTKIT_SHARED says; a fresh clone has none, and every test that reads it then skips with the
reason (`shared_file`). Such tests carry the `shared_data` mark (see pytest_collection_modifyitems).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NMTKIT_SHARED", REPO.parent / "shared"))
SHARED_DATA = SHARED / "data"


# Two trees of wsj_0001.mrg in the treebank's own layout (multi-line, unlabeled root, function
# tags, co-indices, -NONE-, trailing spaces), and the same trees normalized as EVALB expects.
WSJ_MRG = """
( (S 
    (NP-SBJ-1 (NNP Pierre) (NNP Vinken) )
    (VP (MD will) 
      (VP (VB join) 
        (NP (DT the) (NN board) )
        (S (NP-SBJ (-NONE- *-1) ) (VP (TO to) (VP (VB win) )))))
    (. .) ))
( (S 
    (NP-SBJ (NNP Mr.) (NNP Vinken) )
    (VP (VBZ is) 
      (NP-PRD (NN chairman) ))
    (. .) ))
"""
WSJ_NORM = [
    "(TOP (S (NP (NNP Pierre) (NNP Vinken)) (VP (MD will) (VP (VB join) (NP (DT the) (NN board)) "
    "(S (VP (TO to) (VP (VB win)))))) (. .)))",
    "(TOP (S (NP (NNP Mr.) (NNP Vinken)) (VP (VBZ is) (NP (NN chairman))) (. .)))",
]


def _hypothesis_profiles() -> None:
    """Hypothesis's settings for the property tests (the `fuzz` mark): `ci`, the default, a bounded
    and derandomized run (the same examples every time, so a CI failure reproduces); `fuzz`
    (recipes/bench/fuzz.sh: HYPOTHESIS_PROFILE=fuzz) 10,000 fresh examples per test. No deadline:
    a busy 2-core machine times examples unevenly."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the test extra not installed: the property tests fail to import, loudly
        return
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("ci", max_examples=int(os.environ.get("NMTKIT_FUZZ_EXAMPLES", "60")),
                              deadline=None, derandomize=True, database=None, suppress_health_check=quiet)
    settings.register_profile("fuzz", max_examples=int(os.environ.get("NMTKIT_FUZZ_EXAMPLES", "10000")),
                              deadline=None, suppress_health_check=quiet)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_hypothesis_profiles()

# Under the fuzz profile: per property test, the examples run, the failing ones and the slowest
# input with its time (Hypothesis's observability callbacks; printed at the end of the run).
FUZZ_STATS: dict[str, dict] = {}


def _observe(obs, thread_id=None) -> None:  # all_threads callbacks also get the thread
    if getattr(obs, "type", None) != "test_case":
        return
    s = FUZZ_STATS.setdefault(obs.property, {"examples": 0, "failed": 0, "slowest_s": 0.0, "input": ""})
    s["examples"] += 1
    s["failed"] += obs.status == "failed"
    took = sum(v for k, v in (obs.timing or {}).items() if k.startswith("execute"))
    if took >= s["slowest_s"]:
        s["slowest_s"], s["input"] = took, obs.representation


def _watch_examples() -> None:
    """Register `_observe` once per process: this file is imported again as tests.conftest by
    test modules that import from it, and each copy would count every example again."""
    import hypothesis

    if getattr(hypothesis, "_nmtkit_fuzz_stats", False):
        return
    try:
        from hypothesis.internal.observability import add_observability_callback
    except ImportError:  # an older Hypothesis: the run still fuzzes, without the table
        return
    add_observability_callback(_observe, all_threads=True)
    hypothesis._nmtkit_fuzz_stats = True


if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz":
    _watch_examples()


def pytest_terminal_summary(terminalreporter):
    if not FUZZ_STATS:
        return
    w = terminalreporter.write_line
    w("fuzz: property | examples | failed | slowest s | slowest input")
    for name, s in sorted(FUZZ_STATS.items()):
        text = s["input"].replace("\n", " ")
        w(f"{name} | {s['examples']} | {s['failed']} | {s['slowest_s']:.3f} | {text[:160]}")


def pytest_configure(config):
    config.addinivalue_line("markers", "shared_data: in a module that reads ../shared (NMTKIT_SHARED); "
                            "CI runs these again with the folder hidden, as a fresh clone has none")


def pytest_collection_modifyitems(config, items):
    """Mark every test of a module that uses `shared_file` or `SHARED`: `pytest -m shared_data`
    selects them, and `.ci/run` runs them a second time with NMTKIT_SHARED pointing nowhere to
    prove that each one passes or skips with a reason without the shared folder."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and (hasattr(module, "shared_file") or hasattr(module, "SHARED")):
            item.add_marker(pytest.mark.shared_data)
    _mutation_fastest_first(items)


def _mutation_fastest_first(items) -> None:
    """Under a mutation run (docs/testing.md), run a mutant's tests fastest first, by the
    durations mutmut recorded in its first pass, so that a killed mutant stops after a cheap
    test. mutmut does this itself in its fork mode, but in the forkserver mode the benchmark
    uses (mutmut 3.8.1) the tests arrive in the arbitrary order of a set."""
    if not os.environ.get("MUTANT_UNDER_TEST"):
        return
    stats = Path("mutmut-stats.json")  # mutmut runs the tests from its mutants/ folder
    try:
        durations = json.loads(stats.read_text("utf-8"))["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, math.inf))


def shared_file(*parts: str) -> Path:
    """Path to a file under ../shared/data, or skip the test (with the reason) when it is absent."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"real data not available: {p} (set NMTKIT_SHARED to a folder laid out as "
                    'docs/testing.md, "The real data", describes)')
    return p


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


@pytest.fixture
def run_cli(capsys):
    """Run `nmtkit ARGS...` in-process; return exit code, stdout and stderr."""
    from nmtkit.cli import main
    from nmtkit.cli.app import state

    def run(*args: str) -> CliResult:
        capsys.readouterr()  # only this command's output: not what earlier in-process calls printed
        debug = state["debug"]
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            state["debug"] = debug
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def word_mapping_data_dir(root: Path, n_train: int, n_valid: int, n_words: int, seed: int) -> Path:
    """A data dir of a word-mapping task (wK -> WK: learnable by a tiny model in a few updates),
    joint dictionary, no subwords, train and valid splits; returns root/bin."""
    import random

    from nmtkit.data.preprocess import PreprocessConfig, preprocess

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(n_words)]
    for split, n in (("train", n_train), ("valid", n_valid)):
        src, tgt = [], []
        for _ in range(n):
            s = [rng.choice(words) for _ in range(rng.randint(2, 10))]
            src.append(" ".join(s))
            tgt.append(" ".join(w.upper() for w in s))
        (root / f"{split}.de").write_text("\n".join(src) + "\n")
        (root / f"{split}.en").write_text("\n".join(tgt) + "\n")
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(root / "train"),
                                validpref=[str(root / "valid")], destdir=str(root / "bin"), bpe="none",
                                joined_dictionary=True))
    return root / "bin"
