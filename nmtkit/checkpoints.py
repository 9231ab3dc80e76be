"""Checkpoints: safe atomic saving, safe loading, compatibility checks, averaging and pruning.

Why the care: a checkpoint is the only copy of days of training. Writes go to a temporary file in
the same folder, are fsynced and then renamed over the old file, so a crash (or a full disk, or
SIGKILL) mid-save leaves the previous checkpoint intact. Loading uses
`torch.load(weights_only=True)`, which refuses to run arbitrary pickled code, so everything stored
is tensors, numbers, strings, None, lists and dicts (RNG states are converted to tensors, configs
to plain dicts).

Layout of a checkpoint (format_version 1; docs/formats.md "## Checkpoints" is the user-facing copy):

    nmtkit_checkpoint   int, the format version (its presence marks an nmtkit file)
    arch                str, the registry name the model was built from
    arch_config         dict, dataclasses.asdict(ArchConfig) (ArchConfig(**d) rebuilds it)
    model               state_dict of the model (the raw, trained weights)
    ema                 state_dict of the exponential moving average of the weights, or absent
    dictionaries        {"src_sha256", "tgt_sha256", "src_size", "tgt_size", "src_lang", "tgt_lang"}
                        (the language codes are absent from checkpoints written before they were kept)
    data_manifest_id    str or None: the id of the data dir's manifest.json the model trained on
    update, epoch       int: updates done; the epoch the last update belongs to
    train_args          dict of the `nmtkit train` settings (plain values)
    train               the resumable training state, absent from inference checkpoints:
        optimizer, scheduler, scaler    their state_dicts
        rng                             python/numpy/torch/cuda generator states as tensors
        data_position                   {"epoch", "batch_offset", "world_size"}
        early_stopping                  {"metric", "best", "bad_validations"}
        counters                        {"nan_skips", "oom_skips", "elapsed_s", ...}
    best                {"metric", "value"} of the best validation so far (or absent)
    averaged_from       list of source file names (only in averaged checkpoints)
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import random
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from nmtkit.errors import UserError, first_line
from nmtkit.io import atomic_write, require_exists

FORMAT_VERSION = 1
MAGIC = "nmtkit_checkpoint"

UPDATE_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")  # checkpoint_{epoch}_{update}.pt
EPOCH_RE = re.compile(r"^checkpoint(\d+)\.pt$")  # checkpoint{epoch}.pt


# ---------------------------------------------------------------------------------------------
# saving and loading


def save_checkpoint(state: dict, path: str | os.PathLike, links: Iterable[str | os.PathLike] = ()) -> None:
    """Write `state` to `path` atomically (temp file, fsync, rename, fsync of the folder).

    `links`: other names of the same checkpoint (checkpoint_best.pt, checkpoint_EPOCH_UPDATE.pt...),
    each put in place atomically *before* `path`. Training saves checkpoint_last.pt this way, so a
    kill at any moment leaves either the old checkpoint_last.pt (and the rerun redoes the updates
    since, writing the same names again) or the new one with all its names.
    """
    path = Path(path)
    if state.get(MAGIC) is None:
        state = {MAGIC: FORMAT_VERSION, **state}
    with atomic_write(path, "wb", links=list(links)) as fh:
        torch.save(state, fh)
    with contextlib.suppress(OSError):  # make the renames themselves durable (not possible everywhere)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# a temporary file of a checkpoint save: `.NAME.XXXXXXXX.tmp` (atomic_write) or `.NAME.PID.tmp` (a link)
LEFTOVER_RE = re.compile(r"^\.(checkpoint_last|checkpoint_best|checkpoint_\d+_\d+|checkpoint\d+)\.pt\.[A-Za-z0-9_]+\.tmp$")


def remove_leftovers(save_dir: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that killed checkpoint saves left in `save_dir`; return them.

    Only the names a training save writes (LEFTOVER_RE) are touched, and only in `save_dir`
    itself; the caller must hold the save dir (no other save may be under way there).
    """
    removed = []
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return removed
    for p in save_dir.iterdir():
        if LEFTOVER_RE.match(p.name) and p.is_file() and not p.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return sorted(removed)


