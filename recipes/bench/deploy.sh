#!/usr/bin/env bash
# The deployment table (docs/archs.md, "Deployment"): a teacher and its students, each through
# nmtkit's search, CTranslate2 and ONNX Runtime, fp32 and int8, with and without a lexical
# shortlist, on Multi30k test_2016_flickr (1,000 sentences, de->en), in one sitting; sacreBLEU,
# sentences/s of the search at batch 1 (1 thread) and batch 128 (2 threads), peak RSS, size on
# disk, and the deployment targets with their figures.
#
#   bash recipes/bench/deploy.sh --model teacher T.pt T_DATA --model student S.pt S_DATA [--model ...]
#
# After recipes/distill.sh (its work directory W, the quickstart's Q):
#   SHORTLIST=W/shortlist.txt bash recipes/bench/deploy.sh \
#       --model teacher Q/checkpoints/average_last5.pt Q/data --model student W/checkpoints/average_last5.pt W/data
#
#   SHORTLIST=FILE     the shortlist for the *-sl and *-vmap routes (the models must share its pieces)
#   SYSTEMS=...        routes, from nmtkit,nmtkit-sl,nmtkit-int8,nmtkit-int8-sl,ct2,ct2-vmap,ct2-int8,
#                      ct2-int8-vmap,onnx,onnx-sl,onnx-int8,onnx-int8-sl (default: all; without
#                      SHORTLIST, those without one)
#   CELLS=1x1,2x128    THREADSxBATCH cells   RUNS=1   BEAM=4   LENPEN=0.6   LIMIT=0 (first N lines)
#   NMTKIT_DATA=DIR    folder with test_2016_flickr.{de,en}(.gz) (default: Multi30k de/en downloaded
#                      once from the multi30k/dataset repository, as the quickstart does)
#   BENCH_DIR=DIR      scratch folder (default ./runs/bench_deploy)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env
# the engines (the test extra has them; install the two extras only where they are missing)
python -c 'import ctranslate2, onnx, onnxruntime' 2>/dev/null || nmtkit_env ctranslate2,onnx
if [ -n "${NMTKIT_DATA:-}" ]; then
    m30k=$NMTKIT_DATA
else  # the quickstart's own download (recipes/lib/multi30k.sh), once into NMTKIT_CACHE
    RECIPE_NAME=bench
    # shellcheck disable=SC1091
    . recipes/lib/stages.sh
    # shellcheck disable=SC1091
    . recipes/lib/multi30k.sh
    multi30k_raw de en
    m30k=$RAW
fi
src=$m30k/test_2016_flickr.de; [ -f "$src" ] || src=$src.gz
ref=$m30k/test_2016_flickr.en; [ -f "$ref" ] || ref=$ref.gz
all=nmtkit,nmtkit-sl,nmtkit-int8,nmtkit-int8-sl,ct2,ct2-vmap,ct2-int8,ct2-int8-vmap,onnx,onnx-sl,onnx-int8,onnx-int8-sl
plain=nmtkit,nmtkit-int8,ct2,ct2-int8,onnx,onnx-int8
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
python recipes/bench/deploy_bench.py --src "$src" --ref "$ref" --work "${BENCH_DIR:-$(pwd)/runs/bench_deploy}" \
    --shortlist "${SHORTLIST:-}" --systems "${SYSTEMS:-$([ -n "${SHORTLIST:-}" ] && echo $all || echo $plain)}" \
    --cells "${CELLS:-1x1,2x128}" --runs "${RUNS:-1}" --beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}" \
    --limit "${LIMIT:-0}" "$@"
