#!/usr/bin/env bash
# Load benchmark of `nmtkit serve` on loopback (127.0.0.1 only): throughput and p50/p99 latency
# for 1, 8 and 32 concurrent clients (one sentence per request) against the same sentences
# translated one request at a time by a server that does not batch. Bounded: RUNS x COUNT
# sentences per phase, no new request after MAX_SECONDS per phase.
#
#   CKPT=path/to/checkpoint.pt DATA=path/to/data-bin bash recipes/bench/serve.sh
#
#   CKPT=FILE          the model (required), e.g. the quickstart's average_last5.pt
#   DATA=DIR           the data directory it was trained on (required)
#   INPUT=FILE         source sentences, one per line, .gz allowed
#                      (default: ../shared/data/multi30k/test_2016_flickr.de.gz)
#   COUNT=200          sentences per phase (the first COUNT non-empty lines)
#   CLIENTS=1,8,32     concurrent clients of the batching server
#   RUNS=3             runs of every phase (alternating): the median throughput is reported
#   THREADS=2          torch CPU threads of the server
#   MAX_SECONDS=300    per phase: no new requests after this (the table says how many were done)
#   SEARCH_FLAGS="..." nmtkit serve search flags for both servers (default: generate's defaults)
#   BATCH_FLAGS="..."  the batching server's own flags (default: --max-batch-sentences 64
#                      --max-wait-ms 5, the command's defaults)
#   BENCH_DIR=DIR      where results.json goes (default: ./runs/bench_serve)
#   OMP_WAIT_POLICY=PASSIVE  set it when the machine is busy with other work (docs/generate.md, Speed)
#
# Needs the serve extra (pip install -e '.[serve]' in the nmtkit checkout); the clients use the standard library.
# Figures and how to read them: docs/serve.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env
if [ -z "${CKPT:-}" ] || [ -z "${DATA:-}" ]; then
    echo "[bench] set CKPT=path/to/checkpoint.pt and DATA=path/to/data-bin (its data directory)" >&2
    exit 2
fi
input=${INPUT:-$(pwd)/../shared/data/multi30k/test_2016_flickr.de.gz}
[ -f "$input" ] || { echo "[bench] INPUT $input not found" >&2; exit 2; }
python recipes/bench/serve_bench.py --data "$DATA" --ckpt "$CKPT" --input "$input" \
    --count "${COUNT:-200}" --clients "${CLIENTS:-1,8,32}" --runs "${RUNS:-3}" --threads "${THREADS:-2}" \
    --max-seconds "${MAX_SECONDS:-300}" --search-flags "${SEARCH_FLAGS:-}" --batch-flags "${BATCH_FLAGS:-}" \
    --work "${BENCH_DIR:-$(pwd)/runs/bench_serve}"
