"""`nmtkit generate`: flag parsing for nmtkit.generation.generator (docs/generate.md).

The flags are GenerateOptions' and SearchConfig's fields (their defaults and help live there).
"""

from __future__ import annotations

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
    from nmtkit.console import stderr_console
    from nmtkit.generation.generator import generate

    err = stderr_console()
    stats = generate(opts, warn=lambda msg: err.print(f"nmtkit: warning: {msg}", style="yellow"))
    if opts.progress:  # --quiet: neither the progress bar nor this summary line
        err.print(stats.line())
