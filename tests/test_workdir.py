"""nmtkit.workdir: hidden working folders beside a target, locked by their run, put in place
atomically, and removed (or put back) by the next run once their run is gone."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nmtkit import workdir
from nmtkit.workdir import WorkFolders

fcntl = pytest.importorskip("fcntl")

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
FOLDERS = WorkFolders(build=".{name}.{rand}.partial", aside=".{name}.old-{hex}", marker="done",
                      restored="restored {target} from {name}", removed="removed {path}")


def target_holding(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "done").write_text(text)
    return path


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_build_folder_is_locked_until_released_and_only_then_taken_for_a_leftover(tmp_path):
    tmp = FOLDERS.build_folder(tmp_path / "d")
    assert re.fullmatch(r"\.d\.[0-9a-f]{8}\.partial", tmp.name)
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o777 & ~umask()  # a plain mkdir's permissions
    fd = os.open(tmp, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert FOLDERS.clear(tmp_path / "d") == [] and tmp.is_dir()  # its own process's run: kept
        assert FOLDERS.clear(tmp_path / "d", every_name=True) == [] and tmp.is_dir()
        workdir.release(tmp)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now
    finally:
        os.close(fd)
    assert FOLDERS.clear(tmp_path / "d") == [f"removed {tmp}"] and names(tmp_path) == []


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_folder_locked_by_a_live_process_is_kept_and_removed_once_it_is_killed(tmp_path):
    live = tmp_path / ".d.abcd1234.partial"
    live.mkdir()
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(live)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline() == "held\n"
        assert FOLDERS.clear(tmp_path / "d") == [] and live.is_dir()
        assert FOLDERS.left_aside(tmp_path / "d") == []
    finally:
        p.kill()  # SIGKILL: the system releases the lock
        p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL
    assert FOLDERS.clear(tmp_path / "d") == [f"removed {live}"] and names(tmp_path) == []


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "two-renames"])
def test_put_in_place_replaces_the_target_and_leaves_nothing_beside_it(tmp_path, monkeypatch, swap):
    if not swap:
        monkeypatch.setattr(workdir, "exchange", lambda a, b: False)
    target = target_holding(tmp_path / "d", "old")
    (target / "old-only").write_text("x")
    tmp = FOLDERS.build_folder(target)
    (tmp / "done").write_text("new")
    FOLDERS.put_in_place(tmp, target)
    assert names(tmp_path) == ["d"] and names(target) == ["done"] and (target / "done").read_text() == "new"
    fd = os.open(target, os.O_RDONLY)  # the build folder's lock went with it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    tmp = FOLDERS.build_folder(tmp_path / "e")  # no target yet: a plain rename
    FOLDERS.put_in_place(tmp, tmp_path / "e")
    assert names(tmp_path) == ["d", "e"]


def test_a_failed_second_rename_puts_the_target_back_and_leaves_the_build_folder_to_its_caller(tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setattr(workdir, "exchange", lambda a, b: False)
    target = target_holding(tmp_path / "d", "old")
    tmp = FOLDERS.build_folder(target)
    real = os.replace

    def replace(a, b):
        if Path(a) == tmp:
            raise OSError("rename failed")
        return real(a, b)

    monkeypatch.setattr(workdir.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"):
        FOLDERS.put_in_place(tmp, target)
    monkeypatch.undo()
    assert names(tmp_path) == sorted(["d", tmp.name]) and (target / "done").read_text() == "old"
    workdir.discard(tmp)
    assert names(tmp_path) == ["d"]


# killed (SIGKILL-like: no clean-up runs) right after the first of the two renames: the target is aside
KILLED_SWAP = """
import os, sys
from pathlib import Path
from nmtkit import workdir
from nmtkit.workdir import WorkFolders

folders = FOLDERS
target = Path(sys.argv[1])
tmp = folders.build_folder(target)
(tmp / "done").write_text("new")
workdir.exchange = lambda a, b: False
real = os.replace

def replace(a, b):
    real(a, b)
    os._exit(137)

