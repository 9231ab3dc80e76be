#!/usr/bin/env bash
# Reproduce the English constituency parsing result of "Attention Is All You Need" (section 6.3,
# Table 4): WSJ section 23 F1 91.3 (WSJ only, 4 layers), 92.7 semi-supervised.
#
#   PTB_DIR=/path/to/treebank_3/parsed/mrg/wsj bash recipes/ptb/run.sh     # WSJ only (GPU advised)
#   PTB_DIR=... SILVER=silver.trees bash recipes/ptb/run.sh                 # semi-supervised
#   SAMPLE=1 bash recipes/ptb/run.sh        # the small-data result: NLTK sample, ~20 min on 2 CPU cores
#   SMOKE=1 bash recipes/ptb/run.sh         # every stage in a couple of minutes on CPU (NLTK sample)
#   STAGE=generate PTB_DIR=... bash recipes/ptb/run.sh                      # start from one stage
#
# PTB_DIR is the LDC Treebank-3 folder parsed/mrg/wsj (sections 00 ... 24 of wsj_SSNN.mrg files);
# the treebank is licensed from the LDC by its users, so nothing is downloaded. Split: sections
# 02-21 train (39832 trees), 22 valid, 23 test (2416 trees, all lengths). SILVER: more training
# trees (one per line or .mrg, plain or .gz; the paper used ~17M sentences parsed by the Berkeley
# parser and the high-confidence corpus of Vinyals et al. 2015), added to sections 02-21.
#
# Stages: preprocess train average generate score. Each is skipped when its verified output exists,
# so an interrupted run continues when the same command is run again (training resumes from its
# last checkpoint). Every setting below can be overridden from the environment; changing one
# re-runs the stage it belongs to and the later ones. See docs/parsing.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
RECIPE_NAME=ptb
# shellcheck disable=SC1091
. recipes/lib/stages.sh
# shellcheck disable=SC1091
. recipes/lib/env.sh

# ---------------------------------------------------------------- settings (all of them) -------
SMOKE=${SMOKE:-0}                   # 1: CPU smoke run on the NLTK sample in $NMTKIT_SHARED/data/ptb (docs/testing.md)
SAMPLE=${SAMPLE:-0}                 # 1: the small-data setting on that sample (a real F1, ~20 min CPU)
m() {                               # m SMOKE_VALUE SAMPLE_VALUE FULL_VALUE
    if [ "$SMOKE" = 1 ]; then echo "$1"; elif [ "$SAMPLE" = 1 ]; then echo "$2"; else echo "$3"; fi
}
PTB_DIR=${PTB_DIR:-}                # LDC Treebank-3 parsed/mrg/wsj (required unless SMOKE=1 or SAMPLE=1)
SILVER=${SILVER:-}                  # optional silver trees: the semi-supervised setting
NMTKIT_SHARED=${NMTKIT_SHARED:-$ROOT/../shared}
SMOKE_TREEBANK=$NMTKIT_SHARED/data/ptb/treebank.zip   # NLTK's 10% sample (wsj_0001-0199)
SETTING=$(if [ -n "$SILVER" ]; then echo semi; else echo wsj; fi)
WORK=${WORK:-$ROOT/runs/ptb_$SETTING$(m _smoke _sample "")}   # everything the recipe writes

# Data: the standard split (SMOKE, SAMPLE: the sample split by document, wsj_0001-0179 /
# 0180-0189 / 0190-0199); trees normalized as EVALB expects (docs/parsing.md); the target keeps the
# part-of-speech tags (tensor2tensor's WSJ data, used for the paper; POS_TAGS=xx: Vinyals et al.).
# Source: sentencepiece on the words, 16K pieces (32K semi-supervised: section 6.3); the target's
# tree tokens are whole tokens with their own dictionary (~100 entries). No train cleaning: long
# trees (up to 4 target tokens per word) are kept. SAMPLE: the 3669 training trees are too few to
# learn subwords from, so the source is whole words (BPE=none), those seen once in training
# becoming <unk> (THRESHOLD_SRC=2), which also teaches the model the <unk> it meets in the test.
SPLIT=$(m sample sample ptb)
POS_TAGS=${POS_TAGS:-keep}
BPE=${BPE:-$(m sentencepiece none sentencepiece)}   # sentencepiece | none (source side)
VOCAB_SIZE=${VOCAB_SIZE:-$(m 1000 0 "$(if [ -n "$SILVER" ]; then echo 32000; else echo 16000; fi)")}
THRESHOLD_SRC=${THRESHOLD_SRC:-$(m 0 2 0)}         # source words seen fewer times -> <unk>
SPM_MAX_LINES=${SPM_MAX_LINES:-1000000}
WORKERS=${WORKERS:-$(m 1 1 "$(nproc)")}

