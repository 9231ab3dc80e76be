"""torch.distributed set-up for `torchrun ... -m nmtkit train` (DDP; NCCL on GPUs, gloo on CPU).

Why so little: torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT) does the rendezvous; the trainer only needs to know its rank, pick its device, and
sum a few numbers across ranks. Without those variables everything runs as a single process and
no collective is ever called.

Two ways a multi-process run can get stuck are turned into a prompt exit here:
  a rank that stops answering (SIGSTOP, a debugger, a hung or unreachable machine): every
      collective waits at most --ddp-timeout; the ranks that waited exit with one line naming
      the collective, what the ranks were doing and the ranks (`CollectiveFailed`, exit status
      2), and so do the ranks whose peer went away. Each call that runs a collective (ours
      below, DDP's in its constructor, forward and syncing backward) is wrapped in `collective`,
      which alone reads a RuntimeError as a collective's failure;
  a launcher that dies (kill -9 torchrun): its workers would otherwise train on, headless, and
      rank 0 would keep the save-dir lock. `LauncherWatch` stops a torchrun worker as soon as
      its launcher is gone (Linux: a parent-death signal from the kernel; everywhere: a thread
      that polls the parent pid), at once and without a collective or a save (the other ranks may
      be gone too): one line, exit status 143; the OS releases the lock with the process.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from nmtkit.errors import UserError, first_line

DEFAULT_TIMEOUT_S = 300.0  # --ddp-timeout's default (config.py): a few minutes, not torch's 30
EXIT_LAUNCHER_GONE = 128 + int(signal.SIGTERM)  # 143: as if stopped by SIGTERM, but nothing is saved


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


def show_seconds(seconds: float) -> str:
    """300 -> '5m', 5 -> '5s', 90 -> '90s' (as --ddp-timeout accepts them back)."""
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


_timeout_s = DEFAULT_TIMEOUT_S  # the process group's collective timeout (for messages)


def init(info: DistInfo, device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the process group (NCCL for CUDA, gloo for CPU) unless running as one process.

    `timeout_s` bounds the wait for the other processes here and in every later collective.
    """
    global _timeout_s
    if not info.enabled or dist.is_initialized():
        return
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise UserError(f"WORLD_SIZE={info.world_size} but {var} is not set (launch with torchrun)")
    backend = "nccl" if device_type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {}
    if device_type == "cuda":
        kwargs["device_id"] = torch.device("cuda", info.local_rank)
    _timeout_s = timeout_s
    try:
        dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    except RuntimeError as e:  # DistStoreError / DistNetworkError are RuntimeErrors
        if not _is_timeout(e):
            raise
        raise UserError(f"rank {info.rank} of {info.world_size}: not all {info.world_size} processes joined within "
                        f"--ddp-timeout {show_seconds(timeout_s)} ({first_line(e)})") from None


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# collectives that fail in one line


class CollectiveFailed(UserError):
    """A collective did not complete: no answer within --ddp-timeout, or a peer went away.

    `op` names the collective, `where` what the ranks were doing together ("update 13",
    "checkpoint at update 12", ...); the message is built when shown.
    """

    def __init__(self, op: str, kind: str, info: DistInfo, timeout_s: float, detail: str = ""):
        super().__init__(op)
        self.op, self.kind, self.info, self.timeout_s, self.detail = op, kind, info, timeout_s, detail
        self.where = ""

    def __str__(self) -> str:
        r, w = self.info.rank, self.info.world_size
        others = [i for i in range(w) if i != r]
        one = len(others) == 1
        who = f"rank {others[0]}" if one else "ranks " + ", ".join(map(str, others))
        op = f"{self.op} ({self.where})" if self.where else self.op
        if self.kind == "timeout":
            return (f"rank {r} of {w}: {op} got no answer from {who} within --ddp-timeout "
                    f"{show_seconds(self.timeout_s)}: {'it' if one else 'one of them (the one that reports nothing)'} "
                    "is stopped (SIGSTOP, a debugger), hung or unreachable")
        return (f"rank {r} of {w}: {op} failed because {who if one else 'one of ' + who} exited or lost "
                "its connection (see that rank's own message)")


def _is_timeout(e: BaseException) -> bool:
    text = str(e).lower()
    return "timed out" in text or "timeout" in text


_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "connection refused",
              "socket closed")


def collective_failure(e: BaseException, op: str, info: DistInfo) -> CollectiveFailed | None:
    """`e`, raised by the collective `op`, as a CollectiveFailed when it is a timeout or a lost peer; else None."""
    if not info.enabled or not isinstance(e, RuntimeError):
        return None
    if _is_timeout(e):
        return CollectiveFailed(op, "timeout", info, _timeout_s, first_line(e))
    text = str(e).lower()
    if any(s in text for s in _PEER_GONE):
        return CollectiveFailed(op, "peer", info, _timeout_s, first_line(e))
    return None


