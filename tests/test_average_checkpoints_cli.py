"""`nmtkit average-checkpoints`: selection by update/epoch, files, refusals with exit 2."""

from __future__ import annotations

import torch

from nmtkit import checkpoints as ck

DICTS = {"src_sha256": "a" * 64, "tgt_sha256": "a" * 64, "src_size": 8, "tgt_size": 8}


def put(path, value, update=1, epoch=1, arch_config=None):
    ck.save_checkpoint({
        "arch": "tiny", "arch_config": arch_config or {"d_model": 2}, "dictionaries": DICTS,
        "model": {"w": torch.tensor([value, 2 * value])}, "update": update, "epoch": epoch,
        "train": {"optimizer": {"state": {}, "param_groups": []}},
    }, path)


def test_last_n_update_checkpoints(tmp_path, run_cli):
    for e, u, v in [(1, 5, 100.0), (1, 10, 1.0), (2, 15, 2.0), (2, 20, 6.0)]:
        put(tmp_path / f"checkpoint_{e}_{u}.pt", v, update=u, epoch=e)
    put(tmp_path / "checkpoint_last.pt", 999.0, update=20)
    r = run_cli("average-checkpoints", "--inputs", tmp_path, "--num-update-checkpoints", "3",
                "--output", tmp_path / "avg.pt")
    assert r.code == 0, r
    assert "averaged 3 checkpoint(s)" in r.out
    avg = ck.load_checkpoint(tmp_path / "avg.pt")
    assert avg["model"]["w"].tolist() == [3.0, 6.0]
    assert "train" not in avg and avg["averaged_from"] == [
        "checkpoint_1_10.pt", "checkpoint_2_15.pt", "checkpoint_2_20.pt"]


def test_epoch_checkpoints_and_files(tmp_path, run_cli):
    put(tmp_path / "checkpoint1.pt", 1.0, epoch=1)
    put(tmp_path / "checkpoint2.pt", 3.0, epoch=2)
    r = run_cli("average-checkpoints", "--inputs", tmp_path, "--num-epoch-checkpoints", "2", "-o", tmp_path / "e.pt")
    assert r.code == 0, r
    assert ck.load_checkpoint(tmp_path / "e.pt")["model"]["w"].tolist() == [2.0, 4.0]
    r = run_cli("average-checkpoints", tmp_path / "checkpoint1.pt", "--output", tmp_path / "one.pt")
    assert r.code == 0, r
    assert ck.load_checkpoint(tmp_path / "one.pt")["model"]["w"].tolist() == [1.0, 2.0]


def test_refusals(tmp_path, run_cli):
    put(tmp_path / "checkpoint1.pt", 1.0)
    put(tmp_path / "checkpoint_1_3.pt", 1.0, update=3)
    put(tmp_path / "other.pt", 1.0, arch_config={"d_model": 4})
    cases = [
        (["--inputs", tmp_path, "--num-epoch-checkpoints", "5", "-o", tmp_path / "x.pt"],
         "holds only 1 epoch checkpoint"),
        (["--inputs", tmp_path, "--num-update-checkpoints", "2", "-o", tmp_path / "x.pt"],
         "holds only 1 update checkpoint"),
        ([tmp_path / "checkpoint1.pt", tmp_path / "other.pt", "-o", tmp_path / "x.pt"], "architecture"),
        ([tmp_path / "checkpoint1.pt", "-o", tmp_path / "checkpoint1.pt"], "is one of the input"),
        (["--inputs", tmp_path, "-o", tmp_path / "x.pt"], "exactly one of"),
        ([tmp_path / "nope.pt", "-o", tmp_path / "x.pt"], "checkpoint not found"),
        (["-o", tmp_path / "x.pt"], "nothing to average"),
    ]
    for args, message in cases:
        r = run_cli("average-checkpoints", *args)
        assert r.code == 2 and message in r.err, (args, r)
        assert "Traceback" not in r.err
    assert not (tmp_path / "x.pt").exists()
    assert ck.load_checkpoint(tmp_path / "checkpoint1.pt")["model"]["w"].tolist() == [1.0, 2.0]


def test_never_replaces_a_training_checkpoint(tmp_path, run_cli):
    import hashlib

    for e, u, v in [(1, 5, 1.0), (1, 10, 3.0)]:
        put(tmp_path / f"checkpoint_{e}_{u}.pt", v, update=u, epoch=e)
    put(tmp_path / "checkpoint_last.pt", 3.0, update=10)
    put(tmp_path / "my_copy.pt", 3.0, update=10)  # a training checkpoint under a name of the user's
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    args = ("average-checkpoints", "--inputs", tmp_path, "--num-update-checkpoints", "2", "--output")
    for name in ("checkpoint_last.pt", "my_copy.pt"):
        r = run_cli(*args, tmp_path / name)
        assert r.code == 2 and r.err.strip() == (
            f"nmtkit: error: --output {tmp_path / name} is a training checkpoint (it holds the optimizer and "
            "training state a run resumes from); choose another path"), r
    # names that training writes, even where no file exists yet: a run would resume from, prune or
    # average them as its own
    for name in ("checkpoint_best.pt", "checkpoint_2_20.pt", "checkpoint3.pt"):
        r = run_cli(*args, tmp_path / name)
        assert r.code == 2 and r.err.strip() == (
            f"nmtkit: error: --output {tmp_path / name}: {name} is a name that nmtkit train writes; choose "
            "another (e.g. checkpoint_avg5.pt)"), r
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()} == before
    # an earlier average (an inference checkpoint) is replaced as before
    assert run_cli(*args, tmp_path / "avg.pt").code == 0
    assert run_cli(*args, tmp_path / "avg.pt").code == 0
    assert ck.load_checkpoint(tmp_path / "avg.pt")["model"]["w"].tolist() == [2.0, 4.0]
