"""The pieces of nmtkit.search.beam checked one by one against values worked out by hand:
the configuration's refusals (exact messages), the length penalty and output limits, the per-step
rules (banned symbols, <unk> penalty, n-gram ban, min/max length), the sampling filter
(temperature, top-k, top-p) and the sampler's distribution, and greedy/sampling bookkeeping.

Why a file of its own: these are fast (no trained model, ~1 s in all), so a mutation run
(docs/testing.md) kills most mutants of these functions here before reaching the slower
end-to-end search tests of tests/test_search.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from nmtkit.errors import UserError
from nmtkit.search.beam import (
    EOS, PAD, UNK, SearchConfig, _apply_rules, _ban_repeated_ngrams, _filter_for_sampling,
    check_lenpen, length_penalty, max_lengths, search,
)
from nmtkit.settings import SettingError

NEG = -math.inf


def src_batch(rows):
    """Rows of token ids (without </s>) -> (B, S) padded tensor with </s> appended."""
    S = max((len(r) for r in rows), default=0) + 1
    out = torch.full((len(rows), S), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r) + 1] = torch.tensor(list(r) + [EOS])
    return out


# --------------------------------------------------------------------------------------------
# SearchConfig: every refusal with its exact message, and the accepted boundary values.


@pytest.mark.parametrize("kwargs,message", [
    ({"beam": 0}, "--beam must be >= 1, got 0"),
    ({"nbest": 0}, "--nbest must be >= 1, got 0"),
    ({"beam": 4, "nbest": 5}, "--nbest 5 exceeds the --beam 4; raise --beam"),
    ({"beam": 2, "nbest": 3, "sampling": True},
     "--nbest 3 exceeds the samples (--beam) drawn with --sampling 2; raise --beam"),
    ({"lenpen_form": "GNMT"}, "--lenpen-form must be gnmt or fairseq, got 'GNMT'"),
    ({"early_stop": "never"}, "--early-stop must be bound, beam or none, got 'never'"),
    ({"max_len_a": -0.5}, "--max-len-a and --max-len-b must be >= 0, got -0.5 and 50"),
    ({"max_len_b": -1}, "--max-len-a and --max-len-b must be >= 0, got 1.0 and -1"),
    ({"min_len": -1}, "--min-len must be >= 0, got -1"),
    ({"no_repeat_ngram_size": -1}, "--no-repeat-ngram-size must be >= 0, got -1"),
    ({"topk": -1}, "--topk must be >= 0 (0 = off), got -1"),
    ({"topp": -0.25}, "--topp must be in [0, 1] (0 = off), got -0.25"),
    ({"topp": 1.5}, "--topp must be in [0, 1] (0 = off), got 1.5"),
    ({"temperature": 0.0}, "--temperature must be > 0, got 0.0"),
    ({"temperature": -1.0}, "--temperature must be > 0, got -1.0"),
    ({"lenpen": 10.5}, "--lenpen must be between -10 and 10 (the paper: 0.6; larger values overflow "
                       "the length penalty), got 10.5"),
    ({"lenpen": -11.0}, "--lenpen must be between -10 and 10 (the paper: 0.6; larger values overflow "
                        "the length penalty), got -11.0"),
    ({"lenpen": -10.01}, "--lenpen must be between -10 and 10 (the paper: 0.6; larger values overflow "
                         "the length penalty), got -10.01"),
    ({"topp": 1.01}, "--topp must be in [0, 1] (0 = off), got 1.01"),
    ({"lenpen": math.nan}, "--lenpen must be a finite number, got nan"),
    ({"unk_penalty": math.nan}, "--unk-penalty must be a finite number, got nan"),
    ({"temperature": math.inf}, "--temperature must be a finite number, got inf"),
])
def test_config_refusals_name_the_flag(kwargs, message):
    with pytest.raises(SettingError) as e:
        SearchConfig(**kwargs)
    assert str(e.value) == message
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("kwargs", [
    {"beam": 1}, {"beam": 3, "nbest": 3}, {"beam": 2, "nbest": 2, "sampling": True},
    {"lenpen_form": "fairseq"}, {"early_stop": "beam"}, {"early_stop": "none"},
    {"max_len_a": 0.0, "max_len_b": 0}, {"min_len": 0}, {"no_repeat_ngram_size": 0}, {"topk": 0},
    {"topp": 0.0}, {"topp": 1.0}, {"temperature": 1e-3}, {"lenpen": 10.0}, {"lenpen": -10.0},
])
def test_config_boundary_values_are_accepted(kwargs):
    cfg = SearchConfig(**kwargs)
    for k, v in kwargs.items():
        assert getattr(cfg, k) == v


def test_check_lenpen_names_the_given_flag():
    check_lenpen(10.0, "--x")
    check_lenpen(-10.0, "--x")
    with pytest.raises(SettingError, match=r"^--rescore-lenpen must be between -10 and 10 "):
        check_lenpen(10.01, "--rescore-lenpen")


# --------------------------------------------------------------------------------------------
# Length penalty and output limits.


def test_length_penalty_values_by_hand():
    assert length_penalty(7.0, 0.6, "gnmt") == pytest.approx(2.0**0.6, rel=1e-12)  # (5+7)/6 = 2
    assert length_penalty(1.0, 2.0, "gnmt") == 1.0
    assert length_penalty(13.0, -1.0, "gnmt") == pytest.approx(1 / 3, rel=1e-12)  # (5+13)/6 = 3
    assert length_penalty(4.0, 0.5, "fairseq") == pytest.approx(2.0, rel=1e-12)
    assert length_penalty(9.0, 1.5, "fairseq") == pytest.approx(27.0, rel=1e-12)
    t = length_penalty(torch.tensor([1.0, 7.0]), 1.0, "gnmt")
    assert t.tolist() == pytest.approx([1.0, 2.0])
    with pytest.raises(ValueError, match=r"^unknown length penalty form 'GNMT'$"):
        length_penalty(3.0, 0.6, "GNMT")


def test_max_lengths_by_hand():
    # source lengths without padding and </s>: 3, 1, 0, 5
    src = src_batch([[4, 5, 6], [7], [], [4, 4, 4, 4, 4]])
    assert max_lengths(src, SearchConfig(max_len_a=1.5, max_len_b=2)).tolist() == [6, 3, 2, 9]  # floor(1.5 L + 2)
    assert max_lengths(src, SearchConfig(max_len_a=0.0, max_len_b=0)).tolist() == [0, 0, 0, 0]
    assert max_lengths(src, SearchConfig(max_len_a=2.0, max_len_b=1, max_len_cap=5)).tolist() == [5, 3, 1, 5]
    assert max_lengths(src, SearchConfig(max_len_a=1.0, max_len_b=0, max_len_cap=0)).tolist() == [0, 0, 0, 0]
    assert max_lengths(src, SearchConfig(max_len_a=1.0, max_len_b=0, max_len_cap=-3)).tolist() == [0, 0, 0, 0]
    # a huge --max-len-a gives the cap, not an int64 overflow
    assert max_lengths(src, SearchConfig(max_len_a=3e38, max_len_b=0, max_len_cap=40)).tolist() == [40, 40, 0, 40]
    big = max_lengths(src, SearchConfig(max_len_a=3e38, max_len_b=0))
    assert big.dtype == torch.long and big.tolist() == [2**62, 2**62, 0, 2**62]


def test_max_lengths_use_the_configured_pad_and_eos():
    """Other ids for <pad> and </s> (a library caller's dictionary): only those are not counted."""
    src = torch.tensor([[4, 5, 9, 8, 8], [9, 8, 8, 8, 8], [0, 2, 1, 9, 8]])  # pad = 8, eos = 9
    cfg = SearchConfig(max_len_a=1.0, max_len_b=0, pad=8, eos=9)
    assert max_lengths(src, cfg).tolist() == [2, 0, 3]


# --------------------------------------------------------------------------------------------
# Per-step rules.


def test_ban_repeated_ngrams_by_hand():
    gen = torch.tensor([[4, 5, 4, 6, 4],    # bigrams seen after 4: 5, 6 -> both banned
                        [4, 5, 6, 7, 8],    # last token 8 never seen before: nothing
                        [5, 5, 5, 5, 5]])   # 5 5 seen: 5 banned
    lp = torch.zeros(3, 10)
    _ban_repeated_ngrams(lp, gen, 2)
    assert torch.isneginf(lp).nonzero().tolist() == [[0, 5], [0, 6], [2, 5]]
    # trigrams: row 0 ends "6 4", seen "4 6"? no; row 2 ends "5 5", "5 5 5" seen -> 5
    lp = torch.zeros(3, 10)
    _ban_repeated_ngrams(lp, gen, 3)
    assert torch.isneginf(lp).nonzero().tolist() == [[2, 5]]
    # unigrams: every token already generated
    lp = torch.zeros(3, 10)
    _ban_repeated_ngrams(lp, gen, 1)
    assert [torch.isneginf(r).nonzero().view(-1).tolist() for r in lp] == [[4, 5, 6], [4, 5, 6, 7, 8], [5]]


def test_ban_repeated_ngrams_needs_n_tokens_and_n_above_0():
    gen = torch.tensor([[4, 4]])
    for n in (0, -1, 3):  # off, and a prefix shorter than n: nothing to repeat yet
        lp = torch.zeros(1, 6)
        _ban_repeated_ngrams(lp, gen, n)
        assert lp.tolist() == [[0.0] * 6]
    lp = torch.zeros(1, 6)
    _ban_repeated_ngrams(lp, gen, 2)  # t = n: the one bigram "4 4" ends in the prefix "4"
    assert torch.isneginf(lp).nonzero().tolist() == [[0, 4]]


def _rules(lp, t, gen, max_len, min_len, **kw):
    lp = torch.tensor(lp)
    _apply_rules(lp, t, torch.tensor(gen, dtype=torch.long).view(len(lp), -1), torch.tensor(max_len),
                 torch.tensor(min_len), SearchConfig(**kw))
    return lp.tolist()


def test_apply_rules_by_hand():
    row = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]  # pad bos eos unk 4 5
    # pad and bos banned; nothing else at t = 1 with limits 5/0
    assert _rules([row], 1, [[4]], [5], [0]) == [[NEG, NEG, -3.0, -4.0, -5.0, -6.0]]
    # <unk> penalty subtracted, negative = reward
    assert _rules([row], 1, [[4]], [5], [0], unk_penalty=1.5) == [[NEG, NEG, -3.0, -5.5, -5.0, -6.0]]
    assert _rules([row], 1, [[4]], [5], [0], unk_penalty=-1.0) == [[NEG, NEG, -3.0, -3.0, -5.0, -6.0]]
    # min_len: </s> banned while t < min_len, allowed from t = min_len on
    assert _rules([row, row], 1, [[4], [4]], [5, 5], [2, 1]) == [[NEG, NEG, NEG, -4.0, -5.0, -6.0],
                                                              [NEG, NEG, -3.0, -4.0, -5.0, -6.0]]
    # max_len: at t = max_len only </s>, with the model's own log-prob; t < max_len untouched
    assert _rules([row, row], 3, [[4, 5, 4], [4, 5, 4]], [3, 4], [0, 0]) == [[NEG, NEG, -3.0, NEG, NEG, NEG],
                                                                          [NEG, NEG, -3.0, -4.0, -5.0, -6.0]]
    # the n-gram ban: after "4 5 4", 5 would repeat the bigram "4 5"
    assert _rules([row], 3, [[4, 5, 4]], [9], [0], no_repeat_ngram_size=2) == [[NEG, NEG, -3.0, -4.0, -5.0, NEG]]


