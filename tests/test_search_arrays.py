"""The numpy search (`nmtkit.search.arrays`, run by the torch-free ONNX Runtime engine) against the
native torch search (`nmtkit.search.beam`) and against brute force.

Both run over the same models (tests/test_search.py's hash-table `ToyModel` and the half-trained
reversing Transformer), the numpy one through an adapter that hands it each step's log-probs as
arrays, so any difference is the search's own: same hypotheses, scores and per-token scores
within float32 rounding, for every length penalty, stopping rule and per-step rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nmtkit.search import arrays
from nmtkit.search.beam import SearchConfig, search
from tests.test_search import (
    REV_SRCS,
    SRCS,
    ToyModel,
    Uncached,
    exhaustive,
    load_reverser,
    reference_beam,
    src_batch,
)


class AsArrays:
    """A model of the native interface (encode / new_cache / decode_step / index_select) behind
    the array interface of `nmtkit.search.arrays`."""

    def __init__(self, model):
        self.m = model

    def encode(self, src: np.ndarray):
        return self.m.encode(torch.from_numpy(src))

    def new_cache(self):
        return self.m.new_cache()

    def step(self, prev: np.ndarray, enc, cache):
        with torch.inference_mode():
            logits = self.m.decode_step(torch.from_numpy(np.ascontiguousarray(prev)).view(-1, 1), enc, cache)
            return torch.log_softmax(logits[:, -1, :].float(), dim=-1).numpy().copy(), cache

    def select_enc(self, enc, order: np.ndarray):
        return enc.index_select(torch.from_numpy(order))

    def select_cache(self, cache, order: np.ndarray):
        cache.index_select(torch.from_numpy(order))
        return cache


def run_both(model, srcs, cfg, tol=1e-5):
    """The native and the numpy search's hypotheses on `srcs`, checked equal; returns numpy's."""
    src = src_batch(srcs)
    with torch.inference_mode():
        native = search(model, src, cfg)
    mine = arrays.search(AsArrays(model), src.numpy(), cfg)
    assert len(mine) == len(native)
    for a, b in zip(mine, native):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=tol)
        assert [h.logprob for h in a] == pytest.approx([h.logprob for h in b], abs=tol)
        for x, y in zip(a, b):
            assert x.positional_scores == pytest.approx(y.positional_scores, abs=tol)
    return mine


CONFIGS = [
    dict(beam=4),
    dict(beam=4, nbest=4),
    dict(beam=1),
    dict(beam=1, min_len=3, lenpen=1.0, lenpen_form="fairseq"),
    dict(beam=3, lenpen=1.0, lenpen_form="fairseq", early_stop="beam", nbest=2),
    dict(beam=5, early_stop="none", nbest=3),
    dict(beam=4, min_len=3, no_repeat_ngram_size=2),
    dict(beam=4, unk_penalty=1.5),
    dict(beam=4, unk_penalty=-2.0),  # a reward: the bound no longer holds, so it is not used
    dict(beam=7, lenpen=-0.5, max_len_a=0.5, max_len_b=2),
    dict(beam=2, max_len_a=0.0, max_len_b=0),  # only </s> is allowed
    dict(beam=4, max_len_cap=3),
]


@pytest.mark.parametrize("extra", CONFIGS)
def test_equals_native_search_on_the_toy_model(extra):
    cfg = SearchConfig(**{"max_len_a": 1.0, "max_len_b": 3, **extra})
    run_both(ToyModel(vocab=9, seed=2), [[4, 5, 6, 7], [8], [], [4, 4, 4, 4, 4, 4], [6, 7, 8]], cfg)


@pytest.fixture(scope="module")
def reverser():
    torch.set_num_threads(1)
    return load_reverser()


@pytest.mark.parametrize("extra", [dict(beam=4, nbest=4), dict(beam=5, nbest=2, min_len=10), dict(beam=1, min_len=6),
                                   dict(beam=3, no_repeat_ngram_size=2, min_len=4, lenpen=1.0,
                                        lenpen_form="fairseq", early_stop="beam")])
def test_equals_native_search_on_a_real_transformer(reverser, extra):
    """The real incremental cache under the numpy search's reordering (beams, sentences leaving)."""
    out = run_both(reverser, REV_SRCS, SearchConfig(**extra), tol=1e-4)
    if extra["beam"] > 1 and extra.get("nbest", 1) == extra["beam"]:
        assert all(len({tuple(h.tokens) for h in hyps}) == extra["beam"] for hyps in out)  # real choices


