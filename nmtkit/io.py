"""File helpers shared by every subcommand: reading text safely and writing outputs atomically.

Why here: every command reads user text (plain, .gz or stdin) and must report bad bytes with the
file and line, and every command writes outputs that must never be seen half-written. Doing both
in one place keeps those guarantees identical everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import os
import shutil
import sys
import tempfile
import zlib
from pathlib import Path
from typing import IO, Iterator, Sequence

from nmtkit.errors import UserError


def resolve_text_path(prefix: str | os.PathLike, suffix: str = "") -> Path:
    """Return `prefix+suffix` or `prefix+suffix+'.gz'`, whichever exists (plain first)."""
    plain = Path(f"{prefix}{suffix}")
    if plain.is_file():
        return plain
    gz = Path(f"{prefix}{suffix}.gz")
    if gz.is_file():
        return gz
    raise UserError(f"file not found: {plain} (nor {gz.name})")


def require_file(path: str | os.PathLike, flag: str) -> None:
    """UserError naming `flag` unless `path` is an existing file ("-", stdin, passes)."""
    if str(path) == "-" or os.path.isfile(path):
        return
    if os.path.isdir(path):
        raise UserError(f"{flag} {path} is a directory, not a file")
    raise UserError(f"{flag} {path}: no such file")


def require_exists(path: str | os.PathLike) -> None:
    """UserError "checkpoint not found" when `path` (a checkpoint, or an export directory) is absent."""
    if not Path(path).exists():
        raise UserError(f"checkpoint not found: {path}")


def read_json(path: Path) -> object:
    """The JSON value in file `path` (UTF-8); UserError naming the file when it is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    # ValueError: besides bad UTF-8 and bad JSON, an integer of more digits than Python converts;
    # RecursionError: arrays or objects nested deeper than Python's stack
    except (ValueError, RecursionError) as e:
        raise UserError(f"{path}: not valid JSON: {e}") from None


def _open_binary(path: str | os.PathLike) -> IO[bytes]:
    if str(path) == "-":
        return sys.stdin.buffer
    p = Path(path)
    if not p.exists():
        raise UserError(f"file not found: {p}")
    if p.is_dir():
        raise UserError(f"expected a file but got a directory: {p}")
    if p.suffix == ".gz":
        return gzip.open(p, "rb")
    return open(p, "rb")


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain, .gz, or '-' for stdin) without line ends.

    Lines end at b"\\n" only; one trailing carriage return is removed so that CRLF files read
    like LF files; every other character (a lone "\\r", NUL, a BOM) is kept. Invalid UTF-8 raises
    UserError naming the file and 1-based line number, and so does an unreadable, corrupt or
    truncated file (the line being read when it failed), after the lines before it.
    """
    name = "<stdin>" if str(path) == "-" else str(path)
    fh = _open_binary(path)
    lineno = 0
    try:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{name}:{lineno}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                ) from None
            if line.endswith("\n"):
                line = line[:-1]
            if line.endswith("\r"):
                line = line[:-1]
            yield line
    except (gzip.BadGzipFile, EOFError, OSError, zlib.error) as e:
        if isinstance(e, UserError):
            raise
        # lineno: the lines read whole; the failure is in the next one
        raise UserError(f"{name}:{lineno + 1}: cannot read: {e}") from None
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


class DiskFullError(UserError):
    """The disk (or the user's quota) filled up while writing `path`; what was there before is kept."""

    def __init__(self, path: str | os.PathLike, quota: bool = False):
        self.path, self.quota = path, quota
        super().__init__(f"{'disk quota exceeded' if quota else 'no space left on device'} while writing {path}")


def count_lines(path: str, exact: bool = False) -> int | None:
    """Lines of a text file as `read_lines` reads them, counted in its bytes. A .gz file is read
    through only when the count must be `exact` (else None: the progress bar's total is not worth
    a pass); so is a path that is no file, which `read_lines` then reports."""
    p = Path(path)
    if p.suffix == ".gz" or not p.is_file():
        return sum(1 for _ in read_lines(path)) if exact else None
    n = 0
    last = b"\n"
    with open(p, "rb") as fh:
        while block := fh.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)


def is_disk_full(err: BaseException) -> bool:
    """True for the OSErrors of a full disk or quota (ENOSPC, EDQUOT)."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


@contextlib.contextmanager
def reporting_disk_full(path: str | os.PathLike, *, rename_inner: bool = False) -> Iterator[None]:
    """Turn a full disk inside the block into one `DiskFullError` naming `path` (exit 2, no traceback).

    `rename_inner`: a `DiskFullError` raised deeper (naming an inner, perhaps temporary, file) is
    reported as `path` too; for a command that builds a whole folder in a temporary one.
    """
    try:
        yield
    except DiskFullError as e:
        if not rename_inner:
            raise
        raise DiskFullError(path, e.quota) from None
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise DiskFullError(path, quota=e.errno != errno.ENOSPC) from None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8",
                 links: Sequence[str | os.PathLike] = ()) -> Iterator[IO]:
    """Open a temporary file beside `path`; rename it over `path` only if the block succeeds.

    A crash or exception inside the block leaves any previous `path` untouched and removes the
    temporary file, so readers only ever see a complete old file or a complete new one. The
    temporary file is named `.NAME.XXXXXXXX.tmp` in the same folder; a kill (SIGKILL, power
    loss) can leave one behind, which the writer's next run may remove (see
    `nmtkit.checkpoints.remove_leftovers`).

    `links`: other paths that receive the same finished file (a hard link, or a copy where the file
    system has none), each atomically, *before* `path` appears: whoever finds the new `path` knows
    they are all in place. A full disk raises `DiskFullError` naming the file being written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with reporting_disk_full(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    binary = "b" in mode
    try:
        with reporting_disk_full(path):
            # mkstemp creates 0600; give the file the permissions a plain open() would have.
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
            with os.fdopen(fd, mode, encoding=None if binary else encoding) as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
        for other in links:
            with reporting_disk_full(other):
                link_or_copy(Path(tmp), Path(other))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def link_or_copy(src: Path, dst: Path) -> None:
    """Make `dst` an atomic copy of the finished file `src`: a hard link if possible, else a copied temp file.

    The temporary name is `.DST.PID.tmp` beside `dst` (a kill can leave it, like atomic_write's).
    """
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        try:
            os.link(src, tmp)
        except OSError as e:
            if is_disk_full(e):
                raise
            with open(src, "rb") as fi, open(tmp, "wb") as fo:
                shutil.copyfileobj(fi, fo, 1 << 22)
                fo.flush()
                os.fsync(fo.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def output_stream(path: str | os.PathLike | None) -> Iterator[IO[str]]:
    """Write to `path` atomically, or to stdout when `path` is None or '-'."""
    if path is None or str(path) == "-":
        out = text_stdout()
        with reporting_disk_full("standard output"):
            yield out
            out.flush()
        return
    with atomic_write(path, "w") as fh:
        yield fh


def text_stdout() -> IO[str]:
    """stdout as UTF-8 whatever the locale, so piping never fails on non-ASCII output."""
    if isinstance(sys.stdout, io.TextIOWrapper) and (sys.stdout.encoding or "").lower() != "utf-8":
        sys.stdout.reconfigure(encoding="utf-8")
    return sys.stdout