@contextlib.contextmanager
def collective(op: str, info: DistInfo, where: str = "") -> Iterator[None]:
    """Around a call that runs the collective `op`: its timeout or lost peer -> CollectiveFailed at `where`.

    Only the calls that run a collective are wrapped, so the error of any other operation (a
    shape mismatch, a failed write) keeps its own message and traceback, whatever its text says.
    """
    try:
        yield
    except RuntimeError as e:
        failed = collective_failure(e, op, info)
        if failed is None:
            raise
        failed.where = where
        raise failed from None


@contextlib.contextmanager
def during(where: str) -> Iterator[None]:
    """Name `where` in a CollectiveFailed from code that runs collectives without knowing what for
    (the checkpoint's RNG gather, validation's sums)."""
    try:
        yield
    except CollectiveFailed as e:
        e.where = e.where or where
        raise


def all_reduce_sum(t: torch.Tensor, info: DistInfo, where: str = "") -> torch.Tensor:
    """Sum `t` over ranks in place (no-op for one process)."""
    if info.enabled:
        with collective("all_reduce", info, where):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_objects(obj: Any, info: DistInfo, where: str = "") -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...] on every rank (a one-element list for one process)."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    with collective("all_gather_object", info, where):
        dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo, where: str = "") -> None:
    if info.enabled:
        with collective("barrier", info, where):
            dist.barrier()


# ------------------------------------------------------------------------------------------------
# the launcher's death


# The parent-death signal: one of its own, not SIGTERM. The kernel sends it when the launcher's
# thread that started this process exits, which can be a moment before this process is given its
# new parent: a SIGTERM then could not be told from the launcher's own (which means "save and stop").
DEATH_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else None


def _parent_death_signal(sig: int) -> bool:
    """Linux: ask the kernel to send `sig` to this process when its parent exits (0: stop asking)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(sig), 0, 0, 0) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


class LauncherWatch:
    """Ends a torchrun worker at once when its launcher is gone (see the module docstring).

    Made as early as possible, in the main thread: it records the parent pid (torchrun's agent,
    the launcher process itself) and asks for DEATH_SIGNAL, handled by `stop_now`; `start` adds
    the polling thread, `close` disarms everything. Outside torchrun (no TORCHELASTIC_RUN_ID) it
    does nothing: a process started by hand may outlive its shell.
    """

    POLL_S = 0.5

    def __init__(self, environ: dict | None = None, parent: int | None = None):
        env = os.environ if environ is None else environ
        self.active = "TORCHELASTIC_RUN_ID" in env
        self.parent = os.getppid() if parent is None else parent
        self.rank = env.get("RANK", "0")
        self._stop = threading.Event()
        self._once = threading.Lock()
        self._thread: threading.Thread | None = None
        self._describe: Callable[[], str] = lambda: ""
        self._exit: Callable[[int], Any] = os._exit
        self._old_handler: Any = None
        self._handling = False
        if self.active and DEATH_SIGNAL is not None:
            try:
                self._old_handler = signal.signal(DEATH_SIGNAL, lambda signum, frame: self.stop_now())
                self._handling = True
            except ValueError:  # not the main thread: the signal's default action (exit) is left
                pass
            _parent_death_signal(DEATH_SIGNAL)

    def gone(self) -> bool:
        """True when this worker's launcher has exited (it has been given another parent)."""
        return self.active and os.getppid() != self.parent

    def start(self, describe: Callable[[], str], exit: Callable[[int], Any] = os._exit) -> "LauncherWatch":
        """Poll the parent; `describe()` adds what was saved to the exit line."""
        if not self.active:
            return self
        self._describe, self._exit = describe, exit
        if self.gone():  # it died while this process was setting up
            self.stop_now()
            return self
        self._thread = threading.Thread(target=self._poll, name="nmtkit-launcher-watch", daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.POLL_S):
            if self.gone():
                self.stop_now()
                return

    def stop_now(self) -> None:
        """One line on stderr, then exit 143 at once: no collective, no save (a second caller returns)."""
        if not self._once.acquire(blocking=False):
            return
        try:
            note = self._describe()
        except Exception:  # noqa: BLE001 - the exit must not depend on the description
            note = ""
        line = (f"nmtkit train, rank {self.rank}: the torchrun launcher (pid {self.parent}) has exited; stopping at "
                f"once without saving{'; ' + note if note else ''} (run the same command to resume)\n")
        try:
            os.write(2, line.encode("utf-8", "replace"))
        except OSError:  # stderr was a pipe to the launcher
            pass
        self._exit(EXIT_LAUNCHER_GONE)

    def close(self) -> None:
        """Stop watching (the run is over); the parent-death signal is cleared."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.POLL_S)
        if self.active and DEATH_SIGNAL is not None:
            _parent_death_signal(0)
            if self._handling:
                with contextlib.suppress(ValueError):  # not the main thread
                    signal.signal(DEATH_SIGNAL, signal.SIG_DFL if self._old_handler is None else self._old_handler)
                self._handling = False
