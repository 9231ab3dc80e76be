"""`nmtkit preprocess --pairs`: one data directory for many language pairs (layout:
nmtkit.data.languages, docs/preprocess.md "Multilingual data").

Why built on the bilingual pipeline rather than beside it: reading, checking, encoding, cleaning
and binarizing a pair is exactly what `nmtkit.data.preprocess.preprocess` does, with its
streaming, its workers and its refusals. What a multilingual directory adds is around it:

1. One joint sentencepiece model, learned from a temperature-sampled mix of every language's
   training text (`sample_lines`): with plain concatenation a language with a tenth of the text
   would get few pieces of its own and be segmented into characters.
2. Each pair binarized by `preprocess` in a working folder, reusing a vocabulary folder that holds
   that model and a dictionary of all its pieces (`--srcdict`): the training text is encoded and
   cleaned once, in ids every pair shares.
3. One joint dictionary counted over every pair's cleaned training text, the language tags
   `>>xx<<` first (fixed ids 4, 5, ... in language order, whatever the counts and caps), and every
   shard rewritten in its ids, each source sentence prefixed with the tag of its pair's target.
4. The manifest, written last, and the directory put in place atomically, as a bilingual one
   (nmtkit.data.install). Rerunning with the same inputs and options finds it up to date.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nmtkit import __version__
from nmtkit.data import install, subwords
from nmtkit.data.dictionary import NSPECIAL, Dictionary
from nmtkit.data.languages import is_tag, pair_name, parse_pairs, split_name, tag_token
from nmtkit.data.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    sha256_file,
    write_manifest,
)
from nmtkit.data.preprocess import (
    SAMPLE_SEED,
    PreprocessConfig,
    PreprocessResult,
    _check_destination,
    _split_entry,
    _split_names,
    _Task,
    preprocess,
    put_in_place,
    up_to_date,
)
from nmtkit.data.shards import IndexedShard, ShardInfo, ShardWriter, dtype_for_vocab, shard_basename
from nmtkit.data.textfiles import TextFileInfo, iter_line_blocks, scan_text_file
from nmtkit.errors import UserError, count
from nmtkit.io import resolve_text_path

DEFAULT_TEMPERATURE = 5.0  # --spm-temperature: XLM-R/mBART-like rebalancing of the learning mix
MODEL_NAME = "spm.model"
DICT_NAME = "dict.txt"
REWRITE_SENTENCES = 1 << 16  # sentences per block when shards are rewritten in the joint ids


@dataclass(frozen=True)
class PairInputs:
    """One pair's input files: per split ("train", "valid", "valid1", "test", ...) the prefix the
    bilingual pipeline reads (`P` or fairseq's per-pair `P.SRC-TGT`) and the files found."""

    src: str
    tgt: str
    flags: dict[str, str]  # split -> the flag that named its prefix (--trainpref, ...)
    bases: dict[str, str]  # split -> prefix B: the files are B.SRC and B.TGT (or .gz)
    paths: dict[str, dict[str, Path]]  # split -> lang -> file

    @property
    def name(self) -> str:
        return pair_name(self.src, self.tgt)


@dataclass
class _Build:
    """What the steps of one build share (as nmtkit.data.preprocess._Build)."""

    cfg: PreprocessConfig
    pairs: list[PairInputs]
    temperature: float
    tmp: Path  # the hidden folder beside DESTDIR that becomes DESTDIR
    work: Path  # a second hidden folder beside it: the vocabulary and each pair's bilingual build
    progress: object
    log: Callable[[str], None]
    timings: dict[str, float]
    files: dict[str, str] = field(default_factory=dict)  # file name in tmp -> sha256

    @property
    def langs(self) -> list[str]:
        return sorted({lang for p in self.pairs for lang in (p.src, p.tgt)})


# ---------------------------------------------------------------------------------------------
# the temperature-sampled learning mix
# ---------------------------------------------------------------------------------------------


def sample_lines(lines: dict[str, int], temperature: float, max_lines: int) -> dict[str, int]:
    """Lines of each language in the sample sentencepiece learns from.

    Language l with n_l training lines gets the share n_l^(1/T) / sum_m n_m^(1/T) of a sample of
    min(max_lines, sum n) lines (all of them when max_lines is 0). T = 1 keeps the languages'
    proportions; a larger T moves toward equal shares, so a small language weighs more than its
    size (its lines are then drawn several times each). Counts are rounded by largest remainder
    (ties in language order), so they add up to the sample size exactly."""
    total = sum(lines.values())
    size = total if max_lines <= 0 else min(max_lines, total)
    present = sorted(lang for lang, n in lines.items() if n > 0)
    if not present:
        return {lang: 0 for lang in lines}
    top = max(math.log(lines[lang]) for lang in present)
    weights = {lang: math.exp((math.log(lines[lang]) - top) / temperature) for lang in present}  # no overflow
    z = sum(weights.values())
    exact = {lang: size * w / z for lang, w in weights.items()}
    out = {lang: int(math.floor(exact.get(lang, 0.0))) for lang in lines}
    rest = size - sum(out.values())
    for lang in sorted(present, key=lambda lg: (-(exact[lg] - math.floor(exact[lg])), lg))[:rest]:
        out[lang] += 1
    return out


def _language_files(b: _Build, infos: dict[Path, TextFileInfo]) -> dict[str, list[tuple[Path, int]]]:
    """lang -> its training files with their line counts; a file several pairs share (Multi30k's
    line-parallel train.en for de-en and en-de) counts once, by content."""
    out: dict[str, list[tuple[Path, int]]] = {lang: [] for lang in b.langs}
    seen: dict[str, set[str]] = {lang: set() for lang in b.langs}
    for p in b.pairs:
        for lang, path in p.paths["train"].items():
            info = infos[path]
            if info.sha256 not in seen[lang]:
                seen[lang].add(info.sha256)
                out[lang].append((path, info.lines))
    return out


def _mix(files: dict[str, list[tuple[Path, int]]], take: dict[str, int], task: _Task) -> Iterator[str]:
    """The non-empty lines of the learning sample: language l's lines each drawn k // n times plus
    once more with probability (k % n) / n (n its lines, k = take[l]), so about k in all. Seeded
    per language by its name: the sample of one language does not change when another is added."""
    for lang in sorted(files):
        n = sum(lines for _, lines in files[lang])
        whole, part = divmod(take[lang], n)
        rng = np.random.default_rng([SAMPLE_SEED, *lang.encode("utf-8")])
        for path, _ in files[lang]:
            for block in iter_line_blocks(path):
                task.advance(len(block))
                reps = whole + (rng.random(len(block)) < part / n)  # (lines,) int
                for line, r in zip(block, reps.tolist()):
                    if r and line and not line.isspace():
                        yield from [line] * r


def _learn_model(b: _Build, infos: dict[Path, TextFileInfo]) -> dict:
    """Step 1: the joint sentencepiece model, in DESTDIR's build folder; -> the "subword" entry."""
    t = time.perf_counter()
    files = _language_files(b, infos)
    lines = {lang: sum(n for _, n in fs) for lang, fs in files.items()}
    take = sample_lines(lines, b.temperature, b.cfg.spm_max_lines)
    task = _Task(b.progress, "learning sentencepiece (" + "+".join(b.langs) + ")",
                 sum(n for n in lines.values()))
    proto = subwords.learn_sentencepiece(_mix(files, take, task), b.cfg.vocab_size)
    task.finish()
    (b.tmp / MODEL_NAME).write_bytes(proto)
    b.files[MODEL_NAME] = sha256_file(b.tmp / MODEL_NAME)
    size = subwords.SentencePieceModel(model_proto=proto).sp.get_piece_size()
    b.log(f"learned sentencepiece model {MODEL_NAME} ({size} pieces) on a mix at --spm-temperature "
          f"{b.temperature:g}: " + ", ".join(f"{lang} {take[lang]:,} of {lines[lang]:,} lines" for lang in b.langs))
    b.timings["learn"] = time.perf_counter() - t
    return {"kind": "sentencepiece", "kinds": {lang: "sentencepiece" for lang in b.langs}, "joint": True,
            "files": {lang: MODEL_NAME for lang in b.langs}, "vocab_size": b.cfg.vocab_size,
            "sample_lines": take}


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------


def _find(base: str, lang: str) -> Path | None:
    try:
        return resolve_text_path(base, f".{lang}")
    except UserError:
        return None


def _pair_files(flag: str, pref: str, src: str, tgt: str) -> tuple[str, dict[str, Path]]:
    """(prefix B, {lang: file}) of pair src-tgt for prefix `pref`: fairseq's per-pair files
    P.SRC-TGT.SRC / P.SRC-TGT.TGT when either exists, else line-parallel P.SRC / P.TGT (plain or
    .gz, plain first). A missing file is named, with the other naming that would do."""
    per_pair = f"{pref}.{pair_name(src, tgt)}"
    for base in (per_pair, pref):
        found = {lang: _find(base, lang) for lang in (src, tgt)}
        if base == per_pair and not any(found.values()):
            continue
        missing = [lang for lang, p in found.items() if p is None]
        if missing:
            other = f"{pref}.{missing[0]}" if base == per_pair else f"{per_pair}.{missing[0]}"
            raise UserError(f"{flag} {pref}: file not found: {base}.{missing[0]} (nor .gz; nor {other})")
        return base, found
    raise AssertionError("unreachable")


def resolve_pairs(cfg: PreprocessConfig, pairs: list[tuple[str, str]]) -> list[PairInputs]:
    """Every pair's files for every split; a missing file is a UserError naming it and its flag."""
    groups = [("train", "--trainpref", [cfg.trainpref]), ("valid", "--validpref", cfg.validpref),
              ("test", "--testpref", cfg.testpref)]
    out = []
    for src, tgt in pairs:
        flags, bases, paths = {}, {}, {}
        for kind, flag, prefs in groups:
            for split, pref in zip(_split_names(kind, len(prefs)), prefs):
                flags[split] = flag
                bases[split], paths[split] = _pair_files(flag, pref, src, tgt)
        out.append(PairInputs(src, tgt, flags, bases, paths))
    return out


def _check_inputs(pairs: list[PairInputs], progress) -> dict[Path, TextFileInfo]:
    """Every input file read once before anything is written (UTF-8 as FILE:LINE, line counts,
    sha256), as the bilingual pipeline does; a pair's two files must have as many lines."""
    distinct = list(dict.fromkeys(p for pair in pairs for paths in pair.paths.values() for p in paths.values()))
    task = _Task(progress, "checking inputs", sum(p.stat().st_size for p in distinct))
    infos: dict[Path, TextFileInfo] = {}
    for p in distinct:
        infos[p] = scan_text_file(p)
        task.advance(p.stat().st_size)
    task.finish()
    for pair in pairs:
        for split, paths in pair.paths.items():
            a, b = infos[paths[pair.src]], infos[paths[pair.tgt]]
            if a.lines != b.lines:
                raise UserError(f"{pair.flags[split]}: line counts differ: {a.path} has {count(a.lines, 'line')}, "
                                f"{b.path} has {count(b.lines, 'line')}")
            if a.lines == 0:
                raise UserError(f"{pair.flags[split]}: {a.path} and {b.path} are empty")
    return infos


def validate(cfg: PreprocessConfig, pairs: list[tuple[str, str]], temperature: float) -> None:
    """The settings a multilingual directory cannot take, each refused in one line naming the flag."""
    if not pairs:
        raise UserError("--pairs: give at least one pair SRC-TGT")
    parse_pairs(",".join(pair_name(s, t) for s, t in pairs))  # library callers' pairs, checked as the flag's
    cfg.validate()
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise UserError(f"--spm-temperature must be a number > 0, got {temperature!r}")
    if cfg.bpe != "sentencepiece":
        raise UserError(f"--bpe {cfg.bpe} does not apply with --pairs: a multilingual directory has one joint "
                        "sentencepiece model (--bpe sentencepiece)")
    if not cfg.joint_bpe:
        raise UserError("--separate-bpe does not apply with --pairs: every language shares one sentencepiece model")
    if cfg.srcdict is not None or cfg.tgtdict is not None:
        raise UserError("--srcdict/--tgtdict do not apply with --pairs")
    if cfg.nwordstgt != -1 or cfg.thresholdtgt != 0:
        raise UserError("--nwordstgt/--thresholdtgt do not apply with --pairs: its one joint dictionary takes "
                        "--nwordssrc/--thresholdsrc")
    if cfg.target_bpe is not None or cfg.extra_files or cfg.extra_manifest:
        raise UserError("target_bpe, extra_files and extra_manifest do not apply with --pairs")


# ---------------------------------------------------------------------------------------------
# each pair through the bilingual pipeline, then the joint dictionary
# ---------------------------------------------------------------------------------------------


def _vocabulary_dir(b: _Build) -> tuple[Path, Dictionary]:
    """A data directory of the joint model and a dictionary of every one of its pieces (count 0):
    what each pair's bilingual build reuses (--srcdict), so that all pairs come out in the same
    ids, every piece kept (the joint dictionary's cuts come later, over all pairs' counts)."""
    d = b.work / "vocab"
    d.mkdir()
    shutil.copyfile(b.tmp / MODEL_NAME, d / MODEL_NAME)
    vocab = Dictionary.from_counts({p: 0 for p in subwords.SentencePieceModel(d / MODEL_NAME).pieces()})
    files = {MODEL_NAME: sha256_file(d / MODEL_NAME), DICT_NAME: vocab.save(d / DICT_NAME)}
    write_manifest(d, {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "complete": True,
        "source_lang": b.pairs[0].src, "target_lang": b.pairs[0].tgt,
        "subword": {"kind": "sentencepiece", "joint": True, "files": {lang: MODEL_NAME for lang in b.langs},
                    "vocab_size": b.cfg.vocab_size},
        "dictionaries": {"joined": True, **{lang: {"file": DICT_NAME, "size": len(vocab)} for lang in b.langs}},
        "splits": {}, "files": files})
    return d, vocab


def _binarize_pair(b: _Build, pair: PairInputs, vocab_dir: Path) -> tuple[Path, dict]:
    """One pair through `preprocess` into the working folder: checked, encoded in the vocabulary
    folder's ids, train cleaned; -> (its folder, its manifest)."""
    kinds = list(pair.bases)
    cfg = dataclasses.replace(
        b.cfg, source_lang=pair.src, target_lang=pair.tgt, trainpref=pair.bases["train"],
        validpref=[pair.bases[k] for k in kinds if k.startswith("valid")],
        testpref=[pair.bases[k] for k in kinds if k.startswith("test")],
        destdir=str(b.work / pair.name), srcdict=str(vocab_dir), tgtdict=None, joined_dictionary=True,
        nwordssrc=-1, nwordstgt=-1, thresholdsrc=0, thresholdtgt=0, force=False)

    def log(msg: str) -> None:  # its note on cleaning; the rest speaks of its working vocabulary's ids
        if msg.startswith("encoded train"):
            b.log(f"{pair.name}: {msg}")

    result = preprocess(cfg, progress=b.progress, log=log)
    for key in ("encode_train", "write_train", "encode_eval", "binarize_cpu"):
        b.timings[key] = b.timings.get(key, 0.0) + result.timings.get(key, 0.0)
    return result.destdir, result.manifest


def _train_counts(pair_dirs: dict[str, tuple[Path, dict]], pairs: list[PairInputs], size: int) -> np.ndarray:
    """(size,) int64: occurrences of each vocabulary id in every pair's cleaned training text,
    both sides (the joint dictionary's counts, as the bilingual --joined-dictionary's)."""
    counts = np.zeros(size, np.int64)
    for pair in pairs:
        d, m = pair_dirs[pair.name]
        for shard in m["splits"]["train"]["shards"]:
            for lang in (pair.src, pair.tgt):
                e = shard[lang]
                ids = IndexedShard(d / e["bin"], d / e["idx"], e["dtype"]).tokens
                counts += np.bincount(np.asarray(ids, np.int64), minlength=size)[:size]
    return counts


def joint_dictionary(piece_counts: dict[str, int], tag_counts: dict[str, int], nwords: int = -1,
                     threshold: int = 0, pad_to_multiple: int = 1) -> Dictionary:
    """The multilingual dictionary: the four specials, then one tag per language in language
    order (ids 4, 5, ...: the same whatever the text, its counts and the caps), then the pieces
    as `Dictionary.from_counts` orders and cuts them, then the padding. `nwords` counts the
    specials and the tags, which no cap drops. A piece spelled like a tag is left out: a literal
    `>>en<<` in the text stays text (<unk> here) and never asks for a language."""
    d = Dictionary()
    for lang in sorted(tag_counts):
        d.add_symbol(tag_token(lang), int(tag_counts[lang]))
    room = -1 if nwords <= 0 else max(NSPECIAL, nwords - len(tag_counts))  # NSPECIAL: no piece at all
    pieces = Dictionary.from_counts({p: c for p, c in piece_counts.items() if not is_tag(p)},
                                    nwords=room, threshold=threshold)
    for sym, c in zip(pieces.symbols[NSPECIAL:], pieces.counts[NSPECIAL:]):
        d.add_symbol(sym, c)
    d.pad_to_multiple_(pad_to_multiple)
    return d


def _dictionary(b: _Build, vocab: Dictionary, counts: np.ndarray, pair_dirs) -> tuple[Dictionary, np.ndarray, dict]:
    """Step 3: the joint dictionary, saved; -> (it, vocabulary id -> its id, the "dictionaries" entry)."""
    tags = {lang: 0 for lang in b.langs}
    for pair in b.pairs:
        tags[pair.tgt] += pair_dirs[pair.name][1]["splits"]["train"]["sentences"]
    pieces = {vocab[i]: int(counts[i]) for i in range(NSPECIAL, len(vocab))}
    d = joint_dictionary(pieces, tags, b.cfg.nwordssrc, b.cfg.thresholdsrc, b.cfg.pad_to_multiple)
    b.files[DICT_NAME] = d.save(b.tmp / DICT_NAME)
    table = np.fromiter((i if i < NSPECIAL else (d.unk if is_tag(vocab[i]) else d.index(vocab[i]))
                         for i in range(len(vocab))), dtype=np.int64, count=len(vocab))
    b.log(f"dictionary {DICT_NAME}: {len(d):,} entries ({len(tags)} language tags), joined for "
          f"{', '.join(b.langs)}; shards in {dtype_for_vocab(len(d)).name}")
    return d, table, {"joined": True, **{lang: {"file": DICT_NAME, "size": len(d)} for lang in b.langs}}


# ---------------------------------------------------------------------------------------------
# rewriting the shards: joint ids, the target's tag before each source sentence
# ---------------------------------------------------------------------------------------------


def _rewrite_shard(src_dir: Path, e: dict, base: Path, table: np.ndarray, dtype: np.dtype, unk: int,
                   tag: int | None, task: _Task) -> tuple[ShardInfo, int]:
    """One shard of a pair's build rewritten as `base`.bin/.idx: its ids mapped through `table`,
    `tag` (when given) before every sentence; -> (the new shard, its <unk> count)."""
    shard = IndexedShard(src_dir / e["bin"], src_dir / e["idx"], e["dtype"])
    writer = ShardWriter(f"{base}.bin", f"{base}.idx", dtype)
    offsets = np.asarray(shard.offsets)  # (sentences + 1,) int64
    n_unk = 0
    for a in range(0, len(shard), REWRITE_SENTENCES):
        z = min(a + REWRITE_SENTENCES, len(shard))
        ids = table[np.asarray(shard.tokens[offsets[a]:offsets[z]], np.int64)]  # (tokens,)
        lens = np.diff(offsets[a:z + 1])  # (sentences,)
        n_unk += int(np.count_nonzero(ids == unk))
        if tag is not None:  # one tag at each sentence start (empty sentences: the tag alone)
            ids = np.insert(ids, offsets[a:z] - offsets[a], tag)
            lens = lens + 1
        writer.add(ids, lens)
        task.advance(z - a)
    return writer.close(), n_unk


def _rewrite_split(b: _Build, pair: PairInputs, kind: str, pair_dir: Path, entry: dict, d: Dictionary,
                   table: np.ndarray, task: _Task) -> dict:
    """One split of a pair as `KIND.SRC-TGT` of DESTDIR; -> its manifest entry."""
    name = split_name(kind, pair.src, pair.tgt)
    dtype = dtype_for_vocab(len(d))
    tag = d.index(tag_token(pair.tgt))
    shards: dict[str, list[ShardInfo]] = {pair.src: [], pair.tgt: []}
    unk = {pair.src: 0, pair.tgt: 0}
    for i, sh in enumerate(entry["shards"]):
        for lang in (pair.src, pair.tgt):
            info, n_unk = _rewrite_shard(pair_dir, sh[lang], b.tmp / shard_basename(name, lang, i), table, dtype,
                                         d.unk, tag if lang == pair.src else None, task)
            shards[lang].append(info)
            unk[lang] += n_unk
    dropped = Counter(entry["cleaning"]["dropped"]) if "cleaning" in entry else None
    return _split_entry((pair.src, pair.tgt), shards, unk, entry["lines"], dropped, b.files)


def _write_splits(b: _Build, pair_dirs, d: Dictionary, table: np.ndarray) -> dict:
    """Step 4: every pair's splits in DESTDIR's build folder, in pair order then split order."""
    t = time.perf_counter()
    total = sum(2 * m["splits"][k]["sentences"] for _, m in pair_dirs.values() for k in m["splits"])
    task = _Task(b.progress, "writing shards", total)
    splits = {}
    for pair in b.pairs:
        pair_dir, m = pair_dirs[pair.name]
        for kind, entry in m["splits"].items():
            splits[split_name(kind, pair.src, pair.tgt)] = _rewrite_split(b, pair, kind, pair_dir, entry, d, table, task)
    task.finish()
    b.timings["rewrite"] = time.perf_counter() - t
    return splits


# ---------------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------------


def _build(b: _Build, infos: dict[Path, TextFileInfo]) -> dict:
    """Write the dataset into `b.tmp`; -> its manifest (without the run's entries)."""
    sub = _learn_model(b, infos)
    vocab_dir, vocab = _vocabulary_dir(b)
    pair_dirs = {pair.name: _binarize_pair(b, pair, vocab_dir) for pair in b.pairs}
    counts = _train_counts(pair_dirs, b.pairs, len(vocab))
    d, table, dict_entry = _dictionary(b, vocab, counts, pair_dirs)
    splits = _write_splits(b, pair_dirs, d, table)
    sentences = {name: {kind: s["sentences"] for kind, s in m["splits"].items()} for name, (_, m) in pair_dirs.items()}
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "complete": True,
        "nmtkit_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source_lang": b.pairs[0].src, "target_lang": b.pairs[0].tgt,
        "subword": sub, "dictionaries": dict_entry, "splits": splits,
        "files": dict(sorted(b.files.items())),
        "multilingual": {"pairs": [p.name for p in b.pairs], "langs": b.langs,
                         "tags": {lang: tag_token(lang) for lang in b.langs},
                         "spm_temperature": b.temperature, "sentences": sentences},
    }