def test_apply_rules_bans_the_banned_ids_in_both_searches():
    """SearchConfig.banned (a multilingual model's language tags): those columns are -inf at every
    step, before the other rules, in the torch search and in the numpy one alike."""
    import numpy as np

    from nmtkit.search import arrays

    row = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]
    assert _rules([row], 1, [[4]], [5], [0], banned=(4, 5)) == [[NEG, NEG, -3.0, -4.0, NEG, NEG]]
    assert _rules([row], 1, [[4]], [5], [0], banned=()) == [[NEG, NEG, -3.0, -4.0, -5.0, -6.0]]
    lp = np.array([row], dtype=np.float32)
    arrays.apply_rules(lp, 1, np.array([[4]]), np.array([5]), np.array([0]), SearchConfig(banned=(4, 5)))
    assert lp.tolist() == [[NEG, NEG, -3.0, -4.0, NEG, NEG]]


def test_apply_rules_ends_a_row_whose_every_token_is_banned():
    """min_len with the n-gram ban on a tiny vocabulary: no allowed token is left, so the row may
    end with </s> (the model's own log-prob) instead of emitting a banned token."""
    lp = [[-1.0, -2.0, -3.0, -4.0, -5.0], [-1.0, -2.0, -3.0, -4.0, -5.0]]
    # row 0 has generated every other token (3 and 4), row 1 only 4: <unk> is still allowed there
    out = _rules(lp, 2, [[4, 3], [4, 4]], [9, 9], [8, 8], no_repeat_ngram_size=1)
    assert out == [[NEG, NEG, -3.0, NEG, NEG], [NEG, NEG, NEG, -4.0, NEG]]


