"""Several `nmtkit train` processes when one part fails: the torchrun launcher is killed, or a
rank stops answering. Gloo on CPU, the tiny word-mapping corpus; each test starts real processes."""

from __future__ import annotations

import json
import os
import re
import signal
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

from fault_tools import lock_is_free, log_has, start_two_ranks, subreaper_command, torchrun_command

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
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


# ------------------------------------------------------------------------------------------------
# the launcher dies

def test_a_stop_right_after_the_save_names_the_checkpoint_it_wrote(data_dir, tmp_path, monkeypatch):
    """Rank 0's checkpoint_last.pt is on disk (and in the log) before the ranks meet at the save's
    barrier; a stop in that window (the launcher killed, a peer gone) says which update it holds,
    not that none was written."""
    from test_host_syncs import new_trainer

    from nmtkit.training.report import JsonlLog

    t = new_trainer(data_dir, tmp_path / "run")
    (tmp_path / "run").mkdir(exist_ok=True)
    t.log = JsonlLog(tmp_path / "run" / "train_log.jsonl")
    notes = []
    monkeypatch.setattr(D, "barrier", lambda info, where="": notes.append(t._saved_note()))
    t._save([])
    assert notes == [f"{tmp_path / 'run' / 'checkpoint_last.pt'} holds update {t.state.update}"]


@linux_only
def test_workers_stop_at_once_when_the_torchrun_launcher_is_killed(data_dir, tmp_path):
    """kill -9 of torchrun: both workers exit within a second or two with status 143, without a
    collective or a save, and the save dir is free again: the same command resumes."""
    save = tmp_path / "run"
    err = tmp_path / "stderr.txt"
    p = subprocess.run(subreaper_command(torchrun_command(data_dir, save), save / "train_log.jsonl", err, wait_s=240,
                                         reap_s=60), env=ENV, capture_output=True, text=True, timeout=330)
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
    save = tmp_path / "run"
    errs = [tmp_path / f"rank{r}.err" for r in range(2)]
    procs = start_two_ranks(data_dir, save, errs, ENV, ddp_timeout=5)
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


def run_as_rank_0_of_2(data_dir, save: Path, monkeypatch, comm_hook=None):
    """`nmtkit train` in this process as rank 0 of 2: a one-process gloo group stands in for both
    ranks (the start check's gather sees this rank twice), so the run's errors are a distributed
    run's without a second process. `comm_hook` replaces DDP's gradient all-reduce."""
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(D, "all_gather_objects", lambda obj, info, where="": [obj] * info.world_size)
    if comm_hook is not None:
        wrap = T.Trainer._wrap

        def wrap_with_hook(self, model):
            fwd, ddp = wrap(self, model)
            ddp.register_comm_hook(None, comm_hook)
            return fwd, ddp

        monkeypatch.setattr(T.Trainer, "_wrap", wrap_with_hook)
    cfg = TrainConfig(data_dir=str(data_dir), save_dir=str(save), arch="transformer_tiny", max_tokens=256,
                      lr_scheduler="inverse_sqrt", lr=3e-3, warmup_updates=5, threads=1, progress_bar=False,
                      no_validate=True, no_epoch_checkpoints=True, max_update=3)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return T.train(cfg)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_lost_peer_in_ddps_backward_ends_the_run_in_one_line_and_an_end_record(data_dir, tmp_path, monkeypatch):
    """A peer lost in DDP's gradient all-reduce (the last micro-batch's backward): the run ends with
    one line naming DDP's all-reduce, the update, the other rank and the checkpoint to resume from;
    the log gets its end record and the save dir is free."""
    def peer_gone(state, bucket):
        raise RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:29500")

    save = tmp_path / "run"
    with pytest.raises(UserError) as e:
        run_as_rank_0_of_2(data_dir, save, monkeypatch, peer_gone)
    assert not isinstance(e.value, D.CollectiveFailed)
    assert str(e.value) == ("rank 0 of 2: DDP's gradient all-reduce (update 1) failed because rank 1 exited or lost "
                            "its connection (see that rank's own message); no checkpoint_last.pt was written yet (run "
                            "the same command to resume)")
    end = [{k: v for k, v in r.items() if k != "time"} for r in read_log(save / "train_log.jsonl") if r["type"] == "end"]
    assert end == [{"type": "end", "update": 0, "reason": "failed", "message": str(e.value)}]
    assert lock_is_free(save)


def test_an_error_outside_a_collective_is_not_read_as_one_whatever_its_text(data_dir, tmp_path, monkeypatch):
    """A RuntimeError of the loss, not of a collective, keeps its traceback in a distributed run even
    when its text mentions a timeout: only the calls that run collectives read errors as theirs."""
    from nmtkit.training import step as S

    def loss(*args, **kwargs):
        raise RuntimeError("Timed out waiting for the loss kernel")

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", loss)
    with pytest.raises(RuntimeError, match="^Timed out waiting for the loss kernel$"):
        run_as_rank_0_of_2(data_dir, tmp_path / "run", monkeypatch)


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
