"""The Transformer against the paper's math, its own teacher-forced path, and its invariances."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn.functional as F

from nmtkit.errors import UserError
from nmtkit.models import ARCHS, ArchConfig, EncoderOut, Transformer, count_parameters, get_arch
from nmtkit.models.attention import MultiheadAttention
from nmtkit.models.transformer import sinusoid_table


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models gain nothing from threads, and on a shared CPU the waits of a second thread
    cost several times the work; restore the setting for other modules."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TINY = get_arch("transformer_tiny")
V = 40  # vocabulary of the tiny test models: 0 pad, 1 <s>, 2 </s>, 3 <unk>, 4.. words


def make(cfg: ArchConfig = TINY, src_vocab: int = V, tgt_vocab: int = V, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, src_vocab, tgt_vocab).eval()


def batch(seed: int = 1, b: int = 3, s: int = 7, t: int = 6, vocab: int = V):
    """Right-padded source (with </s>) and decoder input (starting with <s>), random lengths."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    tgt = torch.randint(4, vocab, (b, t), generator=g)
    tgt[:, 0] = 1
    src_len = [s] + [int(x) for x in torch.randint(2, s + 1, (b - 1,), generator=g)]
    tgt_len = [t] + [int(x) for x in torch.randint(2, t + 1, (b - 1,), generator=g)]
    for i in range(b):
        src[i, src_len[i] - 1] = 2
        src[i, src_len[i]:] = 0
        tgt[i, tgt_len[i]:] = 0
    return src, tgt, tgt_len


VARIANTS = {
    "post-norm": TINY,
    "pre-norm": TINY.replace(normalize_before=True),
    "learned-pos": TINY.replace(learned_pos=True, share_embeddings="none"),
    "dk!=dv": TINY.replace(d_k=8, d_v=24, heads=2),
}


# ---- incremental decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("max_len", [None, 2, 6])  # grow from the default, grow from tiny, preallocated
def test_cached_steps_equal_teacher_forced_logits(variant, max_len):
    model = make(VARIANTS[variant])
    src, tgt, _ = batch()
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        enc = model.encode(src)
        cache = model.new_cache(max_len)
        steps = [model.decode_step(tgt[:, i:i + 1], enc, cache) for i in range(tgt.size(1))]
    assert cache.length == tgt.size(1)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_cache_and_encoder_reordering_follow_new_order():
    """Reordering mid-decoding (as beam search does) gives the reordered rows' logits."""
    model = make()
    src, tgt, _ = batch(b=3)
    order = torch.tensor([2, 0, 0])  # drop row 1, duplicate row 0
    with torch.no_grad():
        full = model(src.index_select(0, order), tgt.index_select(0, order))
        enc = model.encode(src)
        cache = model.new_cache()
        out = [model.decode_step(tgt[:, i:i + 1], enc, cache) for i in range(3)]
        out = [o.index_select(0, order) for o in out]
        enc = enc.index_select(order)
        cache.index_select(order)
        t2 = tgt.index_select(0, order)
        out += [model.decode_step(t2[:, i:i + 1], enc, cache) for i in range(3, tgt.size(1))]
    torch.testing.assert_close(torch.cat(out, 1), full, atol=1e-5, rtol=0)


def test_beams_share_one_copy_of_the_encoder_keys_and_values():
    """After a beam expansion the g rows of a sentence attend to one cached copy of its encoder
    K/V; reordering within beams and dropping a sentence keep per-sentence K/V; the logits stay
    those of teacher forcing on each row's own history."""
    model = make()
    src, _, _ = batch(b=3)
    g = torch.Generator().manual_seed(5)
    expand = torch.tensor([0, 0, 1, 1, 2, 2])  # 3 sentences -> beams of 2
    regroup = torch.tensor([1, 0, 4, 4])  # sentence 0's beams swapped, sentence 1 gone, a row twice
    h6 = torch.randint(4, V, (6, 3), generator=g)
    h6[:, 0] = 1  # <s>
    h4 = torch.cat([h6.index_select(0, regroup), torch.randint(4, V, (4, 2), generator=g)], 1)  # (4, 5)
    with torch.no_grad():
        want6 = model(src.index_select(0, expand), h6)  # (6, 3, V)
        want4 = model(src.index_select(0, expand.index_select(0, regroup)), h4)  # (4, 5, V)
        enc = model.encode(src)
        cache = model.new_cache()
        model.decode_step(h6[[0, 2, 4], :1], enc, cache)  # one row per sentence
        cache.index_select(expand)
        enc = enc.index_select(expand)
        assert all(lc.cross_k.size(0) == 3 for lc in cache.layers)  # not copied per beam
        got6 = [model.decode_step(h6[:, i:i + 1], enc, cache) for i in (1, 2)]
        cache.index_select(regroup)
        enc = enc.index_select(regroup)
        assert all(lc.cross_k.size(0) == 2 and lc.cross_mask.size(0) == 2 for lc in cache.layers)
        got4 = [model.decode_step(h4[:, i:i + 1], enc, cache) for i in (3, 4)]
    torch.testing.assert_close(torch.cat(got6, 1), want6[:, 1:3], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(got4, 1), want4[:, 3:5], atol=1e-5, rtol=0)


