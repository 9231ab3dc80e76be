"""When training stops: every stopping rule of `nmtkit train` in one function, `stop_reason`.

Why one function: the rules (--max-update, --max-epoch, --max-time, --patience, --target-bleu, a
signal, --max-nan-skips, and "already done" at start) are checked at four moments of the loop, and
their order decides which reason the log and the final message give when several hold at once.
Keeping them together keeps that order visible and lets fine-tuning reuse it unchanged.

The moments, in the order the loop reaches them:
  "start"     before the first update: a run whose checkpoint already reached --max-update or
              --max-epoch does nothing ("already_done");
  "step"      right after every update, before anything is saved: --max-nan-skips NaN/inf
              updates in a row raise TrainingStopped (checkpoint_last.pt stays the last good one);
  "update"    after an update inside an epoch (and its validation, if one ran): target_bleu and
              patience (only right after a validation), max_update, signal, max_time;
  "epoch_end" after the epoch's validation and checkpoint: target_bleu (when that validation
              ran), max_update, max_epoch, patience, signal, max_time.
The target comes first: a run that reached the quality it was run for says so, whatever else
also holds.
Before an epoch's end, `check_epoch_progress` stops a run whose every batch ran out of memory
(one process skips such batches one by one; without this rule it would start epoch after epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

from nmtkit.training.config import TrainConfig


class TrainingStopped(Exception):
    """Training cannot go on (e.g. repeated NaN losses); checkpoint_last.pt is left as it was."""


@dataclass(frozen=True)
class LoopFlags:
    """Conditions each process sees on its own clock or signal handler, agreed over all ranks.

    They travel in the update's one all-reduce (summed: true on any rank = true on all), so every
    rank stops or saves at the same update.
    """

    signal: bool = False  # SIGINT/SIGTERM received
    time_up: bool = False  # --max-time reached
    timed_save: bool = False  # --save-interval-minutes due

    def as_floats(self) -> list[float]:
        return [float(self.signal), float(self.time_up), float(self.timed_save)]

    @classmethod
    def from_sums(cls, sums: list[float]) -> "LoopFlags":
        return cls(*(bool(x > 0) for x in sums))


def check_epoch_progress(epoch: int, updates: int, oom_skips: int) -> None:
    """TrainingStopped when epoch `epoch` made no update and skipped `oom_skips` > 0 batches for
    lack of memory: every later epoch would do the same."""
    if updates == 0 and oom_skips > 0:
        raise TrainingStopped(f"out of memory on every batch of epoch {epoch} ({oom_skips} skipped, no update made); "
                              "lower --max-tokens")


def stop_reason(cfg: TrainConfig, st, flags: LoopFlags, at: str, *, validated: bool = False,
                finished_epoch: int = 0, bleu: float | None = None) -> str | None:
    """The reason to stop now (the log's `end` reason), or None; see the module docstring.

    `st` is the TrainState; `validated`: a validation ran at this update ("update");
    `finished_epoch`: the epoch that just ended ("epoch_end"); `bleu`: the BLEU of a validation
    that ran at this moment. Raises TrainingStopped ("step").
    """
    target = bool(cfg.target_bleu) and bleu is not None and bleu >= cfg.target_bleu
    max_update = bool(cfg.max_update) and st.update >= cfg.max_update
    patience = bool(cfg.patience) and st.bad_validations >= cfg.patience
    if at == "start":
        return "already_done" if max_update or (cfg.max_epoch and st.epoch > cfg.max_epoch) else None
    if at == "step":
        if st.consecutive_nan >= cfg.max_nan_skips:
            raise TrainingStopped(f"{st.consecutive_nan} updates in a row had a NaN/inf loss or gradient "
                                  f"(--max-nan-skips {cfg.max_nan_skips}); training stopped at update {st.update}")
        return None
    if at == "update":
        rules = [("target_bleu", target), ("patience", patience and validated), ("max_update", max_update)]
    elif at == "epoch_end":
        rules = [("target_bleu", target), ("max_update", max_update),
                 ("max_epoch", bool(cfg.max_epoch) and finished_epoch >= cfg.max_epoch),
                 ("patience", patience)]
    else:
        raise ValueError(f"unknown moment {at!r}")
    rules += [("signal", flags.signal), ("max_time", flags.time_up)]
    return next((why for why, hit in rules if hit), None)
