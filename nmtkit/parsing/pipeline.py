"""Parsing as translation, end to end: `nmtkit preprocess --task parsing` and generate's tree output.

Why this module: after `nmtkit.parsing.prepare` a treebank is an ordinary parallel corpus
(source `words`, target `lin`, the linearized tree), so the parsing task reuses the translation
pipeline rather than having one of its own. This module only adds what is specific to trees:

- `preprocess_parsing` reads the treebank inputs (a treebank split by WSJ document with
  `--treebank/--split`, or one source per split with `--trainpref/--validpref/--testpref`),
  writes the prepared text into a temporary folder beside DESTDIR, then runs
  `nmtkit.data.preprocess.preprocess` on it with a subword model on the source side only (the
  target's bracket and tag tokens are whole tokens with their own small dictionary), and puts the
  normalized gold trees and the words of every valid/test split into DESTDIR, with `"task":
  "parsing"` and the part-of-speech mode in manifest.json;
- `tree_output` gives `nmtkit generate` the function that turns a hypothesis into the one
  bracketed tree line written for an input (`nmtkit.parsing.linearize.output_tree_line` against
  the input's own words), so `generate | score --metric parseval --ref DATA/test.gold.trees` runs.

Train cleaning: off by default for parsing (`PARSING_MAX_LEN`, `PARSING_RATIO`). The pairs come
from single trees, so there are no misaligned pairs for a length ratio to catch, and a tree's
target is up to 4 times as long as its sentence (573 tokens for a 249-word sentence of the NLTK
sample): translation's `--max-len 250 --ratio 9` would silently drop exactly the longest trees.
The model's own limit (`max_target_positions`, 1024 for `transformer_parse`) still applies when
training. A user's explicit `--max-len`/`--ratio` is honoured and its drops are reported.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

from nmtkit.data.preprocess import PreprocessConfig, PreprocessResult, preprocess
from nmtkit.errors import UserError
from nmtkit.parsing.linearize import POS_MODES, output_tree_line
from nmtkit.parsing.prepare import GOLD_SUFFIX, SOURCE_SUFFIX, TARGET_SUFFIX, SplitStats, split_paths, write_split
from nmtkit.parsing.treebank import SPLIT_SCHEMES, iter_treebank_file, read_documents, split_documents
from nmtkit.parsing.trees import Tree

TASK = "parsing"
SOURCE_LANG = SOURCE_SUFFIX  # "words": the source "language" of a parsing data directory
TARGET_LANG = TARGET_SUFFIX  # "lin": the linearized trees
PARSING_MAX_LEN = 0  # default --max-len for --task parsing: no limit (see the module docstring)
PARSING_RATIO = 0.0  # default --ratio for --task parsing: no ratio check
WORDS_SUFFIX = "words"  # DESTDIR/SPLIT.words: the sentences of a valid/test split, for generate
_MADEUP = re.compile(r"madeupword\d+")  # dictionary filler (--pad-to-multiple): never a tree token


@dataclass
class TreebankInputs:
    """Where each split's trees come from: `treebank` + `split`, or the per-split prefixes."""

    treebank: str | None = None  # --treebank: a folder (LDC parsed/mrg/wsj), a .zip or a file
    split: str | None = None  # --split: a scheme of nmtkit.parsing.treebank.SPLIT_SCHEMES
    trainpref: str | None = None  # --trainpref P: P itself, P.trees, P.mrg (or .gz), or a folder
    validpref: list[str] = field(default_factory=list)
    testpref: list[str] = field(default_factory=list)
    extra_train: list[str] = field(default_factory=list)  # --extra-train: more training trees (silver)
    pos: str = "keep"  # --pos-tags

    def validate(self) -> None:
        """UserError naming the flag for every impossible combination (before anything is read)."""
        if self.pos not in POS_MODES:
            raise UserError(f"--pos-tags must be one of {', '.join(POS_MODES)}, got {self.pos!r}")
        if self.split is not None and self.split not in SPLIT_SCHEMES:
            raise UserError(f"--split must be one of {', '.join(SPLIT_SCHEMES)}, got {self.split!r}")
        if self.treebank is not None:
            if self.split is None:
                raise UserError(f"--treebank needs --split ({', '.join(SPLIT_SCHEMES)}): which documents "
                                "are train, valid and test")
            given = [f for f, v in (("--trainpref", self.trainpref), ("--validpref", self.validpref),
                                    ("--testpref", self.testpref)) if v]
            if given:
                raise UserError(f"--treebank (split by --split) and {'/'.join(given)} exclude each other; "
                                "use --extra-train for more training trees")
        else:
            if self.split is not None:
                raise UserError("--split applies to --treebank (a whole treebank split by document)")
            if not self.trainpref:
                raise UserError("--task parsing needs --treebank PATH --split NAME, or --trainpref "
                                "(with --validpref/--testpref)")


