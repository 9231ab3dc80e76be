"""Command-line values of the plain kinds (str, int, float, Path, lists of them) made into Python
values without pydantic.

Why: recent typer releases turn every parameter's value, a default included, into its type with
a pydantic TypeAdapter: the first one imports pydantic, and each flag of the command builds its
own. Together that costs more than importing ONNX Runtime, which is all `nmtkit generate` on an
export needs before it translates (docs/export.md, Start-up). nmtkit's flags are all of the plain
kinds, and click hands each value over as a str.

`use_plain_coercion` gives each parameter of a command a coercion that takes the values it can
decide exactly as typer's adapter does (a str as it is, a number written plainly, a path) and
hands every other value to typer's own coercion, built on first need: an odd spelling is read,
and a bad value refused, in typer's own words. Under a typer without these adapters the
parameters are left as they are.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?(?:[0-9]{1,30}\.?[0-9]{0,30}|\.[0-9]{1,30})(?:[eE][-+]?[0-9]{1,3})?")
_UNDECIDED = object()  # a value typer's own coercion must take


class _PlainCoercion:
    """The coercion of one parameter (what typer's `get_runtime_param()` returns): the plain
    values here, the others by typer's own runtime parameter."""

    def __init__(self):
        self._typer = None  # typer's own runtime parameter, built (importing pydantic) on first need

    def coerce(self, value: Any, param, ctx) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:  # as typer: a missing value is None, or () for a list
            return () if multi else None
        annotation = param.type_descriptor.annotation
        if multi and isinstance(value, (list, tuple)):
            items = [plain_value(_item_type(annotation), v, param, ctx) for v in value]
            if _UNDECIDED not in items:
                return items
        elif not multi:
            out = plain_value(annotation, value, param, ctx)
            if out is not _UNDECIDED:
                return out
        if self._typer is None:
            from typer._coercion import build_runtime_param

            self._typer = build_runtime_param(param.type_descriptor)
        return self._typer.coerce(value, param=param, ctx=ctx)


def _item_type(annotation: Any) -> Any:
    """`list[X]` -> X (anything else: itself, which `plain_value` leaves undecided)."""
    args = getattr(annotation, "__args__", None)
    return args[0] if getattr(annotation, "__origin__", None) is list and args and len(args) == 1 else annotation


def plain_value(annotation: Any, value: Any, param, ctx) -> Any:
    """`value` as typer's adapter for `annotation` makes it, or `_UNDECIDED` when that takes more
    than this: a value of another type, a number in another spelling (`1_000`, ` 3`, `nan`), a
    path option with a parser or a path type of its own."""
    if type(value) is annotation and annotation in (str, int, float):
        return value
    if type(value) is not str:
        return _UNDECIDED
    if annotation is str:
        return value
    if annotation is int:
        return int(value) if _INT.fullmatch(value) else _UNDECIDED
    if annotation is float:
        return float(value) if _FLOAT.fullmatch(value) else _UNDECIDED
    if annotation is Path:
        return _path(value, param, ctx)
    return _UNDECIDED


def _path(value: str, param, ctx) -> Any:
    """A path as typer's path adapter makes it: Path(value), then its own checks (exists,
    readable, ... as the parameter asks) in typer's own words."""
    info = param.type_descriptor.parameter_info
    if info.parser is not None or info.path_type not in (None, Path):
        return _UNDECIDED
    try:
        from typer._param_types import coerce_cli_path
    except ImportError:  # pragma: no cover - depends on the installed typer
        return _UNDECIDED
    return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)


def use_plain_coercion(params) -> None:
    """Give each typer parameter in `params` the plain coercion (one not yet coerced, of a typer
    that coerces with adapters; any other is left as it is)."""
    for p in params:
        if getattr(p, "_runtime_param", False) is None and hasattr(p, "type_descriptor"):
            p._runtime_param = _PlainCoercion()
