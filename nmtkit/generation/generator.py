"""The `generate` driver: load models, read inputs, batch, search, and write outputs in order.

Why it is shaped this way:
- Inputs come from a binarized split of a data directory or from raw text (a file or stdin). Raw
  text goes through the data directory's own subword model and dictionary, so `generate` sees
  exactly the segmentation the model was trained on. Both kinds become the same `Item`s.
- Inputs are processed in chunks of `buffer_size` sentences: memory stays bounded for endless
  stdin, and each chunk's results are written (in input order) as soon as the chunk is done.
  Inside a chunk sentences are sorted by length and cut into batches by `max_tokens` /
  `batch_size`, which keeps padding (wasted work) small.
- No input line is ever dropped: an empty line gives an empty output (without running the
  model), an over-long one is truncated to the model's source limit with a warning naming it.
- The output is written atomically when it goes to a file (`nmtkit.io.output_stream`).
- Everything between the text and the hypotheses (loading and checking the checkpoints,
  segmentation, truncation, batching, search, detokenization) is the `Translator`'s
  (`nmtkit.generation.translator`): the Python API and the CLI are one code path. This module
  adds what only a command needs: binarized splits, streaming in chunks, the output formats, the
  progress bar and the summary line.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from nmtkit.backends.registry import engine_class, find_export
from nmtkit.errors import UserError
from nmtkit.generation.forced import ALIGNMENT_LEVELS, format_alignment
from nmtkit.generation.items import Item, Truncations, warn_stderr
from nmtkit.generation.model_flags import (
    check_model_options,
    model_source,
    from_flags,
    print_note,
    runtime_options,
    with_seed,
)
from nmtkit.generation.translator import Translator
from nmtkit.search.config import Hypothesis, SearchConfig
from nmtkit.settings import group, negate, setting

FORMATS = ("plain", "fairseq")


@dataclass
class GenerateOptions:
    """Everything `nmtkit generate` needs; each field with `setting(...)` is one of its flags,
    with its default and help text (docs/generate.md); `search` contributes SearchConfig's."""

    paths: list[str] = setting(flag="--path", parse=list, help="Checkpoint; give it several times for an ensemble. Or a directory made by nmtkit export (run by its runtime, e.g. CTranslate2).")
    # None: --path is an export directory (nmtkit export), which carries its own dictionaries and subword models
    data_dir: str | None = setting(None, flag="data_dir", argument=True, show_default=False, help="Preprocessed data directory (dictionaries, subword model, splits); not needed when --path is an export directory.")
    # default "test" when no --input
    gen_subset: str | None = setting(None, flag="--gen-subset", help="Binarized split to translate [default: test].")
    # raw text file, or "-" for stdin
    input: str | None = setting(None, flag="--input", aliases=("-i",), help="Raw text to translate, one sentence per line (FILE, FILE.gz or - for stdin); segmented with the data dir's subword model.")
    # None or "-" = stdout
    output: str | None = setting(None, flag="--output", aliases=("-o",), help="Write here (atomically) instead of stdout.")
    format: str = setting("plain", flag="--format", help="plain: one detokenized hypothesis per line; fairseq: S-/T-/H-/D-/P- lines.")
    print_scores: bool = setting(False, flag="--print-scores", help="plain format: prefix each line with its score and a tab (--score-reference: add the per-token log-probs).")
    # None, "subword" or "words"; the flag alone means subword (nmtkit.settings optional_value)
    print_alignment: str | None = setting(None, flag="--print-alignment", optional_value="subword", metavar="[subword|words]", help="Each hypothesis' alignment to the source: source-target pairs, 0-based, from the cross-attention of --alignment-layer averaged over heads (fairseq's A- lines; plain format: a last tab-separated column). 'words': pairs of detokenized words.")
    alignment_layer: int | None = setting(None, flag="--alignment-layer", help="Decoder layer (1-based) whose cross-attention gives --print-alignment [default: the last, as fairseq].")
    score_reference: bool = setting(False, flag="--score-reference", help="Score given translations instead of searching: the split's target side, or --reference with --input. plain format: SCORE, LOGPROB, TOKENS per line.")
    reference: str | None = setting(None, flag="--reference", help="With --score-reference and --input: the raw translations to score, one per line of --input (FILE or FILE.gz).")
    # terminology (docs/generate.md, "Terminology"): None, "unordered" or "ordered"
    constraints: str | None = setting(None, flag="--constraints", optional_value="unordered", metavar="[unordered|ordered]", help="Each --input line is SOURCE<TAB>PHRASE<TAB>PHRASE...: phrases (raw text) every output must contain, as fairseq-interactive reads them; unordered (the flag alone): in any order; ordered: in the given order.")
    avoid: str | None = setting(None, flag="--avoid", help="FILE of phrases, one per line, that no output may contain (in any subword spelling).")
    prefix: str | None = setting(None, flag="--prefix", help="FILE with one target prefix per line of --input: each output begins with its line's text (an empty line: none).")
    search: SearchConfig = group(SearchConfig)
    # resolved by from_flags into --lenpen-form and --early-stop (model_flags.search_flag_defaults)
    decoding: str | None = setting(None, flag="--decoding", show_default=False, help="The length penalty and stopping rule in one word: paper (--lenpen-form gnmt --early-stop bound: the paper's, exact) or fairseq (--lenpen-form fairseq --early-stop beam: fairseq's, longer outputs from weak models); a flag given beside it wins [default: paper; fairseq on a CTranslate2 export].")
    max_tokens: int | None = setting(None, flag="--max-tokens", help="Batch limit in padded source tokens.")
    batch_size: int | None = setting(None, flag="--batch-size", help="Batch limit in sentences [default: 128 unless --max-tokens].")
    # not given on the command line: 1 when --input - is a terminal (from_flags)
    buffer_size: int = setting(10000, flag="--buffer-size", unset=True, show_default=False, help="Sentences read, sorted and translated at a time [default: 10000; 1 when --input - is a terminal: each line is translated as it is entered].")
    device: str = setting("auto", flag="--device", help="auto, cpu, cuda, cuda:N or mps.")
    precision: str = setting("fp32", flag="--precision", help="fp32, bf16 or fp16 (weights and activations; scores in fp32).")
    quantize: str = setting("none", flag="--quantize", help="int8: int8 linear layers on CPU (faster, scores in fp32; a small BLEU cost, docs/generate.md); none: the model's fp32 weights.")
    threads: int = setting(0, flag="--threads", help="CPU threads for torch (0 = torch's default).")
    seed: int | None = setting(None, flag="--seed", help="Random seed (sampling).")
    ema: bool = setting(False, flag="--ema", help="Use the checkpoints' EMA weights instead of the raw weights.")
    # progress bar and the summary line on stderr
    engine_note: str | None = field(default=None, compare=False, repr=False)  # from_flags: engine defaults chosen
    progress: bool = setting(True, flag="--quiet", aliases=("-q",), cli_type=bool, cli_default=False, parse=negate, help="No progress bar and no summary line on stderr.")

    @classmethod
    def from_flags(cls, values: dict) -> "GenerateOptions":
        """The options from `nmtkit generate`'s flags (`search_flag_defaults`); without
        --buffer-size, a terminal on stdin is answered line by line, as fairseq-interactive does
        (a file or a pipe keeps the large buffer)."""
        if values.get("buffer_size") is None and values.get("input") == "-" and sys.stdin.isatty():
            values = {**values, "buffer_size": 1}
        return from_flags(cls, values)

    def validate(self) -> None:
        """UserError naming the flag for every impossible setting (the search's own are
        SearchConfig's, checked when it is made)."""
        export = check_model_options(self)
        if export is not None:
            self._validate_export(export, find_export(self.paths)[1])
        if self.format not in FORMATS:
            raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.input is not None and self.gen_subset is not None:
            raise UserError("--input and --gen-subset exclude each other (raw text or a binarized split)")
        for flag, path in (("--avoid", self.avoid), ("--prefix", self.prefix)):
            if path is not None and path != "-" and not Path(path).is_file():
                raise UserError(f"{flag} {path}: not found" if not Path(path).exists() else f"{flag} {path}: not a file")
        for flag, v in (("--max-tokens", self.max_tokens), ("--batch-size", self.batch_size)):
            if v is not None and v < 1:
                raise UserError(f"{flag} must be >= 1, got {v}")
        if self.buffer_size < 1:
            raise UserError(f"--buffer-size must be >= 1, got {self.buffer_size}")
        self._validate_inspection()
        self._validate_terms()

    def _validate_terms(self) -> None:
        """The rules of --constraints, --avoid and --prefix: raw text translated by a search."""
        if self.constraints is not None and self.constraints not in ("unordered", "ordered"):
            raise UserError(f"--constraints must be unordered (the default when given alone) or ordered, "
                            f"got {self.constraints!r}")
        for flag, given in (("--constraints", self.constraints), ("--avoid", self.avoid), ("--prefix", self.prefix)):
            if given is None:
                continue
            if self.input is None:
                raise UserError(f"{flag} applies to raw text: give --input FILE (or - for stdin)")
            if self.score_reference:
                raise UserError(f"{flag} applies to the search, not to --score-reference")
        for flag, path in (("--avoid", self.avoid), ("--prefix", self.prefix)):
            if path == "-":
                raise UserError(f"{flag} must be a file (--input may be - for stdin)")

    def _validate_inspection(self) -> None:
        """The rules of --print-alignment, --alignment-layer, --score-reference and --reference."""
        if self.print_alignment is not None and self.print_alignment not in ALIGNMENT_LEVELS:
            raise UserError(f"--print-alignment must be subword (the default when given alone) or words, "
                            f"got {self.print_alignment!r}")
        if self.alignment_layer is not None:
            if self.print_alignment is None:
                raise UserError("--alignment-layer applies to --print-alignment")
            if self.alignment_layer < 1:
                raise UserError(f"--alignment-layer is 1-based (1 = the lowest decoder layer), got {self.alignment_layer}")
        if self.reference is not None:
            if not self.score_reference:
                raise UserError("--reference applies to --score-reference (the translations to score)")
            if self.input is None:
                raise UserError("--reference pairs with --input (raw source text); a binarized split is "
                                "scored against its own target side")
            if self.reference == "-":
                raise UserError("--reference must be a file (--input may be - for stdin)")
        if self.score_reference:
            if self.input is not None and self.reference is None:
                raise UserError("--score-reference with --input needs --reference FILE: the translations to score")
            if self.search.nbest != 1:
                raise UserError("--nbest applies to the search; --score-reference scores one given translation per input")
            if self.search.sampling:
                raise UserError("--sampling applies to the search, not to --score-reference")

    def _validate_export(self, export: str, fmt: str) -> None:
        """What an export directory cannot do for generate, refused naming the flag: it has no
        binarized splits, and its engine may not teacher-force (the rest is `check_model_options`)."""
        if self.input is None:
            what = f"--gen-subset {self.gen_subset}" if self.gen_subset else "a binarized split"
            raise UserError(f"--path {export} is an export directory, which translates raw text: give --input FILE "
                            f"(or - for stdin); {what} needs the checkpoint and its data directory")
        engine = engine_class(fmt)
        for flag, given in (("--print-alignment", self.print_alignment is not None),
                            ("--score-reference", self.score_reference)):
            if given and not engine.teacher_forcing:
                raise UserError(f"{flag}: {export} is run by {engine.display}, which nmtkit does not read attention "
                                "or forced scores from; use the checkpoint and its data directory")


