"""What a command imports before it works (docs/export.md, "Start-up").

`nmtkit generate` on an export directory should cost little more than its runtime's own import:
the process imports the command it runs and what that command uses, nothing else. The checks are
on WHICH modules a fresh process has imported when it exits, never on time:
- no other command's module, no forced decoding (nothing here asked for scores or alignments),
  no shard reader (raw text, not a binarized split);
- no pydantic: typer builds a pydantic TypeAdapter per flag to convert its value, and nmtkit
  converts the plain kinds itself (`nmtkit.cli.coercion`), as typer would;
- no rich (the run printed no warning and no error), no click beside typer's own copy, no torch.
The conversion is checked value by value against typer's own, for every flag of every command.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from nmtkit.cli.app import COMMANDS, app

REPO = Path(__file__).resolve().parents[1]
RUNTIMES = {"onnx": "onnxruntime", "ctranslate2": "ctranslate2"}

# runs `nmtkit ARGS...` (sys.argv[2:]) and writes the names of every imported module to sys.argv[1]
DUMP = ("import atexit, json, sys; out = sys.argv[1]; "
        "atexit.register(lambda: open(out, 'w').write(json.dumps(sorted(sys.modules)))); "
        "sys.argv = ['nmtkit'] + sys.argv[2:]; from nmtkit.cli import main; main()")


def imported_by(tmp_path: Path, *args: str, stdin: str = "") -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `nmtkit ARGS` in a fresh process; its result and the modules it had imported at exit."""
    out = tmp_path / "modules.json"
    r = subprocess.run([sys.executable, "-c", DUMP, str(out), *map(str, args)], input=stdin, capture_output=True,
                       text=True, cwd=REPO, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    return r, set(json.loads(out.read_text()))


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def export(request, tmp_path_factory):
    """An untrained tiny model's export in each format whose runtime is installed: (format, dir)."""
    fmt = request.param
    pytest.importorskip(RUNTIMES[fmt], reason=f"{RUNTIMES[fmt]} is not installed")
    if fmt == "onnx":
        pytest.importorskip("onnx", reason="onnx is not installed")
    from conftest import word_mapping_data_dir

    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.cli import main
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer

    root = tmp_path_factory.mktemp(f"startup-{fmt}")
    data = word_mapping_data_dir(root, 40, 4, 8, seed=2)
    src, tgt = load_dictionaries(data)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    ckpt = root / "tiny.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(),
                     "model": Transformer(cfg, len(src), len(tgt)).state_dict(),
                     "dictionaries": {"src_sha256": src.sha256, "tgt_sha256": tgt.sha256, "src_lang": "de",
                                      "tgt_lang": "en"}, "update": 1, "epoch": 1}, ckpt)
    out = root / f"m-{fmt}"
    with pytest.raises(SystemExit) as e:
        main(["export", str(data), "--path", str(ckpt), "--format", fmt, "--output", str(out)])
    assert e.value.code == 0
    return fmt, out


def test_generate_on_an_export_imports_only_its_own_command(export, tmp_path):
    fmt, folder = export
    r, mods = imported_by(tmp_path, "generate", "--path", folder, "--input", "-")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    # the summary line, as the console printed it: one plain line
    assert re.fullmatch(r"(nmtkit: note: .*\n)?translated 0 sentences \(0 target tokens\) in \d+\.\ds: .*\n", r.stderr)
    assert RUNTIMES[fmt] in mods  # the engine was loaded: this is a real run, not a parse error
    assert {m for m in mods if m.startswith("nmtkit.cli.")} == {
        "nmtkit.cli.app", "nmtkit.cli.coercion", "nmtkit.cli.generate", "nmtkit.cli.options"}
    unwanted = {"pydantic", "rich", "torch", "nmtkit.forced", "nmtkit.generation.inspection",
                "nmtkit.outputs", "nmtkit.cli.fairseq_flags", "nmtkit.data.shards"}  # raw text: no shard reader
    if _vendored_click():
        unwanted.add("click")
    assert mods & unwanted == set()


def test_a_warning_still_goes_through_the_console(export, tmp_path):
    """A run with a warning imports rich for it, and prints it as one line."""
    fmt, folder = export
    long_line = " ".join(["w1"] * 1100)  # longer than the model's 1023 source tokens: truncated, with a warning
    r, mods = imported_by(tmp_path, "generate", "--path", folder, "--input", "-", "--quiet", stdin=long_line + "\n")
    assert r.returncode == 0, r.stderr
    assert "rich" in mods and "pydantic" not in mods
    warnings = [line for line in r.stderr.splitlines() if line.startswith("nmtkit: warning: ")]
    assert len(warnings) == 1 and "1100" in warnings[0], r.stderr


