#!/usr/bin/env bash
# Benchmark `nmtkit preprocess` on Multi30k repeated to about 3M sentence pairs.
#
#   bash recipes/bench/preprocess.sh
#
# Prints, for 1 and 2 workers: sentence pairs/s of binarization and of the whole command, the
# raw throughput of sentencepiece alone encoding the same text with as many threads (measured in
# the same run), their ratio, and the peak RSS of the preprocess process tree.
#   SIZE=3000000       sentence pairs in the benchmark corpus (smaller for a quick run)
#   WORKERS=1,2        worker counts to measure
#   NMTKIT_DATA=DIR    Multi30k folder with train.de.gz, train.en.gz (default: ../shared/data/multi30k)
#   BENCH_DIR=DIR      scratch folder, about 1 GB for 3M pairs (default: ./runs/bench_preprocess)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env
data=${NMTKIT_DATA:-$(pwd)/../shared/data/multi30k}
python recipes/bench/preprocess_bench.py --data "$data" --size "${SIZE:-3000000}" \
    --work "${BENCH_DIR:-$(pwd)/runs/bench_preprocess}" --workers "${WORKERS:-1,2}"
