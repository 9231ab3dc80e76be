"""The restricted unpickler of fairseq checkpoints: crafted payloads are refused in one line and
run nothing; what fairseq checkpoints hold (Namespace, OmegaConf containers, enums, meters,
tensors) comes back as plain data."""

from __future__ import annotations

import argparse
import builtins
import collections
import io
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from nmtkit.backends.fairseq import unpickle
from nmtkit.errors import UserError

GOLDEN = Path(__file__).parent / "golden" / "fairseq"


def torch_file(path: Path, data_pkl: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A torch zip checkpoint whose data.pkl is `data_pkl` (and raw storages `archive/data/KEY`)."""
    buf = io.BytesIO()
    torch.save({}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for name in src.namelist():
            out.writestr(name, data_pkl if name.endswith("data.pkl") else src.read(name))
        for key, raw in (storages or {}).items():
            out.writestr(f"archive/data/{key}", raw)
    return path


class Call:
    """Pickles as a call of `func(*args)` (what a crafted checkpoint holds)."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def dumps(obj, persistent=None) -> bytes:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    if persistent is not None:
        p.persistent_id = persistent
    p.dump(obj)
    return buf.getvalue()


def payloads(marker: Path) -> dict[str, object]:
    shell = f"touch {marker}"
    py = f"__import__('os').system('touch {marker}')"
    return {
        "os.system in the config": {"cfg": {"model": {"arch": Call(os.system, shell)}}, "model": {}},
        "eval in the config": {"args": None, "cfg": {"task": [Call(eval, py)]}, "model": {}},
        "builtins.exec in the config": {"cfg": {"common": Call(builtins.exec, py)}, "model": {}},
        "os.system in the optimizer state": {
            "model": {}, "last_optimizer_state": {"state": {0: {"exp_avg": Call(os.system, shell)}}}},
        "eval as a tensor's rebuild argument": {
            "model": {"w": Call(torch._utils._rebuild_tensor_v2, Call(eval, py), 0, (1,), (1,), False,
                                collections.OrderedDict())}},
    }


@pytest.mark.parametrize("case", list(payloads(Path("x"))))
def test_payloads_are_refused_and_run_nothing(tmp_path, case):
    marker = tmp_path / "ran"
    path = torch_file(tmp_path / "evil.pt", dumps(payloads(marker)[case]))
    with pytest.raises(UserError) as e:
        unpickle.load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "refused" in msg
    assert any(name in msg for name in ("posix.system", "builtins.eval", "builtins.exec")), msg
    assert not marker.exists()


def test_payload_as_a_tensors_storage_is_refused(tmp_path):
    """The storage slot of a tensor (torch's persistent id) holding a call of os.system."""
    marker = tmp_path / "ran"
    tensor = torch.zeros(1)

    def persistent(obj):
        if isinstance(obj, (torch.UntypedStorage, torch.storage.TypedStorage)):
            return ("storage", Call(os.system, f"touch {marker}"), "0", "cpu", 4)
        return None

    path = torch_file(tmp_path / "evil.pt", dumps({"model": {"w": tensor}}, persistent), {"0": b"\0" * 4})
    with pytest.raises(UserError, match=r"refused.*posix\.system") as e:
        unpickle.load(path)
    assert "\n" not in str(e.value)
    assert not marker.exists()


def _global(name: str) -> bytes:
    module, _, attr = name.rpartition(".")
    return b"c" + module.encode() + b"\n" + attr.encode() + b"\n"


def test_fairseq_classes_become_plain_data(tmp_path):
    """A Namespace, an enum member of fairseq's, an OmegaConf DictConfig with a node, and a meter
    (pickle opcodes written by hand: the classes are named, never imported)."""
    ns = argparse.Namespace(arch="transformer", encoder_layers=2)
    # {"args": Namespace, "enum": ChoiceEnum("c10d"), "cfg": DictConfig{_content: {"lr": AnyNode{_val: 0.5}}},
    #  "meter": AverageMeter{...}}
    body = (
        b"\x80\x02}q\x00(X\x04\x00\x00\x00argsq\x01" + pickle.dumps(ns, protocol=2)[2:-1]
        + b"X\x04\x00\x00\x00enum" + _global("fairseq.dataclass.constants.DDP_BACKEND_CHOICES")
        + b"X\x04\x00\x00\x00c10d\x85R"
        + b"X\x03\x00\x00\x00cfg" + _global("omegaconf.dictconfig.DictConfig") + b")\x81}"
        + b"X\x08\x00\x00\x00_content}X\x02\x00\x00\x00lr" + _global("omegaconf.nodes.AnyNode") + b")\x81}"
        + b"X\x04\x00\x00\x00_valG?\xe0\x00\x00\x00\x00\x00\x00sbssb"
        + b"X\x05\x00\x00\x00meter" + _global("fairseq.logging.meters.AverageMeter") + b")\x81}"
        + b"X\x03\x00\x00\x00sumK\x03sb"
        + b"u."
    )
    state = unpickle.load(torch_file(tmp_path / "ok.pt", body))
    assert unpickle.plain(state) == {"args": {"arch": "transformer", "encoder_layers": 2}, "enum": "c10d",
                                     "cfg": {"lr": 0.5}, "meter": {"sum": 3}}


def test_a_fairseq_0_12_checkpoint_loads():
    """The fixture written by fairseq-train 0.12.2: config, weights and optimizer state."""
    state = unpickle.load(GOLDEN / "a" / "checkpoint.pt")
    cfg = unpickle.plain(state["cfg"])
    assert cfg["model"]["arch"] == "transformer" and cfg["model"]["share_all_embeddings"] is True
    w = state["model"]["encoder.layers.0.self_attn.q_proj.weight"]
    assert isinstance(w, torch.Tensor) and tuple(w.shape) == (32, 32)
    assert state["extra_state"]["train_iterator"]["epoch"] >= 1


def test_unknown_class_is_refused(tmp_path):
    body = b"\x80\x02}X\x01\x00\x00\x00a" + _global("subprocess.Popen") + b")\x81s."
    with pytest.raises(UserError, match=r"refused: the checkpoint names subprocess\.Popen"):
        unpickle.load(torch_file(tmp_path / "x.pt", body))


def test_not_a_checkpoint(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a pickle at all")
    with pytest.raises(UserError, match="cannot read fairseq checkpoint"):
        unpickle.load(junk)
    with pytest.raises(UserError, match="not found"):
        unpickle.load(tmp_path / "missing.pt")


def test_legacy_torch_format(tmp_path):
    """torch.save's format before 1.6 (the published 2018 WMT models): a sequence of pickles."""
    marker = tmp_path / "ran"
    state = {"args": argparse.Namespace(arch="transformer_vaswani_wmt_en_de_big", source_lang="en"),
             "model": {"w": torch.ones(2)}}
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    loaded = unpickle.load(tmp_path / "old.pt")
    assert unpickle.plain(loaded["args"]) == {"arch": "transformer_vaswani_wmt_en_de_big", "source_lang": "en"}
    assert torch.equal(loaded["model"]["w"], torch.ones(2))
    state["model"]["x"] = Call(os.system, f"touch {marker}")
    torch.save(state, tmp_path / "evil.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(UserError, match=r"refused: the checkpoint names posix\.system"):
        unpickle.load(tmp_path / "evil.pt")
    assert not marker.exists()


def test_an_omegaconf_config_pickled_by_omegaconf():
    """tests/golden/fairseq/omegaconf_cfg.pt: a DictConfig written by omegaconf 2.0.6 itself."""
    state = unpickle.load(GOLDEN / "omegaconf_cfg.pt")
    assert unpickle.plain(state["cfg"]) == {
        "model": {"_name": "transformer", "arch": "transformer", "dropout": 0.3, "share_all_embeddings": True,
                  "layers": [1, 2]},
        "task": {"source_lang": "de", "target_lang": None}}