# ---------------------------------------------------------------------------------------------
# inputs


def split_items(data_dir: str, split: str, src_lang: str, tgt_lang: str, trunc: Truncations) -> tuple[int, Iterator[Item]]:
    """(count, items) of a binarized split; targets are attached when the split has them."""
    from nmtkit.data.shards import load_split

    src = load_split(data_dir, split, src_lang)  # checksums verified: a flipped byte is an error
    try:
        tgt = load_split(data_dir, split, tgt_lang, verify=False)
    except UserError:  # no target side
        tgt = None
    if tgt is not None:
        tgt = load_split(data_dir, split, tgt_lang) if len(tgt) == len(src) else None

    def gen() -> Iterator[Item]:
        for i in range(len(src)):
            yield Item(i, trunc(i, src[i]), None if tgt is None else tgt[i])

    return len(src), gen()


def chunks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    buf: list[Item] = []
    for it in items:
        buf.append(it)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


# ---------------------------------------------------------------------------------------------
# outputs


def _fmt(x: float) -> str:
    return "-inf" if x == -math.inf else f"{x:.6f}"


class Writer:
    """Formats one input's hypotheses: plain lines, or fairseq's S-/T-/H-/D-/P-(/A-) lines.

    With `score_reference` the one "hypothesis" is the given translation and plain lines are
    `SCORE<TAB>LOGPROB<TAB>TOKENS` (per-token log-probs added with print_scores). Alignments,
    when given to `write`, are one list of (source, target) pairs per hypothesis.
    """

    def __init__(self, fh: IO[str], fmt: str, print_scores: bool, nbest: int, src_dict, tgt_dict, detok,
                 text_of: Callable[[Item, list[str]], str] | None = None, score_reference: bool = False,
                 print_alignment: bool = False):
        self.fh, self.fmt, self.print_scores, self.nbest = fh, fmt, print_scores, nbest
        self.src_dict, self.tgt_dict, self.detok = src_dict, tgt_dict, detok
        self.text_of = text_of  # (item, pieces) -> output text, instead of detok (parsing: a tree)
        self.score_reference, self.print_alignment = score_reference, print_alignment

    def _text(self, item: Item, pieces: list[str]) -> str:
        return self.detok(pieces) if self.text_of is None else self.text_of(item, pieces)

    def write(self, item: Item, hyps: list[Hypothesis], alignments: list[list[tuple[int, int]]] | None = None) -> None:
        out = []
        aligned = [format_alignment(a) for a in alignments or []]
        if self.fmt == "plain" and self.score_reference:
            h = hyps[0]
            cols = [_fmt(h.score), _fmt(h.logprob), str(len(h.positional_scores))]
            if self.print_scores:
                cols.append(" ".join(f"{p:.4f}" for p in h.positional_scores))
            if self.print_alignment:
                cols.append(aligned[0] if aligned else "")
            out.append("\t".join(cols))
        elif self.fmt == "plain":
            for j in range(self.nbest):
                if j < len(hyps):
                    text = self._text(item, self.tgt_dict.string(hyps[j].tokens))
                    score = hyps[j].score
                else:  # nbest lines per input whatever happens, so line counts stay fixed:
                    # an empty input has one certain (log-prob 0) empty output; a search that
                    # found fewer hypotheses than --nbest (tiny vocabularies) pads with -inf.
                    # (parsing: still a tree, of the input's words)
                    text = "" if self.text_of is None else self.text_of(item, [])
                    score = 0.0 if not hyps else -math.inf
                line = f"{_fmt(score)}\t{text}" if self.print_scores else text
                if self.print_alignment:
                    line += "\t" + (aligned[j] if j < len(aligned) else "")
                out.append(line)
        else:
            i = item.index
            out.append(f"S-{i}\t{' '.join(self.src_dict.string(item.ids))}")
            if item.target_ids is not None:
                out.append(f"T-{i}\t{self._text(item, self.tgt_dict.string(item.target_ids))}")
            for j, h in enumerate(hyps):
                pieces = self.tgt_dict.string(h.tokens)
                out.append(f"H-{i}\t{_fmt(h.score)}\t{' '.join(pieces)}")
                out.append(f"D-{i}\t{_fmt(h.score)}\t{self._text(item, pieces)}")
                out.append(f"P-{i}\t{' '.join(f'{p:.4f}' for p in h.positional_scores)}")
                if self.print_alignment:
                    out.append(f"A-{i}\t{aligned[j] if j < len(aligned) else ''}")
        self.fh.write("".join(line.replace("\n", " ") + "\n" for line in out))


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class GenerateStats:
    sentences: int = 0
    translated: int = 0  # non-empty inputs (the ones the model ran on)
    target_tokens: int = 0  # tokens of the best hypotheses, </s> excluded
    truncated: int = 0
    decode_seconds: float = 0.0  # search only: no loading, reading or writing
    total_seconds: float = 0.0  # from the start of `generate` to the last output line
    scored: bool = False  # --score-reference: pairs scored, not sentences translated

    def count(self, hyps: list) -> None:
        """One input written with these hypotheses (none: an empty input)."""
        self.sentences += 1
        if hyps:
            self.translated += 1
            self.target_tokens += len(hyps[0].tokens)

    def line(self) -> str:
        t = max(self.decode_seconds, 1e-9)
        tt = max(self.total_seconds, 1e-9)
        what, work = ("scored", "scoring") if self.scored else ("translated", "search")
        return (
            f"{what} {self.sentences:,} sentences ({self.target_tokens:,} target tokens) in "
            f"{self.total_seconds:.1f}s: {self.sentences / tt:,.1f} sentences/s, "
            f"{self.target_tokens / tt:,.0f} tokens/s; {work} only {self.decode_seconds:.1f}s: "
            f"{self.sentences / t:,.1f} sentences/s, {self.target_tokens / t:,.0f} tokens/s"
        )