# Model and training (section 6.3 and tensor2tensor's transformer_parsing_base, which the paper's
# authors released): transformer_parse = 4+4 layers, d_model 1024, d_ff 2048, 8 heads, residual
# and attention dropout 0.2, separate embeddings, warmup 16000; Adam (0.9, 0.98, 1e-9); the
# paper's learning rate d_model^-0.5 * min(u^-0.5, u * warmup^-1.5) times LR_SCALE = 0.5
# (tensor2tensor: learning_rate 0.05 for parsing against 0.1 for the base model). Update size:
# tensor2tensor's batch_size 4096 tokens. The paper states neither the number of updates nor the
# update size for parsing: MAX_UPDATE and TOKENS_PER_UPDATE are our choices (100K updates of ~4K
# tokens is ~160 passes over sections 02-21).
# SAMPLE: transformer_parse cut down for 3669 trees and 20 CPU minutes (3+3 layers, d_model 128,
# d_ff 512, 4 heads, dropout 0.1), warmup 400, LR_SCALE 0.45 (a peak rate of 2e-3), 1536 tokens
# per update, a checkpoint every 200 updates.
ARCH=${ARCH:-$(m transformer_tiny transformer_parse transformer_parse)}
ARCH_ARGS=${ARCH_ARGS-$(m "" "--encoder-layers 3 --decoder-layers 3 --d-model 128 --d-ff 512 --heads 4 --dropout 0.1 --attention-dropout 0.1" "")}
MAX_UPDATE=${MAX_UPDATE:-$(m 40 8000 100000)}
WARMUP=${WARMUP:-$(m 20 400 16000)}
LR_SCALE=${LR_SCALE:-$(m 1.0 0.45 0.5)}
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE:-$(m 1024 1536 4096)}
MAX_TOKENS=${MAX_TOKENS:-$TOKENS_PER_UPDATE}           # per batch; UPDATE_FREQ = their ratio
UPDATE_FREQ=${UPDATE_FREQ:-$(( (TOKENS_PER_UPDATE + MAX_TOKENS - 1) / MAX_TOKENS ))}
SAVE_INTERVAL_MINUTES=${SAVE_INTERVAL_MINUTES:-$(m 0 0 10)}   # the paper: every 10 minutes
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(m 20 200 0)}
AVG_N=${AVG_N:-$(m 2 5 5)}          # checkpoints averaged (the base model's 5; the paper gives none for parsing)
KEEP_LAST=${KEEP_LAST:-$AVG_N}
SEED=${SEED:-1}
LOG_INTERVAL=${LOG_INTERVAL:-$(m 10 100 100)}
EXTRA_TRAIN_ARGS=${EXTRA_TRAIN_ARGS:-}  # more `nmtkit train` flags, e.g. "--compile"
DEVICE=${DEVICE:-$(m cpu auto auto)}  # auto | cpu | cuda (one device: sections 02-21 are 40K trees)
PRECISION=${PRECISION:-}            # default: bf16 on a GPU that has it, fp16 on other GPUs, fp32 on CPU
THREADS=${THREADS:-$(m 1 "$(nproc)" "$(nproc)")}

# Decoding and scoring (section 6.3): beam 21, length penalty alpha 0.3, output limit input
# length + 300; EVALB F1 with COLLINS.prm on section 23, all sentence lengths.
BEAM=${BEAM:-$(m 4 4 21)}
LENPEN=${LENPEN:-$(m 0.3 0.3 0.3)}
MAX_LEN_A=${MAX_LEN_A:-1}
MAX_LEN_B=${MAX_LEN_B:-300}
PAPER_F1=$(if [ -n "$SILVER" ]; then echo "92.7 (Table 4, semi-supervised)"; else echo "91.3 (Table 4, WSJ only)"; fi)
if [ "$SAMPLE" = 1 ]; then PAPER_F1="$PAPER_F1 on 39832 training trees, not comparable"; fi
# -----------------------------------------------------------------------------------------------

STAGES=(preprocess train average generate score)

_int() {  # _int NAME: the variable NAME must hold an integer >= 0
    [[ ${!1} =~ ^[0-9]+$ ]] || die "$1 must be a non-negative integer, got '${!1}'"
}

