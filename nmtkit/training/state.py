"""The trainer's bookkeeping: what a checkpoint restores (`TrainState`) and what one run keeps
(`LoopState`, with the log interval's sums in `Interval`).

Why two dataclasses: TrainState is saved verbatim in every checkpoint (`train.state`; its field
names are the format, so they do not change) and survives a resume; LoopState is rebuilt at each
start (clocks, which update was last saved or validated, pending flags) and is never saved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nmtkit.training.loss import bits_per_token, perplexity
from nmtkit.training.stopping import LoopFlags


@dataclass
class TrainState:
    """Everything about training progress that a checkpoint restores (besides tensors)."""

    update: int = 0  # optimizer steps applied
    epoch: int = 1  # the epoch being consumed (1-based)
    batch_offset: int = 0  # this rank's batches of `epoch` already consumed
    last_epoch_done: int = 0  # the epoch of the last applied update (names checkpoints)
    best: float | None = None
    bad_validations: int = 0
    nan_skips: int = 0
    consecutive_nan: int = 0
    oom_skips: int = 0
    overflow_skips: int = 0
    elapsed_s: float = 0.0  # training wall time over all runs (for --max-time)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def count(self, out) -> None:
        """Count one update's outcome (a step.StepResult): applied, or skipped for a reason."""
        if out.applied:
            self.update += 1
            self.last_epoch_done = self.epoch
            self.consecutive_nan = 0
        elif out.skip == "nan":
            self.nan_skips += 1
            self.consecutive_nan += 1
        elif out.skip == "oom":
            self.oom_skips += 1
        elif out.skip == "fp16_overflow":
            self.overflow_skips += 1


class Interval:
    """Sums over the updates since the last train log record."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = 0.0
        self.ntokens = self.nsentences = self.updates = 0
        self.gnorm = 0.0
        self.t0 = time.perf_counter()

    def add(self, out) -> None:
        """Add an applied update (a step.StepResult)."""
        self.loss += out.loss_sum
        self.nll += out.nll_sum
        self.ntokens += out.ntokens
        self.nsentences += out.nsentences
        self.gnorm += out.gnorm
        self.updates += 1

    def record(self, st: TrainState, lr: float, loss_scale: float | None, peak_rss_mib: float | None) -> dict:
        """The `train` log record of the interval (losses in bits per target token); resets the sums."""
        wall = time.perf_counter() - self.t0
        nll_bits = bits_per_token(self.nll, self.ntokens)
        rec = {"type": "train", "epoch": st.last_epoch_done, "update": st.update,
               "loss": bits_per_token(self.loss, self.ntokens), "nll_loss": nll_bits, "ppl": perplexity(nll_bits),
               "lr": lr, "gnorm": self.gnorm / max(self.updates, 1), "tgt_tokens": self.ntokens,
               "sentences": self.nsentences, "updates": self.updates, "wall_s": round(wall, 4),
               "tgt_tok_per_s": self.ntokens / wall if wall > 0 else 0.0}
        if loss_scale is not None:
            rec["loss_scale"] = loss_scale
        rec["peak_rss_mib"] = peak_rss_mib
        self.reset()
        return rec


@dataclass
class LoopState:
    """One run's bookkeeping (never saved): clocks, last save/validation, pending flags and signal."""

    elapsed_base: float  # training seconds of earlier runs (TrainState.elapsed_s at start)
    saved_at_update: int  # the update checkpoint_last.pt holds (-1: none written by this run)
    last_valid_update: int  # the update of the last validation (-1: none)
    t_start: float = field(default_factory=time.monotonic)
    last_timed_save: float = 0.0  # monotonic time of the last --save-interval-minutes checkpoint
    flags: LoopFlags = LoopFlags()  # as agreed over ranks at the last update
    best_pending: bool = False  # a validation improved; checkpoint_best.pt is written at the next save
    signal: int | None = None  # the first SIGINT/SIGTERM received
    interval: Interval = field(default_factory=Interval)

    def __post_init__(self) -> None:
        self.last_timed_save = self.last_timed_save or self.t_start

    def elapsed(self) -> float:
        """Training seconds over all runs so far (what --max-time limits)."""
        return self.elapsed_base + (time.monotonic() - self.t_start)

    def local_flags(self, max_time: float, save_interval_minutes: float) -> LoopFlags:
        """This process's view of the flags (before they are agreed over ranks)."""
        now = time.monotonic()
        return LoopFlags(signal=self.signal is not None,
                         time_up=bool(max_time) and self.elapsed() >= max_time,
                         timed_save=bool(save_interval_minutes) and
                         (now - self.last_timed_save) >= 60 * save_interval_minutes)
