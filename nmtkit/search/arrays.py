"""nmtkit's search over numpy arrays: beam search and greedy search for engines that run without torch.

Why a second implementation: an engine whose runtime is not torch (ONNX Runtime) must not import
it, and `nmtkit.search.beam` is written in torch. This module is that search, step for step,
over numpy: the same per-step rules (`<pad>` / `<s>` banned, `--min-len`, the output limit,
`--unk-penalty`, `--no-repeat-ngram-size`), the same pruning (the `beam` best extensions that are
not `</s>`), the same finished lists, length penalties and stopping rules (`--early-stop bound`,
`beam`, `none`), the same float32 arithmetic. tests/test_search_arrays.py holds it equal to the
native search (the same hypotheses, scores within float32 rounding) on the test models.
Sampling draws from the same filtered distributions (temperature, top-k, top-p) with numpy's
generator: other samples than native's for the same `--seed`, reproducible with it.

The model interface mirrors the native one (docs/internals.md), over arrays:

    enc = model.encode(src_tokens)                # (B, S) int64, rows `ids + [</s>]` right-padded
    cache = model.new_cache()
    lprobs, cache = model.step(prev, enc, cache)  # prev (N,) int64 newest tokens -> (N, V) float32
                                                  # log-probabilities (writable)
    enc = model.select_enc(enc, order)            # row i <- old row order[i], order (N',) int64
    cache = model.select_cache(cache, order)

With a lexical shortlist's candidates (`vocab`, a `nmtkit.search.vocab.RestrictedVocab`), the
model is one over those C candidates (the ONNX engine's `Graphs.restricted`): `step` takes the
newest tokens as positions among them and returns (N, C) log-probabilities normalised over them
(<pad>'s -inf, `nmtkit.search.vocab`); the search runs in positions, as `nmtkit.search.beam` does,
and maps the hypotheses back to ids.

Definitions (|Y|, the output limit, min_len) are `nmtkit.search.beam`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmtkit.search.config import Hypothesis, SearchConfig, length_penalty
from nmtkit.search.vocab import RestrictedVocab

NEG_INF = np.float32(-np.inf)


def max_lengths(src_tokens: np.ndarray, cfg: SearchConfig) -> np.ndarray:
    """Per-sentence limit on generated tokens before </s>: floor(a*src_len + b), capped. (B,) int64."""
    src_len = ((src_tokens != cfg.pad) & (src_tokens != cfg.eos)).sum(axis=1).astype(np.float64)
    lim = np.clip(np.floor(cfg.max_len_a * src_len + cfg.max_len_b), 0, 2.0**62).astype(np.int64)
    if cfg.max_len_cap is not None:
        lim = np.minimum(lim, max(cfg.max_len_cap, 0))
    return lim


def topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of each row of x (N, V) and their columns, largest first: (N, k) each."""
    if k >= x.shape[1]:
        idx = np.argsort(-x, axis=1, kind="stable")[:, :k]
    else:
        part = np.argpartition(-x, k - 1, axis=1)[:, :k]
        idx = np.take_along_axis(part, np.argsort(-np.take_along_axis(x, part, 1), axis=1, kind="stable"), 1)
    return np.take_along_axis(x, idx, 1), idx


