"""What training shows and records: a rich progress bar on stderr and a JSON-lines log file.

Why both: the bar is for the person watching (epoch, update, loss, ppl, lr, target tokens/s,
ETA); the log (`SAVE_DIR/train_log.jsonl`, one JSON object per line, appended across resumed runs)
is for tools: `nmtkit plot`, benchmarks, and anyone who wants the numbers. Only rank 0 reports.

Log records (every record has "type", "time" (UTC ISO) and "update"):
    {"type": "start", "resumed": bool, "arch": ..., "params": N, "world_size": W, "device": ...}
    {"type": "train", "epoch", "update", "loss", "nll_loss", "ppl", "lr", "gnorm", "tgt_tokens",
     "sentences", "updates", "wall_s", "tgt_tok_per_s", "loss_scale" (fp16)}
        loss / nll_loss: bits per target token (with / without label smoothing), averaged over
        the `updates` updates since the previous train record; ppl = 2 ** nll_loss
    {"type": "valid", "epoch", "update", "loss", "nll_loss", "ppl", "tgt_tokens", "bleu" (with
     --eval-bleu), "best", "bad_validations", "weights": "raw" | "ema"}
        multilingual: the figures are the unweighted means over the validated directions (tokens
        summed), and "directions": {"de-en": {"loss", "nll_loss", "ppl", "tgt_tokens", "bleu"}, ...}
    {"type": "epoch", "epoch", "batches", "padding": {"fraction", "source", "target"}}
        one per later epoch of a run; the start record holds "padding" of the epoch it starts in
    {"type": "skip", "reason": "nan" | "oom" | "fp16_overflow", ...}
    {"type": "checkpoint", "files": [...], "seconds": s}
    {"type": "end", "reason": "max_update" | "max_epoch" | "max_time" | "patience" | "target_bleu" | "signal" | ...}

With --tensorboard-logdir the train and valid records are also TensorBoard scalars (TB_TRAIN,
TB_VALID: train/loss, train/nll_loss, train/ppl, train/lr, train/gnorm, train/tgt_tok_per_s,
valid/loss, valid/nll_loss, valid/ppl, valid/bleu, valid/best; a multilingual run also
valid/DIR/loss, valid/DIR/nll_loss, valid/DIR/ppl, valid/DIR/bleu per direction) at step = update.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

from nmtkit.console import stderr_console, text_column

from nmtkit.io import reporting_disk_full


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so every line stays valid JSON (also inside a
    record's objects, e.g. a valid record's directions)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return v


class JsonlLog:
    """Appends one JSON object per line and flushes, so a crash loses at most the current line.

    With `tensorboard` (a TensorBoardLog), the train and valid records also become TensorBoard
    scalars: one writer of the numbers, two formats.
    """

    def __init__(self, path: str | os.PathLike | None, tensorboard: "TensorBoardLog | None" = None):
        self.path = Path(path) if path else None
        self._fh = None
        if self.path:
            with reporting_disk_full(self.path):
                self._fh = open(self.path, "a", encoding="utf-8")
        self.tensorboard = tensorboard

    def write(self, record: dict) -> None:
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        if self._fh is None:
            return
        rec = {"type": record.get("type"), "time": _now(), **{k: _clean(v) for k, v in record.items()}}
        with reporting_disk_full(self.path):
            self._fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


# TensorBoard tags: train record key -> tag, valid record key -> tag (the JSON log's numbers)
TB_TRAIN = {"loss": "train/loss", "nll_loss": "train/nll_loss", "ppl": "train/ppl", "lr": "train/lr",
            "gnorm": "train/gnorm", "tgt_tok_per_s": "train/tgt_tok_per_s", "loss_scale": "train/loss_scale"}
TB_VALID = {"loss": "valid/loss", "nll_loss": "valid/nll_loss", "ppl": "valid/ppl", "bleu": "valid/bleu",
            "best": "valid/best"}
TB_DIRECTION = ("loss", "nll_loss", "ppl", "bleu")  # a multilingual valid record's directions: valid/DIR/KEY


def require_tensorboard():
    """torch.utils.tensorboard's SummaryWriter, or a one-line UserError naming the extra to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from nmtkit.errors import UserError

        raise UserError("--tensorboard-logdir needs the tensorboard package: pip install -e '.[tensorboard]' in the nmtkit checkout") from None
    return SummaryWriter


