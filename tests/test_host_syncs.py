"""The training update reads back from the device once (training/step.py, "Host synchronisation").

Why: on CUDA every read of a device value (.item(), float(t), bool(t), .tolist(), nonzero, a
boolean-mask index, ...) makes the host wait until every queued kernel has run, and the device then
idles while the host prepares the next work. An update is built to read once, after the gradient
norm: the counts, the loop's flags, the norm and the loss sums in one transfer, from which the host
also makes the finite check fairseq makes. A CPU has no such waits, so the tests below count the
calls that would be one (a TorchFunctionMode sees every Python-level call on a tensor); on a CUDA
machine torch.cuda.set_sync_debug_mode("error") checks the real thing.

What the count cannot see on a CPU: a copy to the host with .to("cpu") (the step's own .to(device)
is the same call here); the CUDA test covers it. Tensor.numpy() is not counted: on a device tensor
it raises, so it only ever reads host memory (the step counts a batch's non-pad target tokens so).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from nmtkit.data.batching import collate
from nmtkit.training import step as S
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.loss import fused_label_smoothed_cross_entropy, nonpad_positions
from nmtkit.training.report import read_log
from nmtkit.training.stopping import LoopFlags

from conftest import word_mapping_data_dir

NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}

# calls that make the host wait for a CUDA device (values read back, or a result whose size
# depends on the values)
READS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.__bool__, torch.Tensor.__float__,
    torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.argwhere,
    torch.argwhere, torch.Tensor.masked_select, torch.masked_select, torch.Tensor.unique, torch.unique,
    torch.unique_consecutive, torch.Tensor.unique_consecutive, torch.Tensor.equal, torch.equal, torch.allclose,
    torch.Tensor.allclose, torch.repeat_interleave, torch.Tensor.repeat_interleave,
}
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_, torch.index_put}


def _bool_index(index) -> bool:
    """A boolean-mask index (alone or in a tuple): its result's size depends on the mask's values."""
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8) for p in parts)


class DeviceReads(TorchFunctionMode):
    """Records (by name) every call made while active that would read a device value back."""

    def __init__(self, log: list[str]):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or (func in INDEXING and len(args) > 1 and _bool_index(args[1])):
            self.log.append(func.__name__)
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """200 pairs of a word-mapping task (wK -> WK), joint dictionary, no subwords."""
    return word_mapping_data_dir(tmp_path_factory.mktemp("corpus"), 200, 12, 20, seed=1)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def config(data_dir, save_dir, **kw) -> TrainConfig:
    base = dict(data_dir=str(data_dir), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=128,
                lr_scheduler="inverse_sqrt", lr=3e-3, warmup_updates=5, log_interval=1, progress_bar=False,
                threads=1, no_epoch_checkpoints=True, no_validate=True, arch_overrides=dict(NO_DROPOUT),
                device="cpu", clip_norm=0.5, ema_decay=0.9)
    base.update(kw)
    return TrainConfig(**base)


def new_trainer(data_dir, save_dir, **kw) -> T.Trainer:
    """A Trainer built (seeded weights, optimizer, schedule) and ready to make single updates."""
    t = T.Trainer(config(data_dir, save_dir, **kw))
    t._build()
    t._make_iterators()
    t._prepare_run()
    return t


def update_groups(t: T.Trainer, n: int, k: int, pin: bool = False) -> list[list]:
    """The first n updates' micro-batches of epoch 1 (k per update), collated as the loop does."""
    plan = t.train_batches.batches(1)
    groups = []
    for u in range(n):
        group = [collate(t.train_src, t.train_tgt, idx, t.pad_multiple) for idx in plan[u * k:(u + 1) * k]]
        groups.append([b.pin_memory() for b in group] if pin else group)
    return groups


def run_updates(t: T.Trainer, groups: list[list], first: int = 1) -> tuple[list, list[str]]:
    """The updates over `groups` (numbered from `first`) -> (their StepResults, the reads they made)."""
    reads: list[str] = []
    with DeviceReads(reads):
        outs = [t.update_step(g, first + i, LoopFlags()) for i, g in enumerate(groups)]
    return outs, reads


# ----------------------------------------------------------------------------------------------
# the stand-in sees what it stands for


def test_the_stand_in_records_each_kind_of_read_once():
    """Every expression below reads a value back (or makes a tensor whose size depends on the values)
    and is recorded once; arithmetic, slicing and integer indexing are not."""
    x = torch.tensor([0.0, 1.0, 2.0])
    mask = x > 0.5
    reads: list[str] = []
    with DeviceReads(reads):
        y = (x * 2 + 1)[1:][torch.tensor([0, 1])].cumsum(0)  # nothing read
        assert reads == []
        x.sum().item()
        float(x.sum())
        bool(x.sum() > 0)
        int(x.sum())
        x.tolist()
        x[mask]
        x.nonzero()
        torch.unique(x)
        if torch.isfinite(y).all():
            pass
        math.isfinite(x.sum())
    assert reads == ["item", "__float__", "__bool__", "__int__", "tolist", "__getitem__", "nonzero", "unique",
                     "__bool__", "__float__"]