def test_encoder_out_index_select():
    out = torch.arange(24.0).view(3, 4, 2)
    pad = torch.tensor([[False] * 4, [False, False, True, True], [False, True, True, True]])
    e = EncoderOut(out, pad).index_select(torch.tensor([1, 1, 2]))
    assert torch.equal(e.out, out[[1, 1, 2]]) and torch.equal(e.padding_mask, pad[[1, 1, 2]])
    assert torch.equal(e.attn_mask[:, 0, 0], ~pad[[1, 1, 2]])


# ---- invariances ---------------------------------------------------------------------------------


def test_causality_future_tokens_change_no_earlier_output():
    model = make()
    src, tgt, _ = batch(b=1)
    with torch.no_grad():
        base = model(src, tgt)
        for j in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[0, j] = 4 + (int(changed[0, j]) - 4 + 7) % (V - 4)  # a different word
            out = model(src, changed)
            torch.testing.assert_close(out[:, :j], base[:, :j], atol=1e-6, rtol=0)
            assert (out[:, j:] - base[:, j:]).abs().max() > 1e-4  # the change is seen from j on


def test_source_padding_invariance():
    """A sentence decoded alone equals the same sentence in a batch with a longer one."""
    model = make(VARIANTS["pre-norm"])  # any variant; pre-norm also checks the final norms
    short = torch.tensor([[5, 6, 7, 2]])
    long_ = torch.tensor([[8, 9, 10, 11, 12, 13, 2]])
    tgt = torch.tensor([[1, 14, 15]])
    with torch.no_grad():
        alone = model(short, tgt)
        padded = torch.cat([F.pad(short, (0, 3), value=0), long_])
        both = model(padded, tgt.expand(2, -1))
        enc = model.encode(padded)
    assert torch.isfinite(enc.out).all()  # pad query rows still see the real keys: no NaN
    torch.testing.assert_close(both[:1], alone, atol=1e-5, rtol=0)
    # and with only extra padding columns (batch of one)
    with torch.no_grad():
        torch.testing.assert_close(model(F.pad(short, (0, 5), value=0), tgt), alone, atol=1e-5, rtol=0)


def test_target_padding_invariance():
    model = make()
    src, tgt, tgt_len = batch()
    with torch.no_grad():
        base = model(src, tgt)
        padded = model(src, F.pad(tgt, (0, 4), value=0))
    assert torch.isfinite(padded).all()
    for i, n in enumerate(tgt_len):
        torch.testing.assert_close(padded[i, :n], base[i, :n], atol=1e-5, rtol=0)


# ---- reference math --------------------------------------------------------------------------------


def naive_attention(mha: MultiheadAttention, x_q, x_kv, key_pad=None, causal=False):
    """softmax(Q K^T / sqrt(d_k)) V per head with explicit loops and -inf masking."""
    h, dk, dv = mha.heads, mha.d_k, mha.d_v
    if mha.self_attention:
        wq, wk, wv = mha.qkv_proj.weight.split([h * dk, h * dk, h * dv])
    else:
        wq = mha.q_proj.weight
        wk, wv = mha.kv_proj.weight.split([h * dk, h * dv])
    b, t, _ = x_q.shape
    s = x_kv.shape[1]
    out = torch.zeros(b, t, h * dv)
    for bi in range(b):
        for hi in range(h):
            q = x_q[bi] @ wq[hi * dk:(hi + 1) * dk].T  # (t, dk)
            k = x_kv[bi] @ wk[hi * dk:(hi + 1) * dk].T  # (s, dk)
            v = x_kv[bi] @ wv[hi * dv:(hi + 1) * dv].T  # (s, dv)
            scores = q @ k.T / math.sqrt(dk)  # (t, s)
            for i in range(t):
                for j in range(s):
                    if (key_pad is not None and key_pad[bi, j]) or (causal and j > i):
                        scores[i, j] = -math.inf
            out[bi, :, hi * dv:(hi + 1) * dv] = torch.softmax(scores, dim=-1) @ v
    return out @ mha.out_proj.weight.T


