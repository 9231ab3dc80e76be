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


# ---- behaviour pinned down by the mutation benchmark (recipes/bench/mutation.sh checkpoints) ----


def test_rng_state_tensors_are_int64():
    s = ck.rng_state()
    assert s["python_state"].dtype == torch.int64 and s["numpy_keys"].dtype == torch.int64
    assert s["numpy_keys"].tolist() == np.random.get_state()[1].tolist()
    assert "cuda" not in s  # no CUDA here


class FakeCuda:
    """Stands in for torch.cuda on a machine without a GPU: records what set_rng_state_all gets."""

    def __init__(self, monkeypatch, available=True, initialized=True, count=1):
        self.set_calls = []
        self.states = [torch.tensor([7, 8], dtype=torch.uint8)] * count
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: self.set_calls.append(list(states)))


def test_cuda_rng_states_are_saved_and_restored_only_when_in_use(monkeypatch):
    FakeCuda(monkeypatch, available=True, initialized=False)
    assert "cuda" not in ck.rng_state()  # CUDA present but never used: nothing to save
    FakeCuda(monkeypatch, available=False, initialized=True)
    assert "cuda" not in ck.rng_state()
    fake = FakeCuda(monkeypatch, count=2)
    s = ck.rng_state()
    assert [t.tolist() for t in s["cuda"]] == [[7, 8], [7, 8]]
    ck.set_rng_state(s)
    assert [[t.tolist() for t in call] for call in fake.set_calls] == [[[7, 8], [7, 8]]]
    # another number of GPUs than at save time: CUDA states are left alone
    fake = FakeCuda(monkeypatch, count=3)
    ck.set_rng_state(s)
    assert fake.set_calls == []
    # no CUDA states saved, CUDA available now: nothing to restore (and no KeyError)
    fake = FakeCuda(monkeypatch, count=1)
    ck.set_rng_state({k: v for k, v in s.items() if k != "cuda"})
    assert fake.set_calls == []
    # CUDA states saved, no CUDA now: ignored
    fake = FakeCuda(monkeypatch, available=False, count=2)
    ck.set_rng_state(s)
    assert fake.set_calls == []


def test_check_same_model_messages_are_exact():
    s = make_state([1.0], [1.0], cfg={"a": 1, "b": 2, "c": 3, "d": 4, "e": 5})
    four = {"a": 0, "b": 0, "c": 0, "d": 0, "e": 5}
    with pytest.raises(UserError) as e:
        ck.check_same_model(s, "ckpt.pt", arch="big", arch_config=four, dictionaries=DICTS)
    assert str(e.value) == ("ckpt.pt holds a model of arch 'tiny' that differs from this run's 'big' "
                            "(a: 1 != 0; b: 2 != 0; c: 3 != 0; d: 4 != 0); use another --save-dir or the same "
                            "architecture flags")
    with pytest.raises(UserError) as e:
        ck.check_same_model(s, "ckpt.pt", arch="big", arch_config={**four, "e": 0}, dictionaries=DICTS)
    assert "(a: 1 != 0; b: 2 != 0; c: 3 != 0; d: 4 != 0 ...); use another" in str(e.value)
    with pytest.raises(UserError) as e:  # only in one of them: shown as <absent>
        ck.check_same_model(s, "x", arch="t", arch_config={**s["arch_config"], "f": 1}, dictionaries=DICTS)
    assert "(f: '<absent>' != 1)" in str(e.value)
    with pytest.raises(UserError) as e:
        ck.check_same_model(s, "ckpt.pt", arch="tiny", arch_config=s["arch_config"],
                            dictionaries={**DICTS, "src_sha256": "0123456789abcdef"})
    assert str(e.value) == ("ckpt.pt was trained with another src dictionary (sha256 aaaaaaaaaaaa... vs "
                            "0123456789ab...); it cannot continue on this data dir")


