"""The fused output projection + label-smoothed loss (training/loss.py) against references.

Why: training and validation no longer build the (N, V) logits; the fused loss must give what
`label_smoothed_cross_entropy(F.linear(hidden, weight, bias), ...)` gave (loss, nll and the
gradients of hidden, weight and bias), also across chunk boundaries, with padding, with the weight
tied to the embedding, and under autocast. References: the textbook formula in float64 (q puts
1 - eps on the gold token and eps / (V - 1) on every other one) and the unfused function.
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from nmtkit.data.batching import collate
from nmtkit.models.registry import get_arch
from nmtkit.models.transformer import Transformer
from nmtkit.training import loss as L
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.loss import fused_label_smoothed_cross_entropy, label_smoothed_cross_entropy

from conftest import word_mapping_data_dir

PAD = 0


def textbook(logits: torch.Tensor, target: torch.Tensor, eps: float):
    """(smoothed loss sum, nll sum (detached)) by -sum_v q_v log p_v over non-pad positions, in
    logits' dtype."""
    vocab = logits.size(-1)
    lp = torch.log_softmax(logits, dim=-1)  # (..., V)
    q = torch.full_like(lp, eps / (vocab - 1)).scatter_(-1, target.unsqueeze(-1), 1.0 - eps)
    keep = target != PAD
    nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (...)
    return (-(q * lp).sum(-1) * keep).sum(), (nll * keep).sum().detach()


def inputs(seed: int, vocab: int = 29, d: int = 8, bias: bool = True, dtype=torch.float64):
    """hidden (3, 7, d), weight (V, d), bias (V,) or None, all requiring grad; target (3, 7) with
    padding at the end of two rows (the pad id 0 is never gold elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 7, d, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, d, generator=g, dtype=dtype).mul_(0.7).requires_grad_()
    b = torch.randn(vocab, generator=g, dtype=dtype).requires_grad_() if bias else None
    target = torch.randint(1, vocab, (3, 7), generator=g)
    target[0, 5:] = PAD
    target[2, 2:] = PAD
    return hidden, weight, b, target


@contextlib.contextmanager
def chunk_calls(monkeypatch):
    """Record every chunk's logits (rows, V, dtype) the fused loss computes, forward and backward."""
    real = L._logits
    seen: list[tuple[int, int, torch.dtype]] = []

    def spy(h, weight, bias):
        out = real(h, weight, bias)
        seen.append((out.size(0), out.size(1), out.dtype))
        return out

    monkeypatch.setattr(L, "_logits", spy)
    yield seen


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_loss_and_gradients_equal_float64_textbook_across_chunks(monkeypatch, eps, with_bias):
    hidden, weight, bias, target = inputs(0, bias=with_bias)
    n = int((target != PAD).sum())  # 7 + 5 + 2 non-pad positions
    assert n == 14
    params = [hidden, weight] + ([bias] if with_bias else [])
    with chunk_calls(monkeypatch) as seen:
        loss, nll, ntok = fused_label_smoothed_cross_entropy(hidden, weight, target, eps, bias=bias,
                                                             chunk_elements=4 * 29 + 5)  # 4 rows a chunk
        got = torch.autograd.grad(loss, params)
    # 14 rows in chunks of 4: 4 + 4 + 4 + 2, each chunk's logits computed once (no whole-batch logits)
    assert [r for r, _, _ in seen] == [4, 4, 4, 2] and all(v == 29 for _, v, _ in seen)
    ref_loss, ref_nll = textbook(F.linear(hidden, weight, bias), target, eps)
    want = torch.autograd.grad(ref_loss, params)
    assert ntok == n and loss.dtype == torch.float64
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert float(nll) == pytest.approx(float(ref_nll), rel=1e-12)
    if eps == 0:
        assert loss.item() == nll.item()
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.allclose(g, w, rtol=1e-10, atol=1e-12)
    assert got[0][0, 5:].abs().sum() == 0 and got[0][2, 2:].abs().sum() == 0  # padding: no gradient


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_float32_equals_the_unfused_loss(eps):
    """float32 inputs: the unfused function on the whole logits gives the same loss, nll and
    gradients to float32 rounding; the nll against float64 to 1e-6."""
    hidden, weight, bias, target = inputs(1, vocab=301, d=16, dtype=torch.float32)
    params = [hidden, weight, bias]
    loss, nll, n = fused_label_smoothed_cross_entropy(hidden, weight, target, eps, bias=bias, chunk_elements=1500)
    got = torch.autograd.grad(loss, params)
    old_loss, old_nll, old_n = label_smoothed_cross_entropy(F.linear(hidden, weight, bias), target, eps)
    want = torch.autograd.grad(old_loss, params)
    assert n == old_n and loss.dtype == nll.dtype == torch.float32
    assert loss.item() == pytest.approx(old_loss.item(), rel=1e-6)
    assert float(nll) == pytest.approx(float(old_nll), rel=1e-6)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6)
    _, ref_nll = textbook(F.linear(hidden.double(), weight.double(), bias.double()), target, eps)
    assert float(nll) == pytest.approx(float(ref_nll), rel=1e-6)


