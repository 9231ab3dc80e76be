"""Mutation-testing benchmark driver (mutmut 3), one module at a time: see docs/testing.md.

Why per module, in a work folder of its own: mutmut reads its settings from ./pyproject.toml and
keeps its state in ./mutants/, and it runs the tests named in `pytest_add_cli_args_test_selection`
to learn which test reaches which function. Running the whole suite for that (and again for the
"clean" check) would cost minutes per module and would let every mutant of loss.py run the slow
end-to-end training tests. So each MODULE below gets .mutation/<name>/ with a copy of nmtkit/ and
tests/ and a pyproject.toml whose [tool.mutmut] is the repository's, narrowed to that module's
files and to the test files that cover it. Mutants are then run only against the tests that
reached the mutated function (mutmut's own per-function selection), fastest first, -x.

    python recipes/bench/mutation.py [--list] [--budget SECONDS] [--workers N] [MODULE ...]

Prints, per module, the number of mutants generated, killed, survived, timed out, not reached by
any test ("no tests"), the rest (suspicious/segfault/not checked) and the score
    score = (killed + timed out) / (generated - listed equivalent)
where the equivalent mutants are the ones listed, with a reason, in docs/testing.md ("- `name`:").
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".mutation"


@dataclass(frozen=True)
class Module:
    files: tuple[str, ...]  # sources to mutate, relative to the repository root
    tests: tuple[str, ...]  # the test files that cover them (only these are run)
    functions: tuple[str, ...] = ()  # mutant-name globs: mutate only these functions (default all)
    note: str = ""
    extra: tuple[str, ...] = field(default=())  # other folders the tests need (copied beside tests/)


# The core modules. Names are what `mutation.sh MODULE` takes.
MODULES: dict[str, Module] = {
    # each module's tests include those of its newer code (the chunked loss, the streaming batch
    # plan, the constrained search, the Moses pre-tokenizer, the first bytes of a checkpoint)
    "loss": Module(("nmtkit/training/loss.py",),
                   # test_planted_regressions.py: the products' dtype under autocast (right in value either way)
                   ("tests/test_loss.py", "tests/test_fused_loss.py", "tests/test_planted_regressions.py")),
    "schedule": Module(("nmtkit/training/schedule.py",), ("tests/test_schedule.py",)),
    "ema": Module(("nmtkit/training/ema.py",), ("tests/test_ema.py",)),
    # the fast unit tests first; the golden outputs pin the fp32 hypotheses of real models
    "search": Module(("nmtkit/search/beam.py", "nmtkit/search/config.py"),
                     ("tests/test_search_rules.py", "tests/test_search.py", "tests/test_search_golden.py",
                      "tests/test_terms.py", "tests/test_shortlist_search.py"),
                     # config.py: the search's own rules (its settings API is the Translator's, tested there)
                     ("nmtkit.search.beam.*", "nmtkit.search.config.xǁSearchConfigǁ*",
                      "nmtkit.search.config.x_check_lenpen__*", "nmtkit.search.config.x_length_penalty__*")),
    "generation-batching": Module(
        ("nmtkit/generation/items.py", "nmtkit/generation/translator.py", "nmtkit/generation/generator.py",
         "nmtkit/backends/pytorch/engine.py"),
        ("tests/test_generate_batching.py", "tests/test_generate.py", "tests/test_translator.py"),
        ("*.x_chunks__*", "*.x_make_batches__*", "*.x_collate_source__*", "*.xǁTranslatorǁtranslate_items__*",
         "*.xǁTruncationsǁ*"),
        "batching of sentences for generate and the Translator, not the whole driver",
        ("docs",)),  # test_translator.py runs docs/api.md's example
    "trainer-step": Module(
        ("nmtkit/training/step.py",), ("tests/test_update_step.py", "tests/test_host_syncs.py", "tests/test_train.py",
                                       "tests/test_compile.py::test_the_probe_leaves_training_exactly_as_without_it"),
        (), "the update step (training/step.py: UpdateStep, total_norm)"),
    # --compile's cache folder and probe; the real compilation (a slow test, a minute or more a
    # run) is left out: every mutant would pay it
    "trainer-compile": Module(
        ("nmtkit/training/compiled.py",),
        tuple(f"tests/test_compile.py::{t}" for t in (
            "test_compiled_graphs_go_to_the_users_cache_folder_unless_one_is_chosen",
            "test_a_cache_folder_that_cannot_be_made_leaves_torchs_default_with_a_note",
            "test_the_probes_figures_and_its_line", "test_the_probe_leaves_training_exactly_as_without_it",
            "test_a_model_that_fails_to_compile_is_one_line", "test_the_probe_times_each_pass_and_keeps_the_faster_of_two",
            "test_the_probe_drains_the_accelerators_queue_and_restores_its_generator",
            "test_a_pass_that_fails_after_its_backward_leaves_no_gradients")),
        (), "--compile's cache folder and probe (training/compiled.py)"),
    "batching": Module(("nmtkit/data/batching.py",), ("tests/test_batching.py", "tests/test_batch_plan.py", "tests/test_padding.py")),
    "dictionary": Module(("nmtkit/data/dictionary.py",), ("tests/test_dictionary.py",)),
    "shards": Module(("nmtkit/data/shards.py",), ("tests/test_shards.py",)),
    "subwords": Module(("nmtkit/data/subwords.py",),
                       ("tests/test_subwords.py", "tests/test_preprocess.py", "tests/test_fairseq_import.py"), (),
                       "test_subwords.py: the models by themselves, fast; test_preprocess.py: through preprocess"),
    "checkpoints": Module(("nmtkit/checkpoints.py",),
                          ("tests/test_checkpoints.py", "tests/test_average_checkpoints_cli.py",
                           "tests/test_first_hour_api.py", "tests/test_load_bounds.py"),
                          extra=("docs",)),  # test_load_bounds.py checks docs/formats.md states the limits
    "bleu": Module(("nmtkit/scoring/bleu.py",), ("tests/test_score.py", "tests/test_bleu_unit.py")),
    "parseval": Module(("nmtkit/scoring/parseval.py",), ("tests/test_parseval.py",)),
    "linearize": Module(("nmtkit/parsing/linearize.py",), ("tests/test_linearize.py",)),
    "cli-refusals": Module(
        ("nmtkit/cli/__init__.py", "nmtkit/generation/generator.py", "nmtkit/search/config.py",
         "nmtkit/generation/model_flags.py", "nmtkit/backends/registry.py",
         "nmtkit/training/config.py", "nmtkit/settings.py", "nmtkit/serving/options.py",
         "nmtkit/backends/export.py", "nmtkit/scoring/files.py", "nmtkit/generation/inspection.py",
         "nmtkit/data/preprocess.py", "nmtkit/device.py", "nmtkit/data/languages.py"),
        # the configs' rules are checked directly by test_refusals.py (exact messages); test_search.py
        # and test_train.py (30 s a survivor) are left out: they reach these functions only on the way
        ("tests/test_refusals.py", "tests/test_search_rules.py", "tests/test_cli.py", "tests/test_flags.py",
         "tests/test_generate.py"),
        ("nmtkit.cli.x_main__*", "nmtkit.cli.x_error_line__*",
         "*.xǁGenerateOptionsǁvalidate__*", "*.xǁGenerateOptionsǁ_validate_inspection__*",
         "*.x__check_files__*", "nmtkit.data.languages.x_check_lang_flags__*", "*.x_check_model_options__*",
         "*.x_describe__*",
         "*.x_check_quantize__*", "nmtkit.device.x_check_precision__*",
         "*.x__check_output_path__*", "*.xǁSearchConfigǁ__post_init____*", "*.x_check_lenpen__*",
         "*.xǁTrainConfigǁvalidate__*", "*.xǁTrainConfigǁ_validate_*__*", "*.xǁTrainConfigǁ_require_*__*", "nmtkit.settings.x_check_number__*", "nmtkit.settings.x_check_numbers__*",
         "*.xǁServeOptionsǁvalidate__*", "*.xǁExportOptionsǁvalidate__*", "*.xǁScoreOptionsǁvalidate__*",
         "*.xǁAttentionOptionsǁvalidate__*", "nmtkit.generation.inspection.x__heads__*",
         "*.xǁPreprocessConfigǁvalidate__*"),
        "the exit-2 paths: cli.main's error handling and the flag rules of train, generate, serve, "
        "export, score, attention and preprocess"),
}

COLUMNS = ("generated", "killed", "survived", "timeout", "no tests", "other", "equivalent", "score")


def load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: mutmut depends on `toml` there
        import toml as tomllib  # type: ignore[no-redef]
        return tomllib.loads(path.read_text("utf-8"))
    return tomllib.loads(path.read_text("utf-8"))


def toml_value(v) -> str:
    """TOML for the few value types [tool.mutmut] holds (JSON strings and lists are valid TOML)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"unsupported [tool.mutmut] value {v!r}")