def test_apply_rules_with_bos_equal_to_eos():
    """A dictionary whose </s> doubles as the start symbol: banning <s> must not ban </s>."""
    row = [-1.0, -2.0, -3.0, -4.0, -5.0]
    assert _rules([row], 1, [[4]], [5], [0], bos=2) == [[NEG, -2.0, -3.0, -4.0, -5.0]]


# --------------------------------------------------------------------------------------------
# Sampling: the filter, exactly.


def test_filter_temperature_divides():
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    for temp in (0.5, 2.0, 1.0):
        assert _filter_for_sampling(lp, SearchConfig(temperature=temp)).tolist() == (lp / temp).tolist()


def test_filter_topk_keeps_exactly_k():
    lp = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.05, 0.6, 0.1]]))
    out = _filter_for_sampling(lp, SearchConfig(topk=1))
    assert out.tolist() == [[NEG, lp[0, 1].item(), NEG, NEG], [NEG, NEG, lp[1, 2].item(), NEG]]
    out = _filter_for_sampling(lp, SearchConfig(topk=2))
    assert out.tolist() == [[NEG, lp[0, 1].item(), NEG, lp[0, 3].item()],
                            [lp[1, 0].item(), NEG, lp[1, 2].item(), NEG]]
    for k in (0, 4, 7):  # off, or not fewer than the vocabulary: everything kept
        assert _filter_for_sampling(lp, SearchConfig(topk=k)).tolist() == lp.tolist()
    # with a temperature, top-k works on the scaled logits
    out = _filter_for_sampling(lp, SearchConfig(topk=2, temperature=2.0))
    assert out[1].tolist() == [lp[1, 0].item() / 2, NEG, lp[1, 2].item() / 2, NEG]


