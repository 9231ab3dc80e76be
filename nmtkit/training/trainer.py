"""The training loop of `nmtkit train`: the paper's recipe (section 5), resumable and multi-device.

`Trainer` sets up (data, model, optimizer; resuming from SAVE_DIR/checkpoint_last.pt, or starting
from --finetune-from-model's weights) and runs the loop: updates, logging, validation, checkpoints
and stopping. The concerns it delegates:

  start.py             where the run starts (fresh, resumed, fine-tuned), its architecture, the
                       checks against the checkpoint and which --reset-* apply

  step.py              one update (forward/backward over the micro-batches, clip, Adam, EMA) -> StepResult
  stopping.py          every stopping rule, in one function (`stop_reason`)
  checkpoint_state.py  what a checkpoint holds and how a run is restored from one
  state.py             TrainState (saved in checkpoints), LoopState (this run's bookkeeping)
  validation.py        validation loss and --eval-bleu
  distributed.py       ranks and collectives: --ddp-timeout and its one-line failures, and the stop of
                       a torchrun worker whose launcher died

The data position (epoch, batches consumed in that epoch) advances by K = --update-freq per
update whether the update was applied or skipped, and it is saved in every checkpoint together
with the optimizer, scheduler, scaler and every RNG state, so a resumed run continues
bit-identically on CPU.
"""

from __future__ import annotations

import dataclasses
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
from nmtkit.data.languages import langs_of, pair_name, pairs_of, parse_pairs, split_name, tag_token
from nmtkit.data.sampling import SampledEpochBatches, load_pair_split
from nmtkit.device import resolve_device
from nmtkit.errors import UserError, first_line
from nmtkit.training import checkpoint_state
from nmtkit.training import distributed as D
from nmtkit.training.compiled import CompileFailed, probe, use_cache_folder
from nmtkit.training.config import TrainConfig
from nmtkit.training.ema import EMA
from nmtkit.training.loss import bits_per_token
from nmtkit.training.report import JsonlLog, TensorBoardLog, TrainProgress, require_tensorboard
from nmtkit.training.schedule import Schedule
from nmtkit.training.start import check_same_start, describe_start, find_start
from nmtkit.training.state import LoopState, TrainState
from nmtkit.training.step import MIN_LOSS_SCALE, StepResult, TrainingObjects, UpdateStep, autocast, is_oom
from nmtkit.training.step import total_norm as _total_norm  # noqa: F401 - used by recipes/bench/train_profile.py
from nmtkit.training.stopping import TrainingStopped, check_epoch_progress, stop_reason
from nmtkit.training.validation import Validator

__all__ = ["LAST", "BEST", "MIN_LOSS_SCALE", "TrainState", "TrainingStopped", "TrainResult", "Trainer", "train",
           "manifest_id"]

LAST = "checkpoint_last.pt"
BEST = "checkpoint_best.pt"
RESET_EFFECTS = {  # the start line of a resumed run that applies a reset (docs/train.md)
    "reset_optimizer": "a fresh Adam (and loss scale); the learning-rate schedule starts again from this update",
    "reset_lr_scheduler": "the learning-rate schedule starts again (warmup) from this update; Adam's state is kept",
    "reset_dataloader": "a new epoch from its first batch (the saved data position is dropped)",
    "reset_meters": "skip counters, training time (--max-time) and early stopping (best, --patience) start from zero",
}


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


def multilingual_pairs(manifest: dict, lang_pairs: str | None, data_dir: str) -> list[tuple[str, str]]:
    """The pairs a run trains on: the multilingual directory's, or the --lang-pairs among them
    (refused in one line naming the directory's pairs); [] for a bilingual directory."""
    have = pairs_of(manifest)
    if not have:
        if lang_pairs is not None:
            raise UserError(f"--lang-pairs: {data_dir} is a bilingual data directory "
                            f"({manifest['source_lang']}-{manifest['target_lang']}); the flag selects pairs of a "
                            "multilingual one")
        return []
    if lang_pairs is None:
        return have
    asked = parse_pairs(lang_pairs, "--lang-pairs")
    absent = [pair_name(s, t) for s, t in asked if (s, t) not in have]
    if absent:
        raise UserError(f"--lang-pairs: {', '.join(absent)} not in {data_dir} "
                        f"(its pairs: {', '.join(pair_name(s, t) for s, t in have)})")
    return asked


def mean_figures(directions: dict[str, dict]) -> dict:
    """The unweighted mean over directions of each figure (loss, nll_loss, ppl, bleu), and the
    directions' target tokens summed: every direction counts alike, however large its valid split."""
    first = next(iter(directions.values()))
    out = {k: float(np.mean([d[k] for d in directions.values()])) for k in first if k != "tgt_tokens"}
    out["tgt_tokens"] = sum(d["tgt_tokens"] for d in directions.values())
    return {k: out[k] for k in first}  # the directions' key order


def valid_line(rec: dict) -> str:
    """The console line of a `valid` record; with directions, each one's nll_loss (and bleu) after
    the means."""
    bleu = f" | bleu {rec['bleu']:.2f}" if "bleu" in rec else ""
    best = rec["best"] if rec["best"] is not None else float("nan")
    line = (f"valid | epoch {rec['epoch']} | update {rec['update']} | loss {rec['loss']:.3f} | "
            f"nll_loss {rec['nll_loss']:.3f} | ppl {rec['ppl']:.2f}{bleu} | best {best:.3f}"
            + ("" if rec["improved"] else f" | {rec['bad_validations']} without improvement"))
    directions = rec.get("directions")
    if directions:
        line += f" | mean of {len(directions)} directions: " + ", ".join(
            f"{name} nll_loss {d['nll_loss']:.3f}" + (f" bleu {d['bleu']:.2f}" if "bleu" in d else "")
            for name, d in directions.items())
    return line


