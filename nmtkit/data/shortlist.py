"""Lexical shortlists: the target pieces a batch's translations may use, given its source pieces.

Why: the output layer (d_model x V) and its softmax are a large part of each decoding step. A
translation uses few of the V target pieces, and which ones is well predicted by the source's
pieces, so the search can score only the union of the candidates of the batch's source pieces
(vocabulary selection: Marian's `--shortlist`, Sockeye's `--restrict-lexicon`, CTranslate2's
`vmap`). This module is the data side: the file, its parser (`Shortlist`), and the builder
(`build`, `write`) that `nmtkit shortlist` runs on a data directory's training split.

The file is CTranslate2's vocabulary map (`vmap.txt`), so that one file serves every engine:
UTF-8 text, one rule per line, `SOURCE<TAB>TARGET1 TARGET2 ...`. SOURCE is one source piece or an
n-gram of pieces joined by single spaces; an empty SOURCE lists targets that are always
candidates. The candidates of a batch (CTranslate2's `VocabularyMap::get_candidates`) are
<unk>, <s>, </s>, the always-list, and for every sentence, position i and n up to the longest
key, the targets of the n-gram starting at i when it is a key. nmtkit adds <pad> (id 0, which the
search bans anyway) so that the four special ids 0..3 are always candidates.

nmtkit reads the file more strictly than CTranslate2, which maps an unknown piece to <unk>, lets
a later line replace an earlier one and reads a line without a tab as an always-list: each of
those, and every other malformed line, is one UserError naming the file and line.

The builder is IBM Model 1 (Brown et al., 1993) trained by EM on the training split: per source
piece its `best` most likely target pieces, the piece itself where it is also a target piece
(names, numbers, joint vocabularies), and the `frequent` most frequent target pieces as the
always-list. Why IBM-1 rather than a model's attention: no model is needed, so the shortlist is
built once per data directory and serves the teacher and every student trained on it alike; it is
deterministic and takes minutes where alignment with a model takes a decoding pass.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmtkit.data.dictionary import NSPECIAL, Dictionary
from nmtkit.data.languages import is_tag, pairs_of, split_name
from nmtkit.data.shards import ShardedDataset, load_split
from nmtkit.errors import UserError
from nmtkit.io import atomic_write

# Defaults of the builder. Marian's documented shortlist is `lex.s2t 100 100` (the 100 most
# frequent targets, and the 100 best per source word from fast_align's table) and CTranslate2's
# vmap is usually built the same way; nmtkit's subword vocabularies are small (8k-32k pieces),
# so fewer per source piece keep the candidate sets small. To be tuned by measurement.
BEST = 50  # target pieces kept per source piece, by p(t|s) (docs/generate.md: chosen by measurement)
FREQUENT = 100  # most frequent target pieces, always candidates
ITERATIONS = 5  # EM rounds of IBM Model 1
# EM leaves a little mass on every target piece that ever shared a sentence with s; below this
# a "translation" is noise from one co-occurrence, not evidence, and would only widen the sets.
MIN_PROB = 1e-4
DEFAULT_NAME = "shortlist.txt"  # in the data directory, beside the model's vocabulary
CHUNK_PAIRS = 10_000_000  # (source, target) token pairs per E-step chunk: ~0.5 GB of temporaries

EXPECTED = "expected SOURCE<TAB>TARGET1 TARGET2 ... (an empty SOURCE lists the always-candidates)"
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # Unicode's Cc, but the tab (the separator)

Progress = Callable[[str, int, int], None]  # (what, sentences done, sentences in all)


# ---------------------------------------------------------------------------------------------
# the file
# ---------------------------------------------------------------------------------------------


def _unique(ids: np.ndarray) -> np.ndarray:
    """Sorted unique values of an integer array. A sort and a mask: numpy 2's np.unique hashes
    integers first, 7x slower on a batch's ids and 60x on millions of distinct (s, t) keys."""
    ids = np.sort(ids)
    return ids[np.r_[True, ids[1:] != ids[:-1]]] if len(ids) else ids


