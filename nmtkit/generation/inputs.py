"""What `nmtkit generate` reads, as `Item`s: raw text (a file or stdin) alone, with the --reference
translations to score, or with its terminology (--constraints, --avoid, --prefix); or a
binarized split of the data directory.

Why apart from the driver: each kind of input has its own files, checks and names for its lines
in messages, and every check that can stop the run is made before the first output is written
(a bad --reference line, a missing subword model). The driver asks once (`read_inputs`) and gets
the same three things whatever the kind: the count (the progress bar's total), the items (lazily:
endless stdin streams) and their truncation counter (the summary of over-long inputs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from nmtkit.errors import UserError
from nmtkit.generation.items import Item, Truncations
from nmtkit.generation.terms import split_line
from nmtkit.generation.translator import Translator
from nmtkit.io import count_lines, read_lines


@dataclass(frozen=True)
class InputSpec:
    """generate's input flags, decided once: raw text, or else a binarized split."""

    text: str | None  # --input: a file, or "-" for stdin; None: the binarized `split`
    split: str | None  # the binarized split (--gen-subset, test when not given); None with raw text
    data_dir: str | None  # DATA_DIR as given, to name the split in messages
    scoring: bool = False  # --score-reference: the items carry their target ids
    reference: str | None = None  # --reference: the raw translations of `text` to score
    constraints: str | None = None  # None, "unordered" or "ordered"
    avoid: str | None = None  # --avoid FILE
    prefix: str | None = None  # --prefix FILE
    source_lang: str | None = None  # a multilingual model's direction (--source-lang, --target-lang)
    target_lang: str | None = None

    @property
    def name(self) -> str:
        """The input in messages: the file, <stdin>, or the split."""
        if self.split is not None:
            return f"split {self.split!r}"
        return "<stdin>" if self.text == "-" else str(self.text)

    def line_name(self, index: int) -> str:
        """Input sentence `index` (0-based) in messages: `news.de:12`, `DATA split 'test', sentence 12`."""
        if self.split is not None:
            return f"{self.data_dir} split {self.split!r}, sentence {index + 1}"
        return f"{self.name}:{index + 1}"

    @property
    def has_terms(self) -> bool:
        return bool(self.constraints or self.avoid or self.prefix)


class Inputs(NamedTuple):
    total: int | None  # items in all, when known without reading them (the progress bar's total)
    items: Iterator[Item]
    truncations: Truncations


def read_inputs(spec: InputSpec, tr: Translator) -> Inputs:
    """The items of `spec`'s raw text or binarized split, every check that needs no model run made.
    A split's items carry their targets when it has a target side of as many sentences
    (`load_direction`); on a multilingual directory its sources start with the target's tag."""
    trunc = tr.truncations(spec.line_name, spec.name)
    if spec.split is None:
        return Inputs(*raw_items(spec, tr, trunc), trunc)
    from nmtkit.data.shards import load_direction  # binarized splits only: raw text needs no shards

    pair = (spec.source_lang, spec.target_lang) if tr.langs else (tr.src_lang, tr.tgt_lang)
    src, tgt = load_direction(tr.data_dir, tr.manifest, spec.split, *pair, tagged=bool(tr.langs))
    if spec.scoring and tgt is None:
        raise UserError(f"--score-reference: split {spec.split!r} of {spec.data_dir} has no target side "
                        f"({tr.tgt_lang}) with as many sentences; score raw text with --input and --reference")
    lead = int(bool(tr.langs))  # the tag before each source
    items = (Item(i, trunc(i, src[i]), None if tgt is None else tgt[i], lead=lead) for i in range(len(src)))
    return Inputs(len(src), items, trunc)


def raw_items(spec: InputSpec, tr: Translator, trunc: Truncations) -> tuple[int | None, Iterator[Item]]:
    """(count, items) of the raw text: alone, with its --reference translations or with its terms.
    The source subword model is loaded first: a missing one is reported before the input is read."""
    if spec.scoring:
        return reference_items(spec, tr, trunc)
    tr.src_subword  # noqa: B018 - load it now
    if spec.has_terms:
        tr.engine.require_terms()  # before any input is read or output written
    return (None if spec.text == "-" else count_lines(spec.text)), text_items(spec, tr, trunc)


