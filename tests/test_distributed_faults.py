"""Several `nmtkit train` processes when one part fails: the torchrun launcher is killed, or a
rank stops answering. Gloo on CPU, the tiny word-mapping corpus; each test starts real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError
from nmtkit.training import distributed as D
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig, parse_ddp_timeout
from nmtkit.training.report import read_log


REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TRAIN = ["--arch", "transformer_tiny", "--max-tokens", "256", "--lr-scheduler", "inverse_sqrt", "--lr", "3e-3",
         "--warmup-updates", "5", "--threads", "1", "--device", "cpu", "--no-progress-bar", "--log-interval", "1",
         "--no-validate", "--no-epoch-checkpoints", "--max-update", "100000"]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")


from test_save_crash import _one_thread, data_dir  # noqa: E402, F401 - fixtures: the corpus, torch's threads kept


def wait_for(pred, timeout: float, what: str, procs=()):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a process exited (status {p.returncode}) while waiting for {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def log_has(path: Path, kind: str) -> bool:
    try:
        return any(r["type"] == kind for r in read_log(path))
    except (OSError, ValueError):
        return False


def lock_is_free(save_dir: Path) -> bool:
    try:
        T._SaveDirLock(save_dir).release()
        return True
    except UserError:
        return False


# ------------------------------------------------------------------------------------------------
# the launcher dies

# Run as its own process: it becomes a child subreaper, so the workers orphaned by the launcher's
# death are re-parented to it and it can wait for them and read their exit statuses.
SUBREAPER = r"""
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
cmd, log, err = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(err, "w"))

def children(pid):
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                if d.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out

def saved():
    try:
        return any(json.loads(l)["type"] == "checkpoint" for l in open(log))
    except (OSError, ValueError):
        return False

end = time.monotonic() + 240
while not (saved() and len(children(launcher.pid)) == 2):
    if launcher.poll() is not None or time.monotonic() > end:
        print(json.dumps({"error": f"no checkpoint (launcher status {launcher.poll()})"}))
        sys.exit(0)
    time.sleep(0.1)
workers = children(launcher.pid)
os.kill(launcher.pid, signal.SIGKILL)
launcher.wait()
t0, status = time.monotonic(), {}
while len(status) < len(workers) and time.monotonic() < t0 + 60:
    pid, st = os.waitpid(-1, os.WNOHANG)
    if pid in workers:
        status[pid] = [os.waitstatus_to_exitcode(st), round(time.monotonic() - t0, 2)]
    elif pid == 0:
        time.sleep(0.02)
for pid in workers:
    if pid not in status:
        os.kill(pid, signal.SIGKILL)
