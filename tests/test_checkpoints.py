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
    (tmp_path / "junk.pt").write_bytes(b"\x80\x02this is not a checkpoint")  # a pickle's start, then junk
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


# ---------------------------------------------------------------------------------------------
# loadable but malformed checkpoints: one line naming the file and the entry


def layout_state(**change):
    """A well-formed state (every optional entry present) with `change` applied."""
    state = {**make_state([1.0, 2.0], [0.5], ema={"w": torch.zeros(2), "b": torch.zeros(1), "steps": torch.tensor(3)}),
             "best": {"metric": "loss", "value": 1.5}, "averaged_from": ["a.pt", "b.pt"]}
    return {**state, **change}


def test_every_layout_refusal_names_the_file_and_the_entry(tmp_path):
    path = tmp_path / "crafted.pt"
    expand = torch.zeros(1).expand(4)  # 4 float32 elements over one stored float: 16 bytes claimed, 4 stored
    cases = [
        ({"arch": None}, "'arch' is a NoneType, expected a string"),
        ({"arch": 3}, "'arch' is an int, expected a string"),
        ({"arch": b"tiny"}, "'arch' is a bytes, expected a string"),
        ({"arch_config": None}, "'arch_config' is a NoneType, expected a dict of architecture settings"),
        ({"arch_config": ["d_model"]}, "'arch_config' is a list, expected a dict of architecture settings"),
        ({"arch_config": {"d_model": 4, 7: 1, 8: 2}}, "'arch_config' has a non-string key 7"),
        ({"model": (1, 2)}, "'model' is a tuple, expected a dict of tensors"),
        ({"model": {"w": 1.5}}, "'model' entry 'w' is a float, expected a tensor"),
        ({"model": {"w": torch.zeros(1), 3: torch.zeros(1)}}, "'model' has a non-string key 3"),
        ({"model": {"w": torch.eye(2).to_sparse()}}, "'model' entry w is a torch.sparse_coo tensor, expected a dense one"),
        ({"model": {"w": expand}}, "'model' entry w has shape (4,) but stores only 4 bytes"),
        ({"ema": "weights"}, "'ema' is a str, expected a dict of tensors"),
        ({"ema": {"w": [0.0]}}, "'ema' entry 'w' is a list, expected a tensor"),
        ({"dictionaries": ["a"]}, "'dictionaries' is a list, expected a dict"),
        ({"update": "7"}, "'update' is a str, expected an integer"),
        ({"update": True}, "'update' is a bool, expected an integer"),
        ({"epoch": 1.0}, "'epoch' is a float, expected an integer"),
        ({"train": [1]}, "'train' is a list, expected a dict of training state"),
        ({"best": 1.5}, "'best' is a float, expected a dict"),
        ({"train_args": "--lr 1"}, "'train_args' is a str, expected a dict"),
        ({"averaged_from": "a.pt"}, "'averaged_from' is a str, expected a list of file names"),
        ({"averaged_from": {"a.pt": 1}}, "'averaged_from' is a dict, expected a list of file names"),
        # the weights-only loader also builds OrderedDicts (state_dicts are ones): any mapping is "a dict"
        ({"averaged_from": __import__("collections").OrderedDict(a=1)},
         "'averaged_from' is a dict, expected a list of file names"),
    ]
    for change, message in cases:
        with pytest.raises(UserError) as e:
            ck.check_structure(layout_state(**change), str(path))
        assert str(e.value) == f"{path}: malformed nmtkit checkpoint: {message}", change


def test_layout_accepts_what_nmtkit_writes_and_absent_optional_entries(tmp_path):
    ck.check_structure(layout_state(), tmp_path / "c.pt")  # every entry present and well-formed
    # optional entries may be None or absent; a slice of a larger storage is fine (it stores more than it shows)
    nones = dict.fromkeys(("ema", "dictionaries", "update", "epoch", "train", "best", "train_args", "averaged_from"))
    ck.check_structure(layout_state(**nones, model={"w": torch.arange(6.0)[2:4]}), tmp_path / "c.pt")
    ck.check_structure({"arch": "a", "arch_config": {}, "model": {}}, tmp_path / "c.pt")


def test_a_crafted_file_is_refused_by_the_loader_with_the_same_line(tmp_path):
    p = tmp_path / "c.pt"
    torch.save({ck.MAGIC: 1, **layout_state(model={"w": torch.zeros(1).expand(3, 2)})}, p)
    assert p.stat().st_size < 4096
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(p)
    assert str(e.value) == f"{p}: malformed nmtkit checkpoint: 'model' entry w has shape (3, 2) but stores only 4 bytes"


