"""Learning-rate schedules: the paper's `noam` and fairseq's `inverse_sqrt`.

Both are pure functions of the update number u (1-based: the first optimizer step is u = 1), so
resuming only needs u, and the learning rate of update u is fixed before that update runs:

- noam (paper, section 5.3):
  lr(u) = lr_scale * d_model^-0.5 * min(u^-0.5, u * warmup^-1.5)
  rising linearly for `warmup` updates, then decaying as u^-0.5 (peak at u = warmup).
- inverse_sqrt (fairseq): a linear warmup from warmup_init_lr to the peak `lr` over `warmup`
  updates, then lr * sqrt(warmup / u):
  lr(u) = warmup_init_lr + (lr - warmup_init_lr) * u / warmup    for u <= warmup
  lr(u) = lr * sqrt(warmup / u)                                   for u >  warmup
  fairseq sets the rate for update u from u - 1 completed updates, so its first update runs at
  warmup_init_lr (0 by default, a wasted step); here update u runs at lr(u), one step earlier.
Both need warmup >= 1 (fairseq's inverse_sqrt with warmup 0 silently trains at lr 0).

`start` restarts a schedule in a continued run (`nmtkit train --reset-lr-scheduler` or
`--reset-optimizer`): update u then runs at lr(u - start), so warmup begins again from the update
the run resumed at, while the update counter itself keeps counting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule; `lr(u)` is the rate for update number u >= 1."""

    name: str  # "noam" | "inverse_sqrt"
    warmup: int
    d_model: int = 512  # noam only
    lr_scale: float = 1.0  # noam only
    peak_lr: float = 5e-4  # inverse_sqrt only
    warmup_init_lr: float = 0.0  # inverse_sqrt only
    start: int = 0  # updates before the schedule's own update 1 (a reset in a continued run)

    def __post_init__(self):
        if self.name not in ("noam", "inverse_sqrt"):
            raise ValueError(f"unknown lr scheduler {self.name!r} (choose noam or inverse_sqrt)")
        if self.warmup < 1:
            raise ValueError(f"warmup must be >= 1, got {self.warmup}")

    def lr(self, update: int) -> float:
        u = max(int(update) - self.start, 1)
        if self.name == "noam":
            return self.lr_scale * self.d_model**-0.5 * min(u**-0.5, u * self.warmup**-1.5)
        if u <= self.warmup:
            return self.warmup_init_lr + (self.peak_lr - self.warmup_init_lr) * u / self.warmup
        return self.peak_lr * math.sqrt(self.warmup / u)

    def state_dict(self) -> dict:
        """Stored in checkpoints so a resumed run can say if the schedule was changed."""
        return {
            "name": self.name,
            "warmup": self.warmup,
            "d_model": self.d_model,
            "lr_scale": self.lr_scale,
            "peak_lr": self.peak_lr,
            "warmup_init_lr": self.warmup_init_lr,
            "start": self.start,
        }
