"""A soak of `nmtkit serve`: mixed clients for a while, then whether the server stayed correct
and kept no memory or file descriptors. Run through `bash recipes/bench/serve_soak.sh` (which
prepares the environment; its header lists the options).

    python recipes/bench/serve_soak.py [--seconds 600] [--json FILE] [--path CKPT DATA_DIR --input FILE]

One `python -m nmtkit serve` process on 127.0.0.1 (a free port), with small request limits of its
own (--max-beam, --max-request-sentences, --max-sentence-chars), serves either the given model or
a tiny random one built from nothing by recipes/bench/faults.py's `build` (a word-mapping data
directory and a 1+1-layer checkpoint, in a temporary folder). Client threads (standard library
http.client, a thread per kind, several for valid requests) send, until the time is up:

- valid: 1 to --max-request-sentences sentences drawn from a pool, with a random beam and nbest
  within the server's limits (or none: the server's defaults) and scores (200);
- invalid: bad JSON, not UTF-8, unknown fields, wrong types, nbest above the beam, a wrong path or
  method, bad /attention fields (400, 404, 405);
- slow: a valid request whose body is sent byte by byte with pauses (200, compared too);
- oversized: a sentence too many, a sentence too long, a beam too large, a body over the server's
  limit sent whole or chunked (413);
- gone: a client that closes mid-body, or right after its request (no answer to read);
- page: GET /, /health, /info (200);
- attention: POST /attention of a pool sentence (200; 501 for a model without attention weights).
503 is accepted for every request (a full queue or too many connections say so, by design).

A warm-up of the same load comes first; then the clients stop, and once the server's descriptor
count is steady its RSS (/proc/PID/status VmRSS) and open descriptors (/proc/PID/fd) are read;
the same after the run. Every translation answered is checked against `nmtkit generate
--batch-size 1 --print-scores` (each sentence searched alone, the same flags), run in this process
once per (beam, nbest) on the distinct sentences asked with it, after the server stopped: texts
equal, scores within 1e-4 (batching changes rounding only, docs/serve.md). A blank sentence must
give [("", 0.0)], as documented.

The criteria (exit status 0 when all hold, 1 naming those that did not): 0 wrong answers; 0
statuses other than the one expected (or 503); 0 answers 5xx other than 503, from the clients or
in the server's log; the server's RSS at the end within 5% of the start; as many open descriptors
at the end as at the start; the server exits 0 on SIGTERM with no traceback in its log; every
request that expects an answer got one.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import random
import re
import shlex
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from faults import REPO, build  # recipes/bench/ is on sys.path: the script's folder
from serve_bench import ServerProcess, read_sentences

KINDS = ("valid", "invalid", "slow", "oversized", "gone", "page", "attention")
RSS_TOLERANCE = 0.05
SCORE_TOLERANCE = 1e-4  # generate prints 6 decimals; batching moves scores by about 1e-5
TIMEOUT_S = 120  # a request's answer on a loaded machine
PAUSE_S = 0.01  # between the cheap requests (page, invalid, oversized): the CPU is left to the translations


# ------------------------------------------------------------------------------------ statistics


@dataclass
class Stats:
    """What the clients saw, shared by their threads (under `lock`)."""

    sent: Counter = field(default_factory=Counter)  # kind -> requests sent
    answered: Counter = field(default_factory=Counter)  # kind -> HTTP answers read
    unanswered: Counter = field(default_factory=Counter)  # kind -> no answer where one was due
    statuses: dict = field(default_factory=lambda: {k: Counter() for k in KINDS})
    unexpected: list = field(default_factory=list)  # (kind, what, expected, status, body)
    answers: dict = field(default_factory=dict)  # (sentence, beam, nbest) -> Counter of answers
    crashed: list = field(default_factory=list)  # a client thread's own exception: the soak is broken
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, what: str, expected: set[int], status: int | None, body: bytes = b"") -> None:
        with self.lock:
            self.sent[kind] += 1
            if status is None:
                if expected:
                    self.unanswered[kind] += 1
                    self.unexpected.append((kind, what, sorted(expected), None, "no answer"))
                return
            self.answered[kind] += 1
            self.statuses[kind][status] += 1
            if status not in expected | {503}:
                self.unexpected.append((kind, what, sorted(expected), status, body[:200].decode("utf-8", "replace")))

    def answer(self, key: tuple, rows: tuple) -> None:
        with self.lock:
            self.answers.setdefault(key, Counter())[rows] += 1


# ------------------------------------------------------------------------------------ requests


@dataclass
class Target:
    """The server under test and what a request may ask of it (from its /info)."""

    port: int
    pool: list[str]
    max_sentences: int
    max_chars: int
    max_beam: int
    max_body: int
    default_nbest: int
    attention: bool
    ui: bool


def connect(t: Target) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", t.port, timeout=TIMEOUT_S)


def exchange(t: Target, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int | None, bytes]:
    """(status, body) of one request on a new connection; (None, why) when no answer came."""
    conn = connect(t)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})},
                     encode_chunked=body is not None and not isinstance(body, (bytes, str)))
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return None, repr(e).encode()
    finally:
        conn.close()


def valid_body(t: Target, rng: random.Random) -> tuple[dict, int | None, int | None]:
    """A valid /translate request: (body, beam, nbest); beam and nbest None for the server's."""
    text = [rng.choice(t.pool) for _ in range(rng.randint(1, t.max_sentences))]
    body: dict = {"text": text, "scores": True}
    if rng.random() < 0.2:
        return body, None, None
    beam = rng.randint(1, t.max_beam)
    nbest = rng.randint(1, beam)
    return {**body, "beam": beam, "nbest": nbest}, beam, nbest


