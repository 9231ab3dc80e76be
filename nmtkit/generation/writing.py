"""What `nmtkit generate` shows: each input's hypotheses as output lines, plain or fairseq's
S-/T-/H-/D-/P-(/A-) lines (`Writer`); on stderr a progress bar while it runs (`Progress`) and the
summary line after (`GenerateStats.line`).

Why apart from the driver: none of this decides what is translated or how. A format is a pure
function of one input and its hypotheses, the same whether the lines go to a file (atomically)
or to stdout and whatever produced the hypotheses (a search, or forced decoding with
--score-reference); the bar and the summary only watch the run (--quiet leaves both out).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from nmtkit.generation.items import Item
from nmtkit.generation.translator import Translator
from nmtkit.search.config import Hypothesis

FORMATS = ("plain", "fairseq")


def _fmt(x: float) -> str:
    return "-inf" if x == -math.inf else f"{x:.6f}"


def _formatted(alignments: list[list[tuple[int, int]]] | None) -> list[str]:
    """Each hypothesis's alignment as Pharaoh text (`0-0 1-2`); forced decoding's module is
    imported only by a run that asked for alignments."""
    if not alignments:
        return []
    from nmtkit.forced import format_alignment

    return [format_alignment(a) for a in alignments]


def output_text(tr: Translator, split: str | None, total: int | None) -> Callable[[Item, list[str]], str] | None:
    """(item, pieces) -> output text instead of detokenization, or None: on a parsing data
    directory one bracketed tree per input line (docs/parsing.md), of the raw line's words or of
    the binarized `split`'s kept words (its `total` sentences)."""
    if tr.task != "parsing":
        return None
    from nmtkit.parsing.pipeline import tree_writer

    return tree_writer(tr.data_dir, tr.manifest, split, total, tr.src_dict, tr.src_lang)


class Writer:
    """Formats one input's hypotheses: plain lines, or fairseq's S-/T-/H-/D-/P-(/A-) lines.

    With `score_reference` the one "hypothesis" is the given translation and plain lines are
    `SCORE<TAB>LOGPROB<TAB>TOKENS` (per-token log-probs added with print_scores). Alignments,
    when given to `lines`, are one list of (source, target) pairs per hypothesis.
    """

    def __init__(self, tr: Translator, fmt: str, *, print_scores: bool = False, score_reference: bool = False,
                 print_alignment: bool = False, text_of: Callable[[Item, list[str]], str] | None = None):
        self.fmt, self.print_scores, self.nbest = fmt, print_scores, tr.search.nbest
        self.src_dict, self.tgt_dict, self.detok = tr.src_dict, tr.tgt_dict, tr.tgt_subword.decode
        self.text_of = text_of  # (item, pieces) -> output text, instead of detok (parsing: a tree)
        self.score_reference, self.print_alignment = score_reference, print_alignment

    def write(self, fh, done: list[tuple[Item, list[Hypothesis], list | None]], stats: GenerateStats) -> None:
        """Write these inputs' lines (already in input order; `InOrder`), count them in `stats`,
        and flush, so that a pipe sees them now."""
        if not done:
            return
        for it, hyps, aligns in done:
            fh.write(self.lines(it, hyps, aligns))
            stats.count(hyps)
        fh.flush()

    def _text(self, item: Item, pieces: list[str]) -> str:
        return self.detok(pieces) if self.text_of is None else self.text_of(item, pieces)

    def lines(self, item: Item, hyps: list[Hypothesis], alignments: list[list[tuple[int, int]]] | None = None) -> str:
        """The output lines of one input, each ended by a newline."""
        out = []
        aligned = _formatted(alignments)
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
            out.append(f"S-{i}\t{' '.join(self.src_dict.string(item.ids[item.lead:]))}")
            if item.target_ids is not None:
                out.append(f"T-{i}\t{self._text(item, self.tgt_dict.string(item.target_ids))}")
            for j, h in enumerate(hyps):
                pieces = self.tgt_dict.string(h.tokens)
                out.append(f"H-{i}\t{_fmt(h.score)}\t{' '.join(pieces)}")
                out.append(f"D-{i}\t{_fmt(h.score)}\t{self._text(item, pieces)}")
                out.append(f"P-{i}\t{' '.join(f'{p:.4f}' for p in h.positional_scores)}")
                if self.print_alignment:
                    out.append(f"A-{i}\t{aligned[j] if j < len(aligned) else ''}")
        return "".join(line.replace("\n", " ") + "\n" for line in out)


# ---------------------------------------------------------------------------------------------
# stderr


@dataclass
class GenerateStats:
    """What the summary line reports: counted as each input is written, timed by the driver."""

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


def _bar(enabled: bool, total: int | None):
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


class Progress:
    """The rich bar on stderr (sentences, rate, ETA) when asked for and stderr is a terminal."""

    def __init__(self, enabled: bool, total: int | None):
        self.bar = _bar(enabled and sys.stderr.isatty(), total)
        self.total, self.task, self.t0 = total, None, time.perf_counter()

    def __enter__(self) -> Progress:
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
