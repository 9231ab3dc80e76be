"""The model and search flags that `nmtkit generate`, `serve` and `attention` share.

Why apart from each command's driver: the three commands take the same --path / DATA_DIR /
--device / --precision / --threads / --ema / --quantize and search flags, with the same defaults
that depend on the model (`search_flag_defaults`) and the same refusals (`check_model_options`),
and each then opens its model through `Translator.open`. What a path is, and what its format can
be combined with, is the one opener's (`nmtkit.backends.registry`); nothing here decides it again.
"""

from __future__ import annotations

import dataclasses

from nmtkit.backends.engine import PRECISION_NAMES, QUANTIZE_CHOICES, RuntimeOptions
from nmtkit.backends.registry import (
    CHECKPOINT,
    ModelSource,
    check_combination,
    check_quantize,
    describe,
    engine_class,
    find_export,
)
from nmtkit.errors import UserError
from nmtkit.search.config import DECODING_PRESETS, default_search


def default_max_len_b(data_dir: str) -> int:
    """--max-len-b when not given: 50 (the paper's translation), 300 for a parsing data directory
    (section 6.3: output limit input length + 300; linearized trees are 2-4 tokens per word)."""
    from nmtkit.data.manifest import load_manifest

    return default_search(load_manifest(data_dir)).max_len_b


def search_flag_defaults(values: dict) -> tuple[dict, str | None]:
    """The search flags with the defaults that depend on the model, and a note saying which
    engine defaults were chosen (None: none). A --max-len-b not given depends on the data
    directory (50, or 300 for a parsing data directory: `default_max_len_b`); --lenpen-form and
    --early-stop not given are --decoding's, else the engine's (the paper's gnmt and bound;
    fairseq's and beam on a CTranslate2 export). `values` holds the command's flag values:
    `search`, `paths`, `data_dir` and `decoding` (generate, serve)."""
    flags = dict(values["search"])
    for name, value in DECODING_PRESETS.get(values.get("decoding"), {}).items():
        if flags.get(name) is None:  # a flag given beside --decoding wins
            flags[name] = value
    found = find_export(values["paths"] or ())
    if flags["max_len_b"] is None:
        if found is not None:
            from nmtkit.backends.directory import read_info

            # the description alone: its files' checksums are verified once, when the model is opened
            flags["max_len_b"] = default_search(read_info(found[0])["data"]).max_len_b
        elif values["data_dir"] is not None:
            flags["max_len_b"] = default_max_len_b(values["data_dir"])
    note = None
    if found is not None:
        engine = engine_class(found[1])
        applied = {k: v for k, v in engine.search_defaults.items() if flags.get(k) is None}
        flags.update(applied)
        if applied:
            given = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in applied.items())
            note = (f"{found[0]} is run by {engine.display}, which decodes with fairseq's rules: {given} "
                    "(the paper's gnmt length penalty and exact stopping need the checkpoint)")
    return flags, note


def from_flags(cls, values: dict):
    """generate's or serve's options from their flags (`search_flag_defaults`); the note on the
    engine's defaults is kept for the command to print once its model is open."""
    from nmtkit.settings import construct

    search, note = search_flag_defaults(values)
    return construct(cls, {**values, "search": search, "engine_note": note})


def print_note(note: str | None) -> None:
    """A note on stderr (a default chosen for the user), as warnings are printed; None: nothing."""
    if note is not None:
        import sys

        print(f"nmtkit: note: {note}", file=sys.stderr)


def check_model_options(opts) -> str | None:
    """The checks that generate and serve share (`opts` has their model and search fields): the
    sampling-only flags, the model paths and what their format can be combined with
    (`check_combination`), --precision, --threads and --quantize. Returns the export directory
    among --path, or None."""
    s = opts.search
    if opts.decoding is not None and opts.decoding not in DECODING_PRESETS:
        raise UserError(f"--decoding must be one of {', '.join(DECODING_PRESETS)}, got {opts.decoding!r}")
    if not s.sampling and (s.topk or s.topp or s.temperature != 1.0):
        raise UserError("--topk, --topp and --temperature apply only with --sampling")
    fmt = check_combination(opts.paths, opts.data_dir, ema=opts.ema)
    if opts.precision not in PRECISION_NAMES:
        raise UserError(f"--precision must be one of {', '.join(PRECISION_NAMES)}, got {opts.precision!r}")
    if opts.threads < 0:
        raise UserError(f"--threads must be >= 0 (0 = torch's default), got {opts.threads}")
    if opts.quantize not in QUANTIZE_CHOICES:
        raise UserError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {opts.quantize!r}")
    check_quantize(opts.paths, fmt, opts.quantize)
    if opts.quantize != "none" and opts.precision != "fp32":
        raise UserError(f"--quantize {opts.quantize} works from fp32 weights; drop --precision {opts.precision}")
    return None if fmt == CHECKPOINT else str(opts.paths[0])


def runtime_options(opts) -> RuntimeOptions:
    """The flags' RuntimeOptions (`opts` has --device, --precision, --threads, --ema, --quantize)."""
    quantize = getattr(opts, "quantize", "none")
    return RuntimeOptions(opts.device, opts.precision, opts.threads, opts.ema, None if quantize == "none" else quantize)


def model_source(opts) -> ModelSource:
    """What the flags' --path is (after `check_model_options`), read once."""
    found = find_export(opts.paths)
    return describe(list(opts.paths), opts.data_dir, CHECKPOINT if found is None else found[1])


def with_seed(search, seed: int | None):
    """The search settings with --seed as their seed, unless they carry one already."""
    return dataclasses.replace(search, seed=seed) if search.seed is None and seed is not None else search
