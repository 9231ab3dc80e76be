"""User text reaches the terminal verbatim: rich markup (`[...]`) and emoji codes (`:100:`) are off
in every console, progress column and spinner nmtkit makes (nmtkit/console.py)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from nmtkit.console import plain_text, stderr_console, text_column

REPO = Path(__file__).resolve().parents[1]
TRICKY = "train.de:100: [bold]x[/bold] :smile: [red]"


def _bad_line_100(path: Path) -> Path:
    lines = [f"s {i}".encode() for i in range(1, 121)]
    lines[99] = b"caf\xe9"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_error_line_keeps_file_and_line_number(run_cli, tmp_path):
    """`train.de:100:` once printed as `train.de💯` (the emoji code :100:)."""
    bad = _bad_line_100(tmp_path / "train.de")
    good = tmp_path / "train.en"
    good.write_text("".join(f"s {i}\n" for i in range(1, 121)))
    r = run_cli("score", "--ref", good, "--sys", bad)
    assert r.code == 2, r
    assert r.err.strip() == f"nmtkit: error: {bad}:100: invalid UTF-8 (byte 0xe9 at column 4)"
    r = run_cli("preprocess", "-s", "de", "-t", "en", "--trainpref", tmp_path / "train", "--bpe", "none",
                "--destdir", tmp_path / "bin")
    assert r.code == 2 and r.err == f"nmtkit: error: {bad}:100: invalid UTF-8 (byte 0xe9 at column 4)\n", r


def test_markup_in_a_path_is_printed_as_is(run_cli, tmp_path):
    missing = tmp_path / "[bold]ref[/bold]:100:.txt"
    r = run_cli("score", "--ref", missing, "--sys", missing)
    assert r.code == 2 and str(missing) in r.err, r


def test_console_helpers_print_verbatim():
    buf = io.StringIO()
    con = stderr_console(file=buf, width=20)
    con.print(TRICKY + " and a line longer than the console width")
    assert buf.getvalue() == TRICKY + " and a line longer than the console width\n"  # soft wrap: one line

    from rich.progress import Progress

    buf = io.StringIO()
    with Progress(text_column("{task.description}"), console=stderr_console(file=buf, force_terminal=True)) as p:
        p.add_task(TRICKY)
    assert TRICKY in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert plain_text(TRICKY).plain == TRICKY


def test_train_progress_lines_are_verbatim():
    from nmtkit.training.report import TrainProgress

    buf = io.StringIO()
    TrainProgress(False, None, 0, console=stderr_console(file=buf)).line(TRICKY)
    assert buf.getvalue() == TRICKY + "\n"


def test_no_console_or_text_column_is_made_outside_nmtkit_console():
    """Every rich Console / TextColumn / status comes from nmtkit.console, where markup and emoji
    are off; a new one made directly would bring `train.de💯` back."""
    offenders = []
    for path in (REPO / "nmtkit").rglob("*.py"):
        if path.name == "console.py" and path.parent.name == "nmtkit":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#")[0]
            if re.search(r"\b(Console|TextColumn)\(", code) or re.search(r"\.status\(f?\"", code):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, offenders
