"""Forward+backward throughput, peak memory and model FLOP utilization of one Transformer config.

    python recipes/bench/model.py --arch transformer_tiny --device cpu --dtype fp32
    python recipes/bench/model.py --arch transformer_base --device cuda --dtype bf16 --tokens 16384

One training step here = forward, cross-entropy loss (fp32), backward; no optimizer. Batches have
a realistic shape (sentences of --length tokens on both sides, as length bucketing produces) and
no padding. Prints one result line (and, with --profile, torch.profiler's top operators).

With --step train the step is the one `nmtkit train` makes: forward under autocast to the
decoder's states, nmtkit's chunked output projection and label-smoothed cross-entropy (softmax
statistics in fp32, no whole-batch logits), backward, the gradient norm (read on the host, as the trainer
logs it) and a fused AdamW step.

--tokens takes a comma-separated list searched upward: each size is measured in turn and the
search stops at the first that runs out of memory (CUDA). --json FILE appends one JSON object per
size (status "ok", "oom" or "error" and the figures) for drivers such as recipes/bench/gpu_bench.py.

Model FLOPs are counted analytically (matmuls only, 2 per multiply-add; backward = 2x forward;
causal self-attention counts only the T(T+1)/2 visible pairs), so "MFU" is the achieved fraction
of the device's dense peak, as in the PaLM paper's definition; --peak-tflops also reports it
against a measured rate (e.g. the bf16 GEMM rate that recipes/bench/gpu_bench.py measures).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import sys
import time

import torch
import torch.nn.functional as F

from nmtkit.models import ArchConfig, Transformer, count_parameters, get_arch
from nmtkit.training.loss import fused_label_smoothed_cross_entropy

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' datasheets, in FLOP/s. The first
# matching pattern of torch.cuda.get_device_name() wins, so specific names come first.
GPU_PEAK_BF16 = [
    (r"H100 PCIe", 756e12),
    (r"H100 NVL", 835e12),
    (r"H200", 989e12),
    (r"H100", 989e12),  # SXM
    (r"A100", 312e12),
    (r"L40S", 362e12),
    (r"\bL4\b", 121e12),
    (r"\bA10\b", 125e12),  # not the A10G
]


def gpu_peak(name: str) -> float | None:
    """The dense bf16 peak for a torch.cuda.get_device_name(), or None if not on file."""
    for pattern, peak in GPU_PEAK_BF16:
        if re.search(pattern, name):
            return peak
    return None


def forward_flops(cfg: ArchConfig, b: int, s: int, t: int, vocab: int) -> float:
    """Matmul FLOPs of one forward pass on a (b, s) source and (b, t) target batch."""
    d, f, h = cfg.d_model, cfg.d_ff, cfg.heads
    dk, dv = cfg.head_dim_k, cfg.head_dim_v
    src, tgt = b * s, b * t
    proj_self = 2 * d * h * (2 * dk + dv) + 2 * h * dv * d  # q, k, v and W^O per token
    ffn = 4 * d * f
    enc = src * (proj_self + ffn) + 2 * b * h * s * s * (dk + dv)
    causal_pairs = t * (t + 1) / 2
    dec = (tgt * (proj_self + ffn) + 2 * b * h * causal_pairs * (dk + dv)  # self-attention, FFN
           + tgt * (2 * d * h * dk + 2 * h * dv * d)  # cross-attention q and W^O
           + src * 2 * d * h * (dk + dv)  # cross-attention k, v from the encoder output
           + 2 * b * h * t * s * (dk + dv))  # cross-attention scores and weighted values
    out = 2 * tgt * d * vocab
    return cfg.encoder_layers * enc + cfg.decoder_layers * dec + out


def rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def is_oom(e: BaseException) -> bool:
    """A device out-of-memory error (torch.OutOfMemoryError, or an older torch's RuntimeError)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(e, oom_type)) or "out of memory" in str(e).lower()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="transformer_tiny")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="ArchConfig overrides, e.g. encoder_layers=3 d_model=256")
    p.add_argument("--label", default=None, help="name printed for this config")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--vocab", type=int, default=10000, help="joint vocabulary size")
    p.add_argument("--tokens", default="4000",
                   help="target tokens per batch (about); a comma-separated list is searched upward, "
                        "stopping at the first size that runs out of memory")
    p.add_argument("--length", type=int, default=25, help="source and target sentence length")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--step", default="fwd-bwd", choices=["fwd-bwd", "train"],
                   help="fwd-bwd: forward, cross-entropy, backward; train: nmtkit train's update "
                        "(label-smoothed loss, gradient norm, fused AdamW)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--dynamic", action="store_true",
                   help="with --compile: dynamic shapes, as `nmtkit train --compile` compiles")
    p.add_argument("--compile-backend", default="inductor",
                   help="with --compile: torch.compile backend (inductor; aot_eager traces without "
                        "generating kernels, for quick checks on CPU)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="also report MFU against this rate (TFLOP/s), e.g. a measured GEMM rate")
    p.add_argument("--json", default=None, metavar="FILE", help="append one JSON object per size to FILE")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top operators")
    a = p.parse_args(argv)
    try:
        a.token_list = [int(t) for t in str(a.tokens).split(",") if t.strip()]
    except ValueError:
        p.error(f"--tokens: comma-separated integers expected, got {a.tokens!r}")
    if not a.token_list or min(a.token_list) < 1:
        p.error("--tokens: at least one positive size")
    return a


class Bench:
    """One model (and optimizer, with --step train), measured at one batch size after another."""

    def __init__(self, a: argparse.Namespace):
        from nmtkit.models.registry import apply_overrides

        self.a = a
        self.dev = torch.device(a.device)
        overrides = {}
        for item in a.set:
            k, _, v = item.partition("=")
            overrides[k] = v
        self.cfg = apply_overrides(get_arch(a.arch), overrides)
        self.label = a.label or a.arch
        torch.manual_seed(0)
        self.model = Transformer(self.cfg, a.vocab, a.vocab).to(self.dev).train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.step_model = self.model
        if a.compile:
            self.step_model = torch.compile(self.model, dynamic=True if a.dynamic else None,
                                            backend=a.compile_backend)
        self.optimizer = None
        if a.step == "train":
            kw = {"lr": 1e-4, "betas": (0.9, 0.98), "eps": 1e-9, "weight_decay": 0.0}  # nmtkit train's Adam
            try:
                self.optimizer = torch.optim.AdamW(self.params, fused=True, **kw)
            except (RuntimeError, ValueError, TypeError):
                self.optimizer = torch.optim.AdamW(self.params, **kw)
        self.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
        self.batch = None
        self.compiled_once = False

    def set_batch(self, tokens: int) -> tuple[int, int]:
        a, dev = self.a, self.dev
        self.batch = None
        b, L = max(1, tokens // a.length), a.length
        src = torch.randint(4, a.vocab, (b, L), device=dev)
        src[:, -1] = 2
        prev = torch.randint(4, a.vocab, (b, L), device=dev)
        prev[:, 0] = 1
        target = torch.randint(4, a.vocab, (b, L), device=dev)
        self.batch = (src, prev, target)
        return b, L

    def step(self) -> None:
        a = self.a
        src, prev, target = self.batch
        autocast = torch.autocast(self.dev.type, dtype=self.amp_dtype or torch.float32,
                                  enabled=self.amp_dtype is not None)
        if self.optimizer is None:
            with autocast:
                logits = self.step_model(src, prev)  # (B, T, V)
            loss = F.cross_entropy(logits.float().view(-1, a.vocab), target.view(-1))
            del logits
            loss.backward()
            for prm in self.params:
                prm.grad = None
            return
        with autocast:  # as nmtkit train: decoder states, then the chunked projection and loss
            hidden = self.step_model(src, prev, features_only=True)  # (B, T, D)
            weight, bias = self.model.output_projection()
            loss, _nll, _ = fused_label_smoothed_cross_entropy(hidden, weight, target, self.cfg.label_smoothing,
                                                               bias=bias)
        del hidden
        loss.backward()
        grads = [p.grad for p in self.params if p.grad is not None]  # the norm the trainer logs (a sync)
        float(torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads)])))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def free(self) -> None:
        """After an out-of-memory error: drop the batch and gradients, return cached blocks."""
        self.batch = None
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        for prm in self.params:
            prm.grad = None
        gc.collect()
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()

    def measure(self, tokens: int) -> dict:
        """Warm-up and timed steps at about `tokens` target tokens; -> the JSON record."""
        a = self.a
        b, L = self.set_batch(tokens)
        rec = {"label": self.label, "arch": a.arch, "device": a.device, "dtype": a.dtype, "step": a.step,
               "compile": a.compile, "dynamic": a.dynamic if a.compile else None,
               "compile_backend": a.compile_backend if a.compile else None,
               "tokens_requested": tokens, "max_tokens": b * L, "batch": [b, L], "vocab": a.vocab,
               "params": count_parameters(self.cfg, a.vocab, a.vocab)}
        rss_before = rss_mb()
        if self.dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(a.warmup):
            self.step()
        self.sync()
        rec["warmup_s"] = round(time.perf_counter() - t0, 3)  # includes compilation on the first size
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            self.step()
            self.sync()
            times.append(time.perf_counter() - t0)
        times.sort()
        med = times[len(times) // 2]
        flops = 3 * forward_flops(self.cfg, b, L, L, a.vocab)
        achieved = flops / med
        rec.update(status="ok", tgt_tok_per_s=round(b * L / med, 1), ms_per_step=round(med * 1e3, 3),
                   ms_min=round(times[0] * 1e3, 3), tflops=round(achieved / 1e12, 4))
        if a.peak_tflops:
            rec["mfu_measured"] = round(achieved / (a.peak_tflops * 1e12), 4)
            rec["peak_tflops_measured"] = a.peak_tflops
        if self.dev.type == "cuda":
            name = torch.cuda.get_device_name()
            peak = gpu_peak(name)
            rec.update(gpu=name, peak_mem_mib=round(torch.cuda.max_memory_allocated() / 2**20, 1),
                       peak_reserved_mib=round(torch.cuda.max_memory_reserved() / 2**20, 1),
                       datasheet_tflops=peak / 1e12 if peak else None,
                       mfu_datasheet=round(achieved / peak, 4) if peak else None)
        else:
            rec.update(threads=torch.get_num_threads(), peak_rss_mb=round(rss_mb(), 1),
                       rss_growth_mb=round(rss_mb() - rss_before, 1))
        return rec

    def line(self, rec: dict) -> str:
        """The one-line summary of a measured size."""
        a = self.a
        if rec["device"] == "cuda":
            name = rec["gpu"]
            mfu = (f"MFU {100 * rec['mfu_datasheet']:.1f}% of {rec['datasheet_tflops']:.0f} TFLOP/s ({name})"
                   if rec.get("mfu_datasheet") is not None else f"MFU unknown (no bf16 peak on file for {name!r})")
            mem = f"peak {rec['peak_mem_mib']:,.0f} MiB allocated"
        else:
            mfu = f"{rec['threads']} threads"
            mem = f"peak RSS {rec['peak_rss_mb']:,.0f} MB (+{rec['rss_growth_mb']:,.0f} MB during steps)"
        if rec.get("mfu_measured") is not None:
            mfu += f", {100 * rec['mfu_measured']:.1f}% of the measured {rec['peak_tflops_measured']:.3g} TFLOP/s"
        b, L = rec["batch"]
        return (f"{self.label:<28} {a.device}/{a.dtype}{' compiled' if a.compile else ''}"
                f"{' (train step)' if a.step == 'train' else ''}  params {rec['params'] / 1e6:.1f}M  "
                f"batch {b}x{L}+{b}x{L}  {rec['tgt_tok_per_s']:,.0f} tgt tok/s  {rec['ms_per_step']:,.1f} ms/step "
                f"(min {rec['ms_min']:,.1f})  {rec['tflops']:.3f} TFLOP/s  {mfu}  {mem}")


def write_json(path: str | None, rec: dict) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench: --device cuda but CUDA is not available")
    bench = Bench(a)
    status = 0
    for tokens in a.token_list:
        try:
            rec = bench.measure(tokens)
        except Exception as e:  # noqa: BLE001 - an out-of-memory size ends the search; others are reported
            oom = is_oom(e)
            b, L = max(1, tokens // a.length), a.length
            rec = {"label": bench.label, "arch": a.arch, "device": a.device, "dtype": a.dtype, "step": a.step,
                   "compile": a.compile, "tokens_requested": tokens, "max_tokens": b * L, "batch": [b, L],
                   "status": "oom" if oom else "error", "message": f"{type(e).__name__}: {str(e)[:500]}"}
            del e
            bench.free()
            write_json(a.json, rec)
            print(f"{bench.label:<28} {a.device}/{a.dtype}{' compiled' if a.compile else ''}  batch {b}x{L}: "
                  f"{'out of memory' if oom else rec['message']}", flush=True)
            if not oom:
                status = 1
            break
        write_json(a.json, rec)
        print(bench.line(rec), flush=True)

    if a.profile and bench.batch is not None:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.dev.type == "cuda" else [])
        with profile(activities=acts, record_shapes=False) as prof:
            for _ in range(3):
                bench.step()
            bench.sync()
        key = "cuda_time_total" if bench.dev.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=25), flush=True)
    return status


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    sys.exit(main())
