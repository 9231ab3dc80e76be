"""The `nmtkit preprocess` pipeline: raw parallel text -> subword model, dictionaries, shards.

Why it is built this way:
- Streaming: every pass reads the corpus in blocks and writes shards as it goes; what stays in
  memory is the dictionary, the subword model and a few chunks in flight, never the corpus.
- One encoding pass over the training text: sentences are written with provisional ids (the
  subword library's own ids, or first-seen order for string tokens) while tokens are counted;
  once the dictionary is known, a cheap vectorized pass maps the provisional ids to dictionary ids.
  Encoding twice (count, then binarize, as fairseq does) would halve throughput.
- Parallel and deterministic: `workers` processes encode chunks of a fixed size; results are
  consumed strictly in input order, so the output does not depend on the number of workers.
- Never half-written: everything goes into a hidden temporary directory beside DESTDIR, the
  manifest (the completion marker) is written last, and the directory is swapped into place only
  then (nmtkit.data.install: `--force` replaces only the files of the dataset there, DESTDIR is
  never missing, and the next run cleans up after a killed one).

Entry points: `PreprocessConfig`, `preprocess(cfg)`; for the data directory's parts see
nmtkit.data.manifest (`load_manifest`, `load_dictionaries`, `subword_model_path`, `verify_files`),
nmtkit.data.shards.load_split and nmtkit.data.subwords.load_subword_model (re-exported here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Optional

import numpy as np

from nmtkit import __version__
from nmtkit.data import install, reuse, subwords
from nmtkit.data.dictionary import Dictionary
from nmtkit.data.manifest import (  # noqa: F401  (re-exported: the data-dir API lives with the pipeline)
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    dictionary_path,
    load_dictionaries,
    load_manifest,
    sha256_file,
    subword_model_path,
    remember_verified,
    verify_files,
    write_manifest,
)
from nmtkit.data.shards import ShardInfo, ShardSetWriter, dtype_for_vocab, load_split  # noqa: F401
from nmtkit.data.subwords import load_subword_model  # noqa: F401
from nmtkit.data.textfiles import TextFileInfo, iter_line_blocks, iter_line_chunks, scan_text_file
from nmtkit.errors import UserError, count
from nmtkit.io import resolve_text_path
from nmtkit.settings import check_numbers, setting, split_prefixes, to_str

__all__ = [
    "PreprocessConfig", "PreprocessResult", "preprocess", "clean_mask",
    # the data-directory API, re-exported so that train/generate need one import
    "MANIFEST_NAME", "load_manifest", "load_dictionaries", "dictionary_path", "subword_model_path",
    "verify_files", "load_split", "load_subword_model",
]

CHUNK_LINES = 4096  # sentence pairs per encoding job; fixed, so output never depends on workers
SAMPLE_SEED = 1  # seeds the reproducible sample of lines that sentencepiece learns from
CLEAN_REASONS = ("empty", "too_long", "too_short", "ratio")
REMAP_CHUNK = 1 << 22  # tokens per block when mapping provisional ids to dictionary ids
SPM_CHILD_MIN_LINES = 200_000  # learn sentencepiece in a child process above this many lines


@dataclass
class PreprocessConfig:
    """The pipeline's settings; each field with `setting(...)` is an `nmtkit preprocess` flag, with
    its default and help text (docs/preprocess.md). The flags that select the task and the treebank
    are PreprocessJob's (nmtkit.preprocess_job)."""

    # The languages and trainpref are required for translation; `nmtkit preprocess --task
    # parsing` sets them itself (nmtkit.preprocess_job.PreprocessJob.from_flags).
    source_lang: str = setting(flag="--source-lang", aliases=("-s",), unset=True, help="Source language suffix, e.g. de (required for translation).")
    target_lang: str = setting(flag="--target-lang", aliases=("-t",), unset=True, help="Target language suffix, e.g. en (required for translation).")
    trainpref: str = setting(flag="--trainpref", unset=True, help="Training files prefix P: reads P.SRC and P.TGT (or .gz); --task parsing: a treebank P, P.trees or P.mrg (or .gz, or a folder).")
    destdir: str = setting(flag="--destdir", help="Output directory (created; replaced only with --force).")
    # several -> splits valid, valid1, ...
    validpref: list[str] = setting(default_factory=list, flag="--validpref", cli_type=Optional[str], cli_default=None, parse=split_prefixes("--validpref"), help="Validation prefix(es), comma-separated: splits valid, valid1, ...")
    # several -> splits test, test1, ...
    testpref: list[str] = setting(default_factory=list, flag="--testpref", cli_type=Optional[str], cli_default=None, parse=split_prefixes("--testpref"), help="Test prefix(es), comma-separated: splits test, test1, ...")
    bpe: str = setting("sentencepiece", flag="--bpe", help="Subword model learned on the training text: sentencepiece, subword-nmt or none.")
    vocab_size: int = setting(8000, flag="--vocab-size", unset=True, help="sentencepiece vocabulary size [default: 8000].")
    bpe_merges: int = setting(10000, flag="--bpe-merges", unset=True, help="subword-nmt merge operations [default: 10000].")
    joint_bpe: bool = setting(True, flag="--joint-bpe", off_flag="--separate-bpe", help="One subword model for both languages, or one per language.")
    # lines sentencepiece learns from (reproducible sample)
    spm_max_lines: int = setting(1_000_000, flag="--spm-max-lines", help="Lines sentencepiece learns from (a reproducible sample when the training text has more); 0 = all.")
    joined_dictionary: bool = setting(False, flag="--joined-dictionary", help="One dictionary shared by both languages (needed to share embeddings).")
    nwordssrc: int = setting(-1, flag="--nwordssrc", help="Largest source (or joined) dictionary, specials included; -1 = no limit.")
    nwordstgt: int = setting(-1, flag="--nwordstgt", help="Largest target dictionary, specials included; -1 = no limit.")
    thresholdsrc: int = setting(0, flag="--thresholdsrc", help="Source (or joined) tokens seen fewer times become <unk>.")
    thresholdtgt: int = setting(0, flag="--thresholdtgt", help="Target tokens seen fewer times become <unk>.")
    pad_to_multiple: int = setting(8, flag="--pad-to-multiple", help="Pad dictionary sizes to a multiple of this (madeupwordNNNN entries).")
    # cleaning of train only, in subword tokens; 0 = no limit (--task parsing: 0 unless given)
    max_len: int = setting(250, flag="--max-len", unset=True, show_default=False, help="Train cleaning: drop pairs with a side longer than this many subword tokens; 0 = no limit [default: 250; 0 with --task parsing].")
    min_len: int = setting(1, flag="--min-len", help="Train cleaning: drop pairs with a side shorter than this many subword tokens.")
    # 0 = no ratio check (--task parsing: 0 unless given)
    ratio: float = setting(9.0, flag="--ratio", unset=True, show_default=False, help="Train cleaning: drop pairs whose length ratio exceeds this; 0 = no check [default: 9.0; 0 with --task parsing].")
    workers: int = setting(1, flag="--workers", help="Encoding processes (output is identical for any number).")
    # sentences per shard
    shard_size: int = setting(1_000_000, flag="--shard-size", help="Sentences per shard file.")
    force: bool = setting(False, flag="--force", help="Replace a DESTDIR that holds something else (only once the new data is complete).")
    # reuse an existing model's vocabulary (nmtkit.data.reuse): no subword learning, fixed dictionaries
    srcdict: str | None = setting(None, flag="--srcdict", cli_type=Optional[Path], parse=to_str, help="Reuse this source dictionary instead of building one: a data directory (its dictionary and subword model for the source language) or a dict file (with --bpe none).")
    tgtdict: str | None = setting(None, flag="--tgtdict", cli_type=Optional[Path], parse=to_str, help="Reuse this target dictionary (a data directory or a dict file), as --srcdict.")
    # Library-only settings (no flags of their own; `--task parsing` uses them, see
    # nmtkit/parsing/pipeline.py):
    target_bpe: str | None = None  # "none": the target side is taken as whitespace tokens, no subword model
    extra_files: dict[str, str] = field(default_factory=dict)  # name in DESTDIR -> file copied there (checksummed)
    extra_manifest: dict = field(default_factory=dict)  # more top-level manifest entries (e.g. "task")

    def __post_init__(self) -> None:
        # a single prefix given as a string means one split, not one split per character
        for name in ("validpref", "testpref"):
            value = getattr(self, name)
            if isinstance(value, (str, os.PathLike)):
                setattr(self, name, [str(value)])
            elif value is None:
                setattr(self, name, [])

    def validate(self) -> None:
        """Reject impossible settings with a UserError naming the flag."""
        check_numbers(self)
        for flag, lang in (("--source-lang", self.source_lang), ("--target-lang", self.target_lang)):
            if not lang or any(c in lang for c in "/\\. \t") or lang.startswith("-"):
                raise UserError(f"{flag} must be a short language code such as 'de', got {lang!r}")
        if self.source_lang == self.target_lang:
            raise UserError(f"--source-lang and --target-lang must differ, both are {self.source_lang!r}")
        if self.bpe not in subwords.BPE_KINDS:
            raise UserError(f"--bpe must be one of {', '.join(subwords.BPE_KINDS)}, got {self.bpe!r}")
        checks = [
            ("--vocab-size", self.vocab_size, 1),
            ("--bpe-merges", self.bpe_merges, 0),
            ("--spm-max-lines", self.spm_max_lines, 0),
            ("--pad-to-multiple", self.pad_to_multiple, 1),
            ("--max-len", self.max_len, 0),
            ("--min-len", self.min_len, 0),
            ("--workers", self.workers, 1),
            ("--shard-size", self.shard_size, 1),
            ("--thresholdsrc", self.thresholdsrc, 0),
            ("--thresholdtgt", self.thresholdtgt, 0),
        ]
        for flag, value, lo in checks:
            if value < lo:
                raise UserError(f"{flag} must be >= {lo}, got {value}")
        if self.ratio != 0 and not self.ratio >= 1:
            raise UserError(f"--ratio must be 0 (off) or >= 1, got {self.ratio}")
        if self.max_len and self.min_len > self.max_len:
            raise UserError(f"--min-len {self.min_len} is larger than --max-len {self.max_len}")
        if self.joined_dictionary and (self.nwordstgt != -1 or self.thresholdtgt != 0):
            raise UserError("--nwordstgt/--thresholdtgt do not apply with --joined-dictionary (use --nwordssrc/--thresholdsrc)")
        if self.srcdict is not None or self.tgtdict is not None:
            for flag, value, default in (("--nwordssrc", self.nwordssrc, -1), ("--nwordstgt", self.nwordstgt, -1),
                                         ("--thresholdsrc", self.thresholdsrc, 0), ("--thresholdtgt", self.thresholdtgt, 0)):
                if value != default:
                    raise UserError(f"{flag} does not apply with --srcdict/--tgtdict: the reused dictionaries are taken as they are")
            if self.target_bpe is not None:
                raise UserError("--srcdict/--tgtdict apply to --task translation")
        if self.target_bpe not in (None, "none"):
            raise UserError(f"target_bpe must be None or 'none', got {self.target_bpe!r}")
        for name, path in self.extra_files.items():
            if not name or "/" in name or "\\" in name or name.startswith(".") or name == MANIFEST_NAME \
                    or name.endswith((".bin", ".idx", ".model", ".codes")) or name.startswith("dict."):
                raise UserError(f"extra file name {name!r} is not allowed in a data directory")
            if not Path(path).is_file():
                raise UserError(f"file not found: {path}")

    def lang_bpe(self, lang: str) -> str:
        """The subword kind applied to `lang`: `bpe`, or `target_bpe` on the target side when set."""
        return self.target_bpe if lang == self.target_lang and self.target_bpe is not None else self.bpe

    def output_options(self) -> dict:
        """The options that determine the output (not where it goes or how fast it is made)."""
        d = dataclasses.asdict(self)
        for k in ("trainpref", "validpref", "testpref", "destdir", "workers", "force", "extra_manifest"):
            d.pop(k)
        # the extra files count by content; unset library-only settings are left out, so data
        # directories made before they existed stay up to date
        d["extra_files"] = {name: sha256_file(path) for name, path in sorted(self.extra_files.items())}
        for k in ("target_bpe", "extra_files"):
            if not d[k]:
                d.pop(k)
        # reused dictionaries count by content (preprocess adds "reused"), not by where they were
        d.pop("srcdict")
        d.pop("tgtdict")
        return d


