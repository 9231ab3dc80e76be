"""Reading a fairseq checkpoint without running anything it holds.

Why not `torch.load(weights_only=True)` alone: a fairseq checkpoint pickles an
`argparse.Namespace` (its `args`), OmegaConf containers and fairseq's own classes (enums, meters
in `extra_state`), which the weights-only loader refuses. Why not a plain `torch.load`: it
imports and calls whatever the file names, so a crafted checkpoint runs code (`os.system`).

How: the pickle's GLOBAL references are listed first by reading its opcodes (`pickletools`,
nothing is built). A name outside what fairseq checkpoints hold (the `ALLOWED_*` lists below) is
refused in one line before anything is unpickled. The names that are allowed are then mapped,
through torch's own `safe_globals`, to inert stand-ins (`Record`): a class of this module that
only stores the arguments and state the file gives it. fairseq, omegaconf and argparse are never
imported and no function of theirs is called. torch's weights-only unpickler does the rest
(tensors and storages through its own allowlist), and refuses any name the listing missed.
`plain` turns the records into dicts, lists and numbers.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import pickletools
import re
import zipfile
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from pathlib import Path
from typing import Any

from nmtkit.errors import UserError, first_line

# Whole modules whose every name is data in a fairseq checkpoint: configuration and logging
# classes (dataclass configs, ChoiceEnum enums, meters), OmegaConf's containers and nodes, and
# typing's markers (OmegaConf records `typing.Any` as a node's type). Mapped to records, never
# imported.
ALLOWED_PREFIXES = ("fairseq.", "omegaconf.", "typing.")
# Single names that are data too.
ALLOWED_NAMES = frozenset({
    "argparse.Namespace",
    "enum.Enum",
    "collections.defaultdict",
    "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.Path",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
    # type objects used as OmegaConf metadata (a node's `ref_type`/`object_type`), never called
    "builtins.int", "builtins.float", "builtins.str", "builtins.bool", "builtins.dict", "builtins.list",
    "builtins.tuple", "builtins.object", "builtins.NoneType", "builtins.frozenset", "builtins.bytes",
})


class Record:
    """An inert stand-in for one class or function a checkpoint names.

    Called (pickle's REDUCE: an enum's value, a set's items) it stores the arguments; created
    by `__new__` (NEWOBJ) and given a state (BUILD) it stores the state. It has no behaviour.
    """

    qualname = "?"
    args: tuple = ()  # created by NEWOBJ, `__init__` is not run

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.qualname} record>"


def _record_class(full_name: str) -> type:
    """A fresh Record subclass standing for `full_name` (torch's allowlist maps names to objects)."""
    return type("Record", (Record,), {"qualname": full_name, "__module__": __name__})


# Names torch's weights-only loader allows that no fairseq checkpoint holds and that allocate what
# a number in the file asks for, filled: `bytearray(2**34)` in a file of 40 bytes takes 16 GiB.
REFUSED_TORCH_NAMES = frozenset({"builtins.bytearray"})


def allowed(full_name: str) -> bool:
    return full_name in ALLOWED_NAMES or full_name.startswith(ALLOWED_PREFIXES)


# ---- listing the names a pickle refers to, without unpickling it ---------------------------------


def _globals_of(data: bytes | mmap.mmap, count: int = 1) -> tuple[list[str], int]:
    """The GLOBAL / STACK_GLOBAL names of the next `count` pickles in `data`, and where they end.

    STACK_GLOBAL takes its module and name from the two strings pushed before it (directly or
    through the memo); they are tracked as far as strings go. What cannot be resolved is left
    out: torch's unpickler refuses any name that has no stand-in.
    """
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    names: list[str] = []
    for _ in range(count):
        strings: list[str] = []  # the strings pushed, last two matter for STACK_GLOBAL
        memo: dict[int, str] = {}
        memoized = 0  # MEMOIZE numbers every object it stores, strings or not
        for op, arg, _pos in pickletools.genops(stream):
            if op.name == "GLOBAL":
                names.append(_python3_name(*arg.split(" ", 1)))
            elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8",
                             "SHORT_BINSTRING", "BINSTRING", "STRING"):
                strings.append(arg if isinstance(arg, str) else str(arg))
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
                memo[int(arg)] = strings[-1]
            elif op.name == "MEMOIZE":
                memo[memoized] = strings[-1] if strings else ""
                memoized += 1
            elif op.name in ("BINGET", "LONG_BINGET", "GET") and int(arg) in memo:
                strings.append(memo[int(arg)])
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(_python3_name(strings[-2], strings[-1]))
    return names, stream.tell()


def _python3_name(module: str, name: str) -> str:
    """`module.name` as Python 3 (and torch's unpickler) reads it: protocol 2 writes `__builtin__.eval`."""
    if (module, name) in NAME_MAPPING:
        module, name = NAME_MAPPING[(module, name)]
    elif module in IMPORT_MAPPING:
        module = IMPORT_MAPPING[module]
    return f"{module}.{name}"


def _pickled_globals(path: Path) -> list[str]:
    """Every global the checkpoint's pickles name (zip format: data.pkl; legacy: the first five)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            pkl = [n for n in zf.namelist() if n.endswith("data.pkl")]
            if len(pkl) != 1:
                raise UserError(f"{path}: not a torch checkpoint (expected one data.pkl in the archive)")
            return _globals_of(zf.read(pkl[0]))[0]
    # legacy torch.save: magic, protocol, sys info, the object, storage keys. Mapped, not read: a
    # length in the file (BINBYTES8) then asks for no more than the file holds.
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return _globals_of(mm, count=5)[0]


def _printable(name: str) -> str:
    """A name from the file as one line: quoted with escapes when it holds a line break or another
    control character (STACK_GLOBAL's strings may hold anything)."""
    return name if name.isprintable() else repr(name)


def _message(e: BaseException) -> str:
    text = str(e).strip()
    m = re.search(r"GLOBAL (\S+)", text)
    if m:
        return f"it names {m.group(1)}"
    # torch's weights-only loader opens with advice (load the file unsafely) and gives the
    # reason lines below
    m = re.search(r"WeightsUnpickler error:\s*(\S.*)", text)
    return m.group(1).splitlines()[0].strip() if m else first_line(e)


def load(path: str | os.PathLike) -> dict:
    """The checkpoint's contents with fairseq's classes as `Record`s (tensors stay tensors).

    UserError (one line, naming the file and the global) for anything that is not a fairseq
    checkpoint's data; nothing from the file is called.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise UserError(f"fairseq checkpoint not found: {path}")
    try:
        names = _pickled_globals(path)
    except (pickle.UnpicklingError, ValueError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise UserError(f"{path}: cannot read fairseq checkpoint (corrupt or not a torch file?): "
                        f"{_message(e)}") from None
    torch_allowed = set(torch._weights_only_unpickler._get_allowed_globals()) - REFUSED_TORCH_NAMES
    stand_ins = {}
    for name in names:
        if name in torch_allowed:
            continue
        if not allowed(name):
            raise UserError(f"{path}: refused: the checkpoint names {_printable(name)}, which is not data of a "
                            "fairseq checkpoint (nothing from the file was run)")
        stand_ins.setdefault(name, _record_class(name))
    try:
        with torch.serialization.safe_globals([(cls, name) for name, cls in stand_ins.items()]):
            # mapped (zip format): the optimizer state, often two thirds of the file, is never read
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as e:
        raise UserError(f"{path}: refused by the weights-only loader: {_message(e)} "
                        "(nothing from the file was run)") from None
    except Exception as e:  # noqa: BLE001 - junk bytes make the unpickler fail in many ways
        raise UserError(f"{path}: cannot read fairseq checkpoint (corrupt or truncated file?): "
                        f"{_message(e)}") from None
    if not isinstance(state, dict):
        raise UserError(f"{path}: not a fairseq checkpoint (it holds {type(state).__name__}, not a dict)")
    return state


# ---- records -> plain data ---------------------------------------------------------------------


def plain(obj: Any, depth: int = 0) -> Any:
    """`obj` with its records turned into plain data: a Namespace or dataclass into a dict of its
    attributes, an OmegaConf container into a dict or list of its values, an enum into its value.
    Tensors and numbers are returned as they are."""
    if depth > 64:
        raise UserError("fairseq checkpoint: configuration nested more than 64 levels deep")
    if isinstance(obj, dict):
        return {k: plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v, depth + 1) for v in obj]
    if not isinstance(obj, Record):
        return obj
    state = getattr(obj, "state", None)
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], (dict, type(None))) \
            and isinstance(state[1], dict):  # (dict or None, slots); any other tuple is no state
        state = {**(state[0] or {}), **state[1]}
    if isinstance(state, dict):
        if "_content" in state:  # an OmegaConf container or node: its content is what counts
            return plain(state["_content"], depth + 1)
        if "_val" in state:
            return plain(state["_val"], depth + 1)
        return plain(state, depth + 1)
    if obj.args:  # an enum member or a called type: its value
        return plain(obj.args[0], depth + 1) if len(obj.args) == 1 else plain(list(obj.args), depth + 1)
    return obj.qualname
