"""Putting a finished data directory in place: only nmtkit's own files are ever replaced, DESTDIR is
never missing, and what a killed run leaves behind is cleaned up (or restored) by the next run.

Why: `preprocess --force` once renamed the whole DESTDIR aside and deleted it, taking a user's
`precious.txt` and subfolders with it, and a kill between its two renames left no DESTDIR at all.
Now:
- `--force` replaces a DESTDIR only when everything in it belongs to the dataset there (the files
  its manifest lists, and the manifest); anything else is named and the run refused
  (`check_replaceable`), before any work and again just before the swap.
- The new directory is built beside DESTDIR (`.NAME.XXXXXXXX.partial`, made by `temp_dir`) and
  swapped with the old one in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`), so DESTDIR
  always holds a complete dataset, old or new. Where the system cannot swap, the old directory
  is renamed to `.NAME.old-XXXXXXXX` and the new one into place; a kill between the two leaves
  the old dataset there, and the next `preprocess` (`recover`) renames it back.
- A directory being built or replaced is locked (flock) by its run, so `recover` removes only
  the leftovers of runs that are gone, never those of a run still going.
- The locking, the swap and the clean-up are nmtkit.workdir's, which `nmtkit export` shares.

A directory is an nmtkit dataset when it holds `MANIFEST_NAME` of format `FORMAT_NAME` (any
version); both are defined here because replacing and restoring have to recognise a dataset, and
nmtkit.data.manifest, which reads and writes the manifest itself, takes them from here.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Callable

from nmtkit import workdir
from nmtkit.errors import UserError

MANIFEST_NAME = "manifest.json"  # written last: a directory holding it (complete) is a dataset
# which files were checked against the manifest's sha256, as they were then (nmtkit.data.manifest)
VERIFIED_NAME = ".nmtkit-verified.json"
FORMAT_NAME = "nmtkit-data"  # the manifest's "format": what nmtkit wrote, whatever its version


def dataset_files(dest: Path) -> set[str] | None:
    """The names the nmtkit dataset in `dest` owns (its manifest's files and the manifest), or
    None when `dest` holds no readable nmtkit manifest. Any format version counts: a dataset of
    an older nmtkit is still nmtkit's to replace."""
    try:
        m = json.loads((dest / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME or not isinstance(m.get("files"), dict):
        return None
    names = {n for n in m["files"] if isinstance(n, str) and n and "/" not in n and "\\" not in n and n not in (".", "..")}
    return names | {MANIFEST_NAME, VERIFIED_NAME}


def _record_leftover(name: str) -> bool:
    """The temporary name of an interrupted write of VERIFIED_NAME (nmtkit.io.atomic_write's)."""
    return name.startswith(f".{VERIFIED_NAME}.") and name.endswith(".tmp")


def foreign_entries(dest: Path, owned: set[str] | None) -> list[str]:
    """Entries of `dest` that are not the dataset's own plain files (folders end with "/")."""
    out = []
    for p in sorted(dest.iterdir()):
        if owned is not None and _record_leftover(p.name) and p.is_file() and not p.is_symlink():
            continue  # a write of the record of checked files that a kill interrupted
        if owned is None or p.name not in owned or p.is_symlink() or not p.is_file():
            out.append(p.name + ("/" if p.is_dir() and not p.is_symlink() else ""))
    return out


def _names(entries: list[str], at_most: int = 8) -> str:
    shown = ", ".join(entries[:at_most])
    return shown + (f" and {len(entries) - at_most} more" if len(entries) > at_most else "")


def check_replaceable(dest: Path, owned: set[str] | None) -> None:
    """UserError naming what `dest` holds besides an nmtkit dataset: --force never deletes it."""
    foreign = foreign_entries(dest, owned)
    if not foreign:
        return
    if owned is None:
        raise UserError(f"--destdir {dest} is not empty and holds no nmtkit dataset ({_names(foreign)}); "
                        "--force replaces only a dataset nmtkit wrote: choose a new or empty directory")
    raise UserError(f"--destdir {dest} holds files that are not part of its nmtkit dataset ({_names(foreign)}); "
                    "--force replaces only the files its manifest.json lists: move them away or choose "
                    "another --destdir")


# ---- building beside DESTDIR and swapping (nmtkit.workdir locks, swaps and cleans up) -------------

# Beside DESTDIR NAME: `.NAME.XXXXXXXX.partial` (the new dataset being built) and
# `.NAME.old-XXXXXXXX` (the old one renamed aside where the system cannot swap).
_FOLDERS = workdir.WorkFolders(
    build=".{name}.{rand}.partial", aside=".{name}.old-{hex}", marker=MANIFEST_NAME,
    restored="restored {target} from {name}, where an interrupted 'nmtkit preprocess --force' left it",
    removed="removed {path}, left by an interrupted 'nmtkit preprocess'")


def _real(dest: Path) -> Path:
    """A DESTDIR that is a symlink to a directory is built and swapped where it points (the link
    stays; swapping the link itself would leave the data behind it orphaned)."""
    return Path(os.path.realpath(dest)) if dest.is_symlink() and dest.is_dir() else dest


def temp_dir(dest: Path) -> Path:
    """A new hidden directory beside `dest` to build in, locked by this process."""
    return _FOLDERS.build_folder(_real(dest))


def remove_temp_dir(tmp: Path) -> None:
    workdir.discard(tmp)


def _apply_umask(tmp: Path) -> None:
    """mkstemp/mkdtemp create private (0600/0700) entries; give the result the usual permissions."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)
    for p in tmp.iterdir():
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def install(tmp: Path, dest: Path, owned: set[str] | None) -> None:
    """Put the finished `tmp` at `dest`, with the usual permissions (the umask's, not the
    private ones of a temporary directory). An existing `dest` must hold only the dataset `owned`
    names (checked again here, just before the swap); it is swapped out atomically and deleted
    once the new one is in place."""
    _apply_umask(tmp)
    dest = _real(dest)
    if dest.exists():
        check_replaceable(dest, owned)
    _FOLDERS.put_in_place(tmp, dest)


# ---- the next run: leftovers of a killed one --------------------------------------------------


def recover(dest: Path, log: Callable[[str], None]) -> None:
    """Finish what a killed `preprocess` left: when `dest` is missing but the dataset it was
    replacing survives beside it (`.NAME.old-*`, the two-rename fallback), rename it back; then
    remove the hidden build and old directories of runs that are gone."""
    for line in _FOLDERS.clear(_real(dest)):
        log(line)


def interrupted_install_hint(dest: Path) -> str:
    """For a missing data directory: where an interrupted --force install left its dataset, if it did."""
    with contextlib.suppress(OSError):
        olds = _FOLDERS.left_aside(dest)
        if olds:
            return (f" (an interrupted 'nmtkit preprocess --force' left the previous dataset in {olds[0]}; "
                    "run the same preprocess command again to restore it or finish)")
    return ""
