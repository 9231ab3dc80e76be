#!/usr/bin/env python3
"""Run one `nmtkit train` process and summarize it: speed, peak RSS, the end of the loss curve.

    python recipes/bench/train_stats.py --label NAME --json OUT.json -- nmtkit train DATA ... --save-dir DIR

The command runs as a child process; its wall time and peak resident memory (ru_maxrss of the
child, as `/usr/bin/time -v` reports it) are measured here. The speed is read from DIR's
train_log.jsonl: target tokens (including </s>, excluding padding) per second of each logged
interval, averaged over every interval except the first (start-up, first batches), which is the
statistic of the fairseq yardstick (its `wps`). Intervals are wall-clock and include any
validation or checkpoint saving that fell inside them, as fairseq's do.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True)
    ap.add_argument("--json", type=Path, required=True, help="append the summary to this JSON-lines file")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    save_dir = Path(cmd[cmd.index("--save-dir") + 1])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        print(f"[{a.label}] FAILED with exit status {rc}: {' '.join(cmd)}", file=sys.stderr)
        return rc
    recs = [json.loads(line) for line in (save_dir / "train_log.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in recs if r["type"] == "train"]
    valid = [r for r in recs if r["type"] == "valid"]
    start = next(r for r in recs if r["type"] == "start")
    rates = [r["tgt_tok_per_s"] for r in train]
    if len(rates) >= 2:
        tps, how = statistics.mean(rates[1:]), f"mean of {len(rates) - 1} logged intervals after the first"
    else:
        tps, how = (rates[0] if rates else float("nan")), "single interval (includes start-up)"
    out = {
        "label": a.label, "updates": train[-1]["update"] if train else 0, "wall_s": round(wall, 2),
        "tgt_tok_per_s": round(tps, 1), "how": how, "interval_tok_per_s": [round(x, 1) for x in rates],
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "setup_rss_mib": start.get("peak_rss_mib"),
        "params": start.get("params"),
        "train_pairs": start.get("train_pairs"), "batches_per_epoch": start.get("batches_per_epoch"),
        "last_train": {k: train[-1][k] for k in ("update", "loss", "nll_loss", "ppl", "lr")} if train else None,
        "last_valid": {k: valid[-1][k] for k in ("update", "loss", "nll_loss", "ppl")} if valid else None,
        "loss_curve": [(r["update"], round(r["loss"], 3)) for r in train],
    }
    with open(a.json, "a") as fh:
        fh.write(json.dumps(out) + "\n")
    lt = out["last_train"] or {}
    print(f"[{a.label}] {out['updates']} updates in {wall:.0f} s; {tps:.0f} tgt tok/s ({how}); "
          f"peak RSS {out['peak_rss_mib']:.0f} MiB ({out['setup_rss_mib']} after set-up); last train loss {lt.get('loss', float('nan')):.3f} bits "
          f"(nll {lt.get('nll_loss', float('nan')):.3f}, ppl {lt.get('ppl', float('nan')):.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
