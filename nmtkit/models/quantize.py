"""CPU inference kernels for the model's linear layers: int8 (`--quantize int8`) and prepacked fp32.

Why: at decoding time on CPU almost all the work is in the linear layers (the projections, the
feed-forward network and the output projection over the vocabulary), and with a few rows per
step (one sentence, a beam of 4) they are bound by reading the weights. Two transforms replace
every `nn.Linear` of a loaded model by an inference-only module (`convert_linears`):

- `Int8Linear` (`--quantize int8`): weights in int8 with one scale per output row (symmetric),
  inputs quantized to int8 on the fly with one scale per *row* (token), an exact int8 x int8 ->
  int32 product (`torch._int_mm`), then the two scales: `y = (xq Wq^T) * s_x * s_w + b`, in fp32.
  Scores (log-softmax and everything after) stay fp32. Per-row input scales make a row's result
  independent of the other rows of the batch, so, as in fp32, batching never changes a
  hypothesis, and the quantized model has a well-defined distribution that the tests check
  search against by brute force. (PyTorch's dynamic quantization, `quantize_dynamic` with
  fbgemm, is about 1.2x faster at 512 rows and 2x at 4 rows but quantizes inputs with one scale
  per batch: results then depend on what else is in the batch. Measured in docs/generate.md.)
- `PackedLinear` (fp32, on by default on CPU): the same product in fp32 through oneDNN with
  the weights reordered once into its blocked layout (the op torch.compile's CPU backend uses
  after freezing). On the development machine (AMD EPYC, AVX-512) it is 2-2.5x faster than
  `F.linear`'s MKL sgemm from 4 rows up, and a row's result does not depend on the batch.

Both keep the module tree (the attributes `qkv_proj`, `fc1`, `out_proj`, ... keep their names),
so the model code is unchanged; neither has a `weight` Parameter any more, so a converted model
is for inference only (no training, no state_dict round trip, no export).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmtkit.errors import UserError

QUANTIZE_CHOICES = ("none", "int8")


def fast_int8_product() -> bool:
    """Whether torch's int8 x int8 -> int32 product (`torch._int_mm`) has a fast kernel here:
    oneDNN's, on a CPU with AVX-512. On an AVX2-only CPU torch falls back to a plain loop, measured
    10-30x slower than the fp32 product of the same shape (AMD EPYC, AVX2, torch 2.13: 4 x 256 x
    1024 in 737 us against 78 us; 512 rows in 98 ms against 3.1 ms), which made `--quantize int8`
    3.5x slower than fp32 there."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


