"""The attacks nmtkit was hardened against, run again on a freshly built tiny set-up: a table of
what held. Run through `bash recipes/bench/faults.sh` (which prepares the environment); the rows,
their timeouts and what counts as held are described there and in docs/testing.md ("Faults
checked").

    python recipes/bench/faults.py [--only 1,4] [--keep] [--work DIR]

The set-up (seconds, in a new folder that is removed at the end unless --keep): a data directory
of a word-mapping task (w3 w7 -> W3 W7: 400 training and 24 validation lines, whitespace tokens,
one joined dictionary) and a tiny random Transformer checkpoint of it (1+1 layers, d_model 16),
as tests/conftest.py's `word_mapping_data_dir` and tests/test_export.py's `_tiny_checkpoint` make
them; nothing is downloaded, everything runs on the CPU, and the servers listen on 127.0.0.1
(one on 0.0.0.0 for the warning, which nothing connects to). Every command is a process of its
own (`python -m nmtkit ...`, `python -m torch.distributed.run` for torchrun), with its own
timeout; its peak RSS is its own `ru_maxrss`, as `getrusage(RUSAGE_CHILDREN)` reports a child's,
read for that one process with `os.wait4`.

It runs from a checkout, never from an installed nmtkit, and puts two of the checkout's folders on
sys.path: its root, for the nmtkit that builds the set-up, and tests/, for tests/fault_tools.py:
the raw-socket HTTP clients and the training processes (torchrun, ranks started by hand, the
subreaper that kills the launcher) that the fault tests use too, kept out of the installed package.

Exit status: 0 when every row held; 1 when a row is BROKEN or could not be checked ("not
available": a flag or runtime it needs is missing); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the set-up is built by this checkout's nmtkit, which every command runs; its tests/ folder holds
# the clients and processes shared with the fault tests (module docstring)
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fault_tools import (  # noqa: E402
    POST_HEAD, closed, connect, exchange, lock_is_free, log_has, read_all, start_two_ranks, subreaper_command,
    torchrun_command,
)

PY = sys.executable
NMTKIT = [PY, "-m", "nmtkit"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
for _var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
    ENV.pop(_var, None)  # the training rows start their own processes: nothing inherited

HELD, BROKEN, NOT_AVAILABLE = "held", "BROKEN", "not available"
FAST_S = 15.0  # a refused crafted checkpoint: at most this many seconds (was 22 s) ...
RSS_MIB = 1024  # ... and this much memory (was 4.4 GB), the interpreter's start-up included
SERVE_NOFILE = 1024  # `ulimit -n` of the server under the flood
FLOOD = 1100  # connections sending part of their headers: more than the open-file limit
GRACE_S = 5.0  # the server's --graceful-timeout
DDP_TIMEOUT_S = 5
LAUNCHER_S = 5.0  # the workers of a killed torchrun: exited within this many seconds
GENERATE = ["--gen-subset", "valid", "--beam", "1", "--max-len-b", "4", "--quiet", "--threads", "1"]

# Every row, in the order of the table: (id, what is done). The groups are the numbers.
ROWS = {
    "1a": "attention --format npz -o CHECKPOINT",
    "1b": "generate -o DATA/manifest.json",
    "1c": "generate -o DATA/dict.en.txt",
    "1d": "generate -o DIRECTORY",
    "2a": "generate, max_source_positions 2**22",
    "2b": "export, max_source_positions 2**22",
    "2c": "generate, a NaN weight",
    "2d": "export, a NaN weight",
    "3a": "export killed (-9) while writing; next export",
    "3b": "export --force killed between renames; next export",
    "4a": f"serve: {FLOOD} partial headers, ulimit -n {SERVE_NOFILE}; a request",
    "4b": "serve: a stalled upload, then SIGTERM",
    "4c": "serve: %0a and %1b in a request path",
    "4d": "serve: a client gone mid-body",
    "4e": "serve --host 0.0.0.0",
    "4f": "serve: GET /info",
    "5a": "train: kill -9 of torchrun (2 gloo workers)",
    "5b": f"train: a SIGSTOPped rank, --ddp-timeout {DDP_TIMEOUT_S}",
}


@dataclass
class Row:
    id: str
    verdict: str
    evidence: str


class Check(Exception):
    """A row's verdict decided early: raise it from inside an attack."""

    def __init__(self, verdict: str, evidence: str):
        super().__init__(evidence)
        self.verdict, self.evidence = verdict, evidence


