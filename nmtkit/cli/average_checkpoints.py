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
        None, help="Checkpoint files to average (instead of --inputs).", show_default=False
    ),
    inputs: Optional[Path] = typer.Option(
        None, "--inputs", help="A training --save-dir to pick the last N checkpoints from.", show_default=False
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

    if files and inputs is not None:
        raise UserError("give checkpoint files or --inputs DIR, not both")
    if inputs is not None:
        if (num_update_checkpoints is None) == (num_epoch_checkpoints is None):
            raise UserError("--inputs needs exactly one of --num-update-checkpoints N or --num-epoch-checkpoints N")
        if num_update_checkpoints is not None:
            paths = ck.last_checkpoints(inputs, num_update_checkpoints, "update")
        else:
            paths = ck.last_checkpoints(inputs, num_epoch_checkpoints, "epoch")
    else:
        if num_update_checkpoints is not None or num_epoch_checkpoints is not None:
            raise UserError("--num-update-checkpoints / --num-epoch-checkpoints need --inputs DIR")
        if not files:
            raise UserError("nothing to average: give checkpoint files or --inputs DIR with --num-update-checkpoints N")
        paths = list(files)
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
