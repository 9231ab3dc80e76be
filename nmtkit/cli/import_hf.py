"""`nmtkit import-hf`: flag parsing for nmtkit.backends.huggingface.importer (docs/export.md).

The flags are ImportOptions' fields (their defaults and help live there).
"""

from __future__ import annotations

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
    check_output_file(opts.output, "--output", [("HF_DIR", opts.hf_dir)], replace_nmtkit_checkpoint=opts.force)

    with stderr_console().status(plain_text("import-hf")) as spinner:
        result = import_hf(opts, status=lambda msg: spinner.update(plain_text(f"import-hf: {msg}")))
    print(result.line())
