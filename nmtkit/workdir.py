"""Hidden working folders beside a target directory: built in under a lock, put in place
atomically, and cleaned up (or put back) by the next run once their run is gone.

Why one module: `nmtkit preprocess` and the importers (a data directory, nmtkit.data.install)
and `nmtkit export` (an export directory, nmtkit.backends.directory) each write a directory that
must never be seen half-written and that a kill must never lose. Each names its folders its own
way and says its own words about them (`WorkFolders`); how the folders are locked, swapped into
place and cleaned up is the same:

- a run builds in a new hidden folder beside TARGET (`WorkFolders.build_folder`), locked by it;
- `WorkFolders.put_in_place` swaps the finished folder with an existing TARGET in one atomic step
  (Linux renameat2 RENAME_EXCHANGE) and deletes the earlier TARGET. Where the system cannot swap,
  the earlier TARGET, locked, is renamed aside and the new one into place: a kill between the two
  renames leaves TARGET missing and its earlier self aside;
- the next run (`WorkFolders.clear`) puts such a TARGET back, and removes the folders of runs that
  are gone, saying what it did.

Why a lock and not the pid in the name or an age: flock is released by the system when its
process ends, however it ends (SIGKILL, out of memory), so a folder whose lock can be taken
belongs to no live run; a pid can be reused, and a run can last longer than any age (`nmtkit
train` locks its SAVE_DIR the same way). A cleaner takes the lock of each leftover before it
deletes it and keeps it until the folder is gone, and a new folder counts as made only once its
creator holds its lock and finds it still in place, so the two never race. Where flock does not
exist (Windows) or the file system refuses it (some network mounts), nothing is removed or put back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

_HELD: dict[str, int] = {}  # build folder -> the fd holding its flock, while this process builds in it

# what the fields of a folder name template match in the names of existing folders
_FIELDS = {"name": "(?P<name>.+)", "rand": "[a-z0-9_]{8}", "hex": "[0-9a-f]{8}"}


class NoLocks(Exception):
    """The system or the file system has no flock: no folder can be told dead."""


@dataclass(frozen=True)
class WorkFolders:
    """How one command names its hidden folders beside a target NAME, and what it says of them.

    `build` (the new target being built) and `aside` (an earlier target moved aside for the
    rename): name templates, where `{name}` is the target's name, `{rand}` eight characters of
    [a-z0-9_] (tempfile's alphabet) and `{hex}` eight hex digits; new folders get hex digits in
    both, so that the folders of every earlier nmtkit are still recognised. `marker`: the file
    that makes an earlier target worth putting back. `restored` ({target}, {name}: the folder's
    name) and `removed` ({path}): the lines `clear` returns.
    """

    build: str
    aside: str
    marker: str
    restored: str
    removed: str

    def build_folder(self, target: Path) -> Path:
        """A new hidden folder beside `target` to build it in, with a plain mkdir's permissions,
        locked by this process until `put_in_place` or `discard`."""
        for _ in range(100):
            d = target.parent / _name(self.build, target)
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            if _hold(d):
                return d
        raise OSError(f"cannot make a working folder beside {target}: each one vanished before it could be locked")

    def put_in_place(self, tmp: Path, target: Path) -> None:
        """Rename the finished build folder `tmp` to `target` and let go of its lock. An existing
        `target` is swapped out in one step where the system can, then deleted; elsewhere it is
        moved aside for the rename (`_rename_over`). A failure leaves `tmp` to the caller."""
        if not target.exists():
            os.replace(tmp, target)
        elif exchange(tmp, target):
            _fsync_dir(target.parent)
            _remove(tmp)  # the earlier target, under the build folder's name now
        else:
            self._rename_over(tmp, target)
        _fsync_dir(target.parent)
        release(tmp)

    def _rename_over(self, tmp: Path, target: Path) -> None:
        """The two renames: `target`, locked first so that no cleaner takes it for a dead run's,
        moves aside and `tmp` takes its place; it is deleted after, or put back if the second
        rename fails. Killed between the two, it stays aside for `clear` to put back."""
        aside = target.parent / _name(self.aside, target)
        try:
            fd = _take(target)  # None for a symlink, which is moved, not what it points to
        except NoLocks:
            fd = None
        try:
            os.replace(target, aside)
            try:
                os.replace(tmp, target)
            except BaseException:
                os.replace(aside, target)
                raise
            _fsync_dir(target.parent)
            _remove(aside)
        finally:
            if fd is not None:
                os.close(fd)

    def clear(self, target: Path, every_name: bool = False) -> list[str]:
        """Put back a `target` that a killed run left aside, and remove the folders of runs that
        are gone: `target`'s, or with `every_name` those of any target in its folder. Returns what
        was done, one line each, for the user; the folders of runs still going are left alone."""
        try:
            found = [(p, *kind) for p in target.parent.iterdir()
                     if (kind := self._kind(p.name, None if every_name else target.name))]
        except OSError:  # no parent folder yet, or one that cannot be listed: nothing to do
            return []
        found.sort(key=lambda f: (f[1] != "aside", -_mtime(f[0])))  # the newest aside was in place last
        done: list[str] = []
        for p, kind, name in found:
            try:
                fd = _take(p)
            except NoLocks:
                return done
            if fd is None:
                continue  # a live run's
            try:
                line = self._clear_one(p, kind, p.parent / name)
            finally:
                os.close(fd)
            if line is not None:
                done.append(line)
        return done

    def _clear_one(self, p: Path, kind: str, dest: Path) -> str | None:
        """Remove the dead folder `p`, or put back the earlier `dest` it holds when `dest` is
        missing; what was done, or None where nothing could be."""
        if kind == "aside" and not os.path.lexists(dest):
            # an earlier nmtkit export moved it aside as NAME inside the folder; now the folder is it
            kept = p / dest.name if (p / dest.name / self.marker).is_file() else p
            if (kept / self.marker).is_file():
                try:
                    os.replace(kept, dest)
                except OSError:
                    return None  # left as it is: it holds the only copy of `dest`
                shutil.rmtree(p, ignore_errors=True)
                return self.restored.format(target=dest, name=p.name)
        shutil.rmtree(p, ignore_errors=True)
        return None if os.path.lexists(p) else self.removed.format(path=p)

    def left_aside(self, target: Path) -> list[Path]:
        """The folders holding an earlier `target` that a run now gone moved aside (to name in a
        message about a missing `target`)."""
        return [p for p in sorted(target.parent.iterdir())
                if self._kind(p.name, target.name) == ("aside", target.name) and _dead(p)]

    def _kind(self, entry: str, name: str | None) -> tuple[str, str] | None:
        """("build" | "aside", the target's name) when `entry` names one of these folders, of the
        target `name` (None: of any)."""
        for kind, template in (("aside", self.aside), ("build", self.build)):
            m = _regex(template).fullmatch(entry)
            if m and name in (None, m.group("name")):
                return kind, m.group("name")
        return None


def _name(template: str, target: Path) -> str:
    import secrets  # here: every command that opens an export imports this module

    rand = secrets.token_hex(4)
    return template.format(name=target.name, rand=rand, hex=rand)


def _regex(template: str) -> re.Pattern:
    """The names `template` stands for, as a regex (`_FIELDS`)."""
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile("".join(_FIELDS[p] if i % 2 else re.escape(p) for i, p in enumerate(parts)))


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


# ---- locks ------------------------------------------------------------------------------------------


def _take(path: Path) -> int | None:
    """An fd holding an exclusive flock on directory `path` (closing it releases the lock), or
    None when a live process holds it (this one included) or `path` is not a plain directory;
    `NoLocks` where flock is not available."""
    if fcntl is None:
        raise NoLocks
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
        raise NoLocks from None
    return fd


def _hold(d: Path) -> bool:
    """Lock the new folder `d` for this process (`release`). False when a cleaner took it for a
    leftover before it was locked (it is removing it, or has): it never was this run's."""
    try:
        fd = _take(d)
    except NoLocks:
        return True
    if fd is None:
        return False
    here = None
    with contextlib.suppress(OSError):
        here = os.stat(d, follow_symlinks=False)
    mine = os.fstat(fd)
    if here is None or (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
        os.close(fd)
        return False
    _HELD[str(d)] = fd
    return True


def _dead(p: Path) -> bool:
    """True when `p`'s lock can be taken: no live run holds it."""
    try:
        fd = _take(p)
    except NoLocks:
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


def release(folder: Path) -> None:
    """Let go of the lock this process holds on the build folder `folder` (if it does)."""
    fd = _HELD.pop(str(folder), None)
    if fd is not None:
        os.close(fd)


def discard(folder: Path) -> None:
    """Delete a build folder this process gives up, then let go of its lock (in that order, so
    that no cleaner takes it meanwhile)."""
    shutil.rmtree(folder, ignore_errors=True)
    release(folder)


# ---- renaming ----------------------------------------------------------------------------------------


def exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (Linux renameat2 RENAME_EXCHANGE). False where the
    system or the file system cannot; the caller then uses two renames."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, musl
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(p: Path) -> None:
    """Delete a folder (or the symlink that a replaced target was: what it points to stays)."""
    if p.is_symlink():
        with contextlib.suppress(OSError):
            os.unlink(p)
    else:
        shutil.rmtree(p, ignore_errors=True)
