"""The model and search flags that `nmtkit generate`, `serve` and `attention` share.

Why apart from each command's driver: the three commands take the same --path / DATA_DIR /
--device / --precision / --threads / --ema / --quantize and search flags, with the same defaults
that depend on the model (`search_flag_defaults`) and the same refusals (`check_model_options`),
and each then opens its model through `Translator.open`. What a path is, and what its format can
be combined with, is the one opener's (`nmtkit.backends.registry`); nothing here decides it again.
"""

from __future__ import annotations

import dataclasses
import os

from nmtkit.backends.engine import QUANTIZE_CHOICES, RuntimeOptions
from nmtkit.backends.registry import ModelSource, check_quantize, describe
from nmtkit.device import check_precision
from nmtkit.errors import UserError
from nmtkit.search.config import DECODING_PRESETS, default_search


def model_source(opts) -> ModelSource:
    """What the flags' --path is (`describe`): decided and read once per command, then kept on
    the options (`opts.source`), which every later step takes it from."""
    if opts.source is None:
        opts.paths = split_paths(opts.paths or ())
        opts.source = describe(opts.paths, opts.data_dir, ema=opts.ema)
    return opts.source


def split_paths(paths) -> list[str]:
    """--path values with fairseq's colon-separated ensembles (`--path a.pt:b.pt`) split, as if
    each part had its own --path. A value is split only when it is no existing path itself and
    every part exists; one that is neither is refused, naming the parts not found."""
    out: list[str] = []
    for p in paths:
        parts = str(p).split(":")
        if len(parts) < 2 or os.path.exists(p):
            out.append(p)
            continue
        missing = [q for q in parts if not q or not os.path.exists(q)]
        if missing:
            raise UserError(f"--path {p}: not found; read as fairseq's colon-separated ensemble, "
                            f"{', '.join(repr(q) for q in missing)} not found either (repeat --path for an ensemble)")
        out.extend(parts)
    return out


def search_flag_defaults(flags: dict, decoding: str | None, source: ModelSource) -> tuple[dict, str | None]:
    """The search flags with the defaults that depend on the model, and a note saying which
    engine defaults were chosen (None: none). A --max-len-b not given depends on the data
    (50, or 300 for a parsing model: `default_search`); --lenpen-form and --early-stop not given
    are --decoding's, else the engine's (the paper's gnmt and bound; fairseq's and beam on a
    CTranslate2 export)."""
    flags = dict(flags)
    for name, value in DECODING_PRESETS.get(decoding, {}).items():
        if flags.get(name) is None:  # a flag given beside --decoding wins
            flags[name] = value
    if flags["max_len_b"] is None:
        flags["max_len_b"] = default_search(source.manifest).max_len_b
    engine = source.engine
    applied = {k: v for k, v in engine.search_defaults.items() if flags.get(k) is None}
    flags.update(applied)
    if not applied:
        return flags, None
    given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in applied.items())
    return flags, (f"{source.export} is run by {engine.display}, which decodes with fairseq's rules: {given} "
                   "(the paper's gnmt length penalty and exact stopping need the checkpoint)")


def from_flags(cls, values: dict):
    """generate's or serve's options from their flags: the model described once (`model_source`),
    then the search defaults that depend on it (`search_flag_defaults`); the note on the engine's
    defaults is kept for the command to print once its model is open."""
    from nmtkit.settings import construct

    paths = split_paths(values["paths"] or ())
    source = describe(paths, values["data_dir"], ema=bool(values.get("ema")))
    search, note = search_flag_defaults(values["search"], values.get("decoding"), source)
    return construct(cls, {**values, "paths": paths, "search": search, "engine_note": note, "source": source})


def print_note(note: str | None) -> None:
    """A note on stderr (a default chosen for the user), as warnings are printed; None: nothing."""
    if note is not None:
        import sys

        print(f"nmtkit: note: {note}", file=sys.stderr)


def check_model_options(opts) -> str | None:
    """The checks that generate and serve share (`opts` has their model and search fields): the
    sampling-only flags, the model paths and what their format can be combined with
    (`model_source`), --precision, --threads and --quantize. Returns the export directory
    among --path, or None."""
    s = opts.search
    if opts.decoding is not None and opts.decoding not in DECODING_PRESETS:
        raise UserError(f"--decoding must be one of {', '.join(DECODING_PRESETS)}, got {opts.decoding!r}")
    if not s.sampling and (s.topk or s.topp or s.temperature != 1.0):
        raise UserError("--topk, --topp and --temperature apply only with --sampling")
    if opts.threads < 0:
        raise UserError(f"--threads must be >= 0 (0 = torch's default), got {opts.threads}")
    if opts.quantize not in QUANTIZE_CHOICES:
        raise UserError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {opts.quantize!r}")
    source = model_source(opts)
    check_quantize(source, opts.quantize)
    check_precision(opts.precision)
    if opts.quantize != "none" and opts.precision != "fp32":
        raise UserError(f"--quantize {opts.quantize} works from fp32 weights; drop --precision {opts.precision}")
    return source.export


def runtime_options(opts) -> RuntimeOptions:
    """The flags' RuntimeOptions (`opts` has --device, --precision, --threads, --ema, --quantize)."""
    quantize = getattr(opts, "quantize", "none")
    return RuntimeOptions(opts.device, opts.precision, opts.threads, opts.ema, None if quantize == "none" else quantize)


def with_seed(search, seed: int | None):
    """The search settings with --seed as their seed, unless they carry one already."""
    return dataclasses.replace(search, seed=seed) if search.seed is None and seed is not None else search
