#!/usr/bin/env bash
# transformers' generate on a Hugging Face export (MarianMT) against native `nmtkit generate` on
# Multi30k test_2016_flickr (1,000 sentences, de->en, raw text), greedy and beam 4, length penalty
# 0.6 in fairseq's form with fairseq's stopping rule (the rules transformers has), CPU.
#
#   CKPT=runs/multi30k_de_en/checkpoints/average_last5.pt DATA=runs/multi30k_de_en/data \
#       bash recipes/bench/hf_export.sh
#
# Prints the lines whose hypotheses agree (greedy and beam), names the others with their lengths
# and the output limit, and what transformers gives on them with nmtkit's rule at the limit;
# and the search times of both. Needs the hf extra.
#
#   CKPT=FILE  DATA=DIR    the quickstart's averaged checkpoint and its data directory (required)
#   NMTKIT_DATA=DIR        Multi30k folder with test_2016_flickr.de(.gz) (default: ../shared/data/multi30k)
#   BEAM=4  LENPEN=0.6  THREADS=1
#   BENCH_DIR=DIR          scratch folder (default: ./runs/bench_hf_export)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env hf
if [ -z "${CKPT:-}" ] || [ -z "${DATA:-}" ]; then
    echo "[bench] set CKPT=path/to/average_last5.pt and DATA=its data directory (the quickstart's)" >&2
    exit 2
fi
m30k=${NMTKIT_DATA:-$(pwd)/../shared/data/multi30k}
src=$m30k/test_2016_flickr.de
[ -f "$src" ] || src=$src.gz
python recipes/bench/hf_export_bench.py --data "$DATA" --ckpt "$CKPT" --src "$src" \
    --work "${BENCH_DIR:-$(pwd)/runs/bench_hf_export}" --beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}" \
    --threads "${THREADS:-1}"