def test_custom_backward_passes_gradcheck():
    hidden, weight, bias, target = inputs(2, vocab=11, d=5)
    keep = target.reshape(-1) != PAD
    h = hidden.detach().reshape(-1, 5)[keep][:7].requires_grad_()  # (7, 5), no padding left
    t = target.reshape(-1)[keep][:7]
    for eps in (0.0, 0.1):
        assert torch.autograd.gradcheck(lambda x, w, b: L._FusedProjectionCE.apply(x, w, b, t, eps, 3, True)[0],
                                        (h, weight, bias))


def test_a_vocabulary_larger_than_the_chunk_runs_one_row_at_a_time(monkeypatch):
    hidden, weight, bias, target = inputs(3, vocab=40, bias=False)
    with chunk_calls(monkeypatch) as seen:
        loss, nll, n = fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, chunk_elements=10)
        loss.backward()
    assert n == 14 and [r for r, _, _ in seen] == [1] * 14
    ref, _ = textbook(F.linear(hidden, weight), target, 0.1)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)


def test_only_padding_gives_zero_loss_and_zero_gradients():
    hidden, weight, _, target = inputs(4, bias=False)
    loss, nll, n = fused_label_smoothed_cross_entropy(hidden, weight, torch.zeros_like(target), 0.1)
    gh, gw = torch.autograd.grad(loss, [hidden, weight])
    assert n == 0 and loss.item() == 0.0 and nll.item() == 0.0
    assert gh.abs().sum() == 0 and gw.abs().sum() == 0


def test_without_grad_mode_no_gradient_is_formed(monkeypatch):
    """Validation runs under no_grad: the same figures, and no chunk's gradients are computed."""
    hidden, weight, bias, target = inputs(7)
    formed = []
    real = L._add_chunk_grads_
    monkeypatch.setattr(L, "_add_chunk_grads_", lambda *a: formed.append(1) or real(*a))
    with torch.no_grad():
        loss, nll, n = fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, bias=bias, chunk_elements=100)
    assert not formed and not loss.requires_grad
    want_loss, want_nll = textbook(F.linear(hidden, weight, bias), target, 0.1)
    assert loss.item() == pytest.approx(want_loss.item(), rel=1e-12) and nll.item() == pytest.approx(want_nll.item())
    loss, _, _ = fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, bias=bias, chunk_elements=100)
    assert len(formed) == 5 and loss.requires_grad  # with grad mode: 14 rows, 3 a chunk (100 // 29)


def test_a_nonzero_pad_index_and_frozen_weight():
    """ignore_index 2 drops those positions (0 is an ordinary token); a weight without
    requires_grad gets no gradient computed, the hidden states still do."""
    hidden, weight, _, target = inputs(5, bias=False)
    weight = weight.detach()
    target = target.masked_fill(target == 2, 3)  # no 2 but the three below; the 0s are ordinary tokens
    target[1, :3] = 2
    loss, nll, n = fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, ignore_index=2, chunk_elements=60)
    (gh,) = torch.autograd.grad(loss, [hidden])
    keep = target != 2
    lp = torch.log_softmax(F.linear(hidden, weight), -1)
    q = torch.full_like(lp, 0.1 / 28).scatter_(-1, target.unsqueeze(-1), 0.9)
    ref = (-(q * lp).sum(-1) * keep).sum()
    (want,) = torch.autograd.grad(ref, [hidden])
    assert n == int(keep.sum()) == 18
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12) and torch.allclose(gh, want, rtol=1e-10, atol=1e-12)


def test_bf16_autocast_runs_the_matmuls_in_bf16_and_the_statistics_in_float32(monkeypatch):
    """Under autocast the chunk logits are bf16 (as the model's output layer would make them), the
    sums float32, the gradients in the inputs' dtypes; the figures agree with the unfused loss on
    the bf16 logits of the same autocast region."""
    hidden, weight, bias, target = inputs(6, vocab=301, d=16, dtype=torch.float32)
    params = [hidden, weight, bias]
    with chunk_calls(monkeypatch) as seen:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, nll, _ = fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, bias=bias,
                                                              chunk_elements=1500)
        got = torch.autograd.grad(loss, params)
    assert len(seen) == 4 and {dt for _, _, dt in seen} == {torch.bfloat16}  # 14 rows, 4 a chunk
    assert loss.dtype == nll.dtype == torch.float32
    assert [g.dtype for g in got] == [torch.float32] * 3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(hidden, weight, bias)  # (3, 7, V) bf16
    old_loss, old_nll, _ = label_smoothed_cross_entropy(logits, target, 0.1)
    want = torch.autograd.grad(old_loss, params)
    assert loss.item() == pytest.approx(old_loss.item(), rel=1e-3)
    assert float(nll) == pytest.approx(float(old_nll), rel=1e-3)
    for g, w in zip(got, want):
        assert (g - w).norm() / w.norm() < 2e-2  # bf16 products of the same numbers, summed in other orders


