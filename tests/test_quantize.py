"""CPU inference kernels (nmtkit.models.quantize): int8 and prepacked fp32 linear layers.

The int8 layer is checked against the formula computed independently in float64, its rows
against themselves computed alone (a row never depends on the batch), and quantized beam
search against brute force over the quantized model's own distribution; `--quantize` end to end
and its flag errors through the CLI.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from nmtkit.search.beam import SearchConfig, search
from nmtkit.models.quantize import Int8Linear, PackedLinear, convert_linears, packing_available
from tests.test_generate import COMMON, lines, setup  # noqa: F401 - fixture
from tests.test_search import REAL_SRCS, REV_SRCS, exhaustive, reference_beam, same, src_batch, tiny_transformer

torch.set_num_threads(1)


def _linear(n_in: int, n_out: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight[0].mul_(10.0)  # rows of different scales: per-row weight scales matter
    return lin


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("emulate", [False, True], ids=["int_mm", "fp32-product"])
def test_int8_linear_equals_the_formula(bias, emulate):
    lin = _linear(24, 10, bias, 0)
    x = torch.randn(3, 5, 24)
    x[0, 0] *= 50.0  # one loud token: per-row input scales keep the others precise
    x[1, 2] = 0.0  # an all-zero row
    got = Int8Linear(lin.weight, lin.bias, emulate=emulate)(x)
    # reference in float64: symmetric int8 per output row of W and per row of x
    w = lin.weight.double()
    sw = w.abs().amax(1) / 127
    wq = torch.round(w / sw[:, None])
    xr = x.reshape(-1, 24).double()
    sx = xr.abs().amax(1, keepdim=True).clamp_min(1e-300) / 127
    xq = torch.round(xr / sx)
    ref = (xq @ wq.t()) * sx * sw
    if bias:
        ref = ref + lin.bias.double()
    assert got.shape == (3, 5, 10) and got.dtype == torch.float32
    assert torch.allclose(got.reshape(-1, 10).double(), ref, rtol=1e-6, atol=1e-6)
    assert wq.abs().max() == 127 and xq.abs().max() == 127
    # and it is an approximation of the fp32 layer (about 1% here)
    exact = lin(x).detach()
    assert (got - exact).abs().max() <= 0.03 * exact.abs().max()


def test_the_two_int8_products_give_the_same_numbers():
    """torch._int_mm and the fp32 product of the same integers (an AVX2 CPU's kernel) agree
    exactly while sums stay below 2^24: K = 1024 with every input and weight at +-127."""
    lin = _linear(1024, 40, True, 2)
    with torch.no_grad():
        lin.weight[0] = lin.weight[0].abs()  # one row of the worst case: all products +127 * +127
    x = torch.randn(9, 1024)
    x[0] = 1.0
    a, b = Int8Linear(lin.weight, lin.bias, emulate=False), Int8Linear(lin.weight, lin.bias, emulate=True)
    with torch.inference_mode():
        assert torch.equal(a(x), b(x))
        ids = torch.tensor([0, 3, 39])
        assert torch.equal(a.rows(ids)(x), b.rows(ids)(x)) and b.rows(ids).emulated


def test_the_int8_kernel_follows_the_cpu(monkeypatch):
    from nmtkit.models import quantize

    lin = _linear(8, 4, False, 3)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not quantize.fast_int8_product() and Int8Linear(lin.weight, None).emulated
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert quantize.fast_int8_product() and not Int8Linear(lin.weight, None).emulated


def test_int8_and_packed_rows_do_not_depend_on_the_batch():
    lin = _linear(32, 48, True, 1)
    x = torch.randn(37, 32)
    layers = [Int8Linear(lin.weight, lin.bias, emulate=False), Int8Linear(lin.weight, lin.bias, emulate=True)]
    if packing_available():
        layers.append(PackedLinear(lin.weight, lin.bias))
    with torch.inference_mode():
        for layer in layers:
            full = layer(x)
            for i in (0, 5, 36):
                assert torch.equal(layer(x[i : i + 1]), full[i : i + 1]), type(layer).__name__
            assert torch.equal(layer(x[3:11]), full[3:11])
            assert layer(x[:0]).shape == (0, 48)


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN")
def test_packed_linear_equals_linear():
    lin = _linear(32, 40, True, 2)
    x = torch.randn(2, 7, 32)
    with torch.inference_mode():
        assert torch.allclose(PackedLinear(lin.weight, lin.bias)(x), lin(x), rtol=1e-5, atol=1e-6)
        nobias = _linear(32, 40, False, 2)
        assert torch.allclose(PackedLinear(nobias.weight, None)(x), nobias(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(4, 1, 32), (16, 32), (3, 5, 32), (0, 32), (32,)])
def test_packed_linear_takes_any_layout(shape):
    """Up to 16 rows go to oneDNN as they come (no reshape): non-contiguous and expanded inputs,
    1-D and 3-D, and 0 rows give what the contiguous product gives, in the input's shape."""
    lin = _linear(32, 40, True, 2)
    packed = PackedLinear(lin.weight, lin.bias)
    base = torch.randn(*shape[:-1], 64)[..., ::2]  # every other column: a strided view
    views = [base, base.transpose(0, -2) if base.dim() == 3 else base]
    if base.dim() >= 2 and base.size(0) > 0:
        views.append(base[:1].expand(*base.shape))  # rows sharing memory (stride 0)
    with torch.inference_mode():
        for x in views:
            assert not x.is_contiguous() or x.numel() == 0
            y = packed(x)
            assert y.shape == (*x.shape[:-1], 40)
            assert torch.equal(y, packed(x.contiguous()))
            assert torch.allclose(y, lin(x), rtol=1e-5, atol=1e-6)


def _quantized(model):
    n = convert_linears(model, "int8")
    assert n == sum(1 for m in model.modules() if isinstance(m, Int8Linear)) > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    return model


def test_convert_keeps_the_embedding_and_approximates_the_model():
    model = tiny_transformer(vocab=12, seed=3)
    src, prev = src_batch([[4, 5, 6, 7], [8, 9]]), torch.tensor([[1, 5, 6], [1, 7, 0]])
    with torch.inference_mode():
        ref = torch.log_softmax(model(src, prev), -1)
        emb = model.tgt_embed.weight.clone()
        q = _quantized(model)
        got = torch.log_softmax(q(src, prev), -1)
    assert torch.equal(q.tgt_embed.weight, emb)  # lookups keep the fp32 matrix
    assert (got - ref).abs().max() < 0.1
    assert not torch.equal(got, ref)


@pytest.mark.parametrize("lenpen,form", [(0.6, "gnmt"), (1.0, "fairseq")])
def test_quantized_large_beam_is_exact_against_brute_force(lenpen, form):
    """The quantized model's search is exact against brute force over the quantized model's own
    distribution (every prefix re-decoded alone: one row, no batch)."""
    model = _quantized(tiny_transformer(vocab=6, seed=2))
    max_len = 4
    cfg = SearchConfig(beam=3**max_len, lenpen=lenpen, lenpen_form=form, max_len_a=0, max_len_b=max_len)
    srcs = REAL_SRCS[:3]
    for src_row, hyps in zip(srcs, search(model, src_batch(srcs), cfg)):
        best_score, best_tokens = exhaustive(model, src_row, cfg, max_len)
        assert hyps[0].tokens == best_tokens
        assert hyps[0].score == pytest.approx(best_score, abs=1e-5)


@pytest.fixture(scope="module")
def quantized_reverser():
    from tests.test_search import load_reverser

    return _quantized(load_reverser())


@pytest.mark.parametrize("cfg", [SearchConfig(beam=4, nbest=2), SearchConfig(beam=3, min_len=4, lenpen=1.0, lenpen_form="fairseq"),
                                 SearchConfig(beam=1)])
def test_quantized_search_matches_reference_and_batching(quantized_reverser, cfg):
    """Small beams: the batched search equals the plain one-sentence reference beam search on
    the quantized model, and batched equals one sentence at a time (per-row quantization)."""
    srcs = REV_SRCS
    out = search(quantized_reverser, src_batch(srcs), cfg)
    # greedy search is beam search with a beam of 1 under fairseq's stopping rule
    ref_cfg = cfg if cfg.beam > 1 else dataclasses.replace(cfg, early_stop="beam")
    for src_row, hyps in zip(srcs, out):
        ref = reference_beam(quantized_reverser, src_row, ref_cfg, len(src_row) + 50)
        assert [h.tokens for h in hyps] == [r[1] for r in ref]
        assert [h.score for h in hyps] == pytest.approx([r[0] for r in ref], abs=1e-5)
    same(out, [search(quantized_reverser, src_batch([s]), cfg)[0] for s in srcs], tol=1e-6)


def test_generate_quantize_int8(setup, run_cli):
    data, ckpt, _, _ = setup
    fp32 = run_cli("generate", data, "--path", ckpt, *COMMON, "--print-scores")
    int8 = run_cli("generate", data, "--path", ckpt, *COMMON, "--print-scores", "--quantize", "int8")
    assert fp32.code == 0 and int8.code == 0, int8
    assert len(lines(int8.out)) == len(lines(fp32.out))
    assert lines(int8.out) != lines(fp32.out)  # other weights: other scores
    again = run_cli("generate", data, "--path", ckpt, *COMMON, "--print-scores", "--quantize", "int8", "--batch-size", "1")
    # batching never changes the output, quantized too (scores: up to fp32 rounding, which can
    # move a score printed with 4 decimals one step; the encoder's padding differs between batches)
    split = lambda out: [line.split("\t") for line in lines(out)]  # noqa: E731
    assert [t for _, t in split(again.out)] == [t for _, t in split(int8.out)]
    assert [float(s) for s, _ in split(again.out)] == pytest.approx([float(s) for s, _ in split(int8.out)], abs=1.5e-4)


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--quantize", "int4"), "--quantize must be one of none, int8, got 'int4'"),
        (("--quantize", "int8", "--precision", "bf16"), "--quantize int8 works from fp32 weights"),
    ],
)
def test_quantize_flag_errors(setup, run_cli, args, needle):
    data, ckpt, _, _ = setup
    r = run_cli("generate", data, "--path", ckpt, *COMMON, *args)
    assert r.code == 2 and needle in r.err and "Traceback" not in r.err, r


