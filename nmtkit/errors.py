"""The one exception type for mistakes a user can fix.

Library code raises `UserError` with a message that names the file, line or flag at fault; the CLI
prints it as one red line and exits 2. Anything else is a bug and keeps its traceback under --debug.
"""


class UserError(Exception):
    """A problem with the user's input or flags, reported without a traceback."""


def count(n: int, noun: str) -> str:
    """`1 line`, `2 lines`: counts in messages agree with their number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a
    one-line error quotes of a library's multi-line message."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
