"""Exponential moving average of the weights (Marian's `--exponential-smoothing`).

After every optimizer step: ema = decay * ema + (1 - decay) * weights, for every parameter;
buffers are copied. The average usually validates and translates better than the raw weights late
in training; checkpoints keep both (`model` and `ema`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.model = copy.deepcopy(model).eval()  # same tying of shared parameters as the model
        for p in self.model.parameters():
            p.requires_grad_(False)
        self._src = list(model.parameters())
        self._dst = list(self.model.parameters())

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        torch._foreach_lerp_(self._dst, self._src, 1.0 - self.decay)
        for b_dst, b_src in zip(self.model.buffers(), model.buffers()):
            b_dst.copy_(b_src)

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state)