def test_check_same_dictionaries_compares_languages_when_both_record_them():
    langs = {**DICTS, "src_lang": "de", "tgt_lang": "en"}
    s = make_state([1.0], [1.0], dicts=langs)
    ck.check_same_dictionaries(s, "c.pt", langs)
    with pytest.raises(UserError) as e:
        ck.check_same_dictionaries(s, "c.pt", {**DICTS, "src_lang": "en", "tgt_lang": "de"})
    assert str(e.value) == "c.pt was trained for de->en, but the data dir is en->de; it cannot continue on this data dir"
    with pytest.raises(UserError) as e:
        ck.check_same_dictionaries(s, "c.pt", {**DICTS, "src_lang": "de", "tgt_lang": "fr"}, what="no")
    assert str(e.value) == "c.pt was trained for de->en, but the data dir is de->fr; no"
    # a side that does not record both languages (older checkpoints): only the checksums count
    for mine, theirs in ((DICTS, langs), (langs, DICTS), ({**DICTS, "src_lang": "en"}, langs),
                         (langs, {**DICTS, "tgt_lang": "de"}), ({**DICTS, "tgt_lang": "de"}, langs)):
        ck.check_same_dictionaries(make_state([1.0], [1.0], dicts=mine), "c.pt", theirs)


def test_update_and_epoch_checkpoint_listing(tmp_path):
    for name in ("checkpoint_3_200.pt", "checkpoint_1_50.pt", "checkpoint2.pt", "checkpoint10.pt",
                 "checkpoint_best.pt", "checkpoint_1_x.pt", "checkpoint_2_7.pt.tmp"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "checkpoint_4_300.pt").mkdir()  # a folder with a checkpoint's name is not one
    assert ck.update_checkpoints(tmp_path) == [(50, 1, tmp_path / "checkpoint_1_50.pt"),
                                               (200, 3, tmp_path / "checkpoint_3_200.pt")]
    assert ck.epoch_checkpoints(tmp_path) == [(2, tmp_path / "checkpoint2.pt"), (10, tmp_path / "checkpoint10.pt")]


