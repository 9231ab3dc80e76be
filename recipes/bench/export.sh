#!/usr/bin/env bash
# Benchmark CTranslate2 exports (float32, int8) against native `nmtkit generate` on Multi30k
# test_2016_flickr (1,000 sentences, de->en, raw text), beam 4, fairseq length penalty 0.6, CPU.
#
#   CKPT=runs/multi30k_de_en/checkpoints/average_last5.pt DATA=runs/multi30k_de_en/data \
#       bash recipes/bench/export.sh
#
# Exports CKPT twice (float32, int8) into $BENCH_DIR, then runs every configuration (runtime x
# batch size x threads) once per round, alternating, RUNS rounds, and prints sentences/s (process
# and search), peak RSS, sacreBLEU and the lines identical to native's, with the search-speed
# ratio to native; then the export check (the float32 export's lines against native generate).
# Report ratios from one sitting: shared machines drift. Needs the ctranslate2 extra.
#
#   CKPT=FILE  DATA=DIR    the quickstart's averaged checkpoint and its data directory (required)
#   NMTKIT_DATA=DIR        Multi30k folder with test_2016_flickr.{de,en}(.gz) (default: ../shared/data/multi30k)
#   BATCH_SIZES=1,128  THREADS=1,2  RUNS=2  BEAM=4  LENPEN=0.6
#   BENCH_DIR=DIR          scratch folder (default: ./runs/bench_export)
#   OMP_WAIT_POLICY=PASSIVE  set it when the machine is busy (docs/generate.md, Speed)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env ctranslate2
if [ -z "${CKPT:-}" ] || [ -z "${DATA:-}" ]; then
    echo "[bench] set CKPT=path/to/average_last5.pt and DATA=its data directory (the quickstart's)" >&2
    exit 2
fi
m30k=${NMTKIT_DATA:-$(pwd)/../shared/data/multi30k}
src=$m30k/test_2016_flickr.de
[ -f "$src" ] || src=$src.gz
ref=$m30k/test_2016_flickr.en
[ -f "$ref" ] || ref=$ref.gz
python recipes/bench/export_bench.py --data "$DATA" --ckpt "$CKPT" --src "$src" --ref "$ref" \
    --work "${BENCH_DIR:-$(pwd)/runs/bench_export}" --batch-sizes "${BATCH_SIZES:-1,128}" \
    --threads "${THREADS:-1,2}" --runs "${RUNS:-2}" --beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}"
