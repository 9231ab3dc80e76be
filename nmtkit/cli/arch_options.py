"""One command-line flag per `ArchConfig` field, for commands that build a model (`nmtkit train`).

Why generated: the flags must track the dataclass exactly (a new field gets a flag, with its help
text, without anyone repeating it), and every flag the user did not give must stay "unset" so that
the named architecture's value wins. Usage in a typer command:

    @app.command("train")
    @with_arch_options
    def train(arch: str = typer.Option("transformer_base", "--arch"), ...,
              arch_overrides: dict | None = None):
        cfg = apply_overrides(get_arch(arch), arch_overrides)   # validated, or UserError

`arch_overrides` maps field names to the given value, or None for flags not given.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable, Optional

import typer

from nmtkit.models.registry import arch_field_specs

PARAM_PREFIX = "arch__"  # keeps the generated parameter names apart from the command's own
HELP_PANEL = "Architecture (each overrides the --arch value; see 'nmtkit archs NAME')"


def with_arch_options(func: Callable[..., Any] | None = None, *,
                      exclude: Iterable[str] = ()) -> Any:
    """Add `--encoder-layers`, `--d-model`, ... (all ArchConfig fields) to a typer command.

    The wrapped function receives them as one keyword argument, `arch_overrides`. Use
    `@with_arch_options(exclude=("warmup_steps",))` to leave out fields that the command exposes
    under its own flag (it then passes that value to `apply_overrides` itself).
    """
    if func is None:
        return functools.partial(_add_arch_options, exclude=frozenset(exclude))
    return _add_arch_options(func, frozenset(exclude))


def _add_arch_options(func: Callable[..., Any], exclude: frozenset[str]) -> Callable[..., Any]:
    known = {s.name for s in arch_field_specs()}
    if not exclude <= known:
        raise TypeError(f"with_arch_options: unknown field(s) to exclude: {sorted(exclude - known)}")
    sig = inspect.signature(func)
    if "arch_overrides" not in sig.parameters:
        raise TypeError(f"{func.__name__} must accept an 'arch_overrides' keyword argument")
    own = [p for p in sig.parameters.values() if p.name != "arch_overrides"]
    extra, annotations = [], {}
    for spec in arch_field_specs():
        if spec.name in exclude:
            continue
        pname = PARAM_PREFIX + spec.name
        help_text = spec.help
        if spec.type is bool:
            option = typer.Option(None, f"{spec.flag}/--no-{spec.flag[2:]}", help=help_text,
                                  show_default=False, rich_help_panel=HELP_PANEL)
        else:
            if spec.choices:
                help_text += f" [{'|'.join(spec.choices)}]"
            option = typer.Option(None, spec.flag, help=help_text, show_default=False,
                                  rich_help_panel=HELP_PANEL)
        annotation = Optional[spec.type]
        extra.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, default=option,
                                       annotation=annotation))
        annotations[pname] = annotation

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        overrides = {k[len(PARAM_PREFIX):]: kwargs.pop(k) for k in list(kwargs)
                     if k.startswith(PARAM_PREFIX)}
        return func(*args, arch_overrides=overrides, **kwargs)

    # Own parameters first (keyword-only ones must follow positional-or-keyword ones).
    ordered = sorted(own + extra, key=lambda p: p.kind == inspect.Parameter.KEYWORD_ONLY)
    wrapper.__signature__ = sig.replace(parameters=ordered)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {k: v for k, v in getattr(func, "__annotations__", {}).items()
                               if k != "arch_overrides"} | annotations
    return wrapper
