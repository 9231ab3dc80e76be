"""`nmtkit serve` against clients that misbehave: slow or stalled ones, too many of them, ones
that go away mid-request, hostile paths; and its shutdown, exposure warning and /info.

The translator is `Echo` (no model: it upper-cases each sentence, after an optional delay):
what is tested is the server around it. Clients are raw sockets, which can send part of a
request and stop. In-process servers (`serving`) serve most tests, with timeouts of about a
second (the flags); signals, exit statuses and open-file limits need a process of their own
(`ServerProcess`, this module run as a script).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from nmtkit.errors import UserError
from nmtkit.search.config import SearchConfig
from nmtkit.serving.options import ServeOptions

from fault_tools import POST_HEAD, closed, connect, exchange, read_all

REPO = Path(__file__).resolve().parents[1]


class Echo:
    """A translator without a model: each sentence upper-cased, after `delay` seconds per call
    (a long search), or once `gate` is set. `big:N` gives N x's (an answer larger than the
    sockets' buffers); `fail:MESSAGE` raises RuntimeError(MESSAGE) (a bug)."""

    src_lang, tgt_lang, task, device = "de", "en", "translation", "cpu"

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None):
        self.search = SearchConfig(max_len_b=6)
        self.engine = SimpleNamespace(name="echo", architectures=lambda: [{"d_model": 8}])
        self.delay, self.gate = delay, gate

    def search_config(self, **settings):
        return dataclasses.replace(self.search, **settings)

    def translate_nbest(self, sentences, **settings):
        time.sleep(self.delay)
        if self.gate is not None:
            self.gate.wait(30)
        rows = []
        for s in sentences:
            if s.startswith("fail:"):
                raise RuntimeError(s[5:])
            rows.append([SimpleNamespace(text="x" * int(s[4:]) if s.startswith("big:") else s.upper(), score=0.0)])
        return rows


def echo_options(model: str, **kw) -> ServeOptions:
    kw.setdefault("header_timeout", 1.0)
    kw.setdefault("body_timeout", 1.0)
    kw.setdefault("graceful_timeout", 5.0)
    kw.setdefault("max_wait_ms", 0.0)
    return ServeOptions(paths=[model], port=0, threads=1, **kw)


@pytest.fixture
def model(tmp_path) -> str:
    f = tmp_path / "ckpt" / "model.pt"
    f.parent.mkdir()
    f.write_bytes(b"not read by Echo")
    return str(f)


@contextlib.contextmanager
def serving(opts: ServeOptions, translator=None):
    """An in-process server on 127.0.0.1, ready: (port, Server, its log lines)."""
    pytest.importorskip("uvicorn")
    from nmtkit.serving.server import Server

    logs: list[str] = []
    tr = translator or Echo()
    srv = Server(opts, load=lambda o, warn: tr, log=logs.append)
    port = srv.bind()
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    wait_until(lambda: srv.state.ready)
    try:
        yield port, srv, logs
    finally:
        srv.stop()
        t.join(30)
        assert not t.is_alive()