ptb_setup() {
    # Settings are checked first, so that a mistake costs no time.
    case $SMOKE in 0|1) ;; *) die "SMOKE must be 0 or 1, got '$SMOKE'" ;; esac
    case $SAMPLE in 0|1) ;; *) die "SAMPLE must be 0 or 1, got '$SAMPLE'" ;; esac
    if [ "$SMOKE$SAMPLE" = 11 ]; then die "SMOKE=1 and SAMPLE=1 exclude each other"; fi
    case $BPE in sentencepiece|none) ;; *) die "BPE must be sentencepiece or none, got '$BPE'" ;; esac
    case $POS_TAGS in keep|xx) ;; *) die "POS_TAGS must be keep or xx, got '$POS_TAGS'" ;; esac
    case $DEVICE in auto|cpu|cuda) ;; *) die "DEVICE must be auto, cpu or cuda, got '$DEVICE'" ;; esac
    for v in VOCAB_SIZE MAX_UPDATE WARMUP TOKENS_PER_UPDATE MAX_TOKENS UPDATE_FREQ AVG_N BEAM \
             MAX_LEN_B SAVE_INTERVAL_UPDATES WORKERS THREADS SEED THRESHOLD_SRC; do _int "$v"; done
    if [ "$SMOKE" = 1 ] || [ "$SAMPLE" = 1 ]; then
        TREEBANK=$SMOKE_TREEBANK
    else
        [ -n "$PTB_DIR" ] || die "set PTB_DIR to the LDC Treebank-3 parsed/mrg/wsj folder (or SAMPLE=1 / SMOKE=1 for the NLTK sample)"
        TREEBANK=$PTB_DIR
    fi
    stages_init "${STAGE:-}" "${LAST_STAGE:-}"
    # Then the files: a mistake in the settings is named even where the data is missing.
    if [ -n "$SILVER" ] && [ ! -e "$SILVER" ]; then die "SILVER=$SILVER: no such file"; fi
    if [ "$TREEBANK" = "$SMOKE_TREEBANK" ]; then
        [ -f "$TREEBANK" ] || die "SMOKE=1 and SAMPLE=1 need $TREEBANK (set NMTKIT_SHARED to a folder laid out as docs/testing.md, 'The real data', describes)"
    else
        [ -d "$PTB_DIR" ] || die "PTB_DIR=$PTB_DIR is not a folder"
    fi
    nmtkit_env || die "could not set up the Python environment (recipes/lib/env.sh)"
    if [ "$DEVICE" = auto ]; then
        DEVICE=$(python -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
    fi
    if [ -z "$PRECISION" ]; then
        if [ "$DEVICE" = cuda ]; then
            PRECISION=$(python -c 'import torch; print("bf16" if torch.cuda.is_bf16_supported() else "fp16")')
        else
            PRECISION=fp32
        fi
    fi

    DATA_BIN=$WORK/data
    CKPT_DIR=${CKPT_DIR:-$WORK/checkpoints}
    AVG_CKPT=$CKPT_DIR/average_last$AVG_N.pt
    RESULTS=$WORK/results
    HYP=$RESULTS/test.hyp.trees
    SCORE_FILE=$RESULTS/test.score.txt
    STAMP_DIR=$WORK/stamps

    # Stage keys: each one hashes the stage's settings and the previous stage's key.
    K_PREPROCESS=$(key preprocess "$SMOKE" "$TREEBANK" "$SPLIT" "$SILVER" "$POS_TAGS" "$BPE" "$VOCAB_SIZE" \
        "$THRESHOLD_SRC" "$SPM_MAX_LINES")
    K_TRAIN=$(key train "$K_PREPROCESS" "$ARCH" "$ARCH_ARGS" "$TOKENS_PER_UPDATE" "$MAX_TOKENS" "$UPDATE_FREQ" \
        "$MAX_UPDATE" "$WARMUP" "$LR_SCALE" "$SAVE_INTERVAL_MINUTES" "$SAVE_INTERVAL_UPDATES" \
        "$PRECISION" "$SEED" "$EXTRA_TRAIN_ARGS")
    K_AVERAGE=$(key average "$K_TRAIN" "$AVG_N")
    K_GENERATE=$(key generate "$K_AVERAGE" "$BEAM" "$LENPEN" "$MAX_LEN_A" "$MAX_LEN_B")
    K_SCORE=$(key score "$K_GENERATE" "$PAPER_F1")
}

ptb_summary() {
    local mode=""
    if [ "$SMOKE" = 1 ]; then mode=" (SMOKE=1: a CPU-sized run on the NLTK sample)"; fi
    if [ "$SAMPLE" = 1 ]; then mode=" (SAMPLE=1: the small-data setting on the NLTK sample)"; fi
    say "ptb $SETTING$mode: treebank $TREEBANK${SILVER:+ + silver $SILVER}, work dir $WORK"
    say "  arch $ARCH${ARCH_ARGS:+ $ARCH_ARGS}, $MAX_UPDATE updates of --max-tokens $MAX_TOKENS x --update-freq $UPDATE_FREQ," \
        "warmup $WARMUP, lr scale $LR_SCALE, on $DEVICE ($PRECISION); average of the last $AVG_N checkpoints"
    say "  decoding: beam $BEAM, lenpen $LENPEN, max length $MAX_LEN_A * input + $MAX_LEN_B"
}

