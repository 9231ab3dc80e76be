"""Attention weights on request (nmtkit/models/attention.py `capture_attention`,
`Transformer.forward_with_attention`): the explicit softmax path against the SDPA fast path.

The reference is the fast path itself: the captured weights, multiplied with the module's own V
and pushed through W^O, must give what SDPA gave (recorded by hooks in a run without capture);
rows are distributions; padded keys and future positions get exactly 0.
"""

from __future__ import annotations

import pytest
import torch

from nmtkit.models import ArchConfig, Transformer
from nmtkit.models.attention import MultiheadAttention, capture_attention
from nmtkit.models.transformer import ATTENTION_KINDS

torch.set_num_threads(1)
PAD, BOS, EOS = 0, 1, 2


def tiny_model(normalize_before: bool, seed: int = 0, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = ArchConfig(encoder_layers=2, decoder_layers=3, d_model=32, d_ff=64, heads=4, dropout=0.0,
                     normalize_before=normalize_before, max_source_positions=64, max_target_positions=64, **kw)
    return Transformer(cfg, 20, 20).eval()


def batch():
    """Two sources of different lengths (right padding) and two targets of different lengths."""
    src = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, EOS, PAD, PAD, PAD]])  # (2, 6)
    prev = torch.tensor([[BOS, 12, 13, 14], [BOS, 15, PAD, PAD]])  # (2, 4)
    return src, prev


def _record(model, names):
    """Forward hooks on the named Linear sub-modules; returns {name: [outputs]}."""
    got = {n: [] for n in names}
    mods = dict(model.named_modules())
    handles = [mods[n].register_forward_hook(lambda m, i, o, n=n: got[n].append(o.detach())) for n in names]
    return got, handles


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("head_dims", [{}, {"d_k": 4}])  # d_k != d_v (Table 3 row B)
def test_weights_recombined_with_v_and_wo_give_the_sdpa_output(normalize_before, head_dims):
    model = tiny_model(normalize_before, **head_dims)
    src, prev = batch()
    h = model.cfg.heads
    # (module path, projection giving V, kind, layer)
    mods = []
    for i in range(model.cfg.encoder_layers):
        mods.append((f"encoder_layers.{i}.self_attn", "qkv_proj", "enc-self", i))
    for i in range(model.cfg.decoder_layers):
        mods.append((f"decoder_layers.{i}.self_attn", "qkv_proj", "dec-self", i))
        mods.append((f"decoder_layers.{i}.cross_attn", "kv_proj", "cross", i))
    with torch.no_grad():
        fast, hs = _record(model, [f"{m}.out_proj" for m, *_ in mods])
        ref_logits = model(src, prev)
        for x in hs:
            x.remove()
        proj, hs = _record(model, [f"{m}.{p}" for m, p, *_ in mods])
        logits, weights = model.forward_with_attention(src, prev)
        for x in hs:
            x.remove()
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert set(weights) == set(ATTENTION_KINDS)
    for path, p, kind, i in mods:
        attn = dict(model.named_modules())[path]
        hk, hv = attn.heads * attn.d_k, attn.heads * attn.d_v
        out = proj[f"{path}.{p}"][0]
        v = out[..., -hv:] if p == "qkv_proj" else out[..., hk:]  # (B, L, h*d_v)
        b, length, _ = v.shape
        v = v.view(b, length, h, attn.d_v).transpose(1, 2)  # (B, h, L, d_v)
        w = weights[kind][i]  # (B, h, T, L)
        o = torch.matmul(w, v).transpose(1, 2).reshape(b, -1, hv)
        with torch.no_grad():
            y = attn.out_proj(o)
        torch.testing.assert_close(y, fast[f"{path}.out_proj"][0], atol=1e-5, rtol=1e-5)


def test_rows_sum_to_one_and_padding_and_future_are_exactly_zero():
    model = tiny_model(False)
    src, prev = batch()
    with torch.no_grad():
        _, weights = model.forward_with_attention(src, prev)
    S, T = src.size(1), prev.size(1)
    src_pad = src.eq(PAD)  # (B, S)
    for kind, per_layer in weights.items():
        assert len(per_layer) == (2 if kind == "enc-self" else 3)
        for w in per_layer.values():
            assert w.dtype == torch.float32
            assert w.shape == {"enc-self": (2, 4, S, S), "dec-self": (2, 4, T, T), "cross": (2, 4, T, S)}[kind]
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-6, rtol=0)
            assert bool((w >= 0).all())
            if kind != "dec-self":  # padded source keys: exactly 0, for every query
                assert bool((w.masked_select(src_pad[:, None, None, :].expand_as(w)) == 0).all())
                assert bool((w[0] > 0).all())  # no padding in row 0: all keys attended a little
            else:  # the future: exactly 0; the past and present: > 0
                future = torch.ones(T, T, dtype=torch.bool).triu(1)
                assert bool((w[..., future] == 0).all())
                assert bool((w[..., ~future] > 0).all())


def test_only_the_asked_layers_leave_the_fast_path_and_capture_ends_with_the_block(monkeypatch):
    model = tiny_model(False)
    src, prev = batch()
    calls = []
    orig = MultiheadAttention._explicit_attention

    def spy(self, *a, **k):
        calls.append(self)
        return orig(self, *a, **k)

    monkeypatch.setattr(MultiheadAttention, "_explicit_attention", spy)
    with torch.no_grad():
        _, w = model.forward_with_attention(src, prev, which={"cross": [2], "enc-self": [0]})
        assert set(w["cross"]) == {2} and set(w["enc-self"]) == {0}
        assert calls == [model.encoder_layers[0].self_attn, model.decoder_layers[2].cross_attn]
        calls.clear()
        model(src, prev)  # after the block: SDPA again
        enc = model.encode(src)
        cache = model.new_cache()
        model.decode_step(prev[:, :1], enc, cache)
    assert calls == []
    assert all(m.capture is None for k in ATTENTION_KINDS for m in model.attention_modules(k))
    with pytest.raises(ValueError, match="cross layer 3 out of range"):
        model.forward_with_attention(src, prev, which={"cross": [3]})
    mod = model.decoder_layers[0].cross_attn
    with capture_attention([mod]):
        with pytest.raises(RuntimeError, match="captured twice"):
            with capture_attention([mod]):
                pass
    assert mod.capture is None


def test_training_mode_records_weights_before_dropout():
    torch.manual_seed(0)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, heads=4, dropout=0.0,
                     attention_dropout=0.5, max_source_positions=64, max_target_positions=64)
    model = Transformer(cfg, 20, 20)
    src, prev = batch()
    model.train()
    torch.manual_seed(1)
    _, w_train = model.forward_with_attention(src, prev, which={"enc-self": None})
    model.eval()
    _, w_eval = model.forward_with_attention(src, prev, which={"enc-self": None})
    # dropout (p = 0.5) would zero about half the weights and double the others; the record
    # is the distribution the model computed, the same in both modes
    torch.testing.assert_close(w_train["enc-self"][0], w_eval["enc-self"][0])


def test_weights_without_logits_are_the_same():
    model = tiny_model(True)
    src, prev = batch()
    with torch.no_grad():
        logits, w = model.forward_with_attention(src, prev, which={"cross": [1]})
        none, w2 = model.forward_with_attention(src, prev, which={"cross": [1]}, logits=False)
    assert logits is not None and none is None
    torch.testing.assert_close(w["cross"][1], w2["cross"][1], atol=0, rtol=0)
