"""Forward+backward throughput, peak memory and model FLOP utilization of one Transformer config.

    python recipes/bench/model.py --arch transformer_tiny --device cpu --dtype fp32
    python recipes/bench/model.py --arch transformer_base --device cuda --dtype bf16 --tokens 16384

One training step here = forward, cross-entropy loss (fp32), backward; no optimizer. Batches have
a realistic shape (sentences of --length tokens on both sides, as length bucketing produces) and
no padding. Prints one result line (and, with --profile, torch.profiler's top operators).

Model FLOPs are counted analytically (matmuls only, 2 per multiply-add; backward = 2x forward;
causal self-attention counts only the T(T+1)/2 visible pairs), so "MFU" is the achieved fraction
of the device's dense peak, as in the PaLM paper's definition.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import time

import torch
import torch.nn.functional as F

from nmtkit.models import ArchConfig, Transformer, count_parameters, get_arch

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="transformer_tiny")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="ArchConfig overrides, e.g. encoder_layers=3 d_model=256")
    p.add_argument("--label", default=None, help="name printed for this config")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--vocab", type=int, default=10000, help="joint vocabulary size")
    p.add_argument("--tokens", type=int, default=4000, help="target tokens per batch (about)")
    p.add_argument("--length", type=int, default=25, help="source and target sentence length")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--profile", action="store_true", help="print torch.profiler's top operators")
    a = p.parse_args()

    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench: --device cuda but CUDA is not available")
    dev = torch.device(a.device)
    overrides = {}
    for item in a.set:
        k, _, v = item.partition("=")
        overrides[k] = v
    from nmtkit.models.registry import apply_overrides

    cfg = apply_overrides(get_arch(a.arch), overrides)
    label = a.label or a.arch
    torch.manual_seed(0)
    model = Transformer(cfg, a.vocab, a.vocab).to(dev).train()
    step_model = torch.compile(model) if a.compile else model
    b, L = max(1, a.tokens // a.length), a.length
    src = torch.randint(4, a.vocab, (b, L), device=dev)
    src[:, -1] = 2
    prev = torch.randint(4, a.vocab, (b, L), device=dev)
    prev[:, 0] = 1
    target = torch.randint(4, a.vocab, (b, L), device=dev)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]

    def step() -> None:
        with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            logits = step_model(src, prev)  # (B, T, V)
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), target.view(-1))
        loss.backward()
        for prm in model.parameters():
            prm.grad = None

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    rss_before = rss_mb()
    for _ in range(a.warmup):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    tok_s = b * L / med
    flops = 3 * forward_flops(cfg, b, L, L, a.vocab)
    achieved = flops / med
    if dev.type == "cuda":
        mem = f"peak {torch.cuda.max_memory_allocated() / 2**20:,.0f} MiB allocated"
        name = torch.cuda.get_device_name()
        peak = gpu_peak(name)
        mfu = f"MFU {100 * achieved / peak:.1f}% of {peak / 1e12:.0f} TFLOP/s ({name})" if peak else \
            f"MFU unknown (no bf16 peak on file for {name!r})"
    else:
        mem = f"peak RSS {rss_mb():,.0f} MB (+{rss_mb() - rss_before:,.0f} MB during steps)"
        mfu = f"{torch.get_num_threads()} threads"
    params = count_parameters(cfg, a.vocab, a.vocab)
    print(f"{label:<28} {a.device}/{a.dtype}{' compiled' if a.compile else ''}  "
          f"params {params / 1e6:.1f}M  batch {b}x{L}+{b}x{L}  "
          f"{tok_s:,.0f} tgt tok/s  {med * 1e3:,.1f} ms/step (min {times[0] * 1e3:,.1f})  "
          f"{achieved / 1e12:.3f} TFLOP/s  {mfu}  {mem}", flush=True)

    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts, record_shapes=False) as prof:
            for _ in range(3):
                step()
            sync()
        key = "cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=25), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    main()