def _unpickling_reason(e: Exception) -> str:
    """What the weights-only unpickler refused, without torch's advice to load unsafely.

    torch wraps the unpickler's own message in advice that changed between versions: the refused
    global is named (`Unsupported global: GLOBAL x`, `unsupported GLOBAL x whose module is blocked`,
    older torch's `Unsupported class x`), other refusals follow `WeightsUnpickler error:`, and a few
    (torch 2.13's "... must be imported to load DTensors") only follow `Weights only load failed.`.
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL|Unsupported class)\s+([\w.]+)", text)
    if m:
        return f"it holds a pickled Python object, {m.group(1)}"
    m = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    for line in [m.group(1)] if m else text.splitlines():
        line = re.split(r"\s*(?:Please use|Re-running|This file can still be loaded)", line)[0]
        line = re.sub(r"^\s*Weights only load failed\.", "", line).strip()
        if line and "weights_only" not in line:
            return line
    return type(e).__name__


def _not_torch_file(path: Path) -> str | None:
    """What the file is when its first bytes show it is no torch file (None: it may be one).

    Why look before torch.load: given a text file (a corpus, a config, a path list), the
    unpickler reports its first letter as an opcode ("Unsupported operand 69"), which says nothing
    to the user. A torch file starts with the zip magic (`PK\\x03\\x04`, torch.save's format) or a
    pickle's protocol byte 0x80 (the legacy format); an empty file or printable UTF-8 text is
    named as what it is."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:  # torch.load reports it
        return None
    if not head:
        return "an empty file, not a checkpoint"
    if head.startswith((b"PK\x03\x04", b"\x80")):
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(head) < 4096 or e.start < len(head) - 3:  # not a character cut at the end of the block
            return None
        text = head[:e.start].decode("utf-8")
    if not text or not all(c.isprintable() or c in "\t\n\r\f\v" for c in text):
        return None
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    shown = first if len(first) <= 40 else first[:40] + "..."
    return "a text file, not a checkpoint" + (f" (it begins with {shown!r})" if first else "")


def _torch_load(path: Path, map_location: str | torch.device, mmap: bool) -> Any:
    """torch.load with weights_only=True; an old-format (non-zip) file, which cannot be mapped, is read."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except RuntimeError as e:
        if not mmap or "mmap" not in str(e):
            raise
        return torch.load(path, map_location=map_location, weights_only=True)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict:
    """Load an nmtkit checkpoint with weights_only=True; UserError if missing, corrupt or foreign.

    mmap=True maps the file instead of reading it (torch.load's mmap): only the tensors used are
    read from disk, so loading a training checkpoint for inference skips its optimizer state
    (two thirds of the file), which saves start-up time and peak memory. Safe with nmtkit's
    atomic saves: a checkpoint is replaced by renaming, which leaves a mapped file intact.
    """
    path = Path(path)
    require_exists(path)
    if path.is_dir():
        raise UserError(f"expected a checkpoint file but got a directory: {path}")
    what = _not_torch_file(path)
    if what is not None:
        raise UserError(f"{path}: {what}")
    try:
        state = _torch_load(path, map_location, mmap)
    except pickle.UnpicklingError as e:
        raise UserError(f"{path}: not a safe nmtkit checkpoint (refused by the weights-only loader: "
                        f"{_unpickling_reason(e)})") from None
    except Exception as e:  # noqa: BLE001 - junk bytes make the unpickler fail in many ways
        raise UserError(f"{path}: cannot read checkpoint (corrupt or truncated file?): {first_line(e)}") from None
    if not isinstance(state, dict) or MAGIC not in state:
        raise UserError(f"{path}: not an nmtkit checkpoint (no '{MAGIC}' marker)")
    version = state[MAGIC]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(
            f"{path}: checkpoint format version {version} is newer than this nmtkit understands "
            f"({FORMAT_VERSION}); upgrade nmtkit"
        )
    for key in ("arch", "arch_config", "model"):
        if key not in state:
            raise UserError(f"{path}: incomplete nmtkit checkpoint (no '{key}')")
    check_structure(state, path)
    return state


def _kind(v: Any) -> str:
    name = type(v).__name__
    return "a dict" if isinstance(v, dict) else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _check_weights_structure(weights: Any, key: str, path: Path) -> None:
    if not isinstance(weights, dict):
        raise UserError(f"{path}: malformed nmtkit checkpoint: '{key}' is {_kind(weights)}, expected a dict of tensors")
    for name, t in weights.items():
        if not isinstance(name, str):  # (names the key: "entry 3 is a Tensor, expected a tensor" would puzzle)
            raise UserError(f"{path}: malformed nmtkit checkpoint: '{key}' has a non-string key {name!r}")
        if not isinstance(t, torch.Tensor):
            raise UserError(f"{path}: malformed nmtkit checkpoint: '{key}' entry {name!r} is {_kind(t)}, "
                            "expected a tensor")
        if t.layout != torch.strided:
            raise UserError(f"{path}: malformed nmtkit checkpoint: '{key}' entry {name} is a {t.layout} tensor, "
                            "expected a dense one")
        # a tensor is rebuilt from (storage, shape, strides): zero strides could make a few stored
        # bytes stand for a huge tensor, which the model would then allocate
        if t.numel() * t.element_size() > t.untyped_storage().nbytes():
            raise UserError(f"{path}: malformed nmtkit checkpoint: '{key}' entry {name} has shape "
                            f"{tuple(t.shape)} but stores only {t.untyped_storage().nbytes()} bytes")


def check_structure(state: dict, path: str | os.PathLike) -> None:
    """Refuse a loadable but malformed checkpoint (wrong types where nmtkit expects its layout).

    Only the layout is checked here; whether the tensors fit the architecture config is
    `nmtkit.models.loading.check_weights` (it needs the dictionary sizes).
    """
    path = Path(path)

    def want(key: str, types: tuple, what: str, optional: bool = True) -> None:
        if key not in state or (optional and state[key] is None):
            return
        v = state[key]
        if not isinstance(v, types) or isinstance(v, bool) and bool not in types:
            raise UserError(f"{path}: malformed nmtkit checkpoint: '{key}' is {_kind(v)}, expected {what}")

    want("arch", (str,), "a string", optional=False)
    want("arch_config", (dict,), "a dict of architecture settings", optional=False)
    bad_keys = [k for k in state["arch_config"] if not isinstance(k, str)]
    if bad_keys:
        raise UserError(f"{path}: malformed nmtkit checkpoint: 'arch_config' has a non-string key {bad_keys[0]!r}")
    _check_weights_structure(state["model"], "model", path)
    if state.get("ema") is not None:
        _check_weights_structure(state["ema"], "ema", path)
    want("dictionaries", (dict,), "a dict")
    want("update", (int,), "an integer")
    want("epoch", (int,), "an integer")
    want("train", (dict,), "a dict of training state")
    want("best", (dict,), "a dict")
    want("train_args", (dict,), "a dict")
    want("averaged_from", (list,), "a list of file names")


def nonfinite_entry(weights: dict[str, torch.Tensor]) -> tuple[str, int, int] | None:
    """(name, how many values are NaN or infinite, how many values) of the first floating tensor
    of `weights` that holds any, or None when all are finite.

    Why `aminmax`: one vectorised pass that allocates nothing (its min and max are NaN when a
    value is NaN, as torch documents, and infinite when one is); `isfinite(t).all()` writes a
    mask and reads it again: 200 ms against 14 ms for transformer_base's 63M parameters on one
    thread. A tensor stored under several names (tied embeddings) is read once.
    """
    seen: set[tuple] = set()
    for name, t in weights.items():
        if not t.is_floating_point() or t.numel() == 0:
            continue
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if ident in seen:
            continue
        seen.add(ident)
        lo, hi = torch.aminmax(t)
        if not (math.isfinite(lo.item()) and math.isfinite(hi.item())):
            return name, int((~torch.isfinite(t)).sum()), t.numel()
    return None


def check_finite(weights: dict[str, torch.Tensor], key: str, where: str, advice: str) -> None:
    """UserError naming `where` and the tensor when an entry of `weights` (the checkpoint's `key`:
    "model" or "ema") holds NaN or infinite values: with one NaN weight a model's scores are NaN
    and its output empty or one token repeated, without an error, so it is refused where it is loaded."""
    bad = nonfinite_entry(weights)
    if bad is not None:
        name, n, total = bad
        raise UserError(f"{where}: '{key}' entry {name} holds NaN or infinite values ({n} of {total}): "
                        f"the training diverged or the file is damaged; {advice}")


def inference_state(state: dict) -> dict:
    """The same checkpoint without the training state (optimizer, RNG, data position...)."""
    return {k: v for k, v in state.items() if k != "train"}


def check_training_state(state: dict, path: str | os.PathLike) -> None:
    """Refuse a training checkpoint whose `train` part lacks what resuming reads (see the module docstring)."""
    tr = state["train"]
    for key in ("optimizer", "data_position"):
        if not isinstance(tr.get(key), dict):
            raise UserError(f"{path}: malformed nmtkit checkpoint: 'train.{key}' is "
                            f"{'absent' if key not in tr else _kind(tr[key])}, expected a dict")
    for key in ("epoch", "batch_offset"):
        v = tr["data_position"].get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "epoch" else 0):
            raise UserError(f"{path}: malformed nmtkit checkpoint: 'train.data_position.{key}' is {v!r}")
    for key, types in (("rng", (list,)), ("state", (dict,)), ("scheduler", (dict,)), ("scaler", (dict,))):
        if key in tr and not isinstance(tr[key], types):
            raise UserError(f"{path}: malformed nmtkit checkpoint: 'train.{key}' is {_kind(tr[key])}")


# ---------------------------------------------------------------------------------------------
# random number generator states, as tensors (weights_only-safe)


def rng_state() -> dict:
    """Capture python, numpy, torch (and CUDA) generator states as tensors and numbers."""
    py_version, py_internal, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python_version": int(py_version),
        "python_state": torch.tensor(py_internal, dtype=torch.int64),
        "python_gauss": py_gauss,
        "numpy_name": str(np_name),
        "numpy_keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        "numpy_pos": int(np_pos),
        "numpy_has_gauss": int(np_has_gauss),
        "numpy_gauss": float(np_gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` captured (CUDA states only when CUDA is in use)."""
    random.setstate(
        (state["python_version"], tuple(int(x) for x in state["python_state"].tolist()), state["python_gauss"])
    )
    np.random.set_state(
        (
            state["numpy_name"],
            state["numpy_keys"].numpy().astype(np.uint32),
            state["numpy_pos"],
            state["numpy_has_gauss"],
            state["numpy_gauss"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])


# ---------------------------------------------------------------------------------------------
# compatibility


# Architecture fields added after checkpoints were first written: the value that a checkpoint
# written before the field existed was trained with (what `ArchConfig.from_dict` gives it).
ABSENT_ARCH_FIELDS = {"scale_embedding": True, "encoder_no_residual_layer": None}


def config_differences(a: dict, b: dict) -> list[str]:
    """Human-readable 'key: a != b' lines for two arch config dicts. A field of
    `ABSENT_ARCH_FIELDS` missing from one has its value there, so that a checkpoint written before
    the field existed still resumes and averages with newer ones."""
    a, b = {**ABSENT_ARCH_FIELDS, **a}, {**ABSENT_ARCH_FIELDS, **b}
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k, '<absent>')!r} != {b.get(k, '<absent>')!r}" for k in keys if a.get(k) != b.get(k)]


def check_same_model(state: dict, where: str, *, arch: str, arch_config: dict, dictionaries: dict) -> None:
    """Refuse a checkpoint whose architecture config or dictionaries differ from what the run expects.

    The architecture is compared field by field (the registry name is only reported), so the same
    model reached through another name plus override flags is accepted.
    """
    diffs = config_differences(state["arch_config"], arch_config)
    if diffs:  # the name alone may differ: `--arch X --d-ff N` can equal a registry entry
        detail = "; ".join(diffs[:4]) + (" ..." if len(diffs) > 4 else "")
        raise UserError(
            f"{where} holds a model of arch '{state['arch']}' that differs from this run's '{arch}'"
            + (f" ({detail})" if detail else "")
            + "; use another --save-dir or the same architecture flags"
        )
    check_same_dictionaries(state, where, dictionaries)


def check_same_dictionaries(state: dict, where: str, dictionaries: dict, what: str = "it cannot continue on this data dir") -> None:
    """Refuse a checkpoint trained with other source/target dictionaries (by sha256) or languages.

    A joined dictionary is the same file on both sides, so the checksums alone would accept a data
    dir of the reverse direction (en-de for a de-en model); the language codes catch that. They
    are compared only when both sides record them (older checkpoints lack them).
    """
    have = state.get("dictionaries") or {}
    mine = (have.get("src_lang"), have.get("tgt_lang"))
    theirs = (dictionaries.get("src_lang"), dictionaries.get("tgt_lang"))
    if None not in mine and None not in theirs and mine != theirs:
        raise UserError(f"{where} was trained for {mine[0]}->{mine[1]}, but the data dir is "
                        f"{theirs[0]}->{theirs[1]}; {what}")
    for side in ("src", "tgt"):
        mine, theirs = have.get(f"{side}_sha256"), dictionaries.get(f"{side}_sha256")
        if mine != theirs:
            raise UserError(
                f"{where} was trained with another {side} dictionary "
                f"(sha256 {str(mine)[:12]}... vs {str(theirs)[:12]}...); {what}"
            )


# ---------------------------------------------------------------------------------------------
# finding, selecting and pruning checkpoint files


def update_checkpoints(save_dir: str | os.PathLike) -> list[tuple[int, int, Path]]:
    """(update, epoch, path) of every checkpoint_{epoch}_{update}.pt, by update ascending."""
    found = []
    for p in Path(save_dir).iterdir():
        m = UPDATE_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(2)), int(m.group(1)), p))
    return sorted(found)


