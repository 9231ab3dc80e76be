"""What `nmtkit serve` writes to its log (stderr), made safe to read.

- `printable`: every logged line goes through it. A request's path is percent-decoded (`%0a` is
  a newline, `%1b` the escape character that starts a terminal's control sequences), and file
  names or error messages may hold anything: control and other invisible characters are written
  as `\\xNN` / `\\uNNNN` escapes, so that no one can forge a log line or drive the terminal
  that shows the log.
- `Notes`: what a flood of clients could repeat thousands of times a second (connections
  refused, slow clients closed, `accept()` failing with "Too many open files") is one line at
  most every `interval` seconds per kind, with the count of what happened since the last one.
- `LogHandler`: uvicorn's own warnings and errors (with a bug's traceback) go to the same log
  function, escaped too.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text: str) -> str:
    """`text` with every character that is not printable (controls, line and paragraph
    separators, format characters such as bidi overrides, spaces other than " ") escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


class Notes:
    """One log line per kind at most every `interval` seconds; the events between two lines are
    counted into the next line, or into the one `flush()` writes once the interval has passed."""

    def __init__(self, log: Callable[[str], None], interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.log, self.interval, self.clock = log, interval, clock
        self._last: dict[str, float] = {}
        self._pending: dict[str, tuple[int, str]] = {}  # kind -> (events not logged yet, the latest line)

    def note(self, kind: str, line: str) -> None:
        """One event of `kind`, described by `line`."""
        n = self._pending.get(kind, (0, line))[0] + 1
        self._pending[kind] = (n, line)
        last = self._last.get(kind)
        if last is None or self.clock() - last >= self.interval:
            self._write(kind)

    def flush(self, everything: bool = False) -> None:
        """Write the counted events of every kind whose interval has passed (of every kind, with
        `everything`: when the server stops)."""
        now = self.clock()
        for kind in list(self._pending):
            if everything or now - self._last.get(kind, now - self.interval) >= self.interval:
                self._write(kind)

    def _write(self, kind: str) -> None:
        n, line = self._pending.pop(kind)
        last = self._last.get(kind)
        now = self.clock()
        if last is not None:
            line += f" ({n} time{'s' if n != 1 else ''} in the last {now - last:.0f} s)"
        else:
            line += f" (at most one such line every {self.interval:g} s)"
        self._last[kind] = now
        self.log(line)


def traceback_lines(exc: BaseException) -> list[str]:
    """The traceback of `exc` as lines, the exceptions' messages escaped (they may hold what a
    client sent); the frames are the program's own."""
    te = traceback.TracebackException.from_exception(exc)
    seen, todo = set(), [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(getattr(t, "_str", None), str):
            t._str = printable(t._str)
        todo += [x for x in (t.__cause__, t.__context__) if x is not None]
    return "".join(te.format()).splitlines()


class LogHandler(logging.Handler):
    """A `logging` handler that writes each record as `nmtkit serve: LEVEL: message` lines
    (and its traceback's lines) to `log`, escaped (see `printable`). A record without a
    traceback (uvicorn's "Invalid HTTP request received.", which any client can cause) goes
    through `notes`: one line per message at most every interval."""

    def __init__(self, log: Callable[[str], None], notes: Notes, level: int = logging.WARNING):
        super().__init__(level)
        self._log, self._notes = log, notes

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"nmtkit serve: {record.levelname.lower()}: {printable(record.getMessage().strip())}"
            if not (record.exc_info and record.exc_info[1] is not None):
                self._notes.note(line, line)
                return
            for text in [line, *traceback_lines(record.exc_info[1])]:
                self._log(printable(text))
        except Exception:  # noqa: BLE001 - logging's own convention
            self.handleError(record)