@dataclass
class PreprocessResult:
    destdir: Path
    manifest: dict
    up_to_date: bool  # True: DESTDIR already held this exact dataset and was left as it was
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds


# ---------------------------------------------------------------------------------------------
# progress reporting (the CLI passes a rich Progress; the library works without one)
# ---------------------------------------------------------------------------------------------


class _Task:
    def __init__(self, progress, description: str, total: int | None):
        self.p = progress
        self.id = progress.add_task(description, total=total) if progress is not None else None

    def advance(self, n: int) -> None:
        if self.p is not None:
            self.p.advance(self.id, n)

    def finish(self) -> None:
        if self.p is not None:
            t = self.p.tasks[self.p.task_ids.index(self.id)]
            self.p.update(self.id, total=t.completed)


# ---------------------------------------------------------------------------------------------
# encoding workers
# ---------------------------------------------------------------------------------------------

_MODELS: dict[str, subwords.SubwordModel] = {}  # per process: lang -> model


def _init_models(kinds: dict[str, str], model_files: dict[str, str | None], subword_entry: dict,
                 worker: bool = False) -> None:
    """Load each language's subword model, behind the directory's Moses step if it has one."""
    if worker:  # Ctrl-C is handled by the parent, which terminates the pool: no traceback per worker
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _MODELS.clear()
    for lang, path in model_files.items():
        _MODELS[lang] = subwords.pretokenized(subwords.load_model_file(kinds[lang], path), subword_entry, lang)


