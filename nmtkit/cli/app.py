"""The typer application object that every subcommand module registers itself on.

Kept apart from `nmtkit.cli.__init__` so that subcommand modules can import `app` without a cycle.

Subcommand modules are imported only when their command is used (`COMMANDS`, `_LazyGroup`): a
command's flags come from its config dataclass, which lives beside the work it configures
(`generate`'s brings numpy and the translator), and `nmtkit score` or `nmtkit --version` should
not pay for another command's. Flag values are converted without pydantic
(`nmtkit.cli.coercion`), whose import alone outweighed most commands' own.
"""

from __future__ import annotations

import difflib
import errno
import importlib
import os

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from nmtkit import __version__
from nmtkit.cli.coercion import use_plain_coercion
from nmtkit.settings import fill_optional_values

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import UsageError

# Every subcommand and the module that registers it, in the order of the pipeline (`nmtkit --help`).
COMMANDS = {
    "preprocess": "nmtkit.cli.preprocess",
    "archs": "nmtkit.cli.archs",
    "train": "nmtkit.cli.train",
    "average-checkpoints": "nmtkit.cli.average_checkpoints",
    "shortlist": "nmtkit.cli.shortlist",
    "generate": "nmtkit.cli.generate",
    "attention": "nmtkit.cli.attention",
    "export": "nmtkit.cli.export",
    "import-hf": "nmtkit.cli.import_hf",
    "import-fairseq": "nmtkit.cli.import_fairseq",
    "serve": "nmtkit.cli.serve",
    "plot": "nmtkit.cli.plot",
    "score": "nmtkit.cli.score",
}


class PipeClosed(Exception):
    """stdout's reader went away (`nmtkit generate ... | head -3`): not an error; exit 0 quietly.

    Raised in place of BrokenPipeError because click's `main` turns an EPIPE OSError into
    exit status 1 before `nmtkit.cli.main` could see it."""


class _Command(TyperCommand):
    """A subcommand whose usage line names its arguments as the docs do: `DATA_DIR`, `[DATA_DIR]`,
    `[CHECKPOINT]...` (typer's own line puts a required one in braces, `{data_dir}`, which reads
    as a set of choices)."""

    def get_params(self, ctx) -> list:
        """typer's parameters, converting their values without pydantic (`nmtkit.cli.coercion`)."""
        params = super().get_params(ctx)
        use_plain_coercion(params)  # --help included
        return params

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name == "argument":
                name = p.metavar or p.name.upper()
                pieces.append((name if p.required else f"[{name}]") + ("..." if p.nargs != 1 else ""))
        return pieces


class _LazyGroup(TyperGroup):
    """The `nmtkit` group: builds a subcommand (importing its module) when it is first asked for."""

    def get_params(self, ctx) -> list:
        """--version, --debug and --help, converting their values without pydantic."""
        params = super().get_params(ctx)
        use_plain_coercion(params)
        return params

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise PipeClosed() from e
            raise

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS) + [n for n in self.commands if n not in COMMANDS]

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(COMMANDS[cmd_name])
            info = next(c for c in app.registered_commands if c.name == cmd_name)
            self.commands[cmd_name] = typer.main.get_command_from_info(
                info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode
            )
        cmd = self.commands.get(cmd_name)
        values = getattr(getattr(cmd, "callback", None), "optional_values", None)
        if values and not getattr(cmd, "_optional_values_filled", False):
            # flags that may be given without their value (nmtkit.settings.fill_optional_values)
            parse_args = cmd.parse_args
            cmd.parse_args = lambda ctx, args: parse_args(ctx, fill_optional_values(args, values))
            cmd._optional_values_filled = True
        return cmd

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except UsageError as e:  # typer suggests among the commands built so far: all of them here
            if args and "Did you mean" not in e.message:
                matches = difflib.get_close_matches(args[0], self.list_commands(ctx))
                if matches:
                    e.message = f"{e.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
            raise


class _App(typer.Typer):
    """The application: its subcommands are `_Command`s unless they ask for another class."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or _Command, **kwargs)


app = _App(
    cls=_LazyGroup,
    name="nmtkit",
    help="Train and use Transformer encoder-decoder models (Vaswani et al., 2017).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Set by the --debug flag (or NMTKIT_DEBUG=1); read by nmtkit.cli.main when an error escapes.
state = {"debug": os.environ.get("NMTKIT_DEBUG", "") not in ("", "0")}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nmtkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks for errors (also NMTKIT_DEBUG=1)."
    ),
) -> None:
    """nmtkit: preprocess, train, average, generate and score Transformer models."""
    if debug:
        state["debug"] = True