def _options(cfg: PreprocessConfig, pairs: list[tuple[str, str]], temperature: float) -> dict:
    """What determines the output: the pipeline's options (source_lang and target_lang are the
    first pair's), the pairs in order and the temperature."""
    return cfg.output_options() | {"pairs": [pair_name(s, t) for s, t in pairs], "spm_temperature": float(temperature)}


def preprocess_multilingual(cfg: PreprocessConfig, pairs: list[tuple[str, str]],
                            temperature: float = DEFAULT_TEMPERATURE, *, progress=None,
                            log: Callable[[str], None] | None = None) -> PreprocessResult:
    """Build (or find up to date) the multilingual data directory `cfg.destdir` for `pairs`
    ((src, tgt), in order; `cfg.source_lang`/`target_lang` are set to the first pair's, as the
    manifest records them). See the module docstring."""
    log = log or (lambda msg: None)
    if pairs:
        cfg = dataclasses.replace(cfg, source_lang=pairs[0][0], target_lang=pairs[0][1])
    validate(cfg, pairs, temperature)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    dest = Path(cfg.destdir)
    inputs = resolve_pairs(cfg, pairs)
    install.recover(dest, log)
    flat = {split_name(k, p.src, p.tgt): (p.flags[k], paths) for p in inputs for k, paths in p.paths.items()}
    existing, owned = _check_destination(dest, flat, cfg.force)
    infos = _check_inputs(inputs, progress)
    timings["check"] = time.perf_counter() - t0
    log(f"checked {len(infos)} input files of {count(len(pairs), 'pair')} ({timings['check']:.1f}s)")
    inputs_json = {name: {lang: infos[p].as_json() for lang, p in paths.items()} for name, (_, paths) in flat.items()}
    options = _options(cfg, pairs, temperature)
    fingerprint, done = up_to_date(dest, existing, owned, options, inputs_json, cfg.force, log, timings)
    if done is not None:
        return done
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp, work = install.temp_dir(dest), install.temp_dir(dest)
    try:
        b = _Build(cfg, inputs, float(temperature), tmp, work, progress, log, timings)
        manifest = _build(b, infos)
        recorded = dataclasses.asdict(cfg) | {"destdir": str(dest), "pairs": options["pairs"],
                                              "spm_temperature": options["spm_temperature"]}
        recorded.pop("extra_manifest")
        manifest.update(fingerprint=fingerprint, inputs=inputs_json, options=recorded)
        put_in_place(tmp, dest, owned, manifest)
    except BaseException:
        install.remove_temp_dir(tmp)
        raise
    finally:
        install.remove_temp_dir(work)
    timings["total"] = time.perf_counter() - t0
    return PreprocessResult(dest, manifest, False, timings)