def _shown(text: str) -> str:
    """`text` quoted for a one-line message, shortened past 60 characters."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _pieces(text: str, what: str) -> list[str]:
    """The space-separated pieces of `text`; ValueError (the message's end) on an empty piece."""
    pieces = text.split(" ")
    if "" in pieces:
        raise ValueError(f"empty {what} piece (two spaces in a row, or a space at an end); "
                         "expected pieces separated by single spaces")
    return pieces


def _ids(pieces: list[str], d: Dictionary, side: str) -> list[int]:
    """Ids of `pieces` in `d`; ValueError naming the first piece it lacks (never <unk> for it)."""
    for p in pieces:
        if p not in d:
            raise ValueError(f"{side} piece {_shown(p)} is not in the {side} dictionary")
    return [d._index[p] for p in pieces]


def parse_line(line: str, src_dict: Dictionary, tgt_dict: Dictionary) -> tuple[tuple[int, ...], list[int]]:
    """One rule: (source ids, () for the always-list; target ids). ValueError saying what is
    wrong with the line and what was expected."""
    if not line:
        raise ValueError(f"empty line; {EXPECTED}")
    bad = _CONTROL.search(line)
    if bad is not None:
        if bad.group() == "\r":
            raise ValueError("carriage return in the line (a Windows line end?); expected LF line ends")
        raise ValueError(f"control character {bad.group()!r} at column {bad.start() + 1}; "
                         "pieces hold no control characters")
    tabs = line.count("\t")
    if tabs != 1:
        raise ValueError(f"{'no tab' if tabs == 0 else f'{tabs} tabs'} in the line; {EXPECTED}")
    source, targets = line.split("\t")
    if not targets:
        raise ValueError("no target pieces after the tab; expected at least one")
    key = tuple(_ids(_pieces(source, "source"), src_dict, "source")) if source else ()
    return key, _ids(_pieces(targets, "target"), tgt_dict, "target")


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}:{line}: invalid UTF-8 (byte 0x{data[e.start]:02x}); "
                        "expected a UTF-8 text file") from None


def _read(path: Path) -> bytes:
    try:
        if path.is_dir():
            raise UserError(f"{path}: is a directory; expected a shortlist file")
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: shortlist file not found") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read the shortlist: {e.strerror or e}") from None


def parse(path: Path, data: bytes, src_dict: Dictionary, tgt_dict: Dictionary) -> dict[tuple[int, ...], list[int]]:
    """The rules of a shortlist file's bytes: source ids -> target ids, in the file's order.
    UserError `PATH:LINE: ...` on the first line at fault; blank lines may only end the file."""
    lines = _decode(path, data).split("\n")
    while lines and not lines[-1]:
        lines.pop()  # the final newline, and blank lines at the end
    rules: dict[tuple[int, ...], list[int]] = {}
    first: dict[tuple[int, ...], int] = {}
    for lineno, line in enumerate(lines, start=1):
        try:
            key, targets = parse_line(line, src_dict, tgt_dict)
        except ValueError as e:
            raise UserError(f"{path}:{lineno}: {e}") from None
        if key in rules:
            source = line.partition("\t")[0]
            what = f"source {_shown(source)}" if key else "the always-list (empty source)"
            raise UserError(f"{path}:{lineno}: {what} repeated (first at line {first[key]}); "
                            "expected one line per source")
        rules[key], first[key] = targets, lineno
    if not rules:
        raise UserError(f"{path}:1: empty file (no rules); {EXPECTED}")
    return rules