# ------------------------------------------------------------------------------------ processes

_started: list[subprocess.Popen] = []  # killed at the end if still running


def popen(cmd: list[str], **kw) -> subprocess.Popen:
    kw.setdefault("stdin", subprocess.DEVNULL)
    p = subprocess.Popen([str(c) for c in cmd], env=kw.pop("env", ENV), **kw)
    _started.append(p)
    return p


def stop_started() -> None:
    for p in _started:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
                p.wait(10)


@dataclass
class Done:
    code: int | None  # None: still running at its timeout, then killed
    seconds: float
    rss_mib: float
    out: str
    err: str

    def lines(self) -> list[str]:
        return [x for x in self.err.splitlines() if x.strip()]

    def status(self) -> str:
        return f"timed out after {self.seconds:.0f} s" if self.code is None else f"exit {self.code}"


def run(cmd: list, timeout: float, **kw) -> Done:
    """Run `cmd` to its end (killed after `timeout` seconds): its status, time, peak RSS, output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        p = popen(cmd, stdout=out, stderr=err, **kw)
        code, rss = wait_rusage(p, timeout)
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return Done(code, seconds, rss, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"))


def wait_rusage(p: subprocess.Popen, timeout: float) -> tuple[int | None, float]:
    """(exit status or None if it had to be killed, peak RSS in MiB) of `p`, reaped with wait4
    (its own rusage: what getrusage(RUSAGE_CHILDREN) counts for it)."""
    end = time.monotonic() + timeout
    killed = False
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return (None if killed else p.returncode), usage.ru_maxrss / 1024
        if not killed and time.monotonic() > end:
            p.kill()
            killed = True
        time.sleep(0.02)


def help_of(command: str) -> set[str]:
    """The flags `nmtkit COMMAND --help` lists."""
    d = run([*NMTKIT, command, "--help"], timeout=60)
    return set(re.findall(r"--[a-z][a-z0-9-]+", d.out))


def wait_until(pred: Callable[[], object], timeout: float, poll: float = 0.05):
    """pred()'s first true value within `timeout` seconds, else None."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(poll)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused_in_one_line(d: Done) -> list[str]:
    """What is wrong with a refusal: it must be exit 2 and one line on stderr, no traceback."""
    wrong = []
    if d.code != 2:
        wrong.append(d.status() + " (expected 2)")
    if len(d.lines()) != 1:
        wrong.append(f"{len(d.lines())} lines on stderr")
    if "Traceback" in d.err:
        wrong.append("a traceback")
    return wrong


def verdict(wrong: list[str], fine: str, line: str) -> tuple[str, str]:
    """(held, "FINE: LINE") when nothing is `wrong`, else (BROKEN, "WRONG; WRONG: LINE")."""
    return (BROKEN if wrong else HELD), f"{'; '.join(wrong) if wrong else fine}: {line}"


def shown(d: Done) -> str:
    """The line a command printed (its last one, and how many there were if more)."""
    lines = d.lines()
    if not lines:
        return "(nothing on stderr)"
    return lines[-1] if len(lines) == 1 else f"{lines[-1]} (last of {len(lines)} lines)"


# ------------------------------------------------------------------------------------ the set-up


@dataclass
class Setup:
    root: Path
    data: Path
    ckpt: Path
    positions: Path  # crafted: max_source_positions 2**22
    nan: Path  # crafted: one NaN weight