def _progress(enabled: bool, total: int | None):
    """A rich progress bar on stderr (sentences, rate, ETA), or None."""
    if not enabled:
        return None
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from nmtkit.console import stderr_console, text_column

    console = stderr_console()
    return Progress(
        text_column("generate"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        text_column("{task.fields[rate]} sent/s"),
        TimeElapsedColumn(),
        text_column("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # in a log file, a bar would leave only a blank line
    )


def open_translator(opts: GenerateOptions, warn: Callable[[str], None]) -> Translator:
    """The flags' model through the one opener: the engine's device checked before --output (a
    bad device is reported first), then the model loaded with the search flags as defaults."""
    source = model_source(opts)
    options = runtime_options(opts)
    prepared = source.engine.prepare(options, warn)
    _check_output_path(opts)
    tr = Translator.open(source, options, prepared=prepared, max_tokens=opts.max_tokens,
                         batch_size=opts.batch_size, warn=warn, search=with_seed(opts.search, opts.seed))
    tr.positional_scores = opts.format == "fairseq"  # its P- lines
    return tr


def _inputs(opts: GenerateOptions, tr: Translator) -> tuple[int | None, Iterator[Item], Truncations]:
    """(count or None, items, their truncation counter) of --input (with --reference when
    scoring) or of the binarized split."""
    from nmtkit.io import read_lines

    if opts.input is not None:
        where = "<stdin>" if opts.input == "-" else opts.input
        trunc = tr.truncations(lambda i: f"{where}:{i + 1}", where)
        if opts.score_reference:
            return (*reference_items(tr, opts.input, opts.reference, trunc), trunc)
        tr.src_subword  # noqa: B018 - load it now: a missing model is reported before the input is read
        total = None if opts.input == "-" else _count_lines(opts.input)
        if opts.constraints or opts.avoid or opts.prefix:
            tr.engine.require_terms()  # before any input is read or output written
            return total, term_items(opts, tr, where, trunc), trunc
        return total, tr.items(read_lines(opts.input), trunc), trunc
    split = opts.gen_subset or "test"
    trunc = tr.truncations(lambda i: f"{opts.data_dir} split {split!r}, sentence {i + 1}", f"split {split!r}")
    total, items = split_items(opts.data_dir, split, tr.src_lang, tr.tgt_lang, trunc)
    if opts.score_reference and not _has_targets(opts.data_dir, split, tr.src_lang, tr.tgt_lang):
        raise UserError(f"--score-reference: split {split!r} of {opts.data_dir} has no target side "
                        f"({tr.tgt_lang}) with as many sentences; score raw text with --input and --reference")
    return total, items, trunc


def term_items(opts: GenerateOptions, tr: Translator, where: str, trunc: Truncations) -> Iterator[Item]:
    """Items of --input with their terms: tab-separated phrases after the source (--constraints),
    the --avoid glossary, and the line's --prefix. A mistake names its file and line."""
    from collections import deque

    from nmtkit.generation.terms import split_line
    from nmtkit.io import read_lines

    avoid = _glossary(opts.avoid) if opts.avoid else None
    prefixes = read_lines(opts.prefix) if opts.prefix else None
    phrases: deque = deque()

    def sources() -> Iterator[str]:
        for line in read_lines(opts.input):
            source, fields = split_line(line) if opts.constraints else (line, None)
            phrases.append(fields or None)
            yield source

    for it in tr.items(sources(), trunc):
        pre = None
        if prefixes is not None:
            pre = next(prefixes, None)
            if pre is None:
                raise UserError(f"--prefix {opts.prefix} has {it.index} lines but --input {where} has more")
        it.terms = tr.terms(phrases.popleft(), avoid, pre, opts.constraints == "ordered", f"{where}:{it.index + 1}")
        yield it
    if prefixes is not None and next(prefixes, None) is not None:
        raise UserError(f"--prefix {opts.prefix} has more lines than --input {where}")


def _glossary(path: str) -> list[str]:
    """--avoid's phrases: one per non-empty line (blank lines are separators, not phrases)."""
    from nmtkit.io import read_lines

    phrases = [line.strip() for line in read_lines(path) if line.strip()]
    if not phrases:
        raise UserError(f"--avoid {path}: no phrase in the file (one phrase per line)")
    return phrases


def _alignment_layer(opts: GenerateOptions, tr: Translator) -> int | None:
    """The 0-based decoder layer of --print-alignment (-1: the last), checked; None without it."""
    if opts.print_alignment is None:
        return None
    n = tr.engine.layers("cross")
    if opts.alignment_layer is not None and opts.alignment_layer > n:
        raise UserError(f"--alignment-layer {opts.alignment_layer} is out of range: the model has {n} decoder "
                        f"layers (1..{n})")
    if opts.print_alignment == "words" and tr.task == "parsing":
        raise UserError("--print-alignment words: a parsing model's output is a tree, not words; "
                        "use --print-alignment (subword)")
    return -1 if opts.alignment_layer is None else opts.alignment_layer - 1


def _writer(fh, opts: GenerateOptions, tr: Translator, total: int | None) -> Writer:
    """The output writer; on a parsing data directory one bracketed tree per input line (docs/parsing.md)."""
    text_of = None
    if tr.task == "parsing":
        from nmtkit.parsing.pipeline import tree_writer

        split = None if opts.input is not None else (opts.gen_subset or "test")
        text_of = tree_writer(tr.data_dir, tr.manifest, split, total, tr.src_dict, tr.src_lang)
    return Writer(fh, opts.format, opts.print_scores, tr.search.nbest, tr.src_dict, tr.tgt_dict,
                  tr.tgt_subword.decode, text_of, score_reference=opts.score_reference,
                  print_alignment=opts.print_alignment is not None)


class _Progress:
    """The rich bar on stderr (sentences, rate, ETA) when asked for and stderr is a terminal."""

    def __init__(self, enabled: bool, total: int | None):
        self.bar = _progress(enabled and sys.stderr.isatty(), total)
        self.total, self.task, self.t0 = total, None, time.perf_counter()

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task("generate", total=self.total, rate="-")
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self, n: int) -> None:
        if self.bar is not None and n:
            done = self.bar.tasks[0].completed + n
            rate = done / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.update(self.task, advance=n, rate=f"{rate:,.1f}")


def _run_chunk(chunk: list[Item], opts: GenerateOptions, tr: Translator, layer: int | None,
               progress: _Progress, stats: GenerateStats) -> tuple[dict, dict]:
    """({index: hypotheses}, {index: alignments}) of one chunk: searched, or scored with
    --score-reference (the time of that alone is the summary's decode time); then the
    alignments when asked for (words with --print-alignment words)."""
    # empty inputs need no model call (scoring still runs them: a source of </s> alone)
    progress.advance(0 if opts.score_reference else sum(1 for it in chunk if len(it.ids) == 0))
    td = time.perf_counter()
    if opts.score_reference:
        results, aligns = tr.score_items(chunk, alignment_layer=layer, on_batch=progress.advance)
    else:
        results, aligns = tr.translate_items(chunk, on_batch=progress.advance), {}
    stats.decode_seconds += time.perf_counter() - td
    if layer is not None and not opts.score_reference:
        aligns = tr.align_items(chunk, results, layer)
    if opts.print_alignment == "words":
        for it in chunk:
            if it.index in aligns:
                hyps = results.get(it.index, [])
                aligns[it.index] = [tr.word_alignment(it, h.tokens, a) for h, a in zip(hyps, aligns[it.index])]
    return results, aligns


def generate(opts: GenerateOptions, out: IO[str] | None = None, warn: Callable[[str], None] | None = None) -> GenerateStats:
    """Translate `opts`' input with `opts.paths`' model(s); write to `out` (or opts.output)."""
    from nmtkit.io import output_stream

    t_start = time.perf_counter()
    opts.validate()
    warn = warn or warn_stderr
    tr = open_translator(opts, warn)
    print_note(opts.engine_note)
    total, items, trunc = _inputs(opts, tr)
    layer = _alignment_layer(opts, tr)
    stats = GenerateStats(scored=opts.score_reference)
    stream = output_stream(opts.output) if out is None else contextlib.nullcontext(out)
    with stream as fh, _Progress(opts.progress, total) as progress:
        writer = _writer(fh, opts, tr, total)
        for chunk in chunks(items, opts.buffer_size):
            results, aligns = _run_chunk(chunk, opts, tr, layer, progress, stats)
            for it in chunk:
                hyps = results.get(it.index, [])
                writer.write(it, hyps, aligns.get(it.index))
                stats.count(hyps)
            fh.flush()
    trunc.summary()
    stats.truncated = trunc.count
    stats.total_seconds = time.perf_counter() - t_start
    return stats


def _has_targets(data_dir: str, split: str, src_lang: str, tgt_lang: str) -> bool:
    """Whether `split` has a target side of as many sentences (split_items attaches it only then)."""
    from nmtkit.data.shards import load_split

    try:
        return len(load_split(data_dir, split, tgt_lang)) == len(load_split(data_dir, split, src_lang))
    except UserError:
        return False


def _raw_line_count(path: str) -> int:
    """Lines of a text file (plain or .gz), as read_lines reads them."""
    from nmtkit.io import read_lines

    n = _count_lines(path)
    return n if n is not None else sum(1 for _ in read_lines(path))


def reference_items(tr: Translator, source: str, reference: str, trunc: Truncations) -> tuple[int, Iterator[Item]]:
    """(count, items) of raw sources with their raw translations (--score-reference --reference).

    Every pair is checked before the first is scored (line counts, empty lines, target pieces
    outside the dictionary): a bad line stops the run before anything is written, naming its
    file and line. stdin (--input -) is read into memory for that.
    """
    from nmtkit.io import read_lines

    if tr.task == "parsing":
        raise UserError("--reference: the targets of a parsing data directory are linearized trees; "
                        "score its binarized split (--score-reference without --input)")
    src_name = "<stdin>" if source == "-" else source
    src_lines = list(read_lines(source)) if source == "-" else None
    n_src = len(src_lines) if src_lines is not None else _raw_line_count(source)
    n_ref = _raw_line_count(reference)
    if n_src != n_ref:
        raise UserError(f"--reference {reference} has {n_ref} lines but --input {src_name} has {n_src}; "
                        "they must be line-aligned pairs")
    tr.src_subword  # noqa: B018 - load it now: a missing model is reported before the input is read

    def gen(check: bool) -> Iterator[Item]:
        srcs = iter(src_lines) if src_lines is not None else read_lines(source)
        for i, (s, t) in enumerate(zip(srcs, read_lines(reference))):
            if not s.strip():
                raise UserError(f"{src_name}:{i + 1}: empty source line (every pair needs a source and a target)")
            ids = tr.target_ids(t, f"{reference}:{i + 1}")
            if check:
                continue
            src_ids = tr.src_dict.encode(tr.src_subword.encode(s))
            yield Item(i, trunc(i, src_ids), ids, text=s)

    for _ in gen(check=True):
        pass
    return n_src, gen(check=False)


def _check_output_path(opts: GenerateOptions) -> None:
    """Refuse an --output that is a directory, the input text, the reference, a checkpoint being
    used or any other checkpoint, or a file of a data or export directory (`nmtkit.outputs`)."""
    from nmtkit.outputs import check_output_file

    inputs = [("--input", opts.input), ("--reference", opts.reference), ("--avoid", opts.avoid),
              ("--prefix", opts.prefix)] + [("--path", q) for q in opts.paths]
    check_output_file(opts.output, "--output", inputs)


def _count_lines(path: str) -> int | None:
    """Line count of a plain file for the progress bar's total (None for .gz: not worth a pass)."""
    p = Path(path)
    if p.suffix == ".gz" or not p.is_file():
        return None
    n = 0
    last = b"\n"
    with open(p, "rb") as fh:
        while block := fh.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)
