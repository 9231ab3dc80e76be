"""Search correctness: beam search against exhaustive search and a plain reference beam search,
batching, caching, greedy, ensembles and the per-step rules.

Two kinds of model implement the documented interface (encode / new_cache / decode_step /
index_select): `ToyModel`, a hand-made next-token table indexed by a hash of (source, prefix),
fast and fully deterministic; and the real `Transformer` (random-initialised with peaked
logits), for the tests whose point is the real incremental cache.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
import torch

from nmtkit.search.beam import EOS, PAD, BOS, UNK, SearchConfig, length_penalty, search

torch.set_num_threads(1)

# --------------------------------------------------------------------------------------------
# A hand-made model: logits = table[hash(source, prefix)], so every prefix has its own random
# (peaked) next-token distribution and beam search has real choices to make.


@dataclass
class ToyEnc:
    key: torch.Tensor  # (B,) long: a hash of the source sentence

    def index_select(self, order):
        return ToyEnc(self.key.index_select(0, order))


class ToyCache:
    def __init__(self):
        self.h = None  # (N,) long: hash of the prefix so far
        self.steps = 0

    def index_select(self, order):
        if self.h is not None:
            self.h = self.h.index_select(0, order)


class ToyModel:
    M = 10007

    def __init__(self, vocab: int, seed: int = 0, scale: float = 3.0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(self.M, vocab, generator=g) * scale  # (M, V)
        self.V = vocab

    def encode(self, src):  # (B, S) -> ToyEnc
        w = torch.arange(1, src.size(1) + 1)
        return ToyEnc((src * w * 7919).sum(1) % self.M)

    def new_cache(self):
        return ToyCache()

    def decode_step(self, prev, enc, cache):  # (N, 1) -> (N, 1, V)
        prev = prev.view(-1)
        h = enc.key.clone() if cache.h is None else cache.h
        cache.h = (h * 131 + prev * 17 + 3) % self.M
        cache.steps += 1
        return self.table[cache.h].unsqueeze(1)


def src_batch(rows):
    """Rows of token ids (without </s>) -> (B, S) padded tensor with </s> appended."""
    S = max(len(r) for r in rows) + 1
    out = torch.full((len(rows), S), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r) + 1] = torch.tensor(list(r) + [EOS])
    return out


# --------------------------------------------------------------------------------------------
# References written for clarity, one sentence at a time, without any cache.


def prefix_logprobs(model, src_row, prefix, t, cfg, max_len):
    """Log-probs of the next token after `prefix` with the search's rules, by re-running the model
    from scratch (no reuse of any state)."""
    src = src_batch([src_row])
    seq = [BOS] + list(prefix)
    if hasattr(model, "full_logits"):  # one full forward pass over the whole prefix
        logits = model.full_logits(src, torch.tensor([seq]))
    else:
        enc = model.encode(src)
        cache = model.new_cache()
        for tok in seq:
            logits = model.decode_step(torch.tensor([[tok]]), enc, cache)
    lp = torch.log_softmax(logits[0, -1].double(), dim=-1)
    lp[PAD] = -math.inf
    lp[BOS] = -math.inf
    lp[UNK] -= cfg.unk_penalty
    n = cfg.no_repeat_ngram_size
    if n and len(prefix) >= n:
        for i in range(len(prefix) - n + 1):
            if tuple(prefix[i : i + n - 1]) == tuple(prefix[len(prefix) - n + 1 :]):
                lp[prefix[i + n - 1]] = -math.inf
    if t < min(cfg.min_len, max_len):
        lp[EOS] = -math.inf
    if t >= max_len:
        keep = lp[EOS].item()
        lp[:] = -math.inf
        lp[EOS] = keep
    return lp.tolist()


def exhaustive(model, src_row, cfg, max_len):
    """Best (score, tokens) over every sequence of <= max_len tokens followed by </s>."""
    V = model.V if hasattr(model, "V") else None
    best = (-math.inf, None)
    memo = {}

    def lps(prefix):
        if prefix not in memo:
            memo[prefix] = prefix_logprobs(model, src_row, prefix, len(prefix), cfg, max_len)
        return memo[prefix]

    def rec(prefix, logp):
        nonlocal best
        lp = lps(prefix)
        t = len(prefix)
        if lp[EOS] > -math.inf:
            s = (logp + lp[EOS]) / length_penalty(float(t + 1), cfg.lenpen, cfg.lenpen_form)
            if s > best[0]:
                best = (s, list(prefix))
        if t < max_len:
            for v in range(len(lp)):
                if v != EOS and lp[v] > -math.inf:
                    rec(prefix + (v,), logp + lp[v])

    rec((), 0.0)
    return best


def reference_beam(model, src_row, cfg, max_len):
    """The documented beam search, written plainly: returns [(score, tokens)] best first."""
    K = cfg.beam
    lpf = lambda L: length_penalty(float(L), cfg.lenpen, cfg.lenpen_form)  # noqa: E731
    alive = [(0.0, ())]
    finished = []
    for t in range(max_len + 1):
        cands, eos_cands = [], []
        for logp, prefix in alive:
            lp = prefix_logprobs(model, src_row, prefix, t, cfg, max_len)
            if lp[EOS] > -math.inf:
                eos_cands.append((logp + lp[EOS], list(prefix)))
            cands += [(logp + lp[v], prefix + (v,)) for v in range(len(lp)) if v != EOS and lp[v] > -math.inf]
        alive = sorted(cands, key=lambda x: -x[0])[:K]
        if cfg.early_stop == "beam":  # fairseq: only </s> extensions among the K best candidates
            every = sorted([c[0] for c in alive] + [e[0] for e in eos_cands], reverse=True)
            kth = every[K - 1] if len(every) >= K else -math.inf
            eos_cands = [e for e in eos_cands if e[0] >= kth]
        finished += [(logp / lpf(t + 1), prefix) for logp, prefix in eos_cands]
        finished = sorted(finished, key=lambda x: -x[0])[:K]
        if not alive:
            break
        if cfg.early_stop == "bound" and len(finished) >= cfg.nbest:
            bound = alive[0][0] / max(lpf(t + 2), lpf(max_len + 1))
            if finished[cfg.nbest - 1][0] >= bound:
                break
        if cfg.early_stop == "beam" and len(finished) >= K:
            break
    return finished[: cfg.nbest]


# --------------------------------------------------------------------------------------------
# Tests on the toy model.

SRCS = [[4, 5, 4], [5], [4, 4, 5, 5, 4], [], [5, 4]]


@pytest.mark.parametrize(
    "lenpen,form", [(0.6, "gnmt"), (1.0, "fairseq"), (0.0, "gnmt"), (-0.5, "gnmt"), (2.0, "fairseq")]
)
def test_large_beam_is_exact(lenpen, form):
    """With beam >= (allowed tokens)^max_len every prefix survives every step, so beam search is
    exhaustive: its best hypothesis and score must equal brute force over all sequences."""
    model = ToyModel(vocab=6, seed=1)  # allowed non-</s> tokens: <unk>, 4, 5 -> 3
    max_len = 4
    cfg = SearchConfig(beam=3**max_len, lenpen=lenpen, lenpen_form=form, max_len_a=0, max_len_b=max_len)
    out = search(model, src_batch(SRCS), cfg)
    for src_row, hyps in zip(SRCS, out):
        best_score, best_tokens = exhaustive(model, src_row, cfg, max_len)
        assert hyps[0].tokens == best_tokens
        assert hyps[0].score == pytest.approx(best_score, abs=1e-5)


def test_exhaustive_beats_greedy_somewhere():
    """Guard for the test above: on this model the search problem is not trivial (greedy is
    sub-optimal for some sentence), so agreeing with brute force means something."""
    model = ToyModel(vocab=6, seed=1)
    max_len = 4
    cfg = SearchConfig(beam=1, lenpen=0.6, max_len_a=0, max_len_b=max_len)
    greedy = search(model, src_batch(SRCS), cfg)
    gaps = [exhaustive(model, s, cfg, max_len)[0] - h[0].score for s, h in zip(SRCS, greedy)]
    assert all(g >= -1e-6 for g in gaps)
    assert max(gaps) > 1e-3


@pytest.mark.parametrize("beam", [2, 4, 7])
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"lenpen": 1.0, "lenpen_form": "fairseq"},
        {"min_len": 3},
        {"no_repeat_ngram_size": 2},
        {"unk_penalty": 1.5},
        {"nbest": 2},
        {"early_stop": "none"},
        {"early_stop": "beam"},
        {"early_stop": "beam", "nbest": 2, "lenpen": 1.0, "lenpen_form": "fairseq"},
        {"early_stop": "beam", "min_len": 3, "no_repeat_ngram_size": 2},
    ],
)
def test_matches_reference_beam(beam, extra):
    """The batched, vectorised beam search equals a plain one-sentence-at-a-time implementation of
    the documented algorithm (same hypotheses, same scores) for small beams."""
    if extra.get("nbest", 1) > beam:
        pytest.skip("nbest > beam")
    model = ToyModel(vocab=9, seed=2)
    cfg = SearchConfig(beam=beam, max_len_a=1.0, max_len_b=3, **extra)
    srcs = [[4, 5, 6, 7], [8], [], [4, 4, 4, 4, 4, 4], [6, 7, 8]]
    out = search(model, src_batch(srcs), cfg)
    for src_row, hyps in zip(srcs, out):
        ref = reference_beam(model, src_row, cfg, len(src_row) + 3)
        assert [h.tokens for h in hyps] == [r[1] for r in ref]
        assert [h.score for h in hyps] == pytest.approx([r[0] for r in ref], abs=1e-5)


def test_scores_are_consistent():
    """score = sum(positional scores) / lp(len+1); positional scores include </s>."""
    model = ToyModel(vocab=9, seed=3)
    for beam in (1, 4):
        cfg = SearchConfig(beam=beam, nbest=beam, lenpen=0.6)
        for hyps in search(model, src_batch(SRCS), cfg):
            for h in hyps:
                assert len(h.positional_scores) == len(h.tokens) + 1
                assert h.logprob == pytest.approx(sum(h.positional_scores), abs=1e-5)
                assert h.score == pytest.approx(h.logprob / ((5 + len(h.tokens) + 1) / 6) ** 0.6, abs=1e-5)
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_early_stop_never_changes_the_result():
    model = ToyModel(vocab=12, seed=4)
    srcs = [[4, 5, 6, 7, 8, 9, 10], [11], [4, 4], []]
    for lenpen, form in [(0.6, "gnmt"), (1.0, "fairseq"), (-0.3, "gnmt")]:
        a = search(model, src_batch(srcs), SearchConfig(beam=4, nbest=3, lenpen=lenpen, lenpen_form=form))
        b = search(
            model, src_batch(srcs), SearchConfig(beam=4, nbest=3, lenpen=lenpen, lenpen_form=form, early_stop="none")
        )
        for ha, hb in zip(a, b):
            assert [h.tokens for h in ha] == [h.tokens for h in hb]
            assert [h.score for h in ha] == pytest.approx([h.score for h in hb])


class ScriptedModel(ToyModel):
    """Next-token distribution fixed by the position only: </s> is likely at once (p=0.7), but
    after one token `4` the continuation `4 4 4 ...` is almost certain and </s> becomes likely
    from position 5 on. With a length penalty favouring length, the long hypothesis wins, and a
    search that stopped as soon as the short one finished would miss it."""

    def __init__(self):
        self.V = 6

    def decode_step(self, prev, enc, cache):
        cache.steps += 1
        t = cache.steps - 1
        p = torch.zeros(6)  # only </s> and 4 are possible: brute force stays linear
        if t == 0:
            p[EOS], p[4] = 0.7, 0.3
        elif t < 5:
            p[4] = 0.999
        else:
            p[EOS], p[4] = 0.5, 0.5
        return torch.log(p / p.sum()).expand(prev.size(0), 1, 6).clone()

    def new_cache(self):
        c = ToyCache()
        return c


def test_early_stop_waits_for_the_bound():
    """t2t's bound divides by the penalty at the *maximum* length; dividing by the penalty of the
    next length instead would stop after the first step here and return the empty hypothesis."""
    model = ScriptedModel()
    for cfg in (
        SearchConfig(beam=2, lenpen=1.0, lenpen_form="fairseq", max_len_a=0, max_len_b=10),
        SearchConfig(beam=2, lenpen=3.0, lenpen_form="gnmt", max_len_a=0, max_len_b=10),
    ):
        hyp = search(model, src_batch([[4]]), cfg)[0][0]
        best_score, best_tokens = exhaustive(model, [4], cfg, 10)
        assert hyp.tokens == best_tokens and len(best_tokens) >= 5
        assert hyp.score == pytest.approx(best_score, abs=1e-6)


def test_batched_equals_one_at_a_time():
    model = ToyModel(vocab=11, seed=5)
    srcs = [[4, 5, 6], [7], [], [8, 9, 10, 4, 5, 6, 7], [5, 5]]
    for cfg in (SearchConfig(beam=4, nbest=2), SearchConfig(beam=1)):
        batched = search(model, src_batch(srcs), cfg)
        for src_row, hyps in zip(srcs, batched):
            single = search(model, src_batch([src_row]), cfg)[0]
            assert [h.tokens for h in hyps] == [h.tokens for h in single]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in single])


def test_greedy_is_arg_max_and_beam_search_never_worse():
    """beam 1 is greedy: each token is the arg-max of the (rule-adjusted) distribution and decoding
    stops at the first </s>. Beam search (beam 1 through the beam code, or wider) never finds a
    worse-scoring hypothesis than greedy."""
    from nmtkit.search.beam import _beam_search, _Ensemble

    model = ToyModel(vocab=10, seed=6)
    srcs = [[4, 5], [6, 7, 8, 9], [], [4]]
    cfg = SearchConfig(beam=1, max_len_a=1, max_len_b=4)
    greedy = search(model, src_batch(srcs), cfg)
    for src_row, hyps in zip(srcs, greedy):
        prefix, max_len = [], len(src_row) + 4
        while True:
            lp = prefix_logprobs(model, src_row, tuple(prefix), len(prefix), cfg, max_len)
            tok = max(range(len(lp)), key=lambda v: lp[v])
            if tok == EOS:
                break
            prefix.append(tok)
        assert hyps[0].tokens == prefix
    with torch.inference_mode():
        beam1 = _beam_search(_Ensemble([model]), src_batch(srcs), cfg)
        beam1_fairseq = _beam_search(_Ensemble([model]), src_batch(srcs), dataclasses.replace(cfg, early_stop="beam"))
    beam4 = search(model, src_batch(srcs), SearchConfig(beam=4, max_len_a=1, max_len_b=4))
    for g, b1, b1f, b4 in zip(greedy, beam1, beam1_fairseq, beam4):
        assert b1[0].score >= g[0].score - 1e-6
        assert b4[0].score >= g[0].score - 1e-6
        # Under fairseq's rules beam search with beam 1 *is* greedy search.
        assert b1f[0].tokens == g[0].tokens
        assert b1f[0].score == pytest.approx(g[0].score, abs=1e-6)
    assert any(b[0].tokens != g[0].tokens for g, b in zip(greedy, beam1))  # guard: the rules differ


def test_ensemble_of_itself_equals_single():
    model = ToyModel(vocab=10, seed=7)
    for cfg in (SearchConfig(beam=4, nbest=2), SearchConfig(beam=1)):
        a = search(model, src_batch(SRCS), cfg)
        b = search([model, model, model], src_batch(SRCS), cfg)
        for ha, hb in zip(a, b):
            assert [h.tokens for h in ha] == [h.tokens for h in hb]
            assert [h.score for h in ha] == pytest.approx([h.score for h in hb], abs=1e-5)


def test_ensemble_averages_log_probs():
    """Two different models: the ensemble's scores are the mean of the models' log-probs."""
    m1, m2 = ToyModel(vocab=8, seed=8), ToyModel(vocab=8, seed=9)
    cfg = SearchConfig(beam=3)
    src = src_batch([[4, 5, 6]])
    hyp = search([m1, m2], src, cfg)[0][0]
    prefix = [BOS] + hyp.tokens
    total = 0.0
    for m in (m1, m2):
        enc, cache = m.encode(src), m.new_cache()
        for i, tok in enumerate(prefix):
            lp = torch.log_softmax(m.decode_step(torch.tensor([[tok]]), enc, cache)[0, 0].double(), -1)
            total += lp[(hyp.tokens + [EOS])[i]].item() / 2
    assert hyp.logprob == pytest.approx(total, abs=1e-5)


def test_min_len_and_max_len_respected():
    model = ToyModel(vocab=10, seed=10)
    srcs = [[4] * n for n in range(6)]
    for beam in (1, 4):
        out = search(model, src_batch(srcs), SearchConfig(beam=beam, min_len=5, max_len_a=1, max_len_b=2))
        for src_row, hyps in zip(srcs, out):
            n = len(hyps[0].tokens)
            assert min(5, len(src_row) + 2) <= n <= len(src_row) + 2
        out = search(model, src_batch(srcs), SearchConfig(beam=beam, max_len_a=0, max_len_b=0))
        assert all(h[0].tokens == [] for h in out)
        out = search(model, src_batch(srcs), SearchConfig(beam=beam, max_len_a=2, max_len_b=0, max_len_cap=3))
        assert all(len(h[0].tokens) <= min(3, 2 * len(s)) for s, h in zip(srcs, out))


def test_min_len_changes_the_result():
    """Guard: without min_len this model produces short outputs, so the test above has teeth."""
    model = ToyModel(vocab=10, seed=10)
    srcs = [[4] * n for n in range(6)]
    out = search(model, src_batch(srcs), SearchConfig(beam=4, max_len_a=1, max_len_b=2))
    assert any(len(h[0].tokens) < min(5, len(s) + 2) for s, h in zip(srcs, out))


def has_repeat(tokens, n):
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(n):
    model = ToyModel(vocab=7, seed=11, scale=1.0)
    srcs = [[4] * 12, [5, 6] * 6, [6] * 9]
    plain = search(model, src_batch(srcs), SearchConfig(beam=4, nbest=4, min_len=8))
    assert any(has_repeat(h.tokens, n) for hyps in plain for h in hyps)  # guard: repeats happen
    for beam in (1, 4):
        out = search(
            model, src_batch(srcs), SearchConfig(beam=beam, nbest=beam, min_len=8, no_repeat_ngram_size=n)
        )
        for hyps in out:
            for h in hyps:
                assert not has_repeat(h.tokens, n), (n, h.tokens)


def test_unk_penalty():
    model = ToyModel(vocab=7, seed=12, scale=1.0)
    srcs = [[4] * k for k in range(1, 8)]
    plain = search(model, src_batch(srcs), SearchConfig(beam=4, min_len=4))
    assert any(UNK in h[0].tokens for h in plain)  # guard
    out = search(model, src_batch(srcs), SearchConfig(beam=4, min_len=4, unk_penalty=100.0))
    assert all(UNK not in h[0].tokens for h in out)


def test_never_emits_pad_or_bos():
    model = ToyModel(vocab=6, seed=13)
    model.table[:, PAD] += 50.0
    model.table[:, BOS] += 50.0
    out = search(model, src_batch(SRCS), SearchConfig(beam=3, nbest=3))
    for hyps in out:
        for h in hyps:
            assert PAD not in h.tokens and BOS not in h.tokens


def test_sampling_is_seeded_and_respects_topk():
    model = ToyModel(vocab=20, seed=14, scale=0.5)
    cfg = SearchConfig(beam=5, nbest=5, sampling=True, topk=3, seed=123, temperature=1.0)
    a = search(model, src_batch(SRCS), cfg)
    b = search(model, src_batch(SRCS), cfg)
    c = search(model, src_batch(SRCS), SearchConfig(beam=5, nbest=5, sampling=True, topk=3, seed=124))
    toks = lambda r: [[h.tokens for h in hyps] for hyps in r]  # noqa: E731
    assert toks(a) == toks(b)
    assert toks(a) != toks(c)
    # Every sampled token is among the 3 most likely (after the rules) for its prefix.
    for src_row, hyps in zip(SRCS, a):
        for h in hyps:
            for t, tok in enumerate(h.tokens + [EOS]):
                lp = prefix_logprobs(model, src_row, tuple(h.tokens[:t]), t, cfg, len(src_row) + 50)
                top3 = sorted(range(len(lp)), key=lambda v: -lp[v])[:3]
                assert tok in top3


def test_topp_keeps_the_nucleus():
    from nmtkit.search.beam import _filter_for_sampling

    lp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(_filter_for_sampling(lp, SearchConfig(topp=0.8)))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(_filter_for_sampling(lp, SearchConfig(topp=0.81)))
    assert kept.tolist() == [[True, True, True, False]]
    kept = torch.isfinite(_filter_for_sampling(lp, SearchConfig(topp=0.1)))
    assert kept.tolist() == [[True, False, False, False]]


def test_length_penalty_forms():
    assert length_penalty(7.0, 0.6, "gnmt") == pytest.approx((12 / 6) ** 0.6)
    assert length_penalty(7.0, 0.6, "fairseq") == pytest.approx(7**0.6)
    assert length_penalty(1.0, 0.6, "gnmt") == pytest.approx(1.0)


def test_config_validation():
    for bad in ({"beam": 0}, {"nbest": 5, "beam": 4}, {"lenpen_form": "x"}, {"temperature": 0}, {"topp": 1.5}):
        with pytest.raises(ValueError):
            SearchConfig(**bad)


# --------------------------------------------------------------------------------------------
# The real Transformer: its incremental cache under beam reordering, padding in batches, and
# exactness against brute force computed with full (uncached) forward passes.


def tiny_transformer(vocab: int, seed: int, peak: float = 2.0, layers: int = 2):
    """A random-initialised real Transformer whose logits are made peaked (embeddings, which are
    also the output projection, scaled by `peak`) so that search has clear but non-trivial
    choices."""
    from nmtkit.models import ArchConfig, Transformer

    torch.manual_seed(seed)
    cfg = ArchConfig(
        encoder_layers=layers, decoder_layers=layers, d_model=32, d_ff=64, heads=4, dropout=0.0,
        max_source_positions=64, max_target_positions=64,
    )
    m = Transformer(cfg, vocab, vocab).eval()
    with torch.no_grad():
        m.tgt_embed.weight.mul_(peak)
    m.V = vocab
    return m


@pytest.fixture(scope="module")
def reverser():
    return load_reverser()


def load_reverser():
    """A real Transformer trained briefly to reverse sequences of the symbols 4..11 (2+2 layers,
    d_model 32, V = 12): tests/test_search_golden.py's "post" model, loaded from its stored
    weights. Half-trained on purpose: its distributions depend on the source and the whole
    prefix and are neither flat nor one-hot, so beams hold different histories and search has
    real choices (random-initialised models just repeat one token). Loaded rather than trained
    here: training took 9 s, paid again by every process of a mutation run (docs/testing.md)."""
    from pathlib import Path

    from nmtkit.models import ArchConfig, Transformer

    weights = torch.load(Path(__file__).parent / "golden" / "search_models.pt", weights_only=True)["post"]
    cfg = ArchConfig(
        encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0,
        max_source_positions=64, max_target_positions=64,
    )
    m = Transformer(cfg, 12, 12)
    m.load_state_dict({k: v.float() for k, v in weights.items()})
    m.eval()
    m.V = 12
    return m


@dataclass
class FullEnc:
    src: torch.Tensor  # (B, S)

    def index_select(self, order):
        return FullEnc(self.src.index_select(0, order))


class FullCache:
    def __init__(self):
        self.prefix = None  # (N, t) decoder inputs so far

    def index_select(self, order):
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, order)


class Uncached:
    """The same model behind the same interface, but every step re-runs the whole encoder and
    decoder on the full prefix (model.forward): no incremental state at all."""

    def __init__(self, model):
        self.m, self.V = model, model.V

    def encode(self, src):
        return FullEnc(src)

    def new_cache(self):
        return FullCache()

    def decode_step(self, prev, enc, cache):
        cache.prefix = prev if cache.prefix is None else torch.cat([cache.prefix, prev], dim=1)
        return self.m(enc.src, cache.prefix)[:, -1:, :]

    def full_logits(self, src, prev):
        with torch.inference_mode():
            return self.m(src, prev)[:, -1:, :]


REAL_SRCS = [[4, 5, 4, 4, 5], [5], [4, 4], [5, 5, 4, 5, 4, 4, 5, 4], []]


def same(a, b, tol=1e-4):
    for ha, hb in zip(a, b):
        assert [h.tokens for h in ha] == [h.tokens for h in hb]
        assert [h.score for h in ha] == pytest.approx([h.score for h in hb], abs=tol)
        for x, y in zip(ha, hb):
            assert x.positional_scores == pytest.approx(y.positional_scores, abs=tol)


REV_SRCS = [[4, 5, 6, 7, 8], [9], [], [10, 11, 4, 4, 5, 6, 7, 8], [6, 6]]


def test_reverser_is_not_degenerate(reverser):
    """Guard for the tests below: hypotheses in a beam differ, and the model has learnt something
    of the task (it is half-trained on purpose)."""
    out = search(reverser, src_batch(REV_SRCS), SearchConfig(beam=4, nbest=4))
    assert all(len({tuple(h.tokens) for h in hyps}) == 4 for hyps in out)
    srcs = [[a, b, c] for a in range(4, 12, 2) for b in range(4, 12, 3) for c in (5, 9)]
    greedy = search(reverser, src_batch(srcs), SearchConfig(beam=1))
    beam = search(reverser, src_batch(srcs), SearchConfig(beam=4))
    assert sum(g[0].tokens[:1] == s[-1:] for s, g in zip(srcs, greedy)) >= 0.75 * len(srcs)  # learnt
    assert any(g[0].tokens != b[0].tokens for g, b in zip(greedy, beam))  # search matters


@pytest.mark.parametrize(
    "cfg",
    [
        SearchConfig(beam=4, nbest=4),
        SearchConfig(beam=5, nbest=2, min_len=10),  # long outputs: many steps of beam reordering
        SearchConfig(beam=1, min_len=6),
        SearchConfig(beam=3, no_repeat_ngram_size=2, min_len=4, lenpen=1.0, lenpen_form="fairseq"),
    ],
)
def test_real_transformer_cached_equals_uncached(reverser, cfg):
    src = src_batch(REV_SRCS)
    same(search(reverser, src, cfg), search(Uncached(reverser), src, cfg))


def rescore(model, src_row, tokens):
    """Per-token log-probs of `tokens + [</s>]` by one teacher-forced forward pass: independent of
    the search and of any incremental state or reordering."""
    with torch.inference_mode():
        logits = model(src_batch([src_row]), torch.tensor([[BOS] + tokens]))  # (1, T+1, V)
    lp = torch.log_softmax(logits[0].double(), dim=-1)
    return lp.gather(1, torch.tensor(tokens + [EOS]).unsqueeze(1)).view(-1).tolist()


@pytest.mark.parametrize(
    "cfg", [SearchConfig(beam=4, nbest=4), SearchConfig(beam=5, nbest=5, min_len=10), SearchConfig(beam=1, min_len=6)]
)
def test_real_transformer_scores_equal_teacher_forced_rescoring(reverser, cfg):
    """Every returned hypothesis' per-token scores equal a full forward pass over it: the cache,
    its reordering across beams and the batch shrinking never mix up histories."""
    for src_row, hyps in zip(REV_SRCS, search(reverser, src_batch(REV_SRCS), cfg)):
        for h in hyps:
            assert h.positional_scores == pytest.approx(rescore(reverser, src_row, h.tokens), abs=1e-4)


def test_real_transformer_batched_equals_single(reverser):
    for cfg in (SearchConfig(beam=4, nbest=2), SearchConfig(beam=4, min_len=8), SearchConfig(beam=1, min_len=5)):
        batched = search(reverser, src_batch(REV_SRCS), cfg)
        single = [search(reverser, src_batch([s]), cfg)[0] for s in REV_SRCS]
        same(batched, single)


@pytest.mark.parametrize("lenpen,form", [(0.6, "gnmt"), (1.0, "fairseq"), (-0.5, "gnmt")])
def test_real_transformer_large_beam_is_exact(lenpen, form):
    model = tiny_transformer(vocab=6, seed=2)  # non-</s> tokens the search may emit: <unk>, 4, 5
    max_len = 4
    cfg = SearchConfig(beam=3**max_len, lenpen=lenpen, lenpen_form=form, max_len_a=0, max_len_b=max_len)
    srcs = REAL_SRCS[:3]
    out = search(model, src_batch(srcs), cfg)
    ref = Uncached(model)
    for src_row, hyps in zip(srcs, out):
        best_score, best_tokens = exhaustive(ref, src_row, cfg, max_len)
        assert hyps[0].tokens == best_tokens
        assert hyps[0].score == pytest.approx(best_score, abs=1e-4)


def test_real_transformer_small_beam_matches_reference_and_greedy_is_worse_somewhere():
    """beam 4 equals the plain reference beam search; and on this model greedy is beaten by
    brute force for some sentence, so the exactness tests above are not trivially satisfied."""
    model = tiny_transformer(vocab=6, seed=2)
    ref = Uncached(model)
    max_len = 4
    srcs = REAL_SRCS[:4]
    cfg4 = SearchConfig(beam=4, max_len_a=0, max_len_b=max_len)
    out = search(model, src_batch(srcs), cfg4)
    for src_row, hyps in zip(srcs, out):
        r = reference_beam(ref, src_row, cfg4, max_len)
        assert hyps[0].tokens == r[0][1]
        assert hyps[0].score == pytest.approx(r[0][0], abs=1e-4)
    greedy = search(model, src_batch(srcs), SearchConfig(beam=1, max_len_a=0, max_len_b=max_len))
    gaps = [exhaustive(ref, s, cfg4, max_len)[0] - g[0].score for s, g in zip(srcs, greedy)]
    assert min(gaps) > -1e-5 and max(gaps) > 1e-3


def test_real_transformer_greedy_is_arg_max(reverser):
    ref = Uncached(reverser)
    cfg = SearchConfig(beam=1, max_len_a=1, max_len_b=5)
    for src_row, hyps in zip(REV_SRCS, search(reverser, src_batch(REV_SRCS), cfg)):
        prefix, max_len = [], len(src_row) + 5
        while True:
            lp = prefix_logprobs(ref, src_row, tuple(prefix), len(prefix), cfg, max_len)
            tok = max(range(len(lp)), key=lambda v: lp[v])
            if tok == EOS:
                break
            prefix.append(tok)
        assert hyps[0].tokens == prefix


def test_real_transformer_greedy_equals_beam1_under_fairseq_rules(reverser):
    from nmtkit.search.beam import _beam_search, _Ensemble

    srcs = [[a, b, c] for a in range(4, 12, 2) for b in range(4, 12, 3) for c in (5, 9)] + REV_SRCS
    for cfg in (SearchConfig(beam=1), SearchConfig(beam=1, min_len=4, lenpen=1.0, lenpen_form="fairseq")):
        greedy = search(reverser, src_batch(srcs), cfg)
        with torch.inference_mode():
            beam1 = _beam_search(_Ensemble([reverser]), src_batch(srcs), dataclasses.replace(cfg, early_stop="beam"))
        same(greedy, beam1, tol=1e-5)


def test_real_transformer_early_stop_rules(reverser):
    """"bound" gives exactly the "none" (decode to the limit) result; fairseq's "beam" rule never
    scores better than them and stops no later."""
    src = src_batch(REV_SRCS)
    for lenpen, form in ((0.6, "gnmt"), (1.0, "fairseq")):
        base = dict(beam=4, nbest=2, lenpen=lenpen, lenpen_form=form)
        none = search(reverser, src, SearchConfig(early_stop="none", **base))
        bound = search(reverser, src, SearchConfig(early_stop="bound", **base))
        fair = search(reverser, src, SearchConfig(early_stop="beam", **base))
        same(none, bound)
        for n, f in zip(none, fair):
            assert f[0].score <= n[0].score + 1e-6


def test_real_transformer_ensemble(reverser):
    other = tiny_transformer(vocab=12, seed=5, layers=1)
    src = src_batch(REV_SRCS)
    for cfg in (SearchConfig(beam=4, nbest=2), SearchConfig(beam=1)):
        same(search(reverser, src, cfg), search([reverser, reverser], src, cfg))
        same(search([reverser, other], src, cfg), search([Uncached(reverser), Uncached(other)], src, cfg))


@pytest.mark.parametrize("V", [7, 100, 8008, 8003, 33])
@pytest.mark.parametrize("k", [1, 4, 5])
def test_row_topk_equals_torch_topk(V, k):
    from nmtkit.search.beam import row_topk

    if k > V:
        pytest.skip("k > V")
    g = torch.Generator().manual_seed(V * 10 + k)
    x = torch.randn(37, V, generator=g)
    x[0] = -math.inf  # a dead row
    x[1, : V // 2] = -math.inf
    x[2, V - 1] = 100.0  # the best in the trailing columns that belong to no group
    v, i = row_topk(x, k)
    rv, ri = x.topk(k, dim=1)
    assert torch.equal(v, rv)
    assert torch.equal(x.gather(1, i), rv)  # same values at the returned indices
    assert torch.equal(i[3:], ri[3:])  # no ties in random rows: the same indices