def equivalents() -> set[str]:
    """Mutant names listed as equivalent in docs/testing.md (lines '- `name`: why')."""
    doc = ROOT / "docs" / "testing.md"
    if not doc.exists():
        return set()
    return set(re.findall(r"^- `([\w.ǁ]+__mutmut_\d+)`:", doc.read_text("utf-8"), flags=re.M))


def prepare(name: str, mod: Module) -> Path:
    """A fresh .mutation/NAME/ with nmtkit/, tests/ and a pyproject.toml narrowed to MOD."""
    wd = WORK / name
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("nmtkit", "tests", *mod.extra):
        shutil.copytree(ROOT / d, wd / d, ignore=skip)
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    cfg = dict(load_toml(ROOT / "pyproject.toml").get("tool", {}).get("mutmut", {}))
    cfg.update(source_paths=["nmtkit"], only_mutate=list(mod.files),
               pytest_add_cli_args_test_selection=list(mod.tests),
               # mutmut runs the tests inside mutants/, into which it copies only tests/ and
               # the sources: the extra folders must be named to it too
               also_copy=[*cfg.get("also_copy", []), *mod.extra])
    # drop the repository's [tool.mutmut] table (up to the next table) and append the narrowed one
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
    text += "\n[tool.mutmut]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in cfg.items())
    (wd / "pyproject.toml").write_text(text, "utf-8")
    return wd


