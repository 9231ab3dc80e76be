"""A search over a part of the target vocabulary: a lexical shortlist's candidates for one batch.

Why the search runs in the shortlist's own index space (0..C-1) rather than masking the full
vocabulary: the point of a shortlist is that nothing per step is as wide as the vocabulary. The
output projection computes C logits instead of V, and the log-softmax, the top-k and the
per-step rules all work on (N, C). Only two things cross between the spaces: the newest token,
fed back to the decoder's embedding as its dictionary id (`ids[position]`), and the finished
hypotheses, whose tokens are mapped back once (`hypotheses`).

The candidates are sorted and always hold the four special ids 0..3 (<pad>, <s>, </s>, <unk>;
`nmtkit.data.shortlist` guarantees it), so those keep their ids as positions and the search's
rules for them need no change. The log-probabilities are normalised over the candidates, as in
Marian and CTranslate2: a shortlist is a different, smaller distribution, not a mask. <pad> only
holds its position: its logit is -inf before the softmax, so that the distribution is exactly
CTranslate2's under the same vocabulary map (whose fixed candidates are <unk>, <s> and </s>).

No torch here: the torch search (`nmtkit.search.beam`) and the numpy one (`nmtkit.search.arrays`)
both use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from nmtkit.search.config import Avoided, Hypothesis, SearchConfig, Terms

SPECIAL_IDS = (0, 1, 2, 3)  # <pad>, <s>, </s>, <unk>: positions 0..3 of every candidate list


class RestrictedVocab:
    """One batch's candidate target ids and the maps between ids and positions."""

    def __init__(self, ids: np.ndarray):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or len(ids) < len(SPECIAL_IDS) or tuple(ids[:4]) != SPECIAL_IDS \
                or np.any(np.diff(ids) <= 0):
            raise ValueError("candidate ids must be sorted, unique and start with the special ids 0, 1, 2, 3")
        self.ids = ids  # (C,) target dictionary ids, ascending

    def __len__(self) -> int:
        return len(self.ids)

    def positions(self, ids: Sequence[int]) -> list[int | None]:
        """The position of each id among the candidates, or None for an id that is not one."""
        arr = np.asarray(list(ids), dtype=np.int64)
        pos = np.searchsorted(self.ids, arr)
        pos = np.minimum(pos, len(self.ids) - 1)
        return [int(p) if self.ids[p] == v else None for p, v in zip(pos, arr)]

    def config(self, cfg: SearchConfig) -> SearchConfig:
        """`cfg` in positions: the banned ids that are candidates (the others cannot be produced)."""
        banned = tuple(p for p in self.positions(cfg.banned) if p is not None)
        return dataclasses.replace(cfg, banned=banned) if banned != cfg.banned else cfg

    def terms(self, terms: Terms | None) -> Terms | None:
        """One sentence's terms in positions. Their phrases and prefix must be candidates (the
        engine adds them to the union: `Shortlist.candidates(extra=...)`); an avoided spelling
        through a non-candidate can never be produced, so its edge is dropped."""
        if not terms:
            return terms

        def mapped(ids) -> tuple[int, ...]:
            pos = self.positions(ids)
            if any(p is None for p in pos):
                raise ValueError("a constraint or prefix token is not among the candidates")
            return tuple(pos)

        avoid = []
        for a in terms.avoid:
            keep = [(i, j, p) for (i, j, _), p in zip(a.edges, self.positions([e for _, _, e in a.edges]))
                    if p is not None]
            avoid.append(Avoided(a.end, tuple(keep)))
        return dataclasses.replace(terms, include=tuple(mapped(p) for p in terms.include),
                                   prefix=mapped(terms.prefix), avoid=tuple(avoid))

    def hypotheses(self, found: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
        """The search's results with their tokens as dictionary ids again (in place)."""
        for hyps in found:
            for h in hyps:
                h.tokens = self.ids[np.asarray(h.tokens, dtype=np.int64)].tolist()
        return found


def term_ids(terms: Sequence[Terms | None] | None) -> list[int]:
    """Every id a batch's terms must be able to produce: their prefixes and positive phrases."""
    out: list[int] = []
    for t in terms or ():
        if t:
            out.extend(t.prefix)
            for p in t.include:
                out.extend(p)
    return out