stage_preprocess() {
    # --force: this directory belongs to the recipe; an identical dataset is found up to date and
    # kept, a different one (settings changed) is replaced only once the new one is complete.
    local extra=()
    if [ -n "$SILVER" ]; then extra+=(--extra-train "$SILVER"); fi
    if [ "$BPE" = sentencepiece ]; then extra+=(--vocab-size "$VOCAB_SIZE" --spm-max-lines "$SPM_MAX_LINES"); fi
    nmtkit preprocess --task parsing --treebank "$TREEBANK" --split "$SPLIT" "${extra[@]}" \
        --pos-tags "$POS_TAGS" --destdir "$DATA_BIN" --bpe "$BPE" --thresholdsrc "$THRESHOLD_SRC" \
        --workers "$WORKERS" --force
    STAGE_OUTPUTS+=("$DATA_BIN/manifest.json" "$DATA_BIN/test.gold.trees")
}

stage_train() {
    check_run_settings "$CKPT_DIR" "data=$K_PREPROCESS" "ARCH=$ARCH" "ARCH_ARGS=$ARCH_ARGS" "LR_SCALE=$LR_SCALE" \
        "WARMUP=$WARMUP" "TOKENS_PER_UPDATE=$TOKENS_PER_UPDATE" "SEED=$SEED" \
        "PRECISION=$PRECISION" "EXTRA_TRAIN_ARGS=$EXTRA_TRAIN_ARGS"
    local args=(
        "$DATA_BIN" --arch "$ARCH" --save-dir "$CKPT_DIR"
        --lr-scheduler noam --lr-scale "$LR_SCALE" --warmup-updates "$WARMUP"
        --adam-betas 0.9,0.98 --adam-eps 1e-9
        --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE"
        --save-interval-minutes "$SAVE_INTERVAL_MINUTES" --save-interval-updates "$SAVE_INTERVAL_UPDATES"
        --keep-last-updates "$KEEP_LAST" --no-epoch-checkpoints
        --device "$DEVICE" --precision "$PRECISION" --seed "$SEED" --log-interval "$LOG_INTERVAL"
    )
    if [ "$ARCH" = transformer_tiny ]; then args+=(--share-embeddings none); fi  # separate dictionaries
    # shellcheck disable=SC2206
    if [ -n "$ARCH_ARGS" ]; then args+=($ARCH_ARGS); fi
    if [ "$DEVICE" = cpu ]; then args+=(--threads "$THREADS"); fi
    # shellcheck disable=SC2206
    if [ -n "$EXTRA_TRAIN_ARGS" ]; then args+=($EXTRA_TRAIN_ARGS); fi
    say "train: nmtkit train ${args[*]}"
    # Interrupted? Run the recipe again: training resumes from checkpoint_last.pt.
    nmtkit train "${args[@]}"
    STAGE_OUTPUTS+=("$CKPT_DIR/checkpoint_last.pt")
}

show_score() { cat "$SCORE_FILE"; }

stage_score() {
    local tmp=$SCORE_FILE.tmp.$$ what
    what=$(m "NLTK sample wsj_0190-0199" "NLTK sample wsj_0190-0199" "WSJ section 23")
    {
        echo "ptb $SETTING, $what ($(wc -l < "$DATA_BIN/test.gold.trees") sentences), average of the last $AVG_N checkpoints, beam $BEAM, lenpen $LENPEN:"
        nmtkit score --metric parseval --sys "$HYP" --ref "$DATA_BIN/test.gold.trees" \
            | sed -e "s/^Parseval.*/& | paper: $PAPER_F1/"
    } > "$tmp"
    grep -q '^Parseval F1 = ' "$tmp" || { rm -f "$tmp"; die "scoring failed"; }
    mv -f "$tmp" "$SCORE_FILE"
    show_score
    STAGE_OUTPUTS+=("$SCORE_FILE")
}

ptb_setup
ptb_summary
run_stage preprocess "$K_PREPROCESS" stage_preprocess
run_stage train "$K_TRAIN" stage_train
run_stage average "$K_AVERAGE" stage_average
run_stage generate "$K_GENERATE" stage_generate
run_stage score "$K_SCORE" stage_score show_score
