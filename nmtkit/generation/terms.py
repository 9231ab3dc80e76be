"""Terminology as text: phrases to include or avoid and target prefixes -> `Terms` of target ids.

Why apart from the search: the search knows ids only (`nmtkit.search.terms`); what a phrase is
as ids is the target subword model's and dictionary's business, the same for `nmtkit generate`,
`nmtkit serve` and the API, and needs no torch.

- a phrase to include, and a prefix, are segmented as the target side was (the subword model's
  own segmentation): the search must produce exactly those ids;
- a phrase to avoid is blocked in every segmentation into dictionary pieces (a model may spell
  "Hauptbahnhof" as `▁Haupt bahnhof` or `▁Hauptbahn hof`), so no output contains its text as
  those words; capitalised or inflected variants are other phrases;
- every mistake is one UserError naming the sentence (`in.de:3`) and the phrase: an empty
  phrase, a phrase with pieces outside the target dictionary (its output would be `<unk>`), a
  phrase to include, or a prefix, that contains one to avoid.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from nmtkit.errors import UserError
from nmtkit.search.config import Terms

MAX_SEGMENTATIONS = 256  # per avoided phrase: beyond, the phrase is too long to block every spelling of
BPE_JOINER = "@@"  # subword-nmt's mark of a piece continued by the next


class TermMaker:
    """Builds `Terms` from text with a target subword model and dictionary."""

    def __init__(self, subword, dictionary):
        self.subword, self.dict = subword, dictionary
        self._cache: dict[str, list[tuple[int, ...]]] = {}  # avoided phrase -> its spellings (a glossary repeats)

    def make(self, include: Sequence[str] | None, avoid: Sequence[str] | None, prefix: str | None,
             ordered: bool, where: str) -> Terms | None:
        """The Terms of one sentence (None when it has none); `where` names it in errors."""
        inc = tuple(self._ids(p, where, f"constraint {j + 1}") for j, p in enumerate(_phrases(include, where, "constraints")))
        av = tuple(dict.fromkeys(s for j, p in enumerate(_phrases(avoid, where, "avoid"))
                                 for s in self._spellings(p, where, f"avoided phrase {j + 1}")))
        if prefix is not None and not isinstance(prefix, str):
            raise UserError(f"{where}: the prefix must be a string, got {type(prefix).__name__}")
        pre = self._ids(prefix, where, "prefix") if prefix and prefix.strip() else ()
        for what, ids in [(f"constraint {j + 1}", p) for j, p in enumerate(inc)] + [("the prefix", pre)]:
            for a in av:
                if _contains(ids, a):
                    raise UserError(f"{where}: {what} contains an avoided phrase ({' '.join(self.dict.string(a))})")
        terms = Terms(include=inc, ordered=bool(ordered), avoid=av, prefix=pre, where=where)
        return terms if terms else None

    def _ids(self, text: str, where: str, what: str) -> tuple[int, ...]:
        """The ids of `text` as the target side is segmented; unknown pieces refused."""
        if not text.strip():
            raise UserError(f"{where}: {what} is empty")
        pieces = self.subword.encode(text)
        ids = self.dict.encode(pieces)
        unknown = [p for p, i in zip(pieces, ids) if i == self.dict.unk]
        if not pieces or unknown:
            shown = ", ".join(repr(p) for p in dict.fromkeys(unknown[:5])) or repr(text)
            raise UserError(f"{where}: {what} {text!r} has subword(s) {shown} not in the target dictionary "
                            f"({len(self.dict)} symbols): the model cannot produce it")
        return tuple(int(i) for i in ids)

    def _spellings(self, text: str, where: str, what: str) -> list[tuple[int, ...]]:
        """Every id sequence whose pieces spell `text` as the subword model writes it."""
        if not text.strip():
            raise UserError(f"{where}: {what} is empty")
        if text not in self._cache:
            self._cache[text] = self._all_spellings(text, where, what)
        return self._cache[text]

    def _all_spellings(self, text: str, where: str, what: str) -> list[tuple[int, ...]]:
        kind = getattr(self.subword, "kind", "none")
        pieces = self.subword.encode(text)
        if kind == "sentencepiece":
            found = self._splits("".join(pieces), lambda piece, last: piece)
        elif kind == "subword-nmt":  # words as subword-nmt splits them; every piece but a word's last ends in @@
            words = [self._splits(w, lambda piece, last: piece if last else piece + BPE_JOINER) for w in text.split()]
            if math.prod(len(w) for w in words) > MAX_SEGMENTATIONS:
                found = [()] * (MAX_SEGMENTATIONS + 1)  # refused below
            else:
                found = [sum(c, ()) for c in itertools.product(*words)]
        else:
            ids = self.dict.encode(pieces)
            found = [] if any(i == self.dict.unk for i in ids) else [tuple(int(i) for i in ids)]
        if len(found) > MAX_SEGMENTATIONS:
            raise UserError(f"{where}: {what} {text!r} has over {MAX_SEGMENTATIONS} spellings in target subwords; "
                            "avoid shorter phrases")
        return found  # empty: no spelling the model can produce, nothing to block

    def _splits(self, s: str, token) -> list[tuple[int, ...]]:
        """Every split of `s` into dictionary pieces; `token(piece, last)` is a piece's symbol."""
        ways: list[list[tuple[int, ...]]] = [[()]] + [[] for _ in s]
        for j in range(1, len(s) + 1):
            for i in range(j):
                if ways[i]:
                    sym = token(s[i:j], j == len(s))
                    if self.dict.index(sym) > self.dict.unk:  # in the dictionary, not a special symbol
                        ways[j].extend(w + (self.dict.index(sym),) for w in ways[i])
            if len(ways[j]) > MAX_SEGMENTATIONS:
                return ways[j] + [()]  # too many: the caller refuses
        return ways[len(s)]


def _phrases(phrases, where: str, what: str) -> list[str]:
    """A list of strings (None: none), or a UserError naming `where`."""
    if phrases is None:
        return []
    if isinstance(phrases, str) or not all(isinstance(p, str) for p in phrases):
        raise UserError(f"{where}: {what} must be a list of strings (phrases), got {phrases!r:.60}")
    return list(phrases)


def _contains(seq: Sequence[int], part: Sequence[int]) -> bool:
    n = len(part)
    return any(tuple(seq[i:i + n]) == tuple(part) for i in range(len(seq) - n + 1))


def split_line(line: str) -> tuple[str, list[str]]:
    """`nmtkit generate --constraints` input: the source, then tab-separated phrases (fairseq's
    format). An empty field is kept (and refused as an empty constraint), a trailing newline is not."""
    source, *phrases = line.rstrip("\r\n").split("\t")
    return source, phrases
