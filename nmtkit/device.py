"""The one device resolver of nmtkit: train, generate, the `Translator` and everything after use it.

One set of accepted values everywhere: 'auto' (CUDA if available, else CPU), 'cpu', 'cuda'
(this process's local rank under torchrun, else device 0), 'cuda:N' and 'mps'. A device that is
absent is a `UserError` naming the flag, never a late CUDA error.
"""

from __future__ import annotations

import torch

from nmtkit.errors import UserError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def resolve_device(name: str, local_rank: int = 0, flag: str = "--device") -> torch.device:
    """The torch.device for `name`; 'auto' and 'cuda' pick cuda:`local_rank` (one GPU per process)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"{flag}: unknown device {name!r} (use {DEVICE_CHOICES})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{flag} {name}: CUDA is not available on this machine "
                            "(torch.cuda.is_available() is False)")
        index = local_rank if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            where = f"LOCAL_RANK {local_rank}" if dev.index is None else f"{flag} {name}"
            raise UserError(f"{where}: only {torch.cuda.device_count()} CUDA device(s) here")
        return torch.device("cuda", index)
    if dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UserError(f"{flag} {name}: MPS is not available on this machine")
        return dev
    if dev.type != "cpu":
        raise UserError(f"{flag}: unsupported device type {dev.type!r} (use {DEVICE_CHOICES})")
    return dev
