"""Checkpoint files: atomic saves, safe loads with clear errors, RNG round trips, averaging, pruning."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError

CFG = {"d_model": 4, "layers": 1}
DICTS = {"src_sha256": "a" * 64, "tgt_sha256": "b" * 64, "src_size": 10, "tgt_size": 10}


def make_state(w, b, steps=3, arch="tiny", cfg=CFG, dicts=DICTS, ema=None, update=1, epoch=1):
    state = {
        "arch": arch,
        "arch_config": dict(cfg),
        "model": {"w": torch.as_tensor(w), "b": torch.as_tensor(b), "steps": torch.tensor(steps)},
        "dictionaries": dict(dicts),
        "data_manifest_id": "m1",
        "update": update,
        "epoch": epoch,
        "train": {"optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.98)}]}},
        "train_args": {"seed": 1},
    }
    if ema is not None:
        state["ema"] = ema
    return state


def test_save_load_round_trip(tmp_path):
    s = make_state(torch.arange(6.0).view(2, 3), torch.tensor([1.0], dtype=torch.float16))
    ck.save_checkpoint(s, tmp_path / "c.pt")
    back = ck.load_checkpoint(tmp_path / "c.pt")
    assert back[ck.MAGIC] == ck.FORMAT_VERSION
    assert torch.equal(back["model"]["w"], s["model"]["w"]) and back["model"]["b"].dtype == torch.float16
    assert back["train"]["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.98)
    assert "train" not in ck.inference_state(back)


def test_crash_mid_save_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_last.pt"
    ck.save_checkpoint(make_state(torch.ones(3), torch.zeros(1), update=7), path)
    real_save = torch.save

    def failing_save(obj, f, *a, **k):
        f.write(b"PK\x03\x04 partial bytes of a zip archive")  # half a checkpoint reaches the disk
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="No space"):
        ck.save_checkpoint(make_state(torch.zeros(3), torch.zeros(1), update=8), path)
    monkeypatch.setattr(torch, "save", real_save)
    assert ck.load_checkpoint(path)["update"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_last.pt"]  # no temp file left


def test_load_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        ck.load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"this is not a checkpoint")
    with pytest.raises(UserError, match="cannot read checkpoint"):
        ck.load_checkpoint(tmp_path / "junk.pt")
    good = tmp_path / "good.pt"
    ck.save_checkpoint(make_state(torch.ones(100), torch.zeros(1)), good)
    data = good.read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="corrupt or truncated"):
        ck.load_checkpoint(tmp_path / "trunc.pt")
    torch.save({"model": {}}, tmp_path / "foreign.pt")
    with pytest.raises(UserError, match="not an nmtkit checkpoint"):
        ck.load_checkpoint(tmp_path / "foreign.pt")

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(UserError, match="not a safe nmtkit checkpoint"):
        ck.load_checkpoint(tmp_path / "evil.pt")
    torch.save({ck.MAGIC: 99, "arch": "a", "arch_config": {}, "model": {}}, tmp_path / "future.pt")
    with pytest.raises(UserError, match="newer"):
        ck.load_checkpoint(tmp_path / "future.pt")


def test_rng_state_round_trip_through_file(tmp_path):
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    random.gauss(0, 1)  # makes python's cached gauss non-None
    ck.save_checkpoint({**make_state(torch.ones(1), torch.ones(1)), "train": {"rng": ck.rng_state()}}, tmp_path / "r.pt")
    expect = (random.random(), random.gauss(0, 1), np.random.rand(), torch.rand(3))
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    ck.set_rng_state(ck.load_checkpoint(tmp_path / "r.pt")["train"]["rng"])
    got = (random.random(), random.gauss(0, 1), np.random.rand(), torch.rand(3))
    assert got[:3] == expect[:3] and torch.equal(got[3], expect[3])


def write(tmp_path, name, state):
    ck.save_checkpoint(state, tmp_path / name)
    return tmp_path / name


def test_average_of_known_tensors_is_exact(tmp_path):
    a = write(tmp_path, "a.pt", make_state([1.0, 2.0, 4.0], torch.tensor([1.0], dtype=torch.bfloat16), update=1))
    b = write(tmp_path, "b.pt", make_state([2.0, 3.0, 8.0], torch.tensor([2.0], dtype=torch.bfloat16), update=2))
    c = write(tmp_path, "c.pt", make_state([6.0, 7.0, 0.0], torch.tensor([6.0], dtype=torch.bfloat16), update=3))
    out = ck.average_checkpoints([a, b, c])
    assert out["model"]["w"].tolist() == [3.0, 4.0, 4.0]
    assert out["model"]["b"].dtype == torch.bfloat16 and out["model"]["b"].tolist() == [3.0]
    assert out["model"]["steps"].item() == 3  # integer tensor, equal everywhere: kept
    assert "train" not in out and out["update"] == 3 and out["averaged_from"] == ["a.pt", "b.pt", "c.pt"]
    assert out["arch_config"] == CFG and out["dictionaries"] == DICTS
    # float64 accumulation: 1/3 of (0.1 + 0.2 + 0.3) in float32 is the float32 nearest to 0.2
    x = [write(tmp_path, f"x{i}.pt", make_state(torch.tensor([v], dtype=torch.float32), [0.0])) for i, v in
         enumerate((0.1, 0.2, 0.3))]
    mean = ck.average_checkpoints(x)["model"]["w"]
    expect = (torch.tensor([0.1], dtype=torch.float32).double() + torch.tensor([0.2]).double()
              + torch.tensor([0.3]).double()) / 3
    assert torch.equal(mean, expect.float())


def test_average_of_one_reproduces_it_and_ema(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(5, 7)
    ema = {"w": torch.randn(5, 7), "b": torch.zeros(2), "steps": torch.tensor(3)}
    a = write(tmp_path, "a.pt", make_state(w, torch.randn(2), ema=ema))
    out = ck.average_checkpoints([a])
    src = ck.load_checkpoint(a)
    for k in src["model"]:
        assert torch.equal(out["model"][k], src["model"][k])
        assert torch.equal(out["ema"][k], src["ema"][k])
    # EMA is averaged only when every input has it
    b = write(tmp_path, "b.pt", make_state(w, torch.randn(2)))
    assert "ema" not in ck.average_checkpoints([a, b])


def test_average_refusals(tmp_path):
    a = write(tmp_path, "a.pt", make_state([1.0], [1.0]))
    other_arch = write(tmp_path, "o.pt", make_state([1.0], [1.0], cfg={"d_model": 8, "layers": 1}))
    with pytest.raises(UserError, match="architecture.*d_model: 8 != 4"):
        ck.average_checkpoints([a, other_arch])
    other_dict = write(tmp_path, "d.pt", make_state([1.0], [1.0], dicts={**DICTS, "tgt_sha256": "c" * 64}))
    with pytest.raises(UserError, match="another tgt dictionary"):
        ck.average_checkpoints([a, other_dict])
    steps = write(tmp_path, "s.pt", make_state([1.0], [1.0], steps=4))
    with pytest.raises(UserError, match="non-floating tensor steps differs"):
        ck.average_checkpoints([a, steps])
    with pytest.raises(UserError, match="given twice"):
        ck.average_checkpoints([a, tmp_path / "." / "a.pt"])
    with pytest.raises(UserError, match="--output .* is one of the input"):
        ck.check_output_not_input(tmp_path / "a.pt", [a, steps])


def test_selection_and_pruning(tmp_path):
    for e, u in [(1, 10), (1, 20), (2, 30), (2, 100), (3, 110)]:
        write(tmp_path, f"checkpoint_{e}_{u}.pt", make_state([float(u)], [0.0], update=u))
    for e in (1, 2, 3):
        write(tmp_path, f"checkpoint{e}.pt", make_state([float(e)], [0.0], epoch=e))
    write(tmp_path, "checkpoint_last.pt", make_state([0.0], [0.0]))
    assert [p.name for p in ck.last_checkpoints(tmp_path, 3, "update")] == [
        "checkpoint_2_30.pt", "checkpoint_2_100.pt", "checkpoint_3_110.pt"]  # by update number, not name
    assert [p.name for p in ck.last_checkpoints(tmp_path, 2, "epoch")] == ["checkpoint2.pt", "checkpoint3.pt"]
    with pytest.raises(UserError, match="--num-epoch-checkpoints 5: .* holds only 3 epoch checkpoint"):
        ck.last_checkpoints(tmp_path, 5, "epoch")
    removed = ck.prune_checkpoints(tmp_path, keep_last_updates=2, keep_last_epochs=1)
    assert sorted(p.name for p in removed) == sorted(
        ["checkpoint_1_10.pt", "checkpoint_1_20.pt", "checkpoint_2_30.pt", "checkpoint1.pt", "checkpoint2.pt"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint3.pt", "checkpoint_2_100.pt", "checkpoint_3_110.pt", "checkpoint_last.pt"]


def test_check_same_model(tmp_path):
    s = make_state([1.0], [1.0])
    ck.check_same_model(s, "x", arch="tiny", arch_config=CFG, dictionaries=DICTS)
    ck.check_same_model(s, "x", arch="other_name", arch_config=CFG, dictionaries=DICTS)  # same config: fine
    with pytest.raises(UserError, match="arch 'tiny' that differs from this run's 'big' \\(d_model: 4 != 8\\)"):
        ck.check_same_model(s, "x", arch="big", arch_config={**CFG, "d_model": 8}, dictionaries=DICTS)
    with pytest.raises(UserError, match="another src dictionary"):
        ck.check_same_model(s, "x", arch="tiny", arch_config=CFG, dictionaries={**DICTS, "src_sha256": "z"})


def test_average_keeps_tied_weights_tied(tmp_path):
    def tied(v):
        w = torch.full((3, 2), v)
        return {"arch": "t", "arch_config": CFG, "dictionaries": DICTS, "update": 1, "epoch": 1,
                "model": {"src_embed.weight": w, "tgt_embed.weight": w, "out_proj.weight": w, "b": torch.zeros(2)}}

    a, b = write(tmp_path, "a.pt", tied(1.0)), write(tmp_path, "b.pt", tied(3.0))
    out = ck.average_checkpoints([a, b])
    assert out["model"]["src_embed.weight"].tolist() == [[2.0, 2.0]] * 3
    assert out["model"]["src_embed.weight"] is out["model"]["out_proj.weight"] is out["model"]["tgt_embed.weight"]
    ck.save_checkpoint(out, tmp_path / "avg.pt")
    back = ck.load_checkpoint(tmp_path / "avg.pt")["model"]
    assert back["src_embed.weight"].untyped_storage().data_ptr() == back["out_proj.weight"].untyped_storage().data_ptr()
