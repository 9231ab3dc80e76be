#!/usr/bin/env bash
# Training benchmark on Multi30k De->En (CPU), set up like ../shared/anchors' fairseq yardstick:
# the d_model=256, 3+3-layer, 4-head, d_ff 1024, shared-embedding Transformer, joint sentencepiece
# BPE 8K + joined dictionary, Adam (0.9, 0.98, 1e-9), inverse_sqrt lr 7e-4 with 1000 warmup updates,
# label smoothing 0.1, --max-tokens 4096, seed 1, for MAX_UPDATE updates. Prints target tokens/s
# (mean over the logged intervals after the first, target tokens incl. </s>), peak RSS, and the end
# of the loss curve; then (MEMCHECK=1) trains MEM_UPDATES updates on the corpus repeated 1x and
# REPEAT x and prints both peak RSS figures: shards are memory-mapped, so they should be equal up
# to the per-sentence index arrays (16 bytes per pair).
#
#   bash recipes/bench/train.sh
#
# Environment (defaults):
#   NMTKIT_DATA   folder with train/val/test_2016_flickr.{de,en}.gz  (../shared/data/multi30k)
#   BENCH_DIR     work folder: data, runs, results.jsonl            ($HOME/.cache/nmtkit-bench/train)
#   MAX_UPDATE=200  THREADS=2  LOG_INTERVAL=50  MEMCHECK=1  MEM_UPDATES=30  REPEAT=20
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
. recipes/lib/env.sh
nmtkit_env

DATA=${NMTKIT_DATA:-$ROOT/../shared/data/multi30k}
BENCH_DIR=${BENCH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmtkit-bench/train}
MAX_UPDATE=${MAX_UPDATE:-200}
THREADS=${THREADS:-2}
LOG_INTERVAL=${LOG_INTERVAL:-50}
MEMCHECK=${MEMCHECK:-1}
MEM_UPDATES=${MEM_UPDATES:-30}
REPEAT=${REPEAT:-20}
for v in MAX_UPDATE THREADS LOG_INTERVAL MEM_UPDATES REPEAT; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "$v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
for s in train val test_2016_flickr; do for l in de en; do
    [ -f "$DATA/$s.$l.gz" ] || { echo "missing $DATA/$s.$l.gz (set NMTKIT_DATA)" >&2; exit 2; }
done; done
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
mkdir -p "$BENCH_DIR"
RESULTS=$BENCH_DIR/results.jsonl
: > "$RESULTS"

ARCH=(--arch transformer_base --encoder-layers 3 --decoder-layers 3 --d-model 256 --d-ff 1024 --heads 4
      --share-embeddings all --dropout 0.1 --label-smoothing 0.1)
OPT=(--lr-scheduler inverse_sqrt --lr 7e-4 --warmup-updates 1000 --adam-betas 0.9,0.98 --adam-eps 1e-9
     --max-tokens 4096 --seed 1 --device cpu --threads "$THREADS" --no-progress-bar)

prep() {  # prep PREFIX_DIR DEST
    python -m nmtkit preprocess -s de -t en --trainpref "$1/train" --validpref "$1/val" \
        --testpref "$1/test_2016_flickr" --destdir "$2" --bpe sentencepiece --vocab-size 8000 \
        --joined-dictionary --workers 2 --force > "$2.prep.log" 2>&1 \
        || { echo "[prep] failed; see $2.prep.log" >&2; tail -n 20 "$2.prep.log" >&2; exit 1; }
}

echo "[prep] sentencepiece 8K joint + binarize (log: $BENCH_DIR/data.prep.log)"
prep "$DATA" "$BENCH_DIR/data"

echo "[train] $MAX_UPDATE updates, $THREADS threads"
rm -rf "$BENCH_DIR/run"
python recipes/bench/train_stats.py --label "train ${MAX_UPDATE}u" --json "$RESULTS" -- \
    python -m nmtkit train "$BENCH_DIR/data" "${ARCH[@]}" "${OPT[@]}" --max-update "$MAX_UPDATE" \
    --log-interval "$LOG_INTERVAL" --save-dir "$BENCH_DIR/run" 2> "$BENCH_DIR/run.log" \
    || { tail -n 20 "$BENCH_DIR/run.log" >&2; exit 1; }

if [ "$MEMCHECK" = 1 ]; then
    REP=$BENCH_DIR/corpus_x$REPEAT
    mkdir -p "$REP"
    for l in de en; do
        if [ ! -f "$REP/train.$l.gz" ]; then
            for _ in $(seq "$REPEAT"); do gzip -dc "$DATA/train.$l.gz"; done | gzip -1 > "$REP/train.$l.gz.tmp"
            mv "$REP/train.$l.gz.tmp" "$REP/train.$l.gz"
        fi
        for s in val test_2016_flickr; do cp -f "$DATA/$s.$l.gz" "$REP/"; done
    done
    echo "[memcheck] corpus x$REPEAT: preprocess (log: $BENCH_DIR/data_x$REPEAT.prep.log)"
    prep "$REP" "$BENCH_DIR/data_x$REPEAT"
    for tag in x1 "x$REPEAT"; do
        d=$BENCH_DIR/data; [ "$tag" = x1 ] || d=$BENCH_DIR/data_x$REPEAT
        rm -rf "$BENCH_DIR/mem_$tag"
        python recipes/bench/train_stats.py --label "memcheck $tag" --json "$RESULTS" -- \
            python -m nmtkit train "$d" "${ARCH[@]}" "${OPT[@]}" --max-update "$MEM_UPDATES" --no-validate \
            --log-interval 10 --save-dir "$BENCH_DIR/mem_$tag" 2> "$BENCH_DIR/mem_$tag.log" \
            || { tail -n 20 "$BENCH_DIR/mem_$tag.log" >&2; exit 1; }
    done
fi

python - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n| run | pairs | updates | tgt tok/s | peak RSS MiB | RSS after set-up MiB | wall s | last train loss (bits) | ppl |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    lt = r["last_train"] or {}
    print(f"| {r['label']} | {r['train_pairs']} | {r['updates']} | {r['tgt_tok_per_s']:.0f} | {r['peak_rss_mib']:.0f} | "
          f"{r['setup_rss_mib']} | {r['wall_s']:.0f} | {lt.get('loss', float('nan')):.3f} | {lt.get('ppl', float('nan')):.1f} |")
main = rows[0]
print(f"\nloss curve end ({main['label']}): " + ", ".join(f"u{u}: {l}" for u, l in main["loss_curve"][-4:]))
if main["last_valid"]:
    v = main["last_valid"]
    print(f"last validation: update {v['update']}, nll {v['nll_loss']:.3f} bits, ppl {v['ppl']:.1f}")
mem = [r for r in rows if r["label"].startswith("memcheck")]
if len(mem) == 2:
    print(f"peak RSS {mem[0]['label']}: {mem[0]['peak_rss_mib']:.0f} MiB, {mem[1]['label']}: "
          f"{mem[1]['peak_rss_mib']:.0f} MiB ({mem[1]['train_pairs']} vs {mem[0]['train_pairs']} pairs); after "
          f"loading data and model: {mem[0]['setup_rss_mib']} vs {mem[1]['setup_rss_mib']} MiB")
print(f"(tok/s = {main['how']}; results: {sys.argv[1]})")
PY
