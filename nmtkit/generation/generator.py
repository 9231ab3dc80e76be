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
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

import numpy as np
import torch

from nmtkit.device import resolve_device  # noqa: F401 - re-exported for old imports
from nmtkit.errors import UserError
from nmtkit.generation.search import Hypothesis, SearchConfig, search
from nmtkit.models.loading import PRECISIONS, LoadedModels, load_models  # noqa: F401 - re-exported
from nmtkit.settings import construct, group, negate, setting

FORMATS = ("plain", "fairseq")
MAX_WARNINGS = 20  # over-long lines named one by one; beyond that only counted


@dataclass
class GenerateOptions:
    """Everything `nmtkit generate` needs; each field with `setting(...)` is one of its flags,
    with its default and help text (docs/generate.md); `search` contributes SearchConfig's."""

    data_dir: str = setting(flag="data_dir", argument=True, help="Preprocessed data directory (dictionaries, subword model, splits).")
    paths: list[str] = setting(flag="--path", parse=list, help="Checkpoint; give it several times for an ensemble.")
    # default "test" when no --input
    gen_subset: str | None = setting(None, flag="--gen-subset", help="Binarized split to translate [default: test].")
    # raw text file, or "-" for stdin
    input: str | None = setting(None, flag="--input", aliases=("-i",), help="Raw text to translate, one sentence per line (FILE, FILE.gz or - for stdin); segmented with the data dir's subword model.")
    # None or "-" = stdout
    output: str | None = setting(None, flag="--output", aliases=("-o",), help="Write here (atomically) instead of stdout.")
    format: str = setting("plain", flag="--format", help="plain: one detokenized hypothesis per line; fairseq: S-/T-/H-/D-/P- lines.")
    print_scores: bool = setting(False, flag="--print-scores", help="plain format: prefix each line with its score and a tab.")
    search: SearchConfig = group(SearchConfig)
    max_tokens: int | None = setting(None, flag="--max-tokens", help="Batch limit in padded source tokens.")
    batch_size: int | None = setting(None, flag="--batch-size", help="Batch limit in sentences [default: 128 unless --max-tokens].")
    buffer_size: int = setting(10000, flag="--buffer-size", help="Sentences read, sorted and translated at a time (1 for interactive use).")
    device: str = setting("auto", flag="--device", help="auto, cpu, cuda, cuda:N or mps.")
    precision: str = setting("fp32", flag="--precision", help="fp32, bf16 or fp16 (weights and activations; scores in fp32).")
    threads: int = setting(0, flag="--threads", help="CPU threads for torch (0 = torch's default).")
    seed: int | None = setting(None, flag="--seed", help="Random seed (sampling).")
    ema: bool = setting(False, flag="--ema", help="Use the checkpoints' EMA weights instead of the raw weights.")
    # progress bar and the summary line on stderr
    progress: bool = setting(True, flag="--quiet", aliases=("-q",), cli_type=bool, cli_default=False, parse=negate, help="No progress bar and no summary line on stderr.")

    @classmethod
    def from_flags(cls, values: dict) -> "GenerateOptions":
        """The options from `nmtkit generate`'s flags: a --max-len-b not given depends on the
        data directory (50, or 300 for a parsing data directory: `default_max_len_b`)."""
        search = dict(values["search"])
        if search["max_len_b"] is None:
            search["max_len_b"] = default_max_len_b(values["data_dir"])
        return construct(cls, {**values, "search": search})

    def validate(self) -> None:
        """UserError naming the flag for every impossible setting (the search's own are
        SearchConfig's, checked when it is made)."""
        s = self.search
        if not s.sampling and (s.topk or s.topp or s.temperature != 1.0):
            raise UserError("--topk, --topp and --temperature apply only with --sampling")
        if not self.paths:
            raise UserError("--path is required (give it several times for an ensemble)")
        if self.format not in FORMATS:
            raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.input is not None and self.gen_subset is not None:
            raise UserError("--input and --gen-subset exclude each other (raw text or a binarized split)")
        for flag, v in (("--max-tokens", self.max_tokens), ("--batch-size", self.batch_size)):
            if v is not None and v < 1:
                raise UserError(f"{flag} must be >= 1, got {v}")
        if self.buffer_size < 1:
            raise UserError(f"--buffer-size must be >= 1, got {self.buffer_size}")
        if self.threads < 0:
            raise UserError(f"--threads must be >= 0 (0 = torch's default), got {self.threads}")


