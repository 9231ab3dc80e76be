"""The one exception type for mistakes a user can fix.

Library code raises `UserError` with a message that names the file, line or flag at fault; the CLI
prints it as one red line and exits 2. Anything else is a bug and keeps its traceback under --debug.
"""


class UserError(Exception):
    """A problem with the user's input or flags, reported without a traceback."""
