#!/usr/bin/env bash
# The README's main command: Multi30k German->English with nmtkit, from raw text to sacreBLEU.
#
#   bash recipes/quickstart.sh [--smoke]      # or: SMOKE=1 bash recipes/quickstart.sh
#
# Stages (each skipped when its verified output exists, so a re-run continues where it stopped):
#   data        Multi30k task 1 raw text: $NMTKIT_DATA if set, else downloaded into a cache
#   preprocess  sentencepiece BPE (8000 pieces, joint De+En), joined dictionary, binarized shards
#   train       a small Transformer (d_model 256, 3+3 layers, 4 heads, d_ff 1024, shared
#               embeddings) for MAX_UPDATE updates (about 20 minutes on 2 CPU cores; a GPU is used
#               when present and is much faster), a checkpoint every SAVE_INTERVAL_UPDATES updates
#   average     the last AVG_N checkpoints averaged into one model
#   generate    test_2016_flickr (1000 sentences) translated: beam 4, length penalty 0.6
#   score       sacreBLEU printed on stdout
#
# Options:
#   --smoke     CI-sized run of the same pipeline (about 35 s on 2 idle CPU cores): the first
#               2000 training pairs, 1000 pieces, transformer_tiny, 300 updates at learning rate
#               5e-3, on CPU, in a separate work directory (SMOKE=1 in the environment does the
#               same). It checks the pipeline, not the model: the validation loss falls; most
#               translations stop after one to three words ("A man in"), a few are empty, and
#               BLEU stays near 1 (docs/quickstart.md).
# Environment (every setting below can be overridden, e.g. MAX_UPDATE=1600 for a longer run):
#   NMTKIT_DATA   folder holding train.{de,en}.gz, val.{de,en}.gz, test_2016_flickr.{de,en}.gz
#   NMTKIT_CACHE  where downloads go (default: ${XDG_CACHE_HOME:-~/.cache}/nmtkit/multi30k)
#   NMTKIT_MULTI30K_URL  download location (default: the GitHub multi30k/dataset task1/raw folder)
#   NMTKIT_WORK   work directory (default: ./runs/multi30k_de_en, or ./runs/multi30k_de_en_smoke)
#   STAGE=name    start from this stage (it and every later stage run); LAST_STAGE=name stops after it
#   MAX_UPDATE, MAX_TIME, LR, WARMUP, MAX_TOKENS, DROPOUT, SAVE_INTERVAL_UPDATES, AVG_N, BEAM,
#   LENPEN, DEVICE (auto|cpu|cuda), THREADS, WORKERS: see the settings block; docs/quickstart.md
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RECIPE_NAME=quickstart

# shellcheck disable=SC1091
. recipes/lib/options.sh
recipe_options "${BASH_SOURCE[0]}" "$@"   # --smoke (SMOKE=1 in the environment is the same), --help

# ---------------------------------------------------------------- settings -------------------
WORK=${NMTKIT_WORK:-$ROOT/runs/multi30k_de_en$(s _smoke "")}
SMOKE_TRAIN_LINES=2000
VOCAB_SIZE=${VOCAB_SIZE:-$(s 1000 8000)}
WORKERS=${WORKERS:-1}
# The model of the fairseq 0.12.2 reference run (docs/fairseq.md, "Comparing with fairseq 0.12.2
# and CTranslate2 yourself"; 7.6M parameters, fairseq's log says 9.9M because it also counts
# fused copies of its encoder weights, docs/train.md "Speed against fairseq"): transformer_base with 3+3 layers, d_model 256, 4 heads, d_ff 1024, all embeddings
# shared. Small data and a short budget: a larger learning rate than the paper's with a short
# linear warmup (fairseq's inverse_sqrt schedule), label smoothing 0.1 (the architecture's).
if [ "$SMOKE" = 1 ]; then
    ARCH_FLAGS=(--arch transformer_tiny)
else
    ARCH_FLAGS=(--arch transformer_base --encoder-layers 3 --decoder-layers 3 --d-model 256
                --d-ff 1024 --heads 4 --share-embeddings all --dropout "${DROPOUT:-0.1}")
fi
# --smoke: transformer_tiny (0.2M parameters) with a higher peak rate (5e-3; 1e-2 learns less);
# 300 updates (6 epochs of the 2000-pair slice) take about 20 s on one core and are what it needs
# to say more than "A" (after 30 updates every translation was empty).
LR=${LR:-$(s 5e-3 1e-3)}
WARMUP=${WARMUP:-$(s 50 400)}
MAX_TOKENS=${MAX_TOKENS:-$(s 1024 2048)}  # half the reference run's 4096: twice the updates per epoch
MAX_UPDATE=${MAX_UPDATE:-$(s 300 1600)}  # the budget: 1600 updates (7 epochs) took 20 min on 2 idle cores
MAX_TIME=${MAX_TIME:-}                  # optional wall-clock cap, e.g. 20m (results then vary)
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(s 10 100)}
AVG_N=${AVG_N:-$(s 2 5)}
SEED=${SEED:-1}
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
MAX_LEN_A=1 MAX_LEN_B=50               # output limit: input length + 50 (the paper's)
DEVICE=${DEVICE:-$(s cpu auto)}
THREADS=${THREADS:-$(s 1 "$(nproc)")}
# ---------------------------------------------------------------------------------------------

# shellcheck disable=SC1091
. recipes/lib/stages.sh
# shellcheck disable=SC1091
. recipes/lib/env.sh
# shellcheck disable=SC1091
. recipes/lib/multi30k.sh

