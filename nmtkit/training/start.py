"""Where a training run starts, and with which model: fresh, resumed, or fine-tuned.

Why a module of its own: the three ways to start differ in what they take from a checkpoint,
  resume    SAVE_DIR/checkpoint_last.pt exists: everything (weights, Adam, schedule position,
            data position, counters, random generators), minus what the --reset-* flags drop;
  finetune  --finetune-from-model CKPT and no checkpoint_last.pt: the weights only (raw, or the
            EMA weights with --ema), as update 0 of a new run (fresh optimizer, schedule, data
            position and early stopping);
  fresh     neither: a seeded initialisation,
and in the rules that keep a run sound: the architecture comes from the checkpoint unless --arch
is given; only settings that change no weight's shape may differ from it; the dictionaries must
be the checkpoint's; a resumed run may not change its data or batches under a saved data position
without --reset-dataloader. The trainer calls `find_start` before building anything and
`Start.check` once the data directory is read; checkpoint_state.py restores the parts.

A save dir holding checkpoint_last.pt always resumes (fairseq's rule), also when the command
says --finetune-from-model, so re-running the same command after a crash continues the
fine-tuning instead of starting it again. For the same reason a --reset-* flag is applied once:
when checkpoint_last.pt was written by a run that already had the flag, it is not applied again
(except --reset-dataloader when the data or batches really differ from the checkpoint's).
A --reset-* flag without a checkpoint_last.pt to resume (a fresh or fine-tuning start) has
nothing to act on: the run says so once at start and goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError
from nmtkit.models.registry import ArchConfig
from nmtkit.training.config import TrainConfig, flag

LAST = "checkpoint_last.pt"
DEFAULT_ARCH = "transformer_base"
# ArchConfig fields that a resumed or fine-tuned run may change: no weight's shape depends on them
# (regularization and training defaults only).
NON_SHAPE_FIELDS = ("dropout", "attention_dropout", "activation_dropout", "label_smoothing", "warmup_steps")
NON_SHAPE_FLAGS = "--dropout, --attention-dropout, --activation-dropout, --label-smoothing, --warmup-updates"
RESETS = ("reset_optimizer", "reset_lr_scheduler", "reset_dataloader", "reset_meters")
# settings that fix the batch plan a saved data position points into (the last two: a multilingual
# run's pairs and their sampling, in the batching key of such runs only)
BATCHING_SETTINGS = ("max_tokens", "batch_size", "seed", "lang_pairs", "sampling_temperature")


@dataclass
class Start:
    """How this run starts (see the module docstring)."""

    kind: str  # "fresh" | "resume" | "finetune"
    path: Path | None  # checkpoint_last.pt or --finetune-from-model (None when fresh)
    state: dict | None  # the loaded checkpoint; released by the trainer once restored
    arch: str  # the architecture's name, as checkpoints record it
    arch_cfg: ArchConfig
    changed: dict[str, list] = field(default_factory=dict)  # non-shape field -> [checkpoint's, this run's]
    resets: dict[str, bool] = field(default_factory=dict)  # resume: reset name -> applied by this run
    notes: list[str] = field(default_factory=list)  # what the user should know (shown at start)
    ckpt_update: int | None = None  # the update the checkpoint was written at

    @property
    def resumed(self) -> bool:
        return self.kind == "resume"

    def check(self, cfg: TrainConfig, data_dir: str, manifest: dict, dictionaries: dict, manifest_id: str,
              batching_key: dict) -> None:
        """Refuse a checkpoint that does not fit this run (shape, dictionaries, data position)."""
        if self.state is None:
            return
        ours = self.arch_cfg.to_dict()
        theirs = _arch_dict(self.state, self.path)
        self.changed = {k: [theirs.get(k), ours[k]] for k in NON_SHAPE_FIELDS if theirs.get(k) != ours[k]}
        if self.kind == "resume":
            # the message of a resume (naming both architectures) is checkpoints.check_same_model's;
            # it compares the shape only: the non-shape fields are taken as the checkpoint has them
            saved = self.state["arch_config"]
            shape = {k: v for k, v in ours.items() if k not in NON_SHAPE_FIELDS}
            shape.update({k: saved[k] for k in NON_SHAPE_FIELDS if k in saved})
            ck.check_same_model(self.state, str(self.path), arch=self.arch, arch_config=shape,
                                dictionaries=dictionaries)
            self._check_resume(cfg, data_dir, manifest_id, batching_key)
        else:
            diffs = [f"{flag(k)} {theirs.get(k)!r} -> {ours[k]!r}" for k in ours
                     if k not in NON_SHAPE_FIELDS and theirs.get(k) != ours[k]]
            if diffs:
                raise UserError(
                    f"--finetune-from-model {self.path}: fine-tuning keeps the model's shape, but this run changes "
                    f"{'; '.join(diffs[:4])}{' ...' if len(diffs) > 4 else ''}; only {NON_SHAPE_FLAGS} may differ "
                    "(leave out --arch to take the checkpoint's architecture)")
            self._check_dictionaries(data_dir, manifest, dictionaries)

    def _check_dictionaries(self, data_dir: str, manifest: dict, dictionaries: dict) -> None:
        have = self.state.get("dictionaries") or {}
        where = f"--finetune-from-model {self.path}"
        mine, theirs = (have.get("src_lang"), have.get("tgt_lang")), (dictionaries["src_lang"], dictionaries["tgt_lang"])
        if None not in mine and mine != theirs:
            raise UserError(f"{where} translates {mine[0]}->{mine[1]}, but {data_dir} is {theirs[0]}->{theirs[1]}; "
                            f"fine-tune on data of the model's direction ({mine[0]}->{mine[1]})")
        old_dir = (self.state.get("train_args") or {}).get("data_dir")
        reuse = f"--srcdict {old_dir} --tgtdict {old_dir}" if old_dir else "--srcdict/--tgtdict (the model's data directory)"
        for side, name, lang in (("src", "source", theirs[0]), ("tgt", "target", theirs[1])):
            want, got = have.get(f"{side}_sha256"), dictionaries[f"{side}_sha256"]
            if want != got:
                dict_file = Path(data_dir) / manifest["dictionaries"][lang]["file"]
                raise UserError(
                    f"{where}: {dict_file} is not the model's {name} dictionary (sha256 {str(got)[:12]}... vs the "
                    f"model's {str(want)[:12]}...); binarize the new text with the model's dictionaries and subword "
                    f"model: nmtkit preprocess ... {reuse}")

    def _check_resume(self, cfg: TrainConfig, data_dir: str, manifest_id: str, batching_key: dict) -> None:
        tr = self.state["train"]
        prev = self.state.get("train_args") or {}
        pos = tr["data_position"]
        old_key = pos.get("batching") or {}
        changed = [(k, old_key[k], batching_key.get(k)) for k in BATCHING_SETTINGS
                   if k in old_key and old_key[k] != batching_key.get(k)]
        old_id = self.state.get("data_manifest_id")
        data_changed = old_id is not None and old_id != manifest_id
        for r in RESETS:
            given = bool(getattr(cfg, r))
            differs = r == "reset_dataloader" and (changed or data_changed)
            self.resets[r] = given and (differs or not prev.get(r))
            if given and not self.resets[r]:
                self.notes.append(f"{flag(r)}: not applied again ({self.path} was written by a run that already had it: "
                                  "the same command run again continues that run)")
        if self.resets["reset_dataloader"]:
            return
        where = f"{self.path} stopped at epoch {pos['epoch']}, batch {pos['batch_offset']}"
        if data_changed:
            raise UserError(
                f"{data_dir} is not the data directory {self.path} was trained on ({prev.get('data_dir', 'unknown')}, "
                f"other content); {where} of that data: add --reset-dataloader to continue on {data_dir} from the "
                "start of a new epoch")
        if changed:
            name, was, now = changed[0]
            raise UserError(
                f"{flag(name)} {_show(now)} differs from the {_show(was)} that {self.path} was trained with, and {where} "
                f"of the old batches: add --reset-dataloader to start a new epoch with the new batches (or give "
                f"{flag(name)} {_show(was)})")


def _show(v) -> str:
    return "unset" if v is None else str(v)


def _arch_dict(state: dict, path: Path | None) -> dict:
    try:
        return ArchConfig.from_dict(state["arch_config"]).to_dict()
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def find_start(cfg: TrainConfig, save_dir: Path) -> Start:
    """Load the checkpoint this run starts from (if any) and resolve the architecture."""
    from nmtkit.models.registry import apply_overrides, get_arch

    last = save_dir / LAST
    state, path, kind = None, None, "fresh"
    if last.exists():
        state, path, kind = ck.load_checkpoint(last), last, "resume"
        if "train" not in state:
            raise UserError(f"{last} is an inference checkpoint (no training state); it cannot be resumed")
        ck.check_training_state(state, last)
    elif cfg.finetune_from_model:
        path, kind = Path(cfg.finetune_from_model), "finetune"
        try:
            state = ck.load_checkpoint(path)
        except UserError as e:
            raise UserError(f"--finetune-from-model: {e}") from None
        if cfg.ema and state.get("ema") is None:
            raise UserError(f"--ema: {path} holds no EMA weights (trained without --ema-decay); leave out --ema to "
                            "start from its raw weights")
    if cfg.arch is not None:
        name, base = cfg.arch, get_arch(cfg.arch)
    elif state is not None:
        name, base = str(state["arch"]), ArchConfig.from_dict(_arch_dict(state, path))
    else:
        name, base = DEFAULT_ARCH, get_arch(DEFAULT_ARCH)
    start = Start(kind, path, state, name, apply_overrides(base, cfg.arch_overrides),
                  ckpt_update=None if state is None else state.get("update"))
    given = [flag(r) for r in RESETS if getattr(cfg, r)]
    if kind != "resume" and given:  # a --reset-* drops part of a resumed state: here there is none
        then = (f"fine-tuning from {path} starts with a fresh optimizer, schedule, data position and meters anyway"
                if kind == "finetune" else "this run starts from scratch")
        start.notes.append(f"{', '.join(given)}: nothing to reset, {save_dir} has no checkpoint ({LAST}); {then}")
    if kind == "resume" and cfg.finetune_from_model:
        start.notes.append(f"--finetune-from-model {cfg.finetune_from_model} is not used: {save_dir} already holds "
                           f"{LAST}, whose run resumes (choose another --save-dir to start fine-tuning anew)")
    return start


def describe_start(start: Start, save_dir: Path) -> tuple[str, int | None, str]:
    """(kind, checkpoint update, checkpoint path) of this rank's start: what every rank must share."""
    path = start.path if start.path is not None else Path(save_dir) / LAST
    return start.kind, start.ckpt_update, str(path)


def check_same_start(starts: list[tuple[str, int | None, str]]) -> None:
    """UserError (one line naming the ranks and their updates) unless every rank starts alike.

    Why: each rank reads checkpoint_last.pt from its own view of --save-dir. Node-local save
    directories (only rank 0 writes checkpoints) leave the other nodes with an older checkpoint or
    none, and ranks at different updates would wait on each other's collectives until the timeout.
    """
    if len({(kind, update) for kind, update, _ in starts}) <= 1:
        return
    groups: dict[tuple, list[int]] = {}
    for rank, entry in enumerate(starts):
        groups.setdefault(entry, []).append(rank)
    parts = []
    for (kind, update, path), ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"
        what = {"resume": f"at update {update} (resuming {path})",
                "finetune": f"at update 0 (fine-tuning from {path}: no {LAST} in --save-dir)"}.get(
                    kind, f"at update 0 (fresh: no {path})")
        parts.append(f"{who} {what}")
    raise UserError("the ranks do not start from the same checkpoint: " + ", ".join(parts) +
                    "; every node must see the same --save-dir (a shared file system), or copy "
                    f"rank 0's {LAST} to the others")


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur is None or cur != prev + 1:  # a run ends at prev
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(out)