def _encode_side(model: subwords.SubwordModel, lines: list[str]):
    """(flat ids uint32, lengths int64, local vocab or None) for a list of lines.

    sentencepiece gives its own ids (vocab None); string tokenizers give ids in first-seen order
    within this chunk together with the list of those tokens, which the main process maps to
    global ids. Flat arrays pickle far faster than lists of lists.
    """
    if isinstance(model, subwords.SentencePieceModel):
        ids = model.encode_ids(lines)
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.uint32, count=int(lens.sum()))
        return flat, lens, None
    toks = model.encode_batch(lines)
    lens = np.fromiter(map(len, toks), dtype=np.int64, count=len(toks))
    vocab: dict[str, int] = {}
    flat = np.fromiter(
        (vocab.setdefault(t, len(vocab)) for t in chain.from_iterable(toks)), dtype=np.uint32, count=int(lens.sum())
    )
    return flat, lens, list(vocab)


def _encode_job(job: tuple[tuple[str, list[str]], ...]):
    """Encode both sides of a chunk; also report this process's CPU seconds for it."""
    c = time.process_time()
    out = [_encode_side(_MODELS[lang], lines) for lang, lines in job]
    return out, time.process_time() - c


@contextlib.contextmanager
def _spawn_without_main() -> Iterator[None]:
    """Start spawn children that do not re-import the parent's `__main__`.

    Our children only run functions of this module, but spawn re-runs the main script in each
    child: for the `nmtkit` console script that imports every subcommand (torch included), about
    a second and a few hundred MB per child, and a library caller's unguarded script would run
    again. Hiding `__main__`'s file and spec while the children start makes them import only
    what they use. Children start synchronously inside this block, so the window is short.
    """
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


class _Encoder:
    """Runs `_encode_job` in-process (workers=1) or in a pool, yielding results in input order
    with a bounded number of jobs in flight (so memory does not grow with the corpus)."""

    def __init__(self, kinds: dict[str, str], model_files: dict[str, str | None], workers: int,
                 subword_entry: dict | None = None):
        self.workers = workers
        self.pool = None
        self.worker_cpu = 0.0  # CPU seconds spent in worker processes (not counted by our process_time)
        sub = {k: v for k, v in (subword_entry or {}).items() if k == "pretokenizer"}
        if workers == 1:
            _init_models(kinds, model_files, sub)
        else:
            # spawn, not fork: the parent runs a progress-bar thread, and forking a threaded
            # process can deadlock the child.
            ctx = multiprocessing.get_context("spawn")
            with _spawn_without_main():
                self.pool = ctx.Pool(workers, initializer=_init_models, initargs=(kinds, model_files, sub, True))

    def map(self, jobs: Iterator) -> Iterator:
        if self.pool is None:
            for job in jobs:
                yield _encode_job(job)[0]
            return
        pending: deque = deque()
        for job in jobs:
            pending.append(self.pool.apply_async(_encode_job, (job,)))
            if len(pending) > 2 * self.workers:
                yield self._get(pending.popleft())
        while pending:
            yield self._get(pending.popleft())

    def _get(self, async_result):
        out, cpu = async_result.get()
        self.worker_cpu += cpu
        return out

    def close(self, ok: bool = True) -> None:
        if self.pool is not None:
            if ok:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()
            self.pool = None
        _MODELS.clear()


def _pair_jobs(src: str, tgt: str, src_path: Path, tgt_path: Path) -> Iterator:
    """Aligned chunks of both files as encoding jobs."""
    it_s, it_t = iter_line_chunks(src_path, CHUNK_LINES), iter_line_chunks(tgt_path, CHUNK_LINES)
    for a in it_s:
        b = next(it_t, None)
        if b is None or len(a) != len(b):
            raise UserError(f"{src_path} and {tgt_path} changed while being read (line counts differ now)")
        yield ((src, a), (tgt, b))
    if next(it_t, None) is not None:
        raise UserError(f"{src_path} and {tgt_path} changed while being read (line counts differ now)")


# ---------------------------------------------------------------------------------------------
# cleaning (train only)
# ---------------------------------------------------------------------------------------------


def clean_mask(src_lens: np.ndarray, tgt_lens: np.ndarray, min_len: int, max_len: int, ratio: float):
    """Moses clean-corpus-n rules on token counts; returns (keep mask, {reason: dropped}).

    A pair is dropped for the first reason that applies, in Moses' order: a side is empty; a side
    is longer than max_len (0: no limit); a side is shorter than min_len; one side is more than
    `ratio` times longer than the other (0: no check).
    """
    s, t = np.asarray(src_lens, np.int64), np.asarray(tgt_lens, np.int64)
    empty = (s == 0) | (t == 0)
    rest = ~empty
    too_long = rest & ((s > max_len) | (t > max_len)) if max_len > 0 else np.zeros_like(rest)
    rest &= ~too_long
    too_short = rest & ((s < min_len) | (t < min_len))
    rest &= ~too_short
    bad_ratio = rest & ((s > ratio * t) | (t > ratio * s)) if ratio > 0 else np.zeros_like(rest)
    rest &= ~bad_ratio
    reasons = {
        "empty": int(empty.sum()),
        "too_long": int(too_long.sum()),
        "too_short": int(too_short.sum()),
        "ratio": int(bad_ratio.sum()),
    }
    return rest, reasons


# ---------------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------------


def _split_names(kind: str, n: int) -> list[str]:
    return [kind if i == 0 else f"{kind}{i}" for i in range(n)]


def _resolve_inputs(cfg: PreprocessConfig) -> dict[str, tuple[str, dict[str, Path]]]:
    """split name -> (flag, {lang: path}); missing files name the flag."""
    out: dict[str, tuple[str, dict[str, Path]]] = {}
    groups = [("train", "--trainpref", [cfg.trainpref]), ("valid", "--validpref", cfg.validpref),
              ("test", "--testpref", cfg.testpref)]
    for kind, flag, prefs in groups:
        for name, pref in zip(_split_names(kind, len(prefs)), prefs):
            paths = {}
            for lang in (cfg.source_lang, cfg.target_lang):
                try:
                    paths[lang] = resolve_text_path(pref, f".{lang}")
                except UserError as e:
                    raise UserError(f"{flag} {pref}: {e}") from None
            out[name] = (flag, paths)
    return out