def test_filter_topp_nucleus_by_hand():
    lp = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    # sorted: 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95
    for p, kept in [(0.4, [1]), (0.6, [1, 3]), (0.79, [1, 3]), (0.81, [0, 1, 3]), (0.96, [0, 1, 2, 3])]:
        out = _filter_for_sampling(lp, SearchConfig(topp=p))
        want = [lp[0, v].item() if v in kept else NEG for v in range(4)]
        assert out.tolist() == [want], p
    # per row: a second row with another order
    lp2 = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3], [0.05, 0.6, 0.25, 0.1]]))
    out = _filter_for_sampling(lp2, SearchConfig(topp=0.75))
    assert torch.isfinite(out).tolist() == [[False, True, False, True], [False, True, True, False]]


def test_filter_topp_mass_exactly_reached_stops_the_nucleus():
    """Two equally likely tokens (softmax exactly 0.5 each): with p = 0.5 the first one already
    reaches the mass, so exactly one is kept ("before >= p" drops the second)."""
    lp = torch.tensor([[0.0, 0.0]])
    out = _filter_for_sampling(lp, SearchConfig(topp=0.5))
    assert sorted(out[0].tolist()) == [NEG, 0.0]


def test_filter_topp_1_and_0_keep_everything():
    """p = 1 (and 0) is off: even a token whose probability vanishes next to the others in float32
    (the mass before it already rounds to 1) stays possible."""
    lp = torch.tensor([[0.0, -20.0, -30.0]])
    for p in (1.0, 0.0):
        assert _filter_for_sampling(lp, SearchConfig(topp=p)).tolist() == lp.tolist()


def test_filter_topk_then_topp():
    lp = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    # top-2 renormalises to 4/7, 3/7: with p = 0.5 only the first is needed; without top-k, 0.4 < 0.5
    out = _filter_for_sampling(lp, SearchConfig(topk=2, topp=0.5))
    assert out.tolist() == [[lp[0, 0].item(), NEG, NEG, NEG]]
    out = _filter_for_sampling(lp, SearchConfig(topp=0.5))
    assert out.tolist() == [[lp[0, 0].item(), lp[0, 1].item(), NEG, NEG]]


# --------------------------------------------------------------------------------------------
# Greedy and sampling through search(): a model with a fixed next-token distribution.


class FixedModel:
    """Next-token log-probs fixed per position (row `t` of `table`, the last row after that),
    whatever the source and prefix; records the number of rows of every decoding step."""

    def __init__(self, table):
        self.table = torch.log(torch.tensor(table, dtype=torch.float32))  # (T, V)
        self.rows = []

    def encode(self, src):
        return _Enc(src.size(0))

    def new_cache(self):
        return _Cache()

    def decode_step(self, prev, enc, cache):
        assert prev.dtype == torch.long and prev.size(0) == enc.n, (prev.dtype, prev.size(0), enc.n)
        self.rows.append(prev.size(0))
        t = min(cache.t, len(self.table) - 1)
        cache.t += 1
        return self.table[t].expand(prev.size(0), 1, -1).clone()


class _Enc:
    def __init__(self, n):
        self.n = n

    def index_select(self, order):
        return _Enc(order.numel())


class _Cache:
    t = 0

    def index_select(self, order):
        return None


