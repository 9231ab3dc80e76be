"""Forced decoding, whatever the engine: the scores, attention weights and word alignments of
given target sentences, from an engine's teacher-forced pass (`Engine.forced_pass`,
`Engine.attention`; nmtkit's own in `nmtkit.backends.pytorch.forced`).

Why a teacher-forced pass beside the search: it gives
- the log-probability of any translation (fairseq's `--score-reference`, marian-scorer), with
  the search's own length penalty, so that a beam hypothesis fed back gets the score the beam
  reported;
- through `Transformer.forward_with_attention` (the explicit softmax path, only for the layers
  asked for), the attention weights of that translation: pictures and alignments.
The search code is untouched, so hypotheses stay byte-identical when none of this is asked for.

Conventions (docs/inspect.md): a target of n tokens is fed as `<s> y1 .. yn` and predicts
`y1 .. yn </s>`; row t of decoder attention is the query that predicts output token t (fairseq's
alignment convention); the source is `x1 .. xm </s>`. Alignment pairs are `source-target`,
0-based, over the tokens without `</s>` (fairseq's A- lines, Pharaoh format).
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from nmtkit.search.config import length_penalty

BOS_SYMBOL, EOS_SYMBOL = "<s>", "</s>"
SPM_SPACE = "\u2581"  # sentencepiece's word-start marker
ALIGNMENT_LEVELS = ("subword", "words")


@dataclass(frozen=True)
class PairScore:
    """The score of one given target for its source (natural logarithms)."""

    logprob: float  # sum of the token log-probabilities, </s> included
    tokens: int  # |Y|: target tokens + 1 (the </s>)
    score: float  # logprob / lp(|Y|): the number the beam search ranks by
    positional_scores: list[float] = field(default_factory=list)  # `tokens` entries


def pair_score(token_lp: Sequence[float], lenpen: float, form: str) -> PairScore:
    """PairScore of one target's per-token log-probs (its </s> last), with the search's penalty."""
    pos = [float(x) for x in token_lp]
    logprob = float(sum(pos))
    return PairScore(logprob, len(pos), logprob / length_penalty(float(len(pos)), lenpen, form), pos)


# ---------------------------------------------------------------------------------------------
# alignments


def hard_alignment(attn: np.ndarray, n_src: int, n_tgt: int, lead: int = 0) -> list[tuple[int, int]]:
    """(source, target) pairs, one per target token: the source token it attends to most.

    attn: (>= n_tgt, >= n_src) head-averaged cross-attention of one hypothesis; the </s> row and
    column and any padding are left out, as fairseq's `extract_hard_alignment` does. `lead`: ids
    before the sentence's own among the `n_src` (a multilingual model's language tag), neither
    aligned to nor counted, so that source positions are those of the sentence's pieces.
    """
    n_src -= lead
    if n_tgt == 0 or n_src <= 0:
        return []
    a = np.asarray(attn)[:n_tgt, lead:lead + n_src]
    return [(int(s), t) for t, s in enumerate(a.argmax(axis=1).tolist())]


def word_index(pieces: Sequence[str], kind: str) -> list[int]:
    """The word (0-based) of each subword piece: how the detokenizer will join them.

    sentencepiece: a piece starting with "▁" starts a word; subword-nmt: a piece ending in "@@"
    continues into the next; none (whitespace tokens): every piece is a word. The first piece
    always starts word 0.
    """
    out: list[int] = []
    w = -1
    for i, p in enumerate(pieces):
        if kind == "sentencepiece":
            new = i == 0 or p.startswith(SPM_SPACE)
        elif kind == "subword-nmt":
            new = i == 0 or not pieces[i - 1].endswith("@@")
        else:
            new = True
        w += new
        out.append(w)
    return out


def word_strings(pieces: Sequence[str], words: Sequence[int], decode: Callable[[list[str]], str]) -> list[str]:
    """Each word's text: its pieces detokenized."""
    groups: list[list[str]] = []
    for p, w in zip(pieces, words):
        if w == len(groups):
            groups.append([])
        groups[w].append(p)
    return [decode(g) for g in groups]