class Shortlist:
    """A loaded shortlist: the candidate target ids of a batch of source sentences.

    Unigram keys sit in a CSR table over source ids (`_offsets`, `_values`: the targets of id s
    are `_values[_offsets[s]:_offsets[s + 1]]`), so that a batch's candidates are one gather, one
    concatenation and one sort; longer keys (rare) in a dict of id tuples."""

    def __init__(self, path: Path, sha256: str, rules: dict[tuple[int, ...], list[int]], n_src: int, n_tgt: int):
        self.path, self.sha256 = path, sha256
        self._n_src, self._n_tgt, self._len = n_src, n_tgt, len(rules)
        self._fixed = _unique(np.array([*range(NSPECIAL), *rules.get((), [])], dtype=np.int64))
        lengths = np.zeros(n_src, dtype=np.int64)
        unigrams = sorted(((k[0], _unique(np.asarray(v, dtype=np.int64))) for k, v in rules.items() if len(k) == 1),
                          key=lambda rule: rule[0])
        for s, targets in unigrams:
            lengths[s] = len(targets)
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self._values = np.concatenate([t for _, t in unigrams]) if unigrams else np.zeros(0, np.int64)
        self._ngrams = {k: np.asarray(v, dtype=np.int64) for k, v in rules.items() if len(k) > 1}
        self._max_ngram = max((len(k) for k in rules), default=0)

    @classmethod
    def load(cls, path: str | os.PathLike, src_dict: Dictionary, tgt_dict: Dictionary) -> "Shortlist":
        """Read a shortlist file for a model's dictionaries; UserError `FILE:LINE: ...` on a bad one."""
        path = Path(path)
        data = _read(path)
        rules = parse(path, data, src_dict, tgt_dict)
        return cls(path, hashlib.sha256(data).hexdigest(), rules, len(src_dict), len(tgt_dict))

    @property
    def max_ngram(self) -> int:
        """The longest source key, in pieces (0 when the file holds only the always-list)."""
        return self._max_ngram

    def __len__(self) -> int:
        """The number of keys (lines), the always-list's included."""
        return self._len

    def candidates(self, sources: Sequence[np.ndarray], extra: Iterable[int] = ()) -> np.ndarray:
        """Sorted unique int64 target ids that a batch may output: ids 0..3, the always-list, the
        targets of every key found in `sources` (1-D arrays of source ids, without </s>) and
        `extra` (target ids the search must be able to produce: a forced prefix, constraints)."""
        rows = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sources]
        flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        more = np.fromiter(extra, dtype=np.int64)
        _check_ids(flat, self._n_src, "source")
        _check_ids(more, self._n_tgt, "target")
        parts = [self._fixed, self._unigram_targets(_unique(flat)), more]
        if self._ngrams:
            parts += self._ngram_targets(rows)
        return _unique(np.concatenate(parts))

    def _unigram_targets(self, ids: np.ndarray) -> np.ndarray:
        """(sum of the lengths,) the CSR rows of `ids` gathered in one go."""
        starts = self._offsets[ids]
        lengths = self._offsets[ids + 1] - starts
        ends = np.cumsum(lengths)
        # position k of the output belongs to row r: it is starts[r] + (k - (ends[r] - lengths[r]))
        return self._values[np.repeat(starts - ends + lengths, lengths) + np.arange(ends[-1] if len(ends) else 0)]

    def _ngram_targets(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        found = []
        for row in rows:
            for n in range(2, min(self._max_ngram, len(row)) + 1):
                windows = np.lib.stride_tricks.sliding_window_view(row, n)  # (len - n + 1, n)
                found += [hit for w in windows.tolist() if (hit := self._ngrams.get(tuple(w))) is not None]
        return found


def _check_ids(ids: np.ndarray, size: int, side: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= size):
        raise ValueError(f"{side} ids must lie in 0..{size - 1} (the {side} dictionary), got {ids.min()}..{ids.max()}")


def writable(piece: str) -> bool:
    """True when `piece` can stand in a shortlist line: not empty, no space, tab or control
    character (a dictionary read from a `token count` file may hold any of those but a newline)."""
    return bool(piece) and " " not in piece and _CONTROL.search(piece) is None and "\t" not in piece


def write(path: str | os.PathLike, rules: dict[str, list[str]]) -> None:
    """Write `rules` (source -> target pieces; "" the always-list) as a shortlist file, atomically:
    the always-list first, then the other keys in the dict's order (`build`'s: the source
    dictionary's)."""
    if not rules:
        raise ValueError("no rules to write: a shortlist file holds at least one")
    for key, targets in rules.items():
        pieces = [*(key.split(" ") if key else []), *targets]
        if not targets or not all(map(writable, pieces)):
            raise ValueError(f"rule {key!r} -> {targets!r} cannot be written as a shortlist line")
    keys = ([""] if "" in rules else []) + [k for k in rules if k]
    with atomic_write(path, "w") as fh:
        for key in keys:
            fh.write(f"{key}\t{' '.join(rules[key])}\n")


# ---------------------------------------------------------------------------------------------
# IBM Model 1
# ---------------------------------------------------------------------------------------------


@dataclass
class TranslationTable:
    """IBM Model 1's p(t|s) over the (s, t) pairs that share a sentence pair.

    `keys`: sorted unique int64 `s * n_tgt + t`, s = `null` (the number of source ids) being the
    NULL source word; `prob`: p(t|s) of each key; `source_counts` (null,) and `target_counts`
    (n_tgt,): the occurrences of each id in the sentence pairs used."""

    keys: np.ndarray
    prob: np.ndarray
    n_tgt: int
    null: int
    source_counts: np.ndarray
    target_counts: np.ndarray


def _lengths(rows: Sequence[np.ndarray]) -> np.ndarray:
    """Sentence lengths: a ShardedDataset's from its indexes, any other sequence's by len()."""
    sizes = getattr(rows, "sizes", None)
    if sizes is not None:
        return np.asarray(sizes, dtype=np.int64)
    return np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))