def test_the_stand_in_catches_a_boolean_mask_in_the_loss(data_dir, tmp_path, monkeypatch):
    """A loss that selects the non-pad rows with a boolean mask (as the loss did before
    nonpad_positions) is one more read per micro-batch: the count notices it."""
    real = S.fused_label_smoothed_cross_entropy

    def masked(hidden, weight, target, epsilon, bias=None, ntokens=None):
        keep = target.reshape(-1) != 0
        hidden = hidden.reshape(-1, hidden.size(-1))[keep].unsqueeze(0)  # (1, n, d)
        return real(hidden, weight, target.reshape(-1)[keep].unsqueeze(0), epsilon, bias=bias, ntokens=ntokens)

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", masked)
    t = new_trainer(data_dir, tmp_path / "m", update_freq=2)
    _, reads = run_updates(t, update_groups(t, 2, 2))
    assert sorted(reads) == sorted(["__getitem__"] * 8 + ["tolist"] * 2)  # 2 masks x 2 micro-batches x 2


# ----------------------------------------------------------------------------------------------
# the update: one read each


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_each_update_reads_the_device_once(data_dir, tmp_path, precision):
    """4 updates of 2 micro-batches each (clipping and EMA on): 4 reads, all of them the one
    transfer of read_back, and the updates are applied."""
    t = new_trainer(data_dir, tmp_path / precision, update_freq=2, precision=precision)
    outs, reads = run_updates(t, update_groups(t, 4, 2))
    assert reads == ["tolist"] * 4
    assert all(o.applied for o in outs)
    assert all(math.isfinite(o.loss_sum) and o.loss_sum > 0 and math.isfinite(o.gnorm) for o in outs)


def test_the_one_read_carries_counts_flags_norm_and_losses(data_dir, tmp_path, monkeypatch):
    """read_back gets one float64 vector: target tokens, sentences, the 3 flags, gradient norm, loss
    sum, nll sum; the StepResult is made from exactly those values."""
    seen = []
    real = S.read_back

    def spy(x):
        seen.append(x.clone())
        return real(x)

    monkeypatch.setattr(S, "read_back", spy)
    t = new_trainer(data_dir, tmp_path / "c", update_freq=2)
    group = update_groups(t, 1, 2)[0]
    out = t.update_step(group, 1, LoopFlags(time_up=True))
    assert len(seen) == 1 and seen[0].dtype == torch.float64 and seen[0].shape == (8,)
    ntokens = sum(b.ntokens for b in group)
    nsentences = sum(b.nsentences for b in group)
    assert seen[0][:5].tolist() == [ntokens, nsentences, 0.0, 1.0, 0.0]
    assert (out.ntokens, out.nsentences, out.flags) == (ntokens, nsentences, LoopFlags(time_up=True))
    assert seen[0][5:].tolist() == [out.gnorm, out.loss_sum, out.nll_sum]


def test_a_skipped_update_reads_once_and_an_fp16_overflow_also_reads_the_loss_scale(data_dir, tmp_path,
                                                                                     monkeypatch):
    """A non-finite loss skips the update with the same one read (fp32: "nan"); an fp16 overflow
    reads the shrunk loss scale too (to stop below MIN_LOSS_SCALE): 2 reads on that update only."""
    real = S.fused_label_smoothed_cross_entropy
    calls = {"n": 0}

    def inf_on_third(*args, **kwargs):
        loss, nll, n = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * math.inf if calls["n"] == 3 else loss), nll, n

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", inf_on_third)
    t = new_trainer(data_dir, tmp_path / "n")
    outs, reads = run_updates(t, update_groups(t, 4, 1))
    assert [o.skip for o in outs] == [None, None, "nan", None] and reads == ["tolist"] * 4

    calls["n"] = 0
    t = new_trainer(data_dir, tmp_path / "h", precision="fp16")
    outs, reads = run_updates(t, update_groups(t, 4, 1))
    assert [o.skip for o in outs] == [None, None, "fp16_overflow", None]
    assert reads == ["tolist"] * 3 + ["item", "tolist"]


# ----------------------------------------------------------------------------------------------
# the loop: no more reads at logging intervals (fp16: the loss scale for the log record)


def count_loop_reads(monkeypatch) -> list[str]:
    """Record the reads of the loop's per-update work: the update and what follows it (counting,
    the interval's sums, the log record when due)."""
    reads: list[str] = []
    for name in ("_train_step", "_after_step"):
        real = getattr(T.Trainer, name)

        def counted(self, *args, _real=real, **kwargs):
            with DeviceReads(reads):
                return _real(self, *args, **kwargs)

        monkeypatch.setattr(T.Trainer, name, counted)
    return reads