def test_sampling_draws_beam_samples_per_sentence_and_greedy_one():
    table = [[0.0, 0.0, 0.1, 0.0, 0.5, 0.4]] * 3
    m = FixedModel(table)
    out = search(m, src_batch([[4, 5], [6]]), SearchConfig(beam=3, nbest=3, sampling=True, seed=1))
    assert [len(h) for h in out] == [3, 3]
    assert m.rows[0] == 6  # 2 sentences x 3 samples
    m = FixedModel(table)
    out = search(m, src_batch([[4, 5], [6]]), SearchConfig(beam=2, nbest=2, sampling=True, seed=1))
    assert [len(h) for h in out] == [2, 2] and m.rows[0] == 4
    m = FixedModel(table)
    out = search(m, src_batch([[4, 5], [6]]), SearchConfig(beam=1, max_len_a=1.0, max_len_b=2))
    assert m.rows[0] == 2  # greedy: one row per sentence
    assert [[h.tokens for h in hyps] for hyps in out] == [[[4] * 4], [[4] * 3]]  # arg-max up to the limit


def test_empty_batch():
    """No sentences, no hypotheses, for every kind of search (beam search used to fail here)."""
    src = torch.full((0, 1), PAD, dtype=torch.long)
    for cfg in (SearchConfig(beam=1), SearchConfig(beam=2, nbest=2, sampling=True, seed=0), SearchConfig(beam=3)):
        assert search(FixedModel([[0.1, 0.1, 0.2, 0.2, 0.4]]), src, cfg) == []


def test_sampling_nbest_are_the_best_samples_and_scores_are_model_log_probs():
    """Scores use the model's log-probs, not the tempered ones; the nbest returned are the best of
    the `beam` samples drawn with the same seed."""
    table = [[0.0, 0.0, 0.1, 0.05, 0.45, 0.4], [0.0, 0.0, 0.5, 0.05, 0.25, 0.2]]
    lp = torch.log(torch.tensor(table, dtype=torch.float32))
    cfg = SearchConfig(beam=8, nbest=8, sampling=True, seed=3, temperature=3.0, lenpen=1.0,
                       max_len_a=0.0, max_len_b=3)
    every = search(FixedModel(table), src_batch([[4]]), cfg)[0]
    assert len({tuple(h.tokens) for h in every}) > 2  # guard: the samples differ
    for h in every:
        want = [lp[min(t, 1), tok].item() for t, tok in enumerate(h.tokens + [EOS])]
        assert h.positional_scores == pytest.approx(want, abs=1e-6)
        assert h.logprob == pytest.approx(sum(want), abs=1e-6)
        assert h.score == pytest.approx(sum(want) / ((5 + len(h.tokens) + 1) / 6), abs=1e-6)
    assert [h.score for h in every] == sorted((h.score for h in every), reverse=True)
    best3 = search(FixedModel(table), src_batch([[4]]), dataclasses.replace(cfg, nbest=3))[0]
    assert [(h.tokens, h.score) for h in best3] == [(h.tokens, h.score) for h in every[:3]]


def _first_token_frequencies(probs, n, **kw):
    """Sample `n` one-token outputs (min_len = max_len = 1) from a model whose first distribution
    is `probs` over ids 0..V-1 and count the first tokens."""
    V = len(probs)
    table = [probs, [0.0, 0.0, 1.0] + [0.0] * (V - 3)]
    cfg = SearchConfig(beam=n, nbest=n, sampling=True, seed=5, min_len=1, max_len_a=0.0, max_len_b=1, **kw)
    out = search(FixedModel(table), src_batch([[4]]), cfg)[0]
    assert all(len(h.tokens) == 1 for h in out)
    counts = torch.bincount(torch.tensor([h.tokens[0] for h in out]), minlength=V)
    return counts.double() / n


@pytest.mark.parametrize("kw,want", [
    # the rules first: <pad>, <s> and </s> (min_len) banned; then the filter, worked out by hand
    ({}, [0, 0, 0, 0.1, 0.4, 0.3, 0.2]),
    ({"temperature": 0.5}, [0, 0, 0, 0.01 / 0.3, 0.16 / 0.3, 0.09 / 0.3, 0.04 / 0.3]),  # p^2 renormalised
    ({"temperature": 2.0}, [0, 0, 0] + [x / (0.1**0.5 + 0.4**0.5 + 0.3**0.5 + 0.2**0.5)
                                          for x in (0.1**0.5, 0.4**0.5, 0.3**0.5, 0.2**0.5)]),
    ({"topk": 2}, [0, 0, 0, 0, 4 / 7, 3 / 7, 0]),
    ({"topp": 0.75}, [0, 0, 0, 0, 4 / 9, 3 / 9, 2 / 9]),  # 0.4 + 0.3 < 0.75: 0.2 is needed too
    ({"topk": 3, "topp": 0.5}, [0, 0, 0, 0, 4 / 7, 3 / 7, 0]),  # within the top 3 (sum 0.9): 0.4/0.9 < 0.5
])
def test_sampling_follows_the_filtered_distribution(kw, want):
    probs = [0.05, 0.05, 0.1, 0.1, 0.4, 0.3, 0.2]  # pad bos eos unk 4 5 6 (first three banned)
    n = 6000
    freq = _first_token_frequencies(probs, n, **kw)
    for f, p in zip(freq.tolist(), want):
        # 4.5 standard deviations of a frequency over n draws (and 0 exactly where p = 0)
        assert abs(f - p) <= 4.5 * math.sqrt(p * (1 - p) / n), (kw, freq.tolist(), want)