@pytest.mark.parametrize("lenpen,form", [(0.6, "gnmt"), (1.0, "fairseq"), (-0.5, "gnmt")])
def test_large_beam_is_exact(lenpen, form):
    """beam >= (allowed tokens)^max_len keeps every prefix: the best hypothesis is brute force's."""
    model = ToyModel(vocab=6, seed=1)
    max_len = 4
    cfg = SearchConfig(beam=3**max_len, lenpen=lenpen, lenpen_form=form, max_len_a=0, max_len_b=max_len)
    out = arrays.search(AsArrays(model), src_batch(SRCS).numpy(), cfg)
    for src_row, hyps in zip(SRCS, out):
        best_score, best_tokens = exhaustive(model, src_row, cfg, max_len)
        assert hyps[0].tokens == best_tokens
        assert hyps[0].score == pytest.approx(best_score, abs=1e-5)


@pytest.mark.parametrize("extra", [{}, {"early_stop": "beam", "nbest": 2, "lenpen": 1.0, "lenpen_form": "fairseq"},
                                   {"min_len": 3, "no_repeat_ngram_size": 2}])
def test_matches_the_plain_reference_beam_search(extra):
    model = ToyModel(vocab=9, seed=2)
    cfg = SearchConfig(beam=3, max_len_a=1.0, max_len_b=3, **extra)
    srcs = [[4, 5, 6, 7], [8], [], [6, 7, 8]]
    for src_row, hyps in zip(srcs, arrays.search(AsArrays(model), src_batch(srcs).numpy(), cfg)):
        ref = reference_beam(model, src_row, cfg, len(src_row) + 3)
        assert [h.tokens for h in hyps] == [r[1] for r in ref]
        assert [h.score for h in hyps] == pytest.approx([r[0] for r in ref], abs=1e-5)


def test_greedy_is_arg_max_of_the_uncached_model(reverser):
    """Greedy search over arrays follows the arg-max of full forward passes (no cache at all)."""
    cfg = SearchConfig(beam=1, max_len_a=1, max_len_b=5)
    out = arrays.search(AsArrays(Uncached(reverser)), src_batch(REV_SRCS).numpy(), cfg)
    for src_row, hyps in zip(REV_SRCS, out):
        prefix = []
        with torch.inference_mode():
            while len(prefix) < len(src_row) + 5:
                logits = reverser(src_batch([src_row]), torch.tensor([[1] + prefix]))[0, -1]
                logits[[0, 1]] = -math.inf
                tok = int(logits.argmax())
                if tok == 2:
                    break
                prefix.append(tok)
        assert hyps[0].tokens == prefix


