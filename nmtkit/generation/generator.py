"""The `generate` driver: open the model, read the inputs, then search (or score) them chunk by
chunk and write the outputs in input order as soon as they are known.

Why it is shaped this way:
- Every flag is decided here, once, at the top: `GenerateOptions.validate` refuses what cannot
  be done, `open_translator` opens the model, and each side below gets plain values.
- Inputs come from a binarized split of a data directory or from raw text (a file or stdin).
  Raw text goes through the data directory's own subword model and dictionary, so `generate`
  sees exactly the segmentation the model was trained on; both kinds become the same `Item`s
  (`nmtkit.generation.inputs`, read once, checked before anything is written).
- Inputs are processed in chunks of `buffer_size` sentences: memory stays bounded for endless
  stdin. Each batch's outputs are written as soon as every earlier input's are (`InOrder`), so a
  pipe (`| head`) gets its first lines while the rest is still being translated.
  Inside a chunk sentences are sorted by length and cut into batches by `max_tokens` /
  `batch_size`, which keeps padding (wasted work) small.
- No input line is ever dropped: an empty line gives an empty output (without running the
  model), an over-long one is truncated to the model's source limit with a warning naming it.
- The output is written atomically when it goes to a file (`nmtkit.io.output_stream`), in the
  formats of `nmtkit.generation.writing`, which also shows the progress bar and the summary line.
- Everything between the text and the hypotheses (loading and checking the checkpoints,
  segmentation, truncation, batching, search, detokenization) is the `Translator`'s
  (`nmtkit.generation.translator`): the Python API and the CLI are one code path. This module
  adds what only a command needs: its flags, streaming in chunks and the alignments it prints.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from nmtkit.backends.registry import ModelSource
from nmtkit.data.languages import check_lang_flags
from nmtkit.errors import UserError
from nmtkit.generation.inputs import InputSpec, read_inputs
from nmtkit.generation.items import Item, warn_stderr
from nmtkit.generation.model_flags import (
    check_model_options,
    from_flags,
    model_source,
    print_note,
    runtime_options,
    with_seed,
)
from nmtkit.generation.translator import Translator
from nmtkit.generation.writing import FORMATS, GenerateStats, Progress, Writer, output_text
from nmtkit.io import output_stream, read_lines
from nmtkit.search.config import Hypothesis, SearchConfig
from nmtkit.settings import group, negate, setting


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
    # a multilingual model (docs/multilingual.md): the direction; a bilingual model's own languages are accepted
    source_lang: str | None = setting(None, flag="--source-lang", aliases=("-s",), help="Multilingual model: the source language (needed for a binarized split; checked against the model's languages for raw text).")
    target_lang: str | None = setting(None, flag="--target-lang", aliases=("-t",), help="Multilingual model: the language to translate into (required); its tag >>xx<< is put before each source sentence.")
    search: SearchConfig = group(SearchConfig)
    # resolved by from_flags into --lenpen-form and --early-stop (model_flags.search_flag_defaults)
    decoding: str | None = setting(None, flag="--decoding", show_default=False, help="The length penalty and stopping rule in one word: paper (--lenpen-form gnmt --early-stop bound: the paper's, exact) or fairseq (--lenpen-form fairseq --early-stop beam: fairseq's, longer outputs from weak models); a flag given beside it wins [default: paper; fairseq on a CTranslate2 export].")
    max_tokens: int | None = setting(None, flag="--max-tokens", help="Batch limit in padded source tokens.")
    batch_size: int | None = setting(None, flag="--batch-size", help="Batch limit in sentences [default: 128 unless --max-tokens].")
    # not given on the command line: 1 when --input - is a terminal (from_flags)
    buffer_size: int = setting(10000, flag="--buffer-size", unset=True, show_default=False, help="Sentences read, sorted and translated at a time [default: 10000; 1 when --input - is a terminal: each line is translated as it is entered].")
    device: str = setting("auto", flag="--device", help="auto, cpu, cuda, cuda:N or mps.")
    precision: str = setting("fp32", flag="--precision", help="fp32, bf16 or fp16 (weights and activations; scores in fp32).")
    shortlist: str | None = setting(None, flag="--shortlist", help="A lexical shortlist (nmtkit shortlist): the output layer restricted per batch to its candidates for the batch's source pieces (faster; docs/generate.md). On a CTranslate2 export: the export's own vmap.txt.")
    quantize: str = setting("none", flag="--quantize", help="int8: int8 linear layers on CPU (faster, scores in fp32; a small BLEU cost, docs/generate.md); none: the model's fp32 weights.")
    threads: int = setting(0, flag="--threads", help="CPU threads for torch (0 = torch's default).")
    seed: int | None = setting(None, flag="--seed", help="Random seed (sampling).")
    ema: bool = setting(False, flag="--ema", help="Use the checkpoints' EMA weights instead of the raw weights.")
    # progress bar and the summary line on stderr
    engine_note: str | None = field(default=None, compare=False, repr=False)  # from_flags: engine defaults chosen
    # what --path is, described once (model_flags.model_source) and passed along from here
    source: ModelSource | None = field(default=None, compare=False, repr=False)
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
        SearchConfig's, checked when it is made): the model's (`check_model_options`) and what an
        export directory cannot do for generate first (it has no binarized splits, and its engine
        may not teacher-force), then the flags' own rules."""
        export = check_model_options(self)
        if export is not None and self.input is None:
            what = f"--gen-subset {self.gen_subset}" if self.gen_subset else "a binarized split"
            raise UserError(f"--path {export} is an export directory, which translates raw text: give --input FILE "
                            f"(or - for stdin); {what} needs the checkpoint and its data directory")
        engine = self.source.engine
        for flag, given in (("--print-alignment", self.print_alignment is not None),
                            ("--score-reference", self.score_reference)):
            if given and not engine.teacher_forcing:
                raise UserError(f"{flag}: {export} is run by {engine.display}, which nmtkit does not read attention "
                                "or forced scores from; use the checkpoint and its data directory")
        if self.format not in FORMATS:
            raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.input is not None and self.gen_subset is not None:
            raise UserError("--input and --gen-subset exclude each other (raw text or a binarized split)")
        for flag, path in (("--avoid", self.avoid), ("--prefix", self.prefix), ("--shortlist", self.shortlist)):
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
        if self.print_alignment is not None:
            from nmtkit.forced import ALIGNMENT_LEVELS

            if self.print_alignment not in ALIGNMENT_LEVELS:
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