def keep_answer(stats: Stats, body: dict, beam, nbest, data: bytes) -> None:
    """Each sentence's answer as ((text, score), ...), for the comparison with generate."""
    got = json.loads(data)
    for s, tr, sc in zip(body["text"], got["translations"], got["scores"], strict=True):
        rows = tuple(zip(tr, sc, strict=True)) if isinstance(tr, list) else ((tr, sc),)
        stats.answer((s, beam, nbest), rows)


def valid_client(t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    """Valid requests one after another on one keep-alive connection (a new one after an error)."""
    conn = connect(t)
    while time.monotonic() < until:
        body, beam, nbest = valid_body(t, rng)
        try:
            conn.request("POST", "/translate", json.dumps(body).encode(), {"Content-Type": "application/json"})
            r = conn.getresponse()
            status, data = r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            status, data = None, repr(e).encode()
            conn.close()
            conn = connect(t)
        stats.record("valid", f"POST /translate {json.dumps(body)[:120]}", {200}, status, data)
        if status == 200:
            keep_answer(stats, body, beam, nbest, data)
    conn.close()


def invalid_requests(t: Target) -> list[tuple[str, str, bytes | None, int]]:
    """(method, path, body, expected status) of requests the server must refuse."""
    j = lambda obj: json.dumps(obj).encode()  # noqa: E731
    w = t.pool[1] or "w1"
    cases = [
        ("POST", "/translate", b'{"text": ["' + w.encode(), 400),
        ("POST", "/translate", b"\xff\xfe{}", 400),
        ("POST", "/translate", j([w]), 400),
        ("POST", "/translate", j({}), 400),
        ("POST", "/translate", j({"text": [w], "bream": 2}), 400),
        ("POST", "/translate", j({"text": w}), 400),
        ("POST", "/translate", j({"text": [1]}), 400),
        ("POST", "/translate", j({"text": [w], "beam": "2"}), 400),
        ("POST", "/translate", j({"text": [w], "beam": 0}), 400),
        ("POST", "/translate", j({"text": [w], "beam": 1, "nbest": 2}), 400),
        ("POST", "/translate", j({"text": [w], "lenpen": "x"}), 400),
        ("POST", "/translate", j({"text": [w], "scores": "yes"}), 400),
        ("POST", "/translate", b'{"text": ["\\ud800"]}', 400),
        ("GET", "/translate", None, 405),
        ("POST", "/nowhere", j({"text": [w]}), 404),
        ("POST", "/attention", j({"text": 3}), 400),
        ("POST", "/attention", j({"text": w, "colour": 1}), 400),
    ]
    if t.attention:
        cases.append(("POST", "/attention", j({"text": w, "layer": 99}), 400))
    return cases


def invalid_client(t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    cases = invalid_requests(t)
    while time.monotonic() < until:
        method, path, body, want = rng.choice(cases)
        status, data = exchange(t, method, path, body)
        stats.record("invalid", f"{method} {path} {body!r}"[:160], {want}, status, data)
        time.sleep(PAUSE_S)


def slow_client(t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    """Valid requests whose bodies arrive byte by byte, 2-20 ms apart."""
    while time.monotonic() < until:
        body, beam, nbest = valid_body(t, rng)
        body["text"] = body["text"][:2]
        raw = json.dumps(body).encode()
        conn = connect(t)
        try:
            conn.putrequest("POST", "/translate")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(raw)))
            conn.endheaders()
            for i in range(len(raw)):
                conn.send(raw[i:i + 1])
                time.sleep(rng.uniform(0.002, 0.02))
            r = conn.getresponse()
            status, data = r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            status, data = None, repr(e).encode()
        finally:
            conn.close()
        stats.record("slow", f"POST /translate (byte by byte) {raw[:120]!r}", {200}, status, data)
        if status == 200:
            keep_answer(stats, body, beam, nbest, data)


def oversized_requests(t: Target) -> list[tuple[str, object]]:
    """(what, body) of requests beyond a limit: 413 each. A body over the byte limit is sent
    whole (Content-Length), whole asking for `Connection: close` (the server answers before it
    has read the body, then closes while the client may still be sending), or chunked (no
    length: the server counts)."""
    w = t.pool[1] or "w1"
    big = json.dumps({"text": ["x" * t.max_chars] * (t.max_body // t.max_chars + 1)}).encode()
    return [
        ("a sentence too many", json.dumps({"text": [w] * (t.max_sentences + 1)}).encode()),
        ("a sentence too long", json.dumps({"text": ["x" * (t.max_chars + 1)]}).encode()),
        ("a beam too large", json.dumps({"text": [w], "beam": t.max_beam + 1}).encode()),
        (f"a body of {len(big)} bytes", big),
        (f"a body of {len(big)} bytes, Connection: close", big),
        (f"a chunked body of {len(big)} bytes", big),
    ]


def oversized_client(t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    cases = oversized_requests(t)
    while time.monotonic() < until:
        what, raw = rng.choice(cases)
        body = (raw[i:i + 4096] for i in range(0, len(raw), 4096)) if what.startswith("a chunked") else raw
        headers = {"Connection": "close"} if what.endswith("Connection: close") else None
        status, data = exchange(t, "POST", "/translate", body, headers)
        stats.record("oversized", what, {413}, status, data)
        time.sleep(PAUSE_S)


def gone_client(t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    """Closes mid-body, or 0-200 ms after sending a whole valid request (before its answer)."""
    while time.monotonic() < until:
        raw = json.dumps(valid_body(t, rng)[0]).encode()
        head = (f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(raw)}\r\n\r\n").encode()
        mid_body = rng.random() < 0.5
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", t.port), TIMEOUT_S) as s:
            s.sendall(head + (raw[:len(raw) // 2] if mid_body else raw))
            time.sleep(rng.uniform(0, 0.05 if mid_body else 0.2))
        stats.record("gone", "mid-body" if mid_body else "before the answer", set(), None)
        time.sleep(0.05)


def page_client(t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    paths = (["/"] if t.ui else []) + ["/health", "/info"]
    while time.monotonic() < until:
        path = rng.choice(paths)
        status, data = exchange(t, "GET", path)
        stats.record("page", f"GET {path}", {200}, status, data)
        time.sleep(PAUSE_S)


def attention_client(t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    sentences = [s for s in t.pool if s.strip()]
    while time.monotonic() < until:
        body = json.dumps({"text": rng.choice(sentences)}).encode()
        status, data = exchange(t, "POST", "/attention", body)
        stats.record("attention", f"POST /attention {body[:120]!r}", {200 if t.attention else 501}, status, data)


CLIENTS = {"invalid": invalid_client, "slow": slow_client, "oversized": oversized_client, "gone": gone_client,
           "page": page_client, "attention": attention_client}


def run_client(f, t: Target, stats: Stats, rng: random.Random, until: float) -> None:
    """`f` until the time is up; an exception of the client's own is kept, not lost in a thread."""
    try:
        f(t, stats, rng, until)
    except Exception as e:  # noqa: BLE001 - reported as a failed criterion with its line
        with stats.lock:
            stats.crashed.append(f"{f.__name__}: {type(e).__name__}: {e}")


def load(t: Target, stats: Stats, seconds: float, valid_clients: int, seed: int) -> None:
    """Every kind of client at once for `seconds`; returns when all have finished."""
    until = time.monotonic() + seconds
    plan = [valid_client] * valid_clients + list(CLIENTS.values())
    threads = [threading.Thread(target=run_client, args=(f, t, stats, random.Random(seed * 1000 + i), until),
                                daemon=True) for i, f in enumerate(plan)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


# ------------------------------------------------------------------------------------ the server


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


def sample_rss(pid: int, samples: list[int], stop: threading.Event) -> None:
    """The server's RSS every second until `stop`: how it moved between the two readings."""
    while not stop.wait(1.0):
        with contextlib.suppress(OSError, AttributeError):
            samples.append(rss_kb(pid))


def resources(pid: int, steady_s: float = 1.0, timeout: float = 30) -> tuple[int, int]:
    """(VmRSS in kB, open descriptors) once the descriptor count has not changed for `steady_s`
    (closed connections take a moment to be noticed)."""
    last, since, end = -1, time.monotonic(), time.monotonic() + timeout
    while True:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        now = time.monotonic()
        if fds != last:
            last, since = fds, now
        elif now - since >= steady_s or now > end:
            break
        time.sleep(0.1)
    return rss_kb(pid), fds


def target_of(port: int, pool: list[str]) -> Target:
    """The limits and defaults the running server reports (GET /info)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    conn.request("GET", "/info")
    info = json.loads(conn.getresponse().read())
    conn.request("GET", "/")
    ui = conn.getresponse()
    ui.read()
    conn.close()
    lim = info["limits"]
    return Target(port, pool, lim["max_request_sentences"], lim["max_sentence_chars"], lim["max_beam"],
                  lim["max_body_bytes"], info["defaults"]["nbest"], bool(info.get("attention")), ui.status == 200)


def server_errors(lines: list[str]) -> tuple[int, int]:
    """(request lines of the log with a 5xx status other than 503, lines of tracebacks or errors)."""
    status = re.compile(r"^\S+ \S+ [A-Z]+ \S+ (5\d\d) ")
    fives = sum(1 for x in lines if (m := status.match(x)) and m.group(1) != "503")
    bugs = sum(1 for x in lines if "Traceback" in x or "nmtkit serve: error" in x)
    return fives, bugs


# ------------------------------------------------------------------------------------ the reference


def reference(data: str, ckpt: str, search_flags: list[str], beam, nbest, sentences: list[str],
              default_nbest: int, work: Path) -> dict[str, list[tuple[str, float]]]:
    """sentence -> [(text, score), ...] of `nmtkit generate --batch-size 1 --print-scores` with
    this beam and nbest (None: generate's defaults), run in this process."""
    from nmtkit.cli import main

    src, out = work / "ref.in", work / "ref.out"
    src.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    flags = [f for name, v in (("--beam", beam), ("--nbest", nbest)) if v is not None for f in (name, str(v))]
    try:
        main(["generate", data, "--path", ckpt, "--input", str(src), "--output", str(out), "--quiet",
              "--threads", "1", "--batch-size", "1", "--print-scores", *flags, *search_flags])
    except SystemExit as e:
        if e.code not in (0, None):
            sys.exit(f"[soak] nmtkit generate {' '.join(flags + search_flags)} failed (exit {e.code})")
    rows = [x.split("\t", 1) for x in out.read_text(encoding="utf-8").split("\n")[:-1]]
    n = nbest or default_nbest
    return {s: [(t, float(sc)) for sc, t in rows[i * n:(i + 1) * n] if sc != "-inf"]
            for i, s in enumerate(sentences)}


def same(got: tuple, want: list[tuple[str, float]]) -> bool:
    return len(got) == len(want) and all(
        gt == wt and math.isclose(gs, ws, abs_tol=SCORE_TOLERANCE) for (gt, gs), (wt, ws) in zip(got, want))


def wrong_answers(stats: Stats, data: str, ckpt: str, search_flags: list[str], default_nbest: int,
                  work: Path) -> tuple[int, int, list[str]]:
    """(wrong answers, sentences answered, a few examples) against generate, per (beam, nbest)."""
    groups: dict[tuple, list[str]] = {}
    for s, beam, nbest in stats.answers:
        if s.strip():
            groups.setdefault((beam, nbest), []).append(s)
    wrong, total, examples = 0, 0, []
    for (beam, nbest), sentences in sorted(groups.items(), key=str):
        want = reference(data, ckpt, search_flags, beam, nbest, sentences, default_nbest, work)
        for s in sentences:
            for got, count in stats.answers[(s, beam, nbest)].items():
                total += count
                if not same(got, want[s]):
                    wrong += count
                    examples.append(f"{s!r} beam={beam} nbest={nbest}: got {got}, generate {want[s]}")
    for (s, beam, nbest), answers in stats.answers.items():  # blank sentences: [("", 0.0)] (docs/serve.md)
        if not s.strip():
            total += sum(answers.values())
            bad = {got: c for got, c in answers.items() if got != (("", 0.0),)}
            wrong += sum(bad.values())
            examples += [f"{s!r} beam={beam} nbest={nbest}: got {got}, want (('', 0.0),)" for got in bad]
    return wrong, total, examples[:5]


# ------------------------------------------------------------------------------------ the run


def model(args, work: Path) -> tuple[str, str, list[str]]:
    """(checkpoint, data directory, sentence pool): the given model, or the tiny one; the pool is
    --input's first lines, or for the tiny model random lines of its words, plus blank ones."""
    if args.path:
        ckpt, data = args.path
    else:
        s = build(work)
        ckpt, data = str(s.ckpt), str(s.data)
    if args.input:
        pool = read_sentences(Path(args.input), args.pool)
    else:
        rng, words = random.Random(args.seed), [f"w{i}" for i in range(24)]
        pool = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 10))) for _ in range(args.pool)]
        pool += ["w3 zebra w7", "  w5  w1 ", "w2 \u00fc w9"]  # an unknown word, spaces, a non-ASCII one
    return ckpt, data, pool + ["", " "]


def start_server(args, ckpt: str, data: str) -> ServerProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "nmtkit", "serve", data, "--path", ckpt, "--host", "127.0.0.1", "--port", "0",
           "--device", "cpu", "--threads", str(args.threads), "--max-beam", str(args.max_beam),
           "--max-request-sentences", str(args.max_sentences), "--max-sentence-chars", str(args.max_chars),
           *shlex.split(args.search_flags)]
    return ServerProcess(cmd, env)


def soak(args, work: Path) -> dict:
    """Start the server, warm it up, measure, load it, measure, stop it, compare: the figures."""
    ckpt, data, pool = model(args, work)
    srv = start_server(args, ckpt, data)
    stats = Stats()
    try:
        t = target_of(srv.port, pool)
        load(t, stats, args.warmup, args.clients, args.seed)
        start = resources(srv.proc.pid)
        print(f"[soak] warmed up ({args.warmup:g} s): {start[0]} kB, {start[1]} descriptors; "
              f"now {args.seconds:g} s of load", file=sys.stderr)
        samples, stop = [], threading.Event()
        threading.Thread(target=sample_rss, args=(srv.proc.pid, samples, stop), daemon=True).start()
        load(t, stats, args.seconds, args.clients, args.seed + 1)
        stop.set()
        end = resources(srv.proc.pid)
    finally:
        code = srv.stop()
    log_5xx, bugs = server_errors(srv.lines)
    wrong, compared, examples = wrong_answers(stats, data, ckpt, shlex.split(args.search_flags), t.default_nbest,
                                              work)
    client_5xx = sum(c for k in KINDS for s, c in stats.statuses[k].items() if s >= 500 and s != 503)
    return {"date": datetime.now().isoformat(timespec="seconds"), "seconds": args.seconds, "warmup": args.warmup,
            "model": "tiny (built)" if not args.path else ckpt,
            "sent": dict(stats.sent), "answered": {k: stats.answered[k] for k in KINDS},
            "unanswered": dict(stats.unanswered),
            "statuses": {k: {str(s): c for s, c in sorted(v.items())} for k, v in stats.statuses.items()},
            "503": sum(v[503] for v in stats.statuses.values()),
            "gone_logged": sum(" 499 " in x for x in srv.lines),
            "wrong_answers": wrong, "compared_sentences": compared, "wrong_examples": examples,
            "distinct_requests": len(stats.answers),
            "unexpected_statuses": len(stats.unexpected), "unexpected_examples": stats.unexpected[:5],
            "5xx_clients": client_5xx, "5xx_log": log_5xx, "log_errors": bugs, "exit_status": code,
            "rss_kb": [start[0], end[0]], "rss_peak_kb": max(samples, default=end[0]), "rss_samples_kb": samples,
            "fds": [start[1], end[1]], "client_crashes": stats.crashed}


def criteria(r: dict) -> dict[str, bool]:
    rss0, rss1 = r["rss_kb"]
    return {
        "no wrong answers": r["wrong_answers"] == 0,
        "no unexpected statuses": r["unexpected_statuses"] == 0,
        "no 5xx other than 503": r["5xx_clients"] == 0 and r["5xx_log"] == 0,
        "RSS flat within 5%": abs(rss1 - rss0) <= RSS_TOLERANCE * rss0,
        "open descriptors equal": r["fds"][0] == r["fds"][1],
        "clean exit": r["exit_status"] == 0 and r["log_errors"] == 0,
        "every answer due came": not r["unanswered"],
        "every client ran to the end": not r["client_crashes"],
    }


def report(r: dict) -> list[str]:
    """The result lines (stdout)."""
    a = r["answered"]
    rss0, rss1 = r["rss_kb"]
    failed = [name for name, ok in r["criteria"].items() if not ok]
    return [
        "answered: " + ", ".join(f"{k} {a[k]}" for k in KINDS if k != "gone")
        + f"; gone {r['sent'].get('gone', 0)} (closed without reading an answer; {r['gone_logged']} logged as 499)"
        + f"; 503: {r['503']}; no answer: {sum(r['unanswered'].values())}",
        f"wrong answers: {r['wrong_answers']} of {r['compared_sentences']} sentences "
        f"({r['distinct_requests']} distinct sentence, beam, nbest; reference nmtkit generate --batch-size 1)",
        f"unexpected statuses: {r['unexpected_statuses']}",
        f"5xx other than 503: {r['5xx_clients']} answered, {r['5xx_log']} in the server's log",
        f"RSS: {rss0} kB at start, {rss1} kB at end ({100 * (rss1 - rss0) / rss0:+.1f}%), peak {r['rss_peak_kb']} kB",
        f"open descriptors: {r['fds'][0]} at start, {r['fds'][1]} at end",
        f"server: exit status {r['exit_status']}, {r['log_errors']} traceback or error lines in its log",
        *(f"client crashed: {x}" for x in r["client_crashes"][:3]),
        "all criteria hold" if not failed else "FAILED: " + "; ".join(failed),
    ]


def write_json(path: Path, r: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(r, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600, help="the load after the warm-up (default 600)")
    ap.add_argument("--warmup", type=float, help="seconds of the same load first (default: a quarter, 2-150)")
    ap.add_argument("--path", nargs=2, metavar=("CKPT", "DATA_DIR"), help="the model (default: a tiny one)")
    ap.add_argument("--input", help="source sentences, one per line, .gz allowed (needed with --path)")
    ap.add_argument("--pool", type=int, default=40, help="sentences in the pool (default 40)")
    ap.add_argument("--clients", type=int, default=8, help="threads sending valid requests (default 8)")
    ap.add_argument("--threads", type=int, default=1, help="the server's --threads (default 1)")
    ap.add_argument("--max-beam", type=int, default=4, help="the server's --max-beam (default 4)")
    ap.add_argument("--max-sentences", type=int, default=8, help="the server's --max-request-sentences")
    ap.add_argument("--max-chars", type=int, default=200, help="the server's --max-sentence-chars")
    ap.add_argument("--search-flags", default="", help="search flags for the server and for generate")
    ap.add_argument("--seed", type=int, default=1, help="of the pool and the clients' choices")
    ap.add_argument("--json", type=Path, help="write the figures to this file too")
    args = ap.parse_args()
    if args.path and not args.input:
        ap.error("--path needs --input FILE: the source sentences to send")
    if args.seconds <= 0 or (args.warmup is not None and args.warmup < 0) or args.clients < 1 or args.threads < 0:
        ap.error("--seconds must be > 0, --warmup >= 0, --clients >= 1 and --threads >= 0")
    for name in filter(None, [args.input, *(args.path or [])]):
        if not Path(name).exists():
            ap.error(f"{name} does not exist")
    if args.warmup is None:
        # the server's RSS settles over its first 2-3 minutes of load (the allocator's pools; 10-minute
        # runs, docs/testing.md "Soak of the server"): the start is read after that
        args.warmup = min(150.0, max(2.0, args.seconds / 4))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="nmtkit-soak-") as work:
        r = soak(args, Path(work))
    r["criteria"] = criteria(r)
    lines = report(r)
    print("\n".join(lines), flush=True)
    if args.json:
        write_json(args.json, r)
    sys.exit(0 if all(r["criteria"].values()) else 1)


if __name__ == "__main__":
    main()
