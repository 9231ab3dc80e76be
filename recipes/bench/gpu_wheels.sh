#!/usr/bin/env bash
# Prepares this checkout for recipes/bench/gpu.sh on a GPU machine without internet, whose Python
# (3.12, torch, typer, rich, sentencepiece, sacrebleu, numpy, pytest present) lacks nmtkit's other
# requirements. Run it here, on a machine with internet and the Multi30k data:
#
#   bash recipes/bench/gpu_wheels.sh
#
#   .whl/                      wheels of subword-nmt, sacremoses and what they need beyond that
#                              image (mock, tqdm, joblib, cloudpickle, and regex built for CPython
#                              3.12 manylinux x86_64), downloaded with pip (no dependency
#                              resolution: the list below is the whole set), pinned to the
#                              versions this project is tested with
#   .gpu_data/data/multi30k/   train/val/test_2016_flickr.{de,en}.gz from $NMTKIT_DATA (default:
#                              ../shared/data/multi30k); laid out as a shared-data folder, so that
#                              NMTKIT_SHARED=.gpu_data serves the tests there too
#
# Both folders are listed in .git/info/exclude (never committed) and together hold about 3.5 MB.
# Then copy the checkout including .whl and .gpu_data to the GPU machine and run
# `bash recipes/bench/gpu.sh` from its root with about 590 s allowed (see that script's header).
#
# Environment: GPU_WHEELS_PYTHON_VERSION (default 3.12), GPU_WHEELS_PLATFORM (manylinux2014_x86_64).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

WHEELS=(
    subword-nmt==0.3.8 mock==5.2.0 tqdm==4.70.1
    sacremoses==0.2.0 regex==2026.11.19 joblib==1.6.0 cloudpickle==3.1.3
)
pyver=${GPU_WHEELS_PYTHON_VERSION:-3.12}
platform=${GPU_WHEELS_PLATFORM:-manylinux2014_x86_64}
data=${NMTKIT_DATA:-$root/../shared/data/multi30k}

# never committed: the folders go into this clone's own exclude list
if [ -d .git ]; then
    mkdir -p .git/info
    touch .git/info/exclude
    for pat in /.whl/ /.gpu_data/; do
        grep -qxF "$pat" .git/info/exclude || echo "$pat" >> .git/info/exclude
    done
fi

mkdir -p .whl
echo "[gpu-wheels] downloading ${#WHEELS[@]} wheels for CPython $pyver ($platform) into .whl/" >&2
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$pyver" --implementation cp --platform "$platform" -d .whl "${WHEELS[@]}"
# only the pinned set: a wheel left from an older pin would be installed beside the new one
keep=""
for spec in "${WHEELS[@]}"; do
    name=${spec%%==*}
    keep+="$(echo "${name//-/_}" | tr 'A-Z' 'a-z')-${spec#*==}"$'\n'   # a wheel file name's first two fields
done
for w in .whl/*.whl; do
    stem=$(basename "$w" | cut -d- -f1-2 | tr 'A-Z' 'a-z')
    printf '%s' "$keep" | grep -qxF "$stem" || { echo "[gpu-wheels] removing stale $w" >&2; rm -f "$w"; }
done

dest=.gpu_data/data/multi30k
mkdir -p "$dest"
for split in train val test_2016_flickr; do
    for lang in de en; do
        f=$data/$split.$lang.gz
        [ -f "$f" ] || { echo "[gpu-wheels] missing $f (set NMTKIT_DATA to a Multi30k folder)" >&2; exit 2; }
        cp -f "$f" "$dest/"
    done
done

echo "[gpu-wheels] ready:" >&2
ls -l .whl >&2
du -sh .whl .gpu_data >&2
total_kb=$(du -sk .whl .gpu_data | awk '{s += $1} END {print s}')
if [ "$total_kb" -gt 32768 ]; then
    echo "[gpu-wheels] warning: .whl and .gpu_data hold ${total_kb} KiB; keep what travels small" >&2
fi
echo "[gpu-wheels] on the GPU machine, from the checkout's root (with .whl, .gpu_data):" \
    "bash recipes/bench/gpu.sh" >&2
