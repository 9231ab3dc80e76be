"""`nmtkit train --compile` (nmtkit/training/compiled.py): inductor's cache in the user's cache
folder, and the probe before the first update that times a pass eager and compiled and then
leaves no trace, so that training goes on exactly as without it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from nmtkit.data.batching import collate
from nmtkit.training import compiled as C
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.stopping import LoopFlags

from conftest import word_mapping_data_dir


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return word_mapping_data_dir(tmp_path_factory.mktemp("corpus"), 120, 8, 20, seed=3)


def trainer(data_dir, save_dir) -> T.Trainer:
    """A built Trainer with dropout on (so that a pass draws random numbers), ready for updates."""
    cfg = TrainConfig(data_dir=str(data_dir), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=128,
                      lr=3e-3, warmup_updates=5, progress_bar=False, threads=1, no_epoch_checkpoints=True,
                      no_validate=True, device="cpu", arch_overrides={"dropout": 0.3, "attention_dropout": 0.1})
    t = T.Trainer(cfg)
    t._build()
    t._make_iterators()
    t._prepare_run()
    return t


def test_compiled_graphs_go_to_the_users_cache_folder_unless_one_is_chosen(tmp_path, monkeypatch):
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(C.CACHE_ENV, "restored-after-the-test")
    monkeypatch.delenv(C.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = tmp_path / "xdg" / "nmtkit" / "torch-compile"
    assert C.use_cache_folder() == (folder, None) and folder.is_dir()
    assert os.environ[C.CACHE_ENV] == str(folder)
    monkeypatch.setenv(C.CACHE_ENV, default_cache_dir())  # what importing torch._dynamo sets: not a choice
    assert C.use_cache_folder() == (folder, None) and os.environ[C.CACHE_ENV] == str(folder)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.cache_folder() == tmp_path / "home" / ".cache" / "nmtkit" / "torch-compile"
    monkeypatch.setenv(C.CACHE_ENV, str(tmp_path / "mine"))  # the user's choice stands, untouched
    assert C.use_cache_folder() == (tmp_path / "mine", None) and not (tmp_path / "mine").exists()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(C.CACHE_ENV, "rel")
    assert C.use_cache_folder() == (tmp_path / "rel", None)  # said as the absolute folder torch uses


def test_a_cache_folder_that_cannot_be_made_leaves_torchs_default_with_a_note(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(C.CACHE_ENV, "restored-after-the-test")
    monkeypatch.delenv(C.CACHE_ENV)
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    folder, note = C.use_cache_folder()
    assert folder == Path(default_cache_dir())
    assert note.startswith(f"--compile: cannot make the cache folder {tmp_path / 'file' / 'nmtkit' / 'torch-compile'} (")
    assert C.CACHE_ENV not in __import__("os").environ


def test_the_probes_figures_and_its_line():
    p = C.CompileProbe(eager_s=2.5, first_s=31.6, compiled_s=1.2345, folder=Path("/c"))
    assert p.cold_s == pytest.approx(30.3655) and p.speedup == pytest.approx(2.5 / 1.2345)
    assert p.line() == ("--compile: compiling took 30.4 s (cache: /c; a later run of the same model starts from it); "
                        "a forward and backward pass of the first batch takes 1234 ms compiled against 2500 ms eager: "
                        "2.03x")
    q = C.CompileProbe(eager_s=0.1234567, first_s=30.2222222, compiled_s=0.0987654, folder=Path("/c"))
    assert q.record() == {"cold_s": 30.123, "eager_pass_s": 0.12346, "compiled_pass_s": 0.09877, "speedup": 1.25,
                          "cache": "/c"}
    assert C.CompileProbe(0.1234567, 1.0, 0.0987, Path("/c")).record()["speedup"] == 1.2508
    slow = C.CompileProbe(eager_s=0.4, first_s=0.3, compiled_s=0.5, folder=Path("/c"))
    assert slow.cold_s == 0.0 and slow.line().endswith("0.80x; slower than eager here, so leave --compile off "
                                                       "on this machine")
    assert C.CompileProbe(0.5, 1.0, 0.5, Path("/c")).line().endswith("eager: 1.00x")  # as fast: no advice
    assert str(C.CompileFailed(RuntimeError("no C++ compiler"))) == "no C++ compiler"


def test_the_probe_times_each_pass_and_keeps_the_faster_of_two(monkeypatch):
    """On a clock that moves only when a pass runs: eager passes of 5 (warm-up), 3 and 4 s, compiled
    ones of 100 (compiling), 2 and 2.5 s -> eager 3, first 100, compiled 2."""
    clock = [0.0]
    monkeypatch.setattr(C.time, "perf_counter", lambda: clock[0])
    durations = {"eager": [5.0, 3.0, 4.0], "compiled": [100.0, 2.0, 2.5]}
    eager, compiled = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def run_pass(model):
        clock[0] += durations["eager" if model is eager else "compiled"].pop(0)

    report = C.probe(run_pass, eager, compiled, torch.device("cpu"), [], Path("/cache"))
    assert (report.eager_s, report.first_s, report.compiled_s, report.folder) == (3.0, 100.0, 2.0, Path("/cache"))
    assert report.cold_s == 98.0 and report.speedup == 1.5


@pytest.mark.parametrize("failing", ["eager", "compiled"])
def test_a_pass_that_fails_after_its_backward_leaves_no_gradients(failing):
    """Out of memory after the backward pass (in the optimizer's buffers, say): the error comes
    out (CompileFailed from a compiled pass, as it is from an eager one) without gradients."""
    eager, compiled = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    params = [*eager.parameters(), *compiled.parameters()]

    def run_pass(model):
        model(torch.ones(1, 2)).sum().backward()
        if model is (eager if failing == "eager" else compiled):
            raise torch.OutOfMemoryError("out of memory")

    with pytest.raises(C.CompileFailed if failing == "compiled" else torch.OutOfMemoryError):
        C.probe(run_pass, eager, compiled, torch.device("cpu"), params, Path("/cache"))
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("kind", ["cpu", "cuda", "mps"])
def test_the_probe_drains_the_accelerators_queue_and_restores_its_generator(kind, monkeypatch):
    """Timing a pass on CUDA or MPS waits for the device (its work is queued), and the probe restores
    that device's random generator besides the CPU's."""
    import contextlib

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("cuda sync", device)))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps sync",)))
    monkeypatch.setattr(C.torch.random, "fork_rng",
                        lambda devices, device_type: calls.append(("fork", devices, device_type))
                        or contextlib.nullcontext())
    device = torch.device(kind)
    C.probe(lambda model: None, torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), device, [], Path("/c"))
    assert calls[0] == ("fork", [] if kind == "cpu" else [device], kind)
    syncs = {"cpu": [], "cuda": [("cuda sync", device)], "mps": [("mps sync",)]}[kind]
    assert calls[1:] == syncs * 12  # before and after each of the six passes


class Wrapped(torch.nn.Module):
    """A stand-in for the compiled model: the same module behind another object (compiling for real
    is the last test's; the probe's contract does not depend on what the second model is)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_the_probe_leaves_training_exactly_as_without_it(data_dir, tmp_path):
    """Two trainers built alike; one probes before its first update. The probe's passes drew
    dropout masks and made gradients, yet both updates give the same loss and weights, bit for bit,
    and the random state after the probe is the one before it."""
    with_probe, without = trainer(data_dir, tmp_path / "a"), trainer(data_dir, tmp_path / "b")
    batch = collate(with_probe.train_src, with_probe.train_tgt, with_probe.train_batches.batches(1)[0])
    step = with_probe.update_step
    passes = []

    def run_pass(model):
        passes.append(model)
        step.pass_through(model, batch)
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in step.params)  # a real backward

    rng = torch.get_rng_state()
    report = C.probe(run_pass, step.forward_model, Wrapped(step.forward_model), torch.device("cpu"), step.params,
                     tmp_path)
    assert torch.equal(torch.get_rng_state(), rng)
    assert len(passes) == 6 and [type(m) for m in passes].count(Wrapped) == 3
    assert all(p.grad is None for p in step.params)
    assert report.eager_s > 0 and report.compiled_s > 0 and report.first_s > 0 and report.folder == tmp_path
    step.pass_through(step.forward_model, batch)  # a pass without fork_rng does move the generator
    assert not torch.equal(torch.get_rng_state(), rng)
    torch.set_rng_state(rng)
    for p in step.params:
        p.grad = None
    a = with_probe.update_step([batch], 1, LoopFlags())
    torch.set_rng_state(rng)  # the trainers share the generator: the other update starts where this one did
    b = without.update_step([batch], 1, LoopFlags())
    assert a.loss_sum == b.loss_sum and a.gnorm == b.gnorm
    for pa, pb in zip(with_probe.objs.model.parameters(), without.objs.model.parameters()):
        assert torch.equal(pa, pb)


