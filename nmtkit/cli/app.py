"""The typer application object that every subcommand module registers itself on.

Kept apart from `nmtkit.cli.__init__` so that subcommand modules can import `app` without a cycle.
"""

from __future__ import annotations

import os

import typer

from nmtkit import __version__

app = typer.Typer(
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