@pytest.mark.parametrize("precision, extra", [("fp32", []), ("fp16", ["item"])])
def test_the_loop_reads_once_per_update_and_the_log_adds_nothing_but_the_loss_scale(
        data_dir, tmp_path, monkeypatch, precision, extra):
    """6 updates, a train record every 3: 6 reads of the updates; the records are written from
    the values already read (fp16: each record also reads the loss scale)."""
    reads = count_loop_reads(monkeypatch)
    res = T.train(config(data_dir, tmp_path / precision, max_update=6, log_interval=3, precision=precision))
    assert res.update == 6
    assert reads == (["tolist"] * 3 + extra) * 2
    train = [r for r in read_log(tmp_path / precision / "train_log.jsonl") if r["type"] == "train"]
    assert [r["update"] for r in train] == [3, 6] and all(r["updates"] == 3 and r["loss"] > 0 for r in train)


# ----------------------------------------------------------------------------------------------
# the loss: the non-pad positions without a read


def test_nonpad_positions_are_those_of_the_mask_in_order():
    """Pads anywhere (not only on the right), none, or all: the positions of the non-pad entries."""
    g = torch.Generator().manual_seed(3)
    for n in (1, 7, 100):
        for pad_share in (0.0, 0.3, 1.0):
            target = torch.randint(1, 9, (n,), generator=g)
            target[torch.rand(n, generator=g) < pad_share] = 0
            want = torch.nonzero(target != 0).flatten()
            got = nonpad_positions(target, 0, int((target != 0).sum()))
            assert got.dtype == torch.long and torch.equal(got, want)
    assert torch.equal(nonpad_positions(torch.tensor([5, 2, 5, 1]), 5, 2), torch.tensor([1, 3]))


def test_the_loss_told_the_count_reads_nothing_and_equals_the_counting_one():
    """With ntokens the fused loss reads nothing back; without, it reads the count once; the loss,
    nll and the gradients of the hidden states, the weight and the bias are the same bits."""
    g = torch.Generator().manual_seed(0)
    target = torch.randint(1, 23, (3, 7), generator=g)
    target[0, 4:], target[1, 2:] = 0, 0  # right padding, as collation makes it
    n = int(np.count_nonzero(target.numpy()))
    results = []
    for told in (n, None):
        hidden = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        weight = torch.randn(23, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
        bias = torch.randn(23, generator=torch.Generator().manual_seed(4), requires_grad=True)
        reads: list[str] = []
        with DeviceReads(reads):
            loss, nll, ntok = fused_label_smoothed_cross_entropy(hidden, weight, target, 0.1, bias=bias,
                                                                 chunk_elements=23 * 4, ntokens=told)
            loss.backward()
        results.append((reads, loss, nll, ntok, hidden.grad, weight.grad, bias.grad))
    (reads_told, *told), (reads_counted, *counted) = results
    assert reads_told == [] and reads_counted == ["__int__"]
    assert told[2] == counted[2] == n == 13
    for a, b in zip(told[:2] + told[3:], counted[:2] + counted[3:]):
        assert torch.equal(a, b)
    assert torch.all(told[3][0, 4:] == 0) and torch.all(told[3][1, 2:] == 0)  # no gradient at padding


def test_the_step_counts_non_pad_target_tokens_on_the_host_copy():
    """host_nonpad_count: the non-pad entries of a host target; None for one on another device
    (the meta device stands for it here)."""
    target = torch.tensor([[4, 5, 2, 0], [7, 2, 0, 0]])
    assert S.host_nonpad_count(target) == 5
    assert S.host_nonpad_count(torch.zeros(2, 3, dtype=torch.long, device="meta")) is None


# ----------------------------------------------------------------------------------------------
# on a CUDA device: torch's own sync check


@contextlib.contextmanager
def sync_debug_mode(mode):
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch.cuda.set_sync_debug_mode checks CUDA streams; no CUDA device here")
def test_on_cuda_updates_synchronise_only_in_read_back(data_dir, tmp_path, monkeypatch):
    """Under set_sync_debug_mode("error") every synchronising CUDA call raises, except inside
    read_back (which turns the check off for its one transfer): 3 updates of 2 pinned micro-batches
    run, with one read each. The first update runs before (Adam's state is made with blocking copies)."""
    t = new_trainer(data_dir, tmp_path / "cuda", device="cuda", update_freq=2)
    groups = update_groups(t, 4, 2, pin=True)
    assert t.update_step(groups[0], 1, LoopFlags()).applied
    real, reads = S.read_back, []

    def read_back(x):
        reads.append(x.device.type)
        torch.cuda.set_sync_debug_mode(0)
        try:
            return real(x)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(S, "read_back", read_back)
    with sync_debug_mode("error"):
        outs = [t.update_step(g, u, LoopFlags()) for u, g in enumerate(groups[1:], start=2)]
    assert reads == ["cuda"] * 3 and all(o.applied for o in outs)
