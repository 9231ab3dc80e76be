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

import dataclasses
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmtkit.search.config import (  # noqa: F401 - the search's vocabulary, re-exported
    BOS, EARLY_STOP, EOS, LENPEN_FORMS, LENPEN_LIMIT, PAD, UNK, Hypothesis,
    SearchConfig, Terms, check_lenpen, length_penalty,
)
from nmtkit.search.terms import TermBatch
from nmtkit.search.vocab import RestrictedVocab

# --------------------------------------------------------------------------------------------
# Ensembles: one object that looks like a single model to the search loops.


class _Ensemble:
    """Wraps models so that each keeps its own encoder output and cache.

    `step` returns the mean of the models' log-softmaxes in float32 (whatever the models'
    precision), so scores are comparable across precisions and ensemble sizes.
    """

    def __init__(self, models: Sequence[Any], vocab: torch.Tensor | None = None):
        if len(models) == 0:
            raise ValueError("need at least one model")
        self.models = list(models)
        # a shortlist's candidates (C,) long: the search's tokens are positions in it, and each
        # model projects onto those rows only (`restricted_output`, built once per batch)
        self.vocab = vocab
        self.outputs = [None] * len(self.models) if vocab is None else [m.restricted_output(vocab) for m in self.models]
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
        """prev: (N, 1) newest tokens -> (N, V) float32 log-probabilities (the mean over models);
        with a shortlist, positions among its C candidates in and (N, C) out.

        (log_softmax rather than logits minus torch.logsumexp: on CPU the fused log_softmax
        kernel is the faster of the two.)
        """
        if self.vocab is not None:
            prev = self.vocab[prev]  # (N, 1) positions -> dictionary ids for the embedding
        lp = None
        for m, e, c, out in zip(self.models, encs, caches, self.outputs):
            logits = m.decode_step(prev, e, c) if out is None else m.decode_step(prev, e, c, output=out)  # (N, 1, V|C)
            logits = logits[:, -1, :].float()  # (N, V|C)
            if out is not None:  # <pad> holds position 0 of a shortlist but is no candidate (`nmtkit.search.vocab`)
                logits[:, PAD] = -math.inf
            cur = torch.log_softmax(logits, dim=-1)  # (N, V|C)
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
    if cfg.banned:
        lprobs[:, list(cfg.banned)] = -math.inf
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


def search(models: Any | Sequence[Any], src_tokens: torch.Tensor, cfg: SearchConfig,
           terms: Sequence[Terms | None] | None = None, vocab: RestrictedVocab | None = None
           ) -> list[list[Hypothesis]]:
    """Translate a batch; return, per sentence and in batch order, up to `cfg.nbest` hypotheses
    best first.

    src_tokens: (B, S) long, each row `tokens + [</s>]` right-padded with `<pad>`.
    `models`: one model or a sequence of models (an ensemble). Beam 1 (without sampling) is
    greedy search; sampling draws `beam` independent samples per sentence. An empty batch gives [].
    `terms`: per sentence its `Terms` (phrases to include or avoid, a prefix) or None; when some
    sentence has any, the batch is searched with dynamic beam allocation (`nmtkit.search.terms`;
    at beam 1, beam search of 1 with fairseq's stopping rule, which is greedy search; not with
    sampling), otherwise exactly as without them.
    `vocab`: a lexical shortlist's candidates for this batch (`nmtkit.search.vocab`): the output
    layer and every step work over them only; the terms' ids must be among them.
    """
    if src_tokens.size(0) == 0:  # nothing to decode (the searches below assume B >= 1)
        return []
    models = models if isinstance(models, (list, tuple)) else [models]
    if vocab is None:
        return _search(_Ensemble(models), src_tokens, cfg, terms)
    with torch.inference_mode():
        ens = _Ensemble(models, torch.from_numpy(vocab.ids).to(src_tokens.device))  # (C,) candidates
    terms = None if terms is None else [vocab.terms(t) for t in terms]
    return vocab.hypotheses(_search(ens, src_tokens, vocab.config(cfg), terms))


