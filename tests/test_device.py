"""The one device resolver (nmtkit/device.py): the same accepted values for train and generate."""

import pytest
import torch

from nmtkit.device import DeviceRequest, parse_device, resolve_device
from nmtkit.errors import UserError


def test_auto_and_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    want = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == want


@pytest.mark.parametrize("name, message", [
    ("tpu", "--device: unknown device 'tpu'"),
    ("meta", "--device: unsupported device type 'meta'"),
    ("cpu:01", "--device: unknown device 'cpu:01'"),
    ("cpu:99999999999999999999", "--device: unknown device 'cpu:99999999999999999999'"),
    ("cuda:x", "--device: unknown device 'cuda:x'"),
    ("AUTO", "--device: unknown device 'AUTO'"),
    ("auto:0", "--device: unknown device 'auto:0'"),
])
def test_unknown_devices_name_the_flag(name, message):
    with pytest.raises(UserError, match="^" + message):
        resolve_device(name)
    with pytest.raises(UserError, match="^" + message):  # the same words without torch (other engines)
        parse_device(name)


def test_the_device_parser_reads_kind_and_index_without_torch():
    import subprocess
    import sys

    assert parse_device("cuda:3") == DeviceRequest("cuda:3", "cuda", 3)
    assert parse_device("cuda") == DeviceRequest("cuda", "cuda", None)
    assert parse_device("auto") == DeviceRequest("auto", "auto", None)
    assert resolve_device("cpu:0") == torch.device("cpu", 0)
    code = "import sys, nmtkit.device as d; d.parse_device('cuda:1'); assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_absent_cuda_is_refused(name):
    with pytest.raises(UserError, match=rf"^--device {name}: CUDA is not available"):
        resolve_device(name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_follows_local_rank_and_explicit_index_wins():
    n = torch.cuda.device_count()
    assert resolve_device("cuda", local_rank=n - 1) == torch.device("cuda", n - 1)
    assert resolve_device("cuda:0", local_rank=n - 1) == torch.device("cuda", 0)
    with pytest.raises(UserError, match=f"LOCAL_RANK {n}: only {n} CUDA"):
        resolve_device("cuda", local_rank=n)


# ---- keep_freed_cpu_memory: glibc malloc keeps freed blocks for the next decoding step ----------

_REUSE = """
import ctypes, sys, torch
from nmtkit.device import keep_freed_cpu_memory
tuned = keep_freed_cpu_memory() if sys.argv[1] == "tune" else False
again = keep_freed_cpu_memory() if sys.argv[1] == "tune" else False  # made once: the same answer
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena ordblks smblks hblks hblkhd usmblks fsmblks "
                                               "uordblks fordblks keepcost").split()]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
before = mallinfo2().hblkhd  # bytes in blocks mapped on their own (munmapped when freed)
a = torch.ones(4 << 20)  # a 16 MiB block (a step's logits)
mapped = mallinfo2().hblkhd - before
del a
kept = mallinfo2().fordblks  # free bytes the heap keeps for the next allocations
assert tuned == again, (tuned, again)
print(tuned, mapped >> 20, kept >> 20)
"""


def _glibc() -> bool:
    import ctypes
    import sys

    try:
        return sys.platform.startswith("linux") and bool(ctypes.CDLL(None).gnu_get_libc_version)
    except (OSError, AttributeError):
        return False


def _freed_block(mode: str, env_extra: dict | None = None) -> tuple[str, int, int]:
    """(tuned?, MiB newly mapped on their own for a 16 MiB tensor, MiB of free heap kept once it is freed)"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES", "NMTKIT_KEEP_FREED_MEMORY")}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[1]), **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", _REUSE, mode], env=env, capture_output=True, text=True, check=True)
    tuned, mapped, kept = out.stdout.split()
    return tuned, int(mapped), int(kept)


def _has_mallinfo2() -> bool:
    import ctypes

    return _glibc() and hasattr(ctypes.CDLL(None), "mallinfo2")  # glibc >= 2.33


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc's malloc only (Linux, glibc >= 2.33)")
def test_freed_blocks_stay_in_the_heap():
    # glibc's default maps a 16 MiB block on its own and unmaps it when freed (the next step's
    # block then faults in fresh pages); tuned, it comes from the heap and stays there, free
    assert _freed_block("default")[:2] == ("False", 16)
    tuned, mapped, kept = _freed_block("tune")
    assert (tuned, mapped) == ("True", 0) and kept >= 16


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc's malloc only (Linux, glibc >= 2.33)")
@pytest.mark.parametrize("var, value", [
    ("NMTKIT_KEEP_FREED_MEMORY", "0"),  # the plain opt-out
    ("MALLOC_MMAP_THRESHOLD_", "1048576"),
    ("MALLOC_ARENA_MAX", "2"),  # any MALLOC_ variable: the user is tuning malloc
    ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576"),
    # as a user sets it for jemalloc or tcmalloc; glibc itself stands in for them
    ("LD_PRELOAD", "libc.so.6"),
])
def test_a_users_allocator_settings_are_left_alone(var, value):
    assert _freed_block("tune", {var: value})[:2] == ("False", 16)


@pytest.mark.parametrize("env, chose", [
    ({}, False),
    ({"NMTKIT_KEEP_FREED_MEMORY": "1"}, False),
    ({"NMTKIT_KEEP_FREED_MEMORY": " 0 "}, True),
    ({"MALLOC_TOP_PAD_": "0"}, True),
    ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, False),
    ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.malloc.arena_max=2"}, True),
    ({"LD_PRELOAD": " "}, False),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, True),
])
def test_which_environments_decide_for_themselves(env, chose):
    from nmtkit.device import _user_chose_allocator_settings

    assert _user_chose_allocator_settings(env) is chose


def test_not_on_other_platforms(monkeypatch):
    import nmtkit.device as device

    monkeypatch.setattr(device, "_allocator_tuned", None)
    monkeypatch.setattr("sys.platform", "darwin")
    assert device.keep_freed_cpu_memory() is False