# ----------------------------------------------------------------------------------------------
# through the model: tied and untied output projection


def tiny_model(share: str) -> Transformer:
    cfg = get_arch("transformer_tiny").replace(share_embeddings=share, dropout=0.0, attention_dropout=0.0,
                                               activation_dropout=0.0)
    torch.manual_seed(7)
    return Transformer(cfg, 23, 23).double()


def batch():
    g = torch.Generator().manual_seed(8)
    src = torch.randint(3, 23, (3, 6), generator=g)
    src[1, 4:] = PAD
    prev = torch.randint(3, 23, (3, 5), generator=g)
    prev[:, 0] = 1
    target = torch.cat([prev[:, 1:], torch.full((3, 1), 2)], 1)  # (3, 5)
    prev[2, 3:] = PAD
    target[2, 3:] = PAD
    return src, prev, target


@pytest.mark.parametrize("share", ["all", "none"])
def test_model_gradients_equal_the_logits_path_tied_and_untied(monkeypatch, share):
    """forward(features_only=True) + output_projection + fused loss == forward logits + textbook
    loss, for every parameter (the tied embedding gathers both of its gradients)."""
    model = tiny_model(share)
    weight, bias = model.output_projection()
    assert (weight is model.tgt_embed.weight) == (share == "all") and bias is None
    src, prev, target = batch()
    ref_model = copy.deepcopy(model)
    with chunk_calls(monkeypatch) as seen:
        hidden = model(src, prev, features_only=True)  # (3, 5, D)
        assert hidden.shape == (3, 5, model.cfg.d_model)
        loss, nll, n = fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, chunk_elements=23 * 4)
        loss.backward()
    assert n == 13 and [r for r, _, _ in seen] == [4, 4, 4, 1]
    ref_loss, ref_nll = textbook(ref_model(src, prev), target, 0.1)
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert float(nll) == pytest.approx(float(ref_nll), rel=1e-12)
    want = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name].grad, rtol=1e-9, atol=1e-12), name
    assert torch.equal(model(src, prev), ref_model(src, prev))  # forward still returns the logits


# ----------------------------------------------------------------------------------------------
# the training step and validation


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return word_mapping_data_dir(tmp_path_factory.mktemp("corpus"), 120, 16, 20, seed=3)


def new_trainer(data_dir, save_dir) -> T.Trainer:
    """A Trainer built (seeded weights, optimizer, schedule, validator) and ready to make updates."""
    cfg = TrainConfig(data_dir=str(data_dir), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=128,
                      lr=3e-3, warmup_updates=5, progress_bar=False, threads=1, device="cpu",
                      arch_overrides={"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0})
    t = T.Trainer(cfg)
    t._build()
    t._make_iterators()
    t._prepare_run()
    return t


def unfused_update(model: torch.nn.Module, batches: list, eps: float):
    """(loss sum, nll sum, gradient norm) of one update computed the unfused way: whole logits,
    label_smoothed_cross_entropy, backward of loss sum / tokens."""
    model = copy.deepcopy(model)
    ntok = sum(b.ntokens for b in batches)
    loss_sum = nll_sum = 0.0
    for b in batches:
        loss, nll, _ = label_smoothed_cross_entropy(model(b.src_tokens, b.prev_output_tokens), b.target, eps)
        (loss / ntok).backward()
        loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + float(nll)
    norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None))
    return loss_sum, nll_sum, norm


def test_a_training_step_equals_the_unfused_update(data_dir, tmp_path):
    t = new_trainer(data_dir, tmp_path / "s")
    batches = [collate(t.train_src, t.train_tgt, idx) for idx in t.train_batches.batches(1)[:2]]
    loss, nll, norm = unfused_update(t.model, batches, t.epsilon)
    out = t._train_step(batches)
    assert out.applied and out.ntokens == sum(b.ntokens for b in batches)
    assert out.loss_sum == pytest.approx(loss, rel=1e-6)
    assert out.nll_sum == pytest.approx(nll, rel=1e-6)
    assert out.gnorm == pytest.approx(norm, rel=1e-5)


def test_validation_loss_equals_the_unfused_sums(data_dir, tmp_path):
    t = new_trainer(data_dir, tmp_path / "v")
    v = t.validator
    res = v.loss(t.model, torch.device("cpu"), contextlib.nullcontext, t.epsilon)
    loss_sum = nll_sum = 0.0
    ntok = 0
    with torch.no_grad():
        t.model.eval()
        for idx in v.batches:
            b = collate(v.src_ds, v.tgt_ds, idx, v.pad_multiple)
            loss, nll, n = label_smoothed_cross_entropy(t.model(b.src_tokens, b.prev_output_tokens), b.target,
                                                        t.epsilon)
            loss_sum, nll_sum, ntok = loss_sum + float(loss), nll_sum + float(nll), ntok + n
    assert res.ntokens == ntok > 0
    assert res.loss == pytest.approx(loss_sum / ntok / math.log(2), rel=1e-6)
    assert res.nll_loss == pytest.approx(nll_sum / ntok / math.log(2), rel=1e-6)