def _search(ens: _Ensemble, src_tokens: torch.Tensor, cfg: SearchConfig,
            terms: Sequence[Terms | None] | None) -> list[list[Hypothesis]]:
    """`search`'s choice among the three searches, for an ensemble."""
    with torch.inference_mode(), decoding_attention():
        if terms is not None and any(terms):
            if len(terms) != src_tokens.size(0):
                raise ValueError(f"{len(terms)} terms for {src_tokens.size(0)} sentences")
            if cfg.sampling:
                raise ValueError("terms need beam search, not sampling")
            if cfg.beam == 1:  # greedy search is beam search of 1 under fairseq's stopping rule
                cfg = dataclasses.replace(cfg, early_stop="beam")
            return _terms_beam_search(ens, src_tokens, cfg, terms)
        if cfg.sampling or cfg.beam == 1:
            return _independent_search(ens, src_tokens, cfg)
        return _beam_search(ens, src_tokens, cfg)


# Every fused attention backend but cuDNN's, then the math one (the order is torch's own).
DECODING_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decoding_attention():
    """The attention kernels of incremental decoding: all of SDPA's backends except cuDNN's.

    Why: on recent NVIDIA GPUs torch picks cuDNN's fused attention first for bf16/fp16, and cuDNN
    builds an execution plan for every new shape; incremental decoding shows it a new key length
    at every step of every batch. Measured on one H200 (torch 2.11, CUDA 13), beam 4, batch 128,
    1000 Multi30k sentences: bf16 search took 10.4 s with cuDNN's backend allowed and 1.3 s
    without it (fp32, which never uses cuDNN's backend, 1.0 s). A context manager, so that the
    process's own settings are back in place when the search returns.
    """
    return sdpa_kernel(DECODING_SDPA_BACKENDS)


def _hyp(tokens: torch.Tensor, length: int, pos: torch.Tensor, score: float) -> Hypothesis:
    pos_list = pos[: length + 1].tolist()
    return Hypothesis(
        tokens=tokens[:length].tolist(), score=score, logprob=float(sum(pos_list)), positional_scores=pos_list
    )


# --------------------------------------------------------------------------------------------
# Beam search. One step: scores (model + rules) -> pruning (the K best live extensions) ->
# finishing (</s> extensions, finished sentences) -> reordering (rows, caches).


@dataclass
class _BeamState:
    """What beam search carries from one step to the next; the step functions replace fields.

    Rows are sentence-major: live row r is beam r % kc of active sentence r // kc. B' is the
    number of active sentences (`n_active`) and N = B' * kc the number of live rows; a sentence
    that finishes leaves every tensor at the end of its step.
    """

    T: int  # the largest output limit of the batch: steps 0..T
    tokens: torch.Tensor  # (N, T + 2) long: <s> y1 .. y_{T+1} of the live rows
    pos_scores: torch.Tensor  # (N, T + 1) per-token log-probs of the live rows
    alive: torch.Tensor  # (B', kc) cumulative log-probs of the live hypotheses
    fin_scores: torch.Tensor  # (B', K) penalised scores of the finished ones, sorted best first
    fin_tokens: torch.Tensor  # (B', K, T + 1) long
    fin_pos: torch.Tensor  # (B', K, T + 1)
    fin_len: torch.Tensor  # (B', K) long: tokens before </s>
    sent_ids: torch.Tensor  # (B',) original index of each active sentence
    max_len: torch.Tensor  # (B',) output limits
    min_len: torch.Tensor  # (B',) max_len wins over min_len
    row_max_len: torch.Tensor  # (N,) per-row copies of the limits, for _apply_rules
    row_min_len: torch.Tensor  # (N,)
    encs: list  # per model: the encoder output, one row per live row
    caches: list  # per model: the decoder cache, one row per live row
    kc: int  # live rows per sentence: 1 for the first step, then K
    n_active: int  # B'


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
    return _beam_loop(ens, src_tokens, cfg, None)