print(json.dumps({"workers": workers, "status": status}))
"""


@linux_only
def test_workers_stop_at_once_when_the_torchrun_launcher_is_killed(data_dir, tmp_path):
    """kill -9 of torchrun: both workers exit within a second or two with status 143, without a
    collective or a save, and the save dir is free again: the same command resumes."""
    save = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "nmtkit", "train", str(data_dir), "--save-dir", str(save), *TRAIN, "--save-interval-updates", "2"]
    err = tmp_path / "stderr.txt"
    p = subprocess.run([sys.executable, "-c", SUBREAPER, json.dumps(cmd), str(save / "train_log.jsonl"), str(err)],
                       env=ENV, capture_output=True, text=True, timeout=330)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert "error" not in out, (out, err.read_text()[-3000:])
    codes = {int(pid): code for pid, (code, _) in out["status"].items()}
    seconds = [s for _, s in out["status"].values()]
    assert sorted(codes) == sorted(out["workers"]), out  # both exited by themselves
    assert set(codes.values()) == {D.EXIT_LAUNCHER_GONE}, (out, err.read_text()[-3000:])
    assert max(seconds) < 5, out
    text = err.read_text()
    for rank in (0, 1):
        assert re.search(rf"nmtkit train, rank {rank}: the torchrun launcher \(pid \d+\) has exited; stopping at once "
                         r"without saving; .*checkpoint_last.pt holds update \d+ \(run the same command to resume\)",
                         text), text[-3000:]
    assert lock_is_free(save)
    last = ck.load_checkpoint(save / "checkpoint_last.pt")["update"]
    cfg = TrainConfig(data_dir=str(data_dir), save_dir=str(save), arch="transformer_tiny", max_tokens=256,
                      lr_scheduler="inverse_sqrt", lr=3e-3, warmup_updates=5, threads=1, progress_bar=False,
                      no_validate=True, no_epoch_checkpoints=True, max_update=last + 1)
    assert T.train(cfg).update == last + 1


def test_the_launcher_watch_polls_the_parent_where_no_death_signal_comes(monkeypatch, capfd):
    """The portable half of the watch (a thread comparing os.getppid() with the launcher's pid):
    the parent-death signal is left out here, the parent pid changes, the process exits 143 with
    one line. Outside torchrun the watch does nothing."""
    asked = []
    monkeypatch.setattr(D, "_parent_death_signal", asked.append)
    idle = D.LauncherWatch(environ={"RANK": "0"})
    assert not idle.active and not idle.gone() and asked == []
    idle.start(lambda: "x", exit=lambda code: pytest.fail("exited outside torchrun")).close()

    exits = []
    w = D.LauncherWatch(environ={"TORCHELASTIC_RUN_ID": "r", "RANK": "1"}, parent=os.getppid())
    assert asked == [D.DEATH_SIGNAL]
    w.start(lambda: "checkpoint_last.pt holds update 4", exit=exits.append)
    time.sleep(2 * w.POLL_S)
    assert exits == [] and not w.gone()
    real = os.getppid()
    monkeypatch.setattr(os, "getppid", lambda: real + 1)  # re-parented: the launcher is gone
    wait_for(lambda: exits, 5, "the watch")
    w.close()
    assert exits == [143] and asked == [D.DEATH_SIGNAL, 0]
    assert capfd.readouterr().err == (f"nmtkit train, rank 1: the torchrun launcher (pid {real}) has exited; stopping "
                                      "at once without saving; checkpoint_last.pt holds update 4 (run the same "
                                      "command to resume)\n")


# ------------------------------------------------------------------------------------------------
# a rank stops answering


def test_a_stopped_rank_ends_the_other_within_ddp_timeout_in_one_line(data_dir, tmp_path):
    """Rank 1 is SIGSTOPped mid-training: rank 0 exits (status 2) about --ddp-timeout later with
    one line naming the collective and rank 1, and frees the save dir; rank 1, continued, exits
    at once with one line saying that rank 0 went away."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    save = tmp_path / "run"
    args = [sys.executable, "-m", "nmtkit", "train", str(data_dir), "--save-dir", str(save), *TRAIN,
            "--ddp-timeout", "5"]
    env = {**ENV, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    errs = [tmp_path / f"rank{r}.err" for r in range(2)]
    procs = [subprocess.Popen(args, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.DEVNULL,
                              stderr=open(errs[r], "w")) for r in range(2)]
    try:
        wait_for(lambda: log_has(save / "train_log.jsonl", "train"), 240, "the first update", procs)
        os.kill(procs[1].pid, signal.SIGSTOP)
        t0 = time.monotonic()
        procs[0].wait(timeout=60)
        waited = time.monotonic() - t0
        os.kill(procs[1].pid, signal.SIGCONT)
        procs[1].wait(timeout=60)
        err0, err1 = (e.read_text() for e in errs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines0 = [ln for ln in err0.splitlines() if ln.startswith("nmtkit: error:")]
    assert procs[0].returncode == 2 and len(lines0) == 1, err0[-3000:]
    last = re.escape(str(save / "checkpoint_last.pt"))
    assert re.fullmatch(
        r"nmtkit: error: rank 0 of 2: (all_reduce|DDP's gradient all-reduce|barrier|all_gather_object) "
        r"\((update|checkpoint at update) \d+\) got no answer from rank 1 within --ddp-timeout 5s: it is stopped "
        rf"\(SIGSTOP, a debugger\), hung or unreachable; ({last} holds update \d+|no checkpoint_last\.pt was written "
        r"yet) \(run the same command to resume\)", lines0[0]), lines0
    assert 4.5 < waited < 20, waited
    lines1 = [ln for ln in err1.splitlines() if ln.startswith("nmtkit: error:")]
    assert procs[1].returncode == 2 and len(lines1) == 1, err1[-3000:]
    # rank 1, continued, finds rank 0 gone: as a lost connection, or, when its collective had already
    # begun before the stop, as its own timeout; either way one line naming rank 0
    assert re.match(r"nmtkit: error: rank 1 of 2: .* (failed because rank 0 exited or lost its connection|"
                    r"got no answer from rank 0 within --ddp-timeout 5s)", lines1[0]), lines1
    end = [r for r in read_log(save / "train_log.jsonl") if r["type"] == "end"]
    assert end[-1]["reason"] == "failed" and "got no answer from rank 1" in end[-1]["message"]
    assert lock_is_free(save)


def test_ddp_timeout_flag_and_the_one_line_messages():
    assert parse_ddp_timeout("90s") == 90.0 and parse_ddp_timeout("5m") == 300.0 and parse_ddp_timeout("7") == 7.0
    with pytest.raises(UserError, match="--ddp-timeout expects a duration"):
        parse_ddp_timeout("soon")
    with pytest.raises(UserError, match="--ddp-timeout must be > 0"):
        TrainConfig(data_dir="d", save_dir="s", ddp_timeout=0.0).validate()
    assert TrainConfig(data_dir="d", save_dir="s").ddp_timeout == 300.0
    info = D.DistInfo(rank=2, world_size=4, local_rank=2)
    e = D.collective_failure(RuntimeError("[gloo/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation "
                                          "to complete"), "barrier", info)
    e.where = "checkpoint at update 8"
    assert str(e) == ("rank 2 of 4: barrier (checkpoint at update 8) got no answer from ranks 0, 1, 3 within "
                      "--ddp-timeout 5m: one of them (the one that reports nothing) is stopped (SIGSTOP, a debugger), "
                      "hung or unreachable")
    e = D.collective_failure(RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1"), "all_reduce",
                             D.DistInfo(rank=1, world_size=2, local_rank=1))
    assert str(e) == ("rank 1 of 2: all_reduce failed because rank 0 exited or lost its connection (see that rank's "
                      "own message)")
    assert D.collective_failure(RuntimeError("shape mismatch"), "all_reduce", info) is None
    assert D.collective_failure(RuntimeError("Timed out"), "all_reduce", D.DistInfo()) is None  # one process
