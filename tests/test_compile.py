"""`nmtkit train --compile` (nmtkit/training/compiled.py): inductor's cache in the user's cache
folder, and the probe before the first update that times a pass eager and compiled and then
leaves no trace, so that training goes on exactly as without it."""

from __future__ import annotations

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
    monkeypatch.delenv(C.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert C.use_cache_folder() == tmp_path / "xdg" / "nmtkit" / "torch-compile"
    assert (tmp_path / "xdg" / "nmtkit" / "torch-compile").is_dir()
    import os

    assert os.environ[C.CACHE_ENV] == str(tmp_path / "xdg" / "nmtkit" / "torch-compile")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.cache_folder() == tmp_path / "home" / ".cache" / "nmtkit" / "torch-compile"
    monkeypatch.setenv(C.CACHE_ENV, str(tmp_path / "mine"))  # the user's choice stands, untouched
    assert C.use_cache_folder() == tmp_path / "mine" and not (tmp_path / "mine").exists()


def test_the_probes_figures_and_its_line():
    p = C.CompileProbe(eager_s=0.5, first_s=30.4, compiled_s=0.4, folder=Path("/c"))
    assert p.cold_s == pytest.approx(30.0) and p.speedup == pytest.approx(1.25)
    assert p.line() == ("--compile: compiling took 30.0 s (cache: /c; a later run of the same model starts from it); "
                        "a forward and backward pass of the first batch takes 400 ms compiled against 500 ms eager: "
                        "1.25x")
    assert p.record() == {"cold_s": 30.0, "eager_pass_s": 0.5, "compiled_pass_s": 0.4, "speedup": 1.25,
                          "cache": "/c"}
    slow = C.CompileProbe(eager_s=0.4, first_s=0.3, compiled_s=0.5, folder=Path("/c"))
    assert slow.cold_s == 0.0 and slow.line().endswith("0.80x; slower than eager here, so leave --compile off "
                                                       "on this machine")


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
    assert report.eager_s > 0 and report.compiled_s > 0 and report.first_s > 0
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
