"""The one opener: what a model path is, which engine runs it, and the formats `nmtkit export` writes.

Why one place: `nmtkit generate`, `serve`, `attention` and `Translator.load` all take a model
path that is either nmtkit's own checkpoint(s) with their data directory, or a directory made by
`nmtkit export`. `describe` decides which, once per command, from the directory's own
description file (`nmtkit.json`, whose `runtime.name` is its format, read once), and gives a
`ModelSource` that the command passes along: nothing downstream reads a description again. The
rules about what each can be combined with (ensembles, a data directory beside an export, --ema,
--quantize) follow the engine's declared support (`engine_class`), in `describe` and
`check_quantize`.

Adding a runtime format: a package `nmtkit/backends/NAME/` with `convert.py` (`QUANTIZATIONS`,
`import_runtime`, `prepare`, `write`) and `engine.py` (`ENGINE`, an `Engine` subclass), and one
line in `FORMATS` (docs/internals.md).
"""

from __future__ import annotations

import importlib
import os  # noqa: F401 - os.PathLike in annotations
from collections.abc import Sequence

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


def export_info(path: str | os.PathLike) -> dict | None:
    """The checked description (`nmtkit.json`) of export directory `path`, whose runtime this
    nmtkit runs; None when `path` is not an export directory (a checkpoint file, or anything else)."""
    from nmtkit.backends.directory import is_export_dir, read_info

    if not is_export_dir(path):
        return None
    info = read_info(path)
    name = info["runtime"].get("name")
    if name in EXPORT_ONLY:
        raise UserError(f"{path} is a {name} export, for another library (docs/export.md); nmtkit does not "
                        f"translate with it: use its checkpoint, or nmtkit import-hf {path}")
    if name not in FORMATS:
        raise UserError(f"{path}: exported for {name!r}, which this nmtkit cannot run "
                        f"(known: {', '.join(FORMATS)})")
    return info


class ModelSource:
    """What a model path is, decided once per command (`describe`) and then passed along: nmtkit
    checkpoints with their data directory, or one export directory carrying its own copies of
    the data directory's files. Each description is read once: an export's `nmtkit.json` by
    `describe`, a data directory's manifest when first asked for (`manifest`)."""

    def __init__(self, format: str, engine: type, paths: tuple[str, ...], folder: str,
                 manifest: dict | None = None, info: dict | None = None):
        self.format = format  # CHECKPOINT or an export format
        self.engine = engine  # the Engine subclass that runs it (`engine_class(format)`)
        self.paths = tuple(paths)
        self.folder = folder  # where the dictionaries and subword models are: the data directory or the export
        self.info = info  # an export's nmtkit.json; None for checkpoints
        self._manifest = manifest
        self._checked = False

    @property
    def export(self) -> str | None:
        """The export directory, or None for checkpoints."""
        return None if self.info is None else self.paths[0]

    @property
    def manifest(self) -> dict:
        """The data directory's manifest (read on first use), or the export's copy of its entries."""
        if self._manifest is None:
            from nmtkit.data.manifest import load_manifest

            self._manifest = load_manifest(self.folder)
        return self._manifest

    def check(self) -> None:
        """What the description names, checked once before anything is loaded: the checkpoints
        there and their data directory's manifest read, or an export's files against its
        `nmtkit.json` (the runtime's present, the copied data files' sha256)."""
        if self._checked:
            return
        if self.info is not None:
            from nmtkit.backends.directory import check_files

            check_files(self.folder, self.info)
        else:
            from nmtkit.io import require_exists

            for p in self.paths:
                require_exists(p)
            self.manifest  # noqa: B018 - read now: "data directory not found" before any weight is loaded
        self._checked = True

    def dictionaries(self):
        """(source Dictionary, target Dictionary), checked against their sha256."""
        from nmtkit.data.manifest import load_dictionaries

        return load_dictionaries(self.folder, self.manifest)

    def subword_model(self, lang: str):
        """Language `lang`'s subword model, checked against its sha256."""
        from nmtkit.data.subwords import load_subword_model

        return load_subword_model(self.folder, lang, self.manifest)


def find_export(paths: Sequence[str]) -> tuple[str, str, dict] | None:
    """(the export directory among `paths`, its format, its nmtkit.json), or None: all are
    checkpoints. Each directory's description is read once."""
    for p in paths:
        info = export_info(p)
        if info is not None:
            return str(p), info["runtime"]["name"], info
    return None


def describe(paths: Sequence[str], data_dir, *, ema: bool = False, api: bool = False,
             forced: str | None = None) -> ModelSource:
    """What `paths` are, decided once: nmtkit checkpoints with `data_dir`, or one export directory
    (its `nmtkit.json` read here, once), after refusing what the format cannot be combined with,
    in one line phrased for the command line's flags (or, with `api`, for `Translator.load`'s
    arguments). `forced`: a use that needs teacher forcing (`nmtkit attention`), refused first on
    an engine without it. Nothing else is read: the manifest when first asked for, the files
    when opened (`ModelSource.check`)."""
    if not paths:
        raise UserError("Translator.load: no checkpoint given (a path, or a list of paths for an ensemble)" if api
                        else "--path is required (give it several times for an ensemble)")
    paths = tuple(str(p) for p in paths)
    found = find_export(paths)
    if found is None:
        if data_dir is None:
            raise UserError(
                "Translator.load: data_dir is required: the data directory the checkpoint was trained with "
                "(its dictionaries and subword models), unless path is a directory made by nmtkit export" if api
                else "missing DATA_DIR: the data directory the checkpoint was trained with "
                     "(only an export directory as --path needs none)")
        return ModelSource(CHECKPOINT, engine_class(CHECKPOINT), paths, str(data_dir))
    export, fmt, info = found
    engine = engine_class(fmt)
    if forced is not None:
        engine.require_teacher_forcing(forced)
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
    return ModelSource(fmt, engine, (export,), export, info["data"], info)


def check_quantize(source: ModelSource, quantize: str | None, *, api: bool = False) -> None:
    """Refuse --quantize where the format fixed its weight type when it was written (an export)."""
    if quantize in (None, "none") or source.engine.quantizes:
        return
    raise UserError(f"quantize: {source.paths[0]} runs with the weight type chosen when it was exported "
                    "(nmtkit export --quantization int8)" if api else
                    f"--quantize: {source.paths[0]} runs with the weight type chosen when it was exported; export "
                    "with nmtkit export --quantization int8 (or int8_float32) instead, and drop --quantize")