def _chunks(pairs: np.ndarray, chunk_pairs: int) -> list[tuple[int, int]]:
    """Consecutive sentence ranges [a, b) of at most `chunk_pairs` token pairs each (`pairs`: per
    sentence), or of one sentence when it alone has more."""
    ends = np.cumsum(pairs)
    bounds = [0]
    while bounds[-1] < len(pairs):
        a = bounds[-1]
        done = int(ends[a - 1]) if a else 0
        bounds.append(max(a + 1, int(np.searchsorted(ends, done + chunk_pairs, side="right"))))
    return list(zip(bounds[:-1], bounds[1:]))


@dataclass
class _Chunk:
    """A range of sentence pairs (both sides non-empty), the NULL word before each source."""

    src: np.ndarray  # (source tokens + sentences,) source ids, each sentence led by NULL
    src_lens: np.ndarray  # (sentences,) lengths with NULL
    tgt: np.ndarray  # (target tokens,)
    tgt_lens: np.ndarray  # (sentences,)

    def pairs(self, n_tgt: int) -> tuple[np.ndarray, np.ndarray]:
        """Every (s, t) of each sentence pair, all of s's positions times all of t's: the keys
        `s * n_tgt + t` (P,) and the target positions (P,) they belong to."""
        reps = np.repeat(self.tgt_lens, self.src_lens)  # (source tokens,) the targets each one meets
        ends = np.cumsum(reps)
        first = np.repeat(np.cumsum(self.tgt_lens) - self.tgt_lens, self.src_lens)  # (source tokens,)
        # pair k of source token u is target position first[u] + (k - (ends[u] - reps[u]))
        pos = np.repeat(first - ends + reps, reps) + np.arange(ends[-1] if len(ends) else 0)  # (P,)
        return np.repeat(self.src * n_tgt, reps) + self.tgt[pos], pos