def epoch_checkpoints(save_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(epoch, path) of every checkpoint{epoch}.pt, by epoch ascending."""
    found = []
    for p in Path(save_dir).iterdir():
        m = EPOCH_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def last_checkpoints(save_dir: str | os.PathLike, n: int, kind: str) -> list[Path]:
    """The last n update ("update") or epoch ("epoch") checkpoints of save_dir, oldest first."""
    save_dir = Path(save_dir)
    flag = "--num-update-checkpoints" if kind == "update" else "--num-epoch-checkpoints"
    if not save_dir.is_dir():
        raise UserError(f"--inputs: not a directory: {save_dir}")
    if n < 1:
        raise UserError(f"{flag} must be >= 1, got {n}")
    if kind == "update":
        paths = [p for _, _, p in update_checkpoints(save_dir)]
        pattern = "checkpoint_EPOCH_UPDATE.pt"
    else:
        paths = [p for _, p in epoch_checkpoints(save_dir)]
        pattern = "checkpointEPOCH.pt"
    if len(paths) < n:
        raise UserError(
            f"{flag} {n}: {save_dir} holds only {len(paths)} {kind} checkpoint(s) ({pattern})"
            + (f": {', '.join(p.name for p in paths)}" if paths else "")
        )
    return paths[-n:]


def prune_checkpoints(save_dir: str | os.PathLike, keep_last_updates: int, keep_last_epochs: int) -> list[Path]:
    """Delete all but the newest N update / epoch checkpoints (N <= 0 keeps all); return deleted."""
    removed: list[Path] = []
    if keep_last_updates > 0:
        for _, _, p in update_checkpoints(save_dir)[:-keep_last_updates]:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    if keep_last_epochs > 0:
        for _, p in epoch_checkpoints(save_dir)[:-keep_last_epochs]:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
    return removed


# ---------------------------------------------------------------------------------------------
# averaging


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _aliases(weights: dict[str, torch.Tensor]) -> dict[str, str]:
    """{key: earlier key} for entries that are views of the same memory (tied embeddings)."""
    seen: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for k, v in weights.items():
        ident = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()), v.dtype)
        if v.numel() and ident in seen:
            out[k] = seen[ident]
        else:
            seen[ident] = k
    return out


def _accumulate(total: dict[str, torch.Tensor] | None, weights: dict, name: str, first_name: str,
                skip: dict[str, str]) -> dict:
    if total is None:
        total = {}
        for k, v in weights.items():
            if k not in skip:
                total[k] = v.to(torch.float64).clone() if v.is_floating_point() else v.clone()
        return total
    if set(weights) != set(total) | set(skip):
        missing = sorted((set(total) | set(skip)) ^ set(weights))[:3]
        raise UserError(f"{name}: parameters differ from {first_name} ({', '.join(missing)} ...)")
    for k, v in weights.items():
        if k in skip:
            continue
        acc = total[k]
        if acc.shape != v.shape:
            raise UserError(f"{name}: parameter {k} has shape {tuple(v.shape)} but {first_name} has {tuple(acc.shape)}")
        if v.is_floating_point():
            acc.add_(v.to(torch.float64))
        elif not torch.equal(acc, v):
            raise UserError(f"{name}: non-floating tensor {k} differs from {first_name}; cannot average it")
    return total


def average_checkpoints(paths: Iterable[str | os.PathLike]) -> dict:
    """Element-wise mean of the model weights of `paths` (and of their EMA weights if all have them).

    Floating tensors are summed in float64 and stored back in their own dtype; other tensors must be
    identical in every input. Inputs must share architecture and dictionaries, and hold no NaN or
    infinite value. The result is an inference checkpoint (no training state) carrying the last
    input's metadata.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise UserError("no checkpoints to average")
    _refuse_duplicates(paths)
    first: dict | None = None
    model_sum = ema_sum = None
    all_ema = True
    last: dict = {}
    for p in paths:
        state = load_checkpoint(p)
        for key in ("model", "ema"):  # a NaN would make its tensor's mean NaN
            if state.get(key) is not None:
                check_finite(state[key], key, str(p), "leave it out of the average")
        if first is None:
            first = _reference(state, p)
        else:
            _check_averageable(state, p, first)
        model_sum = _accumulate(model_sum, state["model"], str(p), first["name"], first["aliases"])
        ema = state.get("ema")
        if ema is None:
            all_ema = False
            ema_sum = None
        elif all_ema:
            ema_sum = _accumulate(ema_sum, ema, str(p), first["name"], first["ema_aliases"])
        last = state
        del state
    out = inference_state(last)
    out["model"] = _mean(model_sum, len(paths), first["dtypes"], first["aliases"])
    if all_ema and ema_sum is not None:
        out["ema"] = _mean(ema_sum, len(paths), first["ema_dtypes"], first["ema_aliases"])
    else:
        out.pop("ema", None)
    out["averaged_from"] = [p.name for p in paths]
    return out


def _refuse_duplicates(paths: list[Path]) -> None:
    """Refuse a checkpoint given twice (by another name too): it would count twice in the mean."""
    for i, p in enumerate(paths):
        for q in paths[i + 1 :]:
            if _same_file(p, q):
                raise UserError(f"checkpoint given twice: {p}")


def _reference(state: dict, p: Path) -> dict:
    """What the first checkpoint sets for all: the architecture and dictionaries the others must
    share, and the dtypes and tied entries (of its weights and EMA weights) the mean is stored in."""
    ema = state.get("ema")
    return {"arch": state["arch"], "arch_config": state["arch_config"],
            "dictionaries": state.get("dictionaries") or {}, "name": str(p),
            "dtypes": {k: v.dtype for k, v in state["model"].items()}, "aliases": _aliases(state["model"]),
            "ema_dtypes": {k: v.dtype for k, v in ema.items()} if ema is not None else {},
            "ema_aliases": _aliases(ema) if ema is not None else {}}


def _check_averageable(state: dict, p: Path, first: dict) -> None:
    """Refuse a checkpoint of another architecture or other dictionaries than the first: their
    weights do not mean the same things, so their mean means nothing."""
    if config_differences(state["arch_config"], first["arch_config"]):
        _refuse_arch(p, state, first)
    check_same_dictionaries(state, str(p), first["dictionaries"],
                            f"only checkpoints trained on the same dictionaries as {first['name']} can be averaged")


def _mean(total: dict, n: int, types: dict[str, torch.dtype], alias: dict[str, str]) -> dict:
    """The sums divided by `n`, each back in its checkpoint's dtype, in the checkpoint's order."""
    mean = {k: (v / n).to(types[k]) if v.is_floating_point() else v for k, v in total.items()}
    # tied entries point at one tensor again, so the file stores it once
    return {k: mean[alias.get(k, k)] for k in types}


def _refuse_arch(p: Path, state: dict, first: dict) -> None:
    diffs = config_differences(state["arch_config"], first["arch_config"])
    detail = "; ".join(diffs[:4])
    raise UserError(
        f"{p}: architecture '{state['arch']}' differs from {first['name']} ('{first['arch']}')"
        + (f": {detail}" if detail else "")
        + "; only checkpoints of the same model can be averaged"
    )


def check_output_not_input(output: str | os.PathLike, inputs: Iterable[str | os.PathLike]) -> None:
    """Refuse to overwrite one of the checkpoints being averaged."""
    out = Path(output)
    for p in inputs:
        if _same_file(out, Path(p)):
            raise UserError(f"--output {out} is one of the input checkpoints; choose another path")


def is_training_checkpoint(path: str | os.PathLike) -> bool:
    """True if `path` is an nmtkit checkpoint that holds training state (a run resumes from it).

    Reads the file memory-mapped: only the pickled layout is parsed, no tensor data is read.
    """
    try:
        state = _torch_load(Path(path), "meta", mmap=True)
    except Exception:  # noqa: BLE001 - not a (readable) checkpoint: not a training one either
        return False
    return isinstance(state, dict) and MAGIC in state and isinstance(state.get("train"), dict)


def check_output_not_training(output: str | os.PathLike) -> None:
    """Refuse an --output that would replace a training checkpoint or take a name training writes.

    A training checkpoint (checkpoint_last.pt, and the others while they hold optimizer state) is
    what a run resumes from; names of the checkpoint_EPOCH_UPDATE.pt kind are also listed, pruned
    and averaged by update number, so an inference checkpoint under such a name would be too.
    """
    out = Path(output)
    if out.is_file() and is_training_checkpoint(out):
        raise UserError(f"--output {out} is a training checkpoint (it holds the optimizer and training state "
                        "a run resumes from); choose another path")
    if out.name in ("checkpoint_last.pt", "checkpoint_best.pt") or UPDATE_RE.match(out.name) \
            or EPOCH_RE.match(out.name):
        raise UserError(f"--output {out}: {out.name} is a name that nmtkit train writes; choose another "
                        "(e.g. checkpoint_avg5.pt)")


def state_summary(state: dict) -> dict[str, Any]:
    """A few facts about a checkpoint for messages: arch, update, epoch, parameter count."""
    n_params = sum(v.numel() for v in state["model"].values() if v.is_floating_point())
    return {"arch": state["arch"], "update": state.get("update"), "epoch": state.get("epoch"), "params": n_params}