def build(root: Path) -> Setup:
    """The tiny data directory and checkpoint, and the two crafted checkpoints (module docstring)."""
    import torch

    from nmtkit.checkpoints import MAGIC, save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.data.preprocess import PreprocessConfig, preprocess
    from nmtkit.models import ArchConfig, Transformer

    rng = random.Random(0)
    words = [f"w{i}" for i in range(24)]
    for split, n in (("train", 400), ("valid", 24)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 10))) for _ in range(n)]
        (root / f"{split}.de").write_text("\n".join(src) + "\n", encoding="utf-8")
        (root / f"{split}.en").write_text("\n".join(s.upper() for s in src) + "\n", encoding="utf-8")
    data = root / "data"
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(root / "train"),
                                validpref=[str(root / "valid")], destdir=str(data), bpe="none",
                                joined_dictionary=True))
    src, tgt = load_dictionaries(data)
    torch.manual_seed(0)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    weights = Transformer(cfg, len(src), len(tgt)).state_dict()
    state = {"arch": "test", "arch_config": cfg.to_dict(), "model": weights,
             "dictionaries": {"src_sha256": src.sha256, "tgt_sha256": tgt.sha256, "src_size": len(src),
                              "tgt_size": len(tgt), "src_lang": "de", "tgt_lang": "en"},
             "update": 1, "epoch": 1}
    ckpt = root / "tiny.pt"
    save_checkpoint(state, ckpt)
    # what anyone can write with torch.save, no nmtkit code involved: a file of 40 kB asking for a
    # 2**22 x 16 sinusoid table, and one whose first weight matrix holds a NaN
    positions = root / "crafted-positions.pt"
    torch.save({MAGIC: 1, **state, "arch_config": {**state["arch_config"], "max_source_positions": 2**22}},
               positions)
    poisoned = {k: v.clone() for k, v in weights.items()}
    name = next(k for k, v in poisoned.items() if v.is_floating_point() and v.dim() == 2)
    poisoned[name].view(-1)[0] = float("nan")
    nan = root / "crafted-nan.pt"
    torch.save({MAGIC: 1, **state, "model": poisoned}, nan)
    return Setup(root, data, ckpt, positions, nan)


# ------------------------------------------------------------------------------------ 1. outputs


def attack_outputs(s: Setup) -> Iterator[Row]:
    """Each command writes nothing over a checkpoint, into a data directory, or as a directory."""
    # copies, one per row: a policy that fails damages them, and must not spoil the next row
    data = {rid: shutil.copytree(s.data, s.root / f"data-{rid}") for rid in ("1a", "1b", "1c", "1d")}
    ckpt = Path(shutil.copy2(s.ckpt, s.root / "attention-input.pt"))
    folder = s.root / "an-output-folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept\n", encoding="utf-8")

    def generate(rid: str, out: Path) -> list:
        return [*NMTKIT, "generate", data[rid], "--path", s.ckpt, *GENERATE, "-o", out]

    cases = [
        ("1a", [*NMTKIT, "attention", data["1a"], "--path", ckpt, "--source", "w1 w2", "--format", "npz", "-o", ckpt],
         ckpt),
        ("1b", generate("1b", data["1b"] / "manifest.json"), data["1b"] / "manifest.json"),
        ("1c", generate("1c", data["1c"] / "dict.en.txt"), data["1c"] / "dict.en.txt"),
        ("1d", generate("1d", folder), folder / "notes.txt"),
    ]
    for rid, cmd, target in cases:
        before = sha256(target)
        d = run(cmd, timeout=60)
        wrong = refused_in_one_line(d)
        if not target.is_file() or sha256(target) != before:
            wrong.append(f"{target.name} changed")
        if rid == "1d" and sorted(p.name for p in folder.iterdir()) != ["notes.txt"]:
            wrong.append("the folder changed")
        what = "the directory unchanged" if rid == "1d" else f"{target.name} unchanged"
        yield Row(rid, *verdict(wrong, f"{d.status()}, {what}", shown(d)))


# ------------------------------------------------------------------------------------ 2. bounds


def attack_bounds(s: Setup) -> Iterator[Row]:
    """A crafted checkpoint is one line, fast and small, in generate and export."""
    exports = s.root / "exports-crafted"
    exports.mkdir()
    for rid, cmd, out in [
        ("2a", [*NMTKIT, "generate", s.data, "--path", s.positions, *GENERATE], None),
        ("2b", [*NMTKIT, "export", s.data, "--path", s.positions, "-o", exports / "positions"], exports / "positions"),
        ("2c", [*NMTKIT, "generate", s.data, "--path", s.nan, *GENERATE], None),
        ("2d", [*NMTKIT, "export", s.data, "--path", s.nan, "-o", exports / "nan"], exports / "nan"),
    ]:
        if out is not None and not runtime_installed():
            yield Row(rid, NOT_AVAILABLE, "nmtkit export needs ctranslate2 (pip install -e '.[ctranslate2]' in the nmtkit checkout)")
            continue
        d = run(cmd, timeout=90)
        wrong = refused_in_one_line(d)
        if d.seconds > FAST_S or d.rss_mib > RSS_MIB:
            wrong.append(f"{d.seconds:.1f} s, peak RSS {d.rss_mib:.0f} MiB (at most {FAST_S:g} s, {RSS_MIB} MiB)")
        if out is not None and any(exports.iterdir()):
            wrong.append(f"left {', '.join(p.name for p in exports.iterdir())}")
        yield Row(rid, *verdict(wrong, f"{d.status()} in {d.seconds:.1f} s, peak RSS {d.rss_mib:.0f} MiB", shown(d)))