def _terms_beam_search(ens: _Ensemble, src_tokens: torch.Tensor, cfg: SearchConfig,
                       terms: Sequence[Terms | None]) -> list[list[Hypothesis]]:
    """`_beam_search` with each sentence's terms: the same steps, with the terms' rules in the
    scores and dynamic beam allocation instead of pruning by score (`TermBatch.select`).

    Every finished hypothesis contains its sentence's phrases (`</s>` is banned until then), none
    of its avoided sequences, and starts with its prefix; a sentence for which none could finish
    gets a single hypothesis scored -inf (callers say so).
    """
    return _beam_loop(ens, src_tokens, cfg, TermBatch(terms, src_tokens.device))


def _beam_loop(ens: _Ensemble, src_tokens: torch.Tensor, cfg: SearchConfig,
               tb: TermBatch | None) -> list[list[Hypothesis]]:
    """The steps of beam search: scores (model + rules) -> the K live extensions per sentence (by
    score, or by `tb`'s dynamic beam allocation) -> finishing -> reordering (rows, caches)."""
    st = _beam_start(ens, src_tokens, cfg)
    results: list[list[Hypothesis]] = [[] for _ in range(src_tokens.size(0))]
    for t in range(st.T + 1):
        lprobs, eos_lp, eos_cum = _beam_scores(ens, st, t, cfg, tb)  # (N, V), (N,), (B', kc)
        if tb is None:
            top_lp, beam, tok, step_lp = _beam_prune(st, lprobs, cfg)  # (B', K) each
        else:
            row_val, row_tok = row_topk(lprobs, min(cfg.beam, lprobs.size(1)))  # (N, kk)
            top_lp, beam, tok, step_lp = tb.select(st.alive, lprobs, row_val, row_tok, t, st.tokens[:, 1 : t + 1],
                                                   cfg.beam, cfg.pad)  # (B', K) each
        _beam_finish(st, t, top_lp, eos_lp, eos_cum, cfg)
        done = _beam_done(st, t, top_lp, cfg)  # (B',)
        keep = None
        if bool(done.any()):
            _beam_collect(st, done, results, cfg)
            keep = (~done).nonzero().view(-1)  # (B'',)
            if keep.numel() == 0:
                break
        _beam_reorder(ens, st, t, top_lp, beam, tok, step_lp, keep, cfg)
        if tb is not None:
            tb.advance(keep)
    return results


def _beam_start(ens: _Ensemble, src_tokens: torch.Tensor, cfg: SearchConfig) -> _BeamState:
    """The state before step 0: one live row per sentence (`<s>`, log-prob 0), no finished one.

    One row and not K: all K beams would be identical at the first step, so the encoder output
    and the first decoder step are computed once per sentence; the first reordering copies them
    to the beams.
    """
    device = src_tokens.device
    B, K = src_tokens.size(0), cfg.beam
    max_len = max_lengths(src_tokens, cfg).to(device)  # (B,)
    min_len = torch.clamp(max_len, max=cfg.min_len)  # (B,) max_len wins over min_len
    T = int(max_len.max())
    tokens = torch.full((B, T + 2), cfg.pad, dtype=torch.long, device=device)  # <s> y1 .. y_{T+1}
    tokens[:, 0] = cfg.bos
    return _BeamState(
        T=T,
        tokens=tokens,
        pos_scores=torch.zeros(B, T + 1, device=device),
        alive=torch.zeros(B, 1, device=device),
        fin_scores=torch.full((B, K), -math.inf, device=device),
        fin_tokens=torch.full((B, K, T + 1), cfg.pad, dtype=torch.long, device=device),
        fin_pos=torch.zeros(B, K, T + 1, device=device),
        fin_len=torch.zeros(B, K, dtype=torch.long, device=device),
        sent_ids=torch.arange(B, device=device),
        max_len=max_len,
        min_len=min_len,
        row_max_len=max_len,  # kc = 1: one row per sentence
        row_min_len=min_len,
        encs=ens.encode(src_tokens),
        caches=ens.new_cache(),
        kc=1,
        n_active=B,
    )