def _fingerprint(options: dict, inputs: dict) -> str:
    key = {"format_version": FORMAT_VERSION, "options": options,
           "inputs": {s: {lang: info["sha256"] for lang, info in v.items()} for s, v in inputs.items()}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _describe_difference(old: dict, options: dict, inputs: dict) -> str:
    diffs = []
    old_opts = old.get("options", {})
    for k, v in options.items():
        if old_opts.get(k) != v:
            diffs.append(f"{k} {old_opts.get(k)!r} -> {v!r}")
    old_inputs = {s: {lang: i.get("sha256") for lang, i in v.items()} for s, v in old.get("inputs", {}).items()}
    new_inputs = {s: {lang: i["sha256"] for lang, i in v.items()} for s, v in inputs.items()}
    if old_inputs != new_inputs:
        diffs.insert(0, "other input files")
    return ", ".join(diffs[:4]) + (" ..." if len(diffs) > 4 else "") if diffs else "different build"


def _check_destination(dest: Path, inputs: dict[str, tuple[str, dict[str, Path]]],
                       force: bool) -> tuple[dict | None, set[str] | None]:
    """Refuse dangerous or occupied destinations early; return the manifest already there (if
    any) and the names of the dataset files there (nmtkit.data.install.dataset_files)."""
    if dest.exists() and not dest.is_dir():
        raise UserError(f"--destdir {dest} exists and is not a directory")
    rdest = dest.resolve()
    cwd = Path.cwd().resolve()
    if rdest == cwd or rdest in cwd.parents or rdest == Path.home().resolve():
        raise UserError(f"--destdir {dest} is the current directory, one of its parents or your home; "
                        "choose a directory of its own")
    for _, paths in inputs.values():
        for p in paths.values():
            if rdest in p.resolve().parents:
                raise UserError(f"--destdir {dest} contains the input file {p}; choose another directory")
    if not dest.is_dir() or not any(dest.iterdir()):
        return None, set()
    owned = install.dataset_files(dest)
    if force:  # --force replaces the dataset's own files, nothing else
        install.check_replaceable(dest, owned)
    try:
        return load_manifest(dest), owned
    except UserError as e:
        if force:
            return None, owned
        hint = ("pass --force to replace it" if not install.foreign_entries(dest, owned)
                else "choose a new or empty directory")
        raise UserError(f"--destdir {dest} is not empty and holds no complete nmtkit dataset ({e}); {hint}") from None


def preprocess(cfg: PreprocessConfig, *, progress=None, log: Callable[[str], None] | None = None) -> PreprocessResult:
    """Build (or find up to date) the data directory `cfg.destdir`. See module docstring."""
    log = log or (lambda msg: None)
    cfg.validate()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    dest = Path(cfg.destdir)
    inputs = _resolve_inputs(cfg)
    reused = reuse.resolve(cfg.srcdict, cfg.tgtdict, cfg.source_lang, cfg.target_lang, cfg.joined_dictionary, cfg.bpe)
    install.recover(dest, log)  # what a killed run left beside DESTDIR
    existing, owned = _check_destination(dest, inputs, cfg.force)
    _refuse_reused_destination(dest, reused)
    total_bytes = sum(p.stat().st_size for _, paths in inputs.values() for p in paths.values())
    infos = _check_inputs(cfg, inputs, total_bytes, progress)
    timings["check"] = time.perf_counter() - t0
    log(f"checked {sum(len(v) for v in infos.values())} input files ({total_bytes / 1e6:,.1f} MB): "
        f"{infos['train'][cfg.source_lang].lines:,} training pairs ({timings['check']:.1f}s)")
    inputs_json = {s: {lang: i.as_json() for lang, i in v.items()} for s, v in infos.items()}
    options = _output_options(cfg, reused)
    fingerprint, done = up_to_date(dest, existing, owned, options, inputs_json, cfg.force, log, timings)
    if done is not None:
        return done

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = install.temp_dir(dest)
    try:
        manifest = _build(cfg, tmp, inputs, infos, progress, log, timings, reused)
        _add_run_entries(cfg, tmp, dest, manifest, fingerprint, inputs_json)
        put_in_place(tmp, dest, owned, manifest)
    except BaseException:
        install.remove_temp_dir(tmp)
        raise
    timings["total"] = time.perf_counter() - t0
    return PreprocessResult(dest, manifest, False, timings)


def put_in_place(tmp: Path, dest: Path, owned, manifest: dict) -> None:
    """The built directory `tmp` completed (its manifest, the record of checked files) and swapped in as DEST."""
    write_manifest(tmp, manifest)  # last: its presence marks the directory complete
    remember_verified(tmp, manifest["files"])  # their sha256s were computed from what was written
    install.install(tmp, dest, owned)


def up_to_date(dest: Path, existing: dict | None, owned, options: dict, inputs_json: dict, force: bool,
               log: Callable[[str], None], timings: dict) -> tuple[str, PreprocessResult | None]:
    """The dataset's fingerprint, and the result of a run that finds DEST already holding this very
    dataset (None: build it). Shared by the bilingual and the multilingual pipeline."""
    fingerprint = _fingerprint(options, inputs_json)
    if existing is None or force:
        return fingerprint, None
    _check_same_dataset(dest, existing, owned, options, inputs_json, fingerprint)
    log(f"{dest} is up to date (same inputs and options, checksums verified); nothing to do")
    return fingerprint, PreprocessResult(dest, existing, True, timings)


def _refuse_reused_destination(dest: Path, reused) -> None:
    """DESTDIR may not be the data directory --srcdict/--tgtdict reuses: replacing it would
    delete the dictionaries and subword model being copied from it."""
    for side in (reused or {}).values():
        if side.data_dir is not None and side.data_dir.resolve() == dest.resolve():
            raise UserError(f"--destdir {dest} is the data directory {side.flag} reuses; choose another directory")


def _check_inputs(cfg: PreprocessConfig, inputs: dict[str, tuple[str, dict[str, Path]]], total_bytes: int,
                  progress) -> dict[str, dict[str, TextFileInfo]]:
    """Step 1: read every input once before anything is written (UTF-8, line counts, checksums),
    so that a bad file stops the run at once, not after the subword model was learned."""
    task = _Task(progress, "checking inputs", total_bytes)
    infos: dict[str, dict[str, TextFileInfo]] = {}
    for split, (flag, paths) in inputs.items():
        infos[split] = {}
        for lang, p in paths.items():
            infos[split][lang] = scan_text_file(p)
            task.advance(p.stat().st_size)
        a, b = (infos[split][lang] for lang in (cfg.source_lang, cfg.target_lang))
        if a.lines != b.lines:
            raise UserError(f"{flag}: line counts differ: {a.path} has {count(a.lines, 'line')}, "
                            f"{b.path} has {count(b.lines, 'line')}")
        if a.lines == 0:
            raise UserError(f"{flag}: {a.path} and {b.path} are empty")
    task.finish()
    return infos


def _output_options(cfg: PreprocessConfig, reused) -> dict:
    """The options the fingerprint covers: the config's, and reused dictionaries by content."""
    options = cfg.output_options()
    if reused is not None:
        options["reused"] = {lang: reused[lang].describe() for lang in (cfg.source_lang, cfg.target_lang)}
    return options


def _check_same_dataset(dest: Path, existing: dict, owned: set[str] | None, options: dict, inputs_json: dict,
                        fingerprint: str) -> None:
    """Without --force, DESTDIR may hold only this very dataset, intact: a different one (named
    by what differs) or a damaged one (named by its file) is refused, never overwritten unasked."""
    if existing.get("fingerprint") != fingerprint:
        foreign = install.foreign_entries(dest, owned)
        hint = (f"it also holds {', '.join(foreign[:8])}, which --force would not remove: choose another --destdir"
                if foreign else "pass --force to replace it")
        raise UserError(f"--destdir {dest} already holds a different dataset "
                        f"({_describe_difference(existing, options, inputs_json)}); {hint}")
    try:
        verify_files(dest, existing)
    except UserError as e:
        raise UserError(f"--destdir {dest} holds this dataset but it is damaged: {e}; "
                        "pass --force to rebuild it") from None


def _add_run_entries(cfg: PreprocessConfig, tmp: Path, dest: Path, manifest: dict, fingerprint: str,
                     inputs_json: dict) -> None:
    """Complete `_build`'s manifest with what the caller added (extra files, copied into `tmp` and
    checksummed; extra entries) and what lets the next run find DESTDIR up to date (the
    fingerprint, the inputs and the options as given)."""
    for name, path in cfg.extra_files.items():
        shutil.copyfile(path, tmp / name)
        manifest["files"][name] = sha256_file(tmp / name)
    manifest["files"] = dict(sorted(manifest["files"].items()))
    for k, v in cfg.extra_manifest.items():
        if k in manifest:
            raise ValueError(f"extra manifest entry {k!r} would replace a standard one")
        manifest[k] = v
    recorded = dataclasses.asdict(cfg) | {"destdir": str(dest)}
    recorded.pop("extra_manifest")
    manifest.update(fingerprint=fingerprint, inputs=inputs_json, options=recorded)


def _learn_lines(paths: list[tuple[Path, int]], max_lines: int, task: _Task) -> Iterator[str]:
    """The non-empty lines of `paths`; a reproducible Bernoulli sample of about `max_lines` of
    them when there are more (sentencepiece's own sampler is not seeded)."""
    total = sum(n for _, n in paths)
    p = 1.0 if max_lines <= 0 or total <= max_lines else max_lines / total
    rng = np.random.default_rng(SAMPLE_SEED)
    for path, _ in paths:
        for block in iter_line_blocks(path):
            task.advance(len(block))
            if p < 1.0:
                keep = np.flatnonzero(rng.random(len(block)) < p)
                block = [block[i] for i in keep]
            for line in block:
                if line and not line.isspace():
                    yield line


class _SharedCounter:
    """A `_Task` stand-in for a child process: counts into shared memory the parent displays."""

    def __init__(self, value):
        self.value = value

    def advance(self, n: int) -> None:
        with self.value.get_lock():
            self.value.value += n


def _learn_sentencepiece_child(conn, files, max_lines, vocab_size, out_path, counter) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates us
    try:
        lines = _learn_lines([(Path(p), n) for p, n in files], max_lines, _SharedCounter(counter))
        Path(out_path).write_bytes(subwords.learn_sentencepiece(lines, vocab_size))
        conn.send(("ok", ""))
    except UserError as e:
        conn.send(("user", str(e)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("bug", f"{type(e).__name__}: {e}"))


def _learn_sentencepiece_in_child(files, max_lines: int, vocab_size: int, out_path: Path, task: _Task) -> None:
    """Learn in a separate process: sentencepiece's trainer holds the whole sample in memory and
    the allocator does not give it back, so in-process it would stay in the peak of every later
    phase (and be counted again next to the encoding workers). The model is identical."""
    ctx = multiprocessing.get_context("spawn")
    counter = ctx.Value("q", 0)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_learn_sentencepiece_child, daemon=True,
                       args=(send, [(str(p), n) for p, n in files], max_lines, vocab_size, str(out_path), counter))
    with _spawn_without_main():
        proc.start()
    send.close()
    done = 0
    try:
        msg = None
        while msg is None:
            if recv.poll(0.2):
                try:
                    msg = recv.recv()
                except EOFError:
                    msg = ("died", "")
            elif not proc.is_alive() and not recv.poll(0):
                msg = ("died", "")
            now = counter.value
            task.advance(now - done)
            done = now
        proc.join()
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join()
    kind, text = msg
    if kind == "user":
        raise UserError(text)
    if kind == "bug":
        raise RuntimeError(f"sentencepiece training failed: {text}")
    if kind == "died":
        raise RuntimeError(f"the sentencepiece training process died (exit code {proc.exitcode}; out of memory?)")


def _learn_subwords(cfg, tmp: Path, inputs, infos, progress, log) -> dict:
    """Learn the subword model(s) on the training text; return the manifest's "subword" entry."""
    src, tgt = cfg.source_lang, cfg.target_lang
    train = inputs["train"][1]
    kinds = {lang: cfg.lang_bpe(lang) for lang in (src, tgt)}
    learned = [lang for lang in (src, tgt) if kinds[lang] != "none"]
    joint = cfg.joint_bpe and len(learned) == 2
    entry: dict = {"kind": cfg.bpe, "kinds": kinds, "joint": joint if learned else None, "files": {src: None, tgt: None}}
    if not learned:
        return entry
    groups = [(None, learned)] if joint else [(lang, [lang]) for lang in learned]
    for model_lang, langs in groups:
        name = subwords.model_filename(cfg.bpe, model_lang)
        files = [(train[lang], infos["train"][lang].lines) for lang in langs]
        what = f"{'+'.join(langs)}"
        if cfg.bpe == "sentencepiece":
            task = _Task(progress, f"learning sentencepiece ({what})", sum(n for _, n in files))
            sample = sum(n for _, n in files) if cfg.spm_max_lines <= 0 else min(cfg.spm_max_lines, sum(n for _, n in files))
            if sample > SPM_CHILD_MIN_LINES:
                _learn_sentencepiece_in_child(files, cfg.spm_max_lines, cfg.vocab_size, tmp / name, task)
            else:
                proto = subwords.learn_sentencepiece(_learn_lines(files, cfg.spm_max_lines, task), cfg.vocab_size)
                (tmp / name).write_bytes(proto)
            task.finish()
            proto = (tmp / name).read_bytes()
            size = subwords.SentencePieceModel(model_proto=proto).sp.get_piece_size()
            entry["vocab_size"] = cfg.vocab_size
            log(f"learned sentencepiece model {name} ({size} pieces) on {what}")
        else:
            task = _Task(progress, f"learning subword-nmt ({what})", sum(n for _, n in files))
            counts: Counter = Counter()
            for path, _ in files:
                for block in iter_line_blocks(path):
                    subwords.count_words(block, counts)
                    task.advance(len(block))
            codes = subwords.learn_subword_nmt(counts, cfg.bpe_merges)
            task.finish()
            (tmp / name).write_text(codes, encoding="utf-8")
            entry["merges"] = cfg.bpe_merges
            log(f"learned subword-nmt codes {name} ({codes.count(chr(10)) - 1} merges) on {what}")
        for lang in langs:
            entry["files"][lang] = name
    return entry


def _grow_add(acc: np.ndarray, new: np.ndarray) -> np.ndarray:
    if len(new) > len(acc):
        acc = np.concatenate([acc, np.zeros(len(new) - len(acc), np.int64)])
    acc[: len(new)] += new
    return acc


@dataclass
class _Build:
    """What every step of one build shares: the settings, the folder it writes in, where it
    reports, and the checksums of what it wrote (the manifest's "files"), so that each step
    takes only its own inputs besides."""

    cfg: PreprocessConfig
    tmp: Path  # the hidden directory beside DESTDIR (nmtkit.data.install.temp_dir)
    progress: object  # a rich Progress, or None
    log: Callable[[str], None]
    timings: dict[str, float]  # phase -> seconds (PreprocessResult.timings)
    files: dict[str, str] = field(default_factory=dict)  # file name in tmp -> sha256

    @property
    def langs(self) -> tuple[str, str]:
        return self.cfg.source_lang, self.cfg.target_lang


@dataclass
class _EncodedTrain:
    """The training text after its one encoding pass, before the dictionaries exist: what the
    dictionaries are built from, and the shards to rewrite with their ids."""

    shards: dict[str, list[ShardInfo]]  # lang -> shards of provisional ids (uint32 .prov.bin)
    counts: dict[str, np.ndarray]  # lang -> (provisional vocab,) int64: occurrences of each id
    gvocab: dict[str, int]  # string token -> provisional id, shared by both sides (not sentencepiece)
    dropped: Counter  # cleaning reason -> pairs dropped
    lines: int  # pairs read, before cleaning


@dataclass
class _Side:
    """One language's dictionary as its shards use it: the train shards are rewritten through
    `table`, and valid/test are encoded against the same dictionary and dtype."""

    dictionary: Dictionary
    table: np.ndarray  # (provisional vocab,) int64: provisional id -> dictionary id
    dtype: np.dtype  # of the shards' ids: the smallest that holds every dictionary id


def _build(cfg, tmp: Path, inputs, infos, progress, log, timings, reused=None) -> dict:
    """Write the dataset into `tmp` and return its manifest (`preprocess` adds the run's own
    entries). The steps run in this order because each needs the one before: subword models,
    the training text encoded once, the dictionaries from its counts, the train shards in
    dictionary ids, then valid/test.

    `reused`: {lang: nmtkit.data.reuse.ReusedSide} for --srcdict/--tgtdict (subword models
    copied, dictionaries taken as they are), or None to learn both from the training text."""
    b = _Build(cfg, tmp, progress, log, timings)
    sub, model_files = _subword_models(b, inputs, infos, reused)
    spm_mode = {lang: sub["kinds"][lang] == "sentencepiece" for lang in b.langs}  # sentencepiece ids, not strings
    encoder = _Encoder(sub["kinds"], model_files, cfg.workers, sub)
    ok = False
    try:
        cpu0, wcpu0 = time.process_time(), encoder.worker_cpu
        train = _encode_train(b, encoder, inputs["train"][1], infos["train"][cfg.source_lang].lines, spm_mode)
        sides, dict_entry = _dictionaries(b, train, model_files, spm_mode, reused)
        splits = {"train": _write_train(b, train, sides)}
        timings["binarize_cpu"] = time.process_time() - cpu0 + encoder.worker_cpu - wcpu0
        t = time.perf_counter()
        for split, (_, paths) in inputs.items():
            if split != "train":
                lines = infos[split][cfg.source_lang].lines
                splits[split] = _encode_eval_split(b, encoder, split, paths, lines, sides)
        timings["encode_eval"] = time.perf_counter() - t
        ok = True
    finally:
        encoder.close(ok)
    return _manifest_entries(cfg, sub, dict_entry, splits, b.files)


def _subword_models(b: _Build, inputs, infos, reused) -> tuple[dict, dict[str, str | None]]:
    """Step 2: the subword model(s), learned on the training text or copied from the reused data
    directory; returns the manifest's "subword" entry and lang -> model file (None: no model)."""
    t = time.perf_counter()
    if reused is None:
        sub = _learn_subwords(b.cfg, b.tmp, inputs, infos, b.progress, b.log)
    else:
        sub = reuse.install_subwords(reused, b.cfg.source_lang, b.cfg.target_lang, b.tmp)
        b.log(f"reusing subword model(s) {', '.join(sorted(set(n for n in sub['files'].values() if n))) or 'none'} "
              f"and the dictionaries of {', '.join(sorted(set(sub['reused_from'].values())))}")
    for name in set(n for n in sub["files"].values() if n):
        b.files[name] = sha256_file(b.tmp / name)
    model_files = {lang: (str(b.tmp / n) if n else None) for lang, n in sub["files"].items()}
    b.timings["learn"] = time.perf_counter() - t
    return sub, model_files


def _encode_train(b: _Build, encoder: _Encoder, paths: dict[str, Path], lines: int,
                  spm_mode: dict[str, bool]) -> _EncodedTrain:
    """Step 3: encode the training text once (module docstring): provisional ids are written
    and counted while the chunks arrive, and cleaning drops pairs on the way."""
    src, tgt = b.langs
    t = time.perf_counter()
    task = _Task(b.progress, "encoding train", lines)
    writers = {lang: ShardSetWriter(b.tmp, "train", lang, np.dtype("<u4"), b.cfg.shard_size, suffix=".prov")
               for lang in b.langs}
    counts = {lang: np.zeros(0, np.int64) for lang in b.langs}
    gvocab: dict[str, int] = {}
    dropped = Counter({r: 0 for r in CLEAN_REASONS})
    for res in encoder.map(_pair_jobs(src, tgt, paths[src], paths[tgt])):
        for lang, (flat, lens) in zip(b.langs, _clean_chunk(b.cfg, res, spm_mode, gvocab, dropped)):
            counts[lang] = _grow_add(counts[lang], np.bincount(flat))
            writers[lang].add(flat, lens)
        task.advance(len(res[0][1]))  # pairs in the chunk, before cleaning
    task.finish()
    train = _EncodedTrain({lang: writers[lang].close() for lang in b.langs}, counts, gvocab, dropped, lines)
    _report_train(b, train, time.perf_counter() - t)
    return train


def _clean_chunk(cfg: PreprocessConfig, res, spm_mode: dict[str, bool], gvocab: dict[str, int], dropped: Counter):
    """One encoded chunk of the training text in global provisional ids, less the pairs that
    cleaning drops (counted into `dropped`): ((src ids, src lengths), (tgt ids, tgt lengths)),
    ids (tokens,) uint32, every sentence's ids end to end; lengths (pairs,) int64."""
    (fs, ls, vs), (ft, lt, vt) = res
    if not spm_mode[cfg.source_lang]:
        fs = _globalize(fs, vs, gvocab)
    if not spm_mode[cfg.target_lang]:
        ft = _globalize(ft, vt, gvocab)
    keep, reasons = clean_mask(ls, lt, cfg.min_len, cfg.max_len, cfg.ratio)  # keep: (pairs,) bool
    dropped.update(reasons)
    if not keep.all():
        fs, ls = fs[np.repeat(keep, ls)], ls[keep]
        ft, lt = ft[np.repeat(keep, lt)], lt[keep]
    return (fs, ls), (ft, lt)


def _report_train(b: _Build, train: _EncodedTrain, seconds: float) -> None:
    """Refuse a training text that cleaning emptied (naming the flags to look at); else log
    how fast it was encoded and what cleaning dropped."""
    kept = sum(s.sentences for s in train.shards[b.cfg.source_lang])
    if kept == 0:
        raise UserError(f"--trainpref {b.cfg.trainpref}: no sentence pair left after cleaning "
                        f"(dropped: {_reasons_text(train.dropped)}); check --min-len/--max-len/--ratio")
    b.timings["encode_train"] = seconds
    b.log(f"encoded train: {train.lines:,} pairs in {seconds:.1f}s "
          f"({train.lines / max(seconds, 1e-9):,.0f} pairs/s); kept {kept:,}, "
          f"cleaning dropped {sum(train.dropped.values()):,} ({_reasons_text(train.dropped)})")


def _dictionaries(b: _Build, train: _EncodedTrain, model_files: dict[str, str | None], spm_mode: dict[str, bool],
                  reused) -> tuple[dict[str, _Side], dict]:
    """Step 4: the dictionaries, built from the training counts (or the reused ones) and saved;
    returns per language what its shards need, and the manifest's "dictionaries" entry."""
    src, tgt = b.langs
    tokens = {lang: _spm_pieces(model_files[lang]) if spm_mode[lang] else list(train.gvocab) for lang in b.langs}
    if reused is not None:  # the model's own dictionaries, unchanged: same ids, same sha256
        dicts = {lang: reused[lang].dictionary for lang in b.langs}
    else:
        # sentencepiece: every piece of the model enters the dictionary (count 0 if the encoded
        # training text never used it), so valid/test/new input never turn a piece the model
        # can emit into <unk>; string tokens: only those seen (fairseq), as nothing else is known.
        tok_counts = {lang: _token_counts(tokens[lang], train.counts[lang], keep_zero=spm_mode[lang]) for lang in b.langs}
        dicts = _count_dictionaries(b.cfg, tok_counts)
    entry: dict = {"joined": b.cfg.joined_dictionary or (reused is not None and dicts[src].sha256 == dicts[tgt].sha256)}
    for lang in b.langs:
        name = f"dict.{lang}.txt"
        b.files[name] = dicts[lang].save(b.tmp / name)
        entry[lang] = {"file": name, "size": len(dicts[lang])}
    sides = {lang: _Side(dicts[lang], _table(dicts[lang], tokens[lang]), dtype_for_vocab(len(dicts[lang])))
             for lang in b.langs}
    b.log(f"dictionaries: {src} {len(dicts[src]):,}, {tgt} {len(dicts[tgt]):,}"
          f"{' (joined)' if entry['joined'] else ''}; shards in {sides[src].dtype.name}/{sides[tgt].dtype.name}")
    return sides, entry


def _count_dictionaries(cfg: PreprocessConfig, tok_counts: dict[str, dict[str, int]]) -> dict[str, Dictionary]:
    """lang -> Dictionary from the token counts under the --nwords*/--threshold* caps: one shared
    by both sides with --joined-dictionary (the source side's caps), else one per side."""
    src, tgt = cfg.source_lang, cfg.target_lang
    if cfg.joined_dictionary:
        joint = Counter(tok_counts[src])
        joint.update(tok_counts[tgt])
        d = Dictionary.from_counts(joint, nwords=cfg.nwordssrc, threshold=cfg.thresholdsrc,
                                   pad_to_multiple=cfg.pad_to_multiple)
        return {src: d, tgt: d}
    return {
        src: Dictionary.from_counts(tok_counts[src], nwords=cfg.nwordssrc, threshold=cfg.thresholdsrc,
                                    pad_to_multiple=cfg.pad_to_multiple),
        tgt: Dictionary.from_counts(tok_counts[tgt], nwords=cfg.nwordstgt, threshold=cfg.thresholdtgt,
                                    pad_to_multiple=cfg.pad_to_multiple),
    }


def _write_train(b: _Build, train: _EncodedTrain, sides: dict[str, _Side]) -> dict:
    """Step 5: the provisional train shards rewritten in dictionary ids (a cheap vectorized pass,
    instead of a second encoding); returns the train split's manifest entry. Warns when the
    dictionary caps turned most training tokens into <unk>."""
    t = time.perf_counter()
    task = _Task(b.progress, "writing train shards", sum(s.tokens for lang in b.langs for s in train.shards[lang]))
    final: dict[str, list[ShardInfo]] = {}
    unk = {}
    for lang in b.langs:
        side = sides[lang]
        final[lang], unk[lang] = [], 0
        for info in train.shards[lang]:
            shard, n_unk = _remap_shard(b.tmp, info, side.table, side.dtype, side.dictionary.unk, task)
            final[lang].append(shard)
            unk[lang] += n_unk
    task.finish()
    entry = _split_entry(b.langs, final, unk, train.lines, train.dropped, b.files)
    for lang in b.langs:
        msg = _unk_warning(b.cfg, lang, unk[lang], sum(s.tokens for s in train.shards[lang]))
        if msg:
            b.log(msg)
    b.timings["write_train"] = time.perf_counter() - t
    return entry


def _encode_eval_split(b: _Build, encoder: _Encoder, split: str, paths: dict[str, Path], lines: int,
                       sides: dict[str, _Side]) -> dict:
    """Step 6: one valid/test split, every line in order and no cleaning (generation output must
    align line for line with the references); returns its manifest entry."""
    src, tgt = b.langs
    task = _Task(b.progress, f"encoding {split}", lines)
    writers = {lang: ShardSetWriter(b.tmp, split, lang, sides[lang].dtype, b.cfg.shard_size) for lang in b.langs}
    unk = {lang: 0 for lang in b.langs}
    for res in encoder.map(_pair_jobs(src, tgt, paths[src], paths[tgt])):
        for lang, (flat, lens, vocab) in zip(b.langs, res):
            side = sides[lang]
            table = side.table if vocab is None else _table(side.dictionary, vocab)
            ids = table[flat].astype(side.dtype, copy=False)  # (tokens,)
            unk[lang] += int(np.count_nonzero(ids == side.dictionary.unk))
            writers[lang].add(ids, lens)
        task.advance(len(res[0][1]))
    task.finish()
    entry = _split_entry(b.langs, {lang: writers[lang].close() for lang in b.langs}, unk, lines, None, b.files)
    b.log(f"encoded {split}: {lines:,} pairs (every line kept), <unk>: {src} {unk[src]}, {tgt} {unk[tgt]}")
    return entry


def _manifest_entries(cfg: PreprocessConfig, sub: dict, dict_entry: dict, splits: dict,
                      files: dict[str, str]) -> dict:
    """The manifest of what `_build` wrote (schema: docs/formats.md)."""
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "complete": True,
        "nmtkit_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source_lang": cfg.source_lang,
        "target_lang": cfg.target_lang,
        "subword": sub,
        "dictionaries": dict_entry,
        "splits": splits,
        "files": dict(sorted(files.items())),
    }


