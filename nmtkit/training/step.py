"""One training update: forward/backward over the micro-batches, then apply it or skip it.

What one update does (K = --update-freq micro-batches on each of W ranks):
  1. sum this rank's target tokens and sentences, and the loop's flags, over ranks -> N (one
     all-reduce);
  2. set the learning rate of update u (1-based) from the schedule;
  3. forward to the decoder's final states, label-smoothed loss sum of their projection (chunk by
     chunk: training/loss.py), backward of loss_sum * W / N for each micro-batch (DDP
     averages gradients over ranks, so the result is d(total loss / N) exactly as on one process
     with K * W micro-batches); DDP syncs gradients only on the last micro-batch;
     a collective of the update (ours, or DDP's in its forward and syncing backward) that times
     out or loses a peer raises D.CollectiveFailed naming it and the update;
  4. (fp16: unscale) gradient norm; a non-finite norm or loss skips the update (NaN/inf: "nan";
     fp16 overflow: the loss scale shrinks, "fp16_overflow"); an out-of-memory error skips it
     ("oom", one process only);
  5. clip to --clip-norm, Adam step, EMA update.

Host synchronisation: on CUDA the host queues kernels ahead of the device and only waits where
it reads a value back. An update reads back once (`read_back`), after the gradient norm: the
target-token and sentence counts and the loop's flags (summed over ranks on the device), the
norm and the loss sums travel together, and the host decides from them whether the update is
finite (fairseq makes the same check) before it steps. Nothing else in the update waits for the
device: the token count that normalizes the loss is a device scalar, and the loss gathers the
non-pad target positions with a count taken from the batch's host copy. The only other read is
the fp16 loss scale after an overflow (a skipped update), checked against MIN_LOSS_SCALE.

Why a module of its own: the step is the numerical heart of training and is pinned by
tests/test_update_step.py against independent references; it touches no counters, files or
logs. It returns a `StepResult`, which the loop counts (state.TrainState.count), logs and
checks against the stopping rules.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from nmtkit.data.batching import PAD
from nmtkit.errors import UserError
from nmtkit.training import distributed as D
from nmtkit.training.ema import EMA
from nmtkit.training.loss import fused_label_smoothed_cross_entropy
from nmtkit.training.schedule import Schedule
from nmtkit.training.stopping import LoopFlags, TrainingStopped

MIN_LOSS_SCALE = 2.0**-14  # fp16: below this the loss scale keeps overflowing; training is broken


@dataclass
class TrainingObjects:
    """What training updates and a checkpoint saves: the model and its optimizer, schedule,
    fp16 loss scaler and (with --ema-decay) the moving average of its weights."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    scaler: torch.amp.GradScaler
    ema: EMA | None = None


@dataclass
class StepResult:
    """What one update did. Sums are over all micro-batches of all ranks, losses in nats."""

    applied: bool  # the optimizer step was taken
    ntokens: int  # non-pad target tokens (N)
    nsentences: int
    lr: float  # the learning rate of this update
    flags: LoopFlags = field(default_factory=LoopFlags)  # the loop's flags, agreed over ranks
    loss_sum: float = 0.0  # label-smoothed loss
    nll_sum: float = 0.0  # unsmoothed negative log-likelihood
    gnorm: float = math.nan  # global gradient L2 norm before clipping (unscaled)
    skip: str | None = None  # why not applied: "nan", "oom" or "fp16_overflow"
    shapes: str = ""  # oom: the micro-batches, sentences x src/tgt length


def autocast(device: torch.device, amp_dtype: torch.dtype | None):
    """torch.autocast for --precision bf16/fp16 on `device`; a no-op context for fp32."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of all gradients (one fused norm per tensor, then the norm of the norms)."""
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(grads)]))


def read_back(t: torch.Tensor) -> list[float]:
    """The update's one read of the device: t's values on the host. On CUDA the host waits here
    for every kernel queued so far (see "Host synchronisation" in the module docstring)."""
    return t.tolist()


