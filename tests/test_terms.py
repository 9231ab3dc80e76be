"""Terminology in the search: positive phrases (dynamic beam allocation), avoided phrases and
target prefixes (nmtkit.search.terms), on the toy model of tests/test_search.py.

The exact property tested against brute force: with a beam at least the number of distinct
prefixes the toy can build (3 allowed tokens, so 3^max_len), every candidate survives every
step, and the constrained search returns the `nbest` best-scoring outputs among those that
start with the prefix, contain every positive phrase (in order and without overlap when
ordered) and no avoided sequence, with their scores. With small beams it is a heuristic, but
every finished hypothesis still satisfies its terms.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from nmtkit.search.beam import EOS, SearchConfig, length_penalty, search
from nmtkit.search.config import Avoided, Terms
from test_search import SRCS, ToyModel, prefix_logprobs, src_batch

torch.set_num_threads(1)


def all_outputs(model, src_row, cfg, max_len):
    """(score, tokens) of every output of at most max_len tokens the rules allow."""
    out, memo = [], {}

    def rec(prefix, logp):
        if prefix not in memo:
            memo[prefix] = prefix_logprobs(model, src_row, prefix, len(prefix), cfg, max_len)
        lp, t = memo[prefix], len(prefix)
        if lp[EOS] > -math.inf:
            out.append(((logp + lp[EOS]) / length_penalty(float(t + 1), cfg.lenpen, cfg.lenpen_form), list(prefix)))
        if t < max_len:
            for v in range(len(lp)):
                if v != EOS and lp[v] > -math.inf:
                    rec(prefix + (v,), logp + lp[v])

    rec((), 0.0)
    return out


def contains(seq, p) -> bool:
    return any(tuple(seq[i:i + len(p)]) == tuple(p) for i in range(len(seq) - len(p) + 1))


def in_order(seq, phrases) -> bool:
    """The phrases occur in `seq` in this order, without overlapping (leftmost matches)."""
    i = 0
    for p in phrases:
        while i + len(p) <= len(seq) and tuple(seq[i:i + len(p)]) != tuple(p):
            i += 1
        if i + len(p) > len(seq):
            return False
        i += len(p)
    return True


def spellings(a: Avoided) -> list[tuple[int, ...]]:
    """Every id sequence along the graph from 0 to its end (depth first)."""
    if a.end == 0:
        return [()]
    return [(v, *rest) for i, j, v in a.edges if i == 0
            for rest in spellings(Avoided(a.end - j, tuple((x - j, y - j, w) for x, y, w in a.edges if x >= j)))]


def satisfies(seq, t: Terms) -> bool:
    if tuple(seq[:len(t.prefix)]) != t.prefix or any(contains(seq, s) for a in t.avoid for s in spellings(a)):
        return False
    return in_order(seq, t.include) if t.ordered else all(contains(seq, p) for p in t.include)


MODEL = ToyModel(vocab=6, seed=1)  # allowed non-</s> tokens: <unk> (3), 4, 5
MAX_LEN = 4
T_SRCS = SRCS + [[5, 5]]  # one source per entry of TERMS
TERMS = [
    Terms(include=((5, 4),)),
    Terms(include=((4,), (5, 5))),
    Terms(include=((4, 5), (5, 4)), ordered=True),
    Terms(avoid=((4,),), prefix=(5,)),
    Terms(include=((3, 4),), avoid=((5, 5),)),
    # an avoided phrase with three spellings: 4 5 | 3 | 4 3 (positions 0 -1- 2)
    Terms(avoid=(Avoided(2, ((0, 1, 4), (1, 2, 5), (0, 2, 3), (1, 2, 3))),)),
]


@pytest.mark.parametrize("lenpen,form,early", [(0.6, "gnmt", "bound"), (1.0, "fairseq", "none"), (0.0, "gnmt", "bound")])
def test_large_beam_gives_the_best_satisfying_outputs(lenpen, form, early):
    cfg = SearchConfig(beam=3**MAX_LEN, nbest=3, lenpen=lenpen, lenpen_form=form, early_stop=early,
                       max_len_a=0, max_len_b=MAX_LEN)
    out = search(MODEL, src_batch(T_SRCS), cfg, TERMS)
    for src, terms, hyps in zip(T_SRCS, TERMS, out):
        want = sorted((o for o in all_outputs(MODEL, src, cfg, MAX_LEN) if satisfies(o[1], terms)),
                      key=lambda o: -o[0])[:3]
        assert [h.tokens for h in hyps] == [w[1] for w in want]
        assert [h.score for h in hyps] == pytest.approx([w[0] for w in want], abs=1e-5)


def test_the_terms_change_the_answer():
    """Guard for the test above: unconstrained, the best outputs of these sentences violate
    their terms, so satisfying them means something."""
    cfg = SearchConfig(beam=3**MAX_LEN, max_len_a=0, max_len_b=MAX_LEN)
    plain = search(MODEL, src_batch(T_SRCS), cfg)
    assert sum(not satisfies(h[0].tokens, t) for h, t in zip(plain, TERMS)) >= 5


def random_terms(rng: random.Random, ordered: bool) -> Terms:
    phrase = lambda: tuple(rng.choice((3, 4, 5)) for _ in range(rng.randint(1, 2)))  # noqa: E731
    include = tuple(phrase() for _ in range(rng.randint(0, 2)))
    avoid = tuple(a for a in (phrase() for _ in range(rng.randint(0, 1)))
                  if not any(contains(p, a) for p in include))
    prefix = tuple(rng.choice((3, 4, 5)) for _ in range(rng.randint(0, 1)))
    if any(contains(prefix, a) for a in avoid):  # (tuples of ids here)
        prefix = ()
    return Terms(include=include, ordered=ordered, avoid=avoid, prefix=prefix)


@pytest.mark.parametrize("beam", [3, 4])
@pytest.mark.parametrize("ordered", [False, True])
def test_every_finished_hypothesis_satisfies_its_terms(beam, ordered):
    """Small beams on a wider toy: every returned hypothesis starts with its prefix, contains
    its phrases and none of its avoided sequences, and its scores are the model's (rescored)."""
    rng = random.Random(beam * 2 + ordered)
    model = ToyModel(vocab=9, seed=3)
    srcs = [[rng.randint(4, 8) for _ in range(rng.randint(1, 6))] for _ in range(12)]
    terms = [random_terms(rng, ordered) for _ in srcs]
    cfg = SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=3)
    out = search(model, src_batch(srcs), cfg, terms)
    for src, t, hyps in zip(srcs, terms, out):
        assert hyps and all(satisfies(h.tokens, t) for h in hyps), (t, [h.tokens for h in hyps])
        for h in hyps:
            lps = [prefix_logprobs(model, src, tuple(h.tokens[:i]), i, cfg, len(src) + 3)[tok]
                   for i, tok in enumerate(h.tokens + [EOS])]
            assert h.positional_scores == pytest.approx(lps, abs=1e-4)


