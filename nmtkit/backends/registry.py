"""The one opener: what a model path is, which engine runs it, and the formats `nmtkit export` writes.

Why one place: `nmtkit generate`, `serve`, `attention` and `Translator.load` all take a model
path that is either nmtkit's own checkpoint(s) with their data directory, or a directory made by
`nmtkit export`. `describe` decides which, once, from the directory's own description file
(`nmtkit.json`, whose `runtime.name` is its format), and `engine_class` gives the engine that
runs it. The rules about what each can be combined with (ensembles, a data directory beside an
export, --ema, --quantize) follow the engine's declared support, in `check_combination` and
`check_quantize`.

Adding a runtime format: a package `nmtkit/backends/NAME/` with `convert.py` (`QUANTIZATIONS`,
`import_runtime`, `prepare`, `write`) and `engine.py` (`ENGINE`, an `Engine` subclass), and one
line in `FORMATS` (docs/internals.md).
"""

from __future__ import annotations

import importlib
import os  # noqa: F401 - os.PathLike in annotations
from collections.abc import Sequence
from dataclasses import dataclass

from nmtkit.errors import UserError

CHECKPOINT = "checkpoint"  # nmtkit's own checkpoints, run by PyTorch
# export format -> its package (convert.py + engine.py); the first is `nmtkit export`'s default
FORMATS = {"ctranslate2": "nmtkit.backends.ctranslate2", "onnx": "nmtkit.backends.onnx"}
# export formats that no nmtkit engine runs (another library does): their package has convert.py only
EXPORT_ONLY = {"huggingface": "nmtkit.backends.huggingface"}
_TORCH = "nmtkit.backends.pytorch"


def format_module(fmt: str, part: str):
    """`convert` or `engine` of an export format, or of nmtkit's own checkpoints (engine only)."""
    package = _TORCH if fmt == CHECKPOINT else {**FORMATS, **EXPORT_ONLY}[fmt]
    return importlib.import_module(f"{package}.{part}")


def engine_class(fmt: str):
    """The Engine subclass that runs format `fmt` (not yet imported: its runtime loads on use)."""
    return format_module(fmt, "engine").ENGINE


def export_format(path: str | os.PathLike) -> str | None:
    """The format of export directory `path` (its nmtkit.json's runtime), or None when `path`
    is not an export directory (a checkpoint file, or anything else)."""
    from nmtkit.backends.directory import is_export_dir, read_info

    if not is_export_dir(path):
        return None
    name = read_info(path)["runtime"].get("name")
    if name in EXPORT_ONLY:
        raise UserError(f"{path} is a {name} export, for another library (docs/export.md); nmtkit does not "
                        f"translate with it: use its checkpoint, or nmtkit import-hf {path}")
    if name not in FORMATS:
        raise UserError(f"{path}: exported for {name!r}, which this nmtkit cannot run "
                        f"(known: {', '.join(FORMATS)})")
    return name


def find_export(paths: Sequence[str]) -> tuple[str, str] | None:
    """(the export directory among `paths`, its format), or None: all are checkpoints."""
    for p in paths:
        fmt = export_format(p)
        if fmt is not None:
            return str(p), fmt
    return None


def check_combination(paths: Sequence[str], data_dir, *, ema: bool = False, api: bool = False) -> str:
    """The format of `paths` after refusing what it cannot be combined with, in one line phrased
    for the command line's flags (or, with `api`, for `Translator.load`'s arguments)."""
    if not paths:
        raise UserError("Translator.load: no checkpoint given (a path, or a list of paths for an ensemble)" if api
                        else "--path is required (give it several times for an ensemble)")
    found = find_export(paths)
    if found is None:
        if data_dir is None:
            raise UserError(
                "Translator.load: data_dir is required: the data directory the checkpoint was trained with "
                "(its dictionaries and subword models), unless path is a directory made by nmtkit export" if api
                else "missing DATA_DIR: the data directory the checkpoint was trained with "
                     "(only an export directory as --path needs none)")
        return CHECKPOINT
    export, fmt = found
    engine = engine_class(fmt)
    if api and (data_dir is not None or (len(paths) > 1 and not engine.ensembles)):
        raise UserError(f"{export} is an export directory: it carries its own dictionaries and "
                        "subword models; load it alone, without data_dir (no ensembles of exports)")
    if len(paths) > 1 and not engine.ensembles:
        raise UserError(f"--path {export} is an export directory; ensembles need checkpoints and their data directory")
    if data_dir is not None:
        raise UserError(f"--path {export} is an export directory: it carries its own dictionaries and subword "
                        f"models; drop DATA_DIR ({data_dir})")
    if ema and not engine.runs_ema:
        raise UserError(f"--ema: {export} holds the weights chosen when it was exported (nmtkit export --ema); "
                        "drop --ema")
    return fmt


def check_quantize(paths: Sequence[str], fmt: str, quantize: str | None, *, api: bool = False) -> None:
    """Refuse --quantize where the format fixed its weight type when it was written (an export)."""
    if quantize in (None, "none") or engine_class(fmt).quantizes:
        return
    raise UserError(f"quantize: {paths[0]} runs with the weight type chosen when it was exported "
                    "(nmtkit export --quantization int8)" if api else
                    f"--quantize: {paths[0]} runs with the weight type chosen when it was exported; export "
                    "with nmtkit export --quantization int8 (or int8_float32) instead, and drop --quantize")


@dataclass(frozen=True)
class ModelSource:
    """What a model path is, decided once (`describe`): nmtkit checkpoints with their data
    directory, or one export directory carrying its own copies of the data directory's files."""

    format: str  # CHECKPOINT or an export format
    engine: type  # the Engine subclass that runs it (`engine_class(format)`)
    paths: tuple[str, ...]
    folder: str  # where the dictionaries and subword models are: the data directory or the export
    manifest: dict  # the data directory's manifest, or the export's copy of its entries
    info: dict | None = None  # an export's nmtkit.json

    def dictionaries(self):
        """(source Dictionary, target Dictionary), checked against their sha256."""
        from nmtkit.data.manifest import load_dictionaries

        return load_dictionaries(self.folder, self.manifest)

    def subword_model(self, lang: str):
        """Language `lang`'s subword model (an export's was checked by `load_export`)."""
        from nmtkit.data.manifest import subword_model_path
        from nmtkit.data.subwords import load_model_file, load_subword_model, pretokenized

        if self.info is None:
            return load_subword_model(self.folder, lang)
        sub = self.manifest["subword"]
        kind = sub.get("kinds", {}).get(lang, sub["kind"])
        return pretokenized(load_model_file(kind, subword_model_path(self.folder, lang, self.manifest)), sub, lang)


def describe(paths: Sequence[str], data_dir, fmt: str) -> ModelSource:
    """Read what `paths` of format `fmt` (from `check_combination`) hold: the manifest, or the
    export's checked description."""
    if fmt == CHECKPOINT:
        from nmtkit.data.manifest import load_manifest

        return ModelSource(fmt, engine_class(fmt), tuple(str(p) for p in paths), str(data_dir), load_manifest(data_dir))
    from nmtkit.backends.directory import load_export

    info = load_export(paths[0])
    return ModelSource(fmt, engine_class(fmt), (str(paths[0]),), str(paths[0]), info["data"], info)
