"""What `nmtkit export` does: a checkpoint and its data directory -> a self-contained model directory.

Steps, each refusing bad input before any work is written:
1. the options (format, quantization), the runtime's presence, the working folders that killed
   exports left beside the output (removed, or an export moved aside put back), and the output
   (absent, or an earlier export replaced with --force; never a folder holding an input);
2. the data directory's manifest and dictionaries, and the checkpoint through the one loader
   (`nmtkit.models.loading.load_models`: dictionary and language checks, `--ema` weights);
3. the format's conversion (`nmtkit.backends.FORMAT.convert`: `prepare`, then `write`),
   which refuses an architecture it cannot represent in one line naming the setting (a format
   may also refuse the data directory first, `check_data`, and add files from it after writing,
   `write_extras`: the Hugging Face tokenizer files and model card);
4. the data directory's dictionaries and subword model(s) copied beside it, and `nmtkit.json`
   written last, all in a temporary folder renamed to --output at the end
   (`nmtkit.backends.directory`).

The formats are the registered ones (`nmtkit.backends.registry.FORMATS`); this job knows none of
them by name.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nmtkit.backends.registry import EXPORT_ONLY, FORMATS, format_module
from nmtkit.errors import UserError
from nmtkit.settings import setting


@dataclass
class ExportOptions:
    """Everything `nmtkit export` needs; each field is one of its flags (docs/export.md)."""

    data_dir: str = setting(flag="data_dir", argument=True, help="The data directory the checkpoint was trained with (dictionaries, subword model).")
    path: str = setting(flag="--path", help="Checkpoint to export (an averaged one works as is).")
    output: str = setting(flag="--output", aliases=("-o",), help="The directory to create (atomically).")
    format: str = setting(next(iter(FORMATS)), flag="--format", help=f"Runtime to export for: {', '.join([*FORMATS, *EXPORT_ONLY])}.")
    quantization: str = setting("float32", flag="--quantization", help="Weight type: float32, int8, int8_float32, int8_float16, int8_bfloat16, int16, float16 or bfloat16 (onnx: float32 or int8; huggingface: float32, float16 or bfloat16).")
    ema: bool = setting(False, flag="--ema", help="Export the checkpoint's EMA weights instead of the raw weights.")
    force: bool = setting(False, flag="--force", help="Replace --output if it is an earlier export.")
    shortlist: str | None = setting(None, flag="--shortlist", help="A lexical shortlist (nmtkit shortlist) to ship with the export: onnx and ctranslate2 (its vmap.txt) apply it with generate --shortlist.")
    score_file: str | None = setting(None, flag="--score-file", help="huggingface: the output of nmtkit score, whose BLEU and sacreBLEU signature the model card reports.")

    def validate(self) -> None:
        """UserError naming the flag for every impossible setting."""
        formats = [*FORMATS, *EXPORT_ONLY]
        if self.format not in formats:
            raise UserError(f"--format must be one of {', '.join(formats)}, got {self.format!r}")
        convert = format_module(self.format, "convert")
        if self.score_file is not None and not getattr(convert, "TAKES_SCORE_FILE", False):
            raise UserError(f"--score-file: the {self.format} export has no model card; drop it")
        if self.score_file is not None and not Path(self.score_file).is_file():
            raise UserError(f"--score-file {self.score_file}: not found (give the output of nmtkit score)")
        if self.shortlist is not None and not getattr(convert, "SHORTLIST_FILE", None):
            raise UserError(f"--shortlist: the {self.format} export's runtime has no vocabulary selection; "
                            "export to onnx or ctranslate2")
        if self.shortlist is not None and not Path(self.shortlist).is_file():
            raise UserError(f"--shortlist {self.shortlist}: not found (make one with nmtkit shortlist DATA_DIR)")
        quantizations = convert.QUANTIZATIONS
        if self.quantization not in quantizations:
            raise UserError(f"--quantization must be one of {', '.join(quantizations)}, got {self.quantization!r}")


@dataclass
class ExportContext:
    """What a format's optional `write_extras(folder, ctx)` may draw on besides the weights (the
    Hugging Face export's tokenizer files and model card)."""

    opts: ExportOptions
    data_dir: str
    manifest: dict
    meta: dict  # the checkpoint's (`_checkpoint_meta`)
    cfg: object  # its ArchConfig
    command: str | None = None  # the command line for the card (None: rebuilt from `opts`)