def test_unseeded_sampling_differs_between_runs():
    """seed=None draws a fresh seed: two runs of 50 samples of 4 tokens are not the same."""
    table = [[0.0, 0.0, 0.1, 0.2, 0.25, 0.2, 0.25]]
    cfg = SearchConfig(beam=50, nbest=50, sampling=True, max_len_a=0.0, max_len_b=4, min_len=4)
    a = search(FixedModel(table), src_batch([[4]]), cfg)[0]
    b = search(FixedModel(table), src_batch([[4]]), cfg)[0]
    assert sorted(h.tokens for h in a) != sorted(h.tokens for h in b)


# --------------------------------------------------------------------------------------------
# The model interface: ensembles, functional caches, and the optional `include_encoder` of a
# cache's index_select (docs/internals.md).


def test_an_empty_ensemble_is_refused():
    with pytest.raises(ValueError, match=r"^need at least one model$"):
        search([], src_batch([[4]]), SearchConfig(beam=2))


def test_terms_refusals_of_the_search_itself():
    """A caller's slips with terms (the Translator never makes them): one Terms per sentence, and
    beam search only."""
    from nmtkit.search.config import Terms

    m = FixedModel([[0.1, 0.1, 0.2, 0.2, 0.4]])
    with pytest.raises(ValueError, match=r"^1 terms for 2 sentences$"):
        search(m, src_batch([[4], [4, 4]]), SearchConfig(beam=2), terms=[Terms(include=((4,),))])
    with pytest.raises(ValueError, match=r"^terms need beam search, not sampling$"):
        search(m, src_batch([[4]]), SearchConfig(beam=2, sampling=True, seed=0), terms=[Terms(include=((4,),))])
    # terms that ask nothing leave the search as it is, whatever their count
    assert search(m, src_batch([[4]]), SearchConfig(beam=2), terms=[None, Terms()]) == search(
        m, src_batch([[4]]), SearchConfig(beam=2))


class _Hashed:
    """Next-token log-probs from a table indexed by a hash of (source, prefix), as in
    tests/test_search.py's ToyModel; the cache is functional (index_select returns a new cache
    and leaves the old one alone) or in place, and may record every reordering."""

    M = 997

    def __init__(self, vocab, seed, functional=False, log=None):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(self.M, vocab, generator=g) * 3.0  # (M, V)
        self.functional, self.log = functional, log

    def encode(self, src):  # (B, S) -> a hash per sentence
        return _Key((src * torch.arange(1, src.size(1) + 1) * 31).sum(1) % self.M)

    def new_cache(self):
        return _HashCache(None, self.functional, self.log)

    def decode_step(self, prev, enc, cache):  # (N, 1) -> (N, 1, V)
        h = enc.key if cache.h is None else cache.h
        cache.h = (h * 131 + prev.view(-1) * 17 + 3) % self.M
        return self.table[cache.h].unsqueeze(1)


class _Key:
    def __init__(self, key):
        self.key = key

    def index_select(self, order):
        return _Key(self.key.index_select(0, order))


class _HashCache:
    def __init__(self, h, functional, log):
        self.h, self.functional, self.log = h, functional, log

    def index_select(self, order, include_encoder=True):
        if self.log is not None:
            self.log.append((order.numel(), include_encoder))
        h = None if self.h is None else self.h.index_select(0, order)
        if self.functional:
            return _HashCache(h, True, self.log)
        self.h = h
        return None


SRCS = [[4, 5, 6], [7], [], [8, 4, 5, 6, 7], [5, 5]]


@pytest.mark.parametrize("cfg", [SearchConfig(beam=3, nbest=2), SearchConfig(beam=1),
                                 SearchConfig(beam=3, nbest=3, sampling=True, seed=4)])
