"""File helpers shared by every subcommand: reading text safely and writing outputs atomically.

Why here: every command reads user text (plain, .gz or stdin) and must report bad bytes with the
file and line, and every command writes outputs that must never be seen half-written. Doing both
in one place keeps those guarantees identical everywhere.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
import tempfile
from pathlib import Path
from typing import IO, Iterator

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

    Invalid UTF-8 raises UserError naming the file and 1-based line number. A trailing
    carriage return is removed so that CRLF files read like LF files.
    """
    name = "<stdin>" if str(path) == "-" else str(path)
    fh = _open_binary(path)
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
    except (gzip.BadGzipFile, EOFError, OSError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{name}: cannot read: {e}") from None
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside `path`; rename it over `path` only if the block succeeds.

    A crash or exception inside the block leaves any previous `path` untouched and removes the
    temporary file, so readers only ever see a complete old file or a complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    binary = "b" in mode
    try:
        # mkstemp creates 0600; give the file the permissions a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def output_stream(path: str | os.PathLike | None) -> Iterator[IO[str]]:
    """Write to `path` atomically, or to stdout when `path` is None or '-'."""
    if path is None or str(path) == "-":
        out = text_stdout()
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
