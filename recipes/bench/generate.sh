#!/usr/bin/env bash
# Benchmark `nmtkit generate` against CTranslate2 and nmtkit's ONNX export on the same weights, on
# CPU, in one sitting:
# Multi30k test_2016_flickr (1,000 sentences, de->en), beam 4, length penalty 0.6 (|Y|^alpha, the
# form CTranslate2 has), fairseq's stopping rule (CTranslate2's), output limit 256.
#
#   CKPT=path/to/checkpoint.pt DATA=path/to/data bash recipes/bench/generate.sh
#
# The CTranslate2 models are made from CKPT by `nmtkit export --format ctranslate2` (float32, and
# int8 run as int8_float32) and decoded through CTranslate2's own API
# (recipes/bench/ct2_translate.py) with the data directory's subword model. For every thread
# count and batch size, nmtkit fp32, nmtkit --quantize int8, CTranslate2 float32 and int8 run in
# turn, in a rotating order, RUNS times; with onnx / onnx-int8, the `nmtkit export --format onnx`
# directories (float32, int8) run by `nmtkit generate --path ONNX_DIR` (ONNX Runtime, no torch)
# take their turns too, and their targets (docs/export.md) are printed, with every line whose
# ONNX fp32 output differs from nmtkit fp32's and the two scores. Prints sentences/s of the decoding alone and of the
# process, peak RSS, sacreBLEU and identical lines per row, the ratios nmtkit / CTranslate2, and
# the start-up time of `printf '' | nmtkit generate DATA --path CKPT --input -`, and the speed targets
# (docs/generate.md) each with its figure and whether it is met. Results also go to
# $BENCH_DIR/results.json. On a shared machine, compare within a row (ratios), and report the load.
#
#   CKPT=FILE          the model (required): e.g. the quickstart's average_last5.pt
#   DATA=DIR           the data directory it was trained on (default: preprocess Multi30k into
#                      $BENCH_DIR/data with a joint sentencepiece 8k model and a joined dictionary)
#   NMTKIT_DATA=DIR    Multi30k folder with train/val/test_2016_flickr .de/.en(.gz)
#                      (default: ../shared/data/multi30k)
#   BATCH_SIZES=1,16,128  THREADS=1,2  CELLS=1x1,2x128 (only these THREADSxBATCH pairs)  RUNS=3  BEAM=4  LENPEN=0.6  LIMIT=0 (first N sentences; 0 = all)
#   SYSTEMS=nmtkit,nmtkit-int8,ct2,ct2-int8,onnx,onnx-int8   add "baseline" with BASELINE=DIR (another nmtkit
#                      checkout, e.g. a worktree of an older commit: its fp32, for before/after)
#   SHORTLIST=FILE     a lexical shortlist (`nmtkit shortlist DATA`), for the systems nmtkit-sl, nmtkit-int8-sl,
#                      onnx-sl, onnx-int8-sl (exported with --shortlist) and ct2-vmap, ct2-int8-vmap (CTranslate2
#                      with the same file as its vmap.txt), each printed beside itself without it
#   EXTRA="..."        more `nmtkit generate` flags
#   BENCH_DIR=DIR      scratch folder (default: ./runs/bench_generate)
#   OMP_WAIT_POLICY=PASSIVE  set it when the machine is busy with other work: OpenMP's default
#                      spinning then makes THREADS=2 many times slower (docs/generate.md, Speed)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env ctranslate2,onnx
if [ -z "${CKPT:-}" ]; then
    echo "[bench] set CKPT=path/to/checkpoint.pt (a model trained on Multi30k de-en, e.g. the quickstart's)" >&2
    exit 2
fi
bench=${BENCH_DIR:-$(pwd)/runs/bench_generate}
m30k=${NMTKIT_DATA:-$(pwd)/../shared/data/multi30k}
mkdir -p "$bench"
if [ -z "${DATA:-}" ]; then
    DATA=$bench/data
    echo "[bench] preprocessing Multi30k into $DATA (skipped when up to date)" >&2
    nmtkit preprocess -s de -t en --trainpref "$m30k/train" --validpref "$m30k/val" \
        --testpref "$m30k/test_2016_flickr" --destdir "$DATA" --vocab-size 8000 --joined-dictionary >&2
fi
src=$m30k/test_2016_flickr.de; [ -f "$src" ] || src=$src.gz
ref=$m30k/test_2016_flickr.en; [ -f "$ref" ] || ref=$ref.gz
python recipes/bench/generate_bench.py --data "$DATA" --ckpt "$CKPT" --src "$src" --ref "$ref" --work "$bench" \
    --batch-sizes "${BATCH_SIZES:-1,16,128}" --threads "${THREADS:-1,2}" --cells "${CELLS:-}" --runs "${RUNS:-3}" \
    --limit "${LIMIT:-0}" --beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}" \
    --systems "${SYSTEMS:-nmtkit,nmtkit-int8,ct2,ct2-int8,onnx,onnx-int8}" --baseline "${BASELINE:-}" --extra "${EXTRA:-}" \
    --shortlist "${SHORTLIST:-}"