def test_functional_and_in_place_caches_give_the_same_result(cfg):
    """Both cache styles the interface allows: a cache whose index_select returns the reordered
    cache (and must then be used instead of the old one), and one that reorders itself."""
    src = src_batch(SRCS)
    a = search(_Hashed(9, seed=1), src, cfg)
    b = search(_Hashed(9, seed=1, functional=True), src, cfg)
    assert [[(h.tokens, h.score) for h in hyps] for hyps in a] == [[(h.tokens, h.score) for h in hyps] for hyps in b]
    assert len({tuple(h.tokens) for hyps in a for h in hyps}) > 3  # guard: outputs differ


def test_cache_skips_the_encoder_only_when_rows_stay_within_sentences():
    """Beam search asks a cache that accepts `include_encoder` to skip copying the encoder-side
    keys/values exactly when rows only move among the beams of each sentence: not at the first
    step (one row per sentence becomes `beam` rows) nor when finished sentences leave the batch.
    Greedy search only ever drops rows, so it never skips."""
    log = []
    search(_Hashed(9, seed=2, log=log), src_batch(SRCS), SearchConfig(beam=3))
    assert log[0] == (3 * len(SRCS), True)
    for (prev_rows, _), (rows, include_encoder) in zip(log, log[1:]):
        assert include_encoder == (rows < prev_rows), log
    assert {inc for _, inc in log} == {True, False}  # guard: both kinds of step happened
    log = []
    search(_Hashed(9, seed=2, log=log), src_batch(SRCS), SearchConfig(beam=1))
    assert log and all(inc for _, inc in log)


# --------------------------------------------------------------------------------------------
# When a sentence stops: the number of decoding steps, worked out by hand.


@pytest.mark.parametrize("kw,steps", [
    # lenpen 0 (lp = 1); per step p(</s>) = 0.5, p(4) = 0.3, p(5) = 0.2; beam 2, limit 10 tokens.
    # bound, nbest 1: after step 0 the finished "</s>" (log 0.5) beats the best live log 0.3.
    ({"early_stop": "bound"}, 1),
    # bound, nbest 2: the second finished, "4 </s>" (log 0.15), beats the best live "4 4" (log 0.09)
    # after step 1.
    ({"early_stop": "bound", "nbest": 2}, 2),
    # fairseq's rule: 2 finished after step 1 ("</s>", then "4 </s>" ranks 1st of the step's 4)
    ({"early_stop": "beam"}, 2),
    # to the limit: steps 0..10
    ({"early_stop": "none"}, 11),
    # a negative --unk-penalty (a reward) may raise a log-prob above 0: the bound is not used
    ({"early_stop": "bound", "unk_penalty": -1.0}, 11),
])
def test_beam_search_stops_when_the_rule_says(kw, steps):
    m = FixedModel([[0.0, 0.0, 0.5, 0.0, 0.3, 0.2]])
    cfg = SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=10, **kw)
    hyps = search(m, src_batch([[4]]), cfg)[0]
    assert len(m.rows) == steps
    assert hyps[0].tokens == [] and hyps[0].score == pytest.approx(math.log(0.5))
    if cfg.nbest == 2:
        assert hyps[1].tokens == [4] and hyps[1].score == pytest.approx(math.log(0.15))


def test_greedy_stops_at_the_limit_when_the_model_never_ends():
    """A model that gives </s> probability 0: greedy search still stops at the output limit,
    with max_len tokens and a -inf score."""
    m = FixedModel([[0.0, 0.0, 0.0, 0.1, 0.6, 0.3]])
    hyp = search(m, src_batch([[4, 5]]), SearchConfig(beam=1, max_len_a=1.0, max_len_b=1))[0][0]
    assert hyp.tokens == [4, 4, 4] and hyp.score == NEG and len(m.rows) == 4


@pytest.mark.parametrize("early_stop", ["none", "bound", "beam"])
def test_beam_search_stops_when_every_live_hypothesis_is_dead(early_stop):
    """Vocabulary <unk>, 4 (and </s>), each token at most once, </s> banned before 5 tokens: the
    live hypotheses are "4", "<unk>" (and a dead third beam), then "4 <unk>" and "<unk> 4", which
    must end at step 2 (every token banned); after that nothing is alive, so the search stops
    after 3 steps whatever the rule, with fewer finished hypotheses than beams."""
    m = FixedModel([[0.0, 0.0, 0.2, 0.3, 0.5]])
    cfg = SearchConfig(beam=3, nbest=3, min_len=5, no_repeat_ngram_size=1, max_len_a=0.0, max_len_b=10,
                       early_stop=early_stop)
    hyps = search(m, src_batch([[4]]), cfg)[0]
    assert len(m.rows) == 3
    assert sorted(h.tokens for h in hyps) == [[UNK, 4], [4, UNK]]
    for h in hyps:
        assert h.logprob == pytest.approx(math.log(0.5 * 0.3 * 0.2), abs=1e-6)


