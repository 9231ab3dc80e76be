"""`nmtkit import-hf`: flag parsing for nmtkit.backends.huggingface.importer (docs/export.md).

The flags are ImportOptions' fields (their defaults and help live there).
"""

from __future__ import annotations

from pathlib import Path

from nmtkit.backends.huggingface.importer import ImportOptions
from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings


@app.command("import-hf")
@with_settings(ImportOptions, into="opts")
def import_hf_command(opts: ImportOptions) -> None:
    """Import a Hugging Face MarianMT folder (e.g. an OPUS-MT model) as an nmtkit checkpoint and
    data directory, which generate, score, attention, train (fine-tuning), export and serve take."""
    from nmtkit.backends.huggingface.importer import import_hf
    from nmtkit.console import plain_text, stderr_console
    from nmtkit.outputs import check_output_file

    # the checkpoint to write: never an input, a file of a data or export directory, or another
    # checkpoint (an nmtkit one with --force)
    # (the folder's own files are inputs too: its weights, config and tokenizer files)
    hf_files = sorted(q for q in Path(opts.hf_dir).iterdir() if q.is_file()) if Path(opts.hf_dir).is_dir() else []
    check_output_file(opts.output, "--output", [("HF_DIR", opts.hf_dir)] + [("HF_DIR", q) for q in hf_files],
                      replace_nmtkit_checkpoint=opts.force)

    with stderr_console().status(plain_text("import-hf")) as spinner:
        result = import_hf(opts, status=lambda msg: spinner.update(plain_text(f"import-hf: {msg}")))
    print(result.line())