@pytest.mark.parametrize("dk,dv,heads", [(16, 16, 4), (8, 24, 2), (64, 64, 1)])
def test_attention_matches_naive_reference(dk, dv, heads):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 64)
    mem = torch.randn(2, 4, 64)
    pad = torch.tensor([[False] * 4, [False, False, True, True]])
    self_attn = MultiheadAttention(64, heads, dk, dv, 0.0, self_attention=True).eval()
    cross = MultiheadAttention(64, heads, dk, dv, 0.0, self_attention=False).eval()
    with torch.no_grad():
        got = self_attn(x, is_causal=True)
        torch.testing.assert_close(got, naive_attention(self_attn, x, x, causal=True), atol=1e-5, rtol=0)
        got = self_attn(mem, attn_mask=~pad[:, None, None, :])
        torch.testing.assert_close(got, naive_attention(self_attn, mem, mem, key_pad=pad), atol=1e-5,
                                   rtol=0)
        got = cross.attend(cross.project_q(x), *cross.project_kv(mem), attn_mask=~pad[:, None, None, :])
        torch.testing.assert_close(got, naive_attention(cross, x, mem, key_pad=pad), atol=1e-5, rtol=0)


def naive_forward(model: Transformer, src, tgt):
    """The paper's equations written out: post-norm LayerNorm(x + Sublayer(x)), eval mode."""
    d = model.cfg.d_model
    pe = sinusoid_table(64, d)
    ln = lambda x, m: F.layer_norm(x, (d,), m.weight, m.bias, m.eps)  # noqa: E731
    ffn = lambda x, f: F.relu(x @ f.fc1.weight.T + f.fc1.bias) @ f.fc2.weight.T + f.fc2.bias  # noqa: E731
    pad = src.eq(0)
    x = model.src_embed.weight[src] * math.sqrt(d) + pe[: src.size(1)]
    for i, layer in enumerate(model.encoder_layers, start=1):
        # Liu et al. (2021): the named layer's self-attention without its residual
        kept = 0 if i == model.cfg.encoder_no_residual_layer else x
        x = ln(kept + naive_attention(layer.self_attn, x, x, key_pad=pad), layer.self_attn_norm)
        x = ln(x + ffn(x, layer.ffn), layer.ffn_norm)
    y = model.tgt_embed.weight[tgt] * math.sqrt(d) + pe[: tgt.size(1)]
    for layer in model.decoder_layers:
        y = ln(y + naive_attention(layer.self_attn, y, y, causal=True), layer.self_attn_norm)
        y = ln(y + naive_attention(layer.cross_attn, y, x, key_pad=pad), layer.cross_attn_norm)
        y = ln(y + ffn(y, layer.ffn), layer.ffn_norm)
    return y @ model.tgt_embed.weight.T  # shared pre-softmax projection


@pytest.mark.parametrize("no_residual", [None, 1, 2])
def test_model_forward_matches_naive_equations(no_residual):
    model = make(TINY.replace(encoder_no_residual_layer=no_residual))
    src, tgt, _ = batch(b=2, s=5, t=4)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), naive_forward(model, src, tgt), atol=1e-4, rtol=0)


def test_the_layer_without_a_residual_changes_the_outputs_of_the_same_weights():
    """The same weights with and without `encoder_no_residual_layer`: different log-probabilities
    (the setting is read, and a checkpoint must carry it)."""
    plain, cut = make(), make(TINY.replace(encoder_no_residual_layer=2))
    cut.load_state_dict(plain.state_dict())
    src, tgt, _ = batch(b=2, s=5, t=4)
    with torch.no_grad():
        assert (plain(src, tgt) - cut(src, tgt)).abs().max() > 0.1


@pytest.mark.parametrize("value", [0, -1, 3])
def test_the_layer_without_a_residual_must_be_an_encoder_layer(value):
    with pytest.raises(UserError, match=r"^--encoder-no-residual-layer must name one of the 2 encoder layers "
                                        rf"\(1 to 2\), got {value}$"):
        TINY.replace(encoder_no_residual_layer=value).validate()