def test_ordered_and_unordered_differ_as_documented():
    """Unordered phrases may appear in any order; ordered ones in the given order. On this
    toy the best unordered output of some sentence has the two phrases reversed."""
    cfg = SearchConfig(beam=3**MAX_LEN, max_len_a=0, max_len_b=MAX_LEN)
    phrases = ((5,), (4,))
    un = search(MODEL, src_batch(SRCS), cfg, [Terms(include=phrases)] * len(SRCS))
    od = search(MODEL, src_batch(SRCS), cfg, [Terms(include=phrases, ordered=True)] * len(SRCS))
    assert all(in_order(h[0].tokens, phrases) for h in od)
    assert all(contains(h[0].tokens, (5,)) and contains(h[0].tokens, (4,)) for h in un)
    assert any(not in_order(h[0].tokens, phrases) for h in un)
    for u, o in zip(un, od):  # ordered is a restriction of unordered: never better
        assert o[0].score <= u[0].score + 1e-6


def test_prefix_is_kept_exactly_and_search_continues():
    cfg = SearchConfig(beam=4, nbest=4, max_len_a=0, max_len_b=6)
    prefix = (5, 3, 5)
    out = search(MODEL, src_batch(SRCS), cfg, [Terms(prefix=prefix)] * len(SRCS))
    for hyps in out:
        assert all(tuple(h.tokens[:3]) == prefix for h in hyps)
    assert any(len(h[0].tokens) > 3 for h in out)  # the search went on after the prefix


def test_no_terms_is_todays_search_byte_for_byte():
    cfg = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=3)
    base = search(MODEL, src_batch(SRCS), cfg)
    for terms in (None, [None] * len(SRCS), [Terms()] * len(SRCS)):
        assert search(MODEL, src_batch(SRCS), cfg, terms) == base


def test_a_sentence_gets_the_same_alone_or_in_a_mixed_batch():
    """Batching never changes a result: a sentence with terms among sentences without (which
    get their plain beam search), or alone."""
    cfg = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=3)
    terms = [Terms(include=((4, 4),)), None, Terms(avoid=((5,),)), None, Terms(include=((3,), (5,)), ordered=True)]
    together = search(MODEL, src_batch(SRCS), cfg, terms)
    plain = search(MODEL, src_batch(SRCS), cfg)
    for i, (src, t) in enumerate(zip(SRCS, terms)):
        assert together[i] == search(MODEL, src_batch([src]), cfg, [t] if t else None)[0]
        if t is None:
            assert together[i] == plain[i]


def test_multi_subword_avoided_sequence_is_never_produced():
    cfg = SearchConfig(beam=4, max_len_a=0, max_len_b=6)
    plain = search(MODEL, src_batch(SRCS), cfg)
    banned = next(tuple(h[0].tokens[:2]) for h in plain if len(h[0].tokens) >= 2)
    out = search(MODEL, src_batch(SRCS), cfg, [Terms(avoid=(banned,))] * len(SRCS))
    assert not any(contains(h[0].tokens, banned) for h in out)


def test_sentences_without_terms_in_a_constrained_batch_get_the_pinned_outputs():
    """The golden search cases (tests/test_search_golden.py) with one more sentence that has
    terms, so that the whole batch runs the constrained search: every other sentence's
    hypotheses equal the pinned ones (tokens and scores)."""
    import json

    from test_search_golden import CASES, OUTPUTS, SOURCES, load_models, src_batch as golden_batch

    golden = json.loads(OUTPUTS.read_text(encoding="utf-8"))
    models = load_models()
    for label, names, settings in CASES:
        if settings.get("sampling"):
            continue
        srcs = SOURCES[names[0]] + [[5, 6, 7]]
        ms = [models[n] for n in names]
        terms = [None] * (len(srcs) - 1) + [Terms(avoid=((4,),))]
        out = search(ms if len(ms) > 1 else ms[0], golden_batch(srcs), SearchConfig(**settings), terms)[:-1]
        want = golden[label]
        assert [[h.tokens for h in hyps] for hyps in out] == [[h["tokens"] for h in hyps] for hyps in want], label
        for g_hyps, w_hyps in zip(out, want):
            assert [h.score for h in g_hyps] == pytest.approx([h["score"] for h in w_hyps], abs=1e-5)


def test_an_ensemble_of_the_model_with_itself_gives_the_same_constrained_output():
    cfg = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=3)
    one = search(MODEL, src_batch(T_SRCS), cfg, TERMS)
    assert search([MODEL, MODEL], src_batch(T_SRCS), cfg, TERMS) == one