def tally(name: str, mod: Module, wd: Path, equiv: set[str]) -> dict:
    from mutmut.stats import status_by_exit_code  # mutmut's own reading of its result codes

    counts = dict.fromkeys(COLUMNS[:-1], 0)
    survivors = []
    for f in mod.files:
        meta = wd / "mutants" / (f + ".meta")
        if not meta.exists():
            continue
        for key, code in json.loads(meta.read_text("utf-8"))["exit_code_by_key"].items():
            if mod.functions and not any(fnmatch.fnmatch(key, g) for g in mod.functions):
                continue
            counts["generated"] += 1
            status = status_by_exit_code[code]
            if key in equiv and status != "killed":
                counts["equivalent"] += 1
                continue
            counts[status if status in counts else "other"] += 1
            if status not in ("killed", "timeout"):
                survivors.append(f"{key} ({status})")
    denom = counts["generated"] - counts["equivalent"]
    counts["score"] = f"{100 * (counts['killed'] + counts['timeout']) / denom:.1f}%" if denom else "-"
    counts["survivors"] = survivors
    return counts


def run_module(name: str, mod: Module, workers: int, timeout: float) -> tuple[dict, float, bool]:
    wd = prepare(name, mod)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    # tests find ../shared through conftest's NMTKIT_SHARED; the copy lives elsewhere
    env.setdefault("NMTKIT_SHARED", str(ROOT.parent / "shared"))
    cmd = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())",
           "run", "--max-children", str(workers), *mod.functions]
    log = wd / "mutmut.log"
    t0 = time.monotonic()
    timed_out = False
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=wd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, 15)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                rc = proc.wait()
    elapsed = time.monotonic() - t0
    if rc != 0 and not timed_out:
        tail = log.read_text("utf-8", errors="replace")[-3000:]
        print(f"[mutation] {name}: mutmut exited {rc}; end of {log}:\n{tail}", file=sys.stderr)
    return tally(name, mod, wd, equivalents()), elapsed, timed_out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", metavar="MODULE", help="default: all; --list shows them")
    ap.add_argument("--list", action="store_true", help="list the modules and their tests, then exit")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("MUTATION_WORKERS", "2")))
    ap.add_argument("--budget", type=float, default=float(os.environ.get("MUTATION_BUDGET", "7200")),
                    help="seconds for the whole run (default 7200): each module may use what is left "
                         "divided by the modules still to run, then it is stopped and reported as partial")
    args = ap.parse_args(argv)
    if args.list:
        for n, m in MODULES.items():
            print(f"{n:20} {' '.join(m.files)}  <- {' '.join(m.tests)}" + (f"  ({m.note})" if m.note else ""))
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        print(f"mutation: unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}", file=sys.stderr)
        return 2
    if args.workers < 1 or args.budget <= 0:
        print("mutation: --workers and --budget must be positive", file=sys.stderr)
        return 2
    names = args.modules or list(MODULES)
    rows = []
    deadline = time.monotonic() + args.budget
    for i, n in enumerate(names):
        # a fair share of what is left: modules that finish early leave their time to the others
        share = max(deadline - time.monotonic(), 0.0) / (len(names) - i)
        print(f"[mutation] {n}: {' '.join(MODULES[n].files)} against {' '.join(MODULES[n].tests)} "
              f"(at most {share:.0f} s)", flush=True)
        counts, elapsed, partial = run_module(n, MODULES[n], args.workers, max(share, 1.0))
        rows.append((n, counts, elapsed, partial))
        print(f"[mutation] {n}: {counts['generated']} mutants, score {counts['score']} in {elapsed:.0f} s"
              + (" (stopped: its share of --budget ran out; partial)" if partial else ""), flush=True)
    head = f"{'module':20}" + "".join(f"{c:>11}" for c in COLUMNS) + f"{'seconds':>9}"
    print("\n" + head + "\n" + "-" * len(head))
    for n, c, el, partial in rows:
        print(f"{n:20}" + "".join(f"{c[k]!s:>11}" for k in COLUMNS) + f"{el:>9.0f}" + (" partial" if partial else ""))
    for n, c, _, _ in rows:
        if c["survivors"]:
            print(f"\n{n}: not killed (inspect: cd .mutation/{n} && mutmut show NAME)")
            for s in c["survivors"]:
                print(f"  {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
