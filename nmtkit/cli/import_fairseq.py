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
    # program's checkpoint; of nmtkit's, only an earlier import is replaced (never a trained one)
    check_output_file(opts.output, "--output", [("CHECKPOINT", opts.checkpoint)], replace_nmtkit_checkpoint=True)
    _refuse_a_trained_checkpoint(opts.output)
    with stderr_console().status(plain_text("import-fairseq")) as spinner:
        r = import_fairseq(opts, log=lambda msg: spinner.update(plain_text(f"import-fairseq: {msg}")))
    print(f"{opts.output}: fairseq {r.arch} ({r.src_lang}->{r.tgt_lang}, {r.params:,} parameters, dictionaries "
          f"{r.src_size} / {r.tgt_size}), data directory {opts.data_dir}")


def _refuse_a_trained_checkpoint(path) -> None:
    """UserError when `path` is an nmtkit checkpoint that no import wrote (it has no
    `imported_from`): replacing an earlier import is the point of --output, replacing a trained
    model is a slip that would lose it."""
    from pathlib import Path

    from nmtkit.checkpoints import load_checkpoint
    from nmtkit.errors import UserError
    from nmtkit.outputs import NMTKIT_CHECKPOINT, checkpoint_kind

    if path is None or not Path(path).is_file() or checkpoint_kind(path) != NMTKIT_CHECKPOINT:
        return
    if "imported_from" not in load_checkpoint(path, mmap=True):
        raise UserError(f"--output {path} is an nmtkit checkpoint that no import wrote (a trained model); "
                        "choose another output")
