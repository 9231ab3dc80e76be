"""What a training checkpoint holds, and how the training objects are restored from one.

Why one module: the checkpoint is the contract between a run and its resumption (and, later,
fine-tuning, which restores only some parts: weights without optimizer, a fresh schedule...).
`build` is the only place that decides the keys (checkpoints.py's docstring and docs/formats.md
describe them; they must not change, so that older checkpoints keep loading); `restore_*` are
the only places that read them back. File writing (atomic, links, pruning) is the trainer's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError, first_line
from nmtkit.training import distributed as D
from nmtkit.training.config import TrainConfig
from nmtkit.training.ema import EMA
from nmtkit.training.state import TrainState
from nmtkit.training.step import TrainingObjects


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint says about the run beyond its tensors: settings, model and data."""

    cfg: TrainConfig
    arch_config: dict  # ArchConfig.to_dict()
    dictionaries: dict  # sha256, sizes and languages of both dictionaries
    manifest_id: str  # the data dir's content id
    batching_key: dict  # settings that fix the batch plan (a resume under others warns)


def build(objs: TrainingObjects, st: TrainState, who: RunIdentity, info: D.DistInfo) -> dict:
    """The checkpoint dict of the current training state (collective: gathers every rank's RNG)."""
    cfg = who.cfg
    rngs = D.all_gather_objects(ck.rng_state(), info)
    state: dict[str, Any] = {
        ck.MAGIC: ck.FORMAT_VERSION,
        "arch": cfg.arch,
        "arch_config": who.arch_config,
        "model": objs.model.state_dict(),
        "dictionaries": dict(who.dictionaries),
        "data_manifest_id": who.manifest_id,
        "update": st.update,
        "epoch": st.last_epoch_done,
        "train_args": cfg.to_dict(),
        "train": {
            "optimizer": objs.optimizer.state_dict(),
            "scheduler": {**objs.schedule.state_dict(), "update": st.update},
            "scaler": objs.scaler.state_dict() if objs.scaler.is_enabled() else {},
            "rng": rngs,
            "data_position": {"epoch": st.epoch, "batch_offset": st.batch_offset,
                              "world_size": info.world_size, "batching": who.batching_key},
            "early_stopping": {"metric": cfg.best_checkpoint_metric, "best": st.best,
                               "bad_validations": st.bad_validations, "patience": cfg.patience},
            "counters": {"nan_skips": st.nan_skips, "oom_skips": st.oom_skips,
                         "overflow_skips": st.overflow_skips, "elapsed_s": st.elapsed_s},
            "state": st.to_dict(),
        },
    }
    if objs.ema is not None:
        state["ema"] = objs.ema.state_dict()
    if st.best is not None:
        state["best"] = {"metric": cfg.best_checkpoint_metric, "value": st.best}
    return state


def restore_weights(state: dict, objs: TrainingObjects, ema_decay: float) -> None:
    """The model's weights, and the EMA's (a fresh average of them if the checkpoint has none)."""
    objs.model.load_state_dict(state["model"])
    if objs.ema is not None:
        if state.get("ema") is not None:
            objs.ema.load_state_dict(state["ema"])
        else:
            objs.ema = EMA(objs.model, ema_decay)


def restore_optimization(state: dict, objs: TrainingObjects, cfg: TrainConfig | None = None) -> None:
    """Adam's moments and step counts and the fp16 loss scale (the schedule is a function of the update).

    With `cfg`, this run's --adam-betas, --adam-eps and --weight-decay replace the saved ones
    (fairseq's optimizer overrides): loading a state_dict would otherwise bring the old values
    back silently. Unchanged settings give the same values, so an exact resume stays exact.
    """
    tr = state["train"]
    objs.optimizer.load_state_dict(tr["optimizer"])
    if cfg is not None:
        for g in objs.optimizer.param_groups:
            g.update(betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    if tr.get("scaler"):
        objs.scaler.load_state_dict(tr["scaler"])


def restore_finetune(state: dict, objs: TrainingObjects, use_ema: bool, ema_decay: float, where: str) -> None:
    """The weights only (raw, or the EMA's with `use_ema`): the start of a fine-tuning run.

    Everything else stays as built: a fresh optimizer, schedule, data position and counters; the
    EMA (with --ema-decay) starts from the loaded weights, not from the checkpoint's average.
    """
    weights = state["ema"] if use_ema else state["model"]
    try:
        objs.model.load_state_dict(weights)
    except RuntimeError as e:
        raise UserError(f"{where}: weights do not fit its own architecture config: {first_line(e)}") from None
    if objs.ema is not None:
        objs.ema = EMA(objs.model, ema_decay)


def apply_resets(state: dict, objs: TrainingObjects, st: TrainState, resets: dict[str, bool]) -> None:
    """What --reset-lr-scheduler / --reset-optimizer, --reset-dataloader and --reset-meters drop
    after a full restore (docs/train.md "Continued training"); --reset-optimizer's own part (Adam
    not restored) is `restore`'s."""
    restart = resets.get("reset_optimizer") or resets.get("reset_lr_scheduler")
    start = st.update if restart else int(state["train"]["scheduler"].get("start", 0))
    objs.schedule = dataclasses.replace(objs.schedule, start=start)
    if resets.get("reset_dataloader") and st.batch_offset > 0:
        # a new epoch from its first batch; epochs keep counting, so the earlier run's
        # checkpointEPOCH.pt files are never overwritten and --max-epoch stays a total
        st.epoch += 1
        st.batch_offset = 0
    if resets.get("reset_meters"):
        st.nan_skips = st.consecutive_nan = st.oom_skips = st.overflow_skips = 0
        st.elapsed_s = 0.0
        st.best, st.bad_validations = None, 0


def restore_progress(state: dict, st: TrainState, info: D.DistInfo, seed: int) -> dict | None:
    """Counters, data position and random generators; -> the batching key the checkpoint was made under.

    Resuming with another number of processes keeps the global position (batches consumed x
    processes); the per-rank RNG states are restored only when the number matches (otherwise
    torch is seeded from the seed, rank and update).
    """
    tr = state["train"]
    for k, v in tr.get("state", {}).items():
        if hasattr(st, k):
            setattr(st, k, v)
    pos = tr["data_position"]
    st.epoch = int(pos["epoch"])
    offset, old_world = int(pos["batch_offset"]), int(pos.get("world_size", 1))
    if old_world != info.world_size:
        offset = (offset * old_world) // info.world_size
    st.batch_offset = offset
    rngs = tr.get("rng") or []
    if len(rngs) == info.world_size:
        ck.set_rng_state(rngs[info.rank])
    else:
        torch.manual_seed(seed + info.rank + 1000 * st.update)
    return pos.get("batching")


def restore(state: dict, objs: TrainingObjects, st: TrainState, info: D.DistInfo, cfg: TrainConfig,
            resets: dict[str, bool] | None = None) -> dict | None:
    """Everything, for resuming a run (exactly, without resets); -> the batching key the
    checkpoint was made under. `resets`: which --reset-* this run applies (start.Start.resets)."""
    resets = resets or {}
    restore_weights(state, objs, cfg.ema_decay)
    if not resets.get("reset_optimizer"):
        restore_optimization(state, objs, cfg)
    batching = restore_progress(state, st, info, cfg.seed)
    apply_resets(state, objs, st, resets)
    return batching