def wait_until(condition, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def read_answer(s: socket.socket) -> bytes:
    """One answer (headers and its Content-Length of body), leaving the connection open."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += s.recv(65536)
    size = int(re.search(rb"content-length: (\d+)", raw.lower()).group(1))
    while len(raw.partition(b"\r\n\r\n")[2]) < size:
        raw += s.recv(65536)
    return raw


def noted(logs: list[str], text: str) -> tuple[int, int]:
    """(lines, events) of a kind of `Notes` line: each line after the first counts its events."""
    lines = [x for x in logs if text in x]
    events = sum(int(m.group(1)) if (m := re.search(r"\((\d+) times? in the last \d+ s\)$", x)) else 1
                 for x in lines)
    return len(lines), events


def status_and_body(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def request(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, dict]:
    return status_and_body(exchange(port, method, path, body))


def translate(port: int, texts: list[str]) -> tuple[int, dict]:
    return request(port, "POST", "/translate", json.dumps({"text": texts}).encode())


# ------------------------------------------------------------------------------- slow clients


def test_partial_headers_get_408_and_silent_connections_are_closed(model):
    with serving(echo_options(model, header_timeout=0.5)) as (port, _, logs):
        t0 = time.monotonic()
        with connect(port, b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Le") as slow, connect(port) as silent:
            status, body = status_and_body(read_all(slow))
            assert status == 408 and body == {"error": "the request's headers did not arrive within 0.5 s "
                                                        "(--header-timeout)"}
            assert read_all(silent) == b""  # a connection that never sent a byte is closed without a word
        assert 0.4 < time.monotonic() - t0 < 5
        assert translate(port, ["ein hund"]) == (200, {"translations": ["EIN HUND"]})
    slow_lines = [x for x in logs if "did not arrive within 0.5 s (--header-timeout)" in x]
    assert len(slow_lines) == 1 and slow_lines[0].endswith("(at most one such line every 10 s)")


def test_a_stalled_body_gets_408_and_its_connection_closed(model):
    with serving(echo_options(model, body_timeout=0.5)) as (port, _, logs):
        body = json.dumps({"text": ["ein hund"]}).encode()
        t0 = time.monotonic()
        with connect(port, POST_HEAD % len(body) + body[:10]) as s:
            raw = read_all(s)  # answered, then closed
        assert 0.4 < time.monotonic() - t0 < 5
        assert status_and_body(raw) == (408, {"error": "the request body did not arrive within 0.5 s"})
        assert b"connection: close" in raw.lower()
        assert translate(port, ["ein hund"]) == (200, {"translations": ["EIN HUND"]})
    assert sum(" POST /translate 408 " in x for x in logs) == 1


def test_an_unread_body_after_413_is_discarded_for_at_most_the_body_timeout(model):
    opts = echo_options(model, body_timeout=0.8, max_request_sentences=1, max_sentence_chars=1)
    with serving(opts) as (port, srv, _):
        limit = srv.limits.max_body_bytes
        with connect(port, POST_HEAD % 10_000_000 + b" " * 100) as s:
            assert status_and_body(read_answer(s)) == (413, {"error": f"the request body has 10000000 bytes; "
                                                                      f"at most {limit}"})
            t0 = time.monotonic()
            with contextlib.suppress(OSError):  # a client that goes on sending what was refused
                while time.monotonic() - t0 < 5 and not closed(s):
                    s.sendall(b" " * 100)
                    time.sleep(0.05)
            assert closed(s) and time.monotonic() - t0 < 3


def test_a_client_that_does_not_read_its_answer_is_disconnected(model):
    with serving(echo_options(model, body_timeout=0.5, max_sentence_chars=100)) as (port, _, logs):
        body = json.dumps({"text": ["big:30000000"]}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        with s:
            s.sendall(POST_HEAD % len(body) + body)
            wait_until(lambda: any("read nothing of its answer for 0.5 s" in x for x in logs), 20)
            s.settimeout(10)
            assert len(read_all(s)) < 30_000_000  # cut off before the end
        assert translate(port, ["ein hund"]) == (200, {"translations": ["EIN HUND"]})


def test_connections_are_limited_and_the_longest_waiting_makes_room(model):
    gate = threading.Event()
    with serving(echo_options(model, max_connections=4, header_timeout=30), Echo(gate=gate)) as (port, _, logs):
        slow = [connect(port, b"GET /health HTTP/1.1\r\nHo") for _ in range(6)]
        time.sleep(0.3)
        # a full server still answers: the connections that waited longest for a request are closed
        assert request(port, "GET", "/health") == (200, {"status": "ok"})
        wait_until(lambda: sum(closed(s) for s in slow) == 3)
        assert [closed(s) for s in slow] == [True] * 3 + [False] * 3
        for s in slow:
            s.close()
        # every connection with a request under way: a new one gets 503 at once
        body = json.dumps({"text": ["ein hund"]}).encode()
        busy = [connect(port, POST_HEAD % len(body) + body) for _ in range(4)]
        time.sleep(0.5)
        refused = []
        for _ in range(20):
            with connect(port) as s:
                refused.append(status_and_body(read_all(s)))
        assert refused[0] == (503, {"error": "the server holds 4 connections, each with a request under way "
                                             "(--max-connections); try again later"})
        assert all(r == refused[0] for r in refused)
        gate.set()
        for s in busy:
            with s:
                assert status_and_body(read_answer(s)) == (200, {"translations": ["EIN HUND"]})
        assert translate(port, ["ein hund"]) == (200, {"translations": ["EIN HUND"]})
    # 20 refusals: one line, and the count of the others when the server stops
    assert noted(logs, "new connections get 503") == (2, 20)
    assert noted(logs, "closing the connections that waited longest") == (2, 3)


def test_connection_limit_follows_the_open_file_limit(monkeypatch):
    resource = pytest.importorskip("resource")
    from nmtkit.serving import server

    limits = {"now": (1024, 4096)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: limits.update(now=value))
    assert server.connection_limit(None) == 1024 - 128
    assert server.connection_limit(100) == 100 and limits["now"] == (1024, 4096)
    assert server.connection_limit(2000) == 2000 and limits["now"] == (2250, 4096)  # raised to make room
    limits["now"] = (1024, 4096)
    with pytest.raises(UserError, match=r"--max-connections 5000 needs about 5625 open files; this process may "
                                        r"open at most 4096 \(ulimit -Hn\)"):
        server.connection_limit(5000)
    limits["now"] = (200, 200)
    assert server.connection_limit(None) == 200 - 64
    limits["now"] = (1 << 20, 1 << 20)
    assert server.connection_limit(None) == 1000


# ------------------------------------------------------------- a server process of its own


def main() -> None:
    """`python tests/test_serve_hardening.py CONFIG`: a server on Echo, in the main thread (it
    gets the signals), with the open-file limit CONFIG asks; stdin lines `fill` / `free` use up
    and give back every file descriptor left."""
    cfg = json.loads(sys.argv[1])
    if cfg.get("nofile"):
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["nofile"], resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from nmtkit.serving.server import Server

    held: list[int] = []

    def commands():
        for line in sys.stdin:
            if line.strip() == "fill":
                with contextlib.suppress(OSError):
                    while True:
                        held.append(os.open(os.devnull, os.O_RDONLY))
            else:
                while held:
                    os.close(held.pop())
            print(line.strip(), flush=True)

    threading.Thread(target=commands, daemon=True).start()
    tr = Echo(delay=cfg.get("delay", 0.0))
    srv = Server(echo_options(cfg["model"], **cfg.get("flags", {})), load=lambda o, warn: tr)
    srv.bind()
    sys.exit(srv.run())


class ServerProcess:
    """This module's `main` in a process of its own: its port, stderr lines, stdin commands."""

    def __init__(self, model: str, **cfg):
        pytest.importorskip("uvicorn")
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, __file__, json.dumps({"model": model, **cfg})], cwd=REPO,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.err: list[str] = []
        self.err_bytes = 0
        threading.Thread(target=self._read, daemon=True).start()
        wait_until(lambda: any("ready" in x for x in self.err) or self.proc.poll() is not None, 120)
        m = next((re.search(r"listening on http://127\.0\.0\.1:(\d+)", x) for x in self.err if "listening" in x), None)
        assert m and self.proc.poll() is None, self.err
        self.port = int(m.group(1))

    def _read(self):
        for line in self.proc.stderr:
            self.err_bytes += len(line)
            if len(self.err) < 10_000:
                self.err.append(line.decode("utf-8", "replace").rstrip("\n"))

    def command(self, word: str) -> None:
        self.proc.stdin.write(f"{word}\n".encode())
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().decode().strip() == word

    def stop(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def server_process(model: str, **cfg):
    p = ServerProcess(model, **cfg)
    try:
        yield p
    finally:
        p.close()


def test_a_flood_of_slow_connections_under_a_low_open_file_limit_leaves_it_answering(model):
    """Before: 150 connections sending part of their headers, under `ulimit -n 128`, used every
    file descriptor; `accept()` failed thousands of times a second, each logged with a
    traceback, and nobody was answered."""
    with server_process(model, nofile=128, flags={"header_timeout": 30}) as p:
        flood = []
        for _ in range(150):
            flood.append(connect(p.port, b"GET /health HTTP/1.1\r\nHo"))
        time.sleep(1.0)
        assert request(p.port, "GET", "/health") == (200, {"status": "ok"})
        assert translate(p.port, ["ein hund"]) == (200, {"translations": ["EIN HUND"]})
        for s in flood:
            s.close()
        p.stop()
        assert p.proc.wait(20) == 0
    assert p.err_bytes < 5000 and not any("Traceback" in x or "Too many open files" in x for x in p.err), p.err[:20]
    assert noted(p.err, "closing the connections that waited longest") == (2, 150 + 1 - 64)


def test_accept_failing_for_lack_of_file_descriptors_is_one_line(model):
    """Before: each failed accept() was an asyncio error with a traceback (84 MB of stderr in 15 s)."""
    with server_process(model, nofile=256) as p:
        p.command("fill")  # the process has no file descriptor left: accept() fails with EMFILE
        waiting = [connect(p.port) for _ in range(5)]
        time.sleep(2.5)
        p.command("free")
        assert request(p.port, "GET", "/health") == (200, {"status": "ok"})  # accepting again
        for s in waiting:
            s.close()
        p.stop()
        assert p.proc.wait(20) == 0
    lines = [x for x in p.err if "Too many open files" in x]
    # one try a second for 2.5 s: the first line, and their count when the server stops
    assert len(lines) == 2 and 2 <= noted(p.err, "Too many open files")[1] <= 4, p.err[:20]
    assert lines[0].startswith("nmtkit serve: warning: cannot accept connections: Too many open "
                                                   "files (open-file limit 256); trying again every second"), p.err[:20]
    assert p.err_bytes < 5000 and not any("Traceback" in x for x in p.err)


# ------------------------------------------------------------------------------------ shutdown


def test_sigterm_answers_the_request_in_flight_drops_a_stalled_upload_and_exits_0(model):
    """Before: the stalled upload kept the process alive for ever, after the port had closed."""
    with server_process(model, flags={"max_wait_ms": 1500.0, "body_timeout": 60.0}) as p:
        body = json.dumps({"text": ["ein hund"]}).encode()
        stalled = connect(p.port, POST_HEAD % len(body) + body[:5])
        waiting = connect(p.port, POST_HEAD % len(body) + body)  # queued: waits 1.5 s for company
        time.sleep(0.5)
        t0 = time.monotonic()
        p.stop()
        assert read_all(stalled) == b""  # dropped at once
        assert status_and_body(read_answer(waiting)) == (200, {"translations": ["EIN HUND"]})
        assert p.proc.wait(20) == 0
        assert time.monotonic() - t0 < 5
    text = "\n".join(p.err)
    assert "POST /translate 499 " in text and "dropped: the server is stopping (while sending its request)" in text
    assert " POST /translate 200 sentences=1 batch=1 " in text and p.err[-1] == "nmtkit serve: stopped"


@pytest.mark.parametrize("second_signal", [False, True])
def test_shutdown_takes_at_most_the_graceful_timeout_or_a_second_signal_and_exits_3(model, second_signal):
    grace = 60.0 if second_signal else 1.0
    with server_process(model, delay=30.0, flags={"graceful_timeout": grace}) as p:
        body = json.dumps({"text": ["ein hund"]}).encode()
        searching = connect(p.port, POST_HEAD % len(body) + body, timeout=30)  # a search of 30 s
        time.sleep(0.5)
        t0 = time.monotonic()
        p.stop()
        if second_signal:
            time.sleep(0.5)
            p.stop(signal.SIGINT)
        assert read_all(searching) == b""  # not answered
        assert p.proc.wait(20) == 3
        assert time.monotonic() - t0 < grace + 3
    why = "a second signal" if second_signal else "--graceful-timeout 1 s passed"
    assert f"nmtkit serve: {why}: dropping 1 request not answered yet" in p.err
    assert any("POST /translate 499 sentences=1 " in x and f"dropped: {why} (result discarded)" in x for x in p.err)
    assert p.err[-1] == "nmtkit serve: stopped (1 request dropped unanswered)"
    if second_signal:
        assert "nmtkit serve: SIGINT again: dropping the requests in flight" in p.err


# ------------------------------------------------------------------------------------ the log


def test_control_characters_are_escaped_in_every_log_line(model):
    with serving(echo_options(model)) as (port, _, logs):
        status, body = request(port, "GET", "/a%0a2026-01-01%2000:00:00.000%20GET%20/admin%20200%1b[31m")
        assert status == 404 and body["error"].startswith("no such path /a")  # the answer is JSON: escaped
        status, _ = translate(port, ["fail:bad\nnmtkit serve: forged\x1b[2J"])  # a bug's message, with a traceback
        assert status == 500
        wait_until(lambda: sum(" POST /translate 500 " in x for x in logs) == 1)
    assert all(x.isprintable() for x in logs), [x for x in logs if not x.isprintable()]
    assert not any(x.startswith(("2026-01-01", "nmtkit serve: forged")) for x in logs)
    assert any(x.endswith(r" GET /a\x0a2026-01-01 00:00:00.000 GET /admin 200\x1b[31m 404 "
                          + x.rsplit(" 404 ", 1)[1]) for x in logs if " 404 " in x)
    assert r"RuntimeError: bad\x0anmtkit serve: forged\x1b[2J" in logs  # the traceback's last line
    assert "nmtkit serve: error: Exception in ASGI application" in logs


def test_printable_escapes_what_a_terminal_would_act_on():
    from nmtkit.serving.logs import printable

    assert printable("GET /über ok") == "GET /über ok"
    assert printable("a\nb\r\x1b[31m\x00\x7f\x85\u2028\u202e\t") == r"a\x0ab\x0d\x1b[31m\x00\x7f\x85\u2028\u202e\x09"


def test_notes_write_one_line_per_interval_with_the_count():
    from nmtkit.serving.logs import Notes

    now, out = [100.0], []
    notes = Notes(out.append, interval=10, clock=lambda: now[0])
    for _ in range(1000):
        notes.note("accept", "cannot accept")
    assert out == ["cannot accept (at most one such line every 10 s)"]
    now[0] += 4
    notes.flush()
    assert len(out) == 1
    now[0] += 6
    notes.flush()
    assert out[1] == "cannot accept (999 times in the last 10 s)"
    notes.flush()
    assert len(out) == 2
    notes.note("accept", "cannot accept")
    notes.note("accept", "cannot accept")
    now[0] += 1
    notes.flush(everything=True)  # the server stops: the count so far
    assert out[2:] == ["cannot accept (2 times in the last 1 s)"]


def test_a_client_gone_mid_body_is_one_line_not_a_500(model):
    """Before: a 500 and a traceback of 45 lines."""
    with serving(echo_options(model)) as (port, _, logs):
        before = len(logs)
        with connect(port, POST_HEAD % 100 + b'{"text": ["ein'):
            time.sleep(0.3)
        wait_until(lambda: len(logs) > before)
        time.sleep(0.3)
        new = logs[before:]
    assert len(new) == 1 and re.fullmatch(r"\S+ \S+ POST /translate 499 latency_ms=\d+\.\d "
                                          r"client went away \(while sending its request\)", new[0]), new


# ------------------------------------------------------------------------------- exposure, /info


@pytest.mark.parametrize("host,warned", [("127.0.0.1", False), ("0.0.0.0", True)])
def test_listening_beyond_loopback_is_one_warning_and_info_names_the_model(model, tmp_path, host, warned):
    export = tmp_path / "m30k-ct2"
    export.mkdir()
    (export / "model.bin").write_bytes(b"x")
    opts = echo_options(model, host=host)
    opts.paths = [model, str(export) + "/"]
    with serving(opts) as (port, _, logs):
        status, info = request(port, "GET", "/info")
    assert status == 200 and info["model"]["paths"] == ["model.pt", "m30k-ct2"]
    assert str(tmp_path) not in json.dumps(info)
    warnings = [x for x in logs if "beyond loopback" in x]
    assert len(warnings) == int(warned)
    if warned:
        assert warnings[0].startswith("nmtkit serve: warning: --host 0.0.0.0 listens beyond loopback: anyone who can "
                                      f"reach port {port} can use this server")


def test_new_flags_are_checked(model, monkeypatch):
    import nmtkit.serving.options as O

    monkeypatch.setattr(O, "check_model_options", lambda opts: None)  # the model's own checks: test_serve.py
    for flags, message in [({"header_timeout": 0.0}, "--header-timeout must be in (0, 3600] seconds, got 0.0"),
                           ({"body_timeout": -1.0}, "--body-timeout must be in (0, 3600] seconds, got -1.0"),
                           ({"graceful_timeout": -1.0}, "--graceful-timeout must be in [0, 3600] seconds, got -1.0"),
                           ({"max_connections": 0}, "--max-connections must be >= 1, got 0")]:
        with pytest.raises(UserError, match=re.escape(message)):
            echo_options(model, **flags).validate()


if __name__ == "__main__":
    main()
