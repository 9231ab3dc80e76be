"""Training on several machines: two `torchrun` "nodes" of one process each on this machine, joined
by the c10d rendezvous (gloo, CPU, the tiny corpus), as docs/train.md's multi-node section runs
them; and ranks that would resume from different checkpoints (node-local save directories) stop at
once with one line naming the ranks and their updates."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError
from nmtkit.training.report import read_log
from nmtkit.training.start import check_same_start

from fault_tools import TRAIN, free_port
from test_distributed_faults import ENV
from test_save_crash import _one_thread, data_dir  # noqa: F401 - fixtures: the corpus, torch's threads kept


def two_nodes(data_dir, save_dirs, max_update: int, timeout: float = 60):
    """Start one torchrun per "node" (c10d rendezvous on localhost), each with its own --save-dir
    (the same path twice for a shared one); -> the two finished processes."""
    port = free_port()
    procs = []
    for save in save_dirs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "nmtkit-test",
               "-m", "nmtkit", "train", str(data_dir), "--save-dir", str(save), *TRAIN[:-2],
               "--max-update", str(max_update), "--ddp-timeout", "60s"]
        procs.append(subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:
            p.out, p.err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.communicate()
        raise AssertionError(f"the two nodes did not finish within {timeout}s (waiting on each other?)") from None
    return procs


def test_two_c10d_nodes_train_then_node_local_save_dirs_fail_fast(data_dir, tmp_path):
    a, b = tmp_path / "node_a", tmp_path / "node_b"  # node-local save directories
    procs = two_nodes(data_dir, [a, b], max_update=1)
    assert [p.returncode for p in procs] == [0, 0], [p.err[-2000:] for p in procs]
    # rank 0 (whichever node the rendezvous made it) wrote the checkpoint; the other node has none
    main, other = (a, b) if (a / "checkpoint_last.pt").is_file() else (b, a)
    assert not (other / "checkpoint_last.pt").exists()
    state = ck.load_checkpoint(main / "checkpoint_last.pt")
    assert state["update"] == 1 and state["train"]["data_position"]["world_size"] == 2
    assert [r["update"] for r in read_log(main / "train_log.jsonl") if r["type"] == "train"] == [1]
    # the same command again: rank 0 would resume update 1, rank 1 start fresh -> one line, exit 2, no hang
    procs = two_nodes(data_dir, [a, b], max_update=4)
    want = (f"nmtkit: error: the ranks do not start from the same checkpoint: rank 0 at update 1 (resuming "
            f"{main / 'checkpoint_last.pt'}), rank 1 at update 0 (fresh: no {other / 'checkpoint_last.pt'}); "
            "every node must see the same --save-dir")
    for p in procs:
        assert p.returncode != 0
        lines = [x for x in p.err.splitlines() if x.startswith("nmtkit: error:")]
        assert lines and lines[0].startswith(want), p.err[-2000:]
    assert [r["update"] for r in read_log(main / "train_log.jsonl") if r["type"] == "train"] == [1]


def test_same_start_message_groups_ranks():
    check_same_start([("resume", 5, "/s/checkpoint_last.pt")] * 3)  # all alike: nothing to say
    check_same_start([("fresh", None, "/a/checkpoint_last.pt"), ("fresh", None, "/b/checkpoint_last.pt")])
    starts = [("resume", 8, "/s/c.pt")] * 3 + [("resume", 6, "/s/c.pt")] + [("resume", 8, "/s/c.pt")]
    with pytest.raises(UserError) as e:
        check_same_start(starts)
    assert str(e.value).startswith("the ranks do not start from the same checkpoint: ranks 0-2,4 at update 8 "
                                   "(resuming /s/c.pt), rank 3 at update 6 (resuming /s/c.pt); ")
    with pytest.raises(UserError, match=r"rank 1 at update 0 \(fine-tuning from /m\.pt: no checkpoint_last\.pt"):
        check_same_start([("resume", 3, "/s/checkpoint_last.pt"), ("finetune", 3, "/m.pt")])
