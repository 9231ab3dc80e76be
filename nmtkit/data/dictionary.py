"""`Dictionary`: the mapping between tokens and the integer ids that shards and models use.

Why a class of our own rather than the subword library's vocabulary: the model needs the special
symbols at fixed ids (docs/internals.md: <pad>=0, <s>=1, </s>=2, <unk>=3), the vocabulary must be
cut by frequency and padded to a multiple of 8 for tensor cores (fairseq's `--nwords*`,
`--threshold*`, `--padding-factor`), and the same code must serve sentencepiece pieces,
subword-nmt units and plain whitespace tokens alike.

File format (fairseq's): one `token count` per line, most frequent first, specials not written
(they are implied, always at ids 0-3). Token ids are line numbers + 3 (line 1 is id 4).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from nmtkit.errors import UserError
from nmtkit.io import atomic_write

PAD_WORD, BOS_WORD, EOS_WORD, UNK_WORD = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD_WORD, BOS_WORD, EOS_WORD, UNK_WORD)  # ids 0, 1, 2, 3
NSPECIAL = len(SPECIALS)
MADEUP_FORMAT = "madeupword{:04d}"  # fairseq's filler for --pad-to-multiple


class Dictionary:
    """Tokens <-> ids with the four special symbols first; build, cut, pad, save and load."""

    def __init__(self) -> None:
        self.symbols: list[str] = list(SPECIALS)
        self.counts: list[int] = [0] * NSPECIAL
        self._index: dict[str, int] = {s: i for i, s in enumerate(SPECIALS)}

    # ---- the special symbols -------------------------------------------------------------------
    # Their ids are their places in SPECIALS, the same in every dictionary (shards and models rely on them).
    pad, bos, eos, unk = range(NSPECIAL)

    # ---- lookups -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, token: str) -> bool:
        return token in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dictionary) and self.symbols == other.symbols and self.counts == other.counts

    def __getitem__(self, idx: int) -> str:
        return self.symbols[idx]

    def index(self, token: str) -> int:
        """Id of `token`; <unk> for unknown tokens.

        A literal "<pad>", "<s>" or "</s>" in the text also maps to <unk>: those ids have a
        structural meaning (padding, sentence boundaries) that text must never be able to fake.
        """
        i = self._index.get(token, self.unk)
        return self.unk if i < self.unk else i

    def encode(self, tokens: list[str]) -> np.ndarray:
        """Ids of `tokens` as an int64 array, without </s> (shards store sentences without it)."""
        return np.fromiter((self.index(t) for t in tokens), dtype=np.int64, count=len(tokens))

    def string(self, ids: Iterable[int]) -> list[str]:
        """Tokens of `ids`, dropping <pad>, <s> and </s>; <unk> stays visible as "<unk>"."""
        syms = self.symbols
        return [syms[i] for i in (int(x) for x in ids) if i > self.eos]

    # ---- building --------------------------------------------------------------------------------
    def add_symbol(self, token: str, count: int = 0) -> int:
        """Append `token` (or add to its count) and return its id."""
        i = self._index.get(token)
        if i is not None:
            self.counts[i] += count
            return i
        i = len(self.symbols)
        self._index[token] = i
        self.symbols.append(token)
        self.counts.append(count)
        return i

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, int] | Iterable[tuple[str, int]],
        *,
        nwords: int = -1,
        threshold: int = 0,
        pad_to_multiple: int = 1,
    ) -> "Dictionary":
        """Build a dictionary from token counts, exactly as fairseq's `Dictionary.finalize` does.

        Order: count descending, ties alphabetical. `nwords` (<= 0: no limit) is the maximum size
        *including* the 4 specials; tokens seen fewer than `threshold` times are left out (they
        become <unk>). Then `madeupwordNNNN` entries with count 0 pad the size to a multiple of
        `pad_to_multiple`. Counts for the special symbols themselves are ignored.
        """
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        items = counts.items() if isinstance(counts, Mapping) else counts
        merged: dict[str, int] = {}
        for tok, c in items:
            if tok in SPECIALS:
                continue
            merged[tok] = merged.get(tok, 0) + int(c)
        # sorted() by (-count, token): count descending, alphabetical among equal counts.
        ordered = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))
        limit = len(ordered) if nwords <= 0 else max(0, nwords - NSPECIAL)
        d = cls()
        for tok, c in ordered[:limit]:
            if c < threshold:
                break  # sorted by count: everything after is rarer still
            d.add_symbol(tok, c)
        d.pad_to_multiple_(pad_to_multiple)
        return d

    def pad_to_multiple_(self, multiple: int) -> None:
        """Append count-0 `madeupwordNNNN` symbols until len(self) % multiple == 0 (fairseq)."""
        i = 0
        while multiple > 1 and len(self) % multiple != 0:
            tok = MADEUP_FORMAT.format(i)
            i += 1
            if tok not in self._index:
                self.add_symbol(tok, 0)

    # ---- files -----------------------------------------------------------------------------------
    def to_text(self) -> str:
        """The file contents: `token count` per line, without the specials."""
        return "".join(f"{t} {c}\n" for t, c in zip(self.symbols[NSPECIAL:], self.counts[NSPECIAL:]))

    @property
    def sha256(self) -> str:
        """sha256 of the file that `save` writes (and that `load` read), as hex."""
        return hashlib.sha256(self.to_text().encode("utf-8")).hexdigest()

    def save(self, path: str | os.PathLike) -> str:
        """Write atomically; return the file's sha256."""
        text = self.to_text()
        with atomic_write(path, "w") as fh:
            fh.write(text)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Dictionary":
        """Read a `token count` file; a malformed line is a UserError naming file:line."""
        path = Path(path)
        try:
            if not path.is_file():
                raise UserError(f"dictionary not found: {path}")
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{path}: invalid UTF-8 at byte {e.start}") from None
        except OSError as e:  # a name too long, a folder without permission: is_file() raises those
            raise UserError(f"{path}: cannot read the dictionary: {e.strerror or e}") from None
        d = cls()
        lines = text.split("\n")
        if not lines[-1]:
            lines.pop()  # the empty string after the final newline
        for lineno, line in enumerate(lines, start=1):
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                raise UserError(f"{path}:{lineno}: empty line in dictionary (expected 'token count')")
            tok, sep, cnt = line.rpartition(" ")
            count = _count(cnt)
            if not sep or not tok or count is None:
                raise UserError(f"{path}:{lineno}: malformed dictionary line {line[:60]!r} (expected 'token count')")
            if tok in d._index:
                what = "special symbol" if tok in SPECIALS else "duplicate token"
                raise UserError(f"{path}:{lineno}: {what} {tok!r} (specials are implied, not listed)")
            d.add_symbol(tok, count)
        return d


def _count(text: str) -> int | None:
    """The count of a dictionary line, or None unless it is ASCII digits that Python converts
    (str.isdigit alone accepts "²", which int() refuses, and "٣", which `save` would not write
    back; int() refuses more digits than sys.get_int_max_str_digits())."""
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:
        return None