def test_version_imports_no_command(tmp_path):
    from nmtkit import __version__

    r, mods = imported_by(tmp_path, "--version")
    assert (r.returncode, r.stdout) == (0, f"nmtkit {__version__}\n")
    assert not {m for m in mods if m.startswith(("nmtkit.cli.", "nmtkit.generation"))} - {
        "nmtkit.cli.app", "nmtkit.cli.coercion"}
    assert not mods & {"pydantic", "rich", "numpy", "torch"}


def test_help_lists_every_command_with_its_summary(run_cli):
    r = run_cli("--help")
    assert r.code == 0
    listed = r.out.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed if line.strip()] == list(COMMANDS)
    assert all(len(line.split(None, 1)) == 2 for line in listed if line.strip())  # each with its summary


# ------------------------------------------------------------------------ the flags' values


def _vendored_click() -> bool:
    try:
        import typer._click  # noqa: F401
    except ImportError:
        return False
    return True


# command-line spellings of each kind: the usual ones, and ones typer's own conversion decides
SAMPLES = {
    int: ["0", "7", "-3", "007", "123456789012345678", "1234567890123456789012", "1_000", " 4", "+5", "1.0",
          "1.5", "abc", ""],
    float: ["0.6", "-1e-4", "1.", ".5", "2.5E+10", "1e400", "0.1000000000000000055511151231257827", "nan",
            "-inf", "1_0", " 2", "abc", ".", ""],
    str: ["x", "", "a b", "ü", "-"],
    bool: ["true", "0", "maybe"],
    Path: ["some/file", "", "-", "/", "."],
}


def _outcome(runtime_param, value, param, ctx):
    try:
        out = runtime_param.coerce(value, param=param, ctx=ctx)
    except Exception as e:  # typer's BadParameter, with its message
        return "error", type(e).__name__, str(e)
    return "value", type(out).__name__, repr(out)


def _values(param) -> list:
    """Sample values for one parameter: single strings, or tuples of them for a list."""
    annotation = param.type_descriptor.annotation
    multi = param.multiple or param.nargs == -1
    kind = typer_args(annotation)[0] if multi else annotation
    singles = SAMPLES.get(kind, ["x"])
    if multi:
        return [None, (), *[(v,) for v in singles], tuple(singles[:2]), "not-a-list"]
    return [None, *singles]


def typer_args(annotation) -> tuple:
    return getattr(annotation, "__args__", (annotation,))


def test_every_flag_converts_its_values_as_typer_does():
    """For every flag of every command: the value (or the error message) typer's own conversion
    gives, for the usual spellings and the odd ones alike."""
    pytest.importorskip("typer._adapters", reason="this typer converts values without pydantic")
    from typer._coercion import build_runtime_param

    from nmtkit.cli.coercion import _PlainCoercion

    group = typer.main.get_command(app)
    checked = 0
    for name in COMMANDS:
        cmd = group.get_command(None, name)
        ctx = typer.Context(cmd, info_name=name)
        for param in cmd.get_params(ctx):
            if not hasattr(param, "type_descriptor"):
                continue
            ours = param.get_runtime_param()
            assert isinstance(ours, _PlainCoercion), (name, param.name)
            theirs = build_runtime_param(param.type_descriptor)
            for value in _values(param):
                assert _outcome(ours, value, param, ctx) == _outcome(theirs, value, param, ctx), (name, param.name, value)
                checked += 1
    assert checked > 1000


def test_the_usual_spellings_need_no_pydantic():
    """The values nmtkit's flags take every day are decided without typer's conversion (which is
    what imports pydantic): a number as written, a path, a word."""
    from typer.models import OptionInfo

    from nmtkit.cli.coercion import _UNDECIDED, plain_value

    class Param:  # what plain_value reads of a typer parameter
        class type_descriptor:
            parameter_info = OptionInfo()

    for annotation, value, want in [(int, "4", 4), (int, "-1", -1), (float, "0.6", 0.6), (float, "1e-4", 1e-4),
                                    (float, "3", 3.0), (str, "data-bin", "data-bin"), (float, 0.6, 0.6),
                                    (int, 4, 4), (Path, "data-bin/x", Path("data-bin/x"))]:
        got = plain_value(annotation, value, Param(), None)
        assert got == want and type(got) is type(want), (annotation, value, got)
    for annotation, value in [(int, "1_000"), (float, "nan"), (int, " 4"), (int, 4.0), (float, True), (bool, "yes")]:
        assert plain_value(annotation, value, Param(), None) is _UNDECIDED, (annotation, value)
