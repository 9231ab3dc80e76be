"""`nmtkit score`: sacreBLEU / chrF / TER, paper-comparable tokenized BLEU, and EVALB parseval.

Flags only: they are ScoreOptions' fields, and the scoring, the checks on the files and the
report are nmtkit.scoring.files'.
"""

from __future__ import annotations

import sys

from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings
from nmtkit.scoring.files import ScoreOptions

_MAX_WARNINGS = 10


def _warn(lines: list[str]) -> None:
    """Print warnings on stderr, at most _MAX_WARNINGS of them and a count of the rest."""
    for w in lines[:_MAX_WARNINGS]:
        print(f"nmtkit: warning: {w}", file=sys.stderr)
    if len(lines) > _MAX_WARNINGS:
        print(f"nmtkit: warning: ... and {len(lines) - _MAX_WARNINGS} more", file=sys.stderr)


@app.command("score")
@with_settings(ScoreOptions, into="opts")
def score_cmd(opts: ScoreOptions) -> None:
    """Score hypotheses against references: sacreBLEU, chrF, TER, tokenized BLEU, or parse trees (EVALB)."""
    from nmtkit.console import plain_text, stderr_console
    from nmtkit.io import text_stdout
    from nmtkit.scoring import files

    out = text_stdout()
    if "parseval" in opts.metrics:
        test_path, result = files.score_parseval_file(opts)
        _warn(result.warnings)
        out.write(files.parseval_text(opts, test_path, result))
        return
    inputs = files.read_translation_inputs(opts.ref, opts.sys, opts.paired_bs)
    _warn(inputs.warnings)
    with stderr_console().status(plain_text(f"scoring {len(inputs.hyps)} lines ({', '.join(opts.metrics)})")):
        report = files.score_translation_files(inputs, opts)
    out.write(report.text(as_json=opts.json))
