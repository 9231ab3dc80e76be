"""The `nmtkit` command line: flag parsing only; the work is done by library functions.

`main` turns a `UserError` (or a bad flag) into one red line on stderr and exit status 2; other
exceptions are bugs and keep their traceback under `--debug` / NMTKIT_DEBUG=1.
"""

from __future__ import annotations

import errno
import os
import sys

import typer
from nmtkit.cli.app import PipeClosed, app, state
from nmtkit.errors import UserError

# Each subcommand module registers its command on `app` when imported; `app` imports a module
# when its command is used (add a subcommand to nmtkit.cli.app.COMMANDS). Nothing else is
# imported before it is needed: rich on the first error line, fairseq's flags on an unknown one.

try:  # typer >= 0.20 vendors click as typer._click (and imports no click); older typer uses click itself
    from typer._click import exceptions as _typer_click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    _typer_click_exceptions = None


def _click_errors() -> tuple[type[Exception], ...]:
    """The ClickException classes an error may be of: typer's copy of click's, and click's own once
    click is loaded (only code that imported click can raise one; importing it here would cost
    every command's start-up)."""
    found = (_typer_click_exceptions, sys.modules.get("click.exceptions"))
    return tuple(m.ClickException for m in found if m is not None)


_err = None  # the console of error lines, made by the first one (rich is not every command's import)


def error_line(message: str) -> None:
    """Print one red `nmtkit: error: ...` line on stderr (no markup, no emoji: `train.de:100:`
    must not print as `train.de💯`)."""
    global _err
    if _err is None:
        from nmtkit.console import stderr_console

        _err = stderr_console()
    _err.print(f"nmtkit: error: {message}", style="bold red")


def _fairseq_hint(e: Exception, ctx) -> str | None:
    """`FLAG: the nmtkit way` when click's "No such option" is about one of fairseq's flags for
    this command (nmtkit.cli.fairseq_flags), else None: the message stays click's."""
    option = getattr(e, "option_name", None)
    if type(e).__name__ != "NoSuchOption" or not option or ctx is None or ctx.parent is None:
        return None
    from nmtkit.cli import fairseq_flags

    return fairseq_flags.hint(ctx.info_name, option)


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is still buffered
    does not fail again on the closed pipe (Python would print "Exception ignored" and exit 120)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (e.g. captured in tests)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point; exits with 0 on success, 2 on user error, 1 on a bug."""
    if argv is not None:
        state["debug"] = state["debug"] or "--debug" in argv
    elif "--debug" in sys.argv[1:]:
        state["debug"] = True
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="nmtkit", standalone_mode=False)
        sys.stdout.flush()  # here, not at exit: a reader gone by now is handled below like the rest
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        error_line("aborted")
        sys.exit(130)
    except _click_errors() as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `nmtkit` / `nmtkit CMD`: show help
            print(e.format_message())
            sys.exit(0)
        if state["debug"]:
            raise
        ctx = getattr(e, "ctx", None)
        hint = _fairseq_hint(e, ctx)
        if hint is not None:  # `generate --remove-bpe`: say what nmtkit does instead
            error_line(hint)
            sys.exit(2)
        where = f" (see 'nmtkit {ctx.info_name} --help')" if ctx is not None and ctx.parent else ""
        error_line(e.format_message().replace("\n", " ") + where)
        sys.exit(2)
    except UserError as e:
        if state["debug"]:
            raise
        error_line(str(e))
        sys.exit(2)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    except (PipeClosed, BrokenPipeError):
        # `nmtkit generate | head`: the reader went away; that is not an error of ours.
        _discard_stdout()
        sys.exit(0)
    except OSError as e:
        if state["debug"]:
            raise
        if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):  # a write no library code named
            what = "disk quota exceeded" if e.errno != errno.ENOSPC else "no space left on device"
            error_line(f"{what} while writing {e.filename}" if e.filename else what)
            sys.exit(2)
        error_line(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)")
        sys.exit(1)
    except Exception as e:  # a bug: say so in one line unless the user asked for the traceback
        if state["debug"]:
            raise
        error_line(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)")
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)