@dataclass
class ParsingResult:
    result: PreprocessResult  # the data directory, as `preprocess` returns it
    stats: dict[str, SplitStats]  # per split: trees read, sentences written, lengths


# ------------------------------------------------------------------------------------- inputs


def resolve_treebank_source(pref: str, flag: str) -> Path:
    """A split's treebank: PREF itself (file, folder or .zip), else PREF.trees, PREF.mrg (or .gz)."""
    p = Path(pref)
    if p.exists():
        return p
    for suffix in (".trees", ".trees.gz", ".mrg", ".mrg.gz"):
        q = Path(f"{pref}{suffix}")
        if q.is_file():
            return q
    raise UserError(f"{flag} {pref}: no treebank there (looked for {p.name}, {p.name}.trees, "
                    f"{p.name}.mrg and their .gz)")


def _trees_of(path: Path) -> Iterable[Tree]:
    """Trees of a folder or zip (read as documents) or a file (streamed)."""
    if path.is_dir() or path.suffix == ".zip":
        return [t for d in read_documents(path) for t in d.trees]
    return iter_treebank_file(path)


def _split_sources(inputs: TreebankInputs) -> tuple[dict[str, Iterable[Tree]], dict[str, list[str]]]:
    """(split -> trees, split -> the sources named for the manifest)."""
    extra = [resolve_treebank_source(p, "--extra-train") for p in inputs.extra_train]
    splits: dict[str, Iterable[Tree]] = {}
    sources: dict[str, list[str]] = {}
    if inputs.treebank is not None:
        tb = Path(inputs.treebank)
        if not tb.exists():
            raise UserError(f"--treebank {tb}: not found")
        for name, trees in split_documents(read_documents(tb), inputs.split).items():
            splits[name] = trees
            sources[name] = [f"{tb} ({inputs.split} split: {name})"]
    else:
        groups = [("train", "--trainpref", [inputs.trainpref]), ("valid", "--validpref", inputs.validpref),
                  ("test", "--testpref", inputs.testpref)]
        resolved = {}
        for kind, flag, prefs in groups:  # resolve every path before reading any
            for i, pref in enumerate(prefs):
                resolved[kind if i == 0 else f"{kind}{i}"] = (flag, resolve_treebank_source(pref, flag))
        for name, (_, path) in resolved.items():
            splits[name] = _trees_of(path)
            sources[name] = [str(path)]
    if extra:
        splits["train"] = chain(splits["train"], *(_trees_of(p) for p in extra))
        sources["train"] += [f"{p} (--extra-train)" for p in extra]
    return splits, sources


# --------------------------------------------------------------------------------- preprocess


