"""`nmtkit average-checkpoints`: the paper's checkpoint averaging (last 5 for base, last 20 for big)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nmtkit.cli.app import app
from nmtkit.console import plain_text, stderr_console
from nmtkit.errors import UserError


@app.command("average-checkpoints")
def average_checkpoints_cmd(
    files: Optional[List[Path]] = typer.Argument(
        None, metavar="CHECKPOINT", help="Checkpoint files to average (or after --inputs).", show_default=False
    ),
    inputs: Optional[List[Path]] = typer.Option(
        None, "--inputs", metavar="DIR|CHECKPOINT",
        help="A training --save-dir to pick the last N checkpoints from, or checkpoint files as fairseq takes "
        "them (--inputs a.pt b.pt).", show_default=False
    ),
    num_update_checkpoints: Optional[int] = typer.Option(
        None,
        "--num-update-checkpoints",
        help="With --inputs: average the last N checkpoint_EPOCH_UPDATE.pt files (by update number).",
        show_default=False,
    ),
    num_epoch_checkpoints: Optional[int] = typer.Option(
        None,
        "--num-epoch-checkpoints",
        help="With --inputs: average the last N checkpointEPOCH.pt files (by epoch number).",
        show_default=False,
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the averaged checkpoint."),
) -> None:
    """Average model weights element-wise into one inference checkpoint (no optimizer state)."""
    from nmtkit import checkpoints as ck
    from nmtkit.outputs import check_output_file

    paths = selected_checkpoints(files or [], inputs or [], num_update_checkpoints, num_epoch_checkpoints)
    ck.check_output_not_input(output, paths)
    if output.is_dir():
        raise UserError(f"--output {output} is a directory; give a file name")
    ck.check_output_not_training(output)
    # nor a file of a data or export directory, nor another program's PyTorch checkpoint; an earlier
    # average (an nmtkit inference checkpoint) is replaced
    check_output_file(output, "--output", replace_nmtkit_checkpoint=True)

    with stderr_console().status(plain_text(f"averaging {len(paths)} checkpoint(s)")):
        state = ck.average_checkpoints(paths)
        ck.save_checkpoint(state, output)
    names = ", ".join(p.name for p in paths)
    print(f"averaged {len(paths)} checkpoint(s) of arch {state['arch']} ({names}) -> {output}")


def selected_checkpoints(files: list[Path], inputs: list[Path], num_update: int | None,
                         num_epoch: int | None) -> list[Path]:
    """The checkpoints to average: the last N of one --inputs directory, or the files given,
    positionally or after --inputs (fairseq's `--inputs a.pt b.pt`: the shell gives the second
    file as a positional one), in the order given."""
    from nmtkit import checkpoints as ck

    if num_update is not None or num_epoch is not None or any(p.is_dir() for p in inputs):
        if not inputs:
            raise UserError("--num-update-checkpoints / --num-epoch-checkpoints need --inputs DIR")
        if len(inputs) > 1 or files:
            raise UserError("--inputs DIR picks the last checkpoints of one directory: give it alone, "
                            "or give checkpoint files only (positionally or after --inputs)")
        if (num_update is None) == (num_epoch is None):
            raise UserError("--inputs DIR needs exactly one of --num-update-checkpoints N or --num-epoch-checkpoints N")
        kind, n = ("update", num_update) if num_update is not None else ("epoch", num_epoch)
        return ck.last_checkpoints(inputs[0], n, kind)
    paths = [*inputs, *files]
    if not paths:
        raise UserError("nothing to average: give checkpoint files or --inputs DIR with --num-update-checkpoints N")
    return paths