def piece_text(piece: str) -> str:
    """A piece's characters without the subword markers: sentencepiece's "▁" and subword-nmt's
    trailing "@@" ("▁Ball" -> "Ball", "Ball@@" -> "Ball", "▁" -> "")."""
    text = piece.replace(SPM_SPACE, "")
    return text.removesuffix("@@")


def is_punctuation(text: str) -> bool:
    """Whether `text` is one or more characters, all Unicode punctuation ("," "." "?!" "«" ")")."""
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


def punctuation_words(pieces: Sequence[str], words: Sequence[int],
                      strings: Sequence[str]) -> tuple[list[int], list[str]]:
    """Words as the paper's figures show them: punctuation glued to a word becomes a word of its own.

    pieces: a sentence's pieces; words: their word (0-based, `word_index`); strings: the words'
    text (`word_strings`). Returns the same for the new words. Within a whitespace word, the
    pieces before its first piece holding a letter or digit (or any character that is not
    punctuation) form one word, the pieces after its last one another: "▁Ball" "," gives
    "Ball" ","; "▁(" "x" ")" gives "(" "x" ")"; "Hun@@" "d@@" "." gives "Hund" ".". Punctuation
    between such pieces stays inside ("3" "." "5" is one word "3.5"), a word of punctuation only
    stays whole ("..."), and a piece that mixes letters and punctuation ("▁Ball,") is not split:
    a piece is one row of attention weights. A word whose pieces do not spell its text (the
    detokenizer normalized it, or an <unk>) stays whole.

    Only for pictures: `word_index`'s whitespace words stay those of generate's alignments.
    """
    out_words: list[int] = []
    out_strings: list[str] = []
    start = 0
    while start < len(pieces):
        end = start
        while end < len(pieces) and words[end] == words[start]:
            end += 1
        texts = [piece_text(p) for p in pieces[start:end]]
        text = strings[words[start]]
        content = [i for i, t in enumerate(texts) if t and not is_punctuation(t)]
        cuts = [0, len(texts)]
        if content and "".join(texts) == text:
            first, last = content[0], content[-1] + 1
            if "".join(texts[:first]):
                cuts.insert(1, first)
            if "".join(texts[last:]):
                cuts.insert(-1, last)
        for a, b in itertools.pairwise(cuts):
            part = text if len(cuts) == 2 else "".join(texts[a:b])
            out_words += [len(out_strings)] * (b - a)
            out_strings.append(part)
        start = end
    return out_words, out_strings


def word_alignment(pairs: Sequence[tuple[int, int]], src_words: Sequence[int],
                   tgt_words: Sequence[int]) -> list[tuple[int, int]]:
    """Subword pairs -> word pairs: two words are aligned when any of their pieces are (the usual
    conversion, e.g. Garg et al. 2019); sorted by target word, then source word."""
    return sorted({(src_words[s], tgt_words[t]) for s, t in pairs}, key=lambda p: (p[1], p[0]))


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """`0-0 1-2 ...`: source-target pairs, fairseq's A- line body (Pharaoh format)."""
    return " ".join(f"{s}-{t}" for s, t in pairs)


# ---------------------------------------------------------------------------------------------
# attention of one sentence pair, for pictures and notebooks


def merge_groups(w: np.ndarray, row_groups: Sequence[int], col_groups: Sequence[int]) -> np.ndarray:
    """Merge subword rows/columns of `w` (..., R, C) into words: sum over the columns of a word
    (the attention a query gives the whole word), mean over its rows (the word's pieces as one
    query), as alignment work does. Rows that summed to 1 still do. Groups are contiguous,
    non-decreasing word indices per row / column."""
    col_starts = np.flatnonzero(np.r_[True, np.diff(col_groups) != 0])
    row_starts = np.flatnonzero(np.r_[True, np.diff(row_groups) != 0])
    summed = np.add.reduceat(w, col_starts, axis=-1)  # (..., R, C')
    counts = np.diff(np.r_[row_starts, len(row_groups)])  # pieces per row word
    return np.add.reduceat(summed, row_starts, axis=-2) / counts[:, None]  # (..., R', C')


