"""Which attention kernels incremental decoding may use.

cuDNN's fused attention builds an execution plan per shape, and a decoding step shows it a new key
length every time: on an H200 it made bf16 beam search 8x slower (nmtkit/search/beam.py,
`decoding_attention`). The backend switches are process-wide flags that hold on any device, so
the rule is checked here on the CPU: during the search cuDNN's backend is off and the others on,
and afterwards the process's own settings are back.
"""

from __future__ import annotations

import pytest
import torch

import nmtkit.models.attention as attention_module
from nmtkit.search.beam import SearchConfig, search
from tests.test_search import tiny_transformer


def backend_flags() -> dict[str, bool]:
    return {"cudnn": torch.backends.cuda.cudnn_sdp_enabled(), "flash": torch.backends.cuda.flash_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(), "math": torch.backends.cuda.math_sdp_enabled()}


def spy_on_attention(monkeypatch) -> list[dict[str, bool]]:
    """The backend flags at every SDPA call from now on (the list fills as calls come)."""
    seen: list[dict[str, bool]] = []
    real = attention_module.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(backend_flags())
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    return seen


@pytest.mark.parametrize("beam", [1, 3])
def test_search_runs_attention_without_cudnn_and_restores_the_settings(monkeypatch, beam):
    seen = spy_on_attention(monkeypatch)
    before = backend_flags()
    assert before["cudnn"], "torch enables cuDNN's attention by default; this test starts from that"
    model = tiny_transformer(12, seed=0)
    src = torch.tensor([[4, 5, 6, 2], [7, 8, 2, 1]])  # (B, S): tokens + </s>, padded
    hyps = search(model, src, SearchConfig(beam=beam, max_len_a=0, max_len_b=5))
    assert len(hyps) == 2 and all(h for h in hyps)
    assert seen, "the search called no attention"
    assert all(f == {"cudnn": False, "flash": True, "efficient": True, "math": True} for f in seen)
    assert backend_flags() == before


def test_training_attention_keeps_every_backend(monkeypatch):
    """Only decoding narrows the choice: a training forward pass sees the process's settings."""
    seen = spy_on_attention(monkeypatch)
    model = tiny_transformer(12, seed=0).train()
    model(torch.tensor([[4, 5, 2]]), torch.tensor([[2, 6, 7]]))
    assert seen and all(f["cudnn"] for f in seen)