@pytest.mark.parametrize("V", [7, 8003, 33])
@pytest.mark.parametrize("k", [1, 4])
def test_row_topk_is_the_sorted_top_k(V, k):
    rng = np.random.default_rng(V + k)
    x = rng.standard_normal((37, V)).astype(np.float32)
    x[0] = -np.inf  # a dead row
    x[1, : V // 2] = -np.inf
    v, i = arrays.row_topk(x, k)
    want = -np.sort(-x, axis=1)[:, :k]
    assert np.array_equal(v, want)
    assert np.array_equal(np.take_along_axis(x, i, 1), want)
    assert (np.diff(v[2:], axis=1) <= 0).all()


def test_empty_batch():
    assert arrays.search(None, np.zeros((0, 1), np.int64), SearchConfig()) == []


def test_sampling_filter_equals_native():
    """Temperature, top-k and top-p keep the tokens native sampling keeps, with the same logits."""
    from nmtkit.search.beam import _filter_for_sampling

    rng = np.random.default_rng(0)
    x = np.log(rng.dirichlet(np.full(50, 0.3), size=20)).astype(np.float32)
    for extra in (dict(topk=5), dict(topp=0.7), dict(topk=10, topp=0.5, temperature=0.7), dict(temperature=2.0)):
        cfg = SearchConfig(sampling=True, **extra)
        mine, native = arrays.filter_for_sampling(x, cfg), _filter_for_sampling(torch.from_numpy(x), cfg).numpy()
        assert np.array_equal(np.isneginf(mine), np.isneginf(native)), extra
        assert np.allclose(mine[~np.isneginf(mine)], native[~np.isneginf(native)])


def test_sampling_is_seeded_scored_by_the_model_and_top1_is_greedy(reverser):
    from tests.test_search import rescore

    src = src_batch(REV_SRCS).numpy()
    cfg = SearchConfig(sampling=True, beam=6, nbest=6, seed=3)
    a = arrays.search(AsArrays(reverser), src, cfg)
    assert a == arrays.search(AsArrays(reverser), src, cfg)  # the same seed, the same samples
    other = arrays.search(AsArrays(reverser), src, SearchConfig(sampling=True, beam=6, nbest=6, seed=4))
    assert [h.tokens for hs in a for h in hs] != [h.tokens for hs in other for h in hs]
    assert sum(len({tuple(h.tokens) for h in hs}) > 1 for hs in a) >= 3  # they are samples
    for row, hyps in zip(REV_SRCS, a):  # a sample's scores are the model's log-probs (no temperature)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.positional_scores == pytest.approx(rescore(reverser, row, h.tokens), abs=1e-4)
    greedy = run_both(reverser, REV_SRCS, SearchConfig(beam=1), tol=1e-4)
    top1 = arrays.search(AsArrays(reverser), src, SearchConfig(sampling=True, beam=3, nbest=3, topk=1, seed=1))
    assert all(h.tokens == g[0].tokens for g, hs in zip(greedy, top1) for h in hs)


# --- property tests (Hypothesis) ---
#
# Generated search settings and batches of sources, from the empty sentence up to exactly the
# model's max_source_positions (tokens + </s>), with the output limit capped by its
# max_target_positions as the Translator caps it: the numpy search and the torch search, fed the
# same log-probs (the same model behind `AsArrays`), give the same hypotheses.

import functools  # noqa: E402

from hypothesis import event, given, strategies as st  # noqa: E402

from nmtkit.search.config import EARLY_STOP, LENPEN_FORMS, UNK  # noqa: E402


class LimitedToy(ToyModel):
    """The hash-table model with a Transformer's position limits: a longer source, or a step past
    the decoder's last position, is an error rather than a silently accepted input."""

    def __init__(self, vocab, seed, max_source_positions, max_target_positions):
        super().__init__(vocab, seed)
        self.max_source_positions, self.max_target_positions = max_source_positions, max_target_positions

    def encode(self, src):
        assert src.size(1) <= self.max_source_positions
        return super().encode(src)

    def decode_step(self, prev, enc, cache):
        assert cache.steps < self.max_target_positions
        return super().decode_step(prev, enc, cache)


@functools.lru_cache(maxsize=None)
def limited_model(kind):
    """("toy", V, seed): a LimitedToy; "reverser": the half-trained Transformer with its (computed,
    not stored) sinusoid positions cut to 10 source and 12 target positions."""
    if kind == "reverser":
        from pathlib import Path

        from nmtkit.models import ArchConfig, Transformer

        torch.set_num_threads(1)
        weights = torch.load(Path(__file__).parent / "golden" / "search_models.pt", weights_only=True)["post"]
        cfg = ArchConfig(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0,
                         max_source_positions=10, max_target_positions=12)
        m = Transformer(cfg, 12, 12)
        m.load_state_dict({k: v.float() for k, v in weights.items()})
        m.eval()
        m.V = 12
        return m
    _, vocab, seed = kind
    return LimitedToy(vocab, seed, max_source_positions=9, max_target_positions=11)


@st.composite
def search_cases(draw):
    """(model kind, source rows, SearchConfig) with every rule of the beam and greedy searches."""
    kind = draw(st.sampled_from(["reverser"]) | st.tuples(st.just("toy"), st.integers(4, 12), st.integers(0, 3)))
    model = limited_model(kind)
    longest = model.max_source_positions - 1  # tokens before </s>
    symbols = st.integers(UNK, model.V - 1)
    length = st.just(longest) | st.integers(0, longest)
    srcs = draw(st.lists(length.flatmap(lambda n: st.lists(symbols, min_size=n, max_size=n)), min_size=1, max_size=4))
    real = functools.partial(st.floats, width=32, allow_subnormal=False)  # what SearchConfig accepts
    beam = draw(st.integers(2, 5) | st.just(1))
    top = model.max_target_positions - 1  # the Translator's cap: decoder positions 0 .. top
    cfg = SearchConfig(
        beam=beam, nbest=draw(st.integers(1, beam)), early_stop=draw(st.sampled_from(EARLY_STOP)),
        lenpen_form=draw(st.sampled_from(LENPEN_FORMS)),
        lenpen=draw(st.sampled_from([0.0, 0.6, 1.0, -0.5]) | real(-3.0, 3.0)),
        max_len_a=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]) | real(0.0, 3.0)),
        max_len_b=draw(st.integers(0, 12)), min_len=draw(st.integers(0, 14)),
        no_repeat_ngram_size=draw(st.integers(0, 3)),
        unk_penalty=draw(st.sampled_from([0.0, 0.0, 1.5, -2.0]) | real(-6.0, 6.0)),
        max_len_cap=draw(st.just(top) | st.integers(0, top)))
    return kind, srcs, cfg