def test_sinusoid_table_matches_formula():
    d, n = 10, 50
    table = sinusoid_table(n, d)
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert sinusoid_table(3, 7).shape == (3, 7)  # odd widths work too (last column is a sine)


def test_embeddings_scaled_by_sqrt_d_model_and_pad_row_zero():
    model = make()
    assert model.embed_scale == pytest.approx(math.sqrt(TINY.d_model))
    assert torch.count_nonzero(model.src_embed.weight[0]) == 0
    # init N(0, d^-1/2): scaled embeddings have about unit variance
    assert model.tgt_embed.weight[4:].std().item() == pytest.approx(TINY.d_model ** -0.5, rel=0.1)


# ---- sharing, dropout, limits ---------------------------------------------------------------------


def test_sharing_modes_tie_the_right_tensors():
    m_all = make(TINY)
    assert m_all.src_embed.weight is m_all.tgt_embed.weight is m_all.out_proj.weight
    m_dec = make(TINY.replace(share_embeddings="decoder"), src_vocab=30)
    assert m_dec.tgt_embed.weight is m_dec.out_proj.weight
    assert m_dec.src_embed.weight is not m_dec.tgt_embed.weight
    m_none = make(TINY.replace(share_embeddings="none"), src_vocab=30)
    ws = [m_none.src_embed.weight, m_none.tgt_embed.weight, m_none.out_proj.weight]
    assert len({w.data_ptr() for w in ws}) == 3
    d = TINY.d_model
    n_all = sum(p.numel() for p in m_all.parameters())
    assert sum(p.numel() for p in m_dec.parameters()) == n_all + 30 * d
    assert sum(p.numel() for p in m_none.parameters()) == n_all + 30 * d + V * d
    # one matrix really: the encoder's gradient and the output's gradient both reach it
    src, tgt, _ = batch()
    m_all.train()
    m_all(src, tgt).sum().backward()
    g = m_all.tgt_embed.weight.grad
    assert g is not None and g[int(src[0, 0])].abs().sum() > 0
    # tying survives a state_dict round trip
    m2 = make(TINY, seed=5)
    m2.load_state_dict(m_all.state_dict())
    assert m2.src_embed.weight is m2.out_proj.weight
    torch.testing.assert_close(m2.out_proj.weight, m_all.out_proj.weight)


def test_share_all_refuses_different_vocabularies():
    with pytest.raises(UserError, match="joined-dictionary"):
        Transformer(TINY, 40, 50)
    Transformer(TINY.replace(share_embeddings="decoder"), 40, 50)  # fine


def test_dropout_only_in_training():
    model = make(TINY.replace(dropout=0.3, attention_dropout=0.2, activation_dropout=0.1))
    src, tgt, _ = batch()
    with torch.no_grad():
        a, b = model(src, tgt), model(src, tgt)
        assert torch.equal(a, b)
        model.train()
        c, d = model(src, tgt), model(src, tgt)
    assert not torch.allclose(c, d)
    no_drop = make(TINY.replace(dropout=0.0)).train()
    with torch.no_grad():
        torch.testing.assert_close(no_drop(src, tgt), no_drop.eval()(src, tgt))


def test_too_long_sequences_are_refused_with_the_flag_name():
    model = make(TINY.replace(max_source_positions=8, max_target_positions=5))
    with pytest.raises(UserError, match="--max-source-positions 8"):
        model.encode(torch.full((1, 9), 5))
    src, tgt, _ = batch(t=5)
    enc = model.encode(src)
    cache = model.new_cache()
    with torch.no_grad():
        for i in range(5):
            model.decode_step(tgt[:, i:i + 1], enc, cache)
        with pytest.raises(UserError, match="--max-target-positions 5"):
            model.decode_step(tgt[:, :1], enc, cache)


# ---- precision and compilation -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_autocast_forward_backward_on_cpu(dtype):
    model = make()
    src, tgt, _ = batch()
    with torch.no_grad():
        ref = model(src, tgt)
    model.train()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        logits = model(src, tgt)
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()
    logits.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        low = model(src, tgt).float()
    tol = {torch.float32: 1e-6, torch.bfloat16: 0.15, torch.float16: 0.02}[dtype]
    assert (low - ref).abs().max().item() < tol


