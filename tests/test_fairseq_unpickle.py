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


# --- property tests (Hypothesis) ---
# Any bytes, and pickles built opcode by opcode (GLOBAL, STACK_GLOBAL, INST, OBJ, REDUCE, BUILD,
# NEWOBJ, persistent ids, extension codes, the memo, frames, protocol headers, truncations), read
# as a legacy torch file or as the data.pkl of a zip checkpoint: `load` returns a dict or refuses
# in one line, and nothing outside its allowed names is imported or called. The sentinels: a
# module whose every name records being called, a module nobody has (importing it is recorded),
# extension codes that name them, and os.system, eval, exec, subprocess.Popen, pickle.loads and
# importlib.import_module replaced for the call by recorders.

import contextlib  # noqa: E402
import copyreg  # noqa: E402
import importlib  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SENTINEL = "nmtkit_fuzz_sentinel"  # in sys.modules during the tests: its names record every call
ABSENT = "nmtkit_fuzz_absent"  # nowhere: an attempt to import it is recorded
EXT_CODES = {241: (SENTINEL, "boom"), 40000: (ABSENT, "run"), 2**30: ("os", "system")}
CALLS: list[str] = []  # what ran that must not have


def _record(what: str, real=None):
    """A recorder standing for `what`; with `real` (eval, exec), one that lets the import
    machinery's own calls on code objects through and records only source text."""
    def called(*args, **kwargs):
        if real is not None and args and not isinstance(args[0], (str, bytes)):
            return real(*args, **kwargs)
        CALLS.append(what)
        raise AssertionError(f"{what} was called")
    return called


class _Boom:
    """A class of the sentinel module: created, called, built or reduced, it records it."""

    def __new__(cls, *args, **kwargs):
        CALLS.append(f"{SENTINEL}.Boom")
        return super().__new__(cls)

    def __setstate__(self, state):
        CALLS.append(f"{SENTINEL}.Boom.__setstate__")


