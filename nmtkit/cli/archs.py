"""`nmtkit archs [NAME]`: list the named architectures, or print one in full."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from nmtkit.cli.app import app
from nmtkit.console import plain_console
from nmtkit.errors import UserError
from nmtkit.models.registry import ARCH_NOTES, ARCHS, FIELD_HELP, ArchConfig, get_arch


def _console() -> Console:
    # Piped output gets a wide fixed width so that notes are not wrapped into many lines.
    return plain_console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)


def _params(cfg: ArchConfig, vocab: int) -> int:
    from nmtkit.models.transformer import count_parameters  # imports torch: only when needed

    return count_parameters(cfg, vocab, vocab)


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def _dk(cfg: ArchConfig) -> str:
    k, v = cfg.head_dim_k, cfg.head_dim_v
    return str(k) if k == v else f"{k}/{v}"


@app.command("archs")
def archs(
    name: Optional[str] = typer.Argument(None, metavar="NAME", help="Print this architecture's every field."),
    vocab: int = typer.Option(
        37000, "--vocab", help="Vocabulary size (source = target) for the parameter counts."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the config(s) as JSON instead."),
) -> None:
    """List the named architectures (Table 3 of the paper and more), or show one in full."""
    if vocab < 4:
        raise UserError(f"--vocab must be >= 4 (the special symbols), got {vocab}")
    if name is not None:
        cfg = get_arch(name)
        if as_json:
            print(json.dumps({"name": name, "config": cfg.to_dict(), "note": ARCH_NOTES[name],
                              "params": _params(cfg, vocab), "vocab": vocab}, indent=2))
            return
        table = Table(title=f"{name}: {ARCH_NOTES[name]}", title_justify="left")
        table.add_column("field")
        table.add_column("value", justify="right")
        table.add_column("meaning")
        for f in dataclasses.fields(cfg):
            value = getattr(cfg, f.name)
            shown = str(value)
            if f.name == "d_k" and value is None:
                shown = f"None (= {cfg.head_dim_k})"
            if f.name == "d_v" and value is None:
                shown = f"None (= {cfg.head_dim_v})"
            table.add_row(f.name, shown, FIELD_HELP[f.name])
        table.add_row("parameters", f"{_params(cfg, vocab):,}",
                      f"with a {vocab}-symbol vocabulary on each side (tied matrices counted once)")
        _console().print(table)
        return

    if as_json:
        print(json.dumps({n: {"config": c.to_dict(), "note": ARCH_NOTES[n]} for n, c in ARCHS.items()},
                         indent=2))
        return
    table = Table(title=f"Named architectures (parameters for a {vocab}-symbol vocabulary)",
                  title_justify="left")
    for col, just in (("name", "left"), ("layers", "right"), ("d_model", "right"),
                      ("d_ff", "right"), ("heads", "right"), ("d_k", "right"),
                      ("dropout", "right"), ("ls", "right"), ("params", "right"),
                      ("source in the paper (Table 3: dev BLEU)", "left")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for n, cfg in ARCHS.items():
        table.add_row(
            n, f"{cfg.encoder_layers}+{cfg.decoder_layers}", str(cfg.d_model), str(cfg.d_ff),
            str(cfg.heads), _dk(cfg), f"{cfg.dropout:g}", f"{cfg.label_smoothing:g}",
            _fmt_params(_params(cfg, vocab)), ARCH_NOTES[n],
        )
    _console().print(table)