def row_topk(x: np.ndarray, k: int, groups: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """`topk` for wide rows, as `nmtkit.search.beam.row_topk` computes it: the k groups (columns
    j mod V // groups) with the largest maxima hold the k largest columns, so a max over
    interleaved slices and two small top-k's replace a pass over every column."""
    N, V = x.shape
    nb = V // groups
    if nb < 4 * k:
        return topk(x, k)
    gm = x[:, : nb * groups].reshape(N, groups, nb).max(axis=1)  # (N, nb) group maxima
    gi = topk(gm, k)[1]  # (N, k)
    idx = (gi[:, :, None] + np.arange(groups) * nb).reshape(N, k * groups)
    if nb * groups < V:  # the last V mod groups columns are always candidates
        idx = np.concatenate([idx, np.broadcast_to(np.arange(nb * groups, V), (N, V - nb * groups))], axis=1)
    v, j = topk(np.take_along_axis(x, idx, 1), k)  # (N, k)
    return v, np.take_along_axis(idx, j, 1)


def _ban_repeated_ngrams(lprobs: np.ndarray, gen: np.ndarray, n: int) -> None:
    """-inf on every token that would repeat an n-gram already in gen (N, t)."""
    t = gen.shape[1]
    if n <= 0 or t < n:
        return
    windows = np.lib.stride_tricks.sliding_window_view(gen, n, axis=1)  # (N, t-n+1, n)
    prefix = gen[:, t - n + 1 :]  # (N, n-1)
    match = (windows[:, :, : n - 1] == prefix[:, None, :]).all(axis=-1)  # (N, t-n+1)
    rows, cols = match.nonzero()
    if rows.size:
        lprobs[rows, windows[rows, cols, n - 1]] = NEG_INF


def apply_rules(lprobs: np.ndarray, t: int, gen: np.ndarray, row_max_len: np.ndarray, row_min_len: np.ndarray,
                cfg: SearchConfig) -> None:
    """The per-step constraints in place: lprobs (N, V) for position t, gen (N, t) the tokens so
    far, row_max_len / row_min_len (N,) (`nmtkit.search.beam._apply_rules`)."""
    eos_lp = lprobs[:, cfg.eos].copy()  # (N,) the model's own </s> log-prob
    lprobs[:, cfg.pad] = NEG_INF
    if cfg.bos != cfg.eos:
        lprobs[:, cfg.bos] = NEG_INF
    if cfg.banned:
        lprobs[:, list(cfg.banned)] = NEG_INF
    if cfg.unk_penalty:
        lprobs[:, cfg.unk] -= np.float32(cfg.unk_penalty)
    if cfg.no_repeat_ngram_size > 0:
        _ban_repeated_ngrams(lprobs, gen, cfg.no_repeat_ngram_size)
    ban_eos = row_min_len > t  # (N,)
    if ban_eos.any():
        lprobs[ban_eos, cfg.eos] = NEG_INF
    force_eos = row_max_len <= t  # (N,)
    if cfg.no_repeat_ngram_size > 0:
        force_eos |= np.isneginf(lprobs.max(axis=1))
    if force_eos.any():
        lprobs[force_eos] = NEG_INF
        lprobs[force_eos, cfg.eos] = eos_lp[force_eos]


def search(model: Any, src_tokens: np.ndarray, cfg: SearchConfig,
           vocab: RestrictedVocab | None = None) -> list[list[Hypothesis]]:
    """Up to `cfg.nbest` hypotheses per sentence, best first, in batch order (`nmtkit.search.beam.search`
    without ensembles). src_tokens: (B, S) int64, rows `ids + [</s>]` right-padded. Sampling draws
    from numpy's generator (seeded by `cfg.seed`): the same distributions as native sampling, other
    random numbers. `vocab`: the batch's shortlist candidates, over which `model` steps (module
    docstring); the hypotheses' tokens are dictionary ids either way."""
    if src_tokens.shape[0] == 0:
        return []
    if vocab is not None:  # the banned ids as positions; the found tokens back to ids
        return vocab.hypotheses(search(model, src_tokens, vocab.config(cfg)))
    if cfg.sampling or cfg.beam == 1:
        return _independent(model, src_tokens, cfg)
    return _beam_search(model, src_tokens, cfg)


def _hyp(tokens: np.ndarray, length: int, pos: np.ndarray, score: float) -> Hypothesis:
    pos_list = pos[: length + 1].tolist()
    return Hypothesis(tokens=tokens[:length].tolist(), score=score, logprob=float(sum(pos_list)),
                      positional_scores=pos_list)


# ---- beam search ----------------------------------------------------------------------------------


@dataclass
class _BeamState:
    """`nmtkit.search.beam._BeamState` over arrays: rows sentence-major, B' active sentences, kc
    live rows each (1 at the first step, then K)."""

    T: int
    tokens: np.ndarray  # (N, T + 2) int64: <s> y1 .. y_{T+1}
    pos_scores: np.ndarray  # (N, T + 1) float32
    alive: np.ndarray  # (B', kc) float32 cumulative log-probs
    fin_scores: np.ndarray  # (B', K) float32, best first
    fin_tokens: np.ndarray  # (B', K, T + 1) int64
    fin_pos: np.ndarray  # (B', K, T + 1) float32
    fin_len: np.ndarray  # (B', K) int64
    sent_ids: np.ndarray  # (B',)
    max_len: np.ndarray  # (B',)
    min_len: np.ndarray  # (B',)
    row_max_len: np.ndarray  # (N,)
    row_min_len: np.ndarray  # (N,)
    enc: Any
    cache: Any
    kc: int
    n_active: int


def _beam_search(model: Any, src_tokens: np.ndarray, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """`nmtkit.search.beam._beam_search`: scores -> pruning -> finishing -> reordering per step."""
    st = _beam_start(model, src_tokens, cfg)
    results: list[list[Hypothesis]] = [[] for _ in range(src_tokens.shape[0])]
    for t in range(st.T + 1):
        lprobs, eos_lp, eos_cum = _beam_scores(model, st, t, cfg)  # (N, V), (N,), (B', kc)
        top_lp, beam, tok, step_lp = _beam_prune(st, lprobs, cfg)  # (B', K) each
        _beam_finish(st, t, top_lp, eos_lp, eos_cum, cfg)
        done = _beam_done(st, t, top_lp, cfg)  # (B',)
        keep = None
        if done.any():
            _beam_collect(st, done, results, cfg)
            keep = np.flatnonzero(~done)  # (B'',)
            if keep.size == 0:
                break
        _beam_reorder(model, st, t, top_lp, beam, tok, step_lp, keep, cfg)
    return results


def _beam_start(model: Any, src_tokens: np.ndarray, cfg: SearchConfig) -> _BeamState:
    B, K = src_tokens.shape[0], cfg.beam
    max_len = max_lengths(src_tokens, cfg)  # (B,)
    min_len = np.minimum(max_len, cfg.min_len)  # max_len wins over min_len
    T = int(max_len.max())
    tokens = np.full((B, T + 2), cfg.pad, dtype=np.int64)
    tokens[:, 0] = cfg.bos
    return _BeamState(
        T=T, tokens=tokens, pos_scores=np.zeros((B, T + 1), np.float32), alive=np.zeros((B, 1), np.float32),
        fin_scores=np.full((B, K), NEG_INF, np.float32), fin_tokens=np.full((B, K, T + 1), cfg.pad, np.int64),
        fin_pos=np.zeros((B, K, T + 1), np.float32), fin_len=np.zeros((B, K), np.int64),
        sent_ids=np.arange(B), max_len=max_len, min_len=min_len, row_max_len=max_len, row_min_len=min_len,
        enc=model.encode(src_tokens), cache=model.new_cache(), kc=1, n_active=B,
    )


def _beam_scores(model: Any, st: _BeamState, t: int, cfg: SearchConfig):
    """Step t's log-probs (N, V) with the rules applied and `</s>` set apart (-inf), the `</s>`
    log-probs (N,) and the cumulative log-probs of the `</s>` extensions (B', kc)."""
    lprobs, st.cache = model.step(st.tokens[:, t], st.enc, st.cache)  # (N, V)
    apply_rules(lprobs, t, st.tokens[:, 1 : t + 1], st.row_max_len, st.row_min_len, cfg)
    eos_lp = lprobs[:, cfg.eos].copy()  # (N,)
    eos_cum = (st.alive.reshape(-1) + eos_lp).reshape(st.n_active, st.kc)  # (B', kc)
    lprobs[:, cfg.eos] = NEG_INF
    return lprobs, eos_lp, eos_cum


def _beam_prune(st: _BeamState, lprobs: np.ndarray, cfg: SearchConfig):
    """The K best non-`</s>` extensions per sentence, best first: cumulative log-probs, the row
    (within the sentence) each extends, the token and its log-prob, (B', K) each."""
    n, kc, K = st.n_active, st.kc, cfg.beam
    kk = min(K, lprobs.shape[1])
    row_val, row_tok = row_topk(lprobs, kk)  # (N, kk)
    cand = (row_val + st.alive.reshape(-1, 1)).reshape(n, kc * kk)  # (B', kc * kk)
    row_val, row_tok = row_val.reshape(n, -1), row_tok.reshape(n, -1)
    if kc * kk < K:  # tiny vocabularies: fewer candidates than beams; pad with dead ones
        fill = K - kc * kk
        cand = np.concatenate([cand, np.full((n, fill), NEG_INF, np.float32)], axis=1)
        row_val = np.concatenate([row_val, np.full((n, fill), NEG_INF, np.float32)], axis=1)
        row_tok = np.concatenate([row_tok, np.full((n, fill), cfg.pad, row_tok.dtype)], axis=1)
    top_lp, top_idx = topk(cand, K)  # (B', K)
    beam = np.minimum(top_idx // kk, kc - 1)
    tok = np.take_along_axis(row_tok, top_idx, 1)
    step_lp = np.take_along_axis(row_val, top_idx, 1)
    return top_lp, beam, tok, step_lp


def _beam_finish(st: _BeamState, t: int, top_lp, eos_lp, eos_cum, cfg: SearchConfig) -> None:
    """Offer step t's `</s>` extensions to the finished lists (`nmtkit.search.beam._beam_finish`)."""
    K, T, n, kc = cfg.beam, st.T, st.n_active, st.kc
    eos_score = eos_cum / np.float32(length_penalty(float(t + 1), cfg.lenpen, cfg.lenpen_form))  # (B', kc)
    if cfg.early_stop == "beam":
        both = np.concatenate([top_lp, eos_cum], axis=1)
        kth = -np.partition(-both, K - 1, axis=1)[:, K - 1 : K]  # (B', 1) the K-th best candidate
        eos_score = np.where(eos_cum < kth, NEG_INF, eos_score)
    if not (eos_score > st.fin_scores[:, K - 1 : K]).any():
        return
    st.fin_scores, sel = topk(np.concatenate([st.fin_scores, eos_score], axis=1), K)  # (B', K)
    new_tok = st.tokens[:, 1 : T + 2].reshape(n, kc, T + 1)
    new_pos = st.pos_scores.reshape(n, kc, T + 1).copy()
    new_pos[:, :, t] = eos_lp.reshape(n, kc)
    idx = sel[:, :, None]
    st.fin_tokens = np.take_along_axis(np.concatenate([st.fin_tokens, new_tok], axis=1), idx, 1)
    st.fin_pos = np.take_along_axis(np.concatenate([st.fin_pos, new_pos], axis=1), idx, 1)
    new_len = np.full((n, kc), t, dtype=np.int64)
    st.fin_len = np.take_along_axis(np.concatenate([st.fin_len, new_len], axis=1), sel, 1)


def _beam_done(st: _BeamState, t: int, top_lp: np.ndarray, cfg: SearchConfig) -> np.ndarray:
    """(B',) bool: the sentences that stop after step t (`nmtkit.search.beam._beam_done`)."""
    best_alive = top_lp[:, 0]
    done = (st.max_len <= t) | np.isneginf(best_alive)
    if cfg.early_stop == "bound" and cfg.unk_penalty >= 0:
        lp_next = np.float32(length_penalty(float(t + 2), cfg.lenpen, cfg.lenpen_form))
        lp_max = length_penalty(st.max_len.astype(np.float32) + np.float32(1.0), np.float32(cfg.lenpen),
                                cfg.lenpen_form).astype(np.float32)
        bound = best_alive / np.maximum(lp_max, lp_next)  # (B',) best reachable score
        kth = st.fin_scores[:, cfg.nbest - 1]
        done |= np.isfinite(kth) & (kth >= bound)
    elif cfg.early_stop == "beam":
        done |= np.isfinite(st.fin_scores[:, cfg.beam - 1])
    return done


def _beam_collect(st: _BeamState, done: np.ndarray, results: list, cfg: SearchConfig) -> None:
    """The `nbest` best finished hypotheses of each done sentence (the best even at -inf)."""
    for i in np.flatnonzero(done).tolist():
        hyps = []
        for j in range(cfg.nbest):
            s = float(st.fin_scores[i, j])
            if j > 0 and s == -math.inf:
                break
            hyps.append(_hyp(st.fin_tokens[i, j], int(st.fin_len[i, j]), st.fin_pos[i, j], s))
        results[int(st.sent_ids[i])] = hyps


def _beam_reorder(model: Any, st: _BeamState, t: int, top_lp, beam, tok, step_lp, keep, cfg: SearchConfig) -> None:
    """Move to the new live hypotheses, the sentences not in `keep` leaving: one `order` (new row
    -> old row) for the rows, the encoder rows and the cache."""
    K = cfg.beam
    expanded = st.kc != K
    order = (np.arange(st.n_active) * st.kc)[:, None] + beam  # (B', K)
    if keep is not None:
        order, tok, step_lp, top_lp = (x[keep] for x in (order, tok, step_lp, top_lp))
        st.fin_scores, st.fin_tokens, st.fin_pos, st.fin_len = (
            x[keep] for x in (st.fin_scores, st.fin_tokens, st.fin_pos, st.fin_len))
        st.max_len, st.min_len, st.sent_ids = st.max_len[keep], st.min_len[keep], st.sent_ids[keep]
        st.n_active = keep.size
    order = order.reshape(-1)  # (B' * K,)
    st.tokens = st.tokens[order]
    st.tokens[:, t + 1] = tok.reshape(-1)
    st.pos_scores = st.pos_scores[order]
    st.pos_scores[:, t] = step_lp.reshape(-1)
    st.alive, st.kc = top_lp, K
    if keep is not None or expanded:
        st.enc = model.select_enc(st.enc, order)
        st.row_max_len = np.repeat(st.max_len, K)
        st.row_min_len = np.repeat(st.min_len, K)
    st.cache = model.select_cache(st.cache, order)


# ---- greedy search and sampling ------------------------------------------------------------------


def filter_for_sampling(lprobs: np.ndarray, cfg: SearchConfig) -> np.ndarray:
    """Logits to sample from (N, V): temperature, then top-k, then top-p (the smallest prefix of
    the sorted distribution whose mass reaches p; the most likely token always stays), as
    `nmtkit.search.beam._filter_for_sampling`."""
    logits = lprobs / np.float32(cfg.temperature)
    if 0 < cfg.topk < logits.shape[1]:
        kth = topk(logits, cfg.topk)[0][:, -1:]  # (N, 1)
        logits = np.where(logits < kth, NEG_INF, logits)
    if 0.0 < cfg.topp < 1.0:
        order = np.argsort(-logits, axis=1, kind="stable")
        probs = _softmax(np.take_along_axis(logits, order, 1))
        drop_sorted = (np.cumsum(probs, axis=1) - probs) >= np.float32(cfg.topp)
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, 1)
        logits = np.where(drop, NEG_INF, logits)
    return logits


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _sample(lprobs: np.ndarray, rng: np.random.Generator, cfg: SearchConfig) -> np.ndarray:
    """One token per row (N,), drawn from the filtered distribution by its inverse CDF (a token
    of probability 0 is never drawn: u < the total mass)."""
    cdf = np.cumsum(_softmax(filter_for_sampling(lprobs, cfg).astype(np.float64)), axis=1)  # (N, V)
    u = rng.random(len(cdf))[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), cdf.shape[1] - 1)


def _independent(model: Any, src_tokens: np.ndarray, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """Greedy search (the arg-max token) or sampling (`beam` samples per sentence) until `</s>` or
    the limit; rows that end leave the batch (`nmtkit.search.beam._independent_search`)."""
    B, S = src_tokens.shape[0], cfg.beam if cfg.sampling else 1
    rng = np.random.default_rng(cfg.seed) if cfg.sampling else None
    max_len = np.repeat(max_lengths(src_tokens, cfg), S)  # (N,)
    min_len = np.minimum(max_len, cfg.min_len)
    T, N = int(max_len.max()), B * S
    tokens = np.full((N, T + 2), cfg.pad, dtype=np.int64)
    tokens[:, 0] = cfg.bos
    pos, rows = np.zeros((N, T + 1), np.float32), np.arange(N)
    out_tokens, out_pos = np.full((N, T + 1), cfg.pad, np.int64), np.zeros((N, T + 1), np.float32)
    out_len = np.zeros(N, np.int64)
    enc, cache = model.encode(src_tokens), model.new_cache()
    if S > 1:  # the samples of a sentence share its encoder rows
        enc = model.select_enc(enc, np.repeat(np.arange(B), S))
    for t in range(T + 1):
        lprobs, cache = model.step(tokens[:, t], enc, cache)  # (N', V)
        apply_rules(lprobs, t, tokens[:, 1 : t + 1], max_len, min_len, cfg)
        if rng is not None:
            tok = _sample(lprobs, rng, cfg)
            tok_lp = lprobs[np.arange(len(tok)), tok]  # the model's log-prob, without the temperature
        else:
            tok_lp, tok = (x[:, 0] for x in row_topk(lprobs, 1))
        tokens[:, t + 1], pos[:, t] = tok, tok_lp
        ended = (tok == cfg.eos) | (max_len <= t)
        if ended.any():
            out_tokens[rows[ended]], out_pos[rows[ended]], out_len[rows[ended]] = tokens[ended, 1:], pos[ended], t
            keep = np.flatnonzero(~ended)
            if keep.size == 0:
                break
            enc, cache = model.select_enc(enc, keep), model.select_cache(cache, keep)
            tokens, pos, rows, max_len, min_len = tokens[keep], pos[keep], rows[keep], max_len[keep], min_len[keep]
    return [_collect(out_tokens[b * S : (b + 1) * S], out_pos[b * S : (b + 1) * S], out_len[b * S : (b + 1) * S], cfg)
            for b in range(B)]


def _collect(tokens: np.ndarray, pos: np.ndarray, lengths: np.ndarray, cfg: SearchConfig) -> list[Hypothesis]:
    """A sentence's rows as hypotheses scored with the length penalty, best first, `nbest` kept."""
    hyps = []
    for r in range(len(tokens)):
        n = int(lengths[r])
        score = float(pos[r, : n + 1].sum()) / length_penalty(float(n + 1), cfg.lenpen, cfg.lenpen_form)
        hyps.append(_hyp(tokens[r], n, pos[r], score))
    hyps.sort(key=lambda h: h.score, reverse=True)
    return hyps[: cfg.nbest]