def test_bound_stops_when_the_best_finished_equals_the_bound():
    """p(</s>) = p(4) = 0.4 and lenpen 0: after step 0 the finished "</s>" scores exactly what the
    live "4" could at best still reach (log 0.4), which is enough to stop ("at least")."""
    m = FixedModel([[0.0, 0.0, 0.4, 0.0, 0.4, 0.2]])
    hyps = search(m, src_batch([[4]]), SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=10))[0]
    assert len(m.rows) == 1 and hyps[0].tokens == []


@pytest.mark.parametrize("probs,lenpen,form,steps", [
    # fairseq, alpha 1 (lp(L) = L), limit 2: after step 0 the bound is log 0.1 / lp(3) = -0.768, and
    # "</s>" has log 0.5 = -0.693 >= it: stop (dividing by lp(4) would give -0.576 and go on).
    ([0.0, 0.0, 0.5, 0.0] + [0.1] * 5, 1.0, "fairseq", 1),
    # limit 3 from here on. fairseq, alpha -1 (lp(L) = 1/L, largest for the shortest |Y|): after
    # step 0 the bound is log 0.5 / lp(2) = -1.386 > log 0.2 = -1.609: go on; after step 1 the
    # bound is log 0.25 / lp(3) = -4.159: stop (lp(3) at step 0 would have stopped at once).
    ([0.0, 0.0, 0.2, 0.0, 0.5, 0.3], -1.0, "fairseq", 2),
    # fairseq, alpha 1: after step 0 the bound is log 0.1 / lp(4) = -0.576 > log 0.4 = -0.916: go
    # on (lp(2) of the limit 3 - 1 would stop); after step 1, log 0.01 / lp(4) = -1.151: stop.
    ([0.0, 0.0, 0.4, 0.0] + [0.1] * 6, 1.0, "fairseq", 2),
])
def test_bound_uses_the_penalty_of_the_longest_reachable_output(probs, lenpen, form, steps):
    """The bound divides the best live log-prob by the largest penalty any continuation could
    still get: lp(t + 2) for the next length or lp(max_len + 1) at the limit."""
    m = FixedModel([probs])
    limit = 2 if steps == 1 else 3
    cfg = SearchConfig(beam=2, lenpen=lenpen, lenpen_form=form, max_len_a=0.0, max_len_b=limit)
    hyps = search(m, src_batch([[4]]), cfg)[0]
    assert len(m.rows) == steps and hyps[0].tokens == []


def test_beam_search_returns_only_finished_hypotheses_and_at_least_one():
    """nbest 2, but only one hypothesis can finish ("4 </s>": </s> is banned at step 0, <unk> has
    probability 0 and 4 may not repeat): one hypothesis, not a second, empty one. And a model
    that never ends (p(</s>) = 0) still gives each sentence one hypothesis (callers read [0])."""
    m = FixedModel([[0.0, 0.0, 0.5, 0.0, 0.5]])
    cfg = SearchConfig(beam=2, nbest=2, min_len=1, no_repeat_ngram_size=1, max_len_a=0.0, max_len_b=5)
    out = search(m, src_batch([[4], [5]]), cfg)
    assert [[(h.tokens, h.score) for h in hyps] for hyps in out] == [[([4], pytest.approx(math.log(0.25) / (7 / 6) ** 0.6))]] * 2
    out = search(FixedModel([[0.0, 0.0, 0.0, 0.1, 0.6, 0.3]]), src_batch([[4], [5, 6]]),
                 SearchConfig(beam=2, nbest=2, max_len_a=1.0, max_len_b=1))
    assert [len(hyps) for hyps in out] == [1, 1] and all(hyps[0].score == NEG for hyps in out)


class _Opaque:
    """A callable whose signature cannot be read (as for some C-extension methods)."""

    def __init__(self, fn):
        self.fn = fn

    @property
    def __signature__(self):
        raise ValueError("no signature")

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def test_a_cache_whose_signature_cannot_be_read_is_called_without_include_encoder():
    log = []

    class OpaqueModel(_Hashed):
        def new_cache(self):
            c = _HashCache(None, False, None)
            plain = c.index_select
            c.index_select = _Opaque(lambda order: (log.append(order.numel()), plain(order))[1])
            return c

    src = src_batch(SRCS)
    a = search(OpaqueModel(9, seed=1), src, SearchConfig(beam=3, nbest=2))
    b = search(_Hashed(9, seed=1), src, SearchConfig(beam=3, nbest=2))
    assert [[h.tokens for h in hyps] for hyps in a] == [[h.tokens for h in hyps] for hyps in b] and log
