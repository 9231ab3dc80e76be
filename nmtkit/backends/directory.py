"""The self-contained export directory: what it holds, writing it atomically, and reading it back.

Why one module for both directions: `nmtkit export` writes the directory and `nmtkit generate
--path DIR` / `Translator.load(DIR)` read it; the file names, `nmtkit.json`'s schema and its
checks must agree, and this module imports neither torch nor a runtime, so the generation layer
can read a directory's description cheaply.

Layout (docs/export.md):

    model.bin, config.json, *_vocabulary.json   the runtime's own model (CTranslate2 today)
    dict.SRC.txt, dict.TGT.txt                  the data directory's dictionaries (ids <-> tokens)
    spm*.model / bpe*.codes                     its subword model(s) (segmentation, detokenization)
    nmtkit.json                                 written last: what the directory is (below)

`nmtkit.json` holds `format` / `format_version`, the runtime and its quantization, the
architecture (`arch`, `arch_config`), the languages and task, the source checkpoint (its path as
given, sha256, update, whether its EMA weights were taken, the files it was averaged from), and
`data`: the data directory manifest's entries for the copied files (`source_lang`, `target_lang`,
`task`, `parsing`, `subword`, `dictionaries`, `files` with sha256), in the manifest's own schema,
so that the data directory's readers (`load_dictionaries`, `subword_model_path` and
`load_model_file`, the parsing tree writer) read the export directory through the same code.

Writing: the directory is built in a hidden working folder beside it and renamed into place
(`atomic_directory`); an export that is killed leaves its working folders, which the next export
into the same folder removes once their lock shows their export gone (`remove_leftovers`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from nmtkit.errors import UserError
from nmtkit.io import read_json

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

INFO_NAME = "nmtkit.json"
FORMAT_NAME = "nmtkit-export"
FORMAT_VERSION = 1

# The hidden folders an export works in, beside --output NAME: `.NAME.nmtkit-export-XXXXXXXX.tmp`
# (the new directory being built) and `.NAME.nmtkit-export-XXXXXXXX.old` (an earlier export moved
# aside for the rename, holding it as NAME). Their owner holds an flock on each while it lives.
WORK_MARK = "nmtkit-export"
WORK_RE = re.compile(rf"^\.(?P<name>.+)\.{WORK_MARK}-[a-z0-9_]{{8}}\.(?P<kind>tmp|old)$")


def is_export_dir(path: str | os.PathLike) -> bool:
    """True for a directory holding an `nmtkit.json` (an export), whatever its state."""
    p = Path(path)
    return p.is_dir() and (p / INFO_NAME).is_file()


def read_info(path: str | os.PathLike) -> dict:
    """Read and check `DIR/nmtkit.json` alone (what the directory is, its runtime among it);
    UserError (one line naming the file) for a missing, foreign, newer or incomplete description."""
    d = Path(path)
    p = d / INFO_NAME
    if not p.is_file():
        raise UserError(f"{d} is not an nmtkit export directory (no {INFO_NAME}; make one with nmtkit export)")
    info = read_json(p)
    if not isinstance(info, dict) or info.get("format") != FORMAT_NAME:
        raise UserError(f"{p}: not an nmtkit export description (format is not {FORMAT_NAME!r})")
    if not isinstance(info.get("format_version"), int) or info["format_version"] > FORMAT_VERSION:
        raise UserError(f"{p}: export format version {info.get('format_version')!r} is newer than this nmtkit "
                        f"understands ({FORMAT_VERSION}); upgrade nmtkit")
    for key in ("runtime", "arch_config", "data"):
        if not isinstance(info.get(key), dict):
            raise UserError(f"{p}: incomplete export description (no {key!r})")
    return info


def load_export(path: str | os.PathLike) -> dict:
    """`read_info`, then the directory's files: the runtime's present, every copied data file
    checked against its sha256. UserError (one line naming the file) for a damaged directory."""
    from nmtkit.data.manifest import verify_files

    d = Path(path)
    info = read_info(d)
    for name in info["runtime"].get("files", []):
        if not (d / name).is_file():
            raise UserError(f"{d / name}: missing (listed in {INFO_NAME}); export the model again")
    verify_files(d, info["data"])
    return info


def data_files(manifest: dict) -> list[str]:
    """The data directory files an export needs: both dictionaries and the subword model(s)."""
    names = []
    for lang in (manifest["source_lang"], manifest["target_lang"]):
        names.append(manifest["dictionaries"][lang]["file"])
        sub = manifest["subword"]["files"].get(lang)
        if sub is not None:
            names.append(sub)
    return list(dict.fromkeys(names))  # a joined dictionary or joint model is one file


def data_section(manifest: dict, names: list[str]) -> dict:
    """The manifest entries an export keeps (its schema, restricted to the copied files)."""
    data = {
        "source_lang": manifest["source_lang"],
        "target_lang": manifest["target_lang"],
        "subword": manifest["subword"],
        "dictionaries": manifest["dictionaries"],
        "files": {n: manifest["files"][n] for n in names if n in manifest["files"]},
        "fingerprint": manifest.get("fingerprint"),
    }
    if "task" in manifest:
        data["task"] = manifest["task"]
    if isinstance(manifest.get("parsing"), dict):  # the tree writer needs the part-of-speech mode only
        data["parsing"] = {"pos_tags": manifest["parsing"].get("pos_tags")}
    return data


def check_output(output: str | os.PathLike, force: bool, inputs: list[tuple[str, str | os.PathLike]]) -> Path:
    """Refuse an --output that exists (unless --force replaces an earlier export) or that holds an input.

    `inputs`: (flag, path) of what the export reads; replacing a folder that contains one of them
    would delete it.
    """
    out = Path(output)
    if out.exists() or out.is_symlink():
        if not force:
            raise UserError(f"--output {out} exists; pass --force to replace it")
        if not out.is_dir():
            raise UserError(f"--output {out} is a file, not an export directory; choose another --output")
        if any(out.iterdir()) and not (out / INFO_NAME).is_file():
            raise UserError(f"--output {out} is not an nmtkit export directory (no {INFO_NAME}); "
                            "--force replaces only an earlier export: choose another --output")
    resolved = out.resolve()
    for flag, p in inputs:
        q = Path(p).resolve()
        if q == resolved or resolved in q.parents:
            raise UserError(f"--output {out} would contain {flag} {p}; choose another --output")
    return out


# ---- the working folders: locked by their export, removed by a later one once it is gone -----------
#
# Why a lock and not the pid in the name or an age: flock is released by the system when its
# process ends, however it ends (SIGKILL, out of memory), so a folder whose lock can be taken
# belongs to no live export; a pid can be reused, and an export can run for longer than any age.
# `nmtkit preprocess` and `nmtkit train` lock their folders the same way. Where flock does not
# exist (Windows), nothing is removed. A later export takes the lock of each leftover before it
# deletes it and keeps it until the folder is gone, and a new folder counts as taken only once
# its creator holds its lock and finds it still in place, so the two never race.


class _NoLocks(Exception):
    """The file system refuses flock (some network mounts): no folder can be told dead."""


def _take(path: Path) -> int | None:
    """An fd holding an exclusive flock on directory `path` (closing it releases the lock), or
    None when a live process holds it or `path` is not a plain directory; `_NoLocks` where flock
    is not available."""
    if fcntl is None:
        raise _NoLocks
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise _NoLocks from None
    return fd


def _work_folder(out: Path, kind: str) -> tuple[Path, int | None]:
    """A new hidden folder beside `out` (`kind` "tmp" or "old") with a plain mkdir's permissions,
    and the fd of its lock (None where the file system has no flock)."""
    umask = os.umask(0)
    os.umask(umask)
    for _ in range(100):
        d = Path(tempfile.mkdtemp(prefix=f".{out.name}.{WORK_MARK}-", suffix=f".{kind}", dir=out.parent))
        try:
            fd = _take(d)
        except _NoLocks:
            fd = None
        else:
            if fd is None:
                continue  # another export is removing it as a leftover: it never was this one's
            here = None
            with contextlib.suppress(OSError):
                here = os.stat(d, follow_symlinks=False)
            mine = os.fstat(fd)
            if here is None or (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)  # removed as a leftover before this export locked it: make another
                continue
        os.chmod(d, 0o777 & ~umask)  # mkdtemp makes 0700
        return d, fd
    raise OSError(f"cannot make a working folder beside {out}: each one vanished before it could be locked")


def _release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def remove_leftovers(output: str | os.PathLike) -> list[str]:
    """Remove the working folders that killed exports left beside `output` (for any --output in
    that folder); return what was done, one line each, for the user.

    A leftover `.old` whose export is missing is that export itself, moved aside by a --force
    replacement killed before it renamed the new one into place: it is put back instead. Folders
    of exports still running are locked, and left alone. Call it before checking --output, which
    a restored export occupies again.
    """
    try:
        # the .old ones first, newest first: the newest is the export that was last in place
        found = sorted((q for q in Path(output).parent.iterdir() if WORK_RE.match(q.name)),
                       key=lambda q: (q.name.endswith(".tmp"), -_mtime(q)))
    except OSError:  # no parent folder yet, or one that cannot be listed: nothing to do
        return []
    done: list[str] = []
    for p in found:
        try:
            fd = _take(p)
        except _NoLocks:
            return done
        if fd is None:
            continue
        try:
            line = _clear(p)
        finally:
            _release(fd)
        if line is not None:
            done.append(line)
    return done


def _clear(p: Path) -> str | None:
    """Remove the dead working folder `p`, or put back the export it holds (see
    `remove_leftovers`); what was done, or None where nothing could be."""
    m = WORK_RE.match(p.name)
    dest, kept = p.parent / m.group("name"), p / m.group("name")
    if m.group("kind") == "old" and not os.path.lexists(dest) and (kept / INFO_NAME).is_file():
        try:
            os.rename(kept, dest)
        except OSError:
            return None  # left as it is: it holds the only copy of that export
        shutil.rmtree(p, ignore_errors=True)
        return f"restored {dest} from {p.name}, where an interrupted 'nmtkit export --force' had moved it"
    shutil.rmtree(p, ignore_errors=True)
    return None if os.path.lexists(p) else f"removed {p}, left by an interrupted 'nmtkit export'"


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


@contextlib.contextmanager
def atomic_directory(output: str | os.PathLike) -> Iterator[Path]:
    """A new hidden folder beside `output`, renamed to `output` only if the block succeeds.

    An earlier `output` (the caller allowed it with --force) is moved aside first and deleted
    after the rename, so a crash leaves either the old directory or the new one, and a failure in
    the block leaves `output` untouched and no temporary folder behind. A kill leaves the locked
    working folders (`WORK_RE`), which `remove_leftovers` removes (or puts back) once this
    process is gone.
    """
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, tmp_lock = _work_folder(out, "tmp")
    try:
        yield tmp
        _put_in_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _release(tmp_lock)


def _put_in_place(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`. An existing `out` is moved into a locked `.old` working folder for
    the rename and deleted after it, or put back if the rename fails."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old, lock = _work_folder(out, "old")
    try:
        os.replace(out, old / out.name)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old / out.name, out)
            raise
    finally:
        if os.path.lexists(out):  # else the earlier export is only in `old`: the next export puts it back
            shutil.rmtree(old, ignore_errors=True)
        _release(lock)


def write_info(folder: Path, info: dict) -> None:
    """Write `nmtkit.json` (last: its presence marks a complete directory)."""
    from nmtkit.io import atomic_write

    info = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **info}
    with atomic_write(folder / INFO_NAME, "w") as fh:
        json.dump(info, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
