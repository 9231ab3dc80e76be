#!/usr/bin/env bash
# Model speed: forward+backward throughput (target tokens/s), peak memory and, on a GPU, the
# achieved model FLOP/s as a fraction of the device's peak. One line per configuration.
#
#   bash recipes/bench/model.sh
#
# CPU, fp32: transformer_tiny and a d_model=256, 3+3 layers, 4 heads, d_ff=1024 model, batches of
# 160 sentences x 25 tokens (4000 target tokens), 10k joint vocabulary.
# CUDA (when present), bf16 autocast: transformer_base and transformer_big, eager and compiled,
# 512 x 32 = 16384 target tokens per batch, 37k joint vocabulary (the paper's WMT En-De setup).
#
# Environment: THREADS (CPU threads; default: all cores), STEPS (timed steps; default 10 on CPU,
# 20 on GPU), PROFILE=1 (print torch.profiler's top operators for the d256 CPU model).
# Uses the active Python if it has torch (e.g. a GPU image), else the project's environment.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
if [ -z "${VIRTUAL_ENV:-}" ] && python3 -c 'import torch' 2>/dev/null; then
    py=python3
else
    . recipes/lib/env.sh
    nmtkit_env
    py=python
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
bench=(recipes/bench/model.py)
threads=${THREADS:-$(nproc)}

echo "# $(uname -n): $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), torch $($py -c 'import torch; print(torch.__version__)')"
cpu=(--device cpu --dtype fp32 --tokens 4000 --length 25 --vocab 10000 --threads "$threads"
     --steps "${STEPS:-10}" --warmup 2)
$py "${bench[@]}" --arch transformer_tiny "${cpu[@]}"
profile=()
[ "${PROFILE:-0}" = 1 ] && profile=(--profile)
$py "${bench[@]}" --arch transformer_base --label d256_3+3_h4_ff1024 \
    --set encoder_layers=3 decoder_layers=3 d_model=256 d_ff=1024 heads=4 "${cpu[@]}" "${profile[@]}"

if $py -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    gpu=(--device cuda --dtype bf16 --tokens 16384 --length 32 --vocab 37000 --steps "${STEPS:-20}" --warmup 5)
    for arch in transformer_base transformer_big; do
        $py "${bench[@]}" --arch "$arch" "${gpu[@]}"
        $py "${bench[@]}" --arch "$arch" "${gpu[@]}" --compile
    done
else
    echo "# no CUDA device: skipped transformer_base / transformer_big in bf16"
fi
