"""The one device parser of nmtkit: train, generate, the `Translator`, every engine and everything
after use it.

One set of accepted values everywhere: 'auto' (CUDA if available, else CPU), 'cpu', 'cuda'
(this process's local rank under torchrun, else device 0), 'cuda:N' and 'mps'. `parse_device`
reads the flag without importing torch (an engine that runs without torch checks it against its
own runtime); `resolve_device` turns it into a torch.device. `--precision`'s names live here
too (`check_precision`), beside the device they run on. A device that is absent is a
`UserError` naming the flag, never a late CUDA error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nmtkit.errors import UserError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
# --precision of every command: weights and activations (nmtkit.models.loading maps them to dtypes)
PRECISION_NAMES = ("fp32", "bf16", "fp16")
KINDS = ("auto", "cpu", "cuda", "mps")
# torch's other device types: a name torch knows but nmtkit does not run on
_OTHER_TORCH_TYPES = ("meta", "xpu", "xla", "hpu", "ipu", "mtia", "maia", "lazy", "vulkan", "ve", "fpga", "hip",
                      "mkldnn", "opengl", "opencl", "ideep", "privateuseone")
_DEVICE = re.compile(r"([a-z_]+)(?::(0|[1-9]\d{0,3}))?")  # an index as torch writes it


@dataclass(frozen=True)
class DeviceRequest:
    """A --device value, read: its kind and its index (None: not given, e.g. 'cuda')."""

    name: str  # as the user wrote it, for messages
    kind: str  # auto, cpu, cuda or mps
    index: int | None = None


def parse_device(name: str, flag: str = "--device") -> DeviceRequest:
    """Read a --device value (no torch imported); UserError naming `flag` for anything else."""
    name = str(name)
    m = _DEVICE.fullmatch(name)
    kind = m.group(1) if m else None
    if kind == "auto" and m.group(2) is None:
        return DeviceRequest(name, "auto")
    if kind in _OTHER_TORCH_TYPES:
        raise UserError(f"{flag}: unsupported device type {kind!r} (use {DEVICE_CHOICES})")
    if kind not in KINDS or kind == "auto":
        raise UserError(f"{flag}: unknown device {name!r} (use {DEVICE_CHOICES})")
    return DeviceRequest(name, kind, None if m.group(2) is None else int(m.group(2)))


def resolve_device(name: str, local_rank: int = 0, flag: str = "--device"):
    """The torch.device for `name`; 'auto' and 'cuda' pick cuda:`local_rank` (one GPU per process)."""
    import torch

    req = parse_device(name, flag)
    kind = req.kind
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{flag} {name}: CUDA is not available on this machine "
                            "(torch.cuda.is_available() is False)")
        index = local_rank if req.index is None else req.index
        if index >= torch.cuda.device_count():
            where = f"LOCAL_RANK {local_rank}" if req.index is None else f"{flag} {name}"
            raise UserError(f"{where}: only {torch.cuda.device_count()} CUDA device(s) here")
        return torch.device("cuda", index)
    if kind == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UserError(f"{flag} {name}: MPS is not available on this machine")
        return torch.device("mps") if req.index is None else torch.device("mps", req.index)
    return torch.device("cpu") if req.index is None else torch.device("cpu", req.index)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
OPT_OUT = "NMTKIT_KEEP_FREED_MEMORY"  # "0": leave glibc's malloc as it is
_allocator_tuned: bool | None = None  # None: not tried yet (the settings are made once)


def _user_chose_allocator_settings(env) -> bool:
    """Whether the environment already says how malloc should behave: our opt-out, any
    MALLOC_* variable, glibc.malloc tunables, or a preloaded library (jemalloc, tcmalloc...)."""
    return (env.get(OPT_OUT, "").strip() == "0" or any(k.startswith("MALLOC_") for k in env)
            or "glibc.malloc." in env.get("GLIBC_TUNABLES", "") or bool(env.get("LD_PRELOAD", "").strip()))


def keep_freed_cpu_memory() -> bool:
    """Make glibc's malloc keep freed blocks for reuse; True when it did (now or before).

    Why: CPU decoding allocates and frees tensors of several MB at every step (the logits over
    the vocabulary, the reordered K/V caches, the int8 products). glibc's defaults hand such
    blocks back to the system (munmap, or trimming the top of the heap) and take them again at
    the next step, paying a page fault on every fresh page: 0.50 s of system time in a batch-128
    run, 0.30 s with blocks below 32 MiB served from the heap and up to 256 MiB of free heap
    kept (docs/generate.md, Speed). The price: after a large batch a long-lived process (a
    server) keeps up to that much freed memory resident for the next one. Process-wide, like
    torch's thread count, and harmless to numbers. Made once; left alone where the environment
    already decides (`_user_chose_allocator_settings`: NMTKIT_KEEP_FREED_MEMORY=0 is the plain
    opt-out) and off glibc.
    """
    global _allocator_tuned
    if _allocator_tuned is not None:
        return _allocator_tuned
    import ctypes
    import os
    import sys

    _allocator_tuned = False
    if not sys.platform.startswith("linux") or _user_chose_allocator_settings(os.environ):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl's mallopt does nothing  # noqa: B018
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; the first setting stays even if the second were refused
    _allocator_tuned = bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 256 << 20))
    return _allocator_tuned


def check_precision(name: str) -> str:
    """A --precision value, checked (no torch imported); UserError naming the flag otherwise."""
    if name not in PRECISION_NAMES:
        raise UserError(f"--precision must be one of {', '.join(PRECISION_NAMES)}, got {name!r}")
    return name