# ---------------------------------------------------------------------------------------------
# the model


def open_translator(opts: GenerateOptions, warn: Callable[[str], None]) -> Translator:
    """The flags' model through the one opener: the engine's device checked first (a bad device
    is reported before any file), then the files the flags name and the direction asked for
    (`_check_files`, an empty input said), and the model loaded with the search flags as defaults."""
    source, options = model_source(opts), runtime_options(opts)
    search = with_seed(opts.search, opts.seed)
    prepared = source.engine.prepare(options, warn)
    print_note(_check_files(opts))
    tr = Translator.open(source, options, prepared=prepared, max_tokens=opts.max_tokens,
                         batch_size=opts.batch_size, warn=warn, search=search, shortlist=opts.shortlist)
    print_note(opts.engine_note)  # once the model is open: a refusal stays one line
    tr.positional_scores = opts.format == "fairseq"  # its P- lines
    tr.target_lang = opts.target_lang
    return tr


def _check_files(opts: GenerateOptions) -> str | None:
    """Before the model is loaded, each in one line naming its flag: --input and --reference
    exist and are files (or - for stdin); --output is none of them (`_check_output_path`);
    --source-lang and --target-lang are the model's (`check_lang_flags`). Returns the note for
    an --input file without a single line (loading the model can take seconds); stdin is left
    to the reading itself."""
    for flag, path in (("--input", opts.input), ("--reference", opts.reference)):
        if path is not None and path != "-" and not Path(path).is_file():
            raise UserError(f"{flag} {path}: not found" if not Path(path).exists() else f"{flag} {path}: not a file")
    _check_output_path(opts)
    check_lang_flags(opts.source.manifest, opts.source_lang, opts.target_lang, split=opts.input is None)
    if opts.input is None or opts.input == "-":
        return None
    lines = read_lines(opts.input)
    try:
        empty = next(lines, None) is None
    finally:
        lines.close()
    return f"--input {opts.input} is empty: 0 sentences to translate (the model is still loaded and checked)" if empty else None


def _check_output_path(opts: GenerateOptions) -> None:
    """Refuse an --output that is a directory, the input text, the reference, a checkpoint being
    used or any other checkpoint, or a file of a data or export directory (`nmtkit.outputs`)."""
    if opts.output is None:  # stdout: nothing to check (nor to import)
        return
    from nmtkit.outputs import check_output_file

    inputs = [("--input", opts.input), ("--reference", opts.reference), ("--avoid", opts.avoid),
              ("--prefix", opts.prefix)] + [("--path", q) for q in opts.paths]
    check_output_file(opts.output, "--output", inputs)


# ---------------------------------------------------------------------------------------------
# the work on each chunk


def chunks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """The items in lists of `size` (the last may be shorter), each handed out before the next
    item is read: endless stdin is translated as it comes."""
    buf: list[Item] = []
    for it in items:
        buf.append(it)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


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


