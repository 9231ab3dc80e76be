"""One typer option per settings field: `@with_settings(TrainConfig)` (see nmtkit/settings.py).

Why generated: the flags must track the config dataclass exactly; a new field with `setting(...)`
gets its flag, default, help text and panel without anyone repeating them here. Usage:

    @app.command("train")
    @with_settings(TrainConfig)
    def train_cmd(cfg: TrainConfig) -> None:
        train(cfg)

The command receives the constructed config (built by `nmtkit.settings.cli_values_to_config`,
then `validate()`d when the class has that method) as its `cfg` parameter (`into=` renames it).
Generated parameters are named after their fields; the command's own parameters keep theirs.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import typer

from nmtkit.settings import FlagField, cli_values_to_config, flag_fields, optional_values


def with_settings(cls: type, *, into: str = "cfg") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add one typer option (or argument) per flagged field of `cls`; pass the config as `into`."""
    fields = flag_fields(cls)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func)
        if into not in sig.parameters:
            raise TypeError(f"{func.__name__} must accept a {into!r} parameter (the {cls.__name__})")
        own = [p for p in sig.parameters.values() if p.name != into]
        taken = {p.name for p in own}
        extra = []
        for ff in fields:
            if ff.name in taken:
                raise TypeError(f"with_settings({cls.__name__}): parameter {ff.name!r} is defined twice")
            taken.add(ff.name)
            extra.append(inspect.Parameter(ff.name, inspect.Parameter.KEYWORD_ONLY, default=_typer_param(ff),
                                           annotation=ff.cli_type()))

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            cfg = cli_values_to_config(cls, {ff.path: kwargs.pop(ff.name) for ff in fields})
            if callable(getattr(cfg, "validate", None)):
                cfg.validate()
            return func(*args, **{into: cfg}, **kwargs)

        # Own parameters first (keyword-only ones must follow positional-or-keyword ones).
        params = sorted(own + extra, key=lambda p: p.kind == inspect.Parameter.KEYWORD_ONLY)
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.optional_values = optional_values(cls)  # type: ignore[attr-defined] # read by cli.app
        wrapper.__annotations__ = {k: v for k, v in getattr(func, "__annotations__", {}).items()
                                   if k != into} | {p.name: p.annotation for p in extra}
        return wrapper

    return decorate


def _typer_param(ff: FlagField) -> Any:
    f = ff.flag
    if f.argument:
        return typer.Argument(ff.cli_default(), help=f.help, show_default=f.show_default,
                              metavar=f.metavar or f.flag.upper())
    decls = [f"{f.flag}/{f.off_flag}" if f.off_flag else f.flag, *f.aliases]
    return typer.Option(ff.cli_default(), *decls, help=f.help, rich_help_panel=f.panel,
                        show_default=f.show_default, metavar=f.metavar)
