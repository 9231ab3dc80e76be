"""`nmtkit train DATA_DIR --arch NAME --save-dir DIR`: flags only; the work is nmtkit.training.trainer.

The flags are TrainConfig's fields (nmtkit/training/config.py holds their defaults and help) plus
one per ArchConfig field (nmtkit.cli.arch_options).
"""

from __future__ import annotations

import signal
from typing import Optional

import typer

from nmtkit.cli.app import app
from nmtkit.cli.arch_options import with_arch_options
from nmtkit.cli.options import with_settings
from nmtkit.training.config import TrainConfig

STOP_MESSAGES = {
    "max_update": "reached --max-update", "max_epoch": "reached --max-epoch", "max_time": "reached --max-time",
    "signal": "interrupted; run the same command to resume",
    "already_done": "nothing to do: the checkpoint already reached the stopping rule",
}


@app.command("train")
@with_arch_options(exclude=("warmup_steps",))  # --warmup-updates (a TrainConfig field) sets it
@with_settings(TrainConfig)
def train_cmd(cfg: TrainConfig, arch_overrides: Optional[dict] = None) -> None:
    """Train a Transformer on a preprocessed data directory (resumes from SAVE_DIR/checkpoint_last.pt)."""
    from nmtkit.training.trainer import train

    cfg = cfg.with_arch_overrides(arch_overrides)
    result = train(cfg)
    best = f"; best {cfg.best_checkpoint_metric} {result.best:.4f}" if result.best is not None else ""
    messages = STOP_MESSAGES | {"patience": f"no improvement in {cfg.patience} validations (--patience)",
                                "target_bleu": f"validation BLEU reached --target-bleu {cfg.target_bleu:g}"}
    print(f"{messages.get(result.reason, result.reason)}: update {result.update}, epoch {result.epoch}{best}; "
          f"checkpoints in {cfg.save_dir}")
    if result.reason == "signal":
        # 128 + signal number, as a shell reports a process stopped by it; checkpoint_last.pt is saved.
        raise typer.Exit(128 + int(signal.SIGTERM if result.interrupted_by == signal.SIGTERM else signal.SIGINT))
