#!/usr/bin/env bash
# GPU figures of nmtkit in one sitting (at most about 9.5 minutes on one H100), every number in one
# JSON file: the environment and a measured bf16 GEMM rate, the training step of transformer_base
# and transformer_big (bf16, eager and --compile, at the largest --max-tokens that fits: tokens/s,
# MFU, peak memory), `nmtkit train` on the quickstart's Multi30k task for a fixed time then
# average-checkpoints, generate and sacreBLEU, the time to reach 35.0 BLEU on test_2016_flickr
# (--target-bleu), generate's speed at batch 128, and last tests/test_cuda.py, as far as the
# time left allows.
# The stages and the JSON's fields: recipes/bench/gpu_bench.py.
#
#   bash recipes/bench/gpu.sh [--device auto|cuda|cpu] [--tiny] [--out DIR] [--budget S] [--skip STAGE,...]
#   bash recipes/bench/gpu.sh --device cpu --tiny      # the same stages on transformer_tiny, CPU, ~1 min
#
# Output: DIR/gpu_bench.json, DIR/gpu_bench.log (every command and its output), DIR/train_log.jsonl
# and DIR/test.hyp.en, where DIR is --out, else $GPU_BENCH_OUT, else $OUT, else runs/gpu_bench.
# Exit status 0 when every stage passed (a BLEU target not reached in time is a figure, not a
# failure), 1 when one failed, timed out or was skipped for time (the JSON says which, and the
# stages after it still ran).
#
# On a GPU machine without internet (torch importable by python3, nmtkit not installed, no
# subword-nmt or sacremoses):
#   1. here, with internet and the data:   bash recipes/bench/gpu_wheels.sh
#      it downloads the missing pure-Python packages (and regex, for Python 3.12) as wheels into
#      .whl/ and copies Multi30k into .gpu_data/data/multi30k/ (both git-ignored, about 3.5 MB);
#   2. copy the checkout to the GPU machine together with .whl and .gpu_data (both are
#      git-ignored: a copy of what git tracks must name them) and run, from its root, the one command
#        bash recipes/bench/gpu.sh
#      allowing it about 590 s (it stops itself within its 560 s budget plus start-up); the
#      results land in $OUT when that is set, else in runs/gpu_bench.
#
# Which Python runs it: $GPU_BENCH_PYTHON if set; else python3 when no virtual environment is
# active and python3 can import torch (a GPU image: nothing is installed, nmtkit runs from this
# checkout through PYTHONPATH); else the project's environment (recipes/lib/env.sh: the active
# virtual environment or ./.venv). When .whl/ holds wheels and that Python cannot import
# subword_nmt and sacremoses, they are installed offline into $GPU_BENCH_SITE (default
# ${TMPDIR:-/tmp}/nmtkit-gpu-site) and put on PYTHONPATH.
#
# Environment:
#   NMTKIT_DATA      Multi30k folder with train/val/test_2016_flickr.{de,en}.gz (default:
#                    ./.gpu_data/data/multi30k if present, else ../shared/data/multi30k)
#   NMTKIT_SHARED    the shared-data folder of the tests (default: ./.gpu_data when ../shared is absent)
#   GPU_BENCH_OUT    result folder (see above); GPU_BENCH_WORK scratch folder (default: a temporary
#                    one, removed at the end; an explicit one is kept)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
case " $* " in
    *" -h "*|*" --help "*) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

if [ -n "${GPU_BENCH_PYTHON:-}" ]; then
    py=$GPU_BENCH_PYTHON
elif [ -z "${VIRTUAL_ENV:-}" ] && python3 -c 'import torch' 2>/dev/null; then
    py=python3
else
    # shellcheck disable=SC1091
    . recipes/lib/env.sh
    nmtkit_env || { echo "[gpu-bench] could not set up the Python environment (recipes/lib/env.sh)" >&2; exit 1; }
    py=python
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

# the wheels carried in .whl/ (recipes/bench/gpu_wheels.sh), installed offline when needed
if compgen -G ".whl/*.whl" > /dev/null && ! "$py" -c 'import subword_nmt, sacremoses' 2>/dev/null; then
    site=${GPU_BENCH_SITE:-${TMPDIR:-/tmp}/nmtkit-gpu-site}
    echo "[gpu-bench] installing $(ls .whl/*.whl | wc -l) wheel(s) from .whl into $site" >&2
    if "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$site" .whl/*.whl; then
        export PYTHONPATH="$site:$PYTHONPATH"
    else
        echo "[gpu-bench] warning: pip could not install .whl/*.whl; subword-nmt and sacremoses stay missing" >&2
    fi
fi

# the data carried in .gpu_data/ (recipes/bench/gpu_wheels.sh)
if [ -d .gpu_data/data/multi30k ]; then
    export NMTKIT_DATA=${NMTKIT_DATA:-$root/.gpu_data/data/multi30k}
    [ -d "$root/../shared/data" ] || export NMTKIT_SHARED=${NMTKIT_SHARED:-$root/.gpu_data}
fi

exec "$py" recipes/bench/gpu_bench.py "$@"
