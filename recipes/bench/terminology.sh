#!/usr/bin/env bash
# Terminology benchmark (docs/generate.md, "Terminology"): Multi30k test_2016_flickr (1,000
# sentences, de->en) translated without and with constraints taken from the references (per
# sentence up to TERMS reference words the unconstrained output misses), beam 4, batches of 128
# sentences, on CPU. Prints the rate at which the terms are used, sacreBLEU without and with
# constraints, and the decoding time of both (median of RUNS alternating runs) with their ratio;
# also $BENCH_DIR/terminology.json and the constraints as `nmtkit generate --constraints` reads
# them ($BENCH_DIR/constraints.tsv).
#
#   CKPT=path/to/checkpoint.pt DATA=path/to/data bash recipes/bench/terminology.sh
#
#   CKPT=FILE        the model (required): e.g. the quickstart's checkpoints/average_last5.pt
#   DATA=DIR         the data directory it was trained on (required)
#   NMTKIT_DATA=DIR  Multi30k folder with test_2016_flickr.de/.en(.gz) (default: ../shared/data/multi30k)
#   BEAM=4  BATCH=128  TERMS=2  RUNS=3  THREADS=1  LIMIT=0 (first N sentences; 0 = all)  SEED=1
#   BENCH_DIR=DIR    where results go (default: ./runs/bench_terminology)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env
if [ -z "${CKPT:-}" ] || [ -z "${DATA:-}" ]; then
    echo "[bench] set CKPT=path/to/checkpoint.pt and DATA=its data directory (a Multi30k de-en model, e.g. the quickstart's)" >&2
    exit 2
fi
m30k=${NMTKIT_DATA:-$(pwd)/../shared/data/multi30k}
src=$m30k/test_2016_flickr.de; [ -f "$src" ] || src=$src.gz
ref=$m30k/test_2016_flickr.en; [ -f "$ref" ] || ref=$ref.gz
python recipes/bench/terminology_bench.py --data "$DATA" --ckpt "$CKPT" --src "$src" --ref "$ref" \
    --work "${BENCH_DIR:-$(pwd)/runs/bench_terminology}" --beam "${BEAM:-4}" --batch "${BATCH:-128}" \
    --terms "${TERMS:-2}" --runs "${RUNS:-3}" --threads "${THREADS:-1}" --limit "${LIMIT:-0}" --seed "${SEED:-1}"