def preprocess_parsing(inputs: TreebankInputs, cfg: PreprocessConfig, *, progress=None,
                       log: Callable[[str], None] | None = None) -> ParsingResult:
    """Build the parsing data directory `cfg.destdir` (see the module docstring).

    `cfg` holds the data options (destdir, bpe and vocab size of the source side, dictionary
    limits, cleaning, workers, force); its languages, prefixes, `target_bpe`, `extra_files` and
    `extra_manifest` are set here. Rerunning with the same treebank and options finds DESTDIR up
    to date (the prepared text is compared by checksum, as any input of `preprocess`).
    """
    log = log or (lambda msg: None)
    inputs.validate()
    base = _parsing_config(cfg)  # flag mistakes before the treebank is read
    splits, sources = _split_sources(inputs)

    dest = Path(cfg.destdir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".treebank-text", dir=dest.parent))
    try:
        stats = _write_prepared_text(splits, sources, tmp, inputs.pos, log)
        result = preprocess(_prepared_config(base, tmp, inputs, sources, stats), progress=progress, log=log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ParsingResult(result, stats)


def _parsing_config(cfg: PreprocessConfig) -> PreprocessConfig:
    """`cfg` with what the parsing task fixes (languages, no subword model on the target side),
    checked, so that a flag mistake is reported before the treebank is read."""
    if cfg.joined_dictionary:
        raise UserError("--joined-dictionary does not apply to --task parsing: words and tree tokens "
                        "have separate dictionaries (transformer_parse shares no embeddings)")
    base = dataclasses.replace(cfg, source_lang=SOURCE_LANG, target_lang=TARGET_LANG, trainpref="-",
                               validpref=[], testpref=[], target_bpe="none", joint_bpe=False,
                               extra_files={}, extra_manifest={})
    base.validate()
    return base


def _write_prepared_text(splits: dict[str, Iterable[Tree]], sources: dict[str, list[str]], tmp: Path, pos: str,
                         log: Callable[[str], None]) -> dict[str, SplitStats]:
    """Each split's trees as parallel text (words, linearized trees, gold trees) under `tmp`; a
    split without one tree with words is refused, naming where its trees came from."""
    stats: dict[str, SplitStats] = {}
    for name, trees in splits.items():
        stats[name] = write_split(trees, tmp / name, pos, split=name)
        s = stats[name]
        if s.sentences == 0:
            raise UserError(f"{', '.join(sources[name])}: no tree with words for split {name!r} "
                            f"({s.trees} trees read, {s.dropped_empty} without words)")
        log(f"{name}: {s.sentences:,} trees ({s.words:,} words, {s.target_tokens:,} target tokens, "
            f"longest {s.max_words} words / {s.max_target_tokens} tokens)"
            + (f", {s.dropped_empty} without words dropped" if s.dropped_empty else ""))
    return stats


def _prepared_config(base: PreprocessConfig, tmp: Path, inputs: TreebankInputs, sources: dict[str, list[str]],
                     stats: dict[str, SplitStats]) -> PreprocessConfig:
    """The `preprocess` run over the prepared text: its splits as prefixes, the gold trees and
    words of every valid/test split as extra files (generate and score read them from DESTDIR),
    and the manifest's "task" and "parsing" entries."""
    evals = [n for n in stats if n != "train"]
    extra_files: dict[str, str] = {}
    for n in evals:
        paths = split_paths(tmp / n)
        extra_files[f"{n}.{GOLD_SUFFIX}"] = str(paths["gold"])
        extra_files[f"{n}.{WORDS_SUFFIX}"] = str(paths[SOURCE_SUFFIX])
    info = {
        "pos_tags": inputs.pos,
        "split_scheme": inputs.split,
        "gold": {n: f"{n}.{GOLD_SUFFIX}" for n in evals},
        "words": {n: f"{n}.{WORDS_SUFFIX}" for n in evals},
        "sources": sources,
        "splits": {n: {k: v for k, v in s.to_dict().items() if k not in ("split", "prefix")}
                   for n, s in stats.items()},
    }
    return dataclasses.replace(
        base,
        trainpref=str(tmp / "train"),
        validpref=[str(tmp / n) for n in evals if n.startswith("valid")],
        testpref=[str(tmp / n) for n in evals if n.startswith("test")],
        extra_files=extra_files,
        extra_manifest={"task": TASK, "parsing": info},
    )


# ---------------------------------------------------------------------------------- generate


def parsing_info(manifest: dict) -> dict | None:
    """The manifest's parsing entry, or None for a translation data directory."""
    if manifest.get("task") != TASK:
        return None
    info = manifest.get("parsing")
    if not isinstance(info, dict) or info.get("pos_tags") not in POS_MODES:
        raise UserError("manifest.json says task 'parsing' but has no valid 'parsing' entry; rerun nmtkit preprocess")
    return info


def split_words(data_dir: str | os.PathLike, manifest: dict, split: str, count: int) -> list[str] | None:
    """The sentences (word lines) of a binarized split, when DESTDIR keeps them (valid/test); the
    words come from the treebank, so the tree gets them exactly (a subword model's decoding may
    normalize characters). None for splits without them (train)."""
    from nmtkit.data.manifest import verify_files
    from nmtkit.io import read_lines

    info = parsing_info(manifest)
    name = (info or {}).get("words", {}).get(split)
    if name is None:
        return None
    verify_files(data_dir, manifest, [name])
    lines = list(read_lines(Path(data_dir) / name))
    if len(lines) != count:
        raise UserError(f"{Path(data_dir) / name}: {len(lines)} lines, but split {split!r} has {count} sentences")
    return lines


def tree_line(pieces: list[str], words: str | list[str], pos: str) -> str:
    """The output line for one hypothesis: always one `(TOP ...)` tree with exactly `words`.

    Dictionary fillers (`madeupwordNNNN`) are dropped first; every other token is left to
    `repair` (unknown ones are dropped there, brackets fixed, preterminals matched to the words).
    """
    return output_tree_line([p for p in pieces if not _MADEUP.fullmatch(p)], words, pos)


def tree_writer(data_dir: str | os.PathLike, manifest: dict, split: str | None, count: int | None,
                src_dict, src_lang: str) -> Callable[[object, list[str]], str]:
    """For `nmtkit generate` on a parsing data directory: `(item, hypothesis pieces) -> tree line`.

    The words put into the tree are, in this order of preference: the raw input line
    (`item.text`, `--input`; its whitespace tokens), the split's `SPLIT.words` kept in DATA_DIR
    (valid/test), or the source subword model's decoding of the ids (other splits; the ids may
    have been truncated, and `repair` then still gives every preterminal a word it has).
    """
    info = parsing_info(manifest)
    pos = info["pos_tags"]
    lines = split_words(data_dir, manifest, split, count) if split is not None and count is not None else None
    subword = None

    def words_of(item) -> str:
        nonlocal subword
        if getattr(item, "text", None) is not None:
            return item.text
        if lines is not None:
            return lines[item.index]
        if subword is None:
            from nmtkit.data.subwords import load_subword_model

            subword = load_subword_model(data_dir, src_lang)
        return subword.decode(src_dict.string(item.ids))

    return lambda item, pieces: tree_line(pieces, words_of(item), pos)
