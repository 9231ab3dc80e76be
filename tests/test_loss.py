"""Label-smoothed cross-entropy against hand-computed values; padding ignored; reporting units."""

from __future__ import annotations

import math

import pytest
import torch

from nmtkit.training.loss import bits_per_token, label_smoothed_cross_entropy, perplexity


def logits_for(probs):
    return torch.log(torch.tensor(probs, dtype=torch.float64))


def test_matches_hand_computation_and_ignores_padding():
    # p = (0.1, 0.2, 0.3, 0.4) at every position (logits = log p, so logsumexp = 0), V = 4, eps = 0.1:
    # smoothed target q = 0.9 on gold, 0.1/3 on each other token.
    #   gold 3: -(0.1/3 * (ln .1 + ln .2 + ln .3) + 0.9 ln .4) = 0.9951948523452089, nll = -ln .4 = 0.916290731874155
    #   gold 1: -(0.1/3 * (ln .1 + ln .3 + ln .4) + 0.9 ln .2) = 1.5959224088304949, nll = -ln .2 = 1.6094379124341003
    row = logits_for([0.1, 0.2, 0.3, 0.4])
    logits = row.expand(1, 3, 4).clone()  # (batch=1, tgt_len=3, V=4)
    target = torch.tensor([[3, 1, 0]])  # the last position is padding
    loss, nll, n = label_smoothed_cross_entropy(logits, target, 0.1, ignore_index=0)
    assert n == 2
    assert loss.item() == pytest.approx(0.9951948523452089 + 1.5959224088304949, abs=1e-6)
    assert nll.item() == pytest.approx(0.916290731874155 + 1.6094379124341003, abs=1e-6)


def test_no_smoothing_is_plain_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    target = torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    loss, nll, n = label_smoothed_cross_entropy(logits, target, 0.0)
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    assert n == 8
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6) and nll.item() == pytest.approx(ref.item(), rel=1e-6)


def test_smoothing_equals_explicit_distribution_and_gradients_flow():
    torch.manual_seed(1)
    V, eps = 13, 0.2
    logits = torch.randn(3, 4, V, requires_grad=True)
    target = torch.randint(1, V, (3, 4))
    target[0, 2:] = 0
    loss, _, _ = label_smoothed_cross_entropy(logits, target, eps)
    q = torch.full((3, 4, V), eps / (V - 1)).scatter_(2, target.unsqueeze(2), 1 - eps)
    ref = -(q * logits.log_softmax(-1)).sum(-1)[target != 0].sum()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    (g1,) = torch.autograd.grad(loss, logits)
    (g2,) = torch.autograd.grad(ref, logits)
    assert torch.allclose(g1, g2, atol=1e-6)
    assert g1[0, 2:].abs().sum() == 0  # padded positions get no gradient


def test_bf16_logits_are_accumulated_in_float32():
    logits = logits_for([0.1, 0.2, 0.3, 0.4]).to(torch.bfloat16).expand(1, 2, 4)
    loss, nll, _ = label_smoothed_cross_entropy(logits, torch.tensor([[3, 1]]), 0.1)
    assert loss.dtype == torch.float32
    assert nll.item() == pytest.approx(0.916290731874155 + 1.6094379124341003, abs=2e-2)


def test_reporting_units():
    # 2 tokens with nll ln 4 each: 2 bits per token, ppl 4
    assert bits_per_token(2 * math.log(4), 2) == pytest.approx(2.0)
    assert perplexity(2.0) == pytest.approx(4.0)
    assert perplexity(5000.0) == math.inf


def test_custom_backward_passes_gradcheck():
    from nmtkit.training.loss import _LabelSmoothedCE

    torch.manual_seed(2)
    z = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1, 2, 0, 6, 3, 0])  # two padded positions
    assert torch.autograd.gradcheck(lambda x: _LabelSmoothedCE.apply(x, t, 0.1, 0)[0], (z,))
    assert torch.autograd.gradcheck(lambda x: _LabelSmoothedCE.apply(x, t, 0.0, 0)[0], (z,))


def test_unsmoothed_loss_is_finite_where_a_token_has_zero_probability():
    # eps = 0 must be exactly the nll: a -inf logit (probability 0) on a non-gold token gives
    # smooth_t = +inf, and 0 * inf would be NaN if the smoothing term were computed at all.
    # p = (0, 0.25, 0.75): gold 2 -> nll = -ln 0.75 = 0.2876820724517809
    z = torch.tensor([[[-math.inf, math.log(0.25), math.log(0.75)]]], requires_grad=True)
    loss, nll, n = label_smoothed_cross_entropy(z, torch.tensor([[2]]), 0.0)
    assert n == 1
    assert loss.item() == pytest.approx(0.2876820724517809, abs=1e-6) and nll.item() == loss.item()
    (g,) = torch.autograd.grad(loss, z)
    # d loss / d z = softmax(z) - onehot(gold) = (0, 0.25, -0.25)
    assert torch.allclose(g, torch.tensor([[[0.0, 0.25, -0.25]]]), atol=1e-6)


def test_a_nonzero_pad_index():
    # pad index 2 (not 0) ignores those positions, and token 0 is an ordinary gold token. p = (0.1, 0.2, 0.3, 0.4), eps = 0.1, V = 4:
    #   gold 0: -(0.1/3 * (ln .2 + ln .3 + ln .4) + 0.9 ln .1) = 2.1966499653157805, nll = -ln .1
    logits = logits_for([0.1, 0.2, 0.3, 0.4]).expand(1, 2, 4)  # float64
    loss, nll, n = label_smoothed_cross_entropy(logits, torch.tensor([[0, 2]]), 0.1, ignore_index=2)
    assert n == 1
    assert loss.item() == pytest.approx(2.1966499653157805, abs=1e-6)
    assert nll.item() == pytest.approx(-math.log(0.1), abs=1e-6)


def test_reporting_units_by_hand():
    # bits per token: sum / ntokens / ln 2; a single token, and no token at all (no division by 0)
    assert bits_per_token(math.log(2), 1) == pytest.approx(1.0)
    assert bits_per_token(3 * math.log(8), 3) == pytest.approx(3.0)
    assert bits_per_token(0.0, 0) == 0.0
    assert bits_per_token(math.log(2), 0) == pytest.approx(1.0)
    assert perplexity(3.0) == pytest.approx(8.0)
    assert perplexity(0.5) == pytest.approx(math.sqrt(2))
    # the documented cap: 2 ** bits below 1000 bits, inf from 1000 on (2.0 ** 1024 would raise)
    assert perplexity(999.0) == 2.0**999
    assert perplexity(1000.0) == math.inf and perplexity(1000.5) == math.inf