def test_translator_quantize(setup):
    from nmtkit import Translator
    from nmtkit.errors import UserError

    data, ckpt, _, _ = setup
    tr = Translator.load(ckpt, data, device="cpu", quantize="int8", max_len_b=6)
    assert any(isinstance(m, Int8Linear) for m in tr.engine.models[0].modules())
    assert len(tr.translate(["der Hund läuft", ""])) == 2
    with pytest.raises(UserError, match="runs on CPU only"):
        from nmtkit.models.quantize import check_quantize

        check_quantize("int8", torch.device("meta"), torch.float32)
    with pytest.raises(UserError, match="--quantize must be one of"):
        Translator.load(ckpt, data, device="cpu", quantize="fp8")


def test_padded_rows_bounds_the_shapes_and_the_waste():
    from nmtkit.models.quantize import padded_rows

    assert [padded_rows(m) for m in range(1, 17)] == list(range(1, 17))
    sizes = [padded_rows(m) for m in range(1, 4097)]
    assert all(m <= p <= 1.125 * m for m, p in zip(range(1, 4097), sizes))
    for k in range(4, 12):  # at most 8 sizes per doubling
        assert len({padded_rows(m) for m in range(2**k + 1, 2 ** (k + 1) + 1)}) <= 8
    assert all(padded_rows(p) == p for p in set(sizes))  # a padded count is its own bucket