class Int8Linear(nn.Module):
    """`nn.Linear` with int8 weights (per output row) and int8 inputs (per row), fp32 output.

    The integer product runs as `torch._int_mm` where it is fast (`fast_int8_product`), and
    elsewhere as an fp32 product of the same integers (the prepacked kernel where there is one):
    every product and partial sum is an integer below 2^24 in magnitude while K <= 1040
    (127 * 127 * 1040 < 2^24), so fp32 holds it exactly and the two give the same numbers; on wider
    layers they differ only where a sum passes 2^24 (a rounding of one unit in 2^24). An AVX2 CPU
    thus runs an int8 model at the fp32 speed, with int8's results, instead of 3.5x slower.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, emulate: bool | None = None):
        super().__init__()
        w = weight.detach().float()  # (N, K)
        self.in_features, self.out_features = w.size(1), w.size(0)
        scale = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0  # (N,)
        # (N, K); forward multiplies by its (K, N) transposed view, the fastest layout measured
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.emulated = (not fast_int8_product()) if emulate is None else emulate
        self.product = self._float_product() if self.emulated else None  # the integers in fp32

    def _float_product(self, bucket: bool = False):
        """x (M, K) -> x W_int8^T (M, N) in fp32: the prepacked kernel where there is one (with
        `bucket`, its weight padded to a bucket of rows: `first_columns`)."""
        wf = self.weight_int8.float()  # (N, K), exact integers
        if packing_available():
            return first_columns(wf, None) if bucket else PackedLinear(wf, None)
        return lambda x: x @ wf.t()

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) float -> (..., N) float32."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float()  # (M, K)
        if x2.size(0) == 0:
            return x2.new_zeros(*lead, self.out_features)
        s = x2.abs().amax(dim=1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny).div_(127.0)  # (M, 1)
        xq = (x2 / s).round_()  # (M, K), integers in [-127, 127]
        if self.emulated:
            y = self.product(xq)  # (M, N) fp32, exact integers (the class docstring)
        else:
            # (M, N) int32 -> float32, then the two scales in place: the same numbers as
            # `acc * s`, whose int32 x float broadcast takes a slow path (12x slower at 512 x 8008)
            y = torch._int_mm(xq.to(torch.int8), self.weight_int8.t()).to(torch.float32)
        y.mul_(s).mul_(self.weight_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*lead, self.out_features)

    def rows(self, ids: Tensor) -> "Int8Linear":
        """The layer restricted to output rows `ids` (C,) long (a lexical shortlist's candidates):
        the same int8 rows and scales, so each output equals the full layer's column exactly."""
        out = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(out)
        out.in_features, out.out_features = self.in_features, int(ids.numel())
        out.register_buffer("weight_int8", self.weight_int8.index_select(0, ids))  # (C, K)
        out.register_buffer("weight_scale", self.weight_scale.index_select(0, ids))  # (C,)
        out.register_buffer("bias", None if self.bias is None else self.bias.index_select(0, ids))
        out.emulated = self.emulated
        out.product = out._float_product(bucket=True) if out.emulated else None
        return out

    def extra_repr(self) -> str:
        kernel = "int8 in fp32" if self.emulated else "int8"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {kernel}"


def padded_rows(m: int) -> int:
    """The row count a product of `m` rows is computed with: m itself up to 16, then rounded up
    to one of 8 steps per doubling (at most 12.5% more rows, 6% on average).

    Why: oneDNN builds (and keeps, about 0.5 MB each, measured) one kernel per input shape, and
    beam search changes the row count at almost every step as sentences finish: a batch of 128
    sentences made several hundred shapes and grew the process by 600 MB. Rows do not interact
    in a matrix product and oneDNN's results for a row do not depend on the others (tested), so
    the zero rows change nothing but the count of shapes (at most 8 per doubling).
    """
    if m <= 16:
        return m
    step = 1 << (m - 1).bit_length() - 4  # (2^k, 2^(k+1)] in steps of 2^(k-3)
    return -(-m // step) * step


class PackedLinear(nn.Module):
    """`nn.Linear` in fp32 through oneDNN with the weight reordered once (CPU)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, keep_source: bool = False):
        super().__init__()
        w = weight.detach().float().contiguous()  # (N, K)
        self.in_features, self.out_features = w.size(1), w.size(0)
        # An opaque oneDNN tensor, kept as a plain attribute: it has no place in a state_dict.
        self.weight_packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        # the fp32 matrix, for `rows` (the output projection keeps it: a shortlist packs some of
        # its rows per batch; when tied it is the target embedding's own matrix, no copy)
        self.source = w if keep_source else None

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) float32 -> (..., N) float32."""
        m = x.numel() // self.in_features  # rows of the product
        if m <= 16:  # no padding (padded_rows(m) == m): the op takes x as it is, in any shape
            # (one call instead of five: at batch 1 the wrapper's reshape/slice/view were 5 us
            # of a 25 us product, 19 times per decoding step)
            return torch.ops.mkldnn._linear_pointwise(x, self.weight_packed, self.bias, "none", [], "")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        rows = padded_rows(m)
        if rows != m:  # zero rows up to a bucket size: see padded_rows
            x2 = torch.cat([x2, x2.new_zeros(rows - m, self.in_features)])
        y = torch.ops.mkldnn._linear_pointwise(x2, self.weight_packed, self.bias, "none", [], "")  # (rows, N)
        return y[:m].view(*lead, self.out_features)

    def rows(self, ids: Tensor) -> "PackedLinear":
        """The layer restricted to output rows `ids` (C,) long, packed anew (once per batch of a
        search with a shortlist; a few milliseconds for thousands of rows)."""
        if self.source is None:
            raise ValueError("this packed layer did not keep its fp32 weight (keep_source=False)")
        bias = None if self.bias is None else self.bias.index_select(0, ids)
        return first_columns(self.source.index_select(0, ids), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, oneDNN fp32"


class FirstColumns(nn.Module):
    """A prepacked product whose weight has zero rows added up to a bucket size: its first
    `n` outputs, the product of the real rows."""

    def __init__(self, product: PackedLinear, n: int):
        super().__init__()
        self.product, self.n = product, n

    def forward(self, x: Tensor) -> Tensor:
        return self.product(x)[..., : self.n]


def first_columns(weight: Tensor, bias: Tensor | None) -> nn.Module:
    """`PackedLinear(weight, bias)` for a weight of a varying number of rows (a shortlist's
    candidates, a new count per batch): packed with zero rows up to `padded_rows`' bucket.

    Why: oneDNN builds and keeps a kernel per weight shape, and a shortlist gives each batch its
    own count; at batch 1 a thousand sentences made hundreds of shapes and grew the process by
    120 MiB. Rows do not interact in a product, so the added ones change no real output.
    """
    n, k = weight.shape
    width = padded_rows(n)
    if width == n:
        return PackedLinear(weight, bias)
    weight = torch.cat([weight, weight.new_zeros(width - n, k)])  # (width, K)
    bias = None if bias is None else torch.cat([bias, bias.new_zeros(width - n)])
    return FirstColumns(PackedLinear(weight, bias), n)


def packing_available() -> bool:
    """Whether this torch build has oneDNN's fp32 linear ops (x86 and most CPU wheels do)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def check_quantize(quantize: str | None, device: torch.device, dtype: torch.dtype) -> str | None:
    """The quantization to apply (None for none), or a UserError naming --quantize."""
    if quantize in (None, "none"):
        return None
    if quantize not in QUANTIZE_CHOICES:
        raise UserError(f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {quantize!r}")
    if device.type != "cpu":
        raise UserError(f"--quantize {quantize} runs on CPU only; use --device cpu (on {device.type}, "
                        f"use --precision bf16 or fp16 instead)")
    if dtype != torch.float32:
        raise UserError(f"--quantize {quantize} works from fp32 weights; drop --precision (or use it without --quantize)")
    if not hasattr(torch, "_int_mm"):
        raise UserError(f"--quantize {quantize} needs torch._int_mm, which this torch {torch.__version__} lacks; "
                        f"upgrade torch (>= 2.2)")
    return quantize


def convert_linears(model: nn.Module, kind: str) -> int:
    """Replace every nn.Linear of `model` in place by `Int8Linear` (kind "int8") or
    `PackedLinear` (kind "packed"); return how many were replaced.

    A weight tied to an embedding (the output projection) gets its own converted copy; the
    embedding keeps the fp32 matrix for its lookups.
    """
    todo = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is nn.Linear]
    for parent, name, child in todo:
        if kind == "int8":
            setattr(parent, name, Int8Linear(child.weight, child.bias))
        else:  # the output projection keeps its fp32 matrix for shortlists (`PackedLinear.rows`)
            setattr(parent, name, PackedLinear(child.weight, child.bias, keep_source=parent is model and name == "out_proj"))
    return len(todo)
