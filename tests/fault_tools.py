"""Clients and processes that misbehave on purpose, for the fault tests (test_serve_hardening.py,
test_distributed_faults.py, test_multinode.py) and the fault bench (recipes/bench/faults.py).

- HTTP over raw sockets: a client that sends part of a request and stops, or goes away, is what
  an HTTP library never does, and what `nmtkit serve` is hardened against.
- `nmtkit train` as 2 gloo workers on the CPU, under torchrun or started by hand as ranks 0 and 1,
  and a subreaper that kills the torchrun launcher and reaps the workers it orphans.

The bench runs outside pytest from a checkout and puts this folder on sys.path, so this module
uses the standard library only (nmtkit itself runs in the processes it starts); pytest does not
collect it (its name does not start with test_). `python tests/fault_tools.py CMD LOG ERR WAIT_S
REAP_S` is the subreaper (`subreaper_command`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# ------------------------------------------------------------------------------- HTTP clients

# The head of a POST /translate, `% len(body)`: sent alone or with part of its body, it is an
# upload that stalls.
POST_HEAD = (b"POST /translate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n")


def connect(port: int, data: bytes = b"", timeout: float = 10) -> socket.socket:
    """A connection to 127.0.0.1:`port` that has sent `data` (nothing, part of a request, or all of it)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if data:
        sock.sendall(data)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it does not)."""
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def closed(sock: socket.socket) -> bool:
    """Whether the server closed this connection (after whatever it sent), asked without waiting."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset by the server
        return True
    finally:
        sock.setblocking(True)


def exchange(port: int, method: str, path: str, body: bytes = b"", timeout: float = 10) -> bytes:
    """The raw answer to one whole request on a new connection (b"" when the server closes it
    without one): the status line and headers are checked as they are sent, not as a client
    library would normalize them."""
    head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with connect(port, head + body, timeout) as sock:
        return read_all(sock)


# ------------------------------------------------------------------------------- training

# `nmtkit train` flags of a tiny CPU run that goes on until it is stopped (--max-update 100000),
# logging every update, saving no epoch checkpoints: the ranks to kill or stop.
TRAIN = ["--arch", "transformer_tiny", "--max-tokens", "256", "--lr-scheduler", "inverse_sqrt", "--lr", "3e-3",
         "--warmup-updates", "5", "--threads", "1", "--device", "cpu", "--no-progress-bar", "--log-interval", "1",
         "--no-validate", "--no-epoch-checkpoints", "--max-update", "100000"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a rendezvous (taken by whoever binds it first)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(data: Path, save: Path) -> list[str]:
    """torchrun of 2 workers of the tiny run, saving checkpoint_last.pt every 2 updates: a
    launcher to kill once a checkpoint exists (`subreaper`)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "nmtkit", "train", str(data), "--save-dir", str(save), *TRAIN, "--save-interval-updates", "2"]


def start_two_ranks(data: Path, save: Path, errs: list[Path], env: dict, ddp_timeout: int) -> list[subprocess.Popen]:
    """Ranks 0 and 1 of the tiny run, started by hand (no launcher to notice a stopped one), their
    stderr in `errs`: what is left to notice a rank that stops answering is --ddp-timeout."""
    cmd = [sys.executable, "-m", "nmtkit", "train", str(data), "--save-dir", str(save), *TRAIN,
           "--ddp-timeout", str(ddp_timeout)]
    world = {**env, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = []
    for rank, err in enumerate(errs):
        with open(err, "w") as fh:
            procs.append(subprocess.Popen(cmd, env={**world, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fh))
    return procs


def log_has(path: Path, kind: str) -> bool:
    """Whether the train log at `path` holds a record of type `kind` yet (a line still being
    written is passed over)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("type") == kind:
                return True
    return False


def lock_is_free(save: Path) -> bool:
    """Whether the save directory's lock (flock on SAVE_DIR/.nmtkit-train.lock) can be taken:
    asked from outside, without writing to the lock file as a new run would."""
    import fcntl

    try:
        fd = os.open(save / ".nmtkit-train.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- the subreaper


def subreaper_command(cmd: list[str], log: Path, err: Path, wait_s: float, reap_s: float) -> list[str]:
    """This module as a process of its own running `subreaper`; its last stdout line is the JSON
    of the result. A process of its own, because becoming a subreaper cannot be undone."""
    return [sys.executable, str(Path(__file__).resolve()), json.dumps(cmd), str(log), str(err), str(wait_s),
            str(reap_s)]


def subreaper(cmd: list[str], log: str, err: str, wait_s: float, reap_s: float) -> dict:
    """Start torchrun (`cmd`, its stderr in `err`), wait up to `wait_s` seconds for its two
    workers and a checkpoint in the train log `log`, kill -9 torchrun, and reap the orphaned
    workers (this process is their subreaper, so they are re-parented to it): {"workers": pids,
    "status": {pid: [exit status, seconds after the kill]}} for those that exited within `reap_s`
    seconds (the others are killed), or {"error": why}."""
    import ctypes

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    with open(err, "w") as fh:
        launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh)
    end = time.monotonic() + wait_s
    while not (log_has(Path(log), "checkpoint") and len(_children(launcher.pid)) == 2):
        if launcher.poll() is not None or time.monotonic() > end:
            launcher.kill()
            return {"error": f"no checkpoint within {wait_s:g} s (torchrun {launcher.poll()})"}
        time.sleep(0.1)
    workers = _children(launcher.pid)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    return {"workers": workers, "status": _reap(workers, reap_s)}


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    out = []
    for d in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if d.isdigit() and int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def _reap(workers: list[int], reap_s: float) -> dict[int, list]:
    """{pid: [exit status, seconds]} of the `workers` that exit within `reap_s` seconds; the
    others are killed and reaped, so that they and their locks are gone before the caller looks."""
    t0, status = time.monotonic(), {}
    while len(status) < len(workers) and time.monotonic() < t0 + reap_s:
        pid, st = os.waitpid(-1, os.WNOHANG)
        if pid in workers:
            status[pid] = [os.waitstatus_to_exitcode(st), round(time.monotonic() - t0, 2)]
        elif pid == 0:
            time.sleep(0.02)
    for pid in workers:
        if pid not in status:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return status


if __name__ == "__main__":
    cmd_json, log_path, err_path, wait, reap = sys.argv[1:]
    print(json.dumps(subreaper(json.loads(cmd_json), log_path, err_path, float(wait), float(reap))), flush=True)
