#!/usr/bin/env bash
# fairseq -> nmtkit: train the yardstick's Multi30k model with fairseq 0.12.2 (or reuse it), import it
# with `nmtkit import-fairseq`, and decode test_2016_flickr (1,000 sentences, de->en) with
# fairseq-generate and `nmtkit generate --decoding fairseq`: same beam (4), length penalty (0.6, fairseq's
# form), stopping rule and output limit. Prints the hypotheses that agree (out of 1000), sacreBLEU of
# both, and decode speed side by side (docs/fairseq.md). Outside CI: it installs fairseq.
#
#   bash recipes/bench/fairseq_import.sh
#
#   NMTKIT_SHARED=DIR   the shared folder: anchors/ (fairseq's yardstick) and data/multi30k (default: ../shared)
#   ANCHORS_DIR=DIR     the yardstick's venv, data and runs (default: $HOME/.cache/nmtkit-anchors)
#   MAX_UPDATE=200      fairseq-train updates (the yardstick trains when its checkpoint is missing: ~8 min
#                       on 2 cores for 200; 1560, its full 12 epochs, take about an hour)
#   FAIRSEQ_CKPT=FILE   a fairseq checkpoint of that model to use instead
#   THREADS=2  RUNS=1   decode threads; timed runs per decoder (the median is reported)
#   BENCH_DIR=DIR       scratch folder (default: ./runs/bench_fairseq_import)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env
SHARED=${NMTKIT_SHARED:-$(pwd)/../shared}
export ANCHORS_DIR=${ANCHORS_DIR:-$HOME/.cache/nmtkit-anchors}
MAX_UPDATE=${MAX_UPDATE:-200}
CKPT=${FAIRSEQ_CKPT:-$ANCHORS_DIR/runs/u$MAX_UPDATE/checkpoints/checkpoint_last.pt}
if [ ! -f "$CKPT" ]; then
    echo "[bench] training the yardstick's model with fairseq ($MAX_UPDATE updates): $SHARED/anchors/bench_fairseq.sh" >&2
    MAX_UPDATE=$MAX_UPDATE NMTKIT_SHARED=$SHARED bash "$SHARED/anchors/bench_fairseq.sh" >&2
fi
export OMP_NUM_THREADS=${THREADS:-2} MKL_NUM_THREADS=${THREADS:-2}
python recipes/bench/fairseq_import_bench.py --ckpt "$CKPT" --anchors-dir "$ANCHORS_DIR" \
    --data "$SHARED/data/multi30k" --work "${BENCH_DIR:-$(pwd)/runs/bench_fairseq_import}" \
    --threads "${THREADS:-2}" --runs "${RUNS:-1}"