def host_nonpad_count(target: torch.Tensor) -> int | None:
    """Non-pad positions of a collated target still on the host, counted there (numpy), so that
    the loss gathers them on the device without reading anything back; None for a target already
    on the device (the loss then counts them itself, waiting for the device)."""
    if target.device.type != "cpu":
        return None
    return int(np.count_nonzero(target.numpy() != PAD))


def is_oom(e: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom_type is not None and isinstance(e, oom_type)) or "out of memory" in str(e).lower()


class UpdateStep:
    """Makes updates of `objs` (see the module docstring); `forward_model` is the model as
    called (DDP- and/or torch.compile-wrapped), `ddp` the DDP wrapper when there is one."""

    def __init__(self, objs: TrainingObjects, forward_model: torch.nn.Module, ddp, *, device: torch.device,
                 info: D.DistInfo, amp_dtype: torch.dtype | None, epsilon: float, clip_norm: float):
        self.objs, self.forward_model, self.ddp = objs, forward_model, ddp
        self.device, self.info, self.amp_dtype = device, info, amp_dtype
        self.epsilon, self.clip_norm = epsilon, clip_norm
        self.params = [p for p in objs.model.parameters() if p.requires_grad]

    def __call__(self, batches: list, update: int, flags: LoopFlags) -> StepResult:
        """Update number `update` (1-based) over this rank's micro-batches (collated Batch objects)."""
        where = f"update {update}"  # for the message of a collective that fails
        head = self._head(batches, flags, where)  # (5,) float64 on the device: N, sentences, flags
        lr = self.objs.schedule.lr(update)
        for g in self.objs.optimizer.param_groups:
            g["lr"] = lr
        # W / N as a device scalar: N need not be read back (W, a Python number, over the float64 head)
        world = torch.full((), self.info.world_size, dtype=torch.float64, device=head.device)
        scale = world / head[0].clamp(min=1)
        try:
            sums = self._backward(batches, scale=scale, where=where)
        except Exception as e:  # noqa: BLE001 - only out-of-memory is handled; anything else re-raised
            if not is_oom(e):
                raise
            return self._skip_oom(batches, flags)
        D.all_reduce_sum(sums, self.info, where)
        if self.objs.scaler.is_enabled():
            self.objs.scaler.unscale_(self.objs.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        gnorm = total_norm(grads)
        out = self._result(head, gnorm, sums, lr)
        self._apply(out, grads, gnorm, update)
        return out

    def _head(self, batches: list, flags: LoopFlags, where: str) -> torch.Tensor:
        """This rank's target tokens and sentences and the loop's flags, summed over ranks: (5,)
        float64 on the device (NCCL reduces device tensors only), read back with the update's result.
        The copy to the device does not wait for it (non_blocking: no host synchronisation)."""
        head = torch.tensor([sum(b.ntokens for b in batches), sum(b.nsentences for b in batches),
                             *flags.as_floats()], dtype=torch.float64).to(self.device, non_blocking=True)
        return D.all_reduce_sum(head, self.info, where)

    def _backward(self, batches: list, scale: torch.Tensor, where: str) -> torch.Tensor:
        """Accumulate d(loss_sum * scale) over the micro-batches (scale: a float64 scalar on the
        device, W / N); -> [loss sum, nll sum] (float64, on the device)."""
        loss_acc = torch.zeros((), dtype=torch.float64, device=self.device)
        nll_acc = torch.zeros((), dtype=torch.float64, device=self.device)
        weight, bias = self.objs.model.output_projection()  # (V, D), (V,) or None: the loss projects
        for i, b in enumerate(batches):
            ntokens = host_nonpad_count(b.target)
            b = b.to(self.device, non_blocking=True)
            last = i == len(batches) - 1
            sync = self.ddp.no_sync() if (self.ddp is not None and not last) else contextlib.nullcontext()
            with sync:
                with autocast(self.device, self.amp_dtype):  # the loss's matmuls too
                    with self._ddp_collective(where, op="DDP's broadcast of the gradient buckets' order"):
                        hidden = self.forward_model(b.src_tokens, b.prev_output_tokens,
                                                    features_only=True)  # (B, T, D)
                    loss, nll, _ = fused_label_smoothed_cross_entropy(hidden, weight, b.target, self.epsilon,
                                                                      bias=bias, ntokens=ntokens)
                del hidden
                with self._ddp_collective(where, runs=last):
                    self.objs.scaler.scale(loss * scale.to(loss.dtype)).backward()
            loss_acc += loss.detach().double()
            nll_acc += nll.detach().double()
        return torch.stack([loss_acc, nll_acc])

    def pass_through(self, model: torch.nn.Module, batch) -> None:
        """One forward and backward of `batch` through `model` (the eager or the compiled form of
        the step's model) as an update runs it, its gradients left in .grad for the caller to
        drop: what `--compile`'s probe (training/compiled.py) times. Nothing else changes."""
        kept = self.forward_model
        self.forward_model = model
        try:  # the gradients are dropped: their scale does not matter
            self._backward([batch], scale=torch.ones((), dtype=torch.float64), where="the --compile probe")
        finally:
            self.forward_model = kept

    def _ddp_collective(self, where: str, runs: bool = True, op: str = "DDP's gradient all-reduce"):
        """Around a DDP call that runs the collective `op` (when `runs`): the syncing backward
        all-reduces the gradients, and the forward after the first sync broadcasts rank 0's order
        of the gradient buckets. Without DDP, or where it runs none (a backward under no_sync), nothing."""
        if self.ddp is None or not runs:
            return contextlib.nullcontext()
        return D.collective(op, self.info, where)

    def _result(self, head: torch.Tensor, gnorm: torch.Tensor, sums: torch.Tensor, lr: float) -> StepResult:
        """The update's StepResult from its one read of the device (`read_back`): the counts and
        flags (head), the gradient norm and the loss sums, in one transfer."""
        values = read_back(torch.cat([head, gnorm.to(head.device, torch.float64).reshape(1), sums]))
        ntokens, nsentences, *flag_sums = values[:head.numel()]
        gnorm_value, loss_sum, nll_sum = values[head.numel():]
        return StepResult(applied=False, ntokens=int(ntokens), nsentences=int(nsentences), lr=lr,
                          flags=LoopFlags.from_sums(flag_sums), loss_sum=loss_sum, nll_sum=nll_sum,
                          gnorm=gnorm_value)

    def _apply(self, out: StepResult, grads: list[torch.Tensor], gnorm_t: torch.Tensor, update: int) -> None:
        """Skip or clip, optimizer step, EMA; fills out.applied, out.skip. The gradients are
        already unscaled (fp16) and their norm is gnorm_t (out.gnorm read back)."""
        objs, scaler = self.objs, self.objs.scaler
        finite = math.isfinite(out.gnorm) and math.isfinite(out.loss_sum)
        if finite and self.clip_norm > 0:
            coef = torch.clamp(self.clip_norm / (gnorm_t + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef)  # coef is on the grads' device: total_norm made it from them
        if scaler.is_enabled():
            scaler.step(objs.optimizer)  # skipped by the scaler itself on inf/NaN gradients
            scaler.update()
            out.applied, out.skip = finite, None if finite else "fp16_overflow"
            if not finite and scaler.get_scale() < MIN_LOSS_SCALE:
                raise TrainingStopped(
                    f"fp16 loss scale fell below {MIN_LOSS_SCALE} at update {update}: the "
                    "loss keeps overflowing or is NaN; try --precision bf16/fp32 or a lower --lr"
                )
        elif finite:
            objs.optimizer.step()
            out.applied = True
        else:
            out.skip = "nan"
        objs.optimizer.zero_grad(set_to_none=True)
        if out.applied and objs.ema is not None:
            objs.ema.update(objs.model)

    def _skip_oom(self, batches: list, flags: LoopFlags) -> StepResult:
        shapes = ", ".join(f"{b.nsentences}x{b.src_tokens.shape[1]}/{b.target.shape[1]}" for b in batches)
        if self.info.enabled:
            raise UserError(
                f"out of memory on rank {self.info.rank} (batches sentences x src/tgt length: {shapes}); with "
                "several processes a batch cannot be skipped safely: lower --max-tokens and resume"
            ) from None
        self.objs.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return StepResult(applied=False, ntokens=0, nsentences=0, lr=0.0, flags=flags, skip="oom", shapes=shapes)
