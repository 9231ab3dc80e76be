"""The training update step, pinned against independent references.

Why: the trainer's update (micro-batch accumulation, loss normalization, learning rate, clipping,
loss scaling, NaN skipping, EMA) can be subtly wrong while the loss still falls. Each test here
computes what the update must be by other means: the label-smoothed loss by the textbook formula
on a float64 copy of the model and the whole update's pairs collated as ONE batch, the schedules
and Adam's first step and the EMA by hand, the logged figures from the logits the model produced.
The optimizer's gradients and learning rate are read by a global optimizer step pre-hook, i.e. at
the moment they are applied, whatever code path produced them.

Only `new_trainer` / `step` / `batches_of` know how the tests reach the trainer's internals.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from nmtkit import checkpoints as ck
from nmtkit.data.batching import collate
from nmtkit.errors import UserError
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.report import read_log

from conftest import word_mapping_data_dir

REPO = Path(__file__).resolve().parents[1]
PAD, BOS, EOS = 0, 1, 2
EPS_LS = 0.1  # transformer_tiny's label smoothing
NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """200 pairs of a word-mapping task (wK -> WK), joint dictionary, no subwords."""
    return word_mapping_data_dir(tmp_path_factory.mktemp("corpus"), 200, 12, 20, seed=1)


def config(data_dir, save_dir, **kw) -> TrainConfig:
    base = dict(data_dir=str(data_dir), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=128,
                lr_scheduler="inverse_sqrt", lr=3e-3, warmup_updates=5, log_interval=1, progress_bar=False,
                threads=1, no_epoch_checkpoints=True, no_validate=True, arch_overrides=dict(NO_DROPOUT),
                device="cpu")  # the references below are CPU float64; CUDA pads batches to multiples of 8
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ----------------------------------------------------------------------------------------------
# how the tests reach the step (the only trainer internals used)


def new_trainer(data_dir, save_dir, **kw) -> T.Trainer:
    """A Trainer built (seeded weights, optimizer, schedule) and ready to make single updates."""
    t = T.Trainer(config(data_dir, save_dir, **kw))
    t._build()
    t._make_iterators()
    t._prepare_run()
    return t


def step(t: T.Trainer, batches: list):
    """One update over `batches` (this process's micro-batches); returns the step's result."""
    return t._train_step(batches)


def batches_of(t: T.Trainer, first: int, k: int) -> list:
    """Epoch 1's batches first .. first+k-1, collated."""
    return [collate(t.train_src, t.train_tgt, idx) for idx in t.train_batches.batches(1)[first:first + k]]


# ----------------------------------------------------------------------------------------------
# independent references


def hand_loss(logits: torch.Tensor, target: torch.Tensor, eps: float):
    """(smoothed loss sum, nll sum, non-pad tokens) by the textbook formula, in logits' dtype.

    q puts 1 - eps on the gold token and eps / (V - 1) on every other one; loss_t = -sum_v q_v log p_v.
    logits: (B, T, V); target: (B, T).
    """
    vocab = logits.size(-1)
    lp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    q = torch.full_like(lp, eps / (vocab - 1))
    q.scatter_(-1, target.unsqueeze(-1), 1.0 - eps)
    per_token = -(q * lp).sum(-1)  # (B, T)
    nll = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    keep = target != PAD
    return (per_token * keep).sum(), (nll * keep).sum(), int(keep.sum())


def one_batch(t: T.Trainer, batches: list):
    """All pairs of `batches` collated as one batch (re-padded to the longest pair)."""
    return collate(t.train_src, t.train_tgt, np.concatenate([b.indices for b in batches]))


def reference(model: torch.nn.Module, whole) -> dict:
    """Gradients of (hand loss sum over all target tokens) / (non-pad target tokens), in float64."""
    ref = copy.deepcopy(model).double().train()
    ref.zero_grad(set_to_none=True)
    loss, nll, n = hand_loss(ref(whole.src_tokens, whole.prev_output_tokens), whole.target, EPS_LS)
    (loss / n).backward()
    loss, nll = loss.detach(), nll.detach()
    grads = {name: p.grad.detach().clone() for name, p in ref.named_parameters()}
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    return {"grads": grads, "loss": float(loss), "nll": float(nll), "ntokens": n, "norm": norm}


@contextlib.contextmanager
def applied_steps(model: torch.nn.Module | None = None):
    """Record, at every optimizer step (before it runs), its lr and the gradients it applies.

    Each record: {"lr": float, "grads": {name: tensor}} (names from `model`, else positions).
    """
    seen: list[dict] = []
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}

    def hook(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        seen.append({"lr": opt.param_groups[0]["lr"],
                     "grads": {names.get(id(p), i): p.grad.detach().clone() for i, p in enumerate(params)
                               if p.grad is not None}})

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def params_of(model: torch.nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def rel_err(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over all tensors together (a compared in b's dtype)."""
    assert a.keys() == b.keys()
    num = sum(float(((a[k].to(b[k].dtype) - b[k]) ** 2).sum()) for k in b)
    den = sum(float((b[k] ** 2).sum()) for k in b)
    return math.sqrt(num / den)


def global_norm(grads: dict) -> float:
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))


def noam(u: int, d_model: int, warmup: int, scale: float) -> float:
    return scale * d_model**-0.5 * min(u**-0.5, u * warmup**-1.5)


def inverse_sqrt(u: int, peak: float, warmup: int, init: float) -> float:
    return init + (peak - init) * u / warmup if u <= warmup else peak * math.sqrt(warmup / u)


# ----------------------------------------------------------------------------------------------
# accumulation and normalization


def test_accumulated_gradients_equal_the_whole_update_reference(data_dir, tmp_path):
    """--update-freq 3: the applied gradient is d(loss of all 3 batches / their target tokens)."""
    t = new_trainer(data_dir, tmp_path / "r", update_freq=3, adam_eps=1e-8)
    micro = batches_of(t, 0, 3)
    assert len({b.ntokens for b in micro}) > 1  # unequal micro-batches: per-batch means would differ
    whole = one_batch(t, micro)
    ref = reference(t.model, whole)
    before = params_of(t.model)
    with applied_steps(t.model) as seen:
        out = step(t, micro)
    assert len(seen) == 1 and out.applied
    g = seen[0]["grads"]
    assert rel_err(g, ref["grads"]) < 1e-5
    for name in ref["grads"]:
        assert torch.allclose(g[name].double(), ref["grads"][name], rtol=1e-4, atol=1e-7), name
    # the figures of the update: token and sentence counts, loss sums (nats), gradient norm, lr
    assert out.ntokens == ref["ntokens"] == sum(b.ntokens for b in micro)
    assert out.nsentences == whole.nsentences
    assert out.loss_sum == pytest.approx(ref["loss"], rel=1e-5)
    assert out.nll_sum == pytest.approx(ref["nll"], rel=1e-5)
    assert out.gnorm == pytest.approx(ref["norm"], rel=1e-5)
    lr = inverse_sqrt(1, 3e-3, 5, 0.0)
    assert out.lr == pytest.approx(lr, rel=1e-12) and seen[0]["lr"] == pytest.approx(lr, rel=1e-12)
    # Adam's first step by hand (bias-corrected m = g, v = g^2): p - lr * g / (|g| + eps)
    for name, p in t.model.named_parameters():
        gi = g[name]
        expect = before[name] - lr * gi / (gi.abs() + 1e-8)
        assert torch.allclose(p.detach(), expect, rtol=0, atol=3e-7), name  # lr = 6e-4: a wrong lr is off by far more
    assert t.state.update == 1
    # the gradients are freed after the update (set to None, not zero-filled): no memory held between updates
    assert all(p.grad is None for p in t.model.parameters())


def test_one_batch_equals_its_split_into_micro_batches(data_dir, tmp_path):
    a = new_trainer(data_dir, tmp_path / "a", update_freq=1)
    b = new_trainer(data_dir, tmp_path / "b", update_freq=3)
    for k, v in params_of(a.model).items():  # the same seeded initial weights
        assert torch.equal(v, b.model.state_dict()[k])
    micro = batches_of(b, 3, 3)
    with applied_steps(a.model) as sa:
        oa = step(a, [one_batch(a, micro)])
    with applied_steps(b.model) as sb:
        ob = step(b, micro)
    assert rel_err(sb[0]["grads"], sa[0]["grads"]) < 1e-5
    assert (oa.ntokens, oa.nsentences) == (ob.ntokens, ob.nsentences)
    assert ob.loss_sum == pytest.approx(oa.loss_sum, rel=1e-6)
    assert ob.nll_sum == pytest.approx(oa.nll_sum, rel=1e-6)
    assert ob.gnorm == pytest.approx(oa.gnorm, rel=1e-5)


def test_two_processes_accumulating_2_equal_one_accumulating_4(data_dir, tmp_path):
    """2 gloo processes x --update-freq 2 (DDP must sync on the last micro-batch only) make the
    updates of one process with --update-freq 4 (dropout off): same token counts, losses, weights
    to float tolerance. The two ranks are started directly with torchrun's variables (faster)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "nmtkit", "train", str(data_dir), "--save-dir", str(tmp_path / "ddp"),
            "--update-freq", "2", "--arch", "transformer_tiny", "--dropout", "0", "--max-tokens", "128",
            "--lr-scheduler", "inverse_sqrt", "--lr", "3e-3", "--warmup-updates", "5", "--max-update", "2",
            "--threads", "1", "--device", "cpu", "--no-progress-bar", "--log-interval", "1", "--no-validate",
            "--no-epoch-checkpoints"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [subprocess.Popen(args, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-3000:] for o in outs]
    one = T.train(config(data_dir, tmp_path / "one", update_freq=4, max_update=2))
    ddp_log = [r for r in read_log(tmp_path / "ddp" / "train_log.jsonl") if r["type"] == "train"]
    one_log = [r for r in read_log(tmp_path / "one" / "train_log.jsonl") if r["type"] == "train"]
    assert [r["tgt_tokens"] for r in ddp_log] == [r["tgt_tokens"] for r in one_log]
    assert [r["loss"] for r in ddp_log] == pytest.approx(one.losses, rel=1e-6)
    assert [r["gnorm"] for r in ddp_log] == pytest.approx([r["gnorm"] for r in one_log], rel=1e-5)
    a = ck.load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pt")["model"]
    b = ck.load_checkpoint(tmp_path / "one" / "checkpoint_last.pt")["model"]
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=0), k


# ----------------------------------------------------------------------------------------------
# learning rate


def test_learning_rate_of_each_update_follows_the_formulas_also_after_resume(data_dir, tmp_path):
    # noam: lr_scale 2, d_model 64 (transformer_tiny), warmup 3; updates 1..3, then resumed 4..5
    kw = dict(lr_scheduler="noam", lr_scale=2.0, warmup_updates=3)
    with applied_steps() as seen:
        T.train(config(data_dir, tmp_path / "n", max_update=3, **kw))
    with applied_steps() as resumed:
        T.train(config(data_dir, tmp_path / "n", max_update=5, **kw))
    assert ck.load_checkpoint(tmp_path / "n" / "checkpoint_last.pt")["arch_config"]["d_model"] == 64
    lrs = [s["lr"] for s in seen + resumed]
    assert lrs == pytest.approx([noam(u, 64, 3, 2.0) for u in range(1, 6)], rel=1e-12)
    assert lrs[0] == pytest.approx(2 * 64**-0.5 * 3**-1.5)  # u = 1: the first update is not wasted
    logged = [r["lr"] for r in read_log(tmp_path / "n" / "train_log.jsonl") if r["type"] == "train"]
    assert logged == pytest.approx(lrs, rel=1e-12)
    # inverse_sqrt: linear warmup from warmup_init_lr to the peak over 3 updates, then peak * sqrt(3/u)
    kw = dict(lr_scheduler="inverse_sqrt", lr=2e-3, warmup_init_lr=1e-4, warmup_updates=3)
    with applied_steps() as seen:
        T.train(config(data_dir, tmp_path / "i", max_update=5, **kw))
    assert [s["lr"] for s in seen] == pytest.approx([inverse_sqrt(u, 2e-3, 3, 1e-4) for u in range(1, 6)],
                                                    rel=1e-12)
    assert seen[2]["lr"] == pytest.approx(2e-3) and seen[0]["lr"] == pytest.approx(1e-4 + 1.9e-3 / 3)


# ----------------------------------------------------------------------------------------------
# clipping


@pytest.mark.parametrize("clip", [0.05, 1e6, 0.0])
def test_clip_norm_scales_the_gradient_to_min_of_norm_and_c(data_dir, tmp_path, clip):
    t = new_trainer(data_dir, tmp_path / "c", update_freq=2, clip_norm=clip)
    micro = batches_of(t, 0, 2)
    ref = reference(t.model, one_batch(t, micro))
    with applied_steps(t.model) as seen:
        out = step(t, micro)
    g = seen[0]["grads"]
    norm = ref["norm"]
    assert out.gnorm == pytest.approx(norm, rel=1e-5)  # the norm before clipping is reported
    if clip:
        assert norm > 20 * 0.05  # so that 0.05 really clips and 1e6 really does not
    target = min(norm, clip) if clip else norm
    assert global_norm(g) == pytest.approx(target, rel=1e-5)
    # same direction: g = ref * (target / norm)
    scaled = {k: v * (target / norm) for k, v in ref["grads"].items()}
    assert rel_err(g, scaled) < 1e-5


# ----------------------------------------------------------------------------------------------
# NaN / inf


@contextlib.contextmanager
def poisoned(model: torch.nn.Module, value: float = float("nan")):
    """While active, the model's logits are multiplied by `value` (NaN or inf)."""
    handle = model.register_forward_hook(lambda mod, inputs, output: output * value)
    try:
        yield
    finally:
        handle.remove()


def test_nan_update_is_not_applied_and_counted(data_dir, tmp_path):
    t = new_trainer(data_dir, tmp_path / "n", ema_decay=0.5, max_nan_skips=5)
    assert step(t, batches_of(t, 0, 1)).applied
    w1, ema1 = params_of(t.model), params_of(t.ema.model)
    opt1 = copy.deepcopy(t.optimizer.state_dict()["state"])
    for k in (1, 2):
        with poisoned(t.model), applied_steps() as seen:
            out = step(t, batches_of(t, k, 1))
        assert out.applied is False and out.skip == "nan" and not seen
        assert (t.state.update, t.state.nan_skips, t.state.consecutive_nan) == (1, k, k)
        for name, p in t.model.named_parameters():
            assert torch.equal(p, w1[name]), name
        for name, p in t.ema.model.named_parameters():
            assert torch.equal(p, ema1[name]), name
        opt = t.optimizer.state_dict()["state"]
        assert all(torch.equal(opt[i][key], opt1[i][key]) for i in opt1 for key in opt1[i])
        assert all(p.grad is None for p in t.model.parameters())  # dropped, not kept as zeros
    # an applied update resets the run of NaNs; its gradient holds nothing of the skipped ones
    micro = batches_of(t, 3, 1)
    ref = reference(t.model, one_batch(t, micro))
    with applied_steps(t.model) as seen:
        out = step(t, micro)
    assert out.applied and rel_err(seen[0]["grads"], ref["grads"]) < 1e-5
    assert (t.state.update, t.state.nan_skips, t.state.consecutive_nan) == (2, 2, 0)


@pytest.fixture
def poison_calls(monkeypatch):
    """poison_calls({i, ...}): the i-th (1-based) training forward pass returns NaN logits."""
    from nmtkit.models.transformer import Transformer

    real = Transformer.forward
    bad: set[int] = set()
    calls = {"n": 0}

    def forward(self, *a, **k):
        out = real(self, *a, **k)
        if self.training:
            calls["n"] += 1
            if calls["n"] in bad:
                out = out * float("nan")
        return out

    monkeypatch.setattr(Transformer, "forward", forward)

    def set_bad(which):
        bad.clear()
        bad.update(which)
        calls["n"] = 0

    return set_bad


def test_nan_skips_in_the_loop_advance_the_data_and_stop_after_max_nan_skips(data_dir, tmp_path, poison_calls):
    # calls 2, 4, 5 are NaN: never 3 in a row (the applied update 3 resets the count), so no stop
    poison_calls({2, 4, 5})
    res = T.train(config(data_dir, tmp_path / "m", max_update=4, max_nan_skips=3))
    assert res.reason == "max_update" and res.update == 4 and res.nan_skips == 3
    state = ck.load_checkpoint(tmp_path / "m" / "checkpoint_last.pt")
    pos = state["train"]["data_position"]
    assert (pos["epoch"], pos["batch_offset"]) == (1, 7)  # 4 applied + 3 skipped batches consumed
    assert state["train"]["counters"]["nan_skips"] == 3
    skips = [r for r in read_log(tmp_path / "m" / "train_log.jsonl") if r["type"] == "skip"]
    assert [(s["reason"], s["update"], s["nan_skips"]) for s in skips] == [("nan", 1, 1), ("nan", 2, 2),
                                                                           ("nan", 2, 3)]
    # every call NaN from now on: 3 in a row stop training with the message; checkpoint_last unchanged
    poison_calls(set(range(1, 100)))
    before = (tmp_path / "m" / "checkpoint_last.pt").read_bytes()
    with pytest.raises(UserError) as e:
        T.train(config(data_dir, tmp_path / "m", max_update=10, max_nan_skips=3))
    assert str(e.value) == ("3 updates in a row had a NaN/inf loss or gradient (--max-nan-skips 3); training "
                            "stopped at update 4 (checkpoint_last.pt was left as it was)")
    assert (tmp_path / "m" / "checkpoint_last.pt").read_bytes() == before
    end = read_log(tmp_path / "m" / "train_log.jsonl")[-1]
    assert end["type"] == "end" and end["reason"] == "failed"


# ----------------------------------------------------------------------------------------------
# EMA


def test_ema_after_each_update_is_decay_times_old_plus_rest_times_new(data_dir, tmp_path):
    d = 0.75
    t = new_trainer(data_dir, tmp_path / "e", ema_decay=d, lr=2e-2)
    for k in range(3):
        old = params_of(t.ema.model)
        assert step(t, batches_of(t, k, 1)).applied
        new = params_of(t.model)
        for name, e in t.ema.model.named_parameters():
            assert torch.allclose(e, d * old[name] + (1 - d) * new[name], rtol=0, atol=1e-6), name
        if k == 0:  # the raw weights moved away from the average (the check above is not trivial)
            assert any(not torch.allclose(new[n], params_of(t.ema.model)[n]) for n in new)


# ----------------------------------------------------------------------------------------------
# what is logged


def test_logged_loss_and_nll_are_the_reference_sums_over_tokens_in_bits(data_dir, tmp_path, monkeypatch):
    """Every training forward's logits are recorded; the log's loss/nll of each interval (2 updates
    of 2 micro-batches) is the hand loss summed over them / their target tokens / ln 2."""
    from nmtkit.models.transformer import Transformer

    real = Transformer.forward
    seen: list[tuple] = []

    def forward(self, src_tokens, prev_output_tokens, features_only=False):
        out = real(self, src_tokens, prev_output_tokens, features_only)
        if self.training:  # training asks for the final states (B, T, D) and projects them itself
            logits = self.output_logits(out) if features_only else out
            # the target is the decoder input shifted left, with </s> after the last real token
            b = prev_output_tokens.size(0)
            target = torch.cat([prev_output_tokens[:, 1:], torch.full((b, 1), PAD)], 1)  # (B, T)
            target[torch.arange(b), (prev_output_tokens != PAD).sum(1) - 1] = EOS
            seen.append(hand_loss(logits.detach().double(), target, EPS_LS))
        return out

    monkeypatch.setattr(Transformer, "forward", forward)
    res = T.train(config(data_dir, tmp_path / "l", update_freq=2, max_update=4, log_interval=2))
    train = [r for r in read_log(tmp_path / "l" / "train_log.jsonl") if r["type"] == "train"]
    assert [r["update"] for r in train] == [2, 4] and len(seen) == 8
    for i, rec in enumerate(train):
        part = seen[4 * i : 4 * i + 4]
        loss, nll, n = (sum(float(x[j]) for x in part) for j in range(3))
        assert rec["tgt_tokens"] == n and rec["updates"] == 2
        assert rec["loss"] == pytest.approx(loss / n / math.log(2), rel=1e-6)
        assert rec["nll_loss"] == pytest.approx(nll / n / math.log(2), rel=1e-6)
        assert rec["ppl"] == pytest.approx(2 ** (nll / n / math.log(2)), rel=1e-6)
    per_update = [sum(float(x[0]) for x in seen[j : j + 2]) / sum(x[2] for x in seen[j : j + 2]) / math.log(2)
                  for j in range(0, 8, 2)]
    assert res.losses == pytest.approx(per_update, rel=1e-6)


# ----------------------------------------------------------------------------------------------
# fp16 loss scaling


def test_fp16_loss_scaling_applies_unscaled_clipped_gradients_and_skips_overflow(data_dir, tmp_path):
    try:
        t = new_trainer(data_dir, tmp_path / "h", precision="fp16", update_freq=2, clip_norm=0.05)
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
    except (RuntimeError, UserError) as e:
        pytest.skip(f"fp16 autocast with loss scaling cannot run on this CPU: {e}")
    assert t.scaler.is_enabled() and t.scaler.get_scale() == 2.0**16
    micro = batches_of(t, 0, 2)
    ref = reference(t.model, one_batch(t, micro))
    dtypes = []
    ffn = t.model.decoder_layers[-1].ffn  # the decoder's last matmul before the loss's own
    hook = ffn.register_forward_hook(lambda mod, inputs, output: dtypes.append(output.dtype))
    with applied_steps(t.model) as seen:
        out = step(t, micro)
    hook.remove()
    assert out.applied and out.skip is None
    assert dtypes == [torch.float16, torch.float16]  # the forward ran in fp16 (CPU autocast's default is bf16)
    # the scale (2^16) is divided out before the norm, the clip and the step (fp16 matmuls: 2% here)
    assert out.gnorm == pytest.approx(ref["norm"], rel=2e-2)
    assert global_norm(seen[0]["grads"]) == pytest.approx(0.05, rel=1e-5)
    scaled = {k: v * (0.05 / ref["norm"]) for k, v in ref["grads"].items()}
    assert rel_err(seen[0]["grads"], scaled) < 5e-2
    # an overflow: not applied, not a NaN skip, the scale halves
    w = params_of(t.model)
    with poisoned(t.model, float("inf")):  # (a fused Adam is still called: it skips the step itself)
        out = step(t, batches_of(t, 2, 2))
    assert not out.applied and out.skip == "fp16_overflow"
    assert (t.state.update, t.state.overflow_skips, t.state.nan_skips) == (1, 1, 0)
    assert t.scaler.get_scale() == 2.0**15
    assert all(torch.equal(p, w[n]) for n, p in t.model.named_parameters())
    # the scale may halve down to MIN_LOSS_SCALE = 2^-14 (still a skip); below it training stops
    from nmtkit.training.step import MIN_LOSS_SCALE
    from nmtkit.training.stopping import TrainingStopped

    assert MIN_LOSS_SCALE == 2.0**-14
    t.scaler.update(2.0**-13)
    with poisoned(t.model, float("inf")):
        out = step(t, batches_of(t, 4, 2))
        assert not out.applied and out.skip == "fp16_overflow" and t.scaler.get_scale() == 2.0**-14
        with pytest.raises(TrainingStopped) as e:
            step(t, batches_of(t, 6, 2))
    assert t.scaler.get_scale() == 2.0**-15
    assert str(e.value) == ("fp16 loss scale fell below 6.103515625e-05 at update 2: the loss keeps overflowing or "
                            "is NaN; try --precision bf16/fp32 or a lower --lr")


# ----------------------------------------------------------------------------------------------
# the step's flags and its out-of-memory path (training/step.py), against values written out


@pytest.mark.parametrize("flags", [(True, False, False), (False, True, False), (False, False, True),
                                   (True, True, True)])
def test_flags_pass_through_the_step_in_order(data_dir, tmp_path, flags):
    """The step's all-reduce carries (signal, time_up, timed_save); one process gets back its own."""
    from nmtkit.training.stopping import LoopFlags

    t = new_trainer(data_dir, tmp_path / "s")
    out = t.update_step(batches_of(t, 0, 1), 1, LoopFlags(*flags))
    assert (out.flags.signal, out.flags.time_up, out.flags.timed_save) == flags
    assert out.applied is True


def test_a_one_token_update_is_normalized_by_one_token(data_dir, tmp_path):
    """ntokens = 1: the applied gradient is d(loss of that one token) / 1 (no floor above 1)."""
    import dataclasses

    from nmtkit.training.stopping import LoopFlags

    t = new_trainer(data_dir, tmp_path / "s", clip_norm=0.0)
    b = batches_of(t, 0, 1)[0]
    target = b.target[:1].clone()  # one sentence, one target token: the rest becomes padding
    target[0, 1:] = PAD
    one = dataclasses.replace(b, src_tokens=b.src_tokens[:1], prev_output_tokens=b.prev_output_tokens[:1],
                              target=target, ntokens=1, indices=b.indices[:1])
    ref = reference(t.model, one)
    assert ref["ntokens"] == 1
    with applied_steps(t.model) as seen:
        out = t.update_step([one], 1, LoopFlags())
    assert out.ntokens == 1 and out.applied
    assert rel_err(seen[0]["grads"], ref["grads"]) < 1e-4


def test_is_oom_recognizes_out_of_memory_errors_only():
    from nmtkit.training.step import is_oom

    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried... Out Of Memory"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("bad value"))


def test_out_of_memory_skips_the_update_and_clears_gradients(data_dir, tmp_path, monkeypatch):
    """An OOM in the 2nd micro-batch (after the 1st's backward): no update, gradients dropped,
    weights and Adam state untouched, the batch shapes named, the flags kept; other errors re-raised."""
    from nmtkit.training.stopping import LoopFlags

    t = new_trainer(data_dir, tmp_path / "s")
    bs = batches_of(t, 0, 2)
    before = [p.detach().clone() for p in t.update_step.params]
    real = t.update_step.forward_model
    calls = []

    def forward(src, prev, **k):
        calls.append(src.shape)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(src, prev, **k)

    monkeypatch.setattr(t.update_step, "forward_model", forward)
    out = t.update_step(bs, 1, LoopFlags(time_up=True))
    assert out.applied is False and out.skip == "oom"
    assert (out.ntokens, out.nsentences, out.lr) == (0, 0, 0.0)
    assert out.flags == LoopFlags(time_up=True)
    want = ", ".join(f"{b.nsentences}x{b.src_tokens.shape[1]}/{b.target.shape[1]}" for b in bs)
    assert out.shapes == want
    assert all(p.grad is None for p in t.update_step.params)
    assert all(torch.equal(p, q) for p, q in zip(t.update_step.params, before))
    assert not t.optimizer.state  # Adam never stepped

    calls.clear()

    def broken(src, prev, **k):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(t.update_step, "forward_model", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        t.update_step(bs, 1, LoopFlags())


def test_out_of_memory_with_several_processes_is_a_user_error(data_dir, tmp_path):
    """With DDP a skipped batch would desynchronize the ranks: one line naming rank and shapes."""
    from nmtkit.training import distributed as D
    from nmtkit.training.stopping import LoopFlags

    t = new_trainer(data_dir, tmp_path / "s")
    bs = batches_of(t, 0, 2)
    t.update_step.info = D.DistInfo(rank=1, world_size=2, local_rank=1)
    shapes = ", ".join(f"{b.nsentences}x{b.src_tokens.shape[1]}/{b.target.shape[1]}" for b in bs)
    with pytest.raises(UserError) as e:
        t.update_step._skip_oom(bs, LoopFlags())
    assert str(e.value) == (f"out of memory on rank 1 (batches sentences x src/tgt length: {shapes}); with several "
                            "processes a batch cannot be skipped safely: lower --max-tokens and resume")


# ----------------------------------------------------------------------------------------------
# details of the step that the whole-update references above cannot see (mutants they let survive)


def test_is_oom_recognizes_the_error_type_without_the_message_on_every_torch(monkeypatch):
    """The type decides, not only the text: an OutOfMemoryError whose message does not say "out of
    memory" is one. Older torch (< 2.5) has it only as torch.cuda.OutOfMemoryError, a torch that drops
    that alias only as torch.OutOfMemoryError; with neither, the message still decides."""
    from nmtkit.training.step import is_oom

    class OOM(RuntimeError):  # stands for the type of a torch build without torch.OutOfMemoryError
        pass

    terse = "Tried to allocate 9.00 GiB"
    assert is_oom(torch.OutOfMemoryError(terse))
    assert not is_oom(RuntimeError(terse)) and not is_oom(MemoryError(terse))
    with monkeypatch.context() as m:  # torch < 2.5: only the CUDA name
        m.delattr(torch, "OutOfMemoryError")
        m.setattr(torch.cuda, "OutOfMemoryError", OOM)
        assert is_oom(OOM(terse)) and not is_oom(RuntimeError(terse))
    with monkeypatch.context() as m:  # no CUDA alias: the top-level name
        m.setattr(torch, "OutOfMemoryError", OOM)
        m.delattr(torch.cuda, "OutOfMemoryError")
        assert is_oom(OOM(terse)) and not is_oom(RuntimeError(terse))
    with monkeypatch.context() as m:  # neither: the message alone
        m.delattr(torch, "OutOfMemoryError")
        m.delattr(torch.cuda, "OutOfMemoryError")
        assert is_oom(RuntimeError("CUDA out of memory")) and not is_oom(OOM(terse))
        assert not is_oom(RuntimeError("shape mismatch"))


def test_out_of_memory_empties_the_cuda_cache_on_cuda_only(data_dir, tmp_path, monkeypatch):
    """After a skipped OOM batch on CUDA the cached blocks are given back (so the next batch can
    allocate them); a CPU run makes no CUDA call. torch.cuda.empty_cache is replaced by a recorder."""
    from nmtkit.training.stopping import LoopFlags

    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    t = new_trainer(data_dir, tmp_path / "s")
    bs = batches_of(t, 0, 1)
    assert t.update_step._skip_oom(bs, LoopFlags()).skip == "oom" and emptied == []
    t.update_step.device = torch.device("cuda", 0)
    assert t.update_step._skip_oom(bs, LoopFlags()).skip == "oom" and emptied == [1]


def test_total_norm_of_no_gradients_is_zero_and_mixed_dtypes_are_summed_in_float32():
    from nmtkit.training.step import total_norm

    zero = total_norm([])
    assert zero.shape == () and float(zero) == 0.0
    grads = [torch.tensor([3.0, 4.0], dtype=torch.float16), torch.tensor([[12.0]]), torch.tensor([84.0, 0.0])]
    assert float(total_norm(grads)) == 85.0  # sqrt(9 + 16 + 144 + 7056)


def test_autocast_runs_in_the_precision_asked_for():
    """bf16/fp16 autocast on the step's device in the dtype asked for (CPU autocast's own default
    is bf16, so fp16 must be passed on); fp32 is no autocast at all."""
    from nmtkit.training.step import autocast

    a = torch.ones(2, 2)
    with autocast(torch.device("cpu"), None):
        assert (a @ a).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    try:
        with autocast(torch.device("cpu"), torch.float16):
            out = a @ a
    except RuntimeError as e:
        pytest.skip(f"fp16 autocast cannot run on this CPU: {e}")
    assert out.dtype == torch.float16


def test_loss_sums_are_accumulated_in_float64(data_dir, tmp_path, monkeypatch):
    """The reported loss/nll sums are the float64 sums of the micro-batches' float32 sums: here
    a float32 running sum would differ (checked), so the result shows the accumulator's dtype."""
    from nmtkit.training import step as S

    real = S.fused_label_smoothed_cross_entropy
    seen = []

    def spy(*args, **kwargs):
        loss, nll, n = real(*args, **kwargs)
        seen.append((float(loss.detach()), float(nll.detach())))
        return loss, nll, n

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", spy)
    t = new_trainer(data_dir, tmp_path / "f", update_freq=5)
    out = step(t, batches_of(t, 0, 5))
    assert len(seen) == 5 and out.applied

    def f32_sum(xs):
        acc = torch.zeros((), dtype=torch.float32)
        for x in xs:
            acc += x
        return float(acc)

    for j, got in ((0, out.loss_sum), (1, out.nll_sum)):
        exact = sum(s[j] for s in seen)  # Python floats: float64, in the step's order
        assert f32_sum(s[j] for s in seen) != exact  # a float32 accumulator would be seen
        assert got == exact


def test_a_finite_gradient_with_a_non_finite_loss_is_still_skipped(data_dir, tmp_path, monkeypatch):
    """Either one non-finite skips the update: here the loss is +inf through a constant (its
    gradient, and so the norm, stay finite), and nothing is applied."""
    from nmtkit.training import step as S

    real = S.fused_label_smoothed_cross_entropy

    def inf_loss(*args, **kwargs):
        loss, nll, n = real(*args, **kwargs)
        return loss + float("inf"), nll, n

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", inf_loss)
    t = new_trainer(data_dir, tmp_path / "i")
    w = params_of(t.model)
    with applied_steps() as seen:
        out = step(t, batches_of(t, 0, 1))
    assert out.loss_sum == math.inf and math.isfinite(out.gnorm) and out.gnorm > 0
    assert not out.applied and out.skip == "nan" and not seen
    assert all(torch.equal(p, w[n]) for n, p in t.model.named_parameters())


def test_clipping_a_tiny_gradient_matches_torch_clip_grad_norm(data_dir, tmp_path):
    """The clip coefficient is torch's clip_grad_norm_'s, c / (norm + 1e-6): visible when the norm
    is small (logits scaled by 1e-4 make it ~1e-4), where the 1e-6 is a percent of it."""
    t = new_trainer(data_dir, tmp_path / "t", update_freq=2)
    micro = batches_of(t, 0, 2)
    with poisoned(t.model, 1e-4):
        ref = reference(t.model, one_batch(t, micro))
        assert 1e-6 < ref["norm"] < 1e-3
        t.update_step.clip_norm = clip = ref["norm"] / 2
        with applied_steps(t.model) as seen:
            out = step(t, micro)
    holders = {k: torch.nn.Parameter(torch.zeros_like(v)) for k, v in ref["grads"].items()}
    for k, p in holders.items():
        p.grad = ref["grads"][k].clone()
    torch.nn.utils.clip_grad_norm_(list(holders.values()), clip)
    expect = {k: p.grad for k, p in holders.items()}
    assert out.applied and out.gnorm == pytest.approx(ref["norm"], rel=1e-5)
    assert global_norm(seen[0]["grads"]) == pytest.approx(global_norm(expect), rel=1e-4)
    assert global_norm(expect) < clip * (1 - 1e-3)  # the 1e-6 is visible at this size
    assert rel_err(seen[0]["grads"], expect) < 1e-4


def test_ddp_syncs_gradients_on_the_last_micro_batch_only(data_dir, tmp_path):
    """With DDP (gloo, one process, in this process) the gradient all-reduce runs once per update,
    during the last micro-batch's backward (no_sync before it); the applied gradient is the whole
    update's. A communication hook records which backward each bucket's all-reduce came from."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from nmtkit.training.step import UpdateStep
    from nmtkit.training.stopping import LoopFlags

    t = new_trainer(data_dir, tmp_path / "d", update_freq=3, clip_norm=0.0)
    micro = batches_of(t, 0, 3)
    ref = reference(t.model, one_batch(t, micro))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DDP(t.model)
        forwards, reduced = [], []
        t.model.register_forward_pre_hook(lambda mod, args: forwards.append(1))

        def hook(state, bucket):
            reduced.append(len(forwards))  # the micro-batch whose backward is running
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, hook)
        s = UpdateStep(t.objs, ddp, ddp, device=t.device, info=t.info, amp_dtype=None, epsilon=EPS_LS,
                       clip_norm=0.0)
        with applied_steps(t.model) as seen:
            out = s(micro, 1, LoopFlags())
    finally:
        dist.destroy_process_group()
    assert out.applied and len(forwards) == 3
    assert reduced and set(reduced) == {3}
    assert rel_err(seen[0]["grads"], ref["grads"]) < 1e-5


@contextlib.contextmanager
def ddp_step_of_rank_1_of_2(t: T.Trainer, comm_hook=None):
    """An UpdateStep under real DDP (gloo, a one-process group in this process) that believes it is
    rank 1 of 2: its errors are read as a distributed run's, without starting a second process."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from nmtkit.training import distributed as D
    from nmtkit.training.step import UpdateStep

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DDP(t.model)
        if comm_hook is not None:
            ddp.register_comm_hook(None, comm_hook)
        yield UpdateStep(t.objs, ddp, ddp, device=t.device, info=D.DistInfo(rank=1, world_size=2, local_rank=1),
                         amp_dtype=None, epsilon=EPS_LS, clip_norm=0.0)
    finally:
        dist.destroy_process_group()


def test_an_error_outside_a_collective_keeps_its_own_message_in_a_distributed_run(data_dir, tmp_path,
                                                                                  monkeypatch):
    """Only the calls that run a collective read a RuntimeError as a collective's failure: a shape
    error in the model's forward, and an error of the loss whose text mentions a timeout, reach the
    caller as they were, not as a rank that stopped answering."""
    from nmtkit.training import distributed as D
    from nmtkit.training import step as S
    from nmtkit.training.stopping import LoopFlags

    t = new_trainer(data_dir, tmp_path / "e", update_freq=2)
    micro = batches_of(t, 0, 2)

    def bad_shape(src, prev, **k):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (6x32 and 64x32)")

    monkeypatch.setattr(t.model, "forward", bad_shape)
    with ddp_step_of_rank_1_of_2(t) as s, pytest.raises(RuntimeError, match="shapes cannot be multiplied") as e:
        s(micro, 3, LoopFlags())
    assert not isinstance(e.value, D.CollectiveFailed)
    monkeypatch.undo()

    def slow_loss(*args, **kwargs):
        raise RuntimeError("Timed out waiting for the loss kernel")

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", slow_loss)
    with ddp_step_of_rank_1_of_2(t) as s, pytest.raises(RuntimeError, match="Timed out waiting for the loss") as e:
        s(micro, 3, LoopFlags())
    assert not isinstance(e.value, D.CollectiveFailed)


def test_a_lost_peer_in_ddps_backward_is_a_collective_failure_naming_the_update(data_dir, tmp_path):
    """DDP's gradient all-reduce runs in the last micro-batch's backward: a peer lost there is one
    line naming DDP's all-reduce, the update and the other rank."""
    from nmtkit.training import distributed as D
    from nmtkit.training.stopping import LoopFlags

    def peer_gone(state, bucket):
        raise RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:29500")

    t = new_trainer(data_dir, tmp_path / "p", update_freq=2)
    with ddp_step_of_rank_1_of_2(t, peer_gone) as s, pytest.raises(D.CollectiveFailed) as e:
        s(batches_of(t, 0, 2), 7, LoopFlags())
    assert str(e.value) == ("rank 1 of 2: DDP's gradient all-reduce (update 7) failed because rank 0 exited or lost "
                            "its connection (see that rank's own message)")


def test_a_lost_peer_in_ddps_forward_is_a_collective_failure_naming_the_update(data_dir, tmp_path, monkeypatch):
    """DDP's forward runs a collective too (after the first sync it broadcasts rank 0's order of
    the gradient buckets): a peer lost there is one line naming that broadcast and the update."""
    from nmtkit.training import distributed as D
    from nmtkit.training.stopping import LoopFlags

    def peer_gone(*args, **kwargs):
        raise RuntimeError("[gloo/pair.cc:553] Connection reset by peer [127.0.0.1]:29500")

    t = new_trainer(data_dir, tmp_path / "f", update_freq=2)
    with ddp_step_of_rank_1_of_2(t) as s, pytest.raises(D.CollectiveFailed) as e:
        monkeypatch.setattr(s.forward_model, "forward", peer_gone)
        s(batches_of(t, 0, 2), 5, LoopFlags())
    assert str(e.value) == ("rank 1 of 2: DDP's broadcast of the gradient buckets' order (update 5) failed because "
                            "rank 0 exited or lost its connection (see that rank's own message)")


def test_an_error_in_a_backward_under_no_sync_keeps_its_own_message(data_dir, tmp_path, monkeypatch):
    """Before the last micro-batch DDP's backward runs under no_sync, with no collective: an error
    there whose text mentions a timeout is the error it is, not a rank that stopped answering;
    the same error in the last (syncing) backward is read as the all-reduce's."""
    from nmtkit.training import distributed as D
    from nmtkit.training import step as S
    from nmtkit.training.stopping import LoopFlags

    class FailsBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("Timed out waiting for the gradient kernel")

    real = S.fused_label_smoothed_cross_entropy

    def loss_failing_backward_at(n):
        calls = []

        def loss(*args, **kwargs):
            out = real(*args, **kwargs)
            calls.append(1)
            return (FailsBackward.apply(out[0]), *out[1:]) if len(calls) == n else out
        return loss

    t = new_trainer(data_dir, tmp_path / "n", update_freq=2)
    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", loss_failing_backward_at(1))
    with ddp_step_of_rank_1_of_2(t) as s, pytest.raises(RuntimeError, match="Timed out waiting for the gradient") as e:
        s(batches_of(t, 0, 2), 4, LoopFlags())
    assert not isinstance(e.value, D.CollectiveFailed)
    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", loss_failing_backward_at(2))
    with ddp_step_of_rank_1_of_2(t) as s, pytest.raises(D.CollectiveFailed, match=r"\(update 4\)"):
        s(batches_of(t, 0, 2), 4, LoopFlags())


def test_a_lost_peer_during_the_compile_probe_names_the_probe(data_dir, tmp_path):
    """--compile's probe runs a forward and backward before the first update (UpdateStep.pass_through);
    under DDP its all-reduce can meet a lost peer too, and the line says it happened there."""
    from nmtkit.training import distributed as D

    def peer_gone(state, bucket):
        raise RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:29500")

    t = new_trainer(data_dir, tmp_path / "q")
    with ddp_step_of_rank_1_of_2(t, peer_gone) as s, pytest.raises(D.CollectiveFailed) as e:
        s.pass_through(s.forward_model, batches_of(t, 0, 1)[0])
    assert str(e.value) == ("rank 1 of 2: DDP's gradient all-reduce (the --compile probe) failed because rank 0 exited "
                            "or lost its connection (see that rank's own message)")


def test_token_counts_beyond_float32_precision_are_exact(data_dir, tmp_path):
    """The counts travel in a float64 tensor (for the all-reduce): 2^24 + 1 tokens, which float32
    would round to 2^24, are reported exactly."""
    import dataclasses

    from nmtkit.training.stopping import LoopFlags

    t = new_trainer(data_dir, tmp_path / "b")
    b = batches_of(t, 0, 1)[0]
    big = dataclasses.replace(b, ntokens=2**24 + 1)
    assert float(torch.tensor(2**24 + 1, dtype=torch.float32)) == 2**24  # what float32 would make of it
    out = t.update_step([big], 1, LoopFlags())
    assert out.ntokens == 2**24 + 1 and out.nsentences == b.nsentences


def test_every_collective_of_an_update_names_it(data_dir, tmp_path, monkeypatch):
    """A collective that fails says which update it was in: the step passes "update N" to each of
    its all-reduces (the counts, then the loss sums) and to DDP's gradient all-reduce, which runs
    only where DDP syncs (never without DDP, not in a no_sync backward)."""
    from nmtkit.training import step as S

    t = new_trainer(data_dir, tmp_path / "s", update_freq=2)
    seen = []
    real = S.D.all_reduce_sum
    monkeypatch.setattr(S.D, "all_reduce_sum", lambda x, info, where="": seen.append(where) or real(x, info, where))
    step(t, batches_of(t, 0, 2))
    step(t, batches_of(t, 2, 2))
    assert seen == ["update 1", "update 1", "update 2", "update 2"]
    us = t.update_step
    assert isinstance(us._ddp_collective("update 3"), contextlib.nullcontext)  # no DDP: nothing to catch
    opened = []
    monkeypatch.setattr(S.D, "collective", lambda what, info, where: opened.append((what, where)) or contextlib.nullcontext())
    monkeypatch.setattr(us, "ddp", object())  # DDP present
    us._ddp_collective("update 3")
    us._ddp_collective("update 3", runs=False)  # a no_sync backward runs no collective
    assert opened == [("DDP's gradient all-reduce", "update 3")]
