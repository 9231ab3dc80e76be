"""`nmtkit plot SAVE_DIR`: training curves (loss, ppl, lr, validation) from train_log.jsonl as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from nmtkit.cli.app import app


@app.command("plot")
def plot_cmd(
    save_dir: Path = typer.Argument(..., metavar="SAVE_DIR", help="A training --save-dir (or its train_log.jsonl)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="PNG to write [default: SAVE_DIR/train_curves.png].", show_default=False),
) -> None:
    """Plot loss, perplexity, learning rate and validation curves of a training run."""
    from nmtkit.figures.curves import plot_training

    print(plot_training(save_dir, output))