# ---------------------------------------------------------------------------------------------
# devices and models


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass
class Item:
    """One input sentence."""

    index: int  # 0-based position in the input (line number - 1)
    ids: np.ndarray  # source dictionary ids without </s>, already truncated to the model limit
    target_ids: np.ndarray | None = None  # reference (binarized splits only), for T- lines
    text: str | None = None  # the raw input line (--input only): a parsing model's tree gets its words


class Truncations:
    """Collects the over-long inputs; names the first MAX_WARNINGS of them as they happen.

    `where(index)` names input `index` (0-based) for the user, e.g. `news.en:12`.
    """

    def __init__(self, warn: Callable[[str], None], where: Callable[[int], str], what: str, limit: int):
        self.warn, self.where, self.what, self.limit = warn, where, what, limit
        self.count = 0

    def __call__(self, index: int, ids: np.ndarray) -> np.ndarray:
        if len(ids) <= self.limit:
            return ids
        self.count += 1
        if self.count <= MAX_WARNINGS:
            self.warn(
                f"{self.where(index)}: {len(ids)} tokens, truncated to {self.limit} "
                f"(the model accepts {self.limit + 1} source positions including </s>)"
            )
        return ids[: self.limit]

    def summary(self) -> None:
        if self.count > MAX_WARNINGS:
            self.warn(f"{self.what}: {self.count} inputs in all were truncated ({MAX_WARNINGS} named above)")


def split_items(data_dir: str, split: str, src_lang: str, tgt_lang: str, trunc: Truncations) -> tuple[int, Iterator[Item]]:
    """(count, items) of a binarized split; targets are attached when the split has them."""
    from nmtkit.data.shards import load_split

    src = load_split(data_dir, split, src_lang)
    try:
        tgt = load_split(data_dir, split, tgt_lang)
        if len(tgt) != len(src):
            tgt = None
    except UserError:
        tgt = None

    def gen() -> Iterator[Item]:
        for i in range(len(src)):
            yield Item(i, trunc(i, src[i]), None if tgt is None else tgt[i])

    return len(src), gen()


def raw_items(path: str, subword, src_dict, trunc: Truncations) -> Iterator[Item]:
    """Items of a raw text file (or stdin): subword-encoded, then mapped to dictionary ids."""
    from nmtkit.io import read_lines

    for i, line in enumerate(read_lines(path)):
        if line.strip():
            ids = src_dict.encode(subword.encode(line))
        else:
            ids = np.zeros(0, dtype=np.int64)
        yield Item(i, trunc(i, ids), text=line)


def chunks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    buf: list[Item] = []
    for it in items:
        buf.append(it)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


def make_batches(items: list[Item], max_tokens: int | None, batch_size: int | None) -> list[list[Item]]:
    """Sort by source length (longest first) and cut into batches.

    A batch holds at most `batch_size` sentences and at most `max_tokens` padded source tokens
    (rows x longest row, </s> included); a single sentence over `max_tokens` still forms a batch
    of its own. Empty sentences are left out: they need no model call.
    """
    todo = sorted((it for it in items if len(it.ids) > 0), key=lambda it: (-len(it.ids), it.index))
    batches: list[list[Item]] = []
    cur: list[Item] = []
    width = 0
    for it in todo:
        w = max(width, len(it.ids) + 1)
        if cur and (
            (batch_size is not None and len(cur) + 1 > batch_size)
            or (max_tokens is not None and w * (len(cur) + 1) > max_tokens)
        ):
            batches.append(cur)
            cur, w = [], len(it.ids) + 1
        cur.append(it)
        width = w
    if cur:
        batches.append(cur)
    return batches


def collate_source(batch: list[Item], eos: int, pad: int) -> torch.Tensor:
    """(B, S) long: each row `ids + [</s>]`, right-padded (docs/internals.md)."""
    S = max(len(it.ids) for it in batch) + 1
    out = np.full((len(batch), S), pad, dtype=np.int64)
    for r, it in enumerate(batch):
        n = len(it.ids)
        out[r, :n] = it.ids
        out[r, n] = eos
    return torch.from_numpy(out)


# ---------------------------------------------------------------------------------------------
# outputs


def _fmt(x: float) -> str:
    return "-inf" if x == -math.inf else f"{x:.6f}"


