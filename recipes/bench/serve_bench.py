"""Load benchmark of `nmtkit serve` on loopback: throughput and latency with 1, 8 and 32
concurrent clients, against the same sentences translated one request at a time.

Two servers are started in turn on 127.0.0.1 (an ephemeral port), each a `python -m nmtkit
serve` process:
1. "sequential": a server that never batches (--max-batch-sentences 1 --max-wait-ms 0) and one
   client sending one sentence per request, one request at a time: what translating request by
   request gives;
2. "batching": a server with the batching flags (the defaults, or BATCH_FLAGS), and 1, 8, 32
   clients, each sending one sentence per request as soon as its previous answer arrives.
Every client uses one keep-alive HTTP/1.1 connection (http.client, standard library). Each
phase translates the same COUNT sentences once (the first COUNT lines of the input) after a few
warm-up requests, and stops issuing requests after MAX_SECONDS (the table says how many were
done). Latency is per request, from sending to the whole answer. The answers of every phase are
compared with the sequential ones (each sentence searched alone: what `nmtkit generate` gives).
The mean batch is the sentences searched together per request, from the server's log lines.

Called by recipes/bench/serve.sh, which documents the variables.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

WARMUP = 5


def read_sentences(path: Path, count: int) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                out.append(line.rstrip("\n"))
            if len(out) == count:
                break
    return out


class ServerProcess:
    """`python -m nmtkit serve ... --host 127.0.0.1 --port 0`; its stderr lines are collected."""

    def __init__(self, cmd: list[str], env: dict, timeout: float = 300):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if "nmtkit serve: ready" in line or "nmtkit: error" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or not any("nmtkit serve: ready" in x for x in self.lines):
            self.proc.kill()
            sys.exit("[bench] the server did not start:\n" + "\n".join(self.lines))
        m = next(re.search(r"listening on http://127\.0\.0\.1:(\d+)", x) for x in self.lines if "listening on" in x)
        self.port = int(m.group(1))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)


def translate(conn: http.client.HTTPConnection, sentence: str) -> tuple[str, float]:
    body = json.dumps({"text": [sentence]}).encode()
    t0 = time.perf_counter()
    conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    dt = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
    return json.loads(data)["translations"][0], dt


def warm_up(port: int, sentences: list[str]) -> None:
    """A few requests first: the first searches pay one-off costs (allocations, lazy set-up)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for s in sentences[:WARMUP]:
        translate(conn, s)
    conn.close()


def phase(port: int, sentences: list[str], clients: int, max_seconds: float) -> dict:
    """`clients` threads share the sentences (each translated once); answers by index."""
    todo: queue.Queue = queue.Queue()
    for i in range(len(sentences)):
        todo.put(i)
    answers: dict[int, str] = {}
    latencies: list[float] = []
    errors: list[str] = []
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        start.wait()
        while time.perf_counter() < deadline[0]:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                break
            try:
                text, dt = translate(conn, sentences[i])
            except Exception as e:  # noqa: BLE001 - counted and shown
                errors.append(f"{type(e).__name__}: {e}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                continue
            answers[i] = text
            latencies.append(dt)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    deadline[0] = t0 + max_seconds
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    pct = (lambda p: lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))] * 1000) if lat else (lambda p: float("nan"))
    return {"clients": clients, "done": len(answers), "wall_s": wall, "sent_s": len(answers) / wall,
            "p50_ms": pct(50), "p99_ms": pct(99), "mean_ms": statistics.mean(lat) * 1000 if lat else float("nan"),
            "errors": errors[:5], "n_errors": len(errors), "answers": answers}


def mean_batch(lines: list[str]) -> float:
    b = [int(m.group(1)) for x in lines if (m := re.search(r" POST /translate 200 .*batch=(\d+)", x))]
    return statistics.mean(b) if b else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--input", required=True, help="source sentences, one per line (.gz allowed)")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=300, help="per phase: no new requests after this")
    ap.add_argument("--search-flags", default="", help="nmtkit serve search flags for both servers")
    ap.add_argument("--batch-flags", default="", help="the batching server's own flags")
    ap.add_argument("--work", required=True)
    a = ap.parse_args()

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    sentences = read_sentences(Path(a.input), a.count)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    base = [sys.executable, "-m", "nmtkit", "serve", a.data, "--path", a.ckpt, "--host", "127.0.0.1", "--port", "0",
            "--device", "cpu", "--threads", str(a.threads), *a.search_flags.split()]
    rows = []

    print(f"[bench] sequential: a server without batching, 1 client, {len(sentences)} sentences", flush=True)
    srv = ServerProcess(base + ["--max-batch-sentences", "1", "--max-wait-ms", "0"], env)
    warm_up(srv.port, sentences)
    n0 = len(srv.lines)
    seq = phase(srv.port, sentences, 1, a.max_seconds)
    time.sleep(0.2)  # the last log lines
    seq["mean_batch"] = mean_batch(srv.lines[n0:])
    seq["exit"] = srv.stop()
    seq["name"] = "sequential (no batching)"
    rows.append(seq)
    ref = seq["answers"]

    srv = ServerProcess(base + a.batch_flags.split(), env)
    for c in [int(x) for x in a.clients.split(",")]:
        print(f"[bench] batching server, {c} client(s)", flush=True)
        warm_up(srv.port, sentences)
        n0 = len(srv.lines)
        r = phase(srv.port, sentences, c, a.max_seconds)
        time.sleep(0.2)  # the last log lines
        r["mean_batch"] = mean_batch(srv.lines[n0:])
        r["name"] = f"{c} client{'s' if c > 1 else ''}"
        rows.append(r)
    code = srv.stop()
    for r in rows:
        r["exit"] = r.get("exit", code)

    print()
    print(f"nmtkit serve on loopback, {len(sentences)} sentences of {Path(a.input).name}, one sentence per "
          f"request, {a.threads} torch threads, CPU; search flags: {a.search_flags or '(defaults)'}; "
          f"batching flags: {a.batch_flags or '(defaults)'}")
    print("| clients | sentences done | sent/s | x sequential | p50 ms | p99 ms | mean batch | answers = sequential |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        common = [i for i in r["answers"] if i in ref]
        same = sum(r["answers"][i] == ref[i] for i in common)
        r["same_as_sequential"] = f"{same}/{len(common)}"
        print(f"| {r['name']} | {r['done']}/{len(sentences)} | {r['sent_s']:.1f} | {r['sent_s'] / seq['sent_s']:.2f} | "
              f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['mean_batch']:.1f} | {same}/{len(common)} |")
    for r in rows:
        if r["n_errors"]:
            print(f"[bench] {r['name']}: {r['n_errors']} failed requests, e.g. {r['errors'][0]}")
    print(f"server exit statuses after SIGTERM: {sorted({r['exit'] for r in rows})}")
    out = {"data": a.data, "ckpt": a.ckpt, "count": len(sentences), "threads": a.threads,
           "search_flags": a.search_flags, "batch_flags": a.batch_flags,
           "rows": [{k: v for k, v in r.items() if k != "answers"} for r in rows]}
    (work / "results.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