def _globalize(flat: np.ndarray, vocab: list[str], gvocab: dict[str, int]) -> np.ndarray:
    """Map chunk-local ids (first-seen order in the chunk) to global provisional ids."""
    lmap = np.fromiter((gvocab.setdefault(tok, len(gvocab)) for tok in vocab), dtype=np.uint32, count=len(vocab))
    return lmap[flat] if len(flat) else flat


def _spm_pieces(model_file: str) -> list[str]:
    return subwords.SentencePieceModel(model_file).pieces()


def _token_counts(tokens: list[str], counts: np.ndarray, keep_zero: bool) -> dict[str, int]:
    counts = np.concatenate([counts, np.zeros(max(0, len(tokens) - len(counts)), np.int64)])
    if keep_zero:
        return {tok: int(c) for tok, c in zip(tokens, counts)}
    return {tokens[i]: int(counts[i]) for i in np.flatnonzero(counts)}


def _table(d: Dictionary, tokens: list[str]) -> np.ndarray:
    """Provisional/local id -> dictionary id (unknown or cut tokens -> <unk>)."""
    return np.fromiter((d.index(t) for t in tokens), dtype=np.int64, count=len(tokens))


def _remap_shard(tmp: Path, info: ShardInfo, table: np.ndarray, dtype: np.dtype, unk_id: int, task: _Task):
    """Rewrite a provisional uint32 .bin as dictionary ids in `dtype`, hashing as it writes."""
    src_path = tmp / info.bin
    out_name = info.bin.replace(".prov.bin", ".bin")
    table = table.astype(dtype)
    h = hashlib.sha256()
    n_unk = 0
    with open(src_path, "rb") as fin, open(tmp / out_name, "wb") as fout:
        while True:
            block = np.fromfile(fin, dtype="<u4", count=REMAP_CHUNK)
            if not len(block):
                break
            ids = table[block]
            n_unk += int(np.count_nonzero(ids == unk_id))
            data = ids.tobytes()
            fout.write(data)
            h.update(data)
            task.advance(len(block))
        fout.flush()
        os.fsync(fout.fileno())
    os.unlink(src_path)
    shard = dataclasses.replace(info, bin=out_name, dtype=np.dtype(dtype).name, bin_sha256=h.hexdigest())
    return shard, n_unk


