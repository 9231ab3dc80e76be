"""`nmtkit import-fairseq`: flag parsing for nmtkit.backends.fairseq.importer (docs/fairseq.md).

The flags are ImportOptions' fields (their defaults and help live there), fairseq's names where
it has them.
"""

from __future__ import annotations

from nmtkit.backends.fairseq.importer import ImportOptions
from nmtkit.cli.app import app
from nmtkit.cli.options import with_settings


@app.command("import-fairseq")
@with_settings(ImportOptions, into="opts")
def import_fairseq_command(opts: ImportOptions) -> None:
    """Import a fairseq Transformer checkpoint (read without running pickled code) as an nmtkit
    checkpoint and data directory; every nmtkit command then takes them."""
    from nmtkit.backends.fairseq.importer import import_fairseq
    from nmtkit.console import plain_text, stderr_console
    from nmtkit.outputs import check_output_file

    # the one output policy: never over the input, a data or export directory's file, or another
    # program's checkpoint (an earlier import, an nmtkit checkpoint, is replaced)
    check_output_file(opts.output, "--output", [("CHECKPOINT", opts.checkpoint)], replace_nmtkit_checkpoint=True)
    with stderr_console().status(plain_text("import-fairseq")) as spinner:
        r = import_fairseq(opts, log=lambda msg: spinner.update(plain_text(f"import-fairseq: {msg}")))
    print(f"{opts.output}: fairseq {r.arch} ({r.src_lang}->{r.tgt_lang}, {r.params:,} parameters, dictionaries "
          f"{r.src_size} / {r.tgt_size}), data directory {opts.data_dir}")
