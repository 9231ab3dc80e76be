"""The model settings fairseq's Transformers need (`sinusoid`, `attention_bias`, `decoder_start`):
values against hand-computed ones, incremental decoding against teacher forcing, and the
paper's choices staying the defaults."""

from __future__ import annotations

import math

import pytest
import torch

from nmtkit.errors import UserError
from nmtkit.models.registry import ArchConfig, get_arch
from nmtkit.models.transformer import Transformer, fairseq_sinusoid_table

TINY = ArchConfig(encoder_layers=2, decoder_layers=2, d_model=8, d_ff=16, heads=2, dropout=0.0)


def test_defaults_are_the_papers():
    for name in ("transformer_base", "transformer_big", "transformer_tiny"):
        cfg = get_arch(name)
        assert (cfg.sinusoid, cfg.attention_bias, cfg.decoder_start) == ("paper", False, "bos")


def test_fairseq_sinusoids_by_hand():
    """d=4: half 2, frequencies 1 and 10000^-1; nmtkit's position 0 is fairseq's position 2."""
    t = fairseq_sinusoid_table(3, 4)
    for p in range(3):
        fp = p + 2
        want = [math.sin(fp), math.sin(fp * 1e-4), math.cos(fp), math.cos(fp * 1e-4)]
        assert t[p].tolist() == pytest.approx(want, abs=1e-6)
    assert fairseq_sinusoid_table(2, 5)[:, 4].abs().max() == 0  # odd width: a zero column


def test_model_uses_the_fairseq_table():
    model = Transformer(TINY.replace(sinusoid="fairseq"), 12, 12)
    assert torch.equal(model.src_pos(3, offset=1), fairseq_sinusoid_table(TINY.max_source_positions, 8)[1:4])


def _model(cfg: ArchConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(cfg, 12, 12).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()  # biases that matter (they start at zero)
    return model


def test_attention_biases_are_parameters_and_decode_incrementally():
    model = _model(TINY.replace(attention_bias=True))
    names = {n for n, _ in model.named_parameters()}
    for n in ("encoder_layers.0.self_attn.qkv_proj.bias", "decoder_layers.1.cross_attn.q_proj.bias",
              "decoder_layers.1.cross_attn.kv_proj.bias", "decoder_layers.0.self_attn.out_proj.bias"):
        assert n in names
    assert not any("attn." in n and n.endswith("_proj.bias") for n, _ in _model(TINY).named_parameters())
    src = torch.tensor([[5, 6, 7, 2]])
    prev = torch.tensor([[1, 8, 9]])
    forced = model(src, prev)  # (1, 3, V)
    enc, cache = model.encode(src), model.new_cache()
    steps = torch.cat([model.decode_step(prev[:, t:t + 1], enc, cache) for t in range(3)], dim=1)
    assert torch.allclose(forced, steps, atol=1e-5)


def test_decoder_start_eos_reads_bos_as_eos():
    bos_model = _model(TINY)
    eos_model = _model(TINY.replace(decoder_start="eos"))
    src = torch.tensor([[5, 6, 2]])
    with torch.no_grad():
        a = eos_model(src, torch.tensor([[1, 7]]))
        b = bos_model(src, torch.tensor([[2, 7]]))
        c = bos_model(src, torch.tensor([[1, 7]]))
        enc, cache = eos_model.encode(src), eos_model.new_cache()
        step0 = eos_model.decode_step(torch.tensor([[1]]), enc, cache)
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert torch.allclose(step0[:, 0], a[:, 0], atol=1e-6)


@pytest.mark.parametrize("field,value", [("sinusoid", "t2t"), ("decoder_start", "pad")])
def test_bad_choices_are_refused(field, value):
    with pytest.raises(UserError, match=f"--{field.replace('_', '-')} must be one of"):
        TINY.replace(**{field: value})