def runtime_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ctranslate2") is not None


# ------------------------------------------------------------------------------------ 3. killed exports

# `nmtkit export` that stops while it copies the data directory's files into its working folder
# and says so: the attack then kills it from outside with SIGKILL, so no clean-up can run.
STALLED_EXPORT = r"""
import sys, time
import nmtkit.backends.export as E
def stall(*args, **kwargs):
    print("copying", flush=True)
    time.sleep(600)
E.shutil.copy2 = stall
from nmtkit.cli import main
main(sys.argv[1:])
"""

# `nmtkit export --force` killed between its two renames: the earlier export has been moved into
# its `.NAME.nmtkit-export-XXXXXXXX.old` folder (docs/export.md), the new one not yet put in place.
KILLED_BETWEEN_RENAMES = r"""
import os, signal, sys
real = os.replace
def replace(src, dst, *args, **kwargs):
    real(src, dst, *args, **kwargs)
    if os.path.basename(os.path.dirname(os.fspath(dst))).endswith(".old"):
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
from nmtkit.cli import main
main(sys.argv[1:])
"""


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def attack_killed_export(s: Setup) -> Iterator[Row]:
    if not runtime_installed():
        for rid in ("3a", "3b"):
            yield Row(rid, NOT_AVAILABLE, "nmtkit export needs ctranslate2 (pip install -e '.[ctranslate2]' in the nmtkit checkout)")
        return
    exports = s.root / "exports"
    exports.mkdir()
    export = ["export", s.data, "--path", s.ckpt, "-o"]
    # 3a: killed while it writes, from outside
    p = popen([PY, "-c", STALLED_EXPORT, *export, exports / "m"], stdout=subprocess.PIPE)
    said = _wait_for_line(p, "copying", 90)
    if not said:
        p.kill()
        p.wait()
        yield Row("3a", NOT_AVAILABLE, f"the export did not reach its copy step to be killed there ({p.returncode})")
    else:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
        debris = hidden(exports)
        d = run([*NMTKIT, *export, exports / "m"], timeout=90)
        removed = [x for x in d.out.splitlines() if x.startswith("removed ")]
        wrong = []
        if not debris:
            wrong.append("the killed export left nothing to remove (expected its .tmp folder)")
        if d.code != 0:
            wrong.append(f"the next export: {d.status()}: {shown(d)}")
        if len(removed) != len(debris):
            wrong.append(f"{len(removed)} 'removed' lines for {len(debris)} leftovers")
        left = sorted(q.name for q in exports.iterdir())
        if left != ["m"] or not (exports / "m" / "nmtkit.json").is_file():
            wrong.append(f"the folder holds {left}")
        yield Row("3a", *verdict(wrong, f"the killed export left {', '.join(debris)}; the next export: {d.status()}, "
                                        "the folder holds only m", removed[0] if removed else shown(d)))
    # 3b: a --force replacement of m killed between its two renames: m is missing
    before = sha256(exports / "m" / "nmtkit.json") if (exports / "m" / "nmtkit.json").is_file() else None
    k = run([PY, "-c", KILLED_BETWEEN_RENAMES, *export, exports / "m", "--force"], timeout=90)
    if k.code != -signal.SIGKILL or (exports / "m").exists() or before is None:
        yield Row("3b", NOT_AVAILABLE, f"could not kill an export --force between its renames ({k.status()}: "
                  f"{shown(k)})")
        return
    debris = hidden(exports)
    d = run([*NMTKIT, *export, exports / "n"], timeout=90)
    said = [x for x in d.out.splitlines() if x.startswith(("restored ", "removed "))]
    wrong = []
    if d.code != 0:
        wrong.append(f"the next export: {d.status()}: {shown(d)}")
    if not any(x.startswith(f"restored {exports / 'm'} ") for x in said):
        wrong.append("the earlier export was not put back")
    left = sorted(q.name for q in exports.iterdir())
    if left != ["m", "n"]:
        wrong.append(f"the folder holds {left}")
    elif sha256(exports / "m" / "nmtkit.json") != before:
        wrong.append("m is not the earlier export")
    yield Row("3b", *verdict(wrong, f"m missing, {', '.join(debris)} left; the next export (-o n): {d.status()}, "
                                    "m back as it was, the folder holds m and n", said[0] if said else shown(d)))