def _beam_scores(
    ens: _Ensemble, st: _BeamState, t: int, cfg: SearchConfig, terms: TermBatch | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step t's log-probs for every live row, the per-step rules (and `terms`' rules) applied,
    with `</s>` set apart.

    Returns lprobs (N, V) with the `</s>` column at -inf (so that pruning only sees live
    extensions: a `</s>` extension is never live, it can only finish), eos_lp (N,) the `</s>`
    log-probs and eos_cum (B', kc) the cumulative log-probs of the `</s>` extensions.
    """
    lprobs = ens.step(st.tokens[:, t : t + 1], st.encs, st.caches)  # (N, V)
    _apply_rules(lprobs, t, st.tokens[:, 1 : t + 1], st.row_max_len, st.row_min_len, cfg)
    if terms is not None:
        terms.mask(lprobs, t, st.kc, cfg.eos)
    eos_lp = lprobs[:, cfg.eos].clone()  # (N,)
    eos_cum = (st.alive.view(-1) + eos_lp).view(st.n_active, st.kc)  # (B', kc)
    lprobs[:, cfg.eos] = -math.inf
    return lprobs, eos_lp, eos_cum


def _beam_prune(
    st: _BeamState, lprobs: torch.Tensor, cfg: SearchConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The K best non-`</s>` extensions of each sentence: its live hypotheses after this step.

    A sentence's K best are among the K best of each of its rows: per-row top-k on the
    log-probs, then top-k of those kc*K candidates, never a pass over all N x V cumulative
    scores. Returns, each (B', K) and best first: top_lp the cumulative log-probs, beam the row
    (within the sentence) each extends, tok the token and step_lp its log-prob.
    """
    n, kc, K = st.n_active, st.kc, cfg.beam
    kk = min(K, lprobs.size(1))
    row_val, row_tok = row_topk(lprobs, kk)  # (N, kk)
    cand = (row_val + st.alive.view(-1, 1)).view(n, kc * kk)  # (B', kc * kk)
    if kc * kk < K:  # tiny vocabularies: fewer candidates than beams; pad with dead ones
        fill = K - kc * kk
        cand = torch.cat([cand, cand.new_full((n, fill), -math.inf)], dim=1)
        row_val = torch.cat([row_val.view(n, -1), row_val.new_full((n, fill), -math.inf)], dim=1)
        row_tok = torch.cat([row_tok.view(n, -1), row_tok.new_full((n, fill), cfg.pad)], dim=1)
    top_lp, top_idx = cand.topk(K, dim=1)  # (B', K)
    beam = torch.div(top_idx, kk, rounding_mode="floor").clamp_(max=kc - 1)  # (B', K)
    tok = row_tok.reshape(n, -1).gather(1, top_idx)  # (B', K)
    step_lp = row_val.reshape(n, -1).gather(1, top_idx)  # (B', K)
    return top_lp, beam, tok, step_lp


def _beam_finish(
    st: _BeamState, t: int, top_lp: torch.Tensor, eos_lp: torch.Tensor, eos_cum: torch.Tensor, cfg: SearchConfig
) -> None:
    """Offer step t's `</s>` extensions to the finished lists (the K best by penalised score).

    With early_stop "beam" (fairseq) only those ranking among the step's K best candidates,
    `</s>` or not, are offered. The lists are only rebuilt when some extension can enter (most
    steps none can), since rebuilding copies every finished hypothesis.
    """
    K, T, n, kc = cfg.beam, st.T, st.n_active, st.kc
    eos_score = eos_cum / length_penalty(float(t + 1), cfg.lenpen, cfg.lenpen_form)  # (B', kc)
    if cfg.early_stop == "beam":
        kth = torch.cat([top_lp, eos_cum], dim=1).topk(K, dim=1).values[:, K - 1 :]  # (B', 1)
        eos_score = eos_score.masked_fill(eos_cum < kth, -math.inf)
    if not bool((eos_score > st.fin_scores[:, K - 1 : K]).any()):
        return
    all_scores = torch.cat([st.fin_scores, eos_score], dim=1)  # (B', K + kc)
    st.fin_scores, sel = all_scores.topk(K, dim=1)  # (B', K), sorted
    new_tok = st.tokens[:, 1 : T + 2].reshape(n, kc, T + 1)
    new_pos = st.pos_scores.view(n, kc, T + 1).clone()
    new_pos[:, :, t] = eos_lp.view(n, kc)
    idx = sel.unsqueeze(-1).expand(-1, -1, T + 1)  # (B', K, T + 1)
    st.fin_tokens = torch.cat([st.fin_tokens, new_tok], dim=1).gather(1, idx)
    st.fin_pos = torch.cat([st.fin_pos, new_pos], dim=1).gather(1, idx)
    new_len = torch.full((n, kc), t, device=st.fin_len.device)
    st.fin_len = torch.cat([st.fin_len, new_len], dim=1).gather(1, sel)


def _beam_done(st: _BeamState, t: int, top_lp: torch.Tensor, cfg: SearchConfig) -> torch.Tensor:
    """(B',) bool: the sentences that stop after step t (the rules: _beam_search's docstring).

    top_lp: (B', K) the new live hypotheses' cumulative log-probs, best first. A sentence whose
    best live hypothesis is dead (-inf: every token banned) stops whatever the rule.
    """
    best_alive = top_lp[:, 0]  # (B',)
    done = (st.max_len <= t) | torch.isneginf(best_alive)
    # The bound needs log-probs <= 0; a negative --unk-penalty (a reward) breaks it.
    if cfg.early_stop == "bound" and cfg.unk_penalty >= 0:
        lp_next = length_penalty(float(t + 2), cfg.lenpen, cfg.lenpen_form)
        lp_max = length_penalty(st.max_len.to(top_lp.dtype) + 1.0, cfg.lenpen, cfg.lenpen_form)
        bound = best_alive / torch.clamp(lp_max, min=lp_next)  # (B',) best reachable score
        kth = st.fin_scores[:, cfg.nbest - 1]
        done |= torch.isfinite(kth) & (kth >= bound)
    elif cfg.early_stop == "beam":
        done |= torch.isfinite(st.fin_scores[:, cfg.beam - 1])
    return done


def _beam_collect(st: _BeamState, done: torch.Tensor, results: list[list[Hypothesis]], cfg: SearchConfig) -> None:
    """Write the `nbest` best finished hypotheses of each done sentence to `results`.

    The best one is always written, even at -inf when nothing could finish (callers read [0]);
    the next ones only if they did finish.
    """
    for i in done.nonzero().view(-1).tolist():
        hyps = []
        for j in range(cfg.nbest):
            s = float(st.fin_scores[i, j])
            if j > 0 and s == -math.inf:
                break
            hyps.append(_hyp(st.fin_tokens[i, j], int(st.fin_len[i, j]), st.fin_pos[i, j], s))
        results[int(st.sent_ids[i])] = hyps


def _beam_reorder(
    ens: _Ensemble,
    st: _BeamState,
    t: int,
    top_lp: torch.Tensor,
    beam: torch.Tensor,
    tok: torch.Tensor,
    step_lp: torch.Tensor,
    keep: torch.Tensor | None,
    cfg: SearchConfig,
) -> None:
    """Move to the new live hypotheses: each new row copies the row it extends and appends its
    token; the sentences not in `keep` (B'',) leave, when it is given.

    One `order` (new row -> old row) does both, so the live rows, the encoder outputs and
    every model's cache are copied once per step.
    """
    K = cfg.beam
    expanded = st.kc != K  # the first step: from one row per sentence to K
    order = (torch.arange(st.n_active, device=beam.device) * st.kc).unsqueeze(1) + beam  # (B', K)
    if keep is not None:
        order, tok, step_lp, top_lp = (x.index_select(0, keep) for x in (order, tok, step_lp, top_lp))
        st.fin_scores = st.fin_scores.index_select(0, keep)
        st.fin_tokens = st.fin_tokens.index_select(0, keep)
        st.fin_pos = st.fin_pos.index_select(0, keep)
        st.fin_len = st.fin_len.index_select(0, keep)
        st.max_len = st.max_len.index_select(0, keep)
        st.min_len = st.min_len.index_select(0, keep)
        st.sent_ids = st.sent_ids.index_select(0, keep)
        st.n_active = keep.numel()
    order = order.view(-1)  # (B' * K,)
    st.tokens = st.tokens.index_select(0, order)
    st.tokens[:, t + 1] = tok.view(-1)
    st.pos_scores = st.pos_scores.index_select(0, order)
    st.pos_scores[:, t] = step_lp.view(-1)
    st.alive, st.kc = top_lp, K
    reshaped = keep is not None or expanded
    if reshaped:
        # Rows of one sentence share the encoder output, so `order` also selects the encoder
        # rows; and the per-row limits follow the new layout.
        st.encs = ens.select_enc(st.encs, order)
        st.row_max_len = st.max_len.repeat_interleave(K)
        st.row_min_len = st.min_len.repeat_interleave(K)
    st.caches = ens.select_cache(st.caches, order, within_sentences=not reshaped)


# --------------------------------------------------------------------------------------------
# Greedy search and sampling: rows that never interact.


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


@dataclass
class _RowState:
    """What greedy search and sampling carry from one step to the next.

    N = B * S rows (S samples per sentence, 1 for greedy); N' of them are still active (not yet
    ended). The out_* tensors hold every row's result by original row, on the CPU.
    """

    T: int  # the largest output limit of the batch: steps 0..T
    tokens: torch.Tensor  # (N', T + 2) long: <s> y1 .. y_{T+1}
    pos_scores: torch.Tensor  # (N', T + 1) per-token log-probs
    row_ids: torch.Tensor  # (N',) original row of each active row
    max_len: torch.Tensor  # (N',) output limits
    min_len: torch.Tensor  # (N',)
    encs: list  # per model: the encoder output, one row per active row
    caches: list  # per model: the decoder cache, one row per active row
    out_tokens: torch.Tensor  # (N, T + 1) long: generated tokens, </s> included
    out_pos: torch.Tensor  # (N, T + 1)
    out_len: torch.Tensor  # (N,) long: tokens before </s>


def _independent_search(ens: _Ensemble, src_tokens: torch.Tensor, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """Greedy search (beam 1) or sampling (`beam` samples per sentence): rows never interact.

    Greedy picks the arg-max token and stops a row at its first `</s>` (tensor2tensor and
    fairseq both decode greedily for beam 1). Sampling draws from the model's distribution
    after the rules, temperature, top-k and top-p; its scores are the model's log-probs
    (without temperature). Rows that finish leave the batch.
    """
    S = cfg.beam if cfg.sampling else 1
    gen = _sampling_generator(cfg, src_tokens.device) if cfg.sampling else None
    st = _rows_start(ens, src_tokens, S, cfg)
    for t in range(st.T + 1):
        tok, tok_lp = _independent_step(ens, st, t, gen, cfg)  # (N',) each
        st.tokens[:, t + 1] = tok
        st.pos_scores[:, t] = tok_lp
        ended = (tok == cfg.eos) | (st.max_len <= t)  # (N',)
        if bool(ended.any()) and not _retire_rows(ens, st, ended, t):
            break
    return _collect_rows(st, src_tokens.size(0), S, cfg)


def _sampling_generator(cfg: SearchConfig, device: torch.device) -> torch.Generator:
    """The sampler's own random generator: seeded from `cfg.seed` (`--seed`: the same samples
    on every run), otherwise from fresh entropy; torch's global generator is left alone."""
    gen = torch.Generator(device=device)
    if cfg.seed is not None:
        gen.manual_seed(cfg.seed)
    else:
        gen.seed()
    return gen


def _rows_start(ens: _Ensemble, src_tokens: torch.Tensor, S: int, cfg: SearchConfig) -> _RowState:
    """The state before step 0: S rows per sentence, each `<s>` alone, nothing ended."""
    device = src_tokens.device
    B = src_tokens.size(0)
    max_len = max_lengths(src_tokens, cfg).to(device).repeat_interleave(S)  # (N,)
    min_len = torch.clamp(max_len, max=cfg.min_len)
    T = int(max_len.max())
    N = B * S
    encs = ens.encode(src_tokens)  # one row per sentence; the S samples share it
    if S > 1:
        encs = ens.select_enc(encs, torch.arange(B, device=device).repeat_interleave(S))
    tokens = torch.full((N, T + 2), cfg.pad, dtype=torch.long, device=device)
    tokens[:, 0] = cfg.bos
    return _RowState(
        T=T,
        tokens=tokens,
        pos_scores=torch.zeros(N, T + 1, device=device),
        row_ids=torch.arange(N, device=device),
        max_len=max_len,
        min_len=min_len,
        encs=encs,
        caches=ens.new_cache(),
        out_tokens=torch.full((N, T + 1), cfg.pad, dtype=torch.long),
        out_pos=torch.zeros(N, T + 1),
        out_len=torch.zeros(N, dtype=torch.long),
    )


def _independent_step(
    ens: _Ensemble, st: _RowState, t: int, gen: torch.Generator | None, cfg: SearchConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step t for every active row: the token it emits and that token's log-prob, (N',) each.

    The log-prob is the model's, after the rules but before the sampling filter: a sample's
    score is its probability under the model, not under the temperature.
    """
    lprobs = ens.step(st.tokens[:, t : t + 1], st.encs, st.caches)  # (N', V)
    _apply_rules(lprobs, t, st.tokens[:, 1 : t + 1], st.max_len, st.min_len, cfg)
    if cfg.sampling:
        probs = torch.softmax(_filter_for_sampling(lprobs, cfg), dim=1)
        tok = torch.multinomial(probs, 1, generator=gen).view(-1)  # (N',)
        return tok, lprobs.gather(1, tok.unsqueeze(1)).view(-1)
    tok_lp, tok = row_topk(lprobs, 1)  # arg-max, (N', 1)
    return tok.view(-1), tok_lp.view(-1)


def _retire_rows(ens: _Ensemble, st: _RowState, ended: torch.Tensor, t: int) -> bool:
    """Copy the ended rows (ended: (N',) bool) to the outputs and drop them from the batch, the
    encoder outputs and caches included, so later steps only pay for the rows still running.
    False when no row is left."""
    idx = ended.nonzero().view(-1)
    ids = st.row_ids.index_select(0, idx).cpu()
    st.out_tokens[ids] = st.tokens.index_select(0, idx)[:, 1:].cpu()
    st.out_pos[ids] = st.pos_scores.index_select(0, idx).cpu()
    st.out_len[ids] = t
    keep = (~ended).nonzero().view(-1)  # (N'',)
    if keep.numel() == 0:
        return False
    st.encs = ens.select_enc(st.encs, keep)
    st.caches = ens.select_cache(st.caches, keep)
    st.tokens = st.tokens.index_select(0, keep)
    st.pos_scores = st.pos_scores.index_select(0, keep)
    st.max_len = st.max_len.index_select(0, keep)
    st.min_len = st.min_len.index_select(0, keep)
    st.row_ids = st.row_ids.index_select(0, keep)
    return True


def _collect_rows(st: _RowState, B: int, S: int, cfg: SearchConfig) -> list[list[Hypothesis]]:
    """Per sentence, its S rows as hypotheses, scored with the length penalty, best first,
    the `nbest` best kept."""
    results: list[list[Hypothesis]] = []
    for b in range(B):
        hyps = []
        for r in range(b * S, (b + 1) * S):
            n = int(st.out_len[r])
            logprob = float(st.out_pos[r, : n + 1].sum())
            score = logprob / length_penalty(float(n + 1), cfg.lenpen, cfg.lenpen_form)
            hyps.append(_hyp(st.out_tokens[r], n, st.out_pos[r], score))
        hyps.sort(key=lambda h: h.score, reverse=True)
        results.append(hyps[: cfg.nbest])
    return results