class Writer:
    """Formats one input's hypotheses: plain lines, or fairseq's S-/T-/H-/D-/P- lines."""

    def __init__(self, fh: IO[str], fmt: str, print_scores: bool, nbest: int, src_dict, tgt_dict, detok,
                 text_of: Callable[[Item, list[str]], str] | None = None):
        self.fh, self.fmt, self.print_scores, self.nbest = fh, fmt, print_scores, nbest
        self.src_dict, self.tgt_dict, self.detok = src_dict, tgt_dict, detok
        self.text_of = text_of  # (item, pieces) -> output text, instead of detok (parsing: a tree)

    def _text(self, item: Item, pieces: list[str]) -> str:
        return self.detok(pieces) if self.text_of is None else self.text_of(item, pieces)

    def write(self, item: Item, hyps: list[Hypothesis]) -> None:
        out = []
        if self.fmt == "plain":
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
                out.append(f"{_fmt(score)}\t{text}" if self.print_scores else text)
        else:
            i = item.index
            out.append(f"S-{i}\t{' '.join(self.src_dict.string(item.ids))}")
            if item.target_ids is not None:
                out.append(f"T-{i}\t{self._text(item, self.tgt_dict.string(item.target_ids))}")
            for h in hyps:
                pieces = self.tgt_dict.string(h.tokens)
                out.append(f"H-{i}\t{_fmt(h.score)}\t{' '.join(pieces)}")
                out.append(f"D-{i}\t{_fmt(h.score)}\t{self._text(item, pieces)}")
                out.append(f"P-{i}\t{' '.join(f'{p:.4f}' for p in h.positional_scores)}")
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

    def line(self) -> str:
        t = max(self.decode_seconds, 1e-9)
        tt = max(self.total_seconds, 1e-9)
        return (
            f"translated {self.sentences:,} sentences ({self.target_tokens:,} target tokens) in "
            f"{self.total_seconds:.1f}s: {self.sentences / tt:,.1f} sentences/s, "
            f"{self.target_tokens / tt:,.0f} tokens/s; search only {self.decode_seconds:.1f}s: "
            f"{self.sentences / t:,.1f} sentences/s, {self.target_tokens / t:,.0f} tokens/s"
        )


def translate_items(models, items: list[Item], cfg: SearchConfig, device, max_tokens, batch_size, eos, pad,
                    on_batch: Callable[[int], None] | None = None) -> dict[int, list[Hypothesis]]:
    """Hypotheses for every non-empty item, keyed by item.index."""
    results: dict[int, list[Hypothesis]] = {}
    for batch in make_batches(items, max_tokens, batch_size):
        src = collate_source(batch, eos, pad).to(device)
        for it, hyps in zip(batch, search(models, src, cfg)):
            results[it.index] = hyps
        if on_batch is not None:
            on_batch(len(batch))
    return results


