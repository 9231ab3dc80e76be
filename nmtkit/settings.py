"""Settings written once: a dataclass field carries its default, its flag, its help and its panel.

Why: `nmtkit train`, `generate` and `preprocess` have about a hundred settings. Written as typer
parameters, each one was spelled up to three times (the parameter with its own default and help,
a field-by-field copy into the config, the dataclass default), and the copies could drift. Now the
dataclass field is the only place:

    max_tokens: int | None = setting(4096, flag="--max-tokens", help="...", panel="Data",
                                     parse=none_if_zero)

`nmtkit.cli.options.with_settings(TrainConfig)` makes one typer option per such field (recursing
into `group(...)` fields, e.g. GenerateOptions.search) and hands the command the constructed
config; the rules live in the dataclass too (`__post_init__` / `validate()`, raising UserError
naming the flag). Fields made with plain `field()` are library-only: they have no flag.

This module imports nothing of the CLI (library modules use it); `cli_values_to_config` is the
whole flags -> config step, so tests can run it without typer.

Conventions:
- `parse` turns the command-line value into the field's value (`"0.9,0.98"` -> `(0.9, 0.98)`);
  it is applied to every value, the default included, and `parse(cli_default)` must give the
  field's default.
- `optional_value="x"`: the flag may be given without a value, meaning `x`
  (`--print-alignment` = `--print-alignment subword`; `fill_optional_values` rewrites the
  arguments before click parses them, since click options take a value or none, not either).
- `unset=True`: the flag's default is None, meaning "not given"; the field's default applies,
  unless the class's `from_flags(values)` decides from other settings (e.g. `--max-len-b` from
  the data directory, preprocess `--max-len` from `--task`). Its help text states the default.
- Every number a flag gives (a float, or the floats a `parse` makes, e.g. `--adam-betas`) must be
  finite and fit float32, where models and searches use it: `check_number`, applied to every flag
  of every command by `cli_values_to_config` (a new flag gets it without a line of its own), and
  by configs' own checks (`check_numbers(self)`) for library callers. `nan` or `inf` once gave
  empty translations (`--lenpen nan`) or internal errors (`--max-len-a nan`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Iterator, Sequence

from nmtkit.errors import UserError

SETTING = "nmtkit.setting"  # dataclasses.Field.metadata key of a `Flag`
GROUP = "nmtkit.setting_group"  # metadata key of a field whose dataclass contributes its own flags


class _Same:
    def __repr__(self) -> str:
        return "SAME"


SAME = _Same()  # Flag.cli_default: the flag's default is the field's default


class SettingError(UserError, ValueError):
    """A bad setting: a UserError (one line naming the flag) that is also the ValueError library
    callers of a config class (e.g. SearchConfig) have always caught."""


@dataclass(frozen=True)
class Flag:
    """How one dataclass field appears on the command line."""

    flag: str  # "--max-tokens"; for a positional argument, the argument's name ("data_dir")
    help: str
    panel: str | None = None  # rich help panel
    aliases: tuple[str, ...] = ()  # short forms, e.g. ("-i",)
    off_flag: str | None = None  # a bool's second switch, e.g. "--separate-bpe" for "--joint-bpe"
    parse: Callable[[Any], Any] | None = None  # command-line value -> field value
    cli_type: Any = None  # the command-line value's type when it differs from the field's
    cli_default: Any = SAME  # the flag's default when it differs from the field's
    unset: bool = False  # default None = "not given" (see the module docstring)
    show_default: bool = True
    argument: bool = False  # positional argument instead of an option
    metavar: str | None = None  # the value's name in --help (default: its type, e.g. <int>)
    optional_value: str | None = None  # the value of the flag given alone (see the module docstring)


def setting(default: Any = MISSING, *, default_factory: Any = MISSING, flag: str, help: str,
            panel: str | None = None, aliases: tuple[str, ...] = (), off_flag: str | None = None,
            parse: Callable[[Any], Any] | None = None, cli_type: Any = None, cli_default: Any = SAME,
            unset: bool = False, show_default: bool = True, argument: bool = False,
            metavar: str | None = None, optional_value: str | None = None) -> Any:
    """A dataclass field with its command-line flag (see the module docstring)."""
    meta = Flag(flag=flag, help=help, panel=panel, aliases=tuple(aliases), off_flag=off_flag, parse=parse,
                cli_type=cli_type, cli_default=None if unset else cli_default, unset=unset,
                show_default=show_default, argument=argument, metavar=metavar, optional_value=optional_value)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={SETTING: meta})


def group(cls: type, *, required: bool = False) -> Any:
    """A field holding another settings dataclass whose flags the command also gets."""
    meta = {GROUP: cls}
    if required:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default_factory=cls, metadata=meta)


def same_setting(cls: type, name: str) -> Any:
    """A new field with the default, flag and help of `cls`'s field `name`.

    Why: one flag on several commands is still written once. `nmtkit serve` takes `nmtkit
    generate`'s --path, --device, --precision, ... as they are: `device: str =
    same_setting(GenerateOptions, "device")`.
    """
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if SETTING not in f.metadata:
        raise TypeError(f"{cls.__name__}.{name} has no flag")
    return dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=dict(f.metadata))


@dataclass(frozen=True)
class FlagField:
    """One flag of a (possibly nested) settings class, as the CLI needs it."""

    path: tuple[str, ...]  # field names from the top class, e.g. ("search", "beam")
    field: dataclasses.Field
    flag: Flag
    type: Any  # the field's type hint

    @property
    def name(self) -> str:
        return self.path[-1]

    def field_default(self) -> Any:
        if self.field.default is not MISSING:
            return self.field.default
        if self.field.default_factory is not MISSING:
            return self.field.default_factory()
        return MISSING

    def cli_default(self) -> Any:
        """The typer default: cli_default, else the field's own default (Ellipsis = required)."""
        if self.flag.unset:
            return None
        if self.flag.cli_default is not SAME:
            return self.flag.cli_default
        default = self.field_default()
        return ... if default is MISSING else default

    def cli_type(self) -> Any:
        """The typer annotation: `cli_type`, else the field's type with `X | None` as Optional[X]."""
        t = self.flag.cli_type if self.flag.cli_type is not None else self.type
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            t = typing.Optional[args[0]] if len(args) == 1 else t
        if typing.get_origin(t) is list:
            t = typing.List[typing.get_args(t)[0]]
        if self.flag.unset and typing.get_origin(t) is not typing.Union:
            t = typing.Optional[t]
        return t


def flag_fields(cls: type, _prefix: tuple[str, ...] = ()) -> list[FlagField]:
    """Every flag of `cls` in field order, nested groups in place (library-only fields skipped)."""
    hints = typing.get_type_hints(cls)
    out: list[FlagField] = []
    for f in dataclasses.fields(cls):
        if GROUP in f.metadata:
            out.extend(flag_fields(f.metadata[GROUP], _prefix + (f.name,)))
        elif SETTING in f.metadata:
            out.append(FlagField(_prefix + (f.name,), f, f.metadata[SETTING], hints[f.name]))
    return out


def library_only_fields(cls: type) -> list[str]:
    """Fields of `cls` (not of its groups) that have no flag: set by library callers only."""
    return [f.name for f in dataclasses.fields(cls) if SETTING not in f.metadata and GROUP not in f.metadata]


def cli_values_to_config(cls: type, values: dict[tuple[str, ...], Any]) -> Any:
    """The config for the command-line values `{path: value}` of `flag_fields(cls)`.

    Each value goes through its flag's `parse`; then `build(cls, nested)` constructs it.
    """
    nested: dict[str, Any] = {}
    for ff in flag_fields(cls):
        value = values[ff.path]
        check_number(ff.flag.flag, value)
        if ff.flag.parse is not None:
            value = ff.flag.parse(value)
            check_number(ff.flag.flag, value)
        d = nested
        for name in ff.path[:-1]:
            d = d.setdefault(name, {})
        d[ff.name] = value
    return build(cls, nested)


def build(cls: type, values: dict[str, Any]) -> Any:
    """`cls.from_flags(values)` when the class has its own rules, else `construct(cls, values)`."""
    from_flags = getattr(cls, "from_flags", None)
    return from_flags(values) if from_flags is not None else construct(cls, values)


def construct(cls: type, values: dict[str, Any]) -> Any:
    """`cls(**values)`, with group fields built from their dicts and unset flags left out."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value = values[f.name]
        if GROUP in f.metadata and isinstance(value, dict):
            value = build(f.metadata[GROUP], value)
        elif value is None and SETTING in f.metadata and f.metadata[SETTING].unset:
            continue  # not given: the field's default
        kwargs[f.name] = value
    return cls(**kwargs)


# float32's largest finite value and smallest normal magnitude: a flag's number is used in float32
# tensors (scores, logits, weights), where a larger one is inf and a smaller nonzero one is 0.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38


def check_number(flag: str, value: Any) -> None:
    """SettingError naming `flag` unless every float in `value` (a float, or a tuple/list of
    them) is finite and representable in float32 (0, or 1.2e-38 <= |x| <= 3.4e38)."""
    for v in value if isinstance(value, (tuple, list)) else (value,):
        if not isinstance(v, float):
            continue
        if not math.isfinite(v):
            raise SettingError(f"{flag} must be a finite number, got {v}")
        if abs(v) > FLOAT32_MAX or 0.0 < abs(v) < FLOAT32_TINY:
            raise SettingError(f"{flag} {v:g} is out of range: models compute in float32, which holds 0 and "
                               f"magnitudes from {FLOAT32_TINY:.1e} to {FLOAT32_MAX:.1e}")


def check_numbers(config: Any) -> None:
    """`check_number` on every flagged field of a settings dataclass (not its groups, which check
    themselves): for library callers, who construct configs without `cli_values_to_config`."""
    for f in dataclasses.fields(config):
        if SETTING in f.metadata:
            check_number(f.metadata[SETTING].flag, getattr(config, f.name))


def iter_flags(ff: FlagField) -> Iterator[str]:
    """All command-line spellings of one flag."""
    yield ff.flag.flag
    yield from ff.flag.aliases
    if ff.flag.off_flag:
        yield ff.flag.off_flag


def optional_values(cls: type) -> dict[str, str]:
    """Spelling -> value for every flag of `cls` that may be given without its value."""
    return {spelling: ff.flag.optional_value for ff in flag_fields(cls) if ff.flag.optional_value is not None
            for spelling in (ff.flag.flag, *ff.flag.aliases)}


def fill_optional_values(args: Sequence[str], values: dict[str, str]) -> list[str]:
    """`args` with the optional value inserted after each such flag given without one (last, or
    followed by another option); nothing after `--` is touched."""
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a == "--":
            out.extend(args[i + 1:])
            break
        if a in values and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(values[a])
    return out


# ---- parse functions shared by several configs --------------------------------------------------


def none_if_zero(value: int | None) -> int | None:
    """`--max-tokens 0` means no token limit (None)."""
    return value if value else None


def negate(value: bool) -> bool:
    """A `--no-x` / `--quiet` switch stored as the positive field (`progress_bar`, `progress`)."""
    return not value


def split_prefixes(flag: str) -> Callable[[str | None], list[str]]:
    """Parse for comma-separated prefixes: None -> [], 'a,b' -> ['a', 'b'] (UserError on an empty one)."""

    def parse(value: str | None) -> list[str]:
        if value is None:
            return []
        parts = [p.strip() for p in value.split(",")]
        if any(not p for p in parts):
            raise UserError(f"{flag} has an empty prefix in {value!r} (separate several prefixes with commas)")
        return parts

    parse.__name__ = f"split_prefixes({flag})"
    return parse


def to_str(value: Any) -> Any:
    """A Path flag stored as str (configs hold plain values: they go into checkpoints)."""
    return None if value is None else str(value)
