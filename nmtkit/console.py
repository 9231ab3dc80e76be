"""Rich output that shows the user's text verbatim: no markup, no emoji codes, no highlighting.

Why: rich reads `[...]` as markup and `:name:` as an emoji code, so an error about line 100 of
train.de (`train.de:100: invalid UTF-8`) printed as `train.de💯 invalid UTF-8`, losing the line
number, and a file name in brackets lost its brackets. Messages, paths and progress descriptions
hold user text, so every console, progress column and spinner nmtkit makes comes from here.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text


def plain_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A Console that prints strings as they are (no markup, emoji or highlighting), long lines
    unbroken (`soft_wrap`: an error stays one line however narrow the terminal)."""
    kwargs.setdefault("soft_wrap", True)
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False, **kwargs)


def stderr_console(**kwargs: Any) -> Console:
    """`plain_console` on stderr: errors, warnings, progress bars and spinners."""
    return plain_console(stderr=True, **kwargs)


def text_column(text_format: str, **kwargs: Any):
    """A progress-bar TextColumn whose formatted text is shown as it is (rich's default parses
    the task description as markup and emoji codes)."""
    from rich.progress import TextColumn

    return TextColumn(text_format, markup=False, **kwargs)


def plain_text(text: str) -> Text:
    """A Text for `Console.status(...)`: rich would parse a str status as markup and emoji."""
    return Text(text)
