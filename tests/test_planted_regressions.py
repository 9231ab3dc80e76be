"""Edges of the newest code that the feature tests pass over.

- A text file given as a checkpoint is named as one even when its first 4096-byte block ends
  inside a multi-byte character (the block then does not decode whole; a 2-byte character
  repeated puts no cut at an even offset, a 3-byte one does).
- Under autocast the fused loss hands bf16 operands to every (n x d x V) product, the weight
  gradient's included: autocast alone would make the logits bf16 whatever the loss cast them to,
  but an in-place float32 addmm of the weight gradient would run in float32, several times slower
  on a GPU.
- `nmtkit serve`'s tick writes the log notes whose interval has passed, and hands uvicorn's
  own tick result back (True stops the server's loop).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from nmtkit.errors import UserError


def test_a_text_file_whose_first_block_ends_inside_a_character_is_named_as_text(tmp_path):
    from nmtkit import checkpoints as ck

    lines = "Ein Mann fährt Fahrrad .\n" * 150  # 3900 bytes of UTF-8: 'ä' takes 2
    text = lines + "x" * (4095 - len(lines.encode("utf-8"))) + "€ Preis .\n"  # '€' at bytes 4095..4097
    data = text.encode("utf-8")
    assert data[4095:4098] == "€".encode("utf-8") and len(data) > 4096  # the block ends inside it
    p = tmp_path / "corpus.de"
    p.write_bytes(data)
    want = r"corpus\.de: a text file, not a checkpoint \(it begins with 'Ein Mann fährt Fahrrad \.'\)$"
    with pytest.raises(UserError, match=want):
        ck.load_checkpoint(p)


def test_a_binary_file_invalid_before_the_end_of_its_block_is_left_to_the_loader(tmp_path):
    from nmtkit import checkpoints as ck

    p = tmp_path / "junk.pt"
    p.write_bytes(b"abc\xff" + b"x" * 5000)  # invalid UTF-8 at byte 3: no text, no cut character
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(p)
    assert "junk.pt: cannot read checkpoint" in str(e.value) and "text file" not in str(e.value)


def test_bf16_autocast_gives_every_product_of_the_fused_loss_bf16_operands(monkeypatch):
    from nmtkit.training import loss as L

    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 16, requires_grad=True)  # (batch, tgt_len, d)
    weight = torch.randn(101, 16, requires_grad=True)  # (V, d)
    bias = torch.randn(101, requires_grad=True)  # (V,)
    target = torch.randint(1, 101, (3, 5))  # (batch, tgt_len), no padding
    seen = []
    logits, add_product = L._logits, L._add_product_

    def spy_logits(h, w, b):
        seen.append(("logits", h.dtype, w.dtype))
        return logits(h, w, b)

    def spy_product(acc, a, b):
        seen.append(("weight gradient", a.dtype, b.dtype))
        return add_product(acc, a, b)

    monkeypatch.setattr(L, "_logits", spy_logits)
    monkeypatch.setattr(L, "_add_product_", spy_product)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, n = L.fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, bias=bias, chunk_elements=606)
    grads = torch.autograd.grad(loss, [hidden, weight, bias])
    assert n == 15
    assert [k for k, _, _ in seen] == ["logits", "weight gradient"] * 3  # 6 rows a chunk: 6, 6, 3
    assert {(a, b) for _, a, b in seen} == {(torch.bfloat16, torch.bfloat16)}, seen
    assert [g.dtype for g in grads] == [torch.float32] * 3


class _UvicornTick:
    """Stands for uvicorn.Server: its tick says whether the loop should stop."""

    async def on_tick(self, counter: int) -> bool:
        return counter >= 10


def test_the_serve_tick_writes_the_notes_whose_interval_passed_and_returns_uvicorn_s_answer():
    from nmtkit.serving.logs import Notes
    from nmtkit.serving.server import _on_tick

    now, out = [0.0], []
    server = type("Graceful", (_UvicornTick,), {"on_tick": _on_tick})()
    server.owner = SimpleNamespace(notes=Notes(out.append, interval=10, clock=lambda: now[0]))
    server.owner.notes.note("refused", "refused a connection")  # the first: written at once
    server.owner.notes.note("refused", "refused a connection")  # counted for later
    assert len(out) == 1
    now[0] = 5.0
    assert asyncio.run(server.on_tick(1)) is False
    assert len(out) == 1  # the interval has not passed
    now[0] = 12.0
    assert asyncio.run(server.on_tick(2)) is False
    assert out[1:] == ["refused a connection (1 time in the last 12 s)"]
    assert asyncio.run(server.on_tick(10)) is True
