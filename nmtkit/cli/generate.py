"""`nmtkit generate`: flag parsing for nmtkit.generation.generator (docs/generate.md).

The flags are GenerateOptions' and SearchConfig's fields (their defaults and help live there).
"""

from __future__ import annotations

import sys

from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings
from nmtkit.generation.generator import GenerateOptions


@app.command("generate")
@with_settings(GenerateOptions, into="opts")
def generate_command(opts: GenerateOptions) -> None:
    """Translate a binarized split or raw text with beam search (the paper: beam 4, lenpen 0.6).

    Output: one detokenized hypothesis per input line, in input order, so that
    `nmtkit generate ... | nmtkit score --ref REF` works.
    """
    from nmtkit.generation.generator import generate

    stats = generate(opts, warn=_warn)
    if opts.progress:  # --quiet: neither the progress bar nor this summary line
        print(stats.line(), file=sys.stderr)  # nmtkit's own plain text: no console needed


def _warn(msg: str) -> None:
    """A yellow warning line on stderr. Its console, and rich with it, is made for a warning only:
    most runs have none, and rich's import is a sizeable part of an export's start-up."""
    from nmtkit.console import stderr_console

    stderr_console().print(f"nmtkit: warning: {msg}", style="yellow")