def reference_items(spec: InputSpec, tr: Translator, trunc: Truncations) -> tuple[int, Iterator[Item]]:
    """(count, items) of raw sources with their raw translations (--score-reference --reference).

    Every pair is checked before the first is scored (line counts, empty lines, target pieces
    outside the dictionary): a bad line stops the run before anything is written, naming its
    file and line. stdin (--input -) is read into memory for that.
    """
    if tr.task == "parsing":
        raise UserError("--reference: the targets of a parsing data directory are linearized trees; "
                        "score its binarized split (--score-reference without --input)")
    tr.src_subword  # noqa: B018 - load it now: a missing model is reported before the input is read
    source, reference, src_name = spec.text, spec.reference, spec.name
    src_lines = list(read_lines(source)) if source == "-" else None
    n_src = len(src_lines) if src_lines is not None else count_lines(source, exact=True)
    n_ref = count_lines(reference, exact=True)
    if n_src != n_ref:
        raise UserError(f"--reference {reference} has {n_ref} lines but --input {src_name} has {n_src}; "
                        "they must be line-aligned pairs")

    def gen(check: bool) -> Iterator[Item]:
        srcs = iter(src_lines) if src_lines is not None else read_lines(source)
        for i, (s, t) in enumerate(zip(srcs, read_lines(reference))):
            if not s.strip():
                raise UserError(f"{src_name}:{i + 1}: empty source line (every pair needs a source and a target)")
            ids = tr.target_ids(t, f"{reference}:{i + 1}")
            if check:
                continue
            yield Item(i, trunc(i, tr.source_ids(s, tag)), ids, text=s, lead=int(tag is not None))

    for _ in gen(check=True):
        pass
    tag = tr.tag_id(None, "--target-lang")  # gen's: a multilingual model's tag, or None
    return n_src, gen(check=False)


def text_items(spec: InputSpec, tr: Translator, trunc: Truncations) -> Iterator[Item]:
    """Items of the raw text, with their terms when asked for: tab-separated phrases after the
    source (--constraints), the --avoid glossary, and the line's --prefix. A mistake names its
    file and line. Without terms, the first line that holds a tab is warned about: a terminology
    file (SOURCE<TAB>PHRASE...) given without --constraints is translated whole, its phrases as
    source text."""
    where, terms = spec.name, spec.has_terms
    avoid = _glossary(spec.avoid) if spec.avoid else None
    prefixes = read_lines(spec.prefix) if spec.prefix else None
    phrases: deque = deque()  # each line's --constraints phrases, until its item is made

    def sources() -> Iterator[str]:
        warned = terms
        for i, line in enumerate(read_lines(spec.text)):
            if not warned and "\t" in line:
                tr.warn(f"{spec.line_name(i)}: the line holds a tab and is translated whole, as source text; "
                        "if the input is SOURCE<TAB>PHRASE... lines of terms, add --constraints")
                warned = True
            source, fields = split_line(line) if spec.constraints else (line, None)
            if terms:
                phrases.append(fields or None)
            yield source

    for it in tr.items(sources(), trunc):
        if terms:
            pre = None
            if prefixes is not None:
                pre = next(prefixes, None)
                if pre is None:
                    raise UserError(f"--prefix {spec.prefix} has {it.index} lines but --input {where} has more")
            it.terms = tr.terms(phrases.popleft(), avoid, pre, spec.constraints == "ordered", f"{where}:{it.index + 1}")
        yield it
    if prefixes is not None and next(prefixes, None) is not None:
        raise UserError(f"--prefix {spec.prefix} has more lines than --input {where}")


def _glossary(path: str) -> list[str]:
    """--avoid's phrases: one per non-empty line (blank lines are separators, not phrases)."""
    phrases = [line.strip() for line in read_lines(path) if line.strip()]
    if not phrases:
        raise UserError(f"--avoid {path}: no phrase in the file (one phrase per line)")
    return phrases
