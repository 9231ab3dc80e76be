"""The training loop of `nmtkit train`: the paper's recipe (section 5), resumable and multi-device.

What one update does (K = --update-freq micro-batches on each of W ranks):
  1. collate the K batches of this rank; sum their target tokens over ranks -> N (one all-reduce);
  2. forward, label-smoothed loss sum, backward of loss_sum * W / N for each micro-batch (DDP
     averages gradients over ranks, so the result is d(total loss / N) exactly as on one process
     with K * W micro-batches); DDP syncs gradients only on the last micro-batch;
  3. (fp16: unscale) gradient norm; a non-finite norm or loss skips the update (NaN/inf: counted,
     and --max-nan-skips consecutive ones stop training; fp16 overflow: the loss scale shrinks);
  4. clip to --clip-norm, set the learning rate of update u = done + 1, Adam step, EMA update.

The data position (epoch, batches consumed in that epoch) advances by K per update whether the
update was applied or skipped, and it is saved in every checkpoint together with the optimizer,
scheduler, scaler and every RNG state, so a resumed run continues bit-identically on CPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmtkit import checkpoints as ck
from nmtkit.data.batching import EpochBatches, collate
from nmtkit.device import resolve_device
from nmtkit.errors import UserError
from nmtkit.training import distributed as D
from nmtkit.training.config import TrainConfig
from nmtkit.training.ema import EMA
from nmtkit.training.loss import bits_per_token, label_smoothed_cross_entropy, perplexity
from nmtkit.training.report import JsonlLog, TrainProgress
from nmtkit.training.schedule import Schedule
from nmtkit.training.validation import Validator

LAST = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"
MIN_LOSS_SCALE = 2.0**-14  # fp16: below this the loss scale keeps overflowing; training is broken


class TrainingStopped(Exception):
    """Training cannot go on (e.g. repeated NaN losses); checkpoint_last.pt is left as it was."""


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


@dataclass
class TrainResult:
    """What a finished (or stopped) run reports back to the CLI and tests."""

    reason: str
    update: int
    epoch: int
    save_dir: Path
    best: float | None
    last_valid: dict | None = None
    nan_skips: int = 0
    oom_skips: int = 0
    losses: list[float] = field(default_factory=list)  # per applied update, bits (rank 0)
    interrupted_by: int | None = None  # the signal number, when reason == "signal"


def manifest_id(manifest: dict) -> str:
    """A content id of a data dir: the manifest's build fingerprint, else a hash of its file checksums."""
    if isinstance(manifest.get("fingerprint"), str):
        return manifest["fingerprint"]
    return hashlib.sha256(json.dumps(manifest.get("files", {}), sort_keys=True).encode()).hexdigest()


def _is_oom(e: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(e, oom_type)) or "out of memory" in str(e).lower()