def _wait_for_line(p: subprocess.Popen, text: str, timeout: float) -> bool:
    """Whether `p` writes the line `text` on its stdout within `timeout` seconds."""
    seen = threading.Event()

    def read():
        for line in p.stdout:
            if line.decode("utf-8", "replace").strip() == text:
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return seen.wait(timeout)


# ------------------------------------------------------------------------------------ 4. the server


class Serve:
    """`nmtkit serve` in a process of its own, its stderr collected line by line (raw bytes)."""

    def __init__(self, args: list, nofile: int | None = None):
        cmd = [*NMTKIT, "serve", *args]
        if nofile:  # as a user would: `ulimit -n N` in the shell that starts it
            cmd = ["bash", "-c", f'ulimit -n {nofile} && exec "$@"', "nmtkit-serve", *cmd]
        self.raw: list[bytes] = []
        self.proc = popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.raw.append(line.rstrip(b"\n"))

    @property
    def lines(self) -> list[str]:
        return [x.decode("utf-8", "replace") for x in list(self.raw)]

    def find(self, text: str, start: int = 0) -> str | None:
        return next((x for x in self.lines[start:] if text in x), None)

    def port(self, timeout: float) -> int:
        line = wait_until(lambda: self.find("listening on") or self.proc.poll() is not None, timeout)
        m = re.search(r"listening on http://(?:\[[^\]]*\]|[^:/]+):(\d+)", line) if isinstance(line, str) else None
        if not m:
            raise Check(BROKEN, f"the server did not start listening ({self._end()})")
        return int(m.group(1))

    def ready(self, timeout: float) -> None:
        if not wait_until(lambda: self.find("nmtkit serve: ready") or self.proc.poll() is not None, timeout) \
                or self.proc.poll() is not None:
            raise Check(BROKEN, f"the server did not get ready ({self._end()})")

    def _end(self) -> str:
        state = "running" if self.proc.poll() is None else f"exit {self.proc.returncode}"
        return f"{state}; last line: {self.lines[-1] if self.raw else '(none)'}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def request(port: int, method: str, path: str, body: bytes = b"", timeout: float = 10) -> tuple[int, bytes, float]:
    """(status, body, seconds) of one request on a new connection."""
    t0 = time.monotonic()
    raw = exchange(port, method, path, body, timeout)
    if not raw:
        raise ConnectionError(f"{method} {path}: the connection was closed without an answer")
    top, _, payload = raw.partition(b"\r\n\r\n")
    return int(top.split()[1]), payload, time.monotonic() - t0


TRANSLATE = json.dumps({"text": ["w1 w2"]}).encode()


def attack_server(s: Setup) -> Iterator[Row]:
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        for rid in ("4a", "4b", "4c", "4d", "4e", "4f"):
            yield Row(rid, NOT_AVAILABLE, "nmtkit serve needs the serve extra (pip install -e '.[serve]' in the nmtkit checkout)")
        return
    flags = help_of("serve")
    graceful = "--graceful-timeout" in flags
    args = [s.data, "--path", s.ckpt, "--port", "0", "--threads", "1", "--beam", "1", "--max-len-b", "4"]
    server = Serve([*args, *(["--graceful-timeout", f"{GRACE_S:g}"] if graceful else [])], nofile=SERVE_NOFILE)
    try:
        try:
            port = server.port(90)
            server.ready(120)
        except Check as c:
            for rid in ("4f", "4c", "4d", "4a", "4b"):
                yield Row(rid, c.verdict, c.evidence)
        else:
            # the order matters: 4c and 4d count the log lines that follow them, which the
            # flood's own lines (one every 10 s) would disturb; SIGTERM ends the server
            for rid, attack in (("4f", _info), ("4c", _injection), ("4d", _gone_mid_body), ("4a", _flood)):
                yield _row(rid, lambda attack=attack: attack(server, port, s))
            if not graceful:
                yield Row("4b", NOT_AVAILABLE, "nmtkit serve has no --graceful-timeout")
            else:
                yield _row("4b", lambda: _stalled_upload_and_sigterm(server, port))
    finally:
        server.close()
    yield _row("4e", lambda: _everywhere(args))


def _row(rid: str, attack: Callable[[], tuple[str, str]]) -> Row:
    try:
        return Row(rid, *attack())
    except Check as c:
        return Row(rid, c.verdict, c.evidence)
    except Exception as e:  # noqa: BLE001 - an attack that went wrong is a row, not the end of the table
        return Row(rid, BROKEN, f"the check stopped: {type(e).__name__}: {e}")