os.replace = replace
folders.put_in_place(tmp, target)
""".replace("FOLDERS", repr(FOLDERS))


def test_a_target_that_a_killed_swap_left_aside_is_put_back_by_the_next_run(tmp_path):
    target = target_holding(tmp_path / "d", "old")
    r = subprocess.run([sys.executable, "-c", KILLED_SWAP, str(target)], env=ENV, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 137, r.stderr
    assert not target.exists()
    (aside,) = FOLDERS.left_aside(target)
    assert re.fullmatch(r"\.d\.old-[0-9a-f]{8}", aside.name) and (aside / "done").read_text() == "old"
    (build,) = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert FOLDERS.clear(target) == [f"restored {target} from {aside.name}", f"removed {build}"]
    assert names(tmp_path) == ["d"] and (target / "done").read_text() == "old"
    assert FOLDERS.clear(target) == [] and FOLDERS.left_aside(target) == []


def test_the_debris_of_dead_runs_is_removed_and_the_newest_complete_target_put_back(tmp_path):
    dead = [tmp_path / ".d.ab_cd12x.partial", tmp_path / ".d.old-00000001"]  # tempfile's alphabet; no `done`
    for p in dead:
        p.mkdir()
        (p / "part").write_text("x")
    older = target_holding(tmp_path / ".d.old-0000000a", "older")
    newer = target_holding(tmp_path / ".d.old-0000000b", "newer")
    os.utime(older, (1, 1))
    os.utime(dead[1], (newer.stat().st_mtime + 60,) * 2)  # the newest, but incomplete: not put back
    nested = tmp_path / ".d.old-0000000c"  # the earlier target as NAME inside the folder, also recognised
    target_holding(nested, "")
    os.utime(nested, (2, 2))
    others = [tmp_path / ".e.abcd1234.partial", tmp_path / ".d.old-zzzzzzzz", tmp_path / ".d.abcd123.partial",
              tmp_path / "d.abcd1234.partial", tmp_path / ".notes"]  # another target's, or not these folders
    for p in others:
        p.mkdir()
    (tmp_path / ".d.abcd9999.partial").write_text("a file, not a folder")
    (tmp_path / ".d.abcd8888.partial").symlink_to(tmp_path / ".notes")
    done = FOLDERS.clear(tmp_path / "d")
    assert sorted(done) == sorted([f"restored {tmp_path / 'd'} from {newer.name}",
                                   *(f"removed {p}" for p in [*dead, older, nested])])
    assert (tmp_path / "d" / "done").read_text() == "newer"
    assert names(tmp_path) == sorted(["d", ".d.abcd9999.partial", ".d.abcd8888.partial", *(p.name for p in others)])
    assert FOLDERS.clear(tmp_path / "d", every_name=True) == [f"removed {tmp_path / '.e.abcd1234.partial'}"]


def test_an_earlier_target_nested_in_its_folder_is_put_back(tmp_path):
    nested = tmp_path / ".d.old-12345678"
    nested.mkdir()
    target_holding(nested / "d", "old")
    assert FOLDERS.left_aside(tmp_path / "d") == [nested]
    assert FOLDERS.clear(tmp_path / "d") == [f"restored {tmp_path / 'd'} from {nested.name}"]
    assert names(tmp_path) == ["d"] and (tmp_path / "d" / "done").read_text() == "old"


def test_where_there_is_no_flock_nothing_is_removed_and_building_still_works(tmp_path, monkeypatch):
    monkeypatch.setattr(workdir, "fcntl", None)
    dead = tmp_path / ".d.abcd1234.partial"
    dead.mkdir()
    target_holding(tmp_path / ".d.old-12345678", "old")
    assert FOLDERS.clear(tmp_path / "d") == [] and FOLDERS.left_aside(tmp_path / "d") == []
    tmp = FOLDERS.build_folder(tmp_path / "e")
    FOLDERS.put_in_place(tmp, tmp_path / "e")
    assert names(tmp_path) == sorted([".d.abcd1234.partial", ".d.old-12345678", "e"])


def test_a_missing_parent_folder_has_no_leftovers(tmp_path):
    assert FOLDERS.clear(tmp_path / "absent" / "d") == []