DATA_BIN=$WORK/data
CKPT_DIR=$WORK/checkpoints
AVG_CKPT=$CKPT_DIR/average_last$AVG_N.pt
HYP=$WORK/test_2016_flickr.hyp.en
SCORE_FILE=$WORK/score.txt
STAMP_DIR=$WORK/stamps
STAGES=(data preprocess train average generate score)

stage_data() {
    multi30k_raw de en
    # --smoke trains on the first SMOKE_TRAIN_LINES pairs only; valid and test stay complete.
    mkdir -p "$WORK/raw"
    python - "$RAW" "$WORK/raw" "$(s "$SMOKE_TRAIN_LINES" 0)" <<'EOF'
import gzip, os, shutil, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for split in ("train", "val", "test_2016_flickr"):
    for lang in ("de", "en"):
        name = f"{split}.{lang}.gz"
        tmp = os.path.join(dst, f".{name}.tmp")
        if split == "train" and n:
            with gzip.open(os.path.join(src, name), "rb") as fh, gzip.open(tmp, "wb") as fo:
                fo.writelines(fh.readline() for _ in range(n))
        else:
            shutil.copyfile(os.path.join(src, name), tmp)
        os.replace(tmp, os.path.join(dst, name))
EOF
    local f
    for f in $(multi30k_files de en); do STAGE_OUTPUTS+=("$WORK/raw/$f"); done
}

stage_preprocess() {
    nmtkit preprocess --source-lang de --target-lang en \
        --trainpref "$WORK/raw/train" --validpref "$WORK/raw/val" --testpref "$WORK/raw/test_2016_flickr" \
        --destdir "$DATA_BIN" --bpe sentencepiece --vocab-size "$VOCAB_SIZE" --joined-dictionary \
        --workers "$WORKERS" --force
    STAGE_OUTPUTS+=("$DATA_BIN/manifest.json")
}

device_flags() {  # --threads matters on CPU only (on a GPU it sets the CPU threads for data work)
    DEV_FLAGS=(--device "$DEVICE" --threads "$THREADS")
}

stage_train() {
    local cap=()
    if [ -n "$MAX_TIME" ]; then cap=(--max-time "$MAX_TIME"); fi
    device_flags
    check_run_settings "$CKPT_DIR" "data=$K_PREPROCESS" "arch=${ARCH_FLAGS[*]}" "LR=$LR" \
        "WARMUP=$WARMUP" "MAX_TOKENS=$MAX_TOKENS" "SEED=$SEED"
    nmtkit train "$DATA_BIN" "${ARCH_FLAGS[@]}" --save-dir "$CKPT_DIR" \
        --lr-scheduler inverse_sqrt --lr "$LR" --warmup-updates "$WARMUP" \
        --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" "${cap[@]}" \
        --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-last-updates "$AVG_N" \
        --no-epoch-checkpoints --seed "$SEED" --log-interval 50 "${DEV_FLAGS[@]}"
    show_valid_loss "$CKPT_DIR"
    STAGE_OUTPUTS+=("$CKPT_DIR/checkpoint_last.pt")
}

show_score() {
    cat "$SCORE_FILE"
    if [ "$SMOKE" = 1 ]; then
        say "--smoke checks the pipeline, not the model: transformer_tiny after $MAX_UPDATE updates on" \
            "$SMOKE_TRAIN_LINES pairs scores near 1 BLEU (the full run: about 35)"
    fi
}

stage_score() {
    nmtkit score --sys "$HYP" --ref "$WORK/raw/test_2016_flickr.en.gz" --metric bleu > "$SCORE_FILE.tmp"
    mv -f "$SCORE_FILE.tmp" "$SCORE_FILE"
    show_score
    STAGE_OUTPUTS+=("$SCORE_FILE")
}

[[ $SMOKE =~ ^[01]$ ]] || die "SMOKE must be 0 or 1, got '$SMOKE'"
for v in VOCAB_SIZE WORKERS WARMUP MAX_TOKENS MAX_UPDATE SAVE_INTERVAL_UPDATES AVG_N SEED BEAM THREADS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
stages_init "${STAGE:-}" "${LAST_STAGE:-}"
nmtkit_env || die "could not set up the Python environment (recipes/lib/env.sh)"
say "work dir $WORK$(s ' (--smoke)' '')"

K_DATA=$(key data "${NMTKIT_DATA:-download}" "$MULTI30K_URL" "$SMOKE" "$SMOKE_TRAIN_LINES")
K_PREPROCESS=$(key preprocess "$K_DATA" "$VOCAB_SIZE")
K_TRAIN=$(key train "$K_PREPROCESS" "${ARCH_FLAGS[@]}" "$LR" "$WARMUP" "$MAX_TOKENS" "$MAX_UPDATE" \
    "$MAX_TIME" "$SAVE_INTERVAL_UPDATES" "$SEED")
K_AVERAGE=$(key average "$K_TRAIN" "$AVG_N")
K_GENERATE=$(key generate "$K_AVERAGE" "$BEAM" "$LENPEN")
K_SCORE=$(key score "$K_GENERATE")

run_stage data "$K_DATA" stage_data
run_stage preprocess "$K_PREPROCESS" stage_preprocess
run_stage train "$K_TRAIN" stage_train
run_stage average "$K_AVERAGE" stage_average
run_stage generate "$K_GENERATE" stage_generate
run_stage score "$K_SCORE" stage_score show_score
if [ -n "${NMTKIT_ENV_ACTIVATED:-}" ]; then
    say "nmtkit is installed in $NMTKIT_ENV_ACTIVATED; to run it yourself: source $NMTKIT_ENV_ACTIVATED/bin/activate"
fi
