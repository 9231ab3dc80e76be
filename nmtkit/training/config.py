"""`TrainConfig`: every `nmtkit train` setting except the architecture, validated up front.

Why a dataclass of plain values: the same object drives the CLI, the tests and DDP workers, it
is stored in checkpoints as a plain dict (`train_args`), and `validate()` refuses an impossible
combination with a message naming the flag before any data is read or any model is built.
Each field also carries its flag, help text and help panel (`nmtkit.settings.setting`): `nmtkit
train` is generated from the dataclass (`nmtkit.cli.options.with_settings`), so a default is
written once, here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from nmtkit.device import check_precision
from nmtkit.errors import UserError
from nmtkit.settings import check_numbers, negate, none_if_zero, setting, to_str

SCHEDULERS = ("noam", "inverse_sqrt")
BEST_METRICS = ("loss", "bleu")


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


def parse_max_time(text: str | None) -> float:
    """--max-time: None (not given) = 0.0, no limit; else seconds (see parse_duration)."""
    return parse_duration(text) if text else 0.0


def parse_ddp_timeout(text: str) -> float:
    """--ddp-timeout: seconds (see parse_duration)."""
    return parse_duration(text, "--ddp-timeout")



# Help panels of `nmtkit train --help`.
P_DATA = "Data and batching"
P_OPT = "Optimization"
P_DEV = "Device and precision"
P_STOP = "Stopping"
P_VALID = "Validation"
P_CKPT = "Checkpoints"
P_LOG = "Logging and robustness"
P_FT = "Fine-tuning and continued training"


@dataclass
class TrainConfig:
    """Training settings: each field's flag, default and help text are here (docs/train.md)."""

    data_dir: str = setting(flag="data_dir", argument=True, cli_type=Path, parse=to_str,
                            help="A data directory written by 'nmtkit preprocess'.")
    save_dir: str = setting(flag="--save-dir", cli_type=Path, parse=to_str, help="Checkpoints and train_log.jsonl go here; if it holds checkpoint_last.pt, training resumes from it.")
    # None: transformer_base, or the checkpoint's architecture when resuming or fine-tuning
    arch: str | None = setting(None, flag="--arch", show_default=False, help="Named architecture (see 'nmtkit archs'); the flags in the Architecture panel override its fields [default: transformer_base; when resuming or fine-tuning, the checkpoint's].")
    # ArchConfig fields the user set: the train command's Architecture flags (nmtkit.cli.arch_options)
    arch_overrides: dict[str, Any] = field(default_factory=dict)
    # data
    max_tokens: int | None = setting(4096, flag="--max-tokens", parse=none_if_zero, panel=P_DATA, help="Token budget per batch and process: sentences x longest side (+1), padding included.")
    batch_size: int | None = setting(None, flag="--batch-size", panel=P_DATA, show_default=False, help="At most this many sentence pairs per batch.")
    update_freq: int = setting(1, flag="--update-freq", panel=P_DATA, help="Accumulate gradients over K batches per update (per process).")
    train_subset: str = setting("train", flag="--train-subset", panel=P_DATA, help="Split of DATA_DIR to train on; in a multilingual directory the kind, each pair's SPLIT.SRC-TGT.")
    valid_subset: str = setting("valid", flag="--valid-subset", panel=P_DATA, help="Split of DATA_DIR to validate on; in a multilingual directory the kind, each pair's SPLIT.SRC-TGT.")
    # multilingual data directories (nmtkit.data.languages, nmtkit.data.sampling)
    lang_pairs: str | None = setting(None, flag="--lang-pairs", panel=P_DATA, show_default=False, help="Multilingual DATA_DIR: train on these of its pairs only, e.g. de-en,fr-en [default: all its pairs].")
    sampling_temperature: float = setting(5.0, flag="--sampling-temperature", panel=P_DATA, help="Multilingual DATA_DIR: each epoch samples pair p in proportion to n_p^(1/T) (n_p: its training sentences); 1 = proportional to the data, larger = closer to uniform; 5 as Arivazhagan et al. 2019.")
    # optimization
    lr_scheduler: str = setting("noam", flag="--lr-scheduler", panel=P_OPT, help="noam (the paper: lr-scale * d_model^-0.5 * min(u^-0.5, u * warmup^-1.5)) or inverse_sqrt (fairseq: linear warmup to --lr, then --lr * sqrt(warmup/u)).")
    lr_scale: float = setting(1.0, flag="--lr-scale", panel=P_OPT, help="noam: multiplies the paper's learning rate.")
    lr: float = setting(5e-4, flag="--lr", panel=P_OPT, help="inverse_sqrt: the peak learning rate, reached after warmup.")
    # None: the architecture's warmup_steps (see with_arch_overrides)
    warmup_updates: int | None = setting(None, flag="--warmup-updates", panel=P_OPT, show_default=False, help="Warmup updates of either schedule; sets the architecture's warmup_steps field [default: the architecture's, 4000 for the paper's models].")
    warmup_init_lr: float = setting(0.0, flag="--warmup-init-lr", panel=P_OPT, help="inverse_sqrt: learning rate at update 0 of the warmup.")
    adam_betas: tuple[float, float] = setting((0.9, 0.98), flag="--adam-betas", cli_type=str, cli_default="0.9,0.98", parse=parse_betas, panel=P_OPT, help="Adam beta1,beta2.")
    adam_eps: float = setting(1e-9, flag="--adam-eps", panel=P_OPT, help="Adam epsilon.")
    weight_decay: float = setting(0.0, flag="--weight-decay", panel=P_OPT, help="Decoupled weight decay (AdamW); 0 = plain Adam as in the paper.")
    clip_norm: float = setting(0.0, flag="--clip-norm", panel=P_OPT, help="Clip the gradient's global L2 norm to this; 0 = no clipping (the paper).")
    # precision and device
    precision: str = setting("fp32", flag="--precision", panel=P_DEV, help="fp32, bf16 (autocast) or fp16 (autocast + dynamic loss scaling).")
    compile: bool = setting(False, flag="--compile", panel=P_DEV, help="torch.compile the model (slow first steps, faster afterwards).")
    device: str = setting("auto", flag="--device", panel=P_DEV, help="auto (CUDA if available), cpu, cuda (this process's LOCAL_RANK under torchrun), cuda:N or mps.")
    threads: int | None = setting(None, flag="--threads", panel=P_DEV, show_default=False, help="CPU threads for torch [default: torch's choice].")
    seed: int = setting(1, flag="--seed", panel=P_DEV, help="Seed for initialization, dropout and batch shuffling.")
    # seconds; torch's own default is 30 minutes of silence before anything is reported
    ddp_timeout: float = setting(300.0, flag="--ddp-timeout", cli_type=str, cli_default="5m", parse=parse_ddp_timeout, panel=P_DEV, help="Several processes: how long a collective (an update's all-reduce, a checkpoint's barrier) waits for the other processes; then each waiting process stops with one line naming the collective and the ranks: 300, 90s, 5m.")
    # stopping
    max_update: int = setting(0, flag="--max-update", panel=P_STOP, help="Stop after this many updates; 0 = no limit.")
    max_epoch: int = setting(0, flag="--max-epoch", panel=P_STOP, help="Stop after this many epochs; 0 = no limit.")
    # seconds of training (summed over resumed runs); 0 = no limit
    max_time: float = setting(0.0, flag="--max-time", cli_type=Optional[str], cli_default=None, parse=parse_max_time, panel=P_STOP, show_default=False, help="Stop after this much training time over all runs: 3600, 90m, 12h, 2d or 1:30:00.")
    # validation
    validate_interval_updates: int = setting(0, flag="--validate-interval-updates", panel=P_VALID, help="Also validate every N updates (always at each epoch end); 0 = epoch ends only.")
    no_validate: bool = setting(False, flag="--no-validate", panel=P_VALID, help="Never validate.")
    patience: int = setting(0, flag="--patience", panel=P_VALID, help="Stop after N validations in a row without improvement of --best-checkpoint-metric; 0 = never.")
    eval_bleu: bool = setting(False, flag="--eval-bleu", panel=P_VALID, help="Also decode the valid split and compute sacreBLEU at each validation.")
    eval_bleu_beam: int = setting(1, flag="--eval-bleu-beam", panel=P_VALID, help="Beam size for --eval-bleu (1 = greedy).")
    eval_bleu_lenpen: float = setting(0.6, flag="--eval-bleu-lenpen", panel=P_VALID, help="Length penalty alpha (GNMT form) for --eval-bleu with a beam.")
    eval_bleu_decoding: str = setting("paper", flag="--eval-bleu-decoding", panel=P_VALID, help="--eval-bleu's length penalty and stopping rule, as generate's --decoding: paper (GNMT penalty, exact stopping) or fairseq (|Y|^alpha, stop once --eval-bleu-beam hypotheses finished).")
    eval_bleu_max_len_a: float = setting(1.2, flag="--eval-bleu-max-len-a", panel=P_VALID, help="--eval-bleu output limit: a * source length + b.")
    eval_bleu_max_len_b: int = setting(10, flag="--eval-bleu-max-len-b", panel=P_VALID, help="--eval-bleu output limit: a * source length + b.")
    target_bleu: float = setting(0.0, flag="--target-bleu", panel=P_VALID, help="Stop once a validation's BLEU (--eval-bleu; the mean over directions when multilingual) reaches this: time to quality, as MLPerf's translation benchmark measures it. 0 = never.")
    best_checkpoint_metric: str = setting("loss", flag="--best-checkpoint-metric", panel=P_VALID, help="loss (validation nll, lower is better) or bleu (needs --eval-bleu) chooses checkpoint_best.pt and drives --patience.")
    ema_decay: float = setting(0.0, flag="--ema-decay", panel=P_VALID, help="Keep an exponential moving average of the weights with this decay (e.g. 0.9999); validation then uses it. 0 = off.")
    # checkpoints
    save_interval_updates: int = setting(0, flag="--save-interval-updates", panel=P_CKPT, help="Write checkpoint_EPOCH_UPDATE.pt every N updates; 0 = off.")
    save_interval_minutes: float = setting(0.0, flag="--save-interval-minutes", panel=P_CKPT, help="Write checkpoint_EPOCH_UPDATE.pt every M minutes (the paper: 10); 0 = off.")
    keep_last_updates: int = setting(0, flag="--keep-last-updates", panel=P_CKPT, help="Keep only the newest N checkpoint_EPOCH_UPDATE.pt; 0 = keep all.")
    keep_last_epochs: int = setting(0, flag="--keep-last-epochs", panel=P_CKPT, help="Keep only the newest N checkpointEPOCH.pt; 0 = keep all.")
    no_epoch_checkpoints: bool = setting(False, flag="--no-epoch-checkpoints", panel=P_CKPT, help="Do not write checkpointEPOCH.pt (checkpoint_last.pt is still updated).")
    # robustness and logging
    log_interval: int = setting(100, flag="--log-interval", panel=P_LOG, help="Log training statistics every N updates.")
    progress_bar: bool = setting(True, flag="--no-progress-bar", cli_type=bool, cli_default=False, parse=negate, panel=P_LOG, help="Plain log lines instead of the progress bar.")
    max_nan_skips: int = setting(10, flag="--max-nan-skips", panel=P_LOG, help="Stop after this many NaN/inf updates in a row (each is skipped).")
    tensorboard_logdir: str | None = setting(None, flag="--tensorboard-logdir", cli_type=Optional[Path], parse=to_str, panel=P_LOG, show_default=False, help="Also write the training and validation curves as TensorBoard scalars here (needs the tensorboard extra); a resumed run continues them.")
    # fine-tuning and continued training (nmtkit/training/start.py)
    finetune_from_model: str | None = setting(None, flag="--finetune-from-model", cli_type=Optional[Path], parse=to_str, panel=P_FT, show_default=False, help="Start a new run (update 0, fresh optimizer, schedule and data position) from the weights of this training or inference checkpoint; ignored when SAVE_DIR already holds checkpoint_last.pt (that run resumes).")
    ema: bool = setting(False, flag="--ema", panel=P_FT, help="With --finetune-from-model: start from the checkpoint's EMA weights instead of its raw weights.")
    reset_optimizer: bool = setting(False, flag="--reset-optimizer", panel=P_FT, help="Resuming: a fresh Adam (moments, loss scale) and a restarted learning-rate schedule.")
    reset_lr_scheduler: bool = setting(False, flag="--reset-lr-scheduler", panel=P_FT, help="Resuming: restart the learning-rate schedule (warmup again) from the resumed update; Adam's state is kept.")
    reset_dataloader: bool = setting(False, flag="--reset-dataloader", panel=P_FT, help="Resuming: forget the data position and start a new epoch from its first batch (needed after changing the data dir, --max-tokens, --batch-size or --seed).")
    reset_meters: bool = setting(False, flag="--reset-meters", panel=P_FT, help="Resuming: zero the counters, the training time (--max-time) and the early-stopping state (best, --patience count).")
    # library-only settings (no flags)
    log_file: str = "train_log.jsonl"
    prefetch: bool | None = None  # collate the next update in a thread; None = on for CUDA only

    def validate(self) -> "TrainConfig":
        """Raise UserError naming the first bad flag; return self."""
        check_numbers(self)
        self._validate_batching()
        self._validate_optimizer()
        self._validate_device()
        for name in ("max_update", "max_epoch", "max_time", "validate_interval_updates", "patience",
                     "save_interval_updates", "save_interval_minutes", "keep_last_updates", "keep_last_epochs"):
            self._require_non_negative(name)
        self._validate_validation()
        self._require_positive("max_nan_skips")
        self._require_positive("log_interval")
        if self.ema and not self.finetune_from_model:
            raise UserError("--ema applies with --finetune-from-model (it picks that checkpoint's EMA weights to start from)")
        if self.train_subset == self.valid_subset:
            raise UserError(f"--valid-subset must differ from --train-subset ({self.train_subset!r})")
        self._require_positive("sampling_temperature")
        if self.lang_pairs is not None:
            from nmtkit.data.languages import parse_pairs

            parse_pairs(self.lang_pairs, "--lang-pairs")
        return self

    def _require_positive(self, name: str, allow_none: bool = False) -> None:
        """Refuse a field at or below 0 (None too, unless `allow_none`: a flag that may be left out)."""
        v = getattr(self, name)
        if v is None and allow_none:
            return
        if v is None or v <= 0:
            raise UserError(f"{flag(name)} must be > 0, got {v}")

    def _require_non_negative(self, name: str) -> None:
        """Refuse a field below 0 or NaN, for the settings where 0 means off or no limit."""
        v = getattr(self, name)
        if v < 0 or (isinstance(v, float) and math.isnan(v)):
            raise UserError(f"{flag(name)} must be >= 0, got {v}")

    def _validate_batching(self) -> None:
        """A batch needs a size: a token budget, a sentence count or both, each above 0."""
        if self.max_tokens is None and self.batch_size is None:
            raise UserError("give --max-tokens or --batch-size (or both)")
        self._require_positive("max_tokens", allow_none=True)
        self._require_positive("batch_size", allow_none=True)
        self._require_positive("update_freq")

    def _validate_optimizer(self) -> None:
        """The learning-rate schedule's and Adam's flags (the Optimization panel)."""
        if self.lr_scheduler not in SCHEDULERS:
            raise UserError(f"--lr-scheduler must be one of {', '.join(SCHEDULERS)}, got {self.lr_scheduler!r}")
        self._require_positive("lr_scale")
        self._require_positive("lr")
        if self.warmup_updates is not None and self.warmup_updates < 1:
            raise UserError(f"--warmup-updates must be >= 1, got {self.warmup_updates}")
        self._require_non_negative("warmup_init_lr")
        b1, b2 = self.adam_betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise UserError(f"--adam-betas must both be in [0, 1), got {b1},{b2}")
        self._require_positive("adam_eps")
        self._require_non_negative("weight_decay")
        self._require_non_negative("clip_norm")

    def _validate_device(self) -> None:
        """A precision the trainer knows, a thread count above 0 (or none: torch's choice) and a
        --ddp-timeout above 0."""
        check_precision(self.precision)
        self._require_positive("threads", allow_none=True)
        self._require_positive("ddp_timeout")

    def _validate_validation(self) -> None:
        """--eval-bleu's search, the metric that picks checkpoint_best.pt, the settings that need
        validation to run at all, and --ema-decay."""
        self._require_positive("eval_bleu_beam")
        self._require_non_negative("eval_bleu_max_len_a")
        from nmtkit.search.config import check_lenpen

        check_lenpen(self.eval_bleu_lenpen, "--eval-bleu-lenpen")
        from nmtkit.search.config import DECODING_PRESETS

        if self.eval_bleu_decoding not in DECODING_PRESETS:
            raise UserError(f"--eval-bleu-decoding must be one of {', '.join(DECODING_PRESETS)}, "
                            f"got {self.eval_bleu_decoding!r}")
        self._require_non_negative("eval_bleu_max_len_b")
        if self.best_checkpoint_metric not in BEST_METRICS:
            raise UserError(
                f"--best-checkpoint-metric must be one of {', '.join(BEST_METRICS)}, got {self.best_checkpoint_metric!r}"
            )
        if self.best_checkpoint_metric == "bleu" and not self.eval_bleu:
            raise UserError("--best-checkpoint-metric bleu needs --eval-bleu")
        if not 0.0 <= self.target_bleu <= 100.0:  # NaN fails too
            raise UserError(f"--target-bleu must be a BLEU score from 0 to 100 (0: never stop by it), got {self.target_bleu}")
        if self.target_bleu and not self.eval_bleu:
            raise UserError("--target-bleu needs --eval-bleu (the BLEU it is compared with)")
        if self.no_validate and (self.patience or self.eval_bleu or self.validate_interval_updates):
            raise UserError("--no-validate cannot be combined with --patience, --eval-bleu or --validate-interval-updates")
        if not 0.0 <= self.ema_decay < 1.0:
            raise UserError(f"--ema-decay must be in [0, 1), got {self.ema_decay}")

    def with_arch_overrides(self, overrides: Mapping[str, Any] | None) -> "TrainConfig":
        """`self` with the Architecture flags the user gave (None = not given); `--warmup-updates`
        is also the architecture's warmup_steps field (fairseq's flag name for it)."""
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        if self.warmup_updates is not None:
            given["warmup_steps"] = self.warmup_updates
        return dataclasses.replace(self, arch_overrides=given)

    def to_dict(self) -> dict[str, Any]:
        """Plain values only (stored in checkpoints, loaded with weights_only=True)."""
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        d["arch_overrides"] = {k: v for k, v in self.arch_overrides.items() if v is not None}
        return d
