"""Load benchmark of `nmtkit serve` on loopback: throughput and latency with 1, 8 and 32
concurrent clients, against the same sentences translated one request at a time.

Two `python -m nmtkit serve` processes run on 127.0.0.1 (ephemeral ports):
1. "sequential": a server that never batches (--max-batch-sentences 1 --max-wait-ms 0) and one
   client sending one sentence per request, one request at a time: what translating request by
   request gives;
2. "batching": a server with the batching flags (the defaults, or BATCH_FLAGS), and 1, 8, 32
   clients, each sending one sentence per request as soon as its previous answer arrives.
Every client uses one keep-alive HTTP/1.1 connection (http.client, standard library). Each
phase translates the same COUNT sentences once (the first COUNT lines of the input), and stops
issuing requests after MAX_SECONDS (the output says so). Both servers are warmed up with a few
requests, and the phases of each of RUNS runs alternate between them, so that the machine's load
changes spread over all rows: the table has the median throughput of the runs, and latency
percentiles (per request, from sending to the whole answer) over all runs. The answers of every
phase are compared with the first sequential run's (each sentence searched alone: what `nmtkit
generate` gives). The mean batch is the sentences searched together per request, from the
server's log lines. "sent per server CPU-s" divides the sentences by the CPU time (user +
system, /proc) the server process used during the phase: on a machine shared with other work,
where the server's share of the cores changes from minute to minute, it shows what batching
saves independently of that share.

Called by recipes/bench/serve.sh, which documents the variables.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import math
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

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process used so far; NaN where /proc is absent."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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
    return {"done": len(answers), "wall_s": wall, "sent_s": len(answers) / wall, "latencies": latencies,
            "errors": errors, "answers": answers}


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (ms) of latencies in seconds."""
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))] * 1000


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
    ap.add_argument("--runs", type=int, default=3)
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
    # Both servers stay up (idle when not measured); the phases of every run alternate between
    # them, so that a change in the machine's load spreads over all rows.
    seq_srv = ServerProcess(base + ["--max-batch-sentences", "1", "--max-wait-ms", "0"], env)
    bat_srv = ServerProcess(base + a.batch_flags.split(), env)
    plan = [("sequential (no batching)", seq_srv, 1)] + [
        (f"{c} client{'s' if c > 1 else ''}", bat_srv, c) for c in (int(x) for x in a.clients.split(","))]
    for _, srv, _ in plan[:2]:
        warm_up(srv.port, sentences)
    results: dict[str, list[dict]] = {name: [] for name, _, _ in plan}
    for run in range(a.runs):
        for name, srv, clients in plan:
            n0, cpu0 = len(srv.lines), srv.cpu_seconds()
            r = phase(srv.port, sentences, clients, a.max_seconds)
            r["cpu_s"] = srv.cpu_seconds() - cpu0
            time.sleep(0.2)  # the last log lines
            r["mean_batch"] = mean_batch(srv.lines[n0:])
            results[name].append(r)
            print(f"[bench] run {run + 1}/{a.runs} {name}: {r['done']} sentences, {r['sent_s']:.1f} sent/s, "
                  f"mean batch {r['mean_batch']:.1f}", flush=True)
    exits = [seq_srv.stop(), bat_srv.stop()]

    ref = results[plan[0][0]][0]["answers"]  # each sentence searched alone
    seq_rate = statistics.median(r["sent_s"] for r in results[plan[0][0]])
    seq_cpu = statistics.median(r["done"] / r["cpu_s"] for r in results[plan[0][0]])
    print()
    print(f"nmtkit serve on loopback, {len(sentences)} sentences of {Path(a.input).name}, one sentence per "
          f"request, {a.threads} torch threads, CPU; search flags: {a.search_flags or '(defaults)'}; batching "
          f"flags: {a.batch_flags or '(defaults)'}; median sent/s of {a.runs} run(s), latencies of all runs")
    print("| clients | sent/s | x sequential | p50 ms | p99 ms | mean batch | sent per server CPU-s | x sequential | "
          "answers = sequential | sent/s of each run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name, _, clients in plan:
        rs = results[name]
        lat = [x for r in rs for x in r["latencies"]]
        checked = [(r["answers"][i], ref[i]) for r in rs for i in r["answers"] if i in ref]
        same = sum(x == y for x, y in checked)
        row = {"name": name, "clients": clients, "sent_s": statistics.median(r["sent_s"] for r in rs),
               "runs_sent_s": [r["sent_s"] for r in rs], "done": [r["done"] for r in rs],
               "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
               "mean_batch": statistics.mean(r["mean_batch"] for r in rs), "same": f"{same}/{len(checked)}",
               "errors": sum(len(r["errors"]) for r in rs),
               "sent_per_cpu_s": statistics.median(r["done"] / r["cpu_s"] for r in rs)}
        rows.append(row)
        print(f"| {name} | {row['sent_s']:.1f} | {row['sent_s'] / seq_rate:.2f} | {row['p50_ms']:.0f} | "
              f"{row['p99_ms']:.0f} | {row['mean_batch']:.1f} | {row['sent_per_cpu_s']:.1f} | "
              f"{row['sent_per_cpu_s'] / seq_cpu:.2f} | {row['same']} | "
              f"{', '.join(f'{x:.1f}' for x in row['runs_sent_s'])} |")
    for name, rs in results.items():
        errs = [e for r in rs for e in r["errors"]]
        if errs:
            print(f"[bench] {name}: {len(errs)} failed requests, e.g. {errs[0]}")
        if any(r["done"] < len(sentences) for r in rs):
            print(f"[bench] {name}: stopped by MAX_SECONDS: {[r['done'] for r in rs]} of {len(sentences)} done")
    print(f"server exit statuses after SIGTERM: {exits}")
    out = {"data": a.data, "ckpt": a.ckpt, "count": len(sentences), "runs": a.runs, "threads": a.threads,
           "search_flags": a.search_flags, "batch_flags": a.batch_flags, "rows": rows, "exit_statuses": exits}
    (work / "results.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