def _info(server: Serve, port: int, s: Setup) -> tuple[str, str]:
    status, body, _ = request(port, "GET", "/info")
    info = json.loads(body)
    strings: list[str] = []

    def walk(x):
        if isinstance(x, str):
            strings.append(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k), walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(info)
    absolute = [x for x in strings if os.path.isabs(x) or str(s.root) in x]
    wrong = []
    if status != 200:
        wrong.append(f"status {status}")
    if absolute:
        wrong.append(f"absolute paths {absolute}")
    return verdict(wrong, "200, no absolute path", f"model paths {info.get('model', {}).get('paths')}")


def _injection(server: Serve, port: int, s: Setup) -> tuple[str, str]:
    before = len(server.raw)
    path = "/a%0a2026-01-01%2000:00:00.000%20GET%20/admin%20200%1b[31m"
    status, _, _ = request(port, "GET", path)
    logged = wait_until(lambda: server.find(" 404 ", before), 5)
    time.sleep(0.3)
    new = list(server.raw)[before:]
    wrong = []
    if status != 404:
        wrong.append(f"status {status} (expected 404)")
    if not logged:
        wrong.append("not logged")
    if any(b < 0x20 or b == 0x7F for x in new for b in x):
        wrong.append("raw control characters in the log")
    if any(x.startswith(b"2026-01-01") for x in new):
        wrong.append("a forged log line")
    line = logged or (new[-1].decode("utf-8", "replace") if new else "(no log line)")
    return verdict(wrong, "404, no raw control character in the log", line)


def _gone_mid_body(server: Serve, port: int, s: Setup) -> tuple[str, str]:
    before = len(server.raw)
    with connect(port, POST_HEAD % 100 + b'{"text": ["w1'):
        time.sleep(0.3)
    wait_until(lambda: len(server.raw) > before, 5)
    time.sleep(0.5)
    new = server.lines[before:]
    ok = len(new) == 1 and " 499 " in new[0] and "went away" in new[0] and "Traceback" not in new[0]
    return (HELD if ok else BROKEN,
            f"one line: {new[0]}" if ok else f"{len(new)} lines: {' | '.join(new[:3]) or '(none)'}")