def _read_chunk(src_rows, tgt_rows, a: int, b: int, kept: np.ndarray, null: int) -> _Chunk:
    idx = [i for i in range(a, b) if kept[i]]
    srcs = [np.asarray(src_rows[i], dtype=np.int64) for i in idx]
    tgts = [np.asarray(tgt_rows[i], dtype=np.int64) for i in idx]
    src_lens = np.array([len(s) for s in srcs], dtype=np.int64)
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    starts = np.cumsum(src_lens) - src_lens
    tgt = np.concatenate(tgts) if tgts else np.zeros(0, np.int64)
    return _Chunk(np.insert(src, starts, null), src_lens + 1, tgt, np.array([len(t) for t in tgts], dtype=np.int64))


def _expected_counts(chunk: _Chunk, keys: np.ndarray, prob: np.ndarray, n_tgt: int) -> np.ndarray:
    """E-step on one chunk: (len(keys),) the posterior mass of each (s, t), summed over the chunk:
    each target token's unit is shared among its sentence's source words (NULL included) in
    proportion to p(t|s)."""
    pair_keys, pos = chunk.pairs(n_tgt)
    idx = np.searchsorted(keys, pair_keys)  # (P,)
    p = prob[idx]
    denom = np.bincount(pos, weights=p, minlength=len(chunk.tgt))  # (target tokens,)
    return np.bincount(idx, weights=p / denom[pos], minlength=len(keys))