def test_last_checkpoints_messages_are_exact(tmp_path):
    for name in ("checkpoint_1_50.pt", "checkpoint_2_90.pt", "checkpoint1.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in ck.last_checkpoints(tmp_path, 1, "update")] == ["checkpoint_2_90.pt"]
    assert [p.name for p in ck.last_checkpoints(tmp_path, 1, "epoch")] == ["checkpoint1.pt"]
    cases = [
        ((tmp_path, 3, "update"), f"--num-update-checkpoints 3: {tmp_path} holds only 2 update checkpoint(s) "
                                  "(checkpoint_EPOCH_UPDATE.pt): checkpoint_1_50.pt, checkpoint_2_90.pt"),
        ((tmp_path, 2, "epoch"), f"--num-epoch-checkpoints 2: {tmp_path} holds only 1 epoch checkpoint(s) "
                                 "(checkpointEPOCH.pt): checkpoint1.pt"),
        ((tmp_path, 0, "update"), "--num-update-checkpoints must be >= 1, got 0"),
        ((tmp_path, -1, "epoch"), "--num-epoch-checkpoints must be >= 1, got -1"),
        ((tmp_path / "checkpoint1.pt", 1, "epoch"), f"--inputs: not a directory: {tmp_path / 'checkpoint1.pt'}"),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases.append(((empty, 1, "epoch"), f"--num-epoch-checkpoints 1: {empty} holds only 0 epoch checkpoint(s) "
                                       "(checkpointEPOCH.pt)"))
    for args, message in cases:
        with pytest.raises(UserError) as e:
            ck.last_checkpoints(*args)
        assert str(e.value) == message


def test_prune_keeps_the_newest_and_tolerates_vanished_files(tmp_path, monkeypatch):
    names = ["checkpoint_1_10.pt", "checkpoint_1_20.pt", "checkpoint_2_30.pt", "checkpoint1.pt", "checkpoint2.pt"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert ck.prune_checkpoints(tmp_path, 0, 0) == [] and ck.prune_checkpoints(tmp_path, -1, -1) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    # a file deleted by someone else between the listing and the unlink is skipped, not reported
    real_unlink = type(tmp_path).unlink

    def racing_unlink(self, *a, **k):
        if self.name in ("checkpoint_1_10.pt", "checkpoint1.pt"):
            real_unlink(self)
            raise FileNotFoundError(self)
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(type(tmp_path), "unlink", racing_unlink)
    removed = ck.prune_checkpoints(tmp_path, keep_last_updates=1, keep_last_epochs=1)
    assert [p.name for p in removed] == ["checkpoint_1_20.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint2.pt", "checkpoint_2_30.pt"]


def test_average_refuses_another_arch_with_an_exact_message(tmp_path):
    cfg = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    a = write(tmp_path, "a.pt", make_state([1.0], [1.0], cfg=cfg))
    b = write(tmp_path, "b.pt", make_state([1.0], [1.0], arch="other", cfg={k: 0 for k in cfg}))
    with pytest.raises(UserError) as e:
        ck.average_checkpoints([a, b])
    assert str(e.value) == (f"{b}: architecture 'other' differs from {a} ('tiny'): a: 0 != 1; b: 0 != 2; c: 0 != 3; "
                            "d: 0 != 4; only checkpoints of the same model can be averaged")


def test_state_summary():
    s = make_state(torch.zeros(2, 3), torch.zeros(4), update=12, epoch=3)  # + an integer "steps" tensor
    assert ck.state_summary(s) == {"arch": "tiny", "update": 12, "epoch": 3, "params": 10}
    del s["update"], s["epoch"]
    assert ck.state_summary(s) == {"arch": "tiny", "update": None, "epoch": None, "params": 10}


def test_average_accumulates_in_float64_even_for_half_precision(tmp_path):
    # float16 steps are 2 at 2048: summed in float16, 2048 + 1 + 1 stays 2048 (mean 682.67 -> 682.5);
    # summed in float64 it is 2050 (mean 683.33 -> 683.5, the float16 nearest)
    x = [write(tmp_path, f"h{i}.pt", make_state(torch.tensor([v], dtype=torch.float16), [0.0]))
         for i, v in enumerate((2048.0, 1.0, 1.0))]
    mean = ck.average_checkpoints(x)["model"]["w"]
    assert mean.dtype == torch.float16 and mean.tolist() == [683.5]


def test_average_refusals_name_both_files_exactly(tmp_path):
    a = write(tmp_path, "a.pt", make_state([1.0, 2.0], [1.0]))
    with pytest.raises(UserError) as e:
        ck.average_checkpoints([])
    assert str(e.value) == "no checkpoints to average"
    other = make_state([1.0, 2.0], [1.0])
    other["model"] = {"w": other["model"]["w"], "steps": other["model"]["steps"],
                      **{f"x{i}": torch.zeros(1) for i in range(3)}}  # no "b", three extra
    o = write(tmp_path, "o.pt", other)
    with pytest.raises(UserError) as e:
        ck.average_checkpoints([a, o])
    assert str(e.value) == f"{o}: parameters differ from {a} (b, x0, x1 ...)"
    s = write(tmp_path, "s.pt", make_state([1.0, 2.0, 3.0], [1.0]))
    with pytest.raises(UserError) as e:
        ck.average_checkpoints([a, s])
    assert str(e.value) == f"{s}: parameter w has shape (3,) but {a} has (2,)"
    d = write(tmp_path, "d.pt", make_state([1.0, 2.0], [1.0], dicts={**DICTS, "src_sha256": "c" * 64}))
    with pytest.raises(UserError) as e:
        ck.average_checkpoints([a, d])
    assert str(e.value) == (f"{d} was trained with another src dictionary (sha256 cccccccccccc... vs aaaaaaaaaaaa...); "
                            f"only checkpoints trained on the same dictionaries as {a} can be averaged")
    i = write(tmp_path, "i.pt", make_state([1.0, 2.0], [1.0], steps=5))
    with pytest.raises(UserError) as e:
        ck.average_checkpoints([a, i])
    assert str(e.value) == f"{i}: non-floating tensor steps differs from {a}; cannot average it"


def test_same_file_through_a_hard_link_and_unreadable_paths(tmp_path):
    a = write(tmp_path, "a.pt", make_state([1.0], [1.0]))
    (tmp_path / "link.pt").hardlink_to(a)
    with pytest.raises(UserError, match="given twice"):
        ck.average_checkpoints([a, tmp_path / "link.pt"])
    with pytest.raises(UserError, match="is one of the input"):
        ck.check_output_not_input(tmp_path / "link.pt", [a])
    # a name too long for the file system cannot be compared (OSError): it is not the same file
    ck.check_output_not_input(tmp_path / ("x" * 300), [a])
    ck.check_output_not_input(tmp_path / "new.pt", [a])


def test_average_of_ema_weights_and_mixed_inputs(tmp_path):
    def ema(v):
        return {"w": torch.tensor([v, 2 * v]), "b": torch.tensor([v]), "steps": torch.tensor(3)}

    a = write(tmp_path, "a.pt", make_state([1.0, 1.0], [1.0], ema=ema(1.0)))
    b = write(tmp_path, "b.pt", make_state([3.0, 3.0], [3.0], ema=ema(5.0)))
    n = write(tmp_path, "n.pt", make_state([2.0, 2.0], [2.0]))
    out = ck.average_checkpoints([a, b])
    assert out["ema"]["w"].tolist() == [3.0, 6.0] and out["ema"]["b"].tolist() == [3.0]
    assert out["model"]["w"].tolist() == [2.0, 2.0]
    for order in ([a, n, b], [n, a, b], [a, b, n]):  # one input without EMA: no EMA in the average
        out = ck.average_checkpoints(order)
        assert "ema" not in out and out["model"]["w"].tolist() == [2.0, 2.0]


def test_average_keeps_tied_weights_tied_in_model_and_ema(tmp_path):
    def tied(v):
        w = torch.full((3, 2), v)
        e = torch.full((3, 2), 10 * v)
        return {"arch": "t", "arch_config": CFG, "dictionaries": DICTS, "update": 1, "epoch": 1,
                "model": {"src_embed.weight": w, "out_proj.weight": w, "b": torch.full((2,), v)},
                "ema": {"src_embed.weight": e, "out_proj.weight": e, "b": torch.full((2,), -v)}}

    out = ck.average_checkpoints([write(tmp_path, "a.pt", tied(1.0)), write(tmp_path, "b.pt", tied(3.0))])
    assert out["model"]["b"].tolist() == [2.0, 2.0] and out["ema"]["b"].tolist() == [-2.0, -2.0]
    assert out["ema"]["src_embed.weight"].tolist() == [[20.0, 20.0]] * 3
    assert out["ema"]["src_embed.weight"] is out["ema"]["out_proj.weight"]
    assert out["model"]["src_embed.weight"] is out["model"]["out_proj.weight"]


def test_load_is_safe_even_where_torch_defaults_to_unsafe_loads(tmp_path, monkeypatch):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    # this variable turns torch.load's *default* into weights_only=False; an explicit True still holds
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UserError, match="not a safe nmtkit checkpoint"):
        ck.load_checkpoint(tmp_path / "evil.pt")


def test_load_messages_are_exact(tmp_path, monkeypatch):
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(tmp_path)
    assert str(e.value) == f"expected a checkpoint file but got a directory: {tmp_path}"
    p = tmp_path / "c.pt"
    torch.save({ck.MAGIC: 1, "arch": "a", "model": {}}, p)
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(p)
    assert str(e.value) == f"{p}: incomplete nmtkit checkpoint (no 'arch_config')"
    # only the first line of the loader's message is kept; an empty message gives the exception's name
    import pickle

    for exc, expect in ((pickle.UnpicklingError("  first line\nsecond line"), "first line"),
                        (pickle.UnpicklingError(""), "UnpicklingError")):
        monkeypatch.setattr(torch, "load", lambda *a, _e=exc, **k: (_ for _ in ()).throw(_e))
        with pytest.raises(UserError) as e:
            ck.load_checkpoint(p)
        assert str(e.value) == f"{p}: not a safe nmtkit checkpoint (refused by the weights-only loader: {expect})"
    for exc, expect in ((RuntimeError(" \nPytorchStreamReader failed\nmore"), "PytorchStreamReader failed"),
                        (EOFError(), "EOFError")):
        monkeypatch.setattr(torch, "load", lambda *a, _e=exc, **k: (_ for _ in ()).throw(_e))
        with pytest.raises(UserError) as e:
            ck.load_checkpoint(p)
        assert str(e.value) == f"{p}: cannot read checkpoint (corrupt or truncated file?): {expect}"


def test_load_maps_tensors_where_asked(tmp_path):
    p = write(tmp_path, "c.pt", make_state([1.0, 2.0], [1.0]))
    assert ck.load_checkpoint(p, map_location="meta")["model"]["w"].device.type == "meta"
    assert ck.load_checkpoint(p)["model"]["w"].device.type == "cpu"


def test_save_survives_a_folder_that_cannot_be_fsynced(tmp_path, monkeypatch):
    import os
    import stat

    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(22, "Invalid argument")  # what some file systems answer for a directory
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ck.save_checkpoint(make_state([1.0], [1.0], update=4), tmp_path / "c.pt")
    assert ck.load_checkpoint(tmp_path / "c.pt")["update"] == 4


def test_config_differences_show_absent_keys_on_either_side():
    assert ck.config_differences({"a": 1, "b": 2}, {"b": 3, "c": 4}) == [
        "a: 1 != '<absent>'", "b: 2 != 3", "c: '<absent>' != 4"]


def test_average_ema_refusal_names_both_files(tmp_path):
    a = write(tmp_path, "a.pt", make_state([1.0], [1.0], ema={"w": torch.zeros(2), "b": torch.zeros(1),
                                                               "steps": torch.tensor(3)}))
    b = write(tmp_path, "b.pt", make_state([1.0], [1.0], ema={"w": torch.zeros(3), "b": torch.zeros(1),
                                                               "steps": torch.tensor(3)}))
    with pytest.raises(UserError) as e:
        ck.average_checkpoints([a, b])
    assert str(e.value) == f"{b}: parameter w has shape (3,) but {a} has (2,)"


def test_remove_leftovers_takes_only_the_temporary_files_of_checkpoint_saves(tmp_path):
    ours = [".checkpoint_last.pt.k3j_x9ab.tmp", ".checkpoint_best.pt.12345.tmp", ".checkpoint_3_120.pt.777.tmp",
            ".checkpoint2.pt.abcdefgh.tmp"]
    theirs = [".avg.pt.abcdefgh.tmp", "checkpoint_last.pt", "checkpoint_last.pt.tmp", ".checkpoint_last.pt.tmp",
              "notes.tmp", ".checkpoint_last.pt.abc.tmp.keep", ".checkpoint_avg.pt.abc.tmp", "train_log.jsonl"]
    for name in ours + theirs:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ours[0]).write_bytes(b"x")  # only the save dir itself is tidied
    (tmp_path / ".checkpoint_best.pt.999.tmp").mkdir()  # not a file: left alone
    removed = ck.remove_leftovers(tmp_path)
    assert sorted(p.name for p in removed) == sorted(ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs + ["sub", ".checkpoint_best.pt.999.tmp"])
    assert (tmp_path / "sub" / ours[0]).exists()
    assert ck.remove_leftovers(tmp_path / "absent") == []


def test_save_puts_every_other_name_in_place_before_the_checkpoint_itself(tmp_path, monkeypatch):
    import os

    last, others = tmp_path / "checkpoint_last.pt", [tmp_path / "checkpoint_1_8.pt", tmp_path / "checkpoint_best.pt"]
    ck.save_checkpoint(make_state([1.0], [1.0], update=4), last)
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((os.path.basename(dst), last.exists() and ck.load_checkpoint(last)["update"]))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    ck.save_checkpoint(make_state([2.0], [2.0], update=8), last, links=others)
    # both names are replaced while checkpoint_last.pt still holds update 4
    assert seen == [("checkpoint_1_8.pt", 4), ("checkpoint_best.pt", 4), ("checkpoint_last.pt", 4)]
    assert all(os.path.samefile(last, p) for p in others)  # hard links: one copy on disk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_8.pt", "checkpoint_best.pt",
                                                          "checkpoint_last.pt"]


def test_save_without_hard_links_copies_each_name_atomically(tmp_path, monkeypatch):
    import os

    def no_link(src, dst):
        raise OSError(1, "Operation not permitted")  # a file system without hard links

    monkeypatch.setattr(os, "link", no_link)
    last, best = tmp_path / "checkpoint_last.pt", tmp_path / "checkpoint_best.pt"
    ck.save_checkpoint(make_state([3.0], [1.0], update=9), last, links=[best])
    assert not os.path.samefile(last, best) and best.read_bytes() == last.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_best.pt", "checkpoint_last.pt"]
