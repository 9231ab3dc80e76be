"""`TrainConfig`: every `nmtkit train` setting except the architecture, validated up front.

Why a dataclass of plain values: the same object drives the CLI, the tests and DDP workers, it
is stored in checkpoints as a plain dict (`train_args`), and `validate()` refuses an impossible
combination with a message naming the flag before any data is read or any model is built.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from nmtkit.errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16")
SCHEDULERS = ("noam", "inverse_sqrt")
BEST_METRICS = ("loss", "bleu")


@dataclass
class TrainConfig:
    """Training settings; field names are the flags without `--` (docs/train.md has them all)."""

    data_dir: str
    save_dir: str
    arch: str = "transformer_base"
    arch_overrides: dict[str, Any] = field(default_factory=dict)  # ArchConfig fields the user set
    # data
    max_tokens: int | None = 4096
    batch_size: int | None = None
    update_freq: int = 1
    train_subset: str = "train"
    valid_subset: str = "valid"
    # optimization
    lr_scheduler: str = "noam"
    lr_scale: float = 1.0
    lr: float = 5e-4
    warmup_updates: int | None = None  # None: the architecture's warmup_steps
    warmup_init_lr: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    # precision and device
    precision: str = "fp32"
    compile: bool = False
    device: str = "auto"
    threads: int | None = None
    seed: int = 1
    # stopping
    max_update: int = 0
    max_epoch: int = 0
    max_time: float = 0.0  # seconds of training (summed over resumed runs); 0 = no limit
    # validation
    validate_interval_updates: int = 0
    no_validate: bool = False
    patience: int = 0
    eval_bleu: bool = False
    eval_bleu_beam: int = 1
    eval_bleu_lenpen: float = 0.6
    eval_bleu_max_len_a: float = 1.2
    eval_bleu_max_len_b: int = 10
    best_checkpoint_metric: str = "loss"
    ema_decay: float = 0.0
    # checkpoints
    save_interval_updates: int = 0
    save_interval_minutes: float = 0.0
    keep_last_updates: int = 0
    keep_last_epochs: int = 0
    no_epoch_checkpoints: bool = False
    # robustness and logging
    max_nan_skips: int = 10
    log_interval: int = 100
    progress_bar: bool = True
    log_file: str = "train_log.jsonl"
    prefetch: bool | None = None  # collate the next update in a thread; None = on for CUDA only

    def validate(self) -> "TrainConfig":
        """Raise UserError naming the first bad flag; return self."""

        def positive(name: str, allow_none: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if v is None or v <= 0:
                raise UserError(f"{flag(name)} must be > 0, got {v}")

        def non_negative(name: str) -> None:
            v = getattr(self, name)
            if v < 0 or (isinstance(v, float) and math.isnan(v)):
                raise UserError(f"{flag(name)} must be >= 0, got {v}")

        if self.max_tokens is None and self.batch_size is None:
            raise UserError("give --max-tokens or --batch-size (or both)")
        positive("max_tokens", allow_none=True)
        positive("batch_size", allow_none=True)
        positive("update_freq")
        if self.lr_scheduler not in SCHEDULERS:
            raise UserError(f"--lr-scheduler must be one of {', '.join(SCHEDULERS)}, got {self.lr_scheduler!r}")
        positive("lr_scale")
        positive("lr")
        if self.warmup_updates is not None and self.warmup_updates < 1:
            raise UserError(f"--warmup-updates must be >= 1, got {self.warmup_updates}")
        non_negative("warmup_init_lr")
        b1, b2 = self.adam_betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise UserError(f"--adam-betas must both be in [0, 1), got {b1},{b2}")
        positive("adam_eps")
        non_negative("weight_decay")
        non_negative("clip_norm")
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        positive("threads", allow_none=True)
        for name in ("max_update", "max_epoch", "max_time", "validate_interval_updates", "patience",
                     "save_interval_updates", "save_interval_minutes", "keep_last_updates", "keep_last_epochs"):
            non_negative(name)
        positive("eval_bleu_beam")
        non_negative("eval_bleu_max_len_a")
        non_negative("eval_bleu_max_len_b")
        if self.best_checkpoint_metric not in BEST_METRICS:
            raise UserError(
                f"--best-checkpoint-metric must be one of {', '.join(BEST_METRICS)}, got {self.best_checkpoint_metric!r}"
            )
        if self.best_checkpoint_metric == "bleu" and not self.eval_bleu:
            raise UserError("--best-checkpoint-metric bleu needs --eval-bleu")
        if self.no_validate and (self.patience or self.eval_bleu or self.validate_interval_updates):
            raise UserError("--no-validate cannot be combined with --patience, --eval-bleu or --validate-interval-updates")
        if not 0.0 <= self.ema_decay < 1.0:
            raise UserError(f"--ema-decay must be in [0, 1), got {self.ema_decay}")
        positive("max_nan_skips")
        positive("log_interval")
        if self.train_subset == self.valid_subset:
            raise UserError(f"--valid-subset must differ from --train-subset ({self.train_subset!r})")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (stored in checkpoints, loaded with weights_only=True)."""
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        d["arch_overrides"] = {k: v for k, v in self.arch_overrides.items() if v is not None}
        return d


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhd]?)\s*$")


def parse_duration(text: str, flag_name: str = "--max-time") -> float:
    """Seconds from '3600', '90s', '45m', '12h', '2d' or 'H:MM[:SS]'; UserError otherwise."""
    t = str(text).strip()
    if ":" in t:
        parts = t.split(":")
        if len(parts) in (2, 3) and all(p.isdigit() for p in parts):
            nums = [int(p) for p in parts] + ([0] if len(parts) == 2 else [])
            return float(nums[0] * 3600 + nums[1] * 60 + nums[2])
    else:
        m = _DURATION.match(t)
        if m:
            scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
            return float(m.group(1)) * scale
    raise UserError(f"{flag_name} expects a duration like 3600, 90m, 12h, 2d or 1:30:00, got {text!r}")


def parse_betas(text: str) -> tuple[float, float]:
    """'0.9,0.98' or '(0.9, 0.98)' -> (0.9, 0.98); UserError otherwise."""
    t = str(text).strip().strip("()[]")
    try:
        parts = [float(x) for x in t.replace(" ", "").split(",")]
    except ValueError:
        parts = []
    if len(parts) != 2:
        raise UserError(f"--adam-betas expects two numbers like 0.9,0.98, got {text!r}")
    return parts[0], parts[1]
