"""`nmtkit preprocess`: flag parsing for nmtkit.preprocess_job (docs/preprocess.md).

The flags are PreprocessConfig's and PreprocessJob's fields (their defaults, help and the rules
tying them to --task live there); this module adds the progress bars and prints the summary.
"""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings
from nmtkit.console import stderr_console, text_column
from nmtkit.preprocess_job import PreprocessJob
from nmtkit.io import text_stdout


class _RateColumn(ProgressColumn):
    """Items per second (lines, tokens or bytes, whatever the task counts)."""

    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


@app.command("preprocess")
@with_settings(PreprocessJob, into="job")
def preprocess_command(job: PreprocessJob) -> None:
    """Learn a subword model and dictionaries on the training text and binarize every split.

    Writes to DESTDIR: the subword model, dict.SRC.txt and dict.TGT.txt, per split and language
    binary shards (.bin + .idx), and manifest.json with checksums. Rerunning with the same inputs
    and options finds DESTDIR up to date and does nothing.
    """
    from nmtkit.preprocess_job import format_summary, run_preprocess

    console = stderr_console()
    progress = Progress(
        text_column("{task.description}"), BarColumn(), MofNCompleteColumn(), _RateColumn(),
        TimeElapsedColumn(), text_column("eta"), TimeRemainingColumn(),
        console=console,
        transient=True,  # bars vanish when done; the library logs one line per finished phase
        disable=not console.is_terminal,  # in a log file, a bar would leave only a blank line
    )
    with progress:
        result = run_preprocess(job, progress=progress, log=progress.console.print)
    out = text_stdout()
    out.write(format_summary(result))
    out.flush()
