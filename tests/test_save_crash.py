"""A kill at any step of a checkpoint save loses nothing: the rerun of the same command ends with
exactly the checkpoints of an uninterrupted run, and removes the temporary files the kill left.

How a kill is simulated: one uninterrupted run is watched, and at every file-system step of every
save (each fsync, rename, link and unlink, half-way through writing the checkpoint's bytes, and
after the save) SAVE_DIR is copied as it is on disk at that moment: what `kill -9` there would
leave (bytes still in the process's write buffer are not on disk, so they are not copied). The
same command then reruns on each copy, and its checkpoints are compared with the uninterrupted
run's, file by file and tensor by tensor.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
import torch

from nmtkit import checkpoints as ck
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.validation import ValidResult, Validator

from conftest import word_mapping_data_dir

FS_STEPS = ("fsync", "replace", "rename", "link", "unlink", "remove")
# validation loss by update (the best is not always the newest): best at 4, then at 8
VALID_LOSS = {2: 5.0, 4: 4.0, 6: 4.5, 8: 3.5, 10: 3.8}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return word_mapping_data_dir(tmp_path_factory.mktemp("corpus"), 400, 24, 24, seed=0)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def config(data_dir, save_dir) -> TrainConfig:
    """4 updates per epoch; saves at 2, 4 (epoch), 6, 8 (epoch), 10, with pruning of both kinds."""
    return TrainConfig(data_dir=str(data_dir), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=1024,
                       lr_scheduler="inverse_sqrt", lr=3e-3, warmup_updates=5, log_interval=1, progress_bar=False,
                       threads=1, max_update=10, save_interval_updates=2, validate_interval_updates=2,
                       keep_last_updates=2, keep_last_epochs=1)


def _fake_validation(monkeypatch):
    def loss(self, model, device, autocast, epsilon):
        v = VALID_LOSS[loss.trainer_update()]
        return ValidResult(v, v, 2**v, 100)

    real_validate = T.Trainer._validate

    def validate(self):
        loss.trainer_update = lambda: self.state.update
        return real_validate(self)

    monkeypatch.setattr(Validator, "loss", loss)
    monkeypatch.setattr(T.Trainer, "_validate", validate)


class KillImages:
    """Copies of SAVE_DIR at every step of every save of a run: the disk as a kill there leaves it."""

    def __init__(self, monkeypatch, save_dir: Path, root: Path):
        self.save_dir, self.root = save_dir, root
        self.images: list[Path] = []
        self.update: int | None = None  # the update being saved, while in Trainer._save
        self.steps = 0
        self.busy = False
        self.last_state: list | None = None
        for name in FS_STEPS:
            monkeypatch.setattr(os, name, self._before(name, getattr(os, name)))
        real_torch_save, real_save = torch.save, T.Trainer._save

        def torch_save(obj, f, *a, **k):
            if self.update is None or isinstance(f, (str, os.PathLike)):
                return real_torch_save(obj, f, *a, **k)
            buf = io.BytesIO()
            real_torch_save(obj, buf, *a, **k)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            self.image("mid-write")
            f.write(data[len(data) // 2 :])

        def save(trainer, names):
            self.update, self.steps = trainer.state.update, 0
            try:
                real_save(trainer, names)
                self.image("saved")
            finally:
                self.update = None

        monkeypatch.setattr(torch, "save", torch_save)
        monkeypatch.setattr(T.Trainer, "_save", save)

    def _before(self, name, real):
        def step(*a, **k):
            if self.update is not None and not self.busy:
                self.image(f"before-{name}")
            return real(*a, **k)

        return step

    def _disk_state(self) -> list:
        """What the files are at this moment (the log aside): a step that changed nothing is skipped."""
        return sorted((p.name, os.stat(p).st_ino if p.suffix == ".pt" else p.read_bytes())
                      for p in self.save_dir.iterdir() if p.name != "train_log.jsonl")

    def image(self, label: str) -> None:
        self.busy = True
        try:
            state = self._disk_state()
            if state == self.last_state:
                return
            self.last_state = state
            self.steps += 1
            dst = self.root / f"u{self.update}-{self.steps:02d}-{label}"
            dst.mkdir(parents=True)
            for p in self.save_dir.iterdir():
                if p.suffix == ".pt":  # never written in place (only renamed over): a link is a snapshot
                    os.link(p, dst / p.name)
                else:  # temp files still being written, the log, the lock: copied
                    shutil.copyfile(p, dst / p.name)
            self.images.append(dst)
        finally:
            self.busy = False


def _same(a, b, where: str) -> None:
    """Equal checkpoint contents: tensors bit for bit, everything else equal, wall-clock times aside."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(set(a) ^ set(b)))
        for k in a:
            if k != "elapsed_s":
                _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _checkpoints(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".pt"))


def test_a_kill_at_any_step_of_a_save_loses_nothing_after_a_rerun(data_dir, tmp_path, monkeypatch):
    _fake_validation(monkeypatch)
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    with monkeypatch.context() as m:
        kills = KillImages(m, run_dir, tmp_path / "killed")
        res = T.train(config(data_dir, run_dir))
    run_dir.rename(ref_dir)
    assert res.update == 10 and res.best == 3.5
    expected = _checkpoints(ref_dir)
    assert expected == ["checkpoint2.pt", "checkpoint_2_8.pt", "checkpoint_3_10.pt", "checkpoint_best.pt",
                        "checkpoint_last.pt"]
    ref = {name: ck.load_checkpoint(ref_dir / name) for name in expected}
    assert ref["checkpoint_best.pt"]["update"] == 8 and ref["checkpoint_last.pt"]["best"]["value"] == 3.5
    # every save was caught at several steps: before and during the write, at each rename and link
    assert {int(p.name[1:].split("-")[0]) for p in kills.images} == {2, 4, 6, 8, 10}
    assert any("mid-write" in p.name for p in kills.images)
    assert len(kills.images) >= 5 * 6

    problems = []
    for image in kills.images:
        image.rename(run_dir)  # the disk after the kill, where the killed command wrote
        T.train(config(data_dir, run_dir))  # the same command, run again
        got = _checkpoints(run_dir)
        leftovers = [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
        if got != expected or leftovers:
            problems.append((image.name, "missing", sorted(set(expected) - set(got)), "extra",
                             sorted(set(got) - set(expected)), "leftovers", leftovers))
        else:
            for name in expected:
                try:
                    _same(ref[name], ck.load_checkpoint(run_dir / name), name)
                except AssertionError as e:
                    problems.append((image.name, "differs", name, str(e).splitlines()[0]))
        shutil.rmtree(run_dir)
    assert not problems, "\n".join(map(str, problems))