def training_part(**change):
    """The `train` part of a checkpoint as training writes it (optimizer, data position, rng list...)."""
    tr = {"optimizer": {"state": {}, "param_groups": []}, "data_position": {"epoch": 1, "batch_offset": 0},
          "rng": [{"torch": torch.zeros(2, dtype=torch.uint8)}], "state": {"update": 0},
          "scheduler": {"lr": 1.0}, "scaler": {"scale": 2.0}}
    tr.update(change)
    return {k: v for k, v in tr.items() if v is not ...}  # `...` removes an entry


def test_check_training_state_refusals_are_exact(tmp_path):
    where = tmp_path / "checkpoint_last.pt"
    ck.check_training_state({"train": training_part()}, where)
    ck.check_training_state({"train": training_part(rng=..., state=..., scheduler=..., scaler=...)}, where)
    ck.check_training_state({"train": training_part(data_position={"epoch": 7, "batch_offset": 12})}, where)
    cases = [
        ({"optimizer": ...}, "'train.optimizer' is absent, expected a dict"),
        ({"optimizer": [1, 2]}, "'train.optimizer' is a list, expected a dict"),
        ({"optimizer": None}, "'train.optimizer' is a NoneType, expected a dict"),
        ({"data_position": ...}, "'train.data_position' is absent, expected a dict"),
        ({"data_position": 3}, "'train.data_position' is an int, expected a dict"),
        ({"data_position": {"epoch": 0, "batch_offset": 0}}, "'train.data_position.epoch' is 0"),
        ({"data_position": {"epoch": True, "batch_offset": 0}}, "'train.data_position.epoch' is True"),
        ({"data_position": {"epoch": "1", "batch_offset": 0}}, "'train.data_position.epoch' is '1'"),
        ({"data_position": {"batch_offset": 0}}, "'train.data_position.epoch' is None"),
        ({"data_position": {"epoch": 1, "batch_offset": -1}}, "'train.data_position.batch_offset' is -1"),
        ({"data_position": {"epoch": 2, "batch_offset": 1.0}}, "'train.data_position.batch_offset' is 1.0"),
        ({"data_position": {"epoch": 2}}, "'train.data_position.batch_offset' is None"),
        ({"rng": {"torch": 1}}, "'train.rng' is a dict"),
        ({"state": [0]}, "'train.state' is a list"),
        ({"scheduler": 1.0}, "'train.scheduler' is a float"),
        ({"scaler": "x"}, "'train.scaler' is a str"),
    ]
    for change, message in cases:
        with pytest.raises(UserError) as e:
            ck.check_training_state({"arch": "a", "train": training_part(**change)}, where)
        assert str(e.value) == f"{where}: malformed nmtkit checkpoint: {message}", change


# ---------------------------------------------------------------------------------------------
# loading: memory maps, old-format files, what the weights-only loader refuses