@dataclass
class ExportResult:
    output: Path
    info: dict  # what nmtkit.json holds
    bytes: int  # size of the directory
    seconds: float
    cleaned: list[str] = field(default_factory=list)  # what was done with killed exports' leftovers

    def line(self) -> str:
        """What the command prints: the export, after a line for each leftover removed or put back."""
        cfg = self.info["arch_config"]
        done = (f"exported {self.info['checkpoint']['file']} ({self.info['arch']}, {cfg['encoder_layers']}+"
                f"{cfg['decoder_layers']} layers, d_model {cfg['d_model']}) as {self.info['runtime']['name']} "
                f"{self.info['runtime']['quantization']} -> {self.output} ({self.bytes / 2**20:.1f} MiB, "
                f"{self.seconds:.1f}s)")
        return "\n".join([*self.cleaned, done])


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _checkpoint_meta(path: str) -> dict:
    """What nmtkit.json records of the source checkpoint besides its weights: its file by name
    and sha256, never its folder (an export is made to be copied and published)."""
    from nmtkit.checkpoints import load_checkpoint

    state = load_checkpoint(path, mmap=True)  # the metadata only: no tensor is read
    meta = {k: state.get(k) for k in ("arch", "update", "epoch", "averaged_from", "data_manifest_id")}
    return {"file": Path(path).name, "sha256": sha256_of(path), **meta}


def _description(opts: ExportOptions, runtime: dict, files: list[str], cfg, meta: dict, manifest: dict,
                 names: list[str]) -> dict:
    """nmtkit.json's content (docs/export.md), without the format fields `write_info` adds."""
    from nmtkit import __version__
    from nmtkit.backends.directory import data_section

    return {
        "nmtkit_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runtime": {"name": opts.format, **runtime, "quantization": opts.quantization, "files": files},
        "arch": meta["arch"],
        "arch_config": cfg.to_dict(),
        "source_lang": manifest["source_lang"],
        "target_lang": manifest["target_lang"],
        "task": manifest.get("task", "translation"),
        "checkpoint": {
            "file": meta["file"],
            "sha256": meta["sha256"],
            "ema": opts.ema,
            "update": meta["update"],
            "epoch": meta["epoch"],
            "averaged_from": meta["averaged_from"],
            "data_manifest_id": meta["data_manifest_id"],
        },
        "data": data_section(manifest, names),
    }


def export(opts: ExportOptions, status=None) -> ExportResult:
    """Run the export; `status(msg)` (optional) is told what is happening (a spinner's text)."""
    from nmtkit.backends.directory import atomic_directory, check_output, data_files, remove_leftovers, write_info
    from nmtkit.data.manifest import load_dictionaries, load_manifest, verify_files
    from nmtkit.models.loading import load_models

    t0 = time.perf_counter()
    say = status or (lambda msg: None)
    opts.validate()
    convert = format_module(opts.format, "convert")
    convert.import_runtime()
    cleaned = remove_leftovers(opts.output)  # first: an export put back occupies --output again
    out = check_output(opts.output, opts.force, [("DATA_DIR", opts.data_dir), ("--path", opts.path)])

    say("loading the data directory and the checkpoint")
    manifest = load_manifest(opts.data_dir)
    if hasattr(convert, "check_data"):  # what the format's tokenizer cannot read, refused before loading
        convert.check_data(manifest)
    names = data_files(manifest)
    verify_files(opts.data_dir, manifest, names)
    src_dict, tgt_dict = load_dictionaries(opts.data_dir, manifest)
    if opts.shortlist is not None:  # read with the model's dictionaries: a bad file is refused before any work
        from nmtkit.data.shortlist import Shortlist

        Shortlist.load(opts.shortlist, src_dict, tgt_dict)
    meta = _checkpoint_meta(opts.path)
    loaded = load_models([opts.path], src_dict, tgt_dict, "cpu", "fp32", ema=opts.ema,
                         langs=(manifest["source_lang"], manifest["target_lang"]))
    cfg = loaded.configs[0]

    say("converting")
    prepared = convert.prepare(loaded.models[0], [src_dict[i] for i in range(len(src_dict))],
                               [tgt_dict[i] for i in range(len(tgt_dict))])
    del loaded  # the torch weights: the format's copy is what gets written
    with atomic_directory(out) as tmp:
        runtime = convert.write(prepared, tmp, opts.quantization, **({"shortlist": True} if opts.shortlist else {}))
        del prepared
        if hasattr(convert, "write_extras"):
            convert.write_extras(tmp, ExportContext(opts, opts.data_dir, manifest, meta, cfg))
        runtime_files = sorted(p.name for p in tmp.iterdir())
        for name in names:
            shutil.copy2(Path(opts.data_dir) / name, tmp / name)
        verify_files(tmp, {"files": {n: manifest["files"][n] for n in names if n in manifest["files"]}})
        info = _description(opts, runtime, runtime_files, cfg, meta, manifest, names)
        if opts.shortlist is not None:  # under the name its runtime reads (CTranslate2: vmap.txt)
            shutil.copy2(opts.shortlist, tmp / convert.SHORTLIST_FILE)
            info["shortlist"] = {"file": convert.SHORTLIST_FILE, "sha256": sha256_of(tmp / convert.SHORTLIST_FILE)}
        write_info(tmp, info)
        size = sum(p.stat().st_size for p in tmp.iterdir())
    return ExportResult(out, {"format": "nmtkit-export", **info}, size, time.perf_counter() - t0, cleaned)