def padding_text(padding) -> str:
    """'padding 2.1% of the token slots (source 2.0%, target 2.2%)' for a batching.Padding."""
    d = padding.to_dict()
    return f"padding {d['fraction']:.1%} of the token slots (source {d['source']:.1%}, target {d['target']:.1%})"


def manifest_id(manifest: dict) -> str:
    """A content id of a data dir: the manifest's build fingerprint, else a hash of its file checksums."""
    if isinstance(manifest.get("fingerprint"), str):
        return manifest["fingerprint"]
    return hashlib.sha256(json.dumps(manifest.get("files", {}), sort_keys=True).encode()).hexdigest()


class Trainer:
    """Sets everything up from a TrainConfig, then `run()` trains until a stopping rule fires."""

    def __init__(self, cfg: TrainConfig, progress_console=None):
        # first: a torchrun worker records its launcher before anything slow (distributed.py)
        self._launcher = D.LauncherWatch()
        cfg = cfg.validate()
        self.save_dir = Path(cfg.save_dir)
        if self.save_dir.exists() and not self.save_dir.is_dir():
            raise UserError(f"--save-dir {self.save_dir} exists and is not a directory")
        if cfg.tensorboard_logdir:
            require_tensorboard()
        # resumed, fine-tuned or fresh; the architecture is the checkpoint's unless --arch is given
        self.start = find_start(cfg, self.save_dir)
        self.cfg = cfg = dataclasses.replace(cfg, arch=self.start.arch)
        self.arch_cfg = self.start.arch_cfg
        self.warmup = cfg.warmup_updates if cfg.warmup_updates is not None else self.arch_cfg.warmup_steps
        if self.warmup < 1:
            raise UserError(f"--warmup-updates must be >= 1 (the architecture's warmup_steps is {self.warmup})")
        self.epsilon = self.arch_cfg.label_smoothing
        self.info = D.env_dist_info()
        self.device = resolve_device(cfg.device, self.info.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._check_precision()
        self._console = progress_console
        self._setup_data()
        self._check_save_dir()

    # the training objects (model, optimizer, schedule, scaler, EMA) live in self.objs
    model = property(lambda self: self.objs.model)
    optimizer = property(lambda self: self.objs.optimizer)
    schedule = property(lambda self: self.objs.schedule)
    scaler = property(lambda self: self.objs.scaler)
    ema = property(lambda self: self.objs.ema)

    # ------------------------------------------------------------------------------------------
    # set-up

    def _check_precision(self) -> None:
        p, dev = self.cfg.precision, self.device.type
        if p == "bf16" and dev == "cuda" and not torch.cuda.is_bf16_supported():
            raise UserError("--precision bf16: this GPU does not support bfloat16; use fp16 or fp32")
        self.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[p]

    def _setup_data(self) -> None:
        from nmtkit.data.manifest import load_dictionaries, load_manifest

        d = self.cfg.data_dir
        self.manifest = load_manifest(d)
        self.src_lang, self.tgt_lang = self.manifest["source_lang"], self.manifest["target_lang"]
        self.src_dict, self.tgt_dict = load_dictionaries(d, self.manifest)
        if self.arch_cfg.share_embeddings == "all" and len(self.src_dict) != len(self.tgt_dict):
            raise UserError(
                f"--share-embeddings all needs one joint dictionary but {d} has {len(self.src_dict)} source and "
                f"{len(self.tgt_dict)} target symbols (preprocess with --joined-dictionary, or --share-embeddings none)"
            )
        self.pairs = multilingual_pairs(self.manifest, self.cfg.lang_pairs, d)
        self.tag_ids: frozenset[int] = frozenset()  # ids dropped from --eval-bleu hypotheses besides the specials
        if self.pairs:
            self._load_multilingual()
        else:
            self._load_bilingual()
        self.dictionaries = {
            "src_sha256": self.src_dict.sha256, "tgt_sha256": self.tgt_dict.sha256,
            "src_size": len(self.src_dict), "tgt_size": len(self.tgt_dict),
            "src_lang": self.src_lang, "tgt_lang": self.tgt_lang,
        }
        self.manifest_id = manifest_id(self.manifest)

    def _load_bilingual(self) -> None:
        """The --train-subset split, and the --valid-subset split where there is one (or needed)."""
        from nmtkit.data.shards import load_split

        cfg, d = self.cfg, self.cfg.data_dir
        if cfg.train_subset not in self.manifest["splits"]:
            raise UserError(f"{d}: no split {cfg.train_subset!r} to train on (it has {', '.join(self.manifest['splits'])})")
        self.train_src = load_split(d, cfg.train_subset, self.src_lang, verify=True)
        self.train_tgt = load_split(d, cfg.train_subset, self.tgt_lang, verify=True)
        self.has_valid = (not cfg.no_validate) and cfg.valid_subset in self.manifest["splits"]
        self._check_validation_possible()
        if self.has_valid:
            self.valid_src = load_split(d, cfg.valid_subset, self.src_lang, verify=True)
            self.valid_tgt = load_split(d, cfg.valid_subset, self.tgt_lang, verify=True)

    def _check_validation_possible(self) -> None:
        cfg = self.cfg
        if not cfg.no_validate and not self.has_valid:
            if cfg.patience or cfg.eval_bleu or cfg.validate_interval_updates:
                raise UserError(
                    f"{cfg.data_dir}: no {cfg.valid_subset!r} split, but --patience/--eval-bleu/--validate-interval-updates "
                    "need one (preprocess with --validpref)"
                )

    def _load_multilingual(self) -> None:
        """Each pair's SPLIT.SRC-TGT of the --train-subset kind (all must exist), and of the
        --valid-subset kind where it exists: those pairs are the validated directions."""
        cfg, d, splits = self.cfg, self.cfg.data_dir, self.manifest["splits"]
        missing = [pair_name(s, t) for s, t in self.pairs if split_name(cfg.train_subset, s, t) not in splits]
        if missing:
            raise UserError(f"{d}: no {cfg.train_subset!r} split of pair(s) {', '.join(missing)} to train on "
                            f"(expected {split_name(cfg.train_subset, *self.pairs[0])} ...; preprocess with --trainpref)")
        self.train_pair_data = [load_pair_split(d, self.manifest, cfg.train_subset, s, t) for s, t in self.pairs]
        self.valid_pairs = [] if cfg.no_validate else [
            (s, t) for s, t in self.pairs if split_name(cfg.valid_subset, s, t) in splits]
        self.has_valid = bool(self.valid_pairs)
        self._check_validation_possible()
        self.valid_pair_data = [load_pair_split(d, self.manifest, cfg.valid_subset, s, t) for s, t in self.valid_pairs]
        self.tag_ids = frozenset(self.tgt_dict.index(tag_token(lang)) for lang in langs_of(self.manifest)
                                 if tag_token(lang) in self.tgt_dict)

    def _check_save_dir(self) -> None:
        """The checkpoint this run starts from must fit the data and settings (start.Start.check)."""
        self.pad_multiple = 8 if self.device.type == "cuda" else 1
        self.start.check(self.cfg, self.cfg.data_dir, self.manifest, self.dictionaries, self.manifest_id,
                         self._batching_key())
        # the stored tensors must fit the architecture before any model is built (a crafted config
        # with a huge d_ff would otherwise allocate gigabytes first)
        state = self.start.state
        if state is not None:
            from nmtkit.models.loading import check_weights

            for key in ("model", "ema"):
                if state.get(key) is not None:
                    check_weights(state[key], self.arch_cfg, len(self.src_dict), len(self.tgt_dict),
                                  f"{self.start.path} ({key})", pad_idx=self.src_dict.pad)

    def _batching_key(self) -> dict:
        """The settings that fix the batch plan: a saved data position is a place in it."""
        cfg = self.cfg
        key = {"max_tokens": cfg.max_tokens, "batch_size": cfg.batch_size, "seed": cfg.seed,
               "pad_multiple": self.pad_multiple, "world_size": self.info.world_size}
        if self.pairs:  # which pairs, and their shares, fix the epoch's selection
            key.update(lang_pairs=",".join(pair_name(s, t) for s, t in self.pairs),
                       sampling_temperature=cfg.sampling_temperature)
        return key

    def _autocast(self):
        return autocast(self.device, self.amp_dtype)

    def _build(self) -> None:
        """The seeded model and its optimizer, schedule, scaler and EMA; restored when resuming."""
        import random

        from nmtkit.models.loading import build_model

        cfg, info = self.cfg, self.info
        # before the optimizer: building one imports torch._dynamo, which fixes the cache folder
        self._compile_cache, self._compile_note = use_cache_folder() if cfg.compile else (None, None)
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        model = build_model(self.arch_cfg, self.src_dict, self.tgt_dict).to(self.device)
        params = [p for p in model.parameters() if p.requires_grad]
        self.n_params = sum(p.numel() for p in params)
        self.objs = TrainingObjects(
            model=model, optimizer=self._optimizer(params),
            schedule=Schedule(cfg.lr_scheduler, warmup=self.warmup, d_model=self.arch_cfg.d_model,
                              lr_scale=cfg.lr_scale, peak_lr=cfg.lr, warmup_init_lr=cfg.warmup_init_lr),
            scaler=torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16"),
            ema=EMA(model, cfg.ema_decay) if cfg.ema_decay > 0 else None)
        self.state = TrainState()
        self.resumed = self.start.resumed
        self._resume_batching = None
        if self.start.kind == "resume":
            self._resume_batching = checkpoint_state.restore(self.start.state, self.objs, self.state, info, cfg,
                                                             resets=self.start.resets)
        else:
            if self.start.kind == "finetune":
                checkpoint_state.restore_finetune(self.start.state, self.objs, cfg.ema, cfg.ema_decay,
                                                  f"--finetune-from-model {self.start.path}")
            torch.manual_seed(cfg.seed + info.rank)  # different dropout masks per rank
        self.start.state = None  # restored: the checkpoint's tensors are no longer needed
        forward_model, ddp = self._wrap(model)
        self.update_step = UpdateStep(self.objs, forward_model, ddp, device=self.device, info=info,
                                      amp_dtype=self.amp_dtype, epsilon=self.epsilon, clip_norm=cfg.clip_norm)

    def _optimizer(self, params: list) -> torch.optim.Optimizer:
        cfg = self.cfg
        opt_kwargs: dict[str, Any] = dict(lr=0.0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps,
                                          weight_decay=cfg.weight_decay)
        # AdamW: with --weight-decay 0 (the paper) it is exactly Adam; with decay it is decoupled,
        # as fairseq's adam does. The fused kernel (CPU and CUDA) updates all parameters in one
        # pass per tensor; on CPU it measured 3-10x faster than the default per-parameter loop.
        try:
            return torch.optim.AdamW(params, fused=True, **opt_kwargs)
        except (RuntimeError, ValueError, TypeError):  # a torch build without the fused kernel here
            return torch.optim.AdamW(params, **opt_kwargs)

    def _wrap(self, model: torch.nn.Module) -> tuple[torch.nn.Module, Any]:
        """(the model as the step calls it: DDP- and/or compile-wrapped, the DDP wrapper or None)."""
        ddp = None
        fwd: torch.nn.Module = model
        if self.info.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            with D.collective("DDP's parameter broadcast", self.info, "set-up"):  # rank 0's weights to all
                ddp = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                          broadcast_buffers=False)
            fwd = ddp
        self._eager_forward = None
        if self.cfg.compile:
            self._eager_forward = fwd  # for the probe before the first update (_probe_compile)
            fwd = torch.compile(fwd, dynamic=True)
        return fwd, ddp

    def _probe_compile(self, batches: list) -> None:
        """With --compile, before this process's first update: compile on its first batch and time
        a pass eager and compiled (training/compiled.py); one line and a `compile` log record."""
        if self._eager_forward is None:
            return
        step, eager = self.update_step, self._eager_forward
        self._eager_forward = None
        if self._compile_note and self.info.is_main:  # the cache folder could not be made
            self.progress.line(self._compile_note, style="yellow")
        try:
            report = probe(lambda model: step.pass_through(model, batches[0]), eager, step.forward_model,
                           self.device, step.params, self._compile_cache)
        except Exception as e:  # noqa: BLE001 - the probe has dropped its gradients
            cause = e.cause if isinstance(e, CompileFailed) else e  # else: raised by an eager pass
            if is_oom(cause) and not self.info.enabled:  # the first update will meet it too, and skip it
                if self.info.is_main:
                    self.progress.line("--compile: out of memory while timing the first batch; no figures",
                                       style="yellow")
                return
            if isinstance(e, CompileFailed):
                raise UserError(f"--compile: torch.compile failed ({type(cause).__name__}: {first_line(cause)}); "
                                "train without --compile") from cause
            raise
        if self.info.is_main:
            self.log.write({"type": "compile", "update": self.state.update, **report.record()})
            self.progress.line(report.line(), style="yellow" if report.speedup < 1.0 else None)

    def _make_iterators(self) -> None:
        cfg, a = self.cfg, self.arch_cfg
        limits = dict(max_tokens=cfg.max_tokens, max_sentences=cfg.batch_size, max_source_positions=a.max_source_positions,
                      max_target_positions=a.max_target_positions, pad_multiple=self.pad_multiple)
        if self.pairs:  # every pair's sentences, temperature-sampled per epoch, batched together
            self.train_batches = SampledEpochBatches(self.train_pair_data, temperature=cfg.sampling_temperature,
                                                     seed=cfg.seed, rank=self.info.rank,
                                                     world_size=self.info.world_size, **limits)
            self.train_src, self.train_tgt = self.train_batches.src_ds, self.train_batches.tgt_ds
        else:
            self.train_batches = EpochBatches(self.train_src, self.train_tgt, shuffle=True, seed=cfg.seed,
                                              rank=self.info.rank, world_size=self.info.world_size, **limits)
        self.batching_key = self._batching_key()
        self.identity = checkpoint_state.RunIdentity(cfg, self.arch_cfg.to_dict(), self.dictionaries,
                                                     self.manifest_id, self.batching_key)
        self.validator = None  # bilingual
        self.validators: dict[str, Validator] = {}  # multilingual: direction -> its validator
        self.unvalidatable: dict[str, Validator] = {}  # directions whose every valid pair is skipped
        if self.has_valid and self.pairs:
            built = {pair_name(s, t): Validator(src, tgt, info=self.info, **limits)
                     for (s, t), (src, tgt) in zip(self.valid_pairs, self.valid_pair_data)}
            self.validators = {k: v for k, v in built.items() if v.n_pairs}
            self.unvalidatable = {k: v for k, v in built.items() if not v.n_pairs}
            if not self.validators:
                raise UserError(f"no direction has a validation pair that fits the model ("
                                + "; ".join(f"{k}: {v.filter.describe() or 'empty'}" for k, v in built.items())
                                + "); check --max-tokens and the model's position limits, or train with --no-validate")
        elif self.has_valid:
            self.validator = Validator(self.valid_src, self.valid_tgt, info=self.info, **limits)
            f = self.validator.filter
            if not self.validator.n_pairs:  # its loss would read 0 bits, the best there can be
                why = f"all {f.skipped} skipped: {f.describe()}" if f.skipped else "the split is empty"
                raise UserError(f"no validation pair fits the model ({cfg.valid_subset}: {why}); check --max-tokens "
                                "and the model's position limits, or train with --no-validate")

    def _prepare_run(self) -> None:
        """Start this run's bookkeeping (clocks from now); after _build."""
        st = self.state
        self.loop = LoopState(elapsed_base=st.elapsed_s, saved_at_update=st.update if self.resumed else -1,
                              last_valid_update=st.update if self.resumed else -1)

    # ------------------------------------------------------------------------------------------
    # checkpoints

    def _checkpoint_state(self) -> dict:
        return checkpoint_state.build(self.objs, self.state, self.identity, self.info)

    def _save(self, names: list[str]) -> None:
        """Write checkpoint_last.pt (always) and the other `names` of it before it (rank 0 writes)."""
        t0 = time.perf_counter()
        lp = self.loop
        where = f"checkpoint at update {self.state.update}"  # for the message of a collective that fails
        if lp.best_pending:
            names = [*names, BEST]
        self.state.elapsed_s = lp.elapsed()
        with D.during(where):
            state = self._checkpoint_state()  # collective (RNG gather): every rank calls it
        if self.info.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            # the other names first, checkpoint_last.pt last: a kill before its rename leaves the
            # previous one, from which the rerun redoes these updates and writes these names again
            others = [self.save_dir / n for n in dict.fromkeys(names) if n != LAST]
            ck.save_checkpoint(state, self.save_dir / LAST, links=others)
            lp.saved_at_update = self.state.update  # the file holds it now: a stop from here on says so
            removed = ck.prune_checkpoints(self.save_dir, self.cfg.keep_last_updates, self.cfg.keep_last_epochs)
            self.log.write({"type": "checkpoint", "update": self.state.update, "files": [LAST, *names],
                            "removed": [p.name for p in removed], "seconds": round(time.perf_counter() - t0, 3)})
        D.barrier(self.info, where)
        lp.saved_at_update = self.state.update
        lp.best_pending = False

    def _tidy_save_dir(self) -> None:
        """Finish what a killed save left undone (under the save-dir lock, before anything is written).

        Its temporary files go, and the pruning it may not have reached is done; the checkpoint
        names it may have missed come back when the updates since checkpoint_last.pt are redone
        (_save writes checkpoint_last.pt after them).
        """
        ck.remove_leftovers(self.save_dir)
        if self.save_dir.is_dir():
            ck.prune_checkpoints(self.save_dir, self.cfg.keep_last_updates, self.cfg.keep_last_epochs)

    def _final_save(self) -> None:
        """checkpoint_last.pt (and the best, if pending) unless this update was just saved."""
        if self.loop.saved_at_update != self.state.update or self.loop.best_pending:
            self._save([])

    # ------------------------------------------------------------------------------------------
    # one update

    def _train_step(self, batches: list) -> StepResult:
        """One update over this rank's micro-batches (step.UpdateStep), counted in the TrainState."""
        lp = self.loop
        out = self.update_step(batches, self.state.update + 1,
                               lp.local_flags(self.cfg.max_time, self.cfg.save_interval_minutes))
        lp.flags = out.flags
        self.state.count(out)
        return out

    def _on_signal(self, signum, frame) -> None:
        if self.loop.signal is not None:  # a second Ctrl-C: stop now, without saving
            raise KeyboardInterrupt
        self.loop.signal = signum
        if self.info.is_main:
            self.progress.line(f"received {signal.Signals(signum).name}: saving {LAST} after this update, then stopping "
                               "(press Ctrl-C again to stop at once without saving)", style="yellow")

    # ------------------------------------------------------------------------------------------
    # validation

    def _validate(self) -> dict:
        """Validate, log the `valid` record and keep the best: of the one valid split, or of every
        direction of a multilingual run, whose unweighted means are the record's figures."""
        cfg, st = self.cfg, self.state
        model = self.ema.model if self.ema is not None else self.model
        with D.during(f"validation at update {st.update}"):  # its sums and BLEU's gather are collectives
            if self.pairs:
                directions = {name: self._valid_figures(v, model) for name, v in self.validators.items()}
                figures = mean_figures(directions)
            else:
                directions, figures = None, self._valid_figures(self.validator, model)
        bleu = figures.pop("bleu", None)
        rec = {"type": "valid", "epoch": st.last_epoch_done, "update": st.update, **figures,
               "weights": "ema" if self.ema is not None else "raw"}
        if cfg.eval_bleu:
            rec["bleu"] = bleu
        if directions is not None:
            rec["directions"] = directions
        value = rec["bleu"] if cfg.best_checkpoint_metric == "bleu" else rec["nll_loss"]
        better = math.isfinite(value) and (st.best is None or (
            value > st.best if cfg.best_checkpoint_metric == "bleu" else value < st.best))
        if better:
            st.best = value
            st.bad_validations = 0
            self.loop.best_pending = True
        else:
            st.bad_validations += 1
        rec.update(best=st.best, improved=bool(better), bad_validations=st.bad_validations)
        self.loop.last_valid_update = st.update
        if self.info.is_main:
            self.log.write(rec)
            self.progress.line(valid_line(rec))
        return rec

    def _valid_figures(self, validator: Validator, model: torch.nn.Module) -> dict:
        """loss, nll_loss, ppl, tgt_tokens (and bleu with --eval-bleu) of one validation split."""
        cfg = self.cfg
        res = validator.loss(model, self.device, self._autocast, self.epsilon)
        out = {"loss": res.loss, "nll_loss": res.nll_loss, "ppl": res.ppl, "tgt_tokens": res.ntokens}
        if cfg.eval_bleu:
            out["bleu"] = validator.bleu(
                model, self.device, self._autocast, self._to_text, beam=cfg.eval_bleu_beam,
                lenpen=cfg.eval_bleu_lenpen, decoding=cfg.eval_bleu_decoding, max_len_a=cfg.eval_bleu_max_len_a,
                max_len_b=cfg.eval_bleu_max_len_b, max_target_positions=self.arch_cfg.max_target_positions,
            )
        return out

    def _to_text(self, ids: list[int]) -> str:
        """Detokenized text of ids, without pad/<s>/</s> and (multilingual) language tags."""
        if not hasattr(self, "_subword"):
            from nmtkit.data.subwords import load_subword_model

            self._subword = load_subword_model(self.cfg.data_dir, self.tgt_lang)
        return self._subword.decode(self.tgt_dict.string([i for i in ids if i >= 3 and i not in self.tag_ids]))

    # ------------------------------------------------------------------------------------------
    # the run

    def run(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self._launcher.start(self._saved_note)
        try:
            lock = _SaveDirLock(self.save_dir) if info.is_main else None
            try:
                if info.is_main:
                    self._tidy_save_dir()
                D.init(info, self.device.type, cfg.ddp_timeout)
                try:
                    return self._run()
                except D.CollectiveFailed as e:  # a collective that timed out or lost a peer: one line
                    raise self._collective_failed(e) from None
                finally:
                    D.shutdown(info)
            finally:
                if lock is not None:
                    lock.release()
        finally:
            self._launcher.close()

    def _collective_failed(self, failed: D.CollectiveFailed) -> UserError:
        """The run's last word on a failed collective: no save is possible (the other ranks cannot
        take part), so it says which checkpoint the same command resumes from, and logs the end."""
        message = f"{failed}; {self._saved_note()} (run the same command to resume)"
        log = getattr(self, "log", None)
        if log is not None:
            log.write({"type": "end", "update": self.state.update, "reason": "failed", "message": message})
        return UserError(message)

    def _saved_note(self) -> str:
        """Where the last checkpoint of this run stands (for a stop that cannot save)."""
        loop = getattr(self, "loop", None)
        saved = loop.saved_at_update if loop is not None else -1
        return (f"{self.save_dir / LAST} holds update {saved}" if saved >= 0 else
                f"no {LAST} was written yet")

    def _run(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        if info.enabled:  # before anything that waits on the others: fail fast, not at the timeout
            check_same_start(D.all_gather_objects(describe_start(self.start, self.save_dir), info, "set-up"))
        self._build()
        self._make_iterators()
        st = self.state
        if info.is_main:
            self.save_dir.mkdir(parents=True, exist_ok=True)
        tensorboard = None
        if info.is_main and cfg.tensorboard_logdir:
            # purge_step: curves written after the checkpoint (by a run that then crashed) are
            # dropped, so the resumed run continues them without overlapping points
            tensorboard = TensorBoardLog(cfg.tensorboard_logdir, purge_step=st.update + 1)
        self.log = JsonlLog(self.save_dir / cfg.log_file if info.is_main else None, tensorboard=tensorboard)
        self.progress = TrainProgress(cfg.progress_bar and info.is_main, cfg.max_update or None, st.update,
                                      self._console)
        self._prepare_run()
        result = TrainResult(reason="", update=st.update, epoch=st.epoch, save_dir=self.save_dir, best=st.best)
        old_handlers = {}
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                old_handlers[s] = signal.signal(s, self._on_signal)
            except ValueError:  # not the main thread (e.g. some test runners): no signal handling
                pass
        try:
            self._log_start()
            result.reason = stop_reason(cfg, st, self.loop.flags, "start") or self._loop(result)
        except TrainingStopped as e:
            result.reason = "failed"
            self.log.write({"type": "end", "update": st.update, "reason": "failed", "message": str(e)})
            self.progress.close()
            raise UserError(f"{e} ({LAST} was left as it was)") from None
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            self.progress.close()
        return self._finish(result)

    def _finish(self, result: TrainResult) -> TrainResult:
        st = self.state
        result.update, result.epoch, result.best = st.update, st.last_epoch_done, st.best
        result.nan_skips, result.oom_skips = st.nan_skips, st.oom_skips
        result.interrupted_by = self.loop.signal
        self.log.write({"type": "end", "update": st.update, "epoch": st.epoch, "reason": result.reason,
                        "nan_skips": st.nan_skips, "oom_skips": st.oom_skips, "overflow_skips": st.overflow_skips,
                        "elapsed_s": round(self.loop.elapsed(), 3)})
        self.log.close()
        return result

    def _log_start(self) -> None:
        st, f = self.state, self.train_batches.filter
        if not self.info.is_main:
            return
        start = self.start
        # sampled epochs differ a little in size: a multilingual run names its current epoch's
        n_batches = len(self.train_batches.batches(st.epoch)) if self.pairs else len(self.train_batches)
        padding = self.train_batches.batches(st.epoch).padding  # this epoch's; later ones: _log_epoch
        self.log.write({"type": "start", "update": st.update, "epoch": st.epoch, "resumed": self.resumed,
                        "start": start.kind, "from": str(start.path) if start.path else None,
                        **({"weights": "ema" if self.cfg.ema else "raw", "from_update": start.ckpt_update}
                           if start.kind == "finetune" else {}),
                        "arch_changes": start.changed, "resets": [r for r, on in start.resets.items() if on],
                        "arch": self.cfg.arch, "arch_config": self.arch_cfg.to_dict(), "params": self.n_params,
                        "world_size": self.info.world_size, "device": str(self.device),
                        "precision": self.cfg.precision, "train_pairs": len(self.train_src),
                        "train_pairs_skipped": f.skipped, "batches_per_epoch": n_batches,
                        "padding": padding.to_dict(),
                        **({"multilingual": self._pairs_summary()} if self.pairs else {}),
                        "peak_rss_mib": _peak_rss_mib()})
        for note in start.notes:
            self.progress.line(note, style="yellow")
        if start.kind == "resume":
            where = f"resuming from {self.save_dir / LAST} at update {st.update} (epoch {st.epoch}, batch {st.batch_offset})"
        elif start.kind == "finetune":
            where = (f"fine-tuning from {start.path} ({'EMA' if self.cfg.ema else 'raw'} weights of its update "
                     f"{start.ckpt_update}) as a new run")
        else:
            where = "starting"
        self.progress.line(
            f"{where}: {self.cfg.arch} ({self.n_params / 1e6:.1f}M parameters) on {self.device}"
            f"{f' x {self.info.world_size} processes' if self.info.enabled else ''}, {self.cfg.precision}; "
            f"{len(self.train_src)} training pairs, {n_batches} batches per epoch"
            f"{' per process' if self.info.enabled else ''}, {padding_text(padding)}")
        if self.pairs:
            self._log_pairs()
        if start.changed:
            self.progress.line("changed from the checkpoint: " + ", ".join(
                f"{k} {old} -> {new}" for k, (old, new) in start.changed.items()), style="yellow")
        for r, on in start.resets.items():
            if on:
                self.progress.line(f"--{r.replace('_', '-')}: {RESET_EFFECTS[r]}", style="yellow")
        if f.skipped:
            self.progress.line(f"skipping {f.skipped} training pair(s) that do not fit the model: {f.describe()}",
                               style="yellow")
        for name, v in self.unvalidatable.items():
            why = f"all {v.filter.skipped} are skipped ({v.filter.describe()})" if v.filter.skipped else "it is empty"
            self.progress.line(f"{name}: no validation pair fits the model, {why}: the direction is left out of "
                               "validation and of its means", style="yellow")
        for name, v in ([("", self.validator)] if self.validator is not None else list(self.validators.items())):
            if v.filter.skipped:
                self.progress.line(f"skipping {v.filter.skipped} validation pair(s){f' of {name}' if name else ''} "
                                   f"that do not fit the model: {v.filter.describe()}", style="yellow")

    def _pairs_summary(self) -> dict:
        """The start record's `multilingual` entry: per language pair its training sentences, its
        sampling share at --sampling-temperature and its sentences per epoch; the validated ones."""
        b = self.train_batches
        shares, per_epoch = b.shares(), b.per_epoch()
        return {"sampling_temperature": self.cfg.sampling_temperature,
                "pairs": {pair_name(s, t): {"sentences": n, "share": float(q), "per_epoch": int(k)}
                          for (s, t), n, q, k in zip(self.pairs, b.counts, shares, per_epoch)},
                "valid_directions": list(self.validators), "valid_left_out": list(self.unvalidatable)}

    def _log_pairs(self) -> None:
        """The pairs, their sentences and sampling shares; the pairs that have no validation split."""
        summary = self._pairs_summary()
        self.progress.line(f"{len(self.pairs)} language pairs, sampled at temperature "
                           f"{self.cfg.sampling_temperature:g} (1 = in proportion to the data): " + ", ".join(
                               f"{name} {p['sentences']} sentences, share {p['share']:.3f} ({p['per_epoch']} per epoch)"
                               for name, p in summary["pairs"].items()))
        unvalidated = [name for name in summary["pairs"] if name not in self.validators]
        if self.has_valid and unvalidated:
            self.progress.line(f"no {self.cfg.valid_subset!r} split for {', '.join(unvalidated)}: validation "
                               "averages over the other directions", style="yellow")

    # ------------------------------------------------------------------------------------------
    # the loop

    def _loop(self, result: TrainResult) -> str:
        """Updates until a stopping rule fires; -> its reason."""
        cfg, st = self.cfg, self.state
        self._check_first_epoch()
        first = True  # the start record reports the first epoch's padding
        while True:
            batches = self.train_batches.batches(st.epoch)
            if not first:
                self._log_epoch(batches)
            first = False
            updates, ooms = st.update, st.oom_skips
            for group, collated in self._groups(batches, st.batch_offset):
                self._probe_compile(collated)
                out = self._train_step(collated)
                st.batch_offset += len(group)
                if not self.info.enabled:  # one process: act on the newest state (no need to agree with others)
                    self.loop.flags = self.loop.local_flags(cfg.max_time, cfg.save_interval_minutes)
                self._after_step(out, result)
                if out.skip == "nan":
                    stop_reason(cfg, st, self.loop.flags, "step")  # raises after --max-nan-skips in a row
                if st.batch_offset >= len(batches):  # the epoch's last update: _end_epoch below handles it
                    break
                reason = self._after_update(out)
                if reason:
                    return reason
            check_epoch_progress(st.epoch, st.update - updates, st.oom_skips - ooms)
            reason = self._end_epoch()  # also when a resumed position was already past the end
            if reason:
                return reason

    def _log_epoch(self, batches) -> None:
        """The `epoch` record and line of a new epoch: its batches and their padding (rank 0's)."""
        if not self.info.is_main:
            return
        st = self.state
        self.log.write({"type": "epoch", "update": st.update, "epoch": st.epoch, "batches": len(batches),
                        "padding": batches.padding.to_dict()})
        self.progress.line(f"epoch {st.epoch}: {len(batches)} batches, {padding_text(batches.padding)}")

    def _check_first_epoch(self) -> None:
        st, info = self.state, self.info
        if len(self.train_batches.batches(st.epoch)) == 0:
            raise UserError(
                f"no training batches: all {len(self.train_src)} pairs were skipped or there are fewer batches than "
                f"processes ({info.world_size}); check --max-tokens and the model's position limits")
        key = self._resume_batching
        if self.resumed and key and key != self.batching_key and info.is_main and not self.start.resets.get("reset_dataloader"):
            self.progress.line(f"batching settings changed since the checkpoint ({key} -> {self.batching_key}); "
                               f"epoch {st.epoch} continues at batch {st.batch_offset} of the new plan", style="yellow")

    def _groups(self, batches, start: int):
        """(batch index arrays, collated batches) of each update of the epoch from batch `start` on.

        With prefetching (default on CUDA) the next update's batches are collated and pinned in a
        background thread while the current update runs on the device.
        """
        k = self.cfg.update_freq
        starts = range(start, len(batches), k)  # group j is made when due, not listed up front
        pin = self.device.type == "cuda"

        def group(j):
            return batches[starts[j] : starts[j] + k]

        def make(g):
            out = [collate(self.train_src, self.train_tgt, idx, self.pad_multiple) for idx in g]
            return [b.pin_memory() for b in out] if pin else out

        prefetch = self.cfg.prefetch if self.cfg.prefetch is not None else self.device.type == "cuda"
        if not prefetch or not starts:
            for j in range(len(starts)):
                g = group(j)
                yield g, make(g)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmtkit-collate") as pool:
            nxt = group(0)
            future = pool.submit(make, nxt)
            for j in range(len(starts)):
                g, collated = nxt, future.result()
                if j + 1 < len(starts):
                    nxt = group(j + 1)
                    future = pool.submit(make, nxt)
                yield g, collated

    def _after_step(self, out: StepResult, result: TrainResult) -> None:
        """Log a skip, or add an applied update to the interval (and write its record when due)."""
        cfg, st = self.cfg, self.state
        if out.skip is not None and self.info.is_main:
            self._log_skip(out)
        if not out.applied:
            return
        interval = self.loop.interval
        interval.add(out)
        result.losses.append(bits_per_token(out.loss_sum, out.ntokens))
        if st.update % cfg.log_interval == 0 or (cfg.max_update and st.update >= cfg.max_update):
            rec = interval.record(st, out.lr, self.scaler.get_scale() if self.scaler.is_enabled() else None,
                                  _peak_rss_mib())
            if self.info.is_main:
                self.log.write(rec)
                if not self.progress.live:
                    self.progress.line(
                        f"train | epoch {rec['epoch']} | update {rec['update']} | loss {rec['loss']:.3f} | "
                        f"nll_loss {rec['nll_loss']:.3f} | ppl {rec['ppl']:.2f} | lr {rec['lr']:.3g} | "
                        f"gnorm {rec['gnorm']:.3f} | {rec['tgt_tok_per_s']:.0f} tgt tok/s")
                self.progress.update(st.update, st.epoch, rec, out.lr)
        elif self.info.is_main:
            self.progress.update(st.update, st.epoch, None, out.lr)

    def _log_skip(self, out: StepResult) -> None:
        st = self.state
        rec = {"type": "skip", "reason": out.skip, "update": st.update, "epoch": st.epoch,
               "nan_skips": st.nan_skips, "oom_skips": st.oom_skips}
        if out.skip == "oom":
            rec["batches"] = out.shapes
            self.progress.line(f"out of memory on batch(es) {out.shapes} (sentences x src/tgt length) at "
                               f"update {st.update + 1}: skipped ({st.oom_skips} so far); consider a lower "
                               "--max-tokens", style="yellow")
        elif out.skip == "nan":
            self.progress.line(f"non-finite loss or gradient at update {st.update + 1}: update skipped "
                               f"({st.nan_skips} so far, {st.consecutive_nan} in a row)", style="yellow")
        else:
            rec["loss_scale"] = self.scaler.get_scale()
        self.log.write(rec)

    def _after_update(self, out: StepResult) -> str | None:
        """Inside an epoch: validation and checkpoints when due; -> the stopping reason, if any."""
        cfg, st, lp = self.cfg, self.state, self.loop
        validated = bool(self.has_valid and cfg.validate_interval_updates and out.applied
                         and st.update % cfg.validate_interval_updates == 0)
        bleu = self._validate().get("bleu") if validated else None
        reason = stop_reason(cfg, st, lp.flags, "update", validated=validated, bleu=bleu)
        if reason != "patience":  # patience: no interval checkpoint, only the final save
            interval_due = out.applied and cfg.save_interval_updates and st.update % cfg.save_interval_updates == 0
            if interval_due or lp.flags.timed_save:
                self._save([f"checkpoint_{st.epoch}_{st.update}.pt"])
            elif lp.best_pending:
                self._save([])
            if lp.flags.timed_save:
                lp.last_timed_save = time.monotonic()
        if reason:
            self._final_save()
        return reason

    def _end_epoch(self) -> str | None:
        """Validation and the epoch checkpoint at the end of an epoch; -> the stopping reason, if any."""
        cfg, st = self.cfg, self.state
        finished = st.epoch
        st.epoch += 1
        st.batch_offset = 0
        bleu = None
        if self.has_valid and self.loop.last_valid_update != st.update:
            bleu = self._validate().get("bleu")
        names = [] if cfg.no_epoch_checkpoints else [f"checkpoint{finished}.pt"]
        if cfg.save_interval_updates and st.update % cfg.save_interval_updates == 0 and \
                self.loop.saved_at_update != st.update:
            names.append(f"checkpoint_{finished}_{st.update}.pt")
        self._save(names)
        return stop_reason(cfg, st, self.loop.flags, "epoch_end", finished_epoch=finished, bleu=bleu)


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

        from nmtkit.io import reporting_disk_full

        with reporting_disk_full(directory / ".nmtkit-train.lock"):
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


def train(cfg: TrainConfig, progress_console=None) -> TrainResult:
    """Train according to `cfg` (resuming from SAVE_DIR/checkpoint_last.pt if it exists)."""
    return Trainer(cfg, progress_console).run()
