"""Lexically constrained beam search: positive phrases, avoided phrases and target prefixes.

Why here, beside the beam search and not in it: a sentence without `Terms` must get exactly
today's search, so `nmtkit.search.beam` runs its own loop unless some sentence of the batch
carries terms; then `_terms_beam_search` runs the same step functions with a `TermBatch`, which
masks the log-probs (`mask`) and replaces the pruning by dynamic beam allocation (`select`).

Dynamic beam allocation (Post & Vilar 2018), vectorized over the batch as in Hu et al. (2019)
and fairseq's `LexicallyConstrainedBeamSearch`:
- the candidates of a sentence are, per live row, its `beam` best tokens and every token that
  advances one of its constraints (duplicates dropped);
- each candidate's bank is the number of constraint tokens its hypothesis has met (the tokens
  of the phrases it contains, plus the longest partial match of a phrase it does not yet);
- the `beam` survivors are taken bank by bank, round robin: the best candidate of every bank
  (highest bank first), then the second best of every bank, and so on. The best hypothesis of
  the highest bank always survives, so a phrase can always be completed.

Matching is exact: the progress of a phrase is recomputed at every step from the hypothesis'
own tokens (the longest suffix that is a prefix of the phrase, as in Knuth-Morris-Pratt), so a
hypothesis is counted as containing a phrase exactly when its tokens do. Unordered phrases may
overlap each other; ordered ones (`Terms.ordered`) must appear in the given order without
overlapping: a phrase is matched only after the previous one ends (`start`).

The rules per step: a hypothesis with a phrase still to meet cannot end (`</s>` banned), so every
finished hypothesis contains all its phrases; a token is banned when it would complete some
spelling of an avoided phrase (the row's last tokens spell the rest); before the prefix is
complete only its next token is allowed.

Shapes: B' active sentences, kc live rows per sentence (N = B' * kc), C positive phrases of at
most L ids, A avoided phrases of at most E edges (their spellings as graphs over the positions
of their text: `nmtkit.search.config.Avoided`), P prefix ids (per sentence, padded with -1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from nmtkit.search.config import Terms

NONE = -1  # padding of the id tensors: never a token


def _pad(row: Sequence[int], width: int) -> list[int]:
    """`row` padded with NONE on the right to `width`."""
    return list(row) + [NONE] * (width - len(row))


class TermBatch:
    """The terms of a batch's sentences as tensors, and the live rows' progress on them."""

    def __init__(self, terms: Sequence[Terms | None], device: torch.device):
        terms = [t or Terms() for t in terms]
        C = max(1, max(len(t.include) for t in terms))
        L = max([1] + [len(p) for t in terms for p in t.include])
        A = max(len(t.avoid) for t in terms)
        E = max([1] + [len(a.edges) for t in terms for a in t.avoid])
        P = max(len(t.prefix) for t in terms)

        def tensor(rows):
            return torch.tensor(rows, dtype=torch.long, device=device)

        self.cons = tensor([[_pad(p, L) for p in list(t.include) + [()] * (C - len(t.include))]
                            for t in terms])  # (B', C, L)
        self.lens = (self.cons != NONE).sum(-1)  # (B', C); 0: no phrase
        self.ordered = tensor([t.ordered for t in terms]).bool()  # (B',)
        self.avoid = None  # (B', A, E, 3): every avoided phrase's edges (i, j, id); padding id NONE
        if A:
            pad_edges = [(0, 0, NONE)] * E
            self.avoid = tensor([[list(a.edges) + pad_edges[len(a.edges):] for a in t.avoid]
                                 + [pad_edges] * (A - len(t.avoid)) for t in terms])
            self.avoid_end = tensor([[a.end for a in t.avoid] + [-1] * (A - len(t.avoid)) for t in terms])  # (B', A)
            ends = max(a.end for t in terms for a in t.avoid)
            self.reached = torch.zeros(len(terms), A, ends + 1, dtype=torch.bool, device=device)  # (N, A, end + 1)
        self.prefix = tensor([_pad(t.prefix, P) for t in terms]) if P else None  # (B', P)
        self.met = self.lens == 0  # (N, C) per live row (kc = 1 at the start): a missing phrase is met
        self.start = torch.zeros(len(terms), dtype=torch.long, device=device)  # (N,) where a match may begin
        # select's new state: met (B', K, C), start (B', K), reached (B', K, A, end + 1) or None
        self._next: tuple | None = None

    # -- masking the log-probs

    def mask(self, lprobs: torch.Tensor, t: int, kc: int, eos: int) -> None:
        """Step t's rules in place on lprobs (N, V)."""
        self._ban_avoided(lprobs, kc)
        if self.prefix is not None and t < self.prefix.size(1):
            forced = self.prefix[:, t].repeat_interleave(kc)  # (N,)
            rows = (forced != NONE).nonzero().view(-1)
            if rows.numel():
                keep = lprobs[rows, forced[rows]]
                lprobs[rows] = -math.inf
                lprobs[rows, forced[rows]] = keep
        unmet = ~self.met.all(dim=1)  # (N,)
        if bool(unmet.any()):
            lprobs[unmet, eos] = -math.inf

    def _ban_avoided(self, lprobs: torch.Tensor, kc: int) -> None:
        """-inf on every token that would complete an avoided phrase: an edge into its end from
        its start or from a position the row's last tokens reached. Per sentence, broadcast over
        its kc rows (a glossary's graphs are not copied per row)."""
        if self.avoid is None:
            return
        i, j, v = self.avoid.unbind(-1)  # (B', A, E) each
        n, A, E = v.shape
        reached = self.reached.view(n, kc, A, -1)
        live = reached.gather(3, i.unsqueeze(1).expand(-1, kc, -1, -1)) | (i == 0).unsqueeze(1)  # (B', kc, A, E)
        last = ((j == self.avoid_end.unsqueeze(-1)) & (v != NONE)).unsqueeze(1)  # (B', 1, A, E)
        s, r, a, e = (live & last).nonzero(as_tuple=True)
        if s.numel():
            lprobs[s * kc + r, v[s, a, e]] = -math.inf

    def _reach(self, beam: torch.Tensor, tok: torch.Tensor, kc: int) -> torch.Tensor | None:
        """The positions of every avoided phrase that the survivors' last tokens reach
        (B', K, A, end + 1): the edges labelled with the new token, from the start or from a
        position its parent row reached."""
        if self.avoid is None:
            return None
        i, j, v = self.avoid.unbind(-1)  # (B', A, E) each
        n, A, E = v.shape
        reached = self.reached.view(n, kc, A, -1)
        K = beam.size(1)
        parent = reached.gather(1, beam[:, :, None, None].expand(-1, -1, A, reached.size(3)))  # (B', K, A, end + 1)
        live = parent.gather(3, i.unsqueeze(1).expand(-1, K, -1, -1)) | (i == 0).unsqueeze(1)  # (B', K, A, E)
        hit = live & (v.unsqueeze(1) == tok[:, :, None, None])
        out = torch.zeros(n, K, A, reached.size(3), dtype=torch.uint8, device=v.device)
        return out.scatter_reduce(3, j.unsqueeze(1).expand(-1, K, -1, -1), hit.to(torch.uint8), "amax").bool()

    # -- progress on the positive phrases

    def _progress(self, t: int, gen: torch.Tensor, kc: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cons (N, C, L), open (N, C, L) bool): open[r, c, p] when phrase c may take its token p
        next in row r: its first p tokens end the row's tokens (a match that began at or after the
        row's `start`), the phrase is not met and, when ordered, it is the first unmet one."""
        cons = self.cons.repeat_interleave(kc, dim=0)  # (N, C, L)
        N, C, L = cons.shape
        ok = torch.zeros(N, C, L, dtype=torch.bool, device=cons.device)
        ok[:, :, 0] = True
        for p in range(1, min(L, t + 1)):
            same = (gen[:, t - p:].unsqueeze(1) == cons[:, :, :p]).all(dim=-1)  # (N, C)
            ok[:, :, p] = same & (t - p >= self.start).unsqueeze(1)
        unmet = ~self.met
        first = unmet & (unmet.long().cumsum(dim=1) == 1)
        ordered = self.ordered.repeat_interleave(kc).unsqueeze(1)  # (N, 1)
        eligible = torch.where(ordered, first, unmet)  # (N, C)
        return cons, ok & eligible.unsqueeze(-1) & (cons != NONE)

    def _after(self, cand: torch.Tensor, cons: torch.Tensor, open_: torch.Tensor, t: int, kc: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The state after each row's candidate tokens cand (N, m): met (N, m, C), start (N, m)
        and bank (N, m), the constraint tokens met."""
        L = cons.size(2)
        hit = open_.unsqueeze(1) & (cons.unsqueeze(1) == cand[:, :, None, None])  # (N, m, C, L)
        steps = torch.arange(1, L + 1, device=cand.device)
        new_p = (hit * steps).amax(dim=-1)  # (N, m, C) matched tokens after the candidate
        lens = self.lens.repeat_interleave(kc, dim=0).unsqueeze(1)  # (N, 1, C)
        done = (new_p == lens) & (lens > 0)
        met = self.met.unsqueeze(1) | done  # (N, m, C)
        partial = torch.where(met, torch.zeros_like(new_p), new_p).amax(dim=-1)  # (N, m)
        bank = (met * lens).sum(dim=-1) + partial
        ordered = self.ordered.repeat_interleave(kc).unsqueeze(1)  # (N, 1)
        start = torch.where(ordered & done.any(dim=-1), torch.full_like(bank, t + 1),
                            self.start.unsqueeze(1).expand_as(bank))
        return met, start, bank

    # -- pruning by dynamic beam allocation

    def select(self, alive: torch.Tensor, lprobs: torch.Tensor, row_val: torch.Tensor, row_tok: torch.Tensor,
               t: int, gen: torch.Tensor, K: int, pad: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_beam_prune`'s answer under dynamic beam allocation: (B', K) each, best first:
        top_lp, beam (the row within the sentence), tok, step_lp. alive (B', kc); lprobs (N, V)
        with `</s>` at -inf; row_val, row_tok (N, kk) each row's best tokens. The survivors'
        state waits for `advance`."""
        n, kc = alive.shape
        cons, open_ = self._progress(t, gen, kc)
        N, C, L = cons.shape
        adv = torch.where(open_, cons, torch.full_like(cons, NONE)).view(N, C * L)  # (N, C*L)
        dup = (adv.unsqueeze(2) == row_tok.unsqueeze(1)).any(dim=2)  # already among the row's best
        same = adv.unsqueeze(2) == adv.unsqueeze(1)  # (N, CL, CL)
        dup |= (same & torch.ones(C * L, C * L, dtype=torch.bool, device=adv.device).tril(-1)).any(dim=2)
        adv_val = lprobs.gather(1, adv.clamp(min=0)).masked_fill(dup | (adv == NONE), -math.inf)
        cand = torch.cat([row_tok, adv], dim=1)  # (N, m)
        step = torch.cat([row_val, adv_val], dim=1)  # (N, m)
        met, start, bank = self._after(cand, cons, open_, t, kc)
        m = cand.size(1)
        score = (step + alive.view(-1, 1)).view(n, kc * m)
        if kc * m < K:  # tiny vocabularies: fewer candidates than beams; pad with dead ones
            fill = K - kc * m
            score = torch.cat([score, score.new_full((n, fill), -math.inf)], dim=1)
            bank = torch.cat([bank.view(n, -1), bank.new_zeros(n, fill)], dim=1)
            cand = torch.cat([cand.view(n, -1), cand.new_full((n, fill), pad)], dim=1)
            step = torch.cat([step.view(n, -1), step.new_full((n, fill), -math.inf)], dim=1)
            met = torch.cat([met.view(n, -1, C), met.new_ones(n, fill, C)], dim=1)
            start = torch.cat([start.view(n, -1), start.new_zeros(n, fill)], dim=1)
        chosen = allocate(score, bank.reshape(n, -1), K)  # (B', K) indices into the candidates
        beam = torch.div(chosen, m, rounding_mode="floor").clamp_(max=kc - 1)
        tok = cand.reshape(n, -1).gather(1, chosen)
        self._next = (met.reshape(n, -1, C).gather(1, chosen.unsqueeze(-1).expand(-1, -1, C)),
                      start.reshape(n, -1).gather(1, chosen), self._reach(beam, tok, kc))
        return score.gather(1, chosen), beam, tok, step.reshape(n, -1).gather(1, chosen)

    def advance(self, keep: torch.Tensor | None) -> None:
        """Take `select`'s survivors as the live rows; the sentences not in `keep` (B'',) leave."""
        met, start, reached = self._next
        if keep is not None:
            met, start = met.index_select(0, keep), start.index_select(0, keep)
            self.cons, self.lens = self.cons.index_select(0, keep), self.lens.index_select(0, keep)
            self.ordered = self.ordered.index_select(0, keep)
            if self.prefix is not None:
                self.prefix = self.prefix.index_select(0, keep)
            if reached is not None:
                reached = reached.index_select(0, keep)
                self.avoid, self.avoid_end = self.avoid.index_select(0, keep), self.avoid_end.index_select(0, keep)
        self.met, self.start = met.reshape(-1, met.size(-1)), start.reshape(-1)
        if reached is not None:
            self.reached = reached.reshape(-1, *reached.shape[2:])


def allocate(score: torch.Tensor, bank: torch.Tensor, K: int) -> torch.Tensor:
    """Dynamic beam allocation: (B', K) indices of the survivors among candidates with scores
    and banks (B', M), best score first.

    Candidates are ranked within their bank by score; the survivors are taken by rank, and
    within one rank by bank, highest first (fairseq's stripes). Dead candidates (-inf) come last.
    """
    M = score.size(1)
    by_score = score.sort(dim=1, descending=True, stable=True).indices
    by_bank = bank.gather(1, by_score).sort(dim=1, descending=True, stable=True).indices
    idx = by_score.gather(1, by_bank)  # (B', M): bank descending, then score descending
    b = bank.gather(1, idx)
    ar = torch.arange(M, device=score.device).expand_as(b)
    first = torch.ones_like(b, dtype=torch.bool)
    first[:, 1:] = b[:, 1:] != b[:, :-1]
    rank = ar - torch.where(first, ar, torch.zeros_like(ar)).cummax(dim=1).values
    top = int(bank.max()) + 1
    key = rank * top + (top - 1 - b)
    key = key.masked_fill(torch.isneginf(score.gather(1, idx)), M * top + top)
    chosen = idx.gather(1, key.sort(dim=1, stable=True).indices[:, :K])  # (B', K)
    best = score.gather(1, chosen).sort(dim=1, descending=True, stable=True).indices
    return chosen.gather(1, best)