def _sentinel_attribute(name: str):
    """Any other name of the sentinel module: a recorder (dunder names, which tools look up on
    every module, are missing as on any module)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _record(f"{SENTINEL}.{name}")


@pytest.fixture(scope="module")
def sentinels():
    """The sentinel module and the extension codes naming the sentinels (removed afterwards)."""
    mod = types.ModuleType(SENTINEL)
    mod.boom, mod.Boom = _record(f"{SENTINEL}.boom"), _Boom
    mod.__getattr__ = _sentinel_attribute
    sys.modules[SENTINEL] = mod
    for code, (module, name) in EXT_CODES.items():
        copyreg.add_extension(module, name, code)
    yield
    for code, (module, name) in EXT_CODES.items():
        copyreg.remove_extension(module, name, code)
    del sys.modules[SENTINEL]


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Records any attempt to find a module whose top package the pickles name and nmtkit must
    never import (the finder runs for modules not imported yet)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in FOREIGN:
            CALLS.append(f"import {fullname}")
        return None


# top packages a pickle may name that loading must never import (torch itself imports os, sys,
# typing, argparse and collections while loading, so those are watched by their calls)
FOREIGN = {SENTINEL, ABSENT, "fairseq", "omegaconf", "numpy", "subprocess", "pickle", "shutil", "runpy",
           "webbrowser", "pty", "posix", "nt", "importlib"}


@contextlib.contextmanager
def _watched():
    """Record, for the duration, every import of a FOREIGN package and every call of a function
    that runs code or commands."""
    real_import, real_import_module = builtins.__import__, importlib.import_module

    def watched_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.split(".")[0] in FOREIGN:
            CALLS.append(f"import {name}")
        return real_import(name, globals, locals, fromlist, level)

    def watched_import_module(name, package=None):
        if name.split(".")[0] in FOREIGN:
            CALLS.append(f"importlib.import_module {name}")
        return real_import_module(name, package)

    finder = _ImportWatch()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builtins, "__import__", watched_import)
        mp.setattr(importlib, "import_module", watched_import_module)
        for name in ("eval", "exec"):
            mp.setattr(builtins, name, _record(f"builtins.{name}", getattr(builtins, name)))
        for owner, name in ((os, "system"), (os, "popen"), (os, "execv"), (os, "execve"), (os, "spawnv"),
                            (builtins, "breakpoint"),
                            (subprocess, "Popen"), (subprocess, "run"), (pickle, "loads"), (pickle, "load"),
                            (torch.storage, "_load_from_bytes")):
            mp.setattr(owner, name, _record(f"{owner.__name__}.{name}"))
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)


def _load_watched(path: Path):
    """`unpickle.load(path)` under the watch: the dict, or the UserError's message (one line,
    naming the file). Anything else fails the test, as does any recorded import or call."""
    CALLS.clear()
    try:
        with _watched():
            try:
                out = unpickle.load(path)
            except UserError as e:
                out = str(e)
    finally:
        assert not CALLS, CALLS
    if isinstance(out, str):
        assert len(out.splitlines()) == 1 and str(path) in out, out
        event(out[len(str(path)):].split("(")[0][:40])
    else:
        assert isinstance(out, dict)
        try:  # the records as plain data, as import-fairseq reads the config
            unpickle.plain(out)
        except UserError as e:
            assert len(str(e).splitlines()) == 1, str(e)
        event("loaded")
    return out


# ---- pickles, opcode by opcode ----

_NAMES = [
    (SENTINEL, "boom"), (SENTINEL, "Boom"), (SENTINEL, "anything"), (ABSENT, "run"), ("os", "system"),
    ("posix", "system"), ("nt", "system"), ("__builtin__", "eval"), ("builtins", "exec"), ("builtins", "getattr"),
    ("builtins", "__import__"), ("builtins", "bytearray"), ("subprocess", "Popen"), ("importlib", "import_module"),
    ("pickle", "loads"), ("torch", "load"), ("torch.storage", "_load_from_bytes"), ("numpy", "load"),
    ("copyreg", "_reconstructor"), ("functools", "partial"), ("runpy", "run_path"),
    # names a fairseq checkpoint holds (stand-ins), and torch's own
    ("argparse", "Namespace"), ("fairseq.dataclass.constants", "DDP_BACKEND_CHOICES"), ("fairseq", "x"),
    ("omegaconf.dictconfig", "DictConfig"), ("omegaconf.nodes", "AnyNode"), ("typing", "Any"), ("enum", "Enum"),
    ("collections", "defaultdict"), ("collections", "OrderedDict"), ("__builtin__", "set"), ("builtins", "int"),
    ("_codecs", "encode"), ("torch._utils", "_rebuild_tensor_v2"), ("torch", "FloatStorage"), ("torch", "Tensor"),
    ("torch.nn.parameter", "Parameter"), ("numpy.core.multiarray", "_reconstruct"), ("pathlib", "PosixPath"),
]
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_NAME = st.one_of(st.sampled_from(_NAMES), st.tuples(_TEXT, _TEXT))
_INT = st.one_of(st.integers(-3, 300), st.integers(-(2**31), 2**31 - 1), st.integers(-(2**70), 2**70))


def _short(op: bytes, data: bytes) -> bytes:
    return op + bytes([len(data)]) + data


def _str_op(s: str, kind: int) -> bytes:
    """`s` pushed by one of the string opcodes."""
    raw = s.encode("utf-8")
    return [
        lambda: _short(b"\x8c", raw[:255]),  # SHORT_BINUNICODE
        lambda: b"X" + struct.pack("<I", len(raw)) + raw,  # BINUNICODE
        lambda: b"\x8d" + struct.pack("<Q", len(raw)) + raw,  # BINUNICODE8
        lambda: _short(b"U", raw[:255]),  # SHORT_BINSTRING
        lambda: b"V" + s.encode("raw-unicode-escape").replace(b"\n", b"") + b"\n",  # UNICODE
    ][kind]()


def _int_op(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return _short(b"\x8a", data)  # LONG1


def _global_op(name: tuple[str, str], how: int) -> bytes:
    """A reference to `module.name`: GLOBAL, INST's argument, or STACK_GLOBAL (strings directly, or
    through the memo)."""
    module, attr = (n.replace("\n", "") for n in name)
    if how == 0:
        return b"c" + module.encode() + b"\n" + attr.encode() + b"\n"
    if how == 1:
        return b"(i" + module.encode() + b"\n" + attr.encode() + b"\n"  # INST of no arguments
    if how == 2:
        return _str_op(name[0], 0) + _str_op(name[1], 0) + b"\x93"
    return _str_op(name[0], 0) + b"\x94" + _str_op(name[1], 1) + b"q\x07" + b"0h\x07" + b"\x93"  # memo games


_OP = st.one_of(
    st.builds(_global_op, _NAME, st.integers(0, 3)),
    st.builds(_str_op, _TEXT, st.integers(0, 4)),
    st.builds(_int_op, _INT),
    st.builds(lambda f: b"G" + struct.pack(">d", f), st.floats()),
    st.sampled_from([
        b"R", b"b", b"o", b"\x81", b"\x92", b"Q", b"(", b")", b"]", b"}", b"\x8f", b"t", b"\x85", b"\x86",
        b"\x87", b"l", b"d", b"s", b"u", b"a", b"e", b"\x90", b"\x91", b"0", b"1", b"2", b"N", b"\x88", b"\x89",
        b"\x94", b"\x97", b"\x98", b".", b"(\x85R", b")\x81", b"}b", b")R",
        # EXT1/2/4: the sentinels, and a code no one has
        b"\x82\xf1", b"\x83\x40\x9c", b"\x84\x00\x00\x00\x40", b"\x82\x01",
        b"Pstorage\n", b"P0\n", b"(X\x07\x00\x00\x00storageK\x00X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ",
        b"C\x03abc", b"B\x01\x00\x00\x00a", b"\x8e\x01\x00\x00\x00\x00\x00\x00\x00a", b"\x96\x00" + b"\x00" * 7,
        b"\x8e" + b"\xff" * 8, b"X\xff\xff\xff\x7f", b"\x8b\xff\xff\xff\x7f",  # lengths beyond the data
        b"S'a'\n", b"T\x01\x00\x00\x00a", b"F1.5\n", b"I01\n", b"L5L\n",
    ]),
    st.builds(lambda op, n: op + bytes([n]), st.sampled_from([b"q", b"h", b"\x80"]), st.integers(0, 255)),
    st.builds(lambda op, n: op + struct.pack("<I", n), st.sampled_from([b"r", b"j"]), st.integers(0, 2**32 - 1)),
    st.builds(lambda op, n: op + str(n).encode() + b"\n", st.sampled_from([b"p", b"g"]), st.integers(0, 20)),
    st.binary(max_size=6),
)


def _call(name, how, args: list[bytes], kind: int, state: bytes) -> bytes:
    """One object built from `module.name` and `args`: REDUCE, NEWOBJ, OBJ or INST, then maybe a
    BUILD with `state`."""
    tup = b"(" + b"".join(args) + b"t"
    if kind == 0:
        out = _global_op(name, how if how != 1 else 0) + tup + b"R"
    elif kind == 1:
        out = _global_op(name, how if how != 1 else 0) + tup + b"\x81"
    elif kind == 2:
        out = b"(" + _global_op(name, how if how != 1 else 0) + b"".join(args) + b"o"
    else:
        out = b"(" + b"".join(args) + _global_op(name, 1)[1:]
    return out + (state + b"b" if state else b"")


_SCALAR = st.one_of(
    st.builds(_int_op, _INT), st.builds(_str_op, _TEXT, st.integers(0, 4)), st.sampled_from([b"N", b"\x88", b"\x89"]),
    st.builds(lambda f: b"G" + struct.pack(">d", f), st.floats()),
    st.sampled_from([b"\x82\xf1)R", b"\x83\x40\x9c)R", b"\x84\x00\x00\x00\x40X\x04\x00\x00\x00true\x85R",
                     b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQ"]),
)


# BUILD states of the (dict, slots) form, the first item of the wrong type among them
_SLOT_STATES = st.sampled_from([b"(]K\x01a}t", b"(K\x05}t", b"(N}X\x01\x00\x00\x00aK\x01st", b"(}]t"])


def _values(children):
    return st.one_of(
        st.builds(lambda xs: b"(" + b"".join(xs) + b"l", st.lists(children, max_size=3)),
        st.builds(lambda xs: b"(" + b"".join(xs) + b"t", st.lists(children, max_size=3)),
        st.builds(lambda kv: b"}(" + b"".join(k + v for k, v in kv) + b"u",
                  st.lists(st.tuples(st.builds(_str_op, _TEXT, st.just(1)), children), max_size=3)),
        st.builds(_call, _NAME, st.integers(0, 3), st.lists(children, max_size=3), st.integers(0, 3),
                  st.one_of(st.just(b""), children, _SLOT_STATES)),
    )


_VALUE = st.recursive(_SCALAR, _values, max_leaves=12)


@st.composite
def checkpoints(draw) -> bytes:
    """A well-formed protocol 2 pickle of a dict of values (calls of any name among them)."""
    items = draw(st.lists(st.tuples(st.sampled_from(["model", "args", "cfg", "extra_state", "x"]), _VALUE), max_size=4))
    return b"\x80\x02}(" + b"".join(_str_op(k, 1) + v for k, v in items) + b"u."


@st.composite
def mutated(draw, base) -> bytes:
    """`base` with a few opcodes inserted, bytes deleted, or cut short."""
    data = draw(base)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        if draw(st.booleans()):
            data = data[:at] + draw(_OP) + data[at:]
        else:
            data = data[:at] + data[at + draw(st.integers(1, 4)):]
    return data


@st.composite
def pickles(draw) -> bytes:
    """A protocol 2..5 header (or none), opcodes, maybe in nested frames, a STOP, maybe cut short."""
    ops = draw(st.lists(_OP, max_size=24))
    body = b"".join(ops)
    if draw(st.booleans()):  # frames: a real one around all, or one claiming more than there is
        body = b"\x95" + struct.pack("<Q", draw(st.sampled_from([len(body), len(body) + 9, 2**63]))) + body
    proto = draw(st.sampled_from([b"", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"]))
    data = proto + body + b"."
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_unpickle")


def _legacy_file(data: bytes) -> bytes:
    """`data` as the object of a legacy torch.save file: magic number, protocol version and system
    information before it, the (empty) storage keys after."""
    buf = io.BytesIO()
    torch.save({}, buf, _use_new_zipfile_serialization=False)
    head = buf.getvalue()
    return head[: head.rindex(b"\x80\x02}q\x00.")] + data + b"\x80\x02]q\x00."


@pytest.mark.fuzz
@given(data=st.one_of(checkpoints(), mutated(checkpoints()), pickles(), st.binary(max_size=200)),
       container=st.sampled_from(["zip", "legacy", "raw"]))
@example(data=b"\x80\x02}X\x01\x00\x00\x00a" + _global_op((SENTINEL, "boom"), 0) + b")Rs.", container="zip")
@example(data=b"\x80\x02}X\x01\x00\x00\x00a\x82\xf1)Rs.", container="zip")  # EXT1 naming the sentinel
@example(data=b"\x80\x04" + _global_op((SENTINEL, "Boom"), 2) + b")R.", container="zip")
@example(data=b"\x80\x02" + _global_op((ABSENT, "run"), 1) + b".", container="legacy")
@example(data=b"\x80\x02}X\x01\x00\x00\x00a" + _global_op(("fairseq.x", "Y"), 0) + b")\x81(]K\x01a}tbs.",
         container="zip")  # a (list, dict) state: plain() raised a TypeError
@example(data=b"\x80\x02}X\x01\x00\x00\x00a" + _global_op((SENTINEL, "boom"), 0) + b")Rs.", container="legacy")
@example(data=b"\x80\x02\x8e" + struct.pack("<Q", 2**40) + b"x", container="raw")  # MemoryError: a traceback
@example(data=_str_op(f"{SENTINEL}\nx", 0) + _str_op("boom", 0) + b"\x93.", container="zip")  # a line break in the name
@example(data=b"\x80\x02}X\x01\x00\x00\x00a" + _global_op(("builtins", "bytearray"), 0) + _int_op(2**33)
         + b"\x85Rs.", container="zip")  # torch's loader allocates 8 GiB for 40 bytes
def test_any_pickle_is_loaded_or_refused_and_runs_nothing(sentinels, fuzz_dir, data, container):
    path = fuzz_dir / f"{container}.pt"
    if container == "zip":
        torch_file(path, data, {"0": b"\0" * 4})
    else:
        path.write_bytes(_legacy_file(data) if container == "legacy" else data)
    _load_watched(path)


@pytest.mark.parametrize("payload", [
    _global_op((SENTINEL, "boom"), 0) + b")R.", _global_op((SENTINEL, "Boom"), 1), b"\x82\xf1)R.",
    _global_op((ABSENT, "run"), 0) + b")R.",
    b"\x80\x02" + _global_op(("posix", "system"), 0) + b"X\x01\x00\x00\x00x\x85R.",
    b"\x80\x02" + _global_op(("builtins", "exec"), 0) + b"X\x01\x00\x00\x001\x85R.",
])
def test_the_sentinels_see_what_plain_pickle_runs(sentinels, payload):
    """Guard of the property: Python's own unpickler on the same bytes trips the watch."""
    CALLS.clear()
    with _watched(), contextlib.suppress(Exception):
        pickle.Unpickler(io.BytesIO(payload)).load()
    assert CALLS
    CALLS.clear()


