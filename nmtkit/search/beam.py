"""Batched search over a Transformer's incremental decoder: beam search, greedy and sampling.

Why one module: the three searches share the per-step rules (banned symbols, min/max length,
`--unk-penalty`, `--no-repeat-ngram-size`, the length penalty) and the batch bookkeeping
(sentences that finish leave the batch). Everything is vectorised over the batch: there is no
Python loop over sentences or hypotheses inside a decoding step.

The model interface is the one in docs/internals.md:
`encode(src) -> EncoderOut` (with `index_select`), `new_cache()` (with `index_select`) and
`decode_step(prev_tokens_last (B, 1), enc, cache) -> (B, 1, V)` logits. Several models form an
ensemble: each keeps its own encoder output and cache, and the ensemble's log-probability of a
token is the mean of the models' log-probabilities.

Definitions used throughout (see docs/generate.md):

- `|Y|` counts the generated tokens **including** the final `</s>`, as tensor2tensor (GNMT form)
  and fairseq (its `|Y|^alpha` form) both do; a hypothesis' score is
  `sum of token log-probs (including </s>) / lp(|Y|)`.
- the output limit is `max_len = floor(a * src_len + b)` tokens **before** `</s>` per sentence,
  where `src_len` counts the source tokens without `</s>`; at step `max_len` only `</s>` is
  allowed, so every hypothesis ends with `</s>`.
- `min_len` tokens before `</s>` are required (`</s>` is banned earlier), unless `max_len` is
  smaller, which wins.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Sequence

import torch

from nmtkit.search.config import (  # noqa: F401 - the search's vocabulary, re-exported
    BOS,
    EARLY_STOP,
    EOS,
    LENPEN_FORMS,
    LENPEN_LIMIT,
    PAD,
    UNK,
    Hypothesis,
    SearchConfig,
    check_lenpen,
    length_penalty,
)

# --------------------------------------------------------------------------------------------
# Ensembles: one object that looks like a single model to the search loops.


class _Ensemble:
    """Wraps models so that each keeps its own encoder output and cache.

    `step` returns the mean of the models' log-softmaxes in float32 (whatever the models'
    precision), so scores are comparable across precisions and ensemble sizes.
    """

    def __init__(self, models: Sequence[Any]):
        if len(models) == 0:
            raise ValueError("need at least one model")
        self.models = list(models)
        # An optional extension of the interface (nmtkit's Transformer has it): skipping the copy
        # of the encoder-side K/V when rows only move among the beams of one sentence (those
        # rows are identical).
        self._skip_enc: list[bool | None] = [None] * len(self.models)

    def encode(self, src_tokens: torch.Tensor) -> list:
        return [m.encode(src_tokens) for m in self.models]

    def new_cache(self) -> list:
        # No preallocation for the whole output limit (the Transformer's new_cache(max_len)):
        # every beam reordering copies the cache's whole capacity, so a capacity of
        # max_len + 1 (~66 positions on Multi30k) made reordering 4x dearer than letting the
        # cache grow by doubling from its default (measured: 3.2 s vs 0.8 s of 21 s).
        return [m.new_cache() for m in self.models]

    @staticmethod
    def select_enc(encs: list, order: torch.Tensor) -> list:
        return [e.index_select(order) for e in encs]

    def select_cache(self, caches: list, order: torch.Tensor, within_sentences: bool = False) -> list:
        """Reorder caches: row i <- old row order[i]. within_sentences: order only permutes rows
        among the beams of each sentence (same batch size)."""
        out = []
        for i, c in enumerate(caches):
            if self._skip_enc[i] is None:
                self._skip_enc[i] = _accepts(c.index_select, "include_encoder")
            if within_sentences and self._skip_enc[i]:
                r = c.index_select(order, include_encoder=False)
            else:
                r = c.index_select(order)
            # Accept both in-place (returns None) and functional cache implementations.
            out.append(c if r is None else r)
        return out

    def step(self, prev: torch.Tensor, encs: list, caches: list) -> torch.Tensor:
        """prev: (N, 1) newest tokens -> (N, V) float32 log-probabilities (the mean over models).

        (log_softmax rather than logits minus torch.logsumexp: on CPU the fused log_softmax
        kernel is the faster of the two.)
        """
        lp = None
        for m, e, c in zip(self.models, encs, caches):
            logits = m.decode_step(prev, e, c)  # (N, 1, V)
            cur = torch.log_softmax(logits[:, -1, :].float(), dim=-1)  # (N, V)
            lp = cur if lp is None else lp.add_(cur)
        if len(self.models) > 1:
            lp.div_(len(self.models))
        return lp


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# Per-step rules shared by all searches.


def _source_lengths(src_tokens: torch.Tensor, cfg: SearchConfig) -> torch.Tensor:
    """Source tokens per sentence without padding and without </s>: (B,) long."""
    return (src_tokens.ne(cfg.pad) & src_tokens.ne(cfg.eos)).sum(dim=1)


def max_lengths(src_tokens: torch.Tensor, cfg: SearchConfig) -> torch.Tensor:
    """Per-sentence limit on generated tokens before </s>: floor(a*src_len + b), capped. (B,) long."""
    src_len = _source_lengths(src_tokens, cfg).double()
    # clamped in float64 first: a huge --max-len-a must give the cap, not an int64 overflow
    lim = torch.floor(cfg.max_len_a * src_len + cfg.max_len_b).clamp(min=0, max=2.0**62).long()
    if cfg.max_len_cap is not None:
        lim = lim.clamp(max=max(cfg.max_len_cap, 0))
    return lim


def row_topk(x: torch.Tensor, k: int, groups: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """`x.topk(k, dim=1)` (values, indices; sorted), computed faster on CPU for wide rows.

    Why: torch's CPU top-k over a row of a large vocabulary is several times slower than a
    vectorised max. Column j is put in group j mod (V // groups); the k groups with the largest
    maxima contain the k largest columns (each of those lies in a group whose max is at least
    the k-th largest value, and at most k groups can have such a max, ties aside), so a cheap
    max over interleaved slices, a top-k over V/groups group maxima and a top-k over k*groups
    gathered values give the same answer.
    """
    N, V = x.shape
    nb = V // groups
    if nb < 4 * k or x.device.type != "cpu":
        return x.topk(k, dim=1)
    gm = x[:, : nb * groups].view(N, groups, nb).amax(dim=1)  # (N, nb) group maxima
    gi = gm.topk(k, dim=1).indices  # (N, k)
    idx = (gi.unsqueeze(-1) + torch.arange(groups, device=x.device) * nb).view(N, k * groups)
    if nb * groups < V:  # the last V mod groups columns are always candidates
        idx = torch.cat([idx, torch.arange(nb * groups, V, device=x.device).expand(N, -1)], dim=1)
    v, j = x.gather(1, idx).topk(k, dim=1)  # (N, k)
    return v, idx.gather(1, j)


def _ban_repeated_ngrams(lprobs: torch.Tensor, gen: torch.Tensor, n: int) -> None:
    """Set -inf on every token that would repeat an n-gram already in `gen`.

    lprobs: (N, V), gen: (N, t) generated tokens so far. Vectorised: all windows of size n are
    compared against the last n-1 tokens at once.
    """
    t = gen.size(1)
    if n <= 0 or t < n:
        return
    windows = gen.unfold(1, n, 1)  # (N, t-n+1, n)
    prefix = gen[:, t - n + 1 :]  # (N, n-1)
    match = (windows[:, :, : n - 1] == prefix.unsqueeze(1)).all(dim=-1)  # (N, t-n+1)
    rows, cols = match.nonzero(as_tuple=True)
    if rows.numel():
        lprobs[rows, windows[rows, cols, n - 1]] = -math.inf


def _apply_rules(
    lprobs: torch.Tensor,
    t: int,
    gen: torch.Tensor,
    row_max_len: torch.Tensor,
    row_min_len: torch.Tensor,
    cfg: SearchConfig,
) -> None:
    """Apply the per-step constraints in place.

    lprobs: (N, V) log-probs for the token at (0-based) position t; gen: (N, t) tokens so far;
    row_max_len / row_min_len: (N,) per-row limits (min already clipped to max).
    """
    eos_lp = lprobs[:, cfg.eos].clone()  # (N,) the model's own </s> log-prob
    lprobs[:, cfg.pad] = -math.inf
    if cfg.bos != cfg.eos:
        lprobs[:, cfg.bos] = -math.inf
    if cfg.unk_penalty:
        lprobs[:, cfg.unk] -= cfg.unk_penalty
    if cfg.no_repeat_ngram_size > 0:
        _ban_repeated_ngrams(lprobs, gen, cfg.no_repeat_ngram_size)
    ban_eos = row_min_len > t  # (N,)
    if bool(ban_eos.any()):
        lprobs[ban_eos, cfg.eos] = -math.inf
    # At the max length only </s> is allowed; and a row whose every token is banned (min_len
    # with --no-repeat-ngram-size on a tiny vocabulary) may end rather than emit a banned token.
    force_eos = row_max_len <= t  # (N,)
    if cfg.no_repeat_ngram_size > 0:
        force_eos |= torch.isneginf(lprobs.max(dim=1).values)
    if bool(force_eos.any()):
        lprobs[force_eos] = -math.inf
        lprobs[force_eos, cfg.eos] = eos_lp[force_eos]


# --------------------------------------------------------------------------------------------
# Entry point.


def search(models: Any | Sequence[Any], src_tokens: torch.Tensor, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """Translate a batch; return, per sentence and in batch order, up to `cfg.nbest` hypotheses
    best first.

    src_tokens: (B, S) long, each row `tokens + [</s>]` right-padded with `<pad>`.
    `models`: one model or a sequence of models (an ensemble). Beam 1 (without sampling) is
    greedy search; sampling draws `beam` independent samples per sentence. An empty batch gives [].
    """
    if src_tokens.size(0) == 0:  # nothing to decode (the searches below assume B >= 1)
        return []
    ens = _Ensemble(models if isinstance(models, (list, tuple)) else [models])
    with torch.inference_mode():
        if cfg.sampling or cfg.beam == 1:
            return _independent_search(ens, src_tokens, cfg)
        return _beam_search(ens, src_tokens, cfg)


def _hyp(tokens: torch.Tensor, length: int, pos: torch.Tensor, score: float) -> Hypothesis:
    pos_list = pos[: length + 1].tolist()
    return Hypothesis(
        tokens=tokens[:length].tolist(), score=score, logprob=float(sum(pos_list)), positional_scores=pos_list
    )


def _beam_search(ens: _Ensemble, src_tokens: torch.Tensor, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """Beam search over (batch x beam) flattened rows.

    Per step and per sentence: the `beam` live hypotheses are extended by every token; the
    `beam` best extensions by tokens other than `</s>` (by log-prob; all have the same length)
    become the new live hypotheses; extensions by `</s>` are offered to the sentence's finished
    list, which keeps the `beam` best by length-penalised score. With early_stop "bound" or
    "none" every `</s>` extension is offered; with "beam" (fairseq) only those ranking among the
    step's `beam` best candidates, `</s>` or not.

    A sentence stops at its output limit (where only `</s>` is allowed), or earlier:
    - "bound": when its `nbest` best finished hypotheses score at least the best score a live
      hypothesis could still reach, `max live logprob / max(lp(t+2), lp(max_len+1))` (log-probs
      never increase and lp is monotonic in |Y|). This is exact: the `nbest` output is the same
      as with "none". (tensor2tensor's rule, per sentence and for the nbest instead of the worst.)
    - "beam": as soon as it holds `beam` finished hypotheses (fairseq's rule; not exact).

    The first step runs on one row per sentence (all beams would be identical), so the
    encoder-side keys/values are computed once per sentence and then copied to the beams.
    """
    device = src_tokens.device
    B, K = src_tokens.size(0), cfg.beam
    inf = math.inf

    max_len = max_lengths(src_tokens, cfg).to(device)  # (B,)
    min_len = torch.clamp(max_len, max=cfg.min_len)  # (B,) max_len wins over min_len
    T = int(max_len.max())
    # The bound needs log-probs <= 0; a negative --unk-penalty (a reward) breaks it.
    bound_stop = cfg.early_stop == "bound" and cfg.unk_penalty >= 0
    fairseq_stop = cfg.early_stop == "beam"

    encs = ens.encode(src_tokens)  # one row per sentence until the first step is done
    caches = ens.new_cache()
    kc = 1  # live rows per sentence: 1 for the first step, then K

    tokens = torch.full((B, T + 2), cfg.pad, dtype=torch.long, device=device)  # <s> y1 .. y_{T+1}
    tokens[:, 0] = cfg.bos
    pos_scores = torch.zeros(B, T + 1, device=device)  # per-token log-probs of live rows
    alive = torch.zeros(B, 1, device=device)  # (B', kc) cumulative log-prob of live hypotheses

    fin_scores = torch.full((B, K), -inf, device=device)  # penalised scores, sorted best first
    fin_tokens = torch.full((B, K, T + 1), cfg.pad, dtype=torch.long, device=device)
    fin_pos = torch.zeros(B, K, T + 1, device=device)
    fin_len = torch.zeros(B, K, dtype=torch.long, device=device)

    sent_ids = torch.arange(B, device=device)  # original index of each active sentence
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    n_active = B
    row_max_len, row_min_len = max_len, min_len  # (B' * kc,) per-row copies

    for t in range(T + 1):
        N = n_active * kc
        lprobs = ens.step(tokens[:, t : t + 1], encs, caches)  # (N, V)
        V = lprobs.size(1)
        _apply_rules(lprobs, t, tokens[:, 1 : t + 1], row_max_len, row_min_len, cfg)
        base = alive.view(N, 1)  # (N, 1)
        eos_lp = lprobs[:, cfg.eos].clone()  # (N,)
        eos_cum = (base.view(-1) + eos_lp).view(n_active, kc)  # (B', kc)
        lprobs[:, cfg.eos] = -inf

        # 1. The K best non-</s> extensions will be the live hypotheses. A sentence's K best are
        #    among the K best of each of its rows: per-row top-k on the log-probs, then top-k of
        #    those kc*K candidates, never a pass over all N x V cumulative scores.
        kk = min(K, V)
        row_val, row_tok = row_topk(lprobs, kk)  # (N, kk)
        cand = (row_val + base).view(n_active, kc * kk)
        if kc * kk < K:  # tiny vocabularies: fewer candidates than beams; pad with dead ones
            fill = K - kc * kk
            cand = torch.cat([cand, cand.new_full((n_active, fill), -inf)], dim=1)
            row_val = torch.cat([row_val.view(n_active, -1), row_val.new_full((n_active, fill), -inf)], dim=1)
            row_tok = torch.cat([row_tok.view(n_active, -1), row_tok.new_full((n_active, fill), cfg.pad)], dim=1)
        top_lp, top_idx = cand.topk(K, dim=1)  # (B', K)

        # 2. Offer the </s> extensions to the finished lists (only if one can enter).
        eos_score = eos_cum / length_penalty(float(t + 1), cfg.lenpen, cfg.lenpen_form)  # (B', kc)
        if fairseq_stop:  # only </s> extensions among the step's K best candidates
            kth = torch.cat([top_lp, eos_cum], dim=1).topk(K, dim=1).values[:, K - 1 :]  # (B', 1)
            eos_score = eos_score.masked_fill(eos_cum < kth, -inf)
        if bool((eos_score > fin_scores[:, K - 1 : K]).any()):
            all_scores = torch.cat([fin_scores, eos_score], dim=1)  # (B', K + kc)
            fin_scores, sel = all_scores.topk(K, dim=1)  # (B', K), sorted
            new_tok = tokens[:, 1 : T + 2].reshape(n_active, kc, T + 1)
            new_pos = pos_scores.view(n_active, kc, T + 1).clone()
            new_pos[:, :, t] = eos_lp.view(n_active, kc)
            idx = sel.unsqueeze(-1).expand(-1, -1, T + 1)
            fin_tokens = torch.cat([fin_tokens, new_tok], dim=1).gather(1, idx)
            fin_pos = torch.cat([fin_pos, new_pos], dim=1).gather(1, idx)
            fin_len = torch.cat([fin_len, torch.full((n_active, kc), t, device=device)], dim=1).gather(1, sel)

        # 3. Move to the new live hypotheses: reorder rows, append the chosen tokens.
        beam_idx = torch.div(top_idx, kk, rounding_mode="floor").clamp_(max=kc - 1)  # (B', K)
        tok = row_tok.reshape(n_active, -1).gather(1, top_idx)
        step_lp = row_val.reshape(n_active, -1).gather(1, top_idx)
        order = ((torch.arange(n_active, device=device) * kc).unsqueeze(1) + beam_idx).view(-1)  # (B'*K,)
        tokens = tokens.index_select(0, order)
        tokens[:, t + 1] = tok.view(-1)
        pos_scores = pos_scores.index_select(0, order)
        pos_scores[:, t] = step_lp.view(-1)
        alive = top_lp
        expanded = kc != K
        kc = K

        # 4. Which sentences are done?
        best_alive = alive[:, 0]  # (B',)
        done = (max_len <= t) | torch.isneginf(best_alive)
        if bound_stop:
            lp_next = length_penalty(float(t + 2), cfg.lenpen, cfg.lenpen_form)
            lp_max = length_penalty(max_len.to(alive.dtype) + 1.0, cfg.lenpen, cfg.lenpen_form)
            bound = best_alive / torch.clamp(lp_max, min=lp_next)  # (B',) best reachable score
            kth = fin_scores[:, cfg.nbest - 1]
            done |= torch.isfinite(kth) & (kth >= bound)
        elif fairseq_stop:
            done |= torch.isfinite(fin_scores[:, K - 1])

        dropped = bool(done.any())
        if dropped:
            for i in done.nonzero().view(-1).tolist():
                b = int(sent_ids[i])
                hyps = []
                for j in range(cfg.nbest):
                    s = float(fin_scores[i, j])
                    if j > 0 and s == -inf:
                        break
                    hyps.append(_hyp(fin_tokens[i, j], int(fin_len[i, j]), fin_pos[i, j], s))
                results[b] = hyps
            keep = (~done).nonzero().view(-1)  # (B'',)
            n_active = keep.numel()
            if n_active == 0:
                break
            keep_rows = ((keep * K).unsqueeze(1) + torch.arange(K, device=device)).view(-1)  # (B''*K,)
            order = order.index_select(0, keep_rows)
            tokens = tokens.index_select(0, keep_rows)
            pos_scores = pos_scores.index_select(0, keep_rows)
            alive = alive.index_select(0, keep)
            fin_scores = fin_scores.index_select(0, keep)
            fin_tokens = fin_tokens.index_select(0, keep)
            fin_pos = fin_pos.index_select(0, keep)
            fin_len = fin_len.index_select(0, keep)
            max_len = max_len.index_select(0, keep)
            min_len = min_len.index_select(0, keep)
            sent_ids = sent_ids.index_select(0, keep)
        if dropped or expanded:
            # Rows of one sentence share the encoder output, so `order` (new row -> old row)
            # also selects the encoder rows; and the per-row limits follow the new layout.
            encs = ens.select_enc(encs, order)
            row_max_len = max_len.repeat_interleave(K)
            row_min_len = min_len.repeat_interleave(K)
        # Reorder every model's cache once per step: beam reordering and dropped sentences.
        caches = ens.select_cache(caches, order, within_sentences=not (dropped or expanded))

    return results


def _filter_for_sampling(lprobs: torch.Tensor, cfg: SearchConfig) -> torch.Tensor:
    """Logits to sample from: temperature, then top-k, then top-p (nucleus). (N, V)."""
    logits = lprobs / cfg.temperature
    if cfg.topk > 0 and cfg.topk < logits.size(1):
        kth = logits.topk(cfg.topk, dim=1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, -math.inf)
    if 0.0 < cfg.topp < 1.0:
        sorted_logits, sorted_idx = logits.sort(dim=1, descending=True)
        probs = torch.softmax(sorted_logits, dim=1)
        # Keep the smallest prefix whose mass reaches topp: drop a token when the mass before it
        # already reaches topp (the most likely token is always kept).
        before = probs.cumsum(dim=1) - probs
        drop_sorted = before >= cfg.topp
        drop = torch.zeros_like(drop_sorted).scatter(1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def _independent_search(ens: _Ensemble, src_tokens: torch.Tensor, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """Greedy search (beam 1) or sampling (`beam` samples per sentence): rows never interact.

    Greedy picks the arg-max token and stops a row at its first `</s>` (tensor2tensor and
    fairseq both decode greedily for beam 1). Sampling draws from the model's distribution
    after the rules, temperature, top-k and top-p; its scores are the model's log-probs
    (without temperature). Rows that finish leave the batch.
    """
    device = src_tokens.device
    B = src_tokens.size(0)
    S = cfg.beam if cfg.sampling else 1
    gen = None
    if cfg.sampling:
        gen = torch.Generator(device=device)
        if cfg.seed is not None:
            gen.manual_seed(cfg.seed)
        else:
            gen.seed()

    max_len = max_lengths(src_tokens, cfg).to(device).repeat_interleave(S)  # (N,)
    min_len = torch.clamp(max_len, max=cfg.min_len)
    T = int(max_len.max())
    N = B * S

    encs = ens.encode(src_tokens)
    if S > 1:
        encs = ens.select_enc(encs, torch.arange(B, device=device).repeat_interleave(S))
    caches = ens.new_cache()

    tokens = torch.full((N, T + 2), cfg.pad, dtype=torch.long, device=device)
    tokens[:, 0] = cfg.bos
    pos_scores = torch.zeros(N, T + 1, device=device)
    row_ids = torch.arange(N, device=device)  # original row of each active row

    out_tokens = torch.full((N, T + 1), cfg.pad, dtype=torch.long)
    out_pos = torch.zeros(N, T + 1)
    out_len = torch.zeros(N, dtype=torch.long)

    for t in range(T + 1):
        lprobs = ens.step(tokens[:, t : t + 1], encs, caches)  # (N', V)
        _apply_rules(lprobs, t, tokens[:, 1 : t + 1], max_len, min_len, cfg)
        if cfg.sampling:
            probs = torch.softmax(_filter_for_sampling(lprobs, cfg), dim=1)
            tok = torch.multinomial(probs, 1, generator=gen).view(-1)  # (N',)
            tok_lp = lprobs.gather(1, tok.unsqueeze(1)).view(-1)
        else:
            tok_lp, tok = row_topk(lprobs, 1)  # arg-max, (N', 1)
            tok_lp, tok = tok_lp.view(-1), tok.view(-1)
        tokens[:, t + 1] = tok
        pos_scores[:, t] = tok_lp
        ended = (tok == cfg.eos) | (max_len <= t)
        if bool(ended.any()):
            idx = ended.nonzero().view(-1)
            ids = row_ids.index_select(0, idx).cpu()
            out_tokens[ids] = tokens.index_select(0, idx)[:, 1:].cpu()
            out_pos[ids] = pos_scores.index_select(0, idx).cpu()
            out_len[ids] = t
            keep = (~ended).nonzero().view(-1)
            if keep.numel() == 0:
                break
            encs = ens.select_enc(encs, keep)
            caches = ens.select_cache(caches, keep)
            tokens = tokens.index_select(0, keep)
            pos_scores = pos_scores.index_select(0, keep)
            max_len = max_len.index_select(0, keep)
            min_len = min_len.index_select(0, keep)
            row_ids = row_ids.index_select(0, keep)

    results: list[list[Hypothesis]] = []
    for b in range(B):
        hyps = []
        for r in range(b * S, (b + 1) * S):
            n = int(out_len[r])
            logprob = float(out_pos[r, : n + 1].sum())
            score = logprob / length_penalty(float(n + 1), cfg.lenpen, cfg.lenpen_form)
            hyps.append(_hyp(out_tokens[r], n, out_pos[r], score))
        hyps.sort(key=lambda h: h.score, reverse=True)
        results.append(hyps[: cfg.nbest])
    return results