def same_hypotheses(mine, native, tol=1e-5):
    """The same tokens, scores, log-probs and per-token log-probs, within 1e-5 or float32 rounding
    (a relative 1e-6) for large scores: greedy search sums a row's float32 log-probs in numpy's
    order or torch's, one unit in the last place apart, and a length penalty below 1 (a negative
    --lenpen) scales that up past 1e-5 (-125.070465 against -125.070475)."""
    assert len(mine) == len(native)
    close = functools.partial(pytest.approx, abs=tol, rel=1e-6)
    for a, b in zip(mine, native):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == close([h.score for h in b])
        assert [h.logprob for h in a] == close([h.logprob for h in b])
        for x, y in zip(a, b):
            assert x.positional_scores == close(y.positional_scores)


@pytest.mark.fuzz
@given(search_cases())
def test_search_property_numpy_equals_torch(case):
    kind, srcs, cfg = case
    model, src = limited_model(kind), src_batch(srcs)
    assert src.size(1) <= model.max_source_positions
    with torch.inference_mode():
        native = search(model, src, cfg)
    same_hypotheses(arrays.search(AsArrays(model), src.numpy(), cfg), native)
    limits = arrays.max_lengths(src.numpy(), cfg).tolist()
    event("the reverser" if kind == "reverser" else "a toy model")
    event(f"source at the position limit: {src.size(1) == model.max_source_positions}")
    event(f"output limit reached: {any(len(h.tokens) == n for hs, n in zip(native, limits) for h in hs)}")
    last = any(len(h.tokens) + 1 == model.max_target_positions for hs in native for h in hs)
    event(f"output at the decoder's last position: {last}")
    event("greedy" if cfg.beam == 1 else f"beam, early stop {cfg.early_stop}")
