#!/usr/bin/env bash
# Benchmark nmtkit at paper scale: preprocessing, training start-up memory per rank, resume.
#
#   bash recipes/bench/scale.sh
#   SIZES=1000000,9000000,36000000 BASELINE=/path/to/older/nmtkit bash recipes/bench/scale.sh
#
# For each size: builds that many synthetic de-en pairs from the real text under the shared data
# (Multi30k train and WMT14 newstest sentences joined, about 30 subword tokens per side on
# average), runs `nmtkit preprocess` (time, peak RSS of its process tree), then `nmtkit train`
# (transformer_tiny, CPU) as one process and as `torchrun --nproc_per_node 2` (gloo): seconds to
# the first update, each rank's resident memory there and at its peak, and bytes per pair per
# rank (against a 20K-pair reference corpus, so that torch and the model drop out); and the time
# to resume mid-epoch. Prints the disk used and removes what it made.
#   SIZES=1000000         comma-separated corpus sizes in pairs
#   BASELINE=DIR          also train with the nmtkit checkout in DIR (before/after in one run)
#   WORKERS=2             preprocess --workers
#   REPLICATE=K           also train on the largest size's shards hard-linked K times (K x the
#                         pairs, no preprocessing, no disk; e.g. 36M pairs from 9M)
#   COLD=1                drop the page cache before every training launch (root only), so that
#                         start-up reads the shards and torch from disk
#   NMTKIT_SHARED=DIR     the shared folder holding data/ (default: ../shared)
#   BENCH_DIR=DIR         scratch folder, about 150 bytes per pair at the largest size plus its
#                         text (default: ./runs/bench_scale)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env
shared=${NMTKIT_SHARED:-$(pwd)/../shared}
code="this=$(pwd)"
[ -n "${BASELINE:-}" ] && code="$code,baseline=$BASELINE"
python recipes/bench/scale_bench.py --data "$shared/data" --sizes "${SIZES:-1000000}" \
    --work "${BENCH_DIR:-$(pwd)/runs/bench_scale}" --workers "${WORKERS:-2}" --code "$code" \
    --replicate "${REPLICATE:-1}" ${COLD:+--cold}