# A dictionary cap (--nwords*, --threshold*) that turns more than this share of the training
# tokens into <unk> is almost certainly a mistake (`--nwordssrc 2` maps everything to <unk>).
UNK_WARN_SHARE = 0.5


def _unk_warning(cfg: PreprocessConfig, lang: str, n_unk: int, n_tokens: int) -> str | None:
    """A warning line when the dictionary caps of `lang`'s side made most training tokens <unk>."""
    side = "src" if lang == cfg.source_lang or cfg.joined_dictionary else "tgt"
    nwords, threshold = getattr(cfg, f"nwords{side}"), getattr(cfg, f"threshold{side}")
    caps = ([f"--nwords{side} {nwords}"] if nwords > 0 else []) + ([f"--threshold{side} {threshold}"] if threshold > 0 else [])
    if not caps or n_tokens == 0 or n_unk <= UNK_WARN_SHARE * n_tokens:
        return None
    return (f"nmtkit: warning: {' and '.join(caps)} turn{'s' if len(caps) == 1 else ''} {n_unk / n_tokens:.1%} of the {lang} training tokens "
            f"({n_unk:,} of {n_tokens:,}) into <unk>; raise {caps[0].split()[0]} (the dictionary size counts "
            f"the 4 special symbols)")


def _reasons_text(dropped: Counter) -> str:
    return ", ".join(f"{r.replace('_', ' ')} {dropped[r]}" for r in CLEAN_REASONS)


def _split_entry(langs, shards: dict[str, list[ShardInfo]], unk: dict[str, int], lines: int,
                 dropped: Counter | None, files: dict[str, str]) -> dict:
    """The manifest entry of one split; also records the shards' checksums in `files`."""
    src, tgt = langs
    entry: dict = {"lines": lines, "sentences": sum(s.sentences for s in shards[src])}
    if dropped is not None:
        entry["cleaning"] = {"dropped": {r: int(dropped[r]) for r in CLEAN_REASONS},
                             "dropped_total": int(sum(dropped[r] for r in CLEAN_REASONS))}
    entry["tokens"] = {lang: sum(s.tokens for s in shards[lang]) for lang in langs}
    entry["unk"] = {lang: int(unk[lang]) for lang in langs}
    entry["shards"] = []
    for a, b in zip(shards[src], shards[tgt]):
        assert a.sentences == b.sentences
        entry["shards"].append({
            "sentences": a.sentences,
            **{lang: {"bin": s.bin, "idx": s.idx, "dtype": s.dtype, "tokens": s.tokens}
               for lang, s in ((src, a), (tgt, b))},
        })
        for s in (a, b):
            files[s.bin] = s.bin_sha256
            files[s.idx] = s.idx_sha256
    return entry