# ---- what the properties found (each one a traceback, a message over two lines, or a memory bomb) ----


def test_a_length_beyond_the_file_is_refused_without_allocating_it(tmp_path):
    """A legacy file whose BINBYTES8 claims 2**40 bytes: the listing read them (MemoryError)."""
    path = tmp_path / "x.pt"
    path.write_bytes(b"\x80\x02\x8e" + struct.pack("<Q", 2**40) + b"x")
    with pytest.raises(UserError, match=r"cannot read fairseq checkpoint .*expected 1099511627776 bytes"):
        unpickle.load(path)


def test_a_name_with_a_line_break_is_quoted_on_one_line(tmp_path):
    path = torch_file(tmp_path / "x.pt", _str_op("os\nx", 0) + _str_op("system", 0) + b"\x93.")
    with pytest.raises(UserError) as e:
        unpickle.load(path)
    assert str(e.value) == (f"{path}: refused: the checkpoint names 'os\\nx.system', which is not data of a "
                            "fairseq checkpoint (nothing from the file was run)")


def test_a_bytearray_is_refused_before_it_is_allocated(tmp_path):
    """torch's weights-only loader allows bytearray(n): 40 bytes asked for 8 GiB, zero-filled."""
    body = b"\x80\x02}X\x01\x00\x00\x00a" + _global_op(("builtins", "bytearray"), 0) + _int_op(2**33) + b"\x85Rs."
    with pytest.raises(UserError, match=r"refused: the checkpoint names builtins\.bytearray"):
        unpickle.load(torch_file(tmp_path / "x.pt", body))


def test_the_weights_only_loaders_reason_is_the_message(tmp_path):
    """Its first line is advice to load the file unsafely; the reason comes lines later."""
    path = torch_file(tmp_path / "x.pt", b"\x80\x02}\x94.")
    with pytest.raises(UserError) as e:
        unpickle.load(path)
    assert str(e.value) == (f"{path}: refused by the weights-only loader: Unsupported operand 148 "
                            "(nothing from the file was run)")


@pytest.mark.parametrize("record", [b")\x81(]K\x01a}tb", b")\x81"])
def test_a_record_made_without_arguments_or_state_is_its_name(tmp_path, record):
    """NEWOBJ then BUILD's (dict, slots) state with a list where the dict goes, or NEWOBJ alone:
    plain() raised a TypeError, an AttributeError (NEWOBJ runs no __init__)."""
    body = b"\x80\x02}X\x01\x00\x00\x00a" + _global_op(("fairseq.x", "Y"), 0) + record + b"s."
    assert unpickle.plain(unpickle.load(torch_file(tmp_path / "x.pt", body))) == {"a": "fairseq.x.Y"}