class InOrder:
    """Hands back a chunk's inputs in input order as their results arrive.

    The search runs a chunk in batches sorted by length, so results come out of order; an input
    is released once it and every input before it have their results. `generate` writes what is
    released at once, so that `nmtkit generate ... | head` sees its first lines as soon as they
    are known rather than after the whole chunk, and the output order never changes.
    """

    def __init__(self, chunk: list[Item]):
        self.chunk = chunk
        self.position = {it.index: k for k, it in enumerate(chunk)}
        self.done: list[tuple[list[Hypothesis], list | None] | None] = [None] * len(chunk)
        self.next = 0  # the first input not yet released

    def add(self, results: dict[int, list[Hypothesis]], aligns: dict[int, list]) -> list[tuple[Item, list, list | None]]:
        """Record these results ({index: hypotheses}, {index: alignments}); -> the inputs now released."""
        for index, hyps in results.items():
            self.done[self.position[index]] = (hyps, aligns.get(index))
        return self._release()

    def rest(self) -> list[tuple[Item, list, list | None]]:
        """The end of the chunk: every input not yet released, those without results with none."""
        self.done = [d if d is not None else ([], None) for d in self.done]
        return self._release()

    def _release(self) -> list[tuple[Item, list, list | None]]:
        out = []
        while self.next < len(self.chunk) and self.done[self.next] is not None:
            hyps, aligns = self.done[self.next]
            out.append((self.chunk[self.next], hyps, aligns))
            self.next += 1
        return out


@dataclass(frozen=True)
class ChunkWork:
    """What is done with each chunk, decided once: a search, or forced decoding of the given
    targets (--score-reference); and the alignments asked for (--print-alignment: `layer`, the
    0-based decoder layer, or None; `words`: pairs of words instead of subwords)."""

    tr: Translator
    scoring: bool
    layer: int | None
    words: bool

    def released(self, chunk: list[Item], progress: Progress, stats: GenerateStats
                 ) -> Iterator[list[tuple[Item, list, list | None]]]:
        """The chunk's inputs with their hypotheses and alignments, in input order, as soon as
        each and every one before it is done (`InOrder`); the last list holds the rest. The bar
        advances as each batch is done."""
        ordered = InOrder(chunk)
        for results, aligns in self.run_chunk(chunk, stats):
            progress.advance(len(results))
            yield ordered.add(results, aligns)
        yield ordered.rest()

    def run_chunk(self, chunk: list[Item], stats: GenerateStats) -> Iterator[tuple[dict, dict]]:
        """({index: hypotheses}, {index: alignments}) of one chunk, batch by batch as each is
        known: the empty inputs first when searching (no model call), then each searched or
        scored batch. The time of the search or scoring alone is the summary's decode time."""
        tr = self.tr
        if self.scoring:
            batches = tr.score_batches(chunk, alignment_layer=self.layer, words=self.words)
        else:
            yield {it.index: [] for it in chunk if len(it.ids) == 0}, {}
            batches = ((batch, found, None) for batch, found in tr.translate_batches(chunk))
        while True:
            td = time.perf_counter()
            batch, found, aligns = next(batches, (None, None, None))
            stats.decode_seconds += time.perf_counter() - td
            if batch is None:
                return
            results = {it.index: hyps for it, hyps in zip(batch, found)}
            if aligns is None:  # searched: the alignments of its hypotheses, by a teacher-forced pass
                aligns = tr.align_items(batch, results, self.layer, self.words) if self.layer is not None else {}
            yield results, aligns


# ---------------------------------------------------------------------------------------------
# the run


def generate(opts: GenerateOptions, out: IO[str] | None = None, warn: Callable[[str], None] | None = None) -> GenerateStats:
    """Translate `opts`' input with `opts.paths`' model(s); write to `out` (or opts.output)."""
    t_start = time.perf_counter()
    opts.validate()
    tr = open_translator(opts, warn or warn_stderr)
    # what to read: --input's raw text (with --reference or the terms), or the binarized split
    split = None if opts.input is not None else (opts.gen_subset or "test")
    spec = InputSpec(opts.input, split, opts.data_dir, opts.score_reference, opts.reference,
                     opts.constraints, opts.avoid, opts.prefix, opts.source_lang, opts.target_lang)
    inputs = read_inputs(spec, tr)
    work = ChunkWork(tr, opts.score_reference, _alignment_layer(opts, tr), opts.print_alignment == "words")
    # typing at a terminal: no bar drawn over the line being typed or before each answer
    interactive = opts.input == "-" and sys.stdin.isatty()
    progress = Progress(opts.progress and not interactive, inputs.total)
    writer = Writer(tr, opts.format, print_scores=opts.print_scores, score_reference=opts.score_reference,
                    print_alignment=opts.print_alignment is not None,
                    text_of=output_text(tr, spec.split, inputs.total))
    stats = GenerateStats(scored=opts.score_reference)
    stream = output_stream(opts.output) if out is None else contextlib.nullcontext(out)
    with stream as fh, progress:
        for chunk in chunks(inputs.items, opts.buffer_size):
            for done in work.released(chunk, progress, stats):
                writer.write(fh, done, stats)
    inputs.truncations.summary()
    stats.truncated = inputs.truncations.count
    stats.total_seconds = time.perf_counter() - t_start
    return stats
