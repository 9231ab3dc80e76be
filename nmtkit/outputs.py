"""The one policy for the files a command writes (`--output` / `-o`): what may never be written over.

Why one function: `generate`, `attention`, `plot` and `average-checkpoints` each write a file the
user names, and each once let that name be anything: `attention --format npz -o checkpoint.pt`
turned a checkpoint into an npz, `-o DATA/manifest.json` broke a data directory, `generate -o
DATA/dict.en.txt` overwrote a dictionary. `check_output_file` refuses, before any work and with
one line naming the file and what it is, an output that is

- a directory (an output is a file name);
- one of the command's own inputs (the same file, however named: `os.path.samefile`, so a
  symlink or hard link to an input counts);
- inside an nmtkit data directory (its folder holds `manifest.json` written by `nmtkit
  preprocess`) or an export directory (its folder holds `nmtkit.json`, `nmtkit export`), whether
  the file exists or not: such a folder belongs to the command that made it (`preprocess
  --force` refuses a folder holding files it did not write, `export --force` replaces the whole
  folder), and a file of it replaced breaks its checksums;
- a checkpoint (nmtkit's or any PyTorch one), recognised by its first bytes without unpickling
  anything: a zip whose members hold a `data.pkl` (torch.save's format) or a pickle that starts
  with torch's old (non-zip) format's magic number. `average-checkpoints`, whose output is a
  checkpoint, replaces an nmtkit checkpoint (an earlier average: `replace_nmtkit_checkpoint`)
  and refuses a training one itself (`nmtkit.checkpoints.check_output_not_training`).

Any other file (an earlier output of the same command, a new name) is replaced, atomically
(`nmtkit.io.atomic_write`). `nmtkit export --output` writes a directory and has its own policy
(`nmtkit.backends.directory.check_output`). `-` (stdout) is never checked.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from nmtkit.backends.directory import INFO_NAME
from nmtkit.data.install import MANIFEST_NAME, dataset_files
from nmtkit.errors import UserError

PathLike = str | os.PathLike
Inputs = Iterable[tuple[str, PathLike | None]]

CHECKPOINT_MARKER = b"nmtkit_checkpoint"  # nmtkit.checkpoints.MAGIC, the first key of every saved state
# torch's old serialization (`_use_new_zipfile_serialization=False`) starts with the pickle of this
# long (torch.serialization.MAGIC_NUMBER) under any pickle protocol; the zip format holds `data.pkl`
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
NMTKIT_CHECKPOINT = "an nmtkit checkpoint"
PYTORCH_CHECKPOINT = "a PyTorch checkpoint"
_HEAD = 4096  # bytes read to tell what a checkpoint is; the marker is the pickle's first key


def checkpoint_kind(path: PathLike) -> str | None:
    """'an nmtkit checkpoint', 'a PyTorch checkpoint', or None when the file `path` is neither
    (or unreadable). Reads the file's first bytes (and a zip's member list), never unpickles."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD)
            if head.startswith(b"\x80") and _LEGACY_MAGIC in head[:32]:
                return NMTKIT_CHECKPOINT if CHECKPOINT_MARKER in head else PYTORCH_CHECKPOINT
            if not head.startswith(b"PK\x03\x04"):
                return None
            fh.seek(0)
            with zipfile.ZipFile(fh) as z:
                pkl = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
                if not pkl:
                    return None  # another zip: an npz, a zipped corpus
                try:
                    with z.open(pkl[0]) as member:
                        head = member.read(_HEAD)
                except (OSError, zipfile.BadZipFile, zlib.error, EOFError, ValueError, RuntimeError,
                        NotImplementedError):
                    return PYTORCH_CHECKPOINT
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, RuntimeError, NotImplementedError):
        return None
    return NMTKIT_CHECKPOINT if CHECKPOINT_MARKER in head else PYTORCH_CHECKPOINT


def _owner(folder: Path) -> str | None:
    """What made `folder`, when nmtkit did: its data directory or export directory, named."""
    shown = folder if str(folder) not in ("", ".") else Path.cwd()
    if dataset_files(folder) is not None:
        return f"the data directory {shown} (it holds the {MANIFEST_NAME} of nmtkit preprocess)"
    if (folder / INFO_NAME).is_file():
        return f"the export directory {shown} (it holds the {INFO_NAME} of nmtkit export)"
    return None


def _folders(out: Path) -> list[Path]:
    """The folder `out` is written into, and the real folder of what it points to (a symlink)."""
    folders = [out.parent]
    try:
        real = out.resolve().parent
    except (OSError, RuntimeError):
        return folders
    if real != out.parent.resolve():
        folders.append(real)
    return folders


def _same_file(a: Path, b: PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_output_file(path: PathLike | None, flag: str, inputs: Inputs = (), *,
                      replace_nmtkit_checkpoint: bool = False) -> None:
    """UserError, one line naming `flag`, the file and what it is, unless `path` may be written
    (module docstring). `inputs`: (flag, path) of what the command reads; None and "-" entries are
    skipped. `replace_nmtkit_checkpoint`: an nmtkit checkpoint may be replaced (average-checkpoints,
    which refuses a training checkpoint itself); any other PyTorch checkpoint never is."""
    if path is None or str(path) == "-":
        return
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{flag} {out} is a directory; give a file name")
    if out.exists():
        for in_flag, p in inputs:
            if p is not None and str(p) != "-" and _same_file(out, p):
                raise UserError(f"{flag} {out} is the same file as {in_flag} {p}; choose another output")
    for folder in _folders(out):
        owner = _owner(folder)
        if owner is not None:
            raise UserError(f"{flag} {out} is inside {owner}; write outputs outside it")
    if out.is_file():
        kind = checkpoint_kind(out)
        if kind is not None and not (replace_nmtkit_checkpoint and kind == NMTKIT_CHECKPOINT):
            raise UserError(f"{flag} {out} is {kind}; choose another output")


def check_output_files(paths: Sequence[PathLike], flag: str, inputs: Inputs = (), **kwargs) -> None:
    """`check_output_file` for each of the files one flag names (PNGs with -1, -2, ... suffixes);
    the message names the file at fault."""
    inputs = list(inputs)
    for p in paths:
        check_output_file(p, flag, inputs, **kwargs)
