"""torch.distributed set-up for `torchrun ... -m nmtkit train` (DDP; NCCL on GPUs, gloo on CPU).

Why so little: torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT) does the rendezvous; the trainer only needs to know its rank, pick its device, and
sum a few numbers across ranks. Without those variables everything runs as a single process and
no collective is ever called.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nmtkit.errors import UserError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_dist_info() -> DistInfo:
    """Rank information from the launcher's environment variables (single process if absent)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise UserError("RANK / WORLD_SIZE / LOCAL_RANK must be integers (set by torchrun)") from None
    if world > 1 and not (0 <= rank < world):
        raise UserError(f"RANK {rank} is outside 0..WORLD_SIZE-1 ({world})")
    return DistInfo(rank, world, local)


def init(info: DistInfo, device_type: str) -> None:
    """Join the process group (NCCL for CUDA, gloo for CPU) unless running as one process."""
    if not info.enabled or dist.is_initialized():
        return
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise UserError(f"WORLD_SIZE={info.world_size} but {var} is not set (launch with torchrun)")
    backend = "nccl" if device_type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if device_type == "cuda":
        kwargs["device_id"] = torch.device("cuda", info.local_rank)
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size,
                            timeout=datetime.timedelta(minutes=30), **kwargs)


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum `t` over ranks in place (no-op for one process)."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank (a one-element list for one process)."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