def _flood(server: Serve, port: int, s: Setup) -> tuple[str, str]:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FLOOD + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise Check(NOT_AVAILABLE, f"this process may open {hard} files (ulimit -Hn), the flood needs {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    before = len(server.raw)
    flood: list[socket.socket] = []
    try:
        for i in range(FLOOD):
            try:
                flood.append(connect(port, b"GET /health HTTP/1.1\r\nHo", timeout=5))
            except OSError as e:
                raise Check(BROKEN, f"connection {i + 1} of the {FLOOD} could not be made: {e}") from None
        time.sleep(1.0)
        try:
            health, _, _ = request(port, "GET", "/health", timeout=10)
            status, _, took = request(port, "POST", "/translate", TRANSLATE, timeout=10)
        except OSError as e:
            raise Check(BROKEN, f"with {len(flood)} slow connections open, a request got no answer: {e}") from None
        evicted = sum(closed(x) for x in flood)
    finally:
        for x in flood:
            x.close()
    new = server.lines[before:]
    bad = [x for x in new if "Traceback" in x or "Too many open files" in x]
    note = next((x for x in new if "--max-connections" in x), "(no log line)")
    wrong = []
    if health != 200 or status != 200:
        wrong.append(f"/health {health}, /translate {status}")
    if bad:
        wrong.append(f"{len(bad)} log lines like: {bad[0]}")
    if server.proc.poll() is not None:
        wrong.append(f"the server exited ({server.proc.returncode})")
    return verdict(wrong, f"/health and /translate 200 ({took:.2f} s), {evicted} of the {FLOOD} closed by the "
                          "server", note)


def _stalled_upload_and_sigterm(server: Serve, port: int) -> tuple[str, str]:
    before = len(server.raw)
    stalled = connect(port, POST_HEAD % len(TRANSLATE) + TRANSLATE[:5], timeout=GRACE_S + 5)
    time.sleep(0.3)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        dropped = read_all(stalled) == b""
    except OSError:
        dropped = False
    finally:
        stalled.close()
    try:
        code = server.proc.wait(GRACE_S + 10)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - t0
    lines = server.lines[before:]
    line = next((x for x in lines if " 499 " in x), lines[-1] if lines else "(no log line)")
    wrong = []
    if code is None:
        wrong.append(f"still running {took:.0f} s after SIGTERM")
    elif code != 0:
        wrong.append(f"exit {code}")
    if code is not None and took > GRACE_S:
        wrong.append(f"exited {took:.1f} s after SIGTERM, more than --graceful-timeout {GRACE_S:g}")
    if not dropped:
        wrong.append("the stalled upload was not closed")
    return verdict(wrong, f"exit 0 {took:.1f} s after SIGTERM (--graceful-timeout {GRACE_S:g}), upload closed", line)


def _everywhere(args: list) -> tuple[str, str]:
    """--host 0.0.0.0 (nothing connects to it): one warning line, then SIGTERM."""
    server = Serve([*args, "--host", "0.0.0.0"])
    try:
        server.port(90)
        wait_until(lambda: server.find("warning"), 3)
        time.sleep(0.2)
        warnings = [x for x in server.lines if "warning" in x and "0.0.0.0" in x]
        server.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(30)
    finally:
        server.close()
    ok = len(warnings) == 1
    return HELD if ok else BROKEN, (f"one line: {warnings[0]}" if ok else f"{len(warnings)} warning lines")


# ------------------------------------------------------------------------------------ 5. training


def attack_training(s: Setup) -> Iterator[Row]:
    yield _row("5a", lambda: _launcher_killed(s))
    yield _row("5b", lambda: _stopped_rank(s))


def _launcher_killed(s: Setup) -> tuple[str, str]:
    save = s.root / "train-launcher"
    err = s.root / "train-launcher.err"
    d = run(subreaper_command(torchrun_command(s.data, save), save / "train_log.jsonl", err, wait_s=150, reap_s=30),
            timeout=180)
    try:
        out = json.loads(d.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise Check(BROKEN, f"the launcher attack failed: {d.status()}: {shown(d)}") from None
    if "error" in out:
        raise Check(BROKEN, f"{out['error']}: {_last(err)}")
    codes = [code for code, _ in out["status"].values()]
    seconds = max((t for _, t in out["status"].values()), default=0.0)
    lines = sorted((x for x in _text(err).splitlines() if "the torchrun launcher" in x), key=lambda x: "rank 0" not in x)
    free = lock_is_free(save)
    wrong = []
    if len(codes) < len(out["workers"]):
        wrong.append(f"{len(out['workers']) - len(codes)} of {len(out['workers'])} workers still running 30 s after")
    if set(codes) != {143}:
        wrong.append(f"exit statuses {codes} (expected 143)")
    if seconds > LAUNCHER_S:
        wrong.append(f"the last exited after {seconds:.1f} s (at most {LAUNCHER_S:g})")
    if len(lines) != 2:
        wrong.append(f"{len(lines)} lines about the launcher from 2 workers")
    if not free:
        wrong.append("the save-dir lock is still held")
    return verdict(wrong, f"both workers exit 143 within {seconds:.2f} s of the kill, lock free",
                   lines[0] if lines else _last(err))


def _stopped_rank(s: Setup) -> tuple[str, str]:
    save = s.root / "train-stopped"
    errs = [s.root / f"train-rank{r}.err" for r in range(2)]
    procs = start_two_ranks(s.data, save, errs, ENV, DDP_TIMEOUT_S)
    _started.extend(procs)
    try:
        if not wait_until(lambda: log_has(save / "train_log.jsonl", "train")
                          or any(p.poll() is not None for p in procs), 120, poll=0.1) \
                or any(p.poll() is not None for p in procs):
            if any(p.poll() is not None for p in procs) and "--ddp-timeout" not in help_of("train"):
                raise Check(NOT_AVAILABLE, "nmtkit train has no --ddp-timeout")
            raise Check(BROKEN, f"no update within 120 s (statuses {[p.poll() for p in procs]}): {_last(errs[0])}")
        os.kill(procs[1].pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            code0 = procs[0].wait(DDP_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            code0 = None
        waited = time.monotonic() - t0
        os.kill(procs[1].pid, signal.SIGCONT)
        try:
            code1 = procs[1].wait(30)
        except subprocess.TimeoutExpired:
            code1 = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    lines0 = [x for x in _text(errs[0]).splitlines() if x.startswith("nmtkit: error:")]
    free = lock_is_free(save)
    wrong = []
    if code0 is None:
        wrong.append(f"rank 0 still running {waited:.0f} s after rank 1 stopped")
    elif code0 != 2:
        wrong.append(f"rank 0: exit {code0} (expected 2)")
    elif not DDP_TIMEOUT_S - 0.5 < waited < DDP_TIMEOUT_S + 15:
        wrong.append(f"rank 0 exited after {waited:.1f} s (--ddp-timeout {DDP_TIMEOUT_S})")
    if len(lines0) != 1:
        wrong.append(f"rank 0 printed {len(lines0)} error lines")
    if code1 is None or code1 == 0:
        wrong.append(f"rank 1, continued: {'still running' if code1 is None else 'exit 0'}")
    if not free:
        wrong.append("the save-dir lock is still held")
    return verdict(wrong, f"rank 0 exit 2 after {waited:.1f} s, rank 1 (continued) exit {code1}, lock free",
                   lines0[0] if lines0 else _last(errs[0]))


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _last(path: Path) -> str:
    lines = [x for x in _text(path).splitlines() if x.strip()]
    return lines[-1] if lines else "(nothing on stderr)"


# ------------------------------------------------------------------------------------ the table

GROUPS: dict[str, Callable[[Setup], Iterator[Row]]] = {
    "1": attack_outputs, "2": attack_bounds, "3": attack_killed_export, "4": attack_server, "5": attack_training,
}


def printable(text: str) -> str:
    """`text` with control and other invisible characters as \\xNN escapes: what a broken
    server logged must not drive the terminal that shows the table."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   for c in text)


def table(rows: list[Row], root: Path) -> str:
    width = max(len(t) for t in ROWS.values())
    out = [f"{'':2}  {'attack':<{width}}  {'result':<13}  evidence", f"{'':2}  {'-' * width}  {'-' * 13}  {'-' * 8}"]
    for r in sorted(rows, key=lambda r: r.id):
        evidence = printable(r.evidence.replace(str(root), "WORK"))
        out.append(f"{r.id:2}  {ROWS[r.id]:<{width}}  {r.verdict:<13}  {evidence}")
    return "\n".join(out)


def about() -> str:
    """What was attacked: the code's place and versions, and the machine's CPUs."""
    import torch

    import nmtkit

    return (f"nmtkit {nmtkit.__version__} from {Path(nmtkit.__file__).parent}, torch {torch.__version__}, "
            f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the fault attacks against a tiny set-up; print what held.")
    ap.add_argument("--only", default="1,2,3,4,5", help="groups to run, comma-separated (default: all)")
    ap.add_argument("--work", help="an empty or new folder for the set-up, kept (default: a new temporary folder, "
                                   "removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args(argv)
    groups = [g.strip() for g in a.only.split(",") if g.strip()]
    if not groups or any(g not in GROUPS for g in groups):
        ap.error(f"--only takes group numbers among {', '.join(GROUPS)}, got {a.only!r}")
    if not sys.platform.startswith("linux"):
        print("faults: the attacks need Linux (prctl, /proc, flock)", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    root = Path(a.work).resolve() if a.work else Path(tempfile.mkdtemp(prefix="nmtkit-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        ap.error(f"--work {root} is not empty")
    keep = a.keep or a.work is not None
    rows: list[Row] = []
    try:
        setup = build(root)
        print(f"[faults] set-up in {time.monotonic() - t0:.1f} s under {root}", file=sys.stderr, flush=True)
        for g in groups:
            try:
                for row in GROUPS[g](setup):
                    rows.append(row)
                    print(f"[faults] {row.id} {row.verdict} ({time.monotonic() - t0:.0f} s)", file=sys.stderr,
                          flush=True)
            except Exception as e:  # noqa: BLE001 - the group's remaining rows say what stopped it
                done = {r.id for r in rows}
                rows += [Row(rid, BROKEN, f"the check stopped: {type(e).__name__}: {e}")
                         for rid in ROWS if rid.startswith(g) and rid not in done]
    finally:
        stop_started()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{about()}\n")
    print(table(rows, root))
    held = sum(r.verdict == HELD for r in rows)
    broken = sum(r.verdict == BROKEN for r in rows)
    print(f"\n{held} held, {broken} BROKEN, {len(rows) - held - broken} not available; {time.monotonic() - t0:.0f} s "
          f"(WORK: {root}{', kept' if keep else ', removed'})")
    return 0 if held == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
