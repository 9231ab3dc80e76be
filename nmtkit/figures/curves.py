"""Training curves from SAVE_DIR/train_log.jsonl as one PNG (`nmtkit plot`).

Four panels over the update number: loss (bits per target token: train with and without label
smoothing, validation without), perplexity (log scale, train and validation), learning rate, and
validation BLEU when the run used --eval-bleu (target tokens/s otherwise). matplotlib is an
optional dependency (`pip install -e '.[plot]' in the nmtkit checkout`); training never imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from nmtkit.errors import UserError
from nmtkit.io import atomic_write
from nmtkit.outputs import check_output_file
from nmtkit.training.report import read_log

LOG_NAME = "train_log.jsonl"


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _series(records: list[dict], key: str) -> tuple[list, list[float]]:
    """(updates, values) of `key` over `records`; a missing or non-numeric value is NaN (a gap)."""
    return [r["update"] for r in records], [_num(r.get(key)) for r in records]


def _train_and_valid(ax, title: str, train: list[dict], valid: list[dict],
                     train_keys: list[tuple[str, str]], valid_key: tuple[str, str]) -> None:
    """One panel with the training curves (`train_keys`: (key, label) pairs) as plain lines and
    the validation curve (`valid_key`) marked at each validation, on the same axes so that
    over-fitting shows as the two drifting apart. A run that has not validated yet has none."""
    for key, label in train_keys:
        ax.plot(*_series(train, key), label=label, lw=1)
    if valid:
        key, label = valid_key
        ax.plot(*_series(valid, key), "o-", label=label, ms=3)
    ax.set_title(title)
    ax.legend()


def log_and_output(save_dir: Path, output: str | os.PathLike | None) -> tuple[Path, Path]:
    """(the train log, the PNG to write), checked: the output is never the log itself, a
    checkpoint (the save dir holds them), a directory or a data or export directory's file."""
    log = save_dir / LOG_NAME if save_dir.is_dir() else save_dir
    if not log.is_file():
        raise UserError(f"no training log: {log} not found (is {save_dir} an 'nmtkit train --save-dir'?)")
    out = Path(output) if output else (log.parent / "train_curves.png")
    check_output_file(out, "--output", [("the training log", log)])
    return log, out


def plot_training(save_dir: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """Write the curves of SAVE_DIR's train log to `output` (default SAVE_DIR/train_curves.png)."""
    save_dir = Path(save_dir)
    log, out = log_and_output(save_dir, output)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("nmtkit plot needs matplotlib: pip install -e '.[plot]' in the nmtkit checkout (or pip install matplotlib)") from None
    recs = read_log(log)
    train = [r for r in recs if r.get("type") == "train"]
    valid = [r for r in recs if r.get("type") == "valid"]
    if not train and not valid:
        raise UserError(f"{log}: no train or valid records to plot yet")

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    _train_and_valid(axes[0][0], "loss", train, valid,
                     [("loss", "train loss (label-smoothed)"), ("nll_loss", "train nll")], ("nll_loss", "valid nll"))
    axes[0][0].set_ylabel("bits / target token")
    _train_and_valid(axes[0][1], "perplexity", train, valid, [("ppl", "train ppl")], ("ppl", "valid ppl"))
    axes[0][1].set_yscale("log")
    ax = axes[1][0]
    ax.plot(*_series(train, "lr"), lw=1)
    ax.set_title("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax = axes[1][1]
    bleu = [r for r in valid if "bleu" in r]
    if bleu:
        ax.plot(*_series(bleu, "bleu"), "o-", ms=3)
        ax.set_title("validation BLEU (sacreBLEU)")
    else:
        ax.plot(*_series(train, "tgt_tok_per_s"), lw=1)
        ax.set_title("target tokens / s")
    for row in axes:
        for a in row:
            a.set_xlabel("update")
            a.grid(alpha=0.3)
    fig.suptitle(str(save_dir))
    with atomic_write(out, "wb") as fh:
        fig.savefig(fh, format="png", dpi=100)
    plt.close(fig)
    return out
