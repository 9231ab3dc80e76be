#!/usr/bin/env python3
"""Where the time of one CPU training update goes, phase by phase, on a preprocessed data dir.

    python recipes/bench/train_profile.py DATA_DIR [--steps 6] [--threads 2] [--torch-profile]

Builds the benchmark model (d_model 256, 3+3 layers, 4 heads, d_ff 1024, shared embeddings),
then times, over --steps batches of --max-tokens 4096: collation, forward, loss, backward,
gradient norm, optimizer step; and the same updates through nmtkit's Trainer._train_step, whose
extra cost over the sum of the phases is the trainer's per-update overhead. With
--torch-profile it also prints torch.profiler's top operators for one update, and their self time
by kind (matrix products, attention, dropout's random masks, other element-wise work, layer norm, softmax,
copies and indexing, the optimizer, the rest) with the bound that the products and attention set:
the speed-up if everything else took no time.
"""

import argparse
import re
import time

import torch

from nmtkit.data.batching import collate
from nmtkit.training.config import TrainConfig
from nmtkit.training.loss import fused_label_smoothed_cross_entropy
from nmtkit.training.step import total_norm as _total_norm
from nmtkit.training.trainer import Trainer

ARCH = dict(encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, heads=4, share_embeddings="all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = TrainConfig(data_dir=a.data_dir, save_dir="/nonexistent-profile-dir", arch="transformer_base",
                      arch_overrides=ARCH, lr_scheduler="inverse_sqrt", lr=7e-4, warmup_updates=1000,
                      max_tokens=4096, threads=a.threads, progress_bar=False, device="cpu")
    t = Trainer(cfg)
    t._build()
    t._make_iterators()
    t._prepare_run()
    batches = t.train_batches.batches(1)[: 2 * a.steps + 2]
    model, opt = t.model, t.optimizer
    phases = dict(collate=0.0, forward=0.0, loss=0.0, backward=0.0, grad_norm=0.0, optimizer=0.0)
    ntok = 0

    def clock(name, t0):
        phases[name] += time.perf_counter() - t0
        return time.perf_counter()

    t._train_step([collate(t.train_src, t.train_tgt, batches[0])])  # warm-up
    for idx in batches[2 : 2 + a.steps]:
        t0 = time.perf_counter()
        b = collate(t.train_src, t.train_tgt, idx)
        t0 = clock("collate", t0)
        hidden = model(b.src_tokens, b.prev_output_tokens, features_only=True)  # (B, T, D)
        t0 = clock("forward", t0)
        weight, bias = model.output_projection()  # the projection is the loss's, as in nmtkit train
        loss, _, n = fused_label_smoothed_cross_entropy(hidden, weight, b.target, 0.1, bias=bias)
        t0 = clock("loss", t0)
        (loss / n).backward()
        t0 = clock("backward", t0)
        float(_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
        t0 = clock("grad_norm", t0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock("optimizer", t0)
        ntok += b.ntokens
    total = sum(phases.values())
    print(f"{a.steps} updates, {ntok} target tokens, {a.threads} threads: {ntok / total:.0f} tgt tok/s by phases")
    for k, v in phases.items():
        print(f"  {k:10s} {1000 * v / a.steps:8.1f} ms/update  {100 * v / total:5.1f}%")
    t1, ntok2 = time.perf_counter(), 0
    for idx in batches[2 + a.steps : 2 + 2 * a.steps]:
        b = collate(t.train_src, t.train_tgt, idx)
        t._train_step([b])
        ntok2 += b.ntokens
    wall = time.perf_counter() - t1
    print(f"Trainer._train_step (incl. collate): {1000 * wall / a.steps:.1f} ms/update, {ntok2 / wall:.0f} tgt tok/s "
          f"(other batches; compare per token)")
    if a.torch_profile:
        from torch.profiler import ProfilerActivity, profile

        b = collate(t.train_src, t.train_tgt, batches[1])
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            t._train_step([b])
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25,
                                                                 max_name_column_width=45, max_shapes_column_width=50))
        by_kind(prof.key_averages())


# operator name (aten::...) -> kind; the first pattern that matches wins
KINDS = [
    ("matrix products", r"^aten::(mm|addmm|addmm_|bmm|baddbmm|_addmm_activation|matmul|linear)$"),
    ("attention (SDPA)", r"scaled_dot_product"),  # its products and softmax in one kernel
    ("dropout masks", r"^aten::(bernoulli_?|native_dropout)"),
    ("layer norm", r"layer_norm"),
    ("softmax", r"softmax"),
    ("optimizer", r"adam"),
    ("copies and indexing", r"^aten::(copy_|clone|contiguous|index|index_select|index_add_|gather|scatter|embedding"
                            r"|cat|stack|_to_copy|to|masked_fill_?|masked_select|nonzero|where|fill_|zero_|zeros"
                            r"|empty|narrow|slice|select|view|reshape|t|transpose|permute|expand|as_strided)"),
    ("other element-wise", r"^aten::(mul|add|div|sub|relu|threshold_backward|sum|mean|exp|log|neg|rsqrt|sqrt|pow"
                           r"|clamp|max|amax|sort|logsumexp|eq|ne|lt|gt|abs|sign|_foreach|norm|linalg_vector_norm)"),
]


def by_kind(events) -> None:
    """Self CPU time of one update by kind of operator (profiler key averages), and the bound of
    the products: how much faster the update would be if only they took time."""
    totals: dict[str, float] = {}
    for e in events:
        name = e.key
        if not name.startswith("aten::"):
            continue
        kind = next((k for k, pat in KINDS if re.search(pat, name)), "the rest")
        totals[kind] = totals.get(kind, 0.0) + e.self_cpu_time_total / 1000.0  # ms
    whole = sum(totals.values())
    print("self CPU time of one update by kind of operator:")
    for kind, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:22s} {ms:9.1f} ms  {100 * ms / whole:5.1f}%")
    products = totals.get("matrix products", 0.0) + totals.get("attention (SDPA)", 0.0)
    if products:
        print(f"  if only the matrix products and attention took time: {whole / products:.2f}x this update's speed")


if __name__ == "__main__":
    main()