def _cooccurring(src_rows, tgt_rows, ranges, kept, null, n_tgt, progress) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted unique keys of every (s, t) sharing a sentence pair; the source and target counts."""
    found: list[np.ndarray] = []
    keys = np.zeros(0, np.int64)
    src_counts, tgt_counts = np.zeros(null + 1, np.int64), np.zeros(n_tgt, np.int64)
    for a, b in ranges:
        chunk = _read_chunk(src_rows, tgt_rows, a, b, kept, null)
        found.append(_unique(chunk.pairs(n_tgt)[0]))
        src_counts += np.bincount(chunk.src, minlength=null + 1)
        tgt_counts += np.bincount(chunk.tgt, minlength=n_tgt)
        if sum(len(f) for f in found) > max(len(keys), CHUNK_PAIRS):  # merged when it pays
            keys, found = _unique(np.concatenate([keys, *found])), []
        _report(progress, "pairs", b, len(kept))
    return _unique(np.concatenate([keys, *found])), src_counts[:null], tgt_counts


def _report(progress: Progress | None, what: str, done: int, total: int) -> None:
    if progress is not None:
        progress(what, done, total)


def translation_table(src_rows: Sequence[np.ndarray], tgt_rows: Sequence[np.ndarray], n_src: int, n_tgt: int, *,
                      iterations: int = ITERATIONS, chunk_pairs: int = CHUNK_PAIRS,
                      progress: Progress | None = None) -> TranslationTable:
    """IBM Model 1 with a NULL source word, `iterations` EM rounds from a uniform p(t|s).

    Sentence pairs with an empty side are skipped. The corpus is read in chunks of about
    `chunk_pairs` token pairs (memory stays bounded); the table holds co-occurring pairs only."""
    if len(src_rows) != len(tgt_rows):
        raise ValueError(f"{len(src_rows)} source sentences but {len(tgt_rows)} target sentences")
    src_lens, tgt_lens = _lengths(src_rows), _lengths(tgt_rows)
    kept = (src_lens > 0) & (tgt_lens > 0)
    ranges = _chunks(np.where(kept, (src_lens + 1) * tgt_lens, 0), chunk_pairs)
    keys, src_counts, tgt_counts = _cooccurring(src_rows, tgt_rows, ranges, kept, n_src, n_tgt, progress)
    prob = np.full(len(keys), 1.0 / n_tgt)  # uniform start
    of_source = keys // n_tgt
    for it in range(iterations):
        expected = np.zeros(len(keys))
        for a, b in ranges:
            expected += _expected_counts(_read_chunk(src_rows, tgt_rows, a, b, kept, n_src), keys, prob, n_tgt)
            _report(progress, f"EM round {it + 1}/{iterations}", b, len(kept))
        totals = np.bincount(of_source, weights=expected, minlength=n_src + 1)[of_source]  # M-step
        prob = np.divide(expected, totals, out=np.zeros_like(expected), where=totals > 0)
    return TranslationTable(keys, prob, n_tgt, n_src, src_counts, tgt_counts)


# ---------------------------------------------------------------------------------------------
# the rules
# ---------------------------------------------------------------------------------------------


def allowed_targets(tgt_dict: Dictionary) -> np.ndarray:
    """(len(tgt_dict),) bool: the target pieces a shortlist lists. Not the special symbols (always
    candidates), not language tags (never outputs), not what a line cannot hold."""
    return np.array([i >= NSPECIAL and not is_tag(p) and writable(p) for i, p in enumerate(tgt_dict.symbols)],
                    dtype=bool)


def best_targets(table: TranslationTable, allowed: np.ndarray, best: int) -> dict[int, np.ndarray]:
    """Per source id (NULL left out): its `best` allowed targets by p(t|s) descending, ties by
    target id, p(t|s) >= MIN_PROB."""
    s, t = table.keys // table.n_tgt, table.keys % table.n_tgt
    keep = allowed[t] & (table.prob >= MIN_PROB) & (s != table.null)
    s, t, p = s[keep], t[keep], table.prob[keep]
    order = np.lexsort((t, -p, s))  # by source, then probability descending, then target id
    s, t = s[order], t[order]
    rank = np.arange(len(s)) - np.searchsorted(s, s)  # place within its source's run
    s, t = s[rank < best], t[rank < best]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.zeros(0, np.int64)
    return {int(s[a]): t[a:b] for a, b in zip(starts, [*starts[1:], len(s)])}


def frequent_targets(counts: np.ndarray, allowed: np.ndarray, frequent: int) -> np.ndarray:
    """The `frequent` allowed target ids seen most often (count descending, ties by id)."""
    ids = np.flatnonzero(allowed & (counts > 0))
    return ids[np.lexsort((ids, -counts[ids]))][:frequent]


def build(src_rows: Sequence[np.ndarray], tgt_rows: Sequence[np.ndarray], src_dict: Dictionary,
          tgt_dict: Dictionary, *, best: int = BEST, frequent: int = FREQUENT, iterations: int = ITERATIONS,
          identity: bool = True, progress: Progress | None = None) -> dict[str, list[str]]:
    """The rules of a shortlist for a training corpus (module docstring): "" (the always-list:
    the `frequent` most frequent target pieces) first, then per source piece in dictionary order
    its `best` target pieces by IBM-1's p(t|s) and, with `identity`, the piece itself when it is
    a target piece too and was seen in the sources (a joint dictionary's target-only pieces and
    padding symbols are no keys). Special symbols are never listed; language tags never as
    targets."""
    table = translation_table(src_rows, tgt_rows, len(src_dict), len(tgt_dict), iterations=iterations,
                              progress=progress)
    allowed = allowed_targets(tgt_dict)
    syms = tgt_dict.symbols
    rules: dict[str, list[str]] = {}
    always = frequent_targets(table.target_counts, allowed, frequent)
    if len(always):
        rules[""] = [syms[t] for t in always]
    chosen = best_targets(table, allowed, best)
    for s in range(NSPECIAL, len(src_dict)):
        piece = src_dict.symbols[s]
        if not writable(piece):
            continue
        targets = [syms[t] for t in chosen.get(s, ())]
        own = tgt_dict._index.get(piece)
        if identity and own is not None and allowed[own] and table.source_counts[s] and piece not in targets:
            targets.append(piece)
        if targets:
            rules[piece] = targets
    return rules


def piece_counts(rows: ShardedDataset, size: int) -> np.ndarray:
    """(size,) int64: how often each id occurs in the sentences `rows`, a shard's memory-mapped
    tokens at a time (as the multilingual dictionary's counts are taken)."""
    counts = np.zeros(size, dtype=np.int64)
    for shard in rows.shards:
        counts += np.bincount(np.asarray(shard.tokens, dtype=np.int64), minlength=size)[:size]
    return counts


def language_counts(data_dir: str | os.PathLike, manifest: dict, size: int,
                    split: str = "train") -> dict[str, tuple[int, np.ndarray]]:
    """Per target language of a data directory: (sentences, piece counts) of its `split`'s
    targets in that language (every pair into it, in a multilingual directory)."""
    pairs = pairs_of(manifest)
    if not pairs:
        rows = load_split(data_dir, split, manifest["target_lang"], manifest=manifest)
        return {manifest["target_lang"]: (len(rows), piece_counts(rows, size))}
    out: dict[str, tuple[int, np.ndarray]] = {}
    for lang in dict.fromkeys(t for _, t in pairs):  # the manifest's order
        rows = ShardedDataset([sh for s, t in pairs if t == lang
                               for sh in load_split(data_dir, split_name(split, s, t), t, manifest=manifest).shards])
        out[lang] = (len(rows), piece_counts(rows, size))
    return out


def language_vocabulary(counts: dict[str, tuple[int, np.ndarray]], lang: str, tgt_dict: Dictionary,
                        min_count: int = 1, min_ratio: float = 0.0) -> dict[str, list[str]]:
    """The rules of LANG's vocabulary: one always-list, in dictionary order, of every target piece
    that LANG's targets use at least `min_count` times and, by its share of each language's
    target tokens, at least `min_ratio` times as often as in any other target language's; no
    source keys. `counts`: `language_counts`'s.

    Why: a multilingual model asked for a direction it never trained on (zero-shot) often answers
    in another language, most often the one it produced most in training (English, for an
    English-centric model); with the output restricted to LANG's pieces, it cannot use another
    language's own ones. With a joint vocabulary the languages share many pieces, and any corpus
    holds strays of other languages (Multi30k's French has "the" 4 times, "people" once):
    `min_count` leaves the strays out, and `min_ratio` the pieces that are another language's far
    more than LANG's (`▁A` is English's, though French has it; `▁man` too, though French writes
    *manteau*), which LANG can still spell from smaller pieces."""
    _, mine = counts[lang]
    keep = allowed_targets(tgt_dict) & (mine >= max(min_count, 1))
    if min_ratio > 0:
        share = mine / max(int(mine.sum()), 1)
        for other, (_, c) in counts.items():
            if other != lang:
                keep &= share >= min_ratio * (c / max(int(c.sum()), 1))
    ids = np.flatnonzero(keep)
    return {"": [tgt_dict.symbols[i] for i in ids]} if len(ids) else {}


def training_rows(data_dir: str | os.PathLike, manifest: dict,
                  split: str = "train") -> tuple[ShardedDataset, ShardedDataset]:
    """(source, target) sentences of a data directory's `split`, as two ShardedDatasets. A
    multilingual directory's pairs are read together (each pair's `split.SRC-TGT`, sources led
    by the target's tag), for one joint table in which a tag is a key like any source piece."""
    pairs = pairs_of(manifest)
    if not pairs:
        return (load_split(data_dir, split, manifest["source_lang"], manifest=manifest),
                load_split(data_dir, split, manifest["target_lang"], manifest=manifest))
    sides = [(load_split(data_dir, split_name(split, s, t), s, manifest=manifest),
              load_split(data_dir, split_name(split, s, t), t, manifest=manifest)) for s, t in pairs]
    return ShardedDataset([sh for src, _ in sides for sh in src.shards]), \
        ShardedDataset([sh for _, tgt in sides for sh in tgt.shards])