@dataclass
class Attention:
    """Every attention weight of a model for one source and one target (docs/inspect.md).

    Weights are post-softmax, before dropout, per layer (bottom first) and head, float32:
    `enc_self` (layers, heads, S, S): rows and columns `source_tokens`;
    `dec_self` (layers, heads, T, T): rows `target_tokens` (the token each query predicts),
    columns `decoder_inputs`; `cross` (layers, heads, T, S): rows `target_tokens`, columns
    `source_tokens`. Each row sums to 1; the future (dec_self) is exactly 0.
    """

    source_tokens: list[str]  # source pieces + "</s>"
    target_tokens: list[str]  # target pieces + "</s>"
    decoder_inputs: list[str]  # "<s>" + target pieces
    enc_self: np.ndarray
    dec_self: np.ndarray
    cross: np.ndarray
    score: PairScore  # of the target (the search's length penalty)
    target_given: bool  # True: teacher-forced on a given target; False: the model's own translation
    level: str = "subword"  # "subword", or "words" after `words()`
    source_word_of: list[int] = field(default_factory=list, repr=False)  # word of each source token
    target_word_of: list[int] = field(default_factory=list, repr=False)  # word of each target token
    source_words: list[str] = field(default_factory=list, repr=False)  # word strings, "</s>" last
    target_words: list[str] = field(default_factory=list, repr=False)

    def weights(self, kind: str) -> np.ndarray:
        """The (layers, heads, rows, columns) array of one kind: enc-self, dec-self or cross."""
        return {"enc-self": self.enc_self, "dec-self": self.dec_self, "cross": self.cross}[kind]

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of one kind."""
        return {"enc-self": (self.source_tokens, self.source_tokens),
                "dec-self": (self.target_tokens, self.decoder_inputs),
                "cross": (self.target_tokens, self.source_tokens)}[kind]

    def words(self, split_punctuation: bool = False) -> Attention:
        """The same weights over words: a word's pieces merged by summing over the columns (keys)
        and averaging over the rows (queries); </s> and <s> stay words of their own.

        The words are the detokenized text's whitespace words (those of generate's
        `--print-alignment words`); `split_punctuation=True`: punctuation glued to a word is a
        word of its own, as in the paper's figures and `nmtkit attention --level words`
        (`punctuation_words`)."""
        if self.level == "words":
            return self
        sw, tw = self.source_word_of, self.target_word_of
        s_words, t_words = list(self.source_words), list(self.target_words)
        if split_punctuation:
            sw, s_words = punctuation_words(self.source_tokens, sw, s_words)
            tw, t_words = punctuation_words(self.target_tokens, tw, t_words)
        dec_in = [0] + [w + 1 for w in tw[:-1]]  # <s> is word 0 of the decoder inputs
        return replace(
            self, level="words",
            source_tokens=s_words, target_tokens=t_words, decoder_inputs=[BOS_SYMBOL] + t_words[:-1],
            enc_self=merge_groups(self.enc_self, sw, sw), dec_self=merge_groups(self.dec_self, tw, dec_in),
            cross=merge_groups(self.cross, tw, sw),
            source_words=list(s_words), target_words=list(t_words),
            source_word_of=list(range(len(s_words))), target_word_of=list(range(len(t_words))),
        )

    def to_dict(self, kind: str | None = None, layer: int | None = None, heads: Sequence[int] | None = None) -> dict:
        """Plain lists for JSON: everything, or one kind / layer / heads (0-based indices)."""
        out = {"level": self.level, "target_given": self.target_given, "source_tokens": self.source_tokens,
               "target_tokens": self.target_tokens, "decoder_inputs": self.decoder_inputs,
               "logprob": self.score.logprob, "score": self.score.score, "target_length": self.score.tokens}
        for k in ("enc-self", "dec-self", "cross") if kind is None else (kind,):
            w = self.weights(k)
            if layer is not None:
                w = w[layer]
                if heads is not None:
                    w = w[list(heads)]
            out[k] = np.round(w.astype(np.float64), 6).tolist()
        return out