def test_a_model_that_fails_to_compile_is_one_line(data_dir, tmp_path, monkeypatch):
    """A compilation error (no C++ compiler, an operator inductor cannot lower) stops training with
    one line that names it and the way out, and the probe's gradients are gone; running out of
    memory in the probe, eager or compiled, only costs its figures (the first update then meets it
    and is skipped)."""
    from nmtkit.errors import UserError

    t = trainer(data_dir, tmp_path / "f")
    batch = collate(t.train_src, t.train_tgt, t.train_batches.batches(1)[0])
    t._eager_forward = t.update_step.forward_model

    class Broken(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise RuntimeError("InductorError: CppCompileError: C++ compile error\nlong compiler output")

    t.update_step.forward_model = Broken()
    t._compile_cache, t._compile_note = tmp_path, None
    with pytest.raises(UserError) as e:
        t._probe_compile([batch])
    assert str(e.value) == ("--compile: torch.compile failed (RuntimeError: InductorError: CppCompileError: C++ compile "
                            "error); train without --compile")
    assert all(p.grad is None for p in t.update_step.params)

    class OutOfMemory(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise torch.OutOfMemoryError("Tried to allocate 2.00 GiB")  # known by its type, not its text

    t._eager_forward = t.objs.model
    t.update_step.forward_model = OutOfMemory()
    lines = []
    monkeypatch.setattr(t, "progress", type("P", (), {"line": lambda self, text, style=None: lines.append(text)})(),
                        raising=False)
    t._probe_compile([batch])
    assert lines == ["--compile: out of memory while timing the first batch; no figures"]
    assert all(p.grad is None for p in t.update_step.params)

    # out of memory in the eager passes (the compiled model never ran): the same line, no traceback
    t._eager_forward, t.update_step.forward_model = OutOfMemory(), t.objs.model
    t._probe_compile([batch])
    assert lines == ["--compile: out of memory while timing the first batch; no figures"] * 2
    assert all(p.grad is None for p in t.update_step.params)

    # any other error of an eager pass is not compiling's: raised as it is
    class Bug(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise ValueError("a bug in the model")

    t._eager_forward = Bug()
    with pytest.raises(ValueError, match="^a bug in the model$"):
        t._probe_compile([batch])
    assert all(p.grad is None for p in t.update_step.params)


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="torch.compile on CPU needs a C++ compiler")
def test_train_with_compile_probes_once_and_keeps_the_cache(data_dir, tmp_path):
    """A real `nmtkit train --compile` in a process of its own (a one-layer tiny model, three
    updates): one `compile` record and one line, the graphs in the user's cache folder (not the
    /tmp folder torch picks when it is imported first), the loss finite."""
    import os
    import subprocess
    import sys

    from nmtkit.training.report import read_log

    env = {k: v for k, v in os.environ.items() if k != C.CACHE_ENV}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), OMP_NUM_THREADS="1")
    save = tmp_path / "ckpt"
    run = subprocess.run(
        [sys.executable, "-m", "nmtkit", "train", str(data_dir), "--save-dir", str(save), "--arch", "transformer_tiny",
         "--encoder-layers", "1", "--decoder-layers", "1", "--max-tokens", "128", "--max-update", "3", "--no-validate",
         "--threads", "1", "--device", "cpu", "--no-progress-bar", "--compile", "--log-interval", "1"],
        env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    folder = tmp_path / "xdg" / "nmtkit" / "torch-compile"
    records = read_log(save / "train_log.jsonl")
    probes = [r for r in records if r["type"] == "compile"]
    assert len(probes) == 1 and probes[0]["update"] == 0
    assert probes[0]["compiled_pass_s"] > 0 and probes[0]["eager_pass_s"] > 0 and probes[0]["cold_s"] >= 0
    assert probes[0]["cache"] == str(folder)
    assert any(folder.iterdir())
    assert run.stderr.count("--compile: compiling took") == 1 and f"(cache: {folder};" in run.stderr
    trains = [r for r in records if r["type"] == "train"]
    assert len(trains) == 3 and all(isinstance(r["loss"], float) and r["loss"] == r["loss"] for r in trains)