def mapped_files() -> str:
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
        return fh.read()


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="needs Linux's /proc/self/maps")
def test_mmap_maps_the_file_and_the_default_reads_it(tmp_path):
    p = write(tmp_path, "mapped_checkpoint.pt", make_state(torch.arange(4.0), [1.0]))
    state = ck.load_checkpoint(p, mmap=True)
    assert str(p) in mapped_files() and state["model"]["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    del state
    state = ck.load_checkpoint(p)
    assert str(p) not in mapped_files() and state["model"]["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_an_old_format_file_is_read_when_mapping_was_asked(tmp_path, monkeypatch, capsys):
    p = tmp_path / "old.pt"
    torch.save({ck.MAGIC: 1, **make_state([1.0, 2.0], [3.0])}, p, _use_new_zipfile_serialization=False)
    for mmap in (True, False):
        assert ck.load_checkpoint(p, mmap=mmap)["model"]["w"].tolist() == [1.0, 2.0]
    assert ck.load_checkpoint(p, map_location="meta", mmap=True)["model"]["w"].device.type == "meta"
    assert ck.is_training_checkpoint(p)  # it holds `train`: never an --output of average-checkpoints

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({ck.MAGIC: 1, "train": {}, "x": Evil()}, p, _use_new_zipfile_serialization=False)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch's default becomes unsafe
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(p, mmap=True)
    assert str(e.value).startswith(f"{p}: not a safe nmtkit checkpoint")
    assert not ck.is_training_checkpoint(p)
    assert "pwned" not in capsys.readouterr().out


def test_only_the_mmap_refusal_is_retried_without_mmap(tmp_path, monkeypatch):
    p = write(tmp_path, "c.pt", make_state([1.0], [1.0]))
    calls = []

    def load(*a, **k):  # a read error under mmap that is not about mmap; a second try would succeed
        calls.append(k.get("mmap"))
        if len(calls) == 1:
            raise RuntimeError("PytorchStreamReader failed reading file data/0: invalid header")
        return {ck.MAGIC: 1, "arch": "a", "arch_config": {}, "model": {}}

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(p, mmap=True)
    assert str(e.value) == (f"{p}: cannot read checkpoint (corrupt or truncated file?): "
                            "PytorchStreamReader failed reading file data/0: invalid header")
    assert calls == [True]


def test_is_training_checkpoint_by_hand_built_files(tmp_path, monkeypatch, capsys):
    import torch.serialization as ser

    p = tmp_path / "c.pt"
    for state, expect in (({ck.MAGIC: 1, "train": {"optimizer": {}}}, True),
                          ({ck.MAGIC: 1, "train": None}, False), ({ck.MAGIC: 1, "train": [1]}, False),
                          ({ck.MAGIC: 1, "model": {}}, False), ({"train": {}}, False), ([ck.MAGIC, {"train": {}}], False)):
        torch.save(state, p)
        assert ck.is_training_checkpoint(p) is expect, state
    p.write_bytes(b"not a checkpoint")
    assert ck.is_training_checkpoint(p) is False
    assert ck.is_training_checkpoint(tmp_path / "absent.pt") is False
    # written on a GPU, looked at on a machine without CUDA: the tensors are never placed anywhere
    monkeypatch.setattr(ser, "location_tag", lambda storage: "cuda:0")
    torch.save({ck.MAGIC: 1, "train": {"optimizer": {}}, "model": {"w": torch.ones(3)}}, p)
    monkeypatch.undo()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(p, weights_only=True, mmap=True)  # what a load that maps tensors to their device does
    assert ck.is_training_checkpoint(p) is True

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({ck.MAGIC: 1, "train": {}, "x": Evil()}, p)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    assert ck.is_training_checkpoint(p) is False
    assert "pwned" not in capsys.readouterr().out


def test_output_names_that_training_writes_are_refused_without_a_file(tmp_path):
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_1_20.pt", "checkpoint4.pt"):
        with pytest.raises(UserError) as e:
            ck.check_output_not_training(tmp_path / name)
        assert str(e.value) == (f"--output {tmp_path / name}: {name} is a name that nmtkit train writes; "
                                "choose another (e.g. checkpoint_avg5.pt)")
    for name in ("checkpoint_avg5.pt", "checkpoint_last.pt.bak", "my_checkpoint_best.pt"):
        ck.check_output_not_training(tmp_path / name)


def test_remove_leftovers_tolerates_a_file_that_vanishes_meanwhile(tmp_path, monkeypatch):
    from pathlib import Path

    names = [".checkpoint_last.pt.aaaa.tmp", ".checkpoint_best.pt.bbbb.tmp", ".checkpoint3.pt.cccc.tmp"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    real_unlink = Path.unlink

    def unlink(self, *a, **k):
        if self.name == names[1]:
            real_unlink(self)  # another process removed it between the listing and this call
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(Path, "unlink", unlink)
    removed = ck.remove_leftovers(tmp_path)
    assert [p.name for p in removed] == sorted([names[0], names[2]])
    assert list(tmp_path.iterdir()) == []


def refusal(p) -> str:
    with pytest.raises(UserError) as e:
        ck.load_checkpoint(p)
    prefix = f"{p}: not a safe nmtkit checkpoint (refused by the weights-only loader: "
    assert str(e.value).startswith(prefix) and str(e.value).endswith(")"), str(e.value)
    return str(e.value)[len(prefix):-1]


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
def test_the_refusal_reason_is_what_torch_refused_without_its_advice(tmp_path):
    import os
    import zipfile

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "c.pt"
    # a global outside torch's allow list, and one from a blocked module
    for obj, reason in ((Evil(), "it holds a pickled Python object, print"),
                        (os.system, "it holds a pickled Python object, posix.system")):
        torch.save({ck.MAGIC: 1, "x": obj}, p)
        assert refusal(p) == reason
    # an opcode the weights-only unpickler does not implement (protocol 4's FRAME, 0x95)
    torch.save({ck.MAGIC: 1, "x": "y"}, p, pickle_protocol=4)
    assert refusal(p) == "Unsupported operand 149"
    # a global that torch names only after "Weights only load failed." (no "WeightsUnpickler error:")
    torch.save({ck.MAGIC: 1, "x": os.system}, tmp_path / "s.pt")
    with zipfile.ZipFile(tmp_path / "s.pt") as src, zipfile.ZipFile(p, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = data.replace(b"posix\nsystem\n", b"torch.distributed.tensor\nDTensor\n")
            out.writestr(info, data)
    # importing torch.distributed.tensor (another test may have) puts DTensor on torch's allow list:
    # take the allow list away for this load
    saved = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        assert refusal(p) == "``torch.distributed.tensor`` must be imported to load DTensors"
    finally:
        torch.serialization.add_safe_globals(saved)


def test_the_refusal_reason_in_the_messages_of_older_torch():
    import pickle

    # torch 2.4/2.5 (as printed in a user's traceback): the reason on the line of torch's advice
    old = ("Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, "
           "but it can result in arbitrary code execution. Do it only if you got the file from a trusted source.\n "
           "Please file an issue with the following so that we can make `weights_only=True` compatible with your "
           "use case: WeightsUnpickler error: Unsupported operand 118\n\nCheck the documentation of torch.load to "
           "learn more about types accepted by default with weights_only "
           "https://pytorch.org/docs/stable/generated/torch.load.html.")
    assert ck._unpickling_reason(pickle.UnpicklingError(old)) == "Unsupported operand 118"
    # older torch (1.13's UNSAFE_MESSAGE, as its source writes it): all on one line, a refused class
    # named "Unsupported class"
    older = ("Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely "
             "succeed, but it can result in arbitrary code execution.Do it only if you get the file from a trusted "
             "source. WeightsUnpickler error: ")
    assert ck._unpickling_reason(pickle.UnpicklingError(older + "Unsupported class TTS.tts.configs.XttsConfig")) \
        == "it holds a pickled Python object, TTS.tts.configs.XttsConfig"
    assert ck._unpickling_reason(pickle.UnpicklingError(older + "Unsupported operand 118")) == "Unsupported operand 118"
    # nothing but advice: the exception's name
    assert ck._unpickling_reason(pickle.UnpicklingError("Weights only load failed. " + older)) == "UnpicklingError"


# ---------------------------------------------------------------------------------------------
# what a file is when it is no checkpoint (read before torch.load, whose message would be an opcode)


@pytest.mark.parametrize("content,said", [
    (b"", "an empty file, not a checkpoint"),
    (b"de en\n", "a text file, not a checkpoint (it begins with 'de en')"),
    (b"\n  \n\tx" + b"y" * 39 + b"\n", "a text file, not a checkpoint (it begins with 'x" + "y" * 39 + "')"),  # 40: whole
    (b"x" * 41, "a text file, not a checkpoint (it begins with '" + "x" * 40 + "...')"),  # 41: cut at 40
    (b" \n\t\n", "a text file, not a checkpoint"),  # blank: no first line to show
    # a block of 4096 printable bytes is text, whatever follows it
    (b"a" * 4096 + b"\x00\xff binary", "a text file, not a checkpoint (it begins with '" + "a" * 40 + "...')"),
    # a character cut by the end of the 4096-byte block (here 3 of an emoji's 4 bytes) is still text
    (b"a" * 4093 + "\U0001F600".encode(), "a text file, not a checkpoint (it begins with '" + "a" * 40 + "...')"),
    # not text: invalid UTF-8 before the block's last 3 bytes, or in a short file, or a control character
    (b"a" * 4092 + b"\xffabc", None),
    (b"hello world\xff", None),
    (b"hello\x00world", None),
    (b"PK\x03\x04" + b"a" * 100, None),  # torch.save's zip
    (b"\x80\x02", None),  # a legacy pickle
], ids=["empty", "text", "first-line-of-40", "first-line-of-41", "blank", "text-block-then-binary",
        "char-cut-by-the-block", "invalid-utf8-in-the-block", "invalid-utf8-short", "control-character", "zip",
        "pickle"])
def test_not_torch_file_says_what_a_file_is(tmp_path, content, said):
    p = tmp_path / "f"
    p.write_bytes(content)
    assert ck._not_torch_file(p) == said
    assert ck._not_torch_file(tmp_path / "absent") is None  # torch.load reports a missing file itself


def test_nonfinite_entry_skips_what_cannot_hold_nan_and_reads_a_tied_tensor_once(monkeypatch):
    nan = float("nan")
    bad = torch.tensor([nan, 1.0, float("inf")])
    # integer, boolean and empty tensors are skipped, not the end of the search
    weights = {"i": torch.tensor([1, 2]), "m": torch.tensor([True]), "e": torch.empty(0), "b": bad}
    assert ck.nonfinite_entry(weights) == ("b", 2, 3)
    assert ck.nonfinite_entry({"one": torch.tensor([nan])}) == ("one", 1, 1)  # a single value is read too
    reads = []
    aminmax = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: reads.append(t.shape) or aminmax(t))
    tied = torch.ones(4, 3)
    assert ck.nonfinite_entry({"emb": tied, "out": tied, "view": tied[1:], "x": torch.zeros(2)}) is None
    assert reads == [(4, 3), (3, 3), (2,)]  # the tied entry once; a view of other rows is its own tensor
