"""A full disk: `train`, `preprocess`, `generate` and `average-checkpoints` say "no space left on
device while writing PATH" (exit 2, no traceback) and keep what was there before.

The full disk is simulated where the kernel reports it: every write to a file under a chosen
folder raises OSError(ENOSPC), whichever way the file was opened (open, io.open, os.fdopen). The
output to standard output is written to /dev/full, where the kernel itself answers ENOSPC.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit import checkpoints as ck

from conftest import word_mapping_data_dir

REPO = Path(__file__).resolve().parents[1]


class _FullFile:
    """A file object whose writes fail as on a full disk; everything else is the real file's."""

    def __init__(self, fh):
        self._fh = fh

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def writelines(self, lines):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __iter__(self):
        return iter(self._fh)


def fill_disk(monkeypatch, root: Path, only: str = "") -> None:
    """From now on, writing to a file under `root` (whose name contains `only`) raises ENOSPC."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell which file a descriptor is")
    root = str(root.resolve())
    real_open, real_fdopen = builtins.open, os.fdopen

    def full(path, mode) -> bool:
        path = os.path.abspath(str(path))
        return (path.startswith(root + os.sep) and only in os.path.basename(path)
                and any(c in mode for c in "wax+"))

    def open_(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        return _FullFile(fh) if isinstance(file, (str, os.PathLike)) and full(file, mode) else fh

    def fdopen(fd, mode="r", *a, **k):
        fh = real_fdopen(fd, mode, *a, **k)
        return _FullFile(fh) if full(os.readlink(f"/proc/self/fd/{fd}"), mode) else fh

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr(os, "fdopen", fdopen)


def snapshot(d: Path) -> dict:
    """Every file under `d` (hidden ones too) with its sha256: what must survive the full disk."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != ".nmtkit-train.lock"}


def error_line(r) -> str:
    assert r.code == 2, r
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert "Traceback" not in r.err and "internal error" not in r.err, r
    return lines[-1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    return root, word_mapping_data_dir(root, 60, 6, 12, seed=2)


TRAIN = ("--arch", "transformer_tiny", "--max-tokens", "256", "--threads", "1", "--no-progress-bar",
         "--no-validate", "--no-epoch-checkpoints")


def test_train_keeps_its_checkpoint_and_names_the_file(corpus, tmp_path, run_cli, monkeypatch):
    _, data = corpus
    sd = tmp_path / "ckpt"
    assert run_cli("train", data, "--save-dir", sd, "--max-update", "1", *TRAIN).code == 0
    before = snapshot(sd)
    with monkeypatch.context() as m:
        fill_disk(m, sd, only=".pt")
        r = run_cli("train", data, "--save-dir", sd, "--max-update", "2", *TRAIN)
    assert error_line(r) == f"nmtkit: error: no space left on device while writing {sd / 'checkpoint_last.pt'}"
    after = snapshot(sd)
    assert {k: v for k, v in after.items() if k != "train_log.jsonl"} == {
        k: v for k, v in before.items() if k != "train_log.jsonl"}  # no temp file, the old checkpoint as it was
    assert ck.load_checkpoint(sd / "checkpoint_last.pt")["update"] == 1
    with monkeypatch.context() as m:
        fill_disk(m, sd, only="train_log")
        r = run_cli("train", data, "--save-dir", sd, "--max-update", "2", *TRAIN)
    assert error_line(r) == f"nmtkit: error: no space left on device while writing {sd / 'train_log.jsonl'}"
    assert snapshot(sd) == after
    # with room again, the run goes on from the checkpoint that was kept
    assert run_cli("train", data, "--save-dir", sd, "--max-update", "2", *TRAIN).code == 0
    assert ck.load_checkpoint(sd / "checkpoint_last.pt")["update"] == 2


def test_preprocess_keeps_the_old_dataset(corpus, tmp_path, run_cli, monkeypatch):
    raw, _ = corpus
    dest = tmp_path / "bin"
    args = ("preprocess", "--source-lang", "de", "--target-lang", "en", "--trainpref", raw / "train",
            "--validpref", raw / "valid", "--bpe", "none", "--destdir", dest)
    assert run_cli(*args).code == 0
    before = snapshot(tmp_path)
    for only in (".bin", "dict.", "manifest"):  # shards (plain writes), dictionaries and manifest (atomic)
        with monkeypatch.context() as m:
            fill_disk(m, tmp_path, only=only)
            r = run_cli(*args, "--nwordssrc", "10", "--force")
        assert error_line(r) == f"nmtkit: error: no space left on device while writing {dest}", (only, r)
        assert snapshot(tmp_path) == before, only  # the old dataset, and no temporary folder left


def test_average_checkpoints_keeps_the_old_output(tmp_path, run_cli, monkeypatch):
    for i, v in enumerate((1.0, 3.0)):
        ck.save_checkpoint({"arch": "t", "arch_config": {}, "model": {"w": torch.tensor([v])}}, tmp_path / f"{i}.pt")
    out = tmp_path / "avg.pt"
    assert run_cli("average-checkpoints", tmp_path / "0.pt", "--output", out).code == 0
    before = snapshot(tmp_path)
    with monkeypatch.context() as m:
        fill_disk(m, tmp_path)
        r = run_cli("average-checkpoints", tmp_path / "0.pt", tmp_path / "1.pt", "--output", out)
    assert error_line(r) == f"nmtkit: error: no space left on device while writing {out}"
    assert snapshot(tmp_path) == before
    assert ck.load_checkpoint(out)["model"]["w"].tolist() == [1.0]


def test_a_full_disk_nobody_named_still_says_which_file(tmp_path, run_cli, monkeypatch):
    def average(paths):
        raise OSError(errno.ENOSPC, "No space left on device", "/scratch/x.bin")

    monkeypatch.setattr(ck, "average_checkpoints", average)
    ck.save_checkpoint({"arch": "t", "arch_config": {}, "model": {"w": torch.tensor([1.0])}}, tmp_path / "a.pt")
    r = run_cli("average-checkpoints", tmp_path / "a.pt", "--output", tmp_path / "avg.pt")
    assert error_line(r) == "nmtkit: error: no space left on device while writing /scratch/x.bin"


@pytest.fixture(scope="module")
def model(corpus, tmp_path_factory):
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer

    _, data = corpus
    src, tgt = load_dictionaries(data)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    p = tmp_path_factory.mktemp("model") / "m.pt"
    ck.save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": Transformer(cfg, len(src), len(tgt)).state_dict(),
                        "dictionaries": {"src_sha256": src.sha256, "tgt_sha256": tgt.sha256}}, p)
    return p


GENERATE = ("--gen-subset", "valid", "--beam", "1", "--max-len-b", "3", "--quiet", "--threads", "1")


def test_generate_keeps_the_old_output(corpus, model, tmp_path, run_cli, monkeypatch):
    _, data = corpus
    out = tmp_path / "hyp.txt"
    out.write_text("an earlier translation\n")
    with monkeypatch.context() as m:
        fill_disk(m, tmp_path)
        r = run_cli("generate", data, "--path", model, "--output", out, *GENERATE)
    assert error_line(r) == f"nmtkit: error: no space left on device while writing {out}"
    assert [p.name for p in tmp_path.iterdir()] == ["hyp.txt"] and out.read_text() == "an earlier translation\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_generate_to_a_full_standard_output(corpus, model):
    _, data = corpus
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "nmtkit", "generate", str(data), "--path", str(model), *GENERATE],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "nmtkit: error: no space left on device while writing standard output"