class TensorBoardLog:
    """The train and valid log records as TensorBoard scalars, at step = the update number.

    `purge_step` (the first update this run makes): TensorBoard hides the points at that step
    and later that an earlier, interrupted run wrote to the same folder after its last
    checkpoint, so a resumed run continues the same curves without a zigzag.
    """

    def __init__(self, logdir: str | os.PathLike, purge_step: int | None = None):
        self.writer = require_tensorboard()(log_dir=str(logdir), purge_step=purge_step)

    def write(self, record: dict) -> None:
        tags = {"train": TB_TRAIN, "valid": TB_VALID}.get(record.get("type"))
        if tags is None:
            return
        step = int(record["update"])
        self._scalars(record, tags, step)
        for name, figures in (record.get("directions") or {}).items():  # valid/de-en/loss, ...
            self._scalars(figures, {k: f"valid/{name}/{k}" for k in TB_DIRECTION}, step)
        self.writer.flush()

    def _scalars(self, record: dict, tags: dict[str, str], step: int) -> None:
        for key, tag in tags.items():
            v = record.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                self.writer.add_scalar(tag, v, global_step=step)

    def close(self) -> None:
        self.writer.close()


def read_log(path: str | os.PathLike) -> list[dict]:
    """Records of a train log, with the ones a resumed run redid removed.

    A resumed run restarts from its checkpoint's update U and logs a "start" record with
    "update": U; records of the interrupted run with update > U were lost with that run and are
    dropped, so every update appears once. Unparseable lines (a crash mid-write) are skipped.
    """
    records: list[dict] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict):
                continue
            if rec.get("type") == "start" and rec.get("resumed"):
                u = rec.get("update", 0)
                records = [r for r in records if r.get("type") in ("start", "end")
                           or not isinstance(r.get("update"), int) or r["update"] <= u]
            records.append(rec)
    return records


class TrainProgress:
    """The training progress display: a rich bar on a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool, total_updates: int | None, start_update: int, console: Console | None = None):
        self.console = console or stderr_console()
        self.live = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        self._task = None
        if self.live:
            self._progress = Progress(
                text_column("epoch {task.fields[epoch]}"),
                BarColumn(bar_width=24),
                text_column("update {task.completed:.0f}{task.fields[of]}"),
                text_column("loss {task.fields[loss]} ppl {task.fields[ppl]} lr {task.fields[lr]}"),
                text_column("{task.fields[tps]} tgt tok/s"),
                TimeElapsedColumn(),
                text_column("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
                refresh_per_second=4,
            )
            self._task = self._progress.add_task(
                "train", total=total_updates, completed=start_update, epoch="-", loss="-", ppl="-", lr="-",
                tps="-", of=f"/{total_updates}" if total_updates else "",
            )
            self._progress.start()

    def update(self, update: int, epoch: int, stats: dict | None = None, lr: float | None = None) -> None:
        if self._progress is None:
            return
        fields: dict[str, Any] = {"epoch": epoch}
        if lr is not None:
            fields["lr"] = f"{lr:.3g}"
        if stats:
            fields.update(loss=f"{stats['loss']:.3f}", ppl=f"{stats['ppl']:.2f}", tps=f"{stats['tgt_tok_per_s']:.0f}")
        self._progress.update(self._task, completed=update, **fields)

    def line(self, text: str, style: str | None = None) -> None:
        """A message above the bar (or a plain stderr line without a terminal)."""
        if self._progress is not None:
            self._progress.console.print(text, style=style, markup=False, emoji=False, highlight=False)
        else:
            self.console.print(text, style=style, markup=False, emoji=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