class Trainer:
    """Sets everything up from a TrainConfig, then `run()` trains until a stopping rule fires."""

    def __init__(self, cfg: TrainConfig, progress_console=None):
        from nmtkit.models.registry import apply_overrides, get_arch

        self.cfg = cfg.validate()
        self.arch_cfg = apply_overrides(get_arch(cfg.arch), cfg.arch_overrides)
        self.warmup = cfg.warmup_updates if cfg.warmup_updates is not None else self.arch_cfg.warmup_steps
        if self.warmup < 1:
            raise UserError(f"--warmup-updates must be >= 1 (the architecture's warmup_steps is {self.warmup})")
        self.epsilon = self.arch_cfg.label_smoothing
        self.info = D.env_dist_info()
        self.device = resolve_device(cfg.device, self.info.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._check_precision()
        self.save_dir = Path(cfg.save_dir)
        self._console = progress_console
        self._signal: int | None = None
        self._setup_data()
        self._check_save_dir()

    # ------------------------------------------------------------------------------------------
    # set-up

    def _check_precision(self) -> None:
        p, dev = self.cfg.precision, self.device.type
        if p == "bf16" and dev == "cuda" and not torch.cuda.is_bf16_supported():
            raise UserError("--precision bf16: this GPU does not support bfloat16; use fp16 or fp32")
        self.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[p]

    def _setup_data(self) -> None:
        from nmtkit.data.manifest import load_dictionaries, load_manifest
        from nmtkit.data.shards import load_split

        cfg, d = self.cfg, self.cfg.data_dir
        self.manifest = load_manifest(d)
        self.src_lang, self.tgt_lang = self.manifest["source_lang"], self.manifest["target_lang"]
        self.src_dict, self.tgt_dict = load_dictionaries(d, self.manifest)
        if self.arch_cfg.share_embeddings == "all" and len(self.src_dict) != len(self.tgt_dict):
            raise UserError(
                f"--share-embeddings all needs one joint dictionary but {d} has {len(self.src_dict)} source and "
                f"{len(self.tgt_dict)} target symbols (preprocess with --joined-dictionary, or --share-embeddings none)"
            )
        if cfg.train_subset not in self.manifest["splits"]:
            raise UserError(f"{d}: no split {cfg.train_subset!r} to train on (it has {', '.join(self.manifest['splits'])})")
        self.train_src = load_split(d, cfg.train_subset, self.src_lang, verify=True)
        self.train_tgt = load_split(d, cfg.train_subset, self.tgt_lang, verify=True)
        self.has_valid = (not cfg.no_validate) and cfg.valid_subset in self.manifest["splits"]
        if not cfg.no_validate and not self.has_valid:
            if cfg.patience or cfg.eval_bleu or cfg.validate_interval_updates:
                raise UserError(
                    f"{d}: no {cfg.valid_subset!r} split, but --patience/--eval-bleu/--validate-interval-updates "
                    "need one (preprocess with --validpref)"
                )
        if self.has_valid:
            self.valid_src = load_split(d, cfg.valid_subset, self.src_lang, verify=True)
            self.valid_tgt = load_split(d, cfg.valid_subset, self.tgt_lang, verify=True)
        self.dictionaries = {
            "src_sha256": self.src_dict.sha256, "tgt_sha256": self.tgt_dict.sha256,
            "src_size": len(self.src_dict), "tgt_size": len(self.tgt_dict),
            "src_lang": self.src_lang, "tgt_lang": self.tgt_lang,
        }
        self.manifest_id = manifest_id(self.manifest)

    def _check_save_dir(self) -> None:
        if self.save_dir.exists() and not self.save_dir.is_dir():
            raise UserError(f"--save-dir {self.save_dir} exists and is not a directory")
        self.resume_state: dict | None = None
        last = self.save_dir / LAST
        if last.exists():
            state = ck.load_checkpoint(last)
            if "train" not in state:
                raise UserError(f"{last} is an inference checkpoint (no training state); it cannot be resumed")
            ck.check_same_model(state, str(last), arch=self.cfg.arch, arch_config=self.arch_cfg.to_dict(),
                                dictionaries=self.dictionaries)
            self.resume_state = state

    # ------------------------------------------------------------------------------------------

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _build(self) -> None:
        from nmtkit.models.loading import build_model

        cfg, info = self.cfg, self.info
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        np.random.seed(cfg.seed)
        import random

        random.seed(cfg.seed)
        self.model = build_model(self.arch_cfg, self.src_dict, self.tgt_dict).to(self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.n_params = sum(p.numel() for p in self.params)
        opt_kwargs: dict[str, Any] = dict(lr=0.0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                                          weight_decay=cfg.weight_decay)
        # AdamW: with --weight-decay 0 (the paper) it is exactly Adam; with decay it is decoupled,
        # as fairseq's adam does. The fused kernel (CPU and CUDA) updates all parameters in one
        # pass per tensor; on CPU it measured 3-10x faster than the default per-parameter loop.
        try:
            self.optimizer = torch.optim.AdamW(self.params, fused=True, **opt_kwargs)
        except (RuntimeError, ValueError, TypeError):  # a torch build without the fused kernel here
            self.optimizer = torch.optim.AdamW(self.params, **opt_kwargs)
        self.schedule = Schedule(cfg.lr_scheduler, warmup=self.warmup, d_model=self.arch_cfg.d_model,
                                 lr_scale=cfg.lr_scale, peak_lr=cfg.lr, warmup_init_lr=cfg.warmup_init_lr)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        self.ema = EMA(self.model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        self.state = TrainState()
        self.resumed = False
        if self.resume_state is not None:
            self._restore(self.resume_state)
            self.resume_state = None
        else:
            torch.manual_seed(cfg.seed + info.rank)  # different dropout masks per rank
        self.ddp = None
        fwd: torch.nn.Module = self.model
        if info.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.ddp = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                           broadcast_buffers=False)
            fwd = self.ddp
        if cfg.compile:
            fwd = torch.compile(fwd, dynamic=True)
        self.forward_model = fwd

    def _restore(self, state: dict) -> None:
        tr = state["train"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(tr["optimizer"])
        if tr.get("scaler"):
            self.scaler.load_state_dict(tr["scaler"])
        if self.ema is not None:
            if state.get("ema") is not None:
                self.ema.load_state_dict(state["ema"])
            else:
                self.ema = EMA(self.model, self.cfg.ema_decay)
        saved = tr.get("state", {})
        for k, v in saved.items():
            if hasattr(self.state, k):
                setattr(self.state, k, v)
        pos = tr["data_position"]
        self.state.epoch = int(pos["epoch"])
        offset, old_world = int(pos["batch_offset"]), int(pos.get("world_size", 1))
        if old_world != self.info.world_size:
            offset = (offset * old_world) // self.info.world_size
        self.state.batch_offset = offset
        self._resume_batching = pos.get("batching")
        rngs = tr.get("rng") or []
        if len(rngs) == self.info.world_size:
            ck.set_rng_state(rngs[self.info.rank])
        else:
            torch.manual_seed(self.cfg.seed + self.info.rank + 1000 * self.state.update)
        self.resumed = True

    def _make_iterators(self) -> None:
        cfg, a = self.cfg, self.arch_cfg
        self.pad_multiple = 8 if self.device.type == "cuda" else 1
        self.train_batches = EpochBatches(
            self.train_src, self.train_tgt, max_tokens=cfg.max_tokens, max_sentences=cfg.batch_size,
            max_source_positions=a.max_source_positions, max_target_positions=a.max_target_positions,
            pad_multiple=self.pad_multiple, shuffle=True, seed=cfg.seed, rank=self.info.rank,
            world_size=self.info.world_size,
        )
        self.batching_key = {"max_tokens": cfg.max_tokens, "batch_size": cfg.batch_size, "seed": cfg.seed,
                             "pad_multiple": self.pad_multiple, "world_size": self.info.world_size}
        self.validator = None
        if self.has_valid:
            self.validator = Validator(
                self.valid_src, self.valid_tgt, max_tokens=cfg.max_tokens, max_sentences=cfg.batch_size,
                max_source_positions=a.max_source_positions, max_target_positions=a.max_target_positions,
                pad_multiple=self.pad_multiple, info=self.info,
            )

    # ------------------------------------------------------------------------------------------
    # checkpoints

    def _checkpoint_state(self) -> dict:
        st = self.state
        rngs = D.all_gather_objects(ck.rng_state(), self.info)
        state: dict[str, Any] = {
            ck.MAGIC: ck.FORMAT_VERSION,
            "arch": self.cfg.arch,
            "arch_config": self.arch_cfg.to_dict(),
            "model": self.model.state_dict(),
            "dictionaries": dict(self.dictionaries),
            "data_manifest_id": self.manifest_id,
            "update": st.update,
            "epoch": st.last_epoch_done,
            "train_args": self.cfg.to_dict(),
            "train": {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": {**self.schedule.state_dict(), "update": st.update},
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
                "rng": rngs,
                "data_position": {"epoch": st.epoch, "batch_offset": st.batch_offset,
                                  "world_size": self.info.world_size, "batching": self.batching_key},
                "early_stopping": {"metric": self.cfg.best_checkpoint_metric, "best": st.best,
                                   "bad_validations": st.bad_validations, "patience": self.cfg.patience},
                "counters": {"nan_skips": st.nan_skips, "oom_skips": st.oom_skips,
                             "overflow_skips": st.overflow_skips, "elapsed_s": st.elapsed_s},
                "state": st.to_dict(),
            },
        }
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        if st.best is not None:
            state["best"] = {"metric": self.cfg.best_checkpoint_metric, "value": st.best}
        return state

    def _save(self, names: list[str]) -> None:
        """Write checkpoint_last.pt (always) and link/copy it to the other `names` (rank 0 writes)."""
        t0 = time.perf_counter()
        if self._best_pending:
            names = [*names, BEST]
        self.state.elapsed_s = self._elapsed()
        state = self._checkpoint_state()  # collective (RNG gather): every rank calls it
        if self.info.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            last = self.save_dir / LAST
            ck.save_checkpoint(state, last)
            for name in names:
                if name != LAST:
                    _link_or_copy(last, self.save_dir / name)
            removed = ck.prune_checkpoints(self.save_dir, self.cfg.keep_last_updates, self.cfg.keep_last_epochs)
            self.log.write({"type": "checkpoint", "update": self.state.update, "files": [LAST, *names],
                            "removed": [p.name for p in removed], "seconds": round(time.perf_counter() - t0, 3)})
        D.barrier(self.info)
        self._saved_at_update = self.state.update
        self._best_pending = False

    # ------------------------------------------------------------------------------------------
    # one update

    def _train_step(self, batches: list) -> dict:
        """Forward/backward over this rank's micro-batches of one update; maybe an optimizer step."""
        info, cfg = self.info, self.cfg
        ntok_local = sum(b.ntokens for b in batches)
        flags = self._flags()
        head = torch.tensor([ntok_local, sum(b.nsentences for b in batches), *flags], dtype=torch.float64)
        D.all_reduce_sum(head, info)
        ntok_total, nsent_total = int(head[0]), int(head[1])
        self._pending_flags = [bool(x > 0) for x in head[2:].tolist()]
        lr = self.schedule.lr(self.state.update + 1)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        scale = info.world_size / max(ntok_total, 1)
        loss_acc = torch.zeros((), dtype=torch.float64, device=self.device)
        nll_acc = torch.zeros((), dtype=torch.float64, device=self.device)
        try:
            for i, b in enumerate(batches):
                b = b.to(self.device, non_blocking=True)
                sync = self.ddp.no_sync() if (self.ddp is not None and i < len(batches) - 1) else contextlib.nullcontext()
                with sync:
                    with self._autocast():
                        logits = self.forward_model(b.src_tokens, b.prev_output_tokens)  # (B, T, V)
                    loss, nll, _ = label_smoothed_cross_entropy(logits, b.target, self.epsilon)
                    del logits
                    self.scaler.scale(loss * scale).backward()
                loss_acc += loss.detach().double()
                nll_acc += nll.detach().double()
        except Exception as e:  # noqa: BLE001 - only out-of-memory is handled; anything else re-raised
            if not _is_oom(e):
                raise
            return self._handle_oom(batches, e)
        sums = torch.stack([loss_acc, nll_acc])
        D.all_reduce_sum(sums, info)
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        gnorm_t = _total_norm(grads)
        gnorm, loss_sum, nll_sum = float(gnorm_t), float(sums[0]), float(sums[1])
        finite = math.isfinite(gnorm) and math.isfinite(loss_sum)
        out = {"ntokens": ntok_total, "nsentences": nsent_total, "loss_sum": loss_sum, "nll_sum": nll_sum,
               "gnorm": gnorm, "lr": lr, "applied": False}
        if finite and cfg.clip_norm > 0:
            coef = torch.clamp(cfg.clip_norm / (gnorm_t + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # skipped by the scaler itself on inf/NaN gradients
            self.scaler.update()
            if finite:
                out["applied"] = True
            else:
                self.state.overflow_skips += 1
                out["skip"] = "fp16_overflow"
                if self.scaler.get_scale() < MIN_LOSS_SCALE:
                    raise TrainingStopped(
                        f"fp16 loss scale fell below {MIN_LOSS_SCALE} at update {self.state.update + 1}: the "
                        "loss keeps overflowing or is NaN; try --precision bf16/fp32 or a lower --lr"
                    )
        elif finite:
            self.optimizer.step()
            out["applied"] = True
        else:
            out["skip"] = "nan"
        self.optimizer.zero_grad(set_to_none=True)
        if out["applied"]:
            self.state.update += 1
            self.state.last_epoch_done = self.state.epoch
            self.state.consecutive_nan = 0
            if self.ema is not None:
                self.ema.update(self.model)
        elif out.get("skip") == "nan":
            self.state.nan_skips += 1
            self.state.consecutive_nan += 1
        return out

    def _handle_oom(self, batches: list, e: BaseException) -> dict:
        shapes = ", ".join(f"{b.nsentences}x{b.src_tokens.shape[1]}/{b.target.shape[1]}" for b in batches)
        if self.info.enabled:
            raise UserError(
                f"out of memory on rank {self.info.rank} (batches sentences x src/tgt length: {shapes}); with "
                "several processes a batch cannot be skipped safely: lower --max-tokens and resume"
            ) from None
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.state.oom_skips += 1
        return {"applied": False, "skip": "oom", "shapes": shapes, "error": str(e).splitlines()[0][:200],
                "ntokens": 0, "nsentences": 0, "loss_sum": 0.0, "nll_sum": 0.0, "gnorm": math.nan, "lr": 0.0}

    # ------------------------------------------------------------------------------------------
    # stopping signals and time

    def _elapsed(self) -> float:
        return self._elapsed_base + (time.monotonic() - self._t_start)

    def _flags(self) -> list[float]:
        """[signal received, --max-time reached, --save-interval-minutes due]; summed over ranks."""
        now = time.monotonic()
        max_time = bool(self.cfg.max_time) and self._elapsed() >= self.cfg.max_time
        timed_save = bool(self.cfg.save_interval_minutes) and (now - self._last_timed_save) >= 60 * self.cfg.save_interval_minutes
        return [float(self._signal is not None), float(max_time), float(timed_save)]

    def _on_signal(self, signum, frame) -> None:
        if self._signal is not None:  # a second Ctrl-C: stop now, without saving
            raise KeyboardInterrupt
        self._signal = signum
        if self.info.is_main:
            self.progress.line(f"received {signal.Signals(signum).name}: saving {LAST} after this update, then stopping "
                               "(press Ctrl-C again to stop at once without saving)", style="yellow")

    # ------------------------------------------------------------------------------------------
    # validation

    def _validate(self) -> dict:
        model = self.ema.model if self.ema is not None else self.model
        res = self.validator.loss(model, self.device, self._autocast, self.epsilon)
        rec = {"type": "valid", "epoch": self.state.last_epoch_done, "update": self.state.update, "loss": res.loss,
               "nll_loss": res.nll_loss, "ppl": res.ppl, "tgt_tokens": res.ntokens,
               "weights": "ema" if self.ema is not None else "raw"}
        if self.cfg.eval_bleu:
            rec["bleu"] = self.validator.bleu(
                model, self.device, self._autocast, self._to_text, beam=self.cfg.eval_bleu_beam,
                lenpen=self.cfg.eval_bleu_lenpen, max_len_a=self.cfg.eval_bleu_max_len_a,
                max_len_b=self.cfg.eval_bleu_max_len_b, max_target_positions=self.arch_cfg.max_target_positions,
            )
        value = rec["bleu"] if self.cfg.best_checkpoint_metric == "bleu" else res.nll_loss
        better = math.isfinite(value) and (self.state.best is None or (
            value > self.state.best if self.cfg.best_checkpoint_metric == "bleu" else value < self.state.best))
        if better:
            self.state.best = value
            self.state.bad_validations = 0
            self._best_pending = True
        else:
            self.state.bad_validations += 1
        rec.update(best=self.state.best, improved=bool(better), bad_validations=self.state.bad_validations)
        self._last_valid_update = self.state.update
        if self.info.is_main:
            self.log.write(rec)
            bleu = f" | bleu {rec['bleu']:.2f}" if "bleu" in rec else ""
            self.progress.line(
                f"valid | epoch {self.state.last_epoch_done} | update {self.state.update} | loss {res.loss:.3f} | "
                f"nll_loss {res.nll_loss:.3f} | ppl {res.ppl:.2f}{bleu} | best {self.state.best if self.state.best is not None else float('nan'):.3f}"
                + ("" if better else f" | {self.state.bad_validations} without improvement"))
        return rec

    def _to_text(self, ids: list[int]) -> str:
        if not hasattr(self, "_subword"):
            from nmtkit.data.subwords import load_subword_model

            self._subword = load_subword_model(self.cfg.data_dir, self.tgt_lang)
        return self._subword.decode(self.tgt_dict.string([i for i in ids if i >= 3]))  # drop pad/<s>/</s>

    # ------------------------------------------------------------------------------------------
    # the loop

    def run(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        lock = _SaveDirLock(self.save_dir) if info.is_main else None
        try:
            D.init(info, self.device.type)
            try:
                return self._run()
            finally:
                D.shutdown(info)
        finally:
            if lock is not None:
                lock.release()

    def _run(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        self._build()
        self._make_iterators()
        st = self.state
        if info.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
        self.log = JsonlLog(self.save_dir / cfg.log_file if info.is_main else None)
        total = cfg.max_update or None
        self.progress = TrainProgress(cfg.progress_bar and info.is_main, total, st.update, self._console)
        self._t_start = time.monotonic()
        self._elapsed_base = st.elapsed_s
        self._last_timed_save = self._t_start
        self._saved_at_update = st.update if self.resumed else -1
        self._last_valid_update = st.update if self.resumed else -1
        self._pending_flags = [False, False, False]
        self._best_pending = False
        result = TrainResult(reason="", update=st.update, epoch=st.epoch, save_dir=self.save_dir, best=st.best)

        old_handlers = {}
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                old_handlers[s] = signal.signal(s, self._on_signal)
            except ValueError:  # not the main thread (e.g. some test runners): no signal handling
                pass
        try:
            self._log_start()
            if cfg.max_update and st.update >= cfg.max_update:
                result.reason = "already_done"
            elif cfg.max_epoch and st.epoch > cfg.max_epoch:
                result.reason = "already_done"
            else:
                result.reason = self._loop(result)
        except TrainingStopped as e:
            result.reason = "failed"
            self.log.write({"type": "end", "update": st.update, "reason": "failed", "message": str(e)})
            self.progress.close()
            raise UserError(f"{e} ({LAST} was left as it was)") from None
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            self.progress.close()
        result.update, result.epoch, result.best = st.update, st.last_epoch_done, st.best
        result.nan_skips, result.oom_skips = st.nan_skips, st.oom_skips
        result.interrupted_by = self._signal
        self.log.write({"type": "end", "update": st.update, "epoch": st.epoch, "reason": result.reason,
                        "nan_skips": st.nan_skips, "oom_skips": st.oom_skips, "overflow_skips": st.overflow_skips,
                        "elapsed_s": round(self._elapsed(), 3)})
        self.log.close()
        return result

    def _log_start(self) -> None:
        st, f = self.state, self.train_batches.filter
        if not self.info.is_main:
            return
        self.log.write({"type": "start", "update": st.update, "epoch": st.epoch, "resumed": self.resumed,
                        "arch": self.cfg.arch, "arch_config": self.arch_cfg.to_dict(), "params": self.n_params,
                        "world_size": self.info.world_size, "device": str(self.device),
                        "precision": self.cfg.precision, "train_pairs": len(self.train_src),
                        "train_pairs_skipped": f.skipped, "batches_per_epoch": len(self.train_batches),
                        "peak_rss_mib": _peak_rss_mib()})
        where = (f"resuming from {self.save_dir / LAST} at update {st.update} (epoch {st.epoch}, batch "
                 f"{st.batch_offset})" if self.resumed else "starting")
        self.progress.line(
            f"{where}: {self.cfg.arch} ({self.n_params / 1e6:.1f}M parameters) on {self.device}"
            f"{f' x {self.info.world_size} processes' if self.info.enabled else ''}, {self.cfg.precision}; "
            f"{len(self.train_src)} training pairs, {len(self.train_batches)} batches per epoch"
            f"{f' per process' if self.info.enabled else ''}")
        if f.skipped:
            self.progress.line(f"skipping {f.skipped} training pair(s) that do not fit the model: {f.describe()}",
                               style="yellow")
        if self.validator is not None and self.validator.filter.skipped:
            self.progress.line(f"skipping {self.validator.filter.skipped} validation pair(s) that do not fit the "
                               f"model: {self.validator.filter.describe()}", style="yellow")

    def _loop(self, result: TrainResult) -> str:
        cfg, st, info = self.cfg, self.state, self.info
        interval = _Interval()
        batches = self.train_batches.batches(st.epoch)
        if len(batches) == 0:
            raise UserError(
                f"no training batches: all {len(self.train_src)} pairs were skipped or there are fewer batches than "
                f"processes ({info.world_size}); check --max-tokens and the model's position limits")
        if self.resumed:
            key = getattr(self, "_resume_batching", None)
            if key and key != self.batching_key and info.is_main:
                self.progress.line(f"batching settings changed since the checkpoint ({key} -> {self.batching_key}); "
                                   f"epoch {st.epoch} continues at batch {st.batch_offset} of the new plan", style="yellow")
        while True:
            batches = self.train_batches.batches(st.epoch)
            n = len(batches)
            for group, collated in self._groups(batches, st.batch_offset):
                out = self._train_step(collated)
                st.batch_offset += len(group)
                if not info.enabled:  # one process: act on the newest state (no need to agree with others)
                    self._pending_flags = [x > 0 for x in self._flags()]
                signal_seen, time_up, timed_save = self._pending_flags
                self._after_step(out, interval, result)
                if st.batch_offset >= n:  # the epoch's last update: _end_epoch below handles it
                    break
                if self.validator is not None and cfg.validate_interval_updates and out["applied"] and \
                        st.update % cfg.validate_interval_updates == 0:
                    self._validate()
                    if cfg.patience and st.bad_validations >= cfg.patience:
                        self._final_save()
                        return "patience"
                interval_due = out["applied"] and cfg.save_interval_updates and st.update % cfg.save_interval_updates == 0
                if interval_due or timed_save:
                    self._save([f"checkpoint_{st.epoch}_{st.update}.pt"])
                elif self._best_pending:
                    self._save([])
                if timed_save:
                    self._last_timed_save = time.monotonic()
                for stop, why in ((cfg.max_update and st.update >= cfg.max_update, "max_update"),
                                  (signal_seen, "signal"), (time_up, "max_time")):
                    if stop:
                        self._final_save()
                        return why
            reason = self._end_epoch()  # also when a resumed position was already past the end
            if reason:
                return reason

    def _groups(self, batches: list, start: int):
        """(batch index arrays, collated batches) of each update of the epoch from batch `start` on.

        With prefetching (default on CUDA) the next update's batches are collated and pinned in a
        background thread while the current update runs on the device.
        """
        k = self.cfg.update_freq
        groups = [batches[i : i + k] for i in range(start, len(batches), k)]
        pin = self.device.type == "cuda"

        def make(group):
            out = [collate(self.train_src, self.train_tgt, idx, self.pad_multiple) for idx in group]
            return [b.pin_memory() for b in out] if pin else out

        prefetch = self.cfg.prefetch if self.cfg.prefetch is not None else self.device.type == "cuda"
        if not prefetch or not groups:
            for g in groups:
                yield g, make(g)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmtkit-collate") as pool:
            future = pool.submit(make, groups[0])
            for j, g in enumerate(groups):
                collated = future.result()
                if j + 1 < len(groups):
                    future = pool.submit(make, groups[j + 1])
                yield g, collated

    def _after_step(self, out: dict, interval: "_Interval", result: TrainResult) -> None:
        cfg, st = self.cfg, self.state
        if out.get("skip") in ("nan", "oom", "fp16_overflow") and self.info.is_main:
            rec = {"type": "skip", "reason": out["skip"], "update": st.update, "epoch": st.epoch,
                   "nan_skips": st.nan_skips, "oom_skips": st.oom_skips}
            if out["skip"] == "oom":
                rec["batches"] = out["shapes"]
                self.progress.line(f"out of memory on batch(es) {out['shapes']} (sentences x src/tgt length) at "
                                   f"update {st.update + 1}: skipped ({st.oom_skips} so far); consider a lower "
                                   "--max-tokens", style="yellow")
            elif out["skip"] == "nan":
                self.progress.line(f"non-finite loss or gradient at update {st.update + 1}: update skipped "
                                   f"({st.nan_skips} so far, {st.consecutive_nan} in a row)", style="yellow")
            else:
                rec["loss_scale"] = self.scaler.get_scale()
            self.log.write(rec)
        if out.get("skip") == "nan" and st.consecutive_nan >= cfg.max_nan_skips:
            raise TrainingStopped(f"{st.consecutive_nan} updates in a row had a NaN/inf loss or gradient "
                                  f"(--max-nan-skips {cfg.max_nan_skips}); training stopped at update {st.update}")
        if not out["applied"]:
            return
        interval.add(out)
        bits = bits_per_token(out["loss_sum"], out["ntokens"])
        result.losses.append(bits)
        if st.update % cfg.log_interval == 0 or (cfg.max_update and st.update >= cfg.max_update):
            rec = interval.record(st, out["lr"], self.scaler.get_scale() if self.scaler.is_enabled() else None)
            if self.info.is_main:
                self.log.write(rec)
                if not self.progress.live:
                    self.progress.line(
                        f"train | epoch {rec['epoch']} | update {rec['update']} | loss {rec['loss']:.3f} | "
                        f"nll_loss {rec['nll_loss']:.3f} | ppl {rec['ppl']:.2f} | lr {rec['lr']:.3g} | "
                        f"gnorm {rec['gnorm']:.3f} | {rec['tgt_tok_per_s']:.0f} tgt tok/s")
                self.progress.update(st.update, st.epoch, rec, out["lr"])
        elif self.info.is_main:
            self.progress.update(st.update, st.epoch, None, out["lr"])

    def _end_epoch(self) -> str | None:
        """Validation, epoch checkpoint and stopping rules at the end of an epoch."""
        cfg, st = self.cfg, self.state
        finished = st.epoch
        st.epoch += 1
        st.batch_offset = 0
        if self.validator is not None and self._last_valid_update != st.update:
            self._validate()
        names = [] if cfg.no_epoch_checkpoints else [f"checkpoint{finished}.pt"]
        if cfg.save_interval_updates and st.update % cfg.save_interval_updates == 0 and self._saved_at_update != st.update:
            names.append(f"checkpoint_{finished}_{st.update}.pt")
        self._save(names)
        if cfg.max_update and st.update >= cfg.max_update:
            return "max_update"
        if cfg.max_epoch and finished >= cfg.max_epoch:
            return "max_epoch"
        if cfg.patience and st.bad_validations >= cfg.patience:
            return "patience"
        signal_seen, time_up, _ = self._pending_flags
        if signal_seen:
            return "signal"
        if time_up:
            return "max_time"
        return None

    def _final_save(self) -> None:
        """checkpoint_last.pt (and the best, if pending) unless this update was just saved."""
        if self._saved_at_update != self.state.update or self._best_pending:
            self._save([])


class _Interval:
    """Sums over the updates since the last train log record."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = 0.0
        self.ntokens = self.nsentences = self.updates = 0
        self.gnorm = 0.0
        self.t0 = time.perf_counter()

    def add(self, out: dict) -> None:
        self.loss += out["loss_sum"]
        self.nll += out["nll_sum"]
        self.ntokens += out["ntokens"]
        self.nsentences += out["nsentences"]
        self.gnorm += out["gnorm"]
        self.updates += 1

    def record(self, st: TrainState, lr: float, loss_scale: float | None) -> dict:
        wall = time.perf_counter() - self.t0
        nll_bits = bits_per_token(self.nll, self.ntokens)
        rec = {"type": "train", "epoch": st.last_epoch_done, "update": st.update,
               "loss": bits_per_token(self.loss, self.ntokens), "nll_loss": nll_bits, "ppl": perplexity(nll_bits),
               "lr": lr, "gnorm": self.gnorm / max(self.updates, 1), "tgt_tokens": self.ntokens,
               "sentences": self.nsentences, "updates": self.updates, "wall_s": round(wall, 4),
               "tgt_tok_per_s": self.ntokens / wall if wall > 0 else 0.0}
        if loss_scale is not None:
            rec["loss_scale"] = loss_scale
        rec["peak_rss_mib"] = _peak_rss_mib()
        self.reset()
        return rec


class _SaveDirLock:
    """An exclusive lock on SAVE_DIR for the whole run, so two trainings never write the same files.

    flock(2) on SAVE_DIR/.nmtkit-train.lock, released by the OS if the process dies; where flock
    is unavailable (Windows) there is no lock.
    """

    def __init__(self, directory: Path):
        self.fh = None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            return
        directory.mkdir(parents=True, exist_ok=True)
        fh = open(directory / ".nmtkit-train.lock", "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown process"
            fh.close()
            raise UserError(f"--save-dir {directory} is in use by another nmtkit train ({holder}); "
                            "wait for it to finish or choose another --save-dir") from None
        import socket

        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        fh.flush()
        self.fh = fh

    def release(self) -> None:
        if self.fh is not None:
            import fcntl

            fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None


def _peak_rss_mib() -> float | None:
    """This process's peak resident memory so far (MiB), where the OS reports it."""
    try:
        import resource
        import sys

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(kib / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)  # bytes on macOS
    except (ImportError, OSError):
        return None


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of all gradients (one fused norm per tensor, then the norm of the norms)."""
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads)]))


def _link_or_copy(src: Path, dst: Path) -> None:
    """Make `dst` an atomic copy of `src`: a hard link if possible, else a copied temp file."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        import shutil

        with open(src, "rb") as fi, open(tmp, "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 22)
            fo.flush()
            os.fsync(fo.fileno())
    os.replace(tmp, dst)


def train(cfg: TrainConfig, progress_console=None) -> TrainResult:
    """Train according to `cfg` (resuming from SAVE_DIR/checkpoint_last.pt if it exists)."""
    return Trainer(cfg, progress_console).run()