def test_torch_compile_matches_eager():
    """Inductor (the default backend) on CPU; one layer each side keeps compile time ~5-10 s."""
    model = make(TINY.replace(encoder_layers=1, decoder_layers=1))
    src, tgt, _ = batch()
    compiled = torch.compile(model, dynamic=False)
    t0 = time.time()
    with torch.no_grad():
        torch.testing.assert_close(compiled(src, tgt), model(src, tgt), atol=1e-5, rtol=0)
    assert time.time() - t0 < 120  # compile time budget on a 2-core CPU


# ---- sizes and the registry ---------------------------------------------------------------------


def expected_params(cfg: ArchConfig, vocab: int) -> int:
    """Hand count for a shared-vocabulary model without biases in attention (docs/model.md)."""
    d, f, h = cfg.d_model, cfg.d_ff, cfg.heads
    dk, dv = cfg.head_dim_k, cfg.head_dim_v
    attn = d * h * (2 * dk + dv) + h * dv * d
    ffn = d * f + f + f * d + d
    ln = 2 * d
    enc = attn + ffn + 2 * ln
    dec = 2 * attn + ffn + 3 * ln
    return vocab * d + cfg.encoder_layers * enc + cfg.decoder_layers * dec


def test_param_counts_of_base_and_big_with_a_37k_joint_vocabulary():
    base = count_parameters(get_arch("transformer_base"), 37000)
    big = count_parameters(get_arch("transformer_big"), 37000)
    assert base == expected_params(get_arch("transformer_base"), 37000) == 63_045_632
    assert big == expected_params(get_arch("transformer_big"), 37000) == 214_171_648
    assert abs(big - 213e6) / 213e6 < 0.02
    # The paper's base figure (65M) is 3.0% above ours: its own Table 3 rows imply a ~41K
    # vocabulary for d_model=512 (docs/model.md). The architecture part is checked exactly below.
    assert abs(base - 65e6) / 65e6 < 0.031


# Table 3 reports parameters in millions (rounded); the differences from base do not depend on the
# vocabulary for d_model=512 rows, so they check the non-embedding counts against the paper.
@pytest.mark.parametrize("name,paper_millions", [
    ("transformer_base_dk16", 58), ("transformer_base_dk32", 60), ("transformer_base_n2", 36),
    ("transformer_base_n4", 50), ("transformer_base_n8", 80), ("transformer_base_ff1024", 53),
    ("transformer_base_ff4096", 90),
])
def test_table3_parameter_differences_match_the_paper(name, paper_millions):
    base = count_parameters(get_arch("transformer_base"), 37000)
    ours = count_parameters(get_arch(name), 37000)
    assert abs((ours - base) / 1e6 - (paper_millions - 65)) <= 1.0  # both paper numbers rounded


@pytest.mark.parametrize("name", list(ARCHS))
def test_every_registry_entry_builds_and_runs(name):
    """Real shapes for every entry, built on the meta device and filled with constants: random
    init of the big ones takes seconds each and is covered by the tiny-model tests."""
    cfg = ARCHS[name]
    tgt_vocab = 24 if cfg.share_embeddings != "all" else 20
    with torch.device("meta"):
        model = Transformer(cfg, 20, tgt_vocab)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg, 20, tgt_vocab)
    model.to_empty(device="cpu").eval()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(0.02 * ((i % 7) - 3))  # distinct constants: shapes and wiring, not numerics
        model.src_pos.reset_parameters()
        model.tgt_pos.reset_parameters()
        logits = model(torch.tensor([[5, 6, 2]]), torch.tensor([[1, 7]]))
    assert logits.shape == (1, 2, tgt_vocab) and torch.isfinite(logits).all()
    assert model.out_proj.weight.shape == (tgt_vocab, cfg.d_model)


def test_initialization_statistics():
    """Glorot-uniform projections (per Q/K/V block), zero biases, N(0, d^-1/2) embeddings."""
    cfg = TINY.replace(d_model=256, d_ff=512, heads=4)
    model = make(cfg)
    w = model.encoder_layers[0].self_attn.qkv_proj.weight  # (3*256, 256)
    for block in w.split(256):
        assert block.abs().max().item() <= math.sqrt(6 / 512) + 1e-7
        assert block.std().item() == pytest.approx(math.sqrt(2 / 512), rel=0.05)
    fc1 = model.decoder_layers[0].ffn.fc1
    assert fc1.weight.std().item() == pytest.approx(math.sqrt(2 / (256 + 512)), rel=0.05)
    assert torch.count_nonzero(fc1.bias) == 0
