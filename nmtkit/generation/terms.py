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

from collections.abc import Sequence

from nmtkit.data.subwords import BPE_SEPARATOR
from nmtkit.errors import UserError
from nmtkit.search.config import Avoided, Terms


class TermMaker:
    """Builds `Terms` from text with a target subword model and dictionary."""

    def __init__(self, subword, dictionary):
        self.subword, self.dict = subword, dictionary
        self._cache: dict[str, Avoided | None] = {}  # avoided phrase -> its spellings (a glossary repeats)
        self._longest = max(map(len, dictionary.symbols), default=0)  # no piece spells more characters

    def make(self, include: Sequence[str] | None, avoid: Sequence[str] | None, prefix: str | None,
             ordered: bool, where: str) -> Terms | None:
        """The Terms of one sentence (None when it has none); `where` names it in errors."""
        inc = tuple(self._ids(p, where, f"constraint {j + 1}") for j, p in enumerate(_phrases(include, where, "constraints")))
        named = [(p, self._spellings(p, where, f"avoided phrase {j + 1}"))
                 for j, p in enumerate(_phrases(avoid, where, "avoid"))]
        av = tuple(dict.fromkeys(g for _, g in named if g is not None))
        if prefix is not None and not isinstance(prefix, str):
            raise UserError(f"{where}: the prefix must be a string, got {type(prefix).__name__}")
        pre = self._ids(prefix, where, "prefix") if prefix and prefix.strip() else ()
        for what, ids in [(f"constraint {j + 1}", p) for j, p in enumerate(inc)] + [("the prefix", pre)]:
            for text, a in named:
                if a is not None and a.found_in(ids):
                    raise UserError(f"{where}: {what} contains an avoided phrase ({text!r})")
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

    def _spellings(self, text: str, where: str, what: str) -> Avoided | None:
        """Every id sequence whose pieces spell `text` as the subword model writes it, as a graph
        (None: no spelling the model can produce, nothing to block)."""
        if not text.strip():
            raise UserError(f"{where}: {what} is empty")
        if text not in self._cache:
            self._cache[text] = self._graph(text)
        return self._cache[text]

    def _graph(self, text: str) -> Avoided | None:
        kind = getattr(self.subword, "kind", "none")
        if kind == "sentencepiece":  # one string: the pieces joined, word starts marked by ▁
            words = ["".join(self.subword.encode(text))]
        elif kind == "subword-nmt":  # each word on its own; every piece but a word's last ends in @@
            # the words as the subword model sees them: after the data directory's Moses step, if
            # it has one (`station's` -> `station &apos;s`)
            words = getattr(self.subword, "tokenize", lambda line: line)(text).split()
        else:
            ids = self.dict.encode(self.subword.encode(text))
            return None if any(i == self.dict.unk for i in ids) else Avoided.sequence(ids)
        edges, offset = [], 0
        for w in words:
            for i in range(len(w)):
                for j in range(i + 1, min(i + self._longest, len(w)) + 1):  # linear in the phrase, not cubic
                    sym = w[i:j] if kind == "sentencepiece" or j == len(w) else w[i:j] + BPE_SEPARATOR
                    v = self.dict.index(sym)
                    if v > self.dict.unk:  # in the dictionary, not a special symbol
                        edges.append((offset + i, offset + j, int(v)))
            offset += len(w)
        return _on_paths(edges, offset)


def _on_paths(edges: list[tuple[int, int, int]], end: int) -> Avoided | None:
    """The edges on some path from 0 to `end` (None when there is none)."""
    fwd, back = {0}, {end}
    for i, j, _ in sorted(edges):
        if i in fwd:
            fwd.add(j)
    for i, j, _ in sorted(edges, key=lambda e: -e[1]):
        if j in back:
            back.add(i)
    kept = tuple(e for e in sorted(edges) if e[0] in fwd and e[1] in back)
    return Avoided(end, kept) if end in fwd else None


def _phrases(phrases, where: str, what: str) -> list[str]:
    """A list of strings (None: none), or a UserError naming `where`."""
    if phrases is None:
        return []
    if isinstance(phrases, str) or not all(isinstance(p, str) for p in phrases):
        raise UserError(f"{where}: {what} must be a list of strings (phrases), got {phrases!r:.60}")
    return list(phrases)


def split_line(line: str) -> tuple[str, list[str]]:
    """`nmtkit generate --constraints` input: the source, then tab-separated phrases (fairseq's
    format). An empty field is kept (and refused as an empty constraint), a trailing newline is not."""
    source, *phrases = line.rstrip("\r\n").split("\t")
    return source, phrases
