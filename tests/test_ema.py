"""Weight EMA against the formula applied by hand: ema = decay * ema + (1 - decay) * weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nmtkit.training.ema import EMA


class Tied(nn.Module):
    """An embedding tied to the output projection (as share_embeddings does) and a BatchNorm,
    whose running statistics are buffers (copied, not averaged)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=True)
        self.out.weight = self.embed.weight  # tied: one Parameter, two names
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x):  # x: (B,) token ids -> (B, 5) logits
        return self.out(self.norm(self.embed(x)))


def set_params(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def test_starts_as_a_frozen_copy_in_eval_mode():
    torch.manual_seed(0)
    model = Tied().train()
    ema = EMA(model, 0.9)
    assert ema.decay == 0.9
    assert ema.model is not model and not ema.model.training and model.training  # the source is untouched
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), ema.model.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2) and p1.data_ptr() != p2.data_ptr()
        assert not p2.requires_grad and p1.requires_grad
    # the copy keeps the tying: one averaged matrix serves both names
    assert ema.model.out.weight is ema.model.embed.weight


def test_updates_follow_the_formula_by_hand():
    model = Tied()
    set_params(model, 1.0)
    ema = EMA(model, 0.75)
    # three steps of the raw weights: 3, 5, -1. By hand, decay 0.75:
    #   1 -> 0.75*1 + 0.25*3 = 1.5 -> 0.75*1.5 + 0.25*5 = 2.375 -> 0.75*2.375 + 0.25*(-1) = 1.53125
    for w, expected in ((3.0, 1.5), (5.0, 2.375), (-1.0, 1.53125)):
        set_params(model, w)
        ema.update(model)
        for p in ema.model.parameters():
            assert torch.equal(p, torch.full_like(p, expected)), (w, p)
    for p in model.parameters():  # the raw weights are not touched by the update
        assert torch.equal(p, torch.full_like(p, -1.0))


def test_each_parameter_is_averaged_elementwise():
    torch.manual_seed(1)
    model = Tied()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    ema = EMA(model, 0.9)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    ema.update(model)
    for n, p in ema.model.named_parameters():
        ref = 0.9 * start[n] + 0.1 * dict(model.named_parameters())[n].detach()
        assert torch.allclose(p, ref, rtol=0, atol=1e-6), n


def test_buffers_are_copied_not_averaged():
    torch.manual_seed(2)
    model = Tied().train()
    ema = EMA(model, 0.5)
    model(torch.tensor([0, 1, 2, 3, 4]))  # a training-mode forward moves BatchNorm's running stats
    assert model.norm.num_batches_tracked.item() == 1
    ema.update(model)
    for (n, b_src), b_dst in zip(model.named_buffers(), ema.model.buffers()):
        assert torch.equal(b_dst, b_src), n
    assert not torch.equal(ema.model.norm.running_mean, torch.zeros(3))


def test_state_dict_round_trip():
    model = Tied()
    set_params(model, 2.0)
    ema = EMA(model, 0.5)
    set_params(model, 4.0)
    ema.update(model)  # ema weights 3.0
    state = ema.state_dict()
    assert set(state) == set(model.state_dict())
    assert torch.equal(state["embed.weight"], torch.full((5, 3), 3.0))
    # resuming: a new EMA of a new model, then the checkpoint's average loaded into it
    fresh = Tied()
    other = EMA(fresh, 0.5)
    other.load_state_dict(state)
    for k, v in other.state_dict().items():
        assert torch.equal(v, state[k]), k
    # the loaded copy keeps averaging from the loaded weights: 0.5*3 + 0.5*1 = 2
    set_params(fresh, 1.0)
    other.update(fresh)
    assert torch.equal(other.model.embed.weight, torch.full((5, 3), 2.0))


def test_decay_one_keeps_the_start_and_decay_zero_follows_the_model():
    model = Tied()
    set_params(model, 1.0)
    frozen, follower = EMA(model, 1.0), EMA(model, 0.0)
    set_params(model, 7.0)
    frozen.update(model)
    follower.update(model)
    assert all(torch.equal(p, torch.ones_like(p)) for p in frozen.model.parameters())
    assert all(torch.equal(p, torch.full_like(p, 7.0)) for p in follower.model.parameters())


def test_load_rejects_a_state_of_another_shape():
    ema = EMA(Tied(), 0.5)
    with pytest.raises(RuntimeError):
        ema.load_state_dict({"embed.weight": torch.zeros(2, 2)})