def _progress(enabled: bool, total: int | None):
    """A rich progress bar on stderr (sentences, rate, ETA), or None."""
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("generate"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]} sent/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def generate(opts: GenerateOptions, out: IO[str] | None = None, warn: Callable[[str], None] | None = None) -> GenerateStats:
    """Translate `opts`' input with `opts.paths`' model(s); write to `out` (or opts.output)."""
    from nmtkit.data.manifest import load_dictionaries, load_manifest
    from nmtkit.data.subwords import load_subword_model
    from nmtkit.io import output_stream

    t_start = time.perf_counter()
    opts.validate()
    warn = warn or (lambda msg: print(f"nmtkit: warning: {msg}", file=sys.stderr))
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.seed is not None:
        torch.manual_seed(opts.seed)
    device = resolve_device(opts.device)
    dtype = PRECISIONS[opts.precision]
    if device.type == "cpu" and dtype is torch.float16:
        warn("--precision fp16 on CPU is emulated and slow; bf16 is the fast half precision there")

    _check_output_path(opts)
    manifest = load_manifest(opts.data_dir)
    src_lang, tgt_lang = manifest["source_lang"], manifest["target_lang"]
    src_dict, tgt_dict = load_dictionaries(opts.data_dir, manifest)
    tgt_subword = load_subword_model(opts.data_dir, tgt_lang)
    loaded = load_models(opts.paths, src_dict, tgt_dict, device, dtype, ema=opts.ema, langs=(src_lang, tgt_lang))

    cfg = opts.search
    cap = loaded.max_target_tokens if cfg.max_len_cap is None else min(cfg.max_len_cap, loaded.max_target_tokens)
    seed = cfg.seed if cfg.seed is not None else opts.seed
    cfg = dataclasses.replace(
        cfg, max_len_cap=cap, seed=seed, pad=tgt_dict.pad, bos=tgt_dict.bos, eos=tgt_dict.eos, unk=tgt_dict.unk
    )
    batch_size = opts.batch_size
    if batch_size is None and opts.max_tokens is None:
        batch_size = 128

    if opts.input is not None:
        where = "<stdin>" if opts.input == "-" else opts.input
        trunc = Truncations(warn, lambda i: f"{where}:{i + 1}", where, loaded.max_source_tokens)
        subword = load_subword_model(opts.data_dir, src_lang)
        total = None if opts.input == "-" else _count_lines(opts.input)
        items = raw_items(opts.input, subword, src_dict, trunc)
    else:
        split = opts.gen_subset or "test"
        trunc = Truncations(
            warn, lambda i: f"{opts.data_dir} split {split!r}, sentence {i + 1}", f"split {split!r}",
            loaded.max_source_tokens,
        )
        total, items = split_items(opts.data_dir, split, src_lang, tgt_lang, trunc)
    text_of = None
    if manifest.get("task") == "parsing":  # one bracketed tree per input line (docs/parsing.md)
        from nmtkit.parsing.pipeline import tree_writer

        text_of = tree_writer(opts.data_dir, manifest, None if opts.input is not None else split, total,
                              src_dict, src_lang)

    stats = GenerateStats()
    progress = _progress(opts.progress and sys.stderr.isatty(), total)
    task = None
    t0 = None

    def on_batch(n: int) -> None:
        if progress is not None:
            done = progress.tasks[0].completed + n
            rate = done / max(time.perf_counter() - t0, 1e-9)
            progress.update(task, advance=n, rate=f"{rate:,.1f}")

    stream = output_stream(opts.output) if out is None else contextlib.nullcontext(out)
    with stream as fh:
        writer = Writer(fh, opts.format, opts.print_scores, cfg.nbest, src_dict, tgt_dict, tgt_subword.decode, text_of)
        if progress is not None:
            progress.start()
            task = progress.add_task("generate", total=total, rate="-")
        t0 = time.perf_counter()
        try:
            for chunk in chunks(items, opts.buffer_size):
                empties = sum(1 for it in chunk if len(it.ids) == 0)
                if progress is not None and empties:
                    progress.update(task, advance=empties)
                td = time.perf_counter()
                results = translate_items(
                    loaded.models, chunk, cfg, device, opts.max_tokens, batch_size, src_dict.eos, src_dict.pad, on_batch
                )
                stats.decode_seconds += time.perf_counter() - td
                for it in chunk:
                    hyps = results.get(it.index, [])
                    writer.write(it, hyps)
                    stats.sentences += 1
                    if hyps:
                        stats.translated += 1
                        stats.target_tokens += len(hyps[0].tokens)
                fh.flush()
        finally:
            if progress is not None:
                progress.stop()
    trunc.summary()
    stats.truncated = trunc.count
    stats.total_seconds = time.perf_counter() - t_start
    return stats


def default_max_len_b(data_dir: str) -> int:
    """--max-len-b when not given: 50 (the paper's translation), 300 for a parsing data directory
    (section 6.3: output limit input length + 300; linearized trees are 2-4 tokens per word)."""
    from nmtkit.data.manifest import load_manifest
    from nmtkit.parsing.pipeline import PARSING_MAX_LEN_B

    return PARSING_MAX_LEN_B if load_manifest(data_dir).get("task") == "parsing" else SearchConfig.max_len_b


def _check_output_path(opts: GenerateOptions) -> None:
    """Refuse an --output that would overwrite the input text or a checkpoint being used."""
    if opts.output is None or opts.output == "-":
        return
    out = Path(opts.output)
    if out.is_dir():
        raise UserError(f"--output {out} is a directory; give a file name")
    if not out.exists():
        return
    for flag, p in [("--input", opts.input)] + [("--path", q) for q in opts.paths]:
        if p is not None and p != "-" and Path(p).exists() and os.path.samefile(out, p):
            raise UserError(f"--output {out} is the same file as {flag} {p}; choose another output")


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
