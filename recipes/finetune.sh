#!/usr/bin/env bash
# Fine-tune the quickstart's Multi30k De->En model (image captions) on news, and measure both
# domains before and after: the adaptation users do most after training.
#
#   bash recipes/finetune.sh [--smoke]        # or: SMOKE=1 bash recipes/finetune.sh
#
# Stages (each skipped when its verified output exists, so a re-run continues where it stopped):
#   base        the quickstart model: $BASE_MODEL if it exists (used as it is, read only), else
#               recipes/quickstart.sh is run (up to its average stage) in $QUICKSTART_WORK
#   data        WMT news De-En: newstest2013 (3000 pairs) to fine-tune on; newstest2014 (3003)
#               split into a validation part (the first NEWS_VALID_LINES) and a held-out test
#               part (the last NEWS_TEST_LINES), from $WMT14_DIR if it holds them, else
#               downloaded from statmt.org (dev.tgz, test-full.tgz; md5-checked SGM, extracted
#               as sacreBLEU does)
#   preprocess  nmtkit preprocess --srcdict/--tgtdict: the news text with the base model's own
#               sentencepiece model and dictionaries (the model's ids, unchanged)
#   before      the base model translates the held-out news and Multi30k test_2016_flickr: sacreBLEU
#   train       nmtkit train --finetune-from-model: a new run from the base model's weights (its
#               architecture; dropout raised to DROPOUT), fresh Adam and schedule, the best
#               checkpoint by news validation loss
#   after       the fine-tuned model on both test sets; the before/after table on stdout
#
# Options:
#   --smoke     CI-sized run of the same pipeline: the quickstart's --smoke model, 300 news pairs,
#               30 updates (validated every 10), on CPU, 100 held-out news lines and 200 flickr
#               lines. It checks the pipeline, not the model: the news validation loss falls, BLEU
#               stays near 0.
# Environment (each setting below can be overridden):
#   QUICKSTART_WORK  the quickstart's work directory (default: its own, ./runs/multi30k_de_en,
#                    or ./runs/multi30k_de_en_smoke with --smoke)
#   BASE_MODEL, BASE_DATA, FLICKR_SRC, FLICKR_REF  the model to fine-tune, its data directory
#                    and test_2016_flickr's German source and English reference (default: the
#                    quickstart's files in QUICKSTART_WORK: checkpoints/average_lastN.pt, data,
#                    raw/test_2016_flickr.en.gz; FLICKR_SRC: FLICKR_REF's name with .de.gz for .en.gz)
#   WMT14_DIR        folder with newstest2013.{de,en}.gz and newstest2014-ende.{de,en}.gz
#                    (default: $NMTKIT_SHARED/data/wmt14, NMTKIT_SHARED=../shared)
#   DOWNLOAD_DIR     where the statmt.org archives go when WMT14_DIR lacks the files
#   NMTKIT_WORK      this recipe's work directory (default: ./runs/finetune_news_de_en[_smoke])
#   STAGE=name / LAST_STAGE=name  start from / stop after a stage
#   LR, WARMUP, MAX_UPDATE, MAX_TOKENS, DROPOUT, PATIENCE, SEED, BEAM, LENPEN, DEVICE, THREADS
#   DECODING         generate's --decoding (default fairseq: this recipe adapts a model, it does not
#                    reproduce the paper; fairseq's rules keep a weak model's outputs from stopping
#                    after a word or two; paper: the GNMT penalty and exact stopping)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RECIPE_NAME=finetune

# shellcheck disable=SC1091
. recipes/lib/options.sh
recipe_options "${BASH_SOURCE[0]}" "$@"   # --smoke (SMOKE=1 in the environment is the same), --help

# ---------------------------------------------------------------- settings -------------------
WORK=${NMTKIT_WORK:-$ROOT/runs/finetune_news_de_en$(s _smoke "")}
QUICKSTART_WORK=${QUICKSTART_WORK:-$ROOT/runs/multi30k_de_en$(s _smoke "")}
QS_AVG_N=$(s 2 5)   # the quickstart's number of averaged checkpoints (its AVG_N default)
BASE_MODEL=${BASE_MODEL:-$QUICKSTART_WORK/checkpoints/average_last$QS_AVG_N.pt}
BASE_DATA=${BASE_DATA:-$QUICKSTART_WORK/data}
FLICKR_REF=${FLICKR_REF:-$QUICKSTART_WORK/raw/test_2016_flickr.en.gz}
FLICKR_SRC=${FLICKR_SRC:-${FLICKR_REF%.en.gz}.de.gz}   # beside the reference
NMTKIT_SHARED=${NMTKIT_SHARED:-$ROOT/../shared}
WMT14_DIR=${WMT14_DIR:-$NMTKIT_SHARED/data/wmt14}
DOWNLOAD_DIR=${DOWNLOAD_DIR:-$ROOT/runs/wmt14_download}   # shared with the wmt14 recipes
# statmt.org archives and md5 sums (as in recipes/wmt14_en_de/run.sh)
DEV_URL="https://statmt.org/wmt14/dev.tgz ${DEV_MD5:-88ba3fc60b2278d59277122e1c7dd6e7}"
TEST_URL="https://statmt.org/wmt14/test-full.tgz ${TEST_MD5:-a8cd784e006feb32ac6f3d9ec7eb389a}"
NEWS_TRAIN_LINES=$(s 300 3000)          # newstest2013 pairs to fine-tune on (3000: all of it)
NEWS_VALID_LINES=$(s 100 1003)          # newstest2014 lines 1..N: validation (best checkpoint)
NEWS_TEST_LINES=$(s 100 2000)           # newstest2014's last N lines: the held-out news test
FLICKR_LINES=$(s 200 1000)              # test_2016_flickr lines scored (1000: all of it)
# Fine-tuning: the base model's architecture; a little more dropout for 3000 sentences, a
# fresh Adam with a short warmup to a peak below the quickstart's 1e-3, the checkpoint with the
# best validation loss on news.
LR=${LR:-5e-4}
WARMUP=${WARMUP:-$(s 5 100)}
MAX_UPDATE=${MAX_UPDATE:-$(s 30 800)}
MAX_TOKENS=${MAX_TOKENS:-$(s 1024 2048)}
DROPOUT=${DROPOUT:-0.3}
PATIENCE=${PATIENCE:-5}
SEED=${SEED:-1}
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
DECODING=${DECODING:-fairseq}
MAX_LEN_A=1 MAX_LEN_B=50
DEVICE=${DEVICE:-$(s cpu auto)}
THREADS=${THREADS:-$(s 1 "$(nproc)")}
# ---------------------------------------------------------------------------------------------

# shellcheck disable=SC1091
. recipes/lib/stages.sh
# shellcheck disable=SC1091
. recipes/lib/env.sh

RAW=$WORK/raw
NEWS_BIN=$WORK/data
CKPT_DIR=$WORK/checkpoints
FT_MODEL=$CKPT_DIR/checkpoint_best.pt
RESULTS=$WORK/results
STAMP_DIR=$WORK/stamps
STAGES=(base data preprocess before train after)
NEWS_FILES="newstest2013.de.gz newstest2013.en.gz newstest2014-ende.de.gz newstest2014-ende.en.gz"

stage_base() {
    if [ -f "$BASE_MODEL" ]; then
        say "base: using $BASE_MODEL (data $BASE_DATA)"
    else
        say "base: $BASE_MODEL not found: running recipes/quickstart.sh$(s ' --smoke' '') in $QUICKSTART_WORK"
        env -u STAGE LAST_STAGE=average SMOKE="$SMOKE" NMTKIT_WORK="$QUICKSTART_WORK" bash recipes/quickstart.sh
        [ -f "$BASE_MODEL" ] || die "the quickstart did not write $BASE_MODEL"
    fi
    [ -f "$BASE_DATA/manifest.json" ] || die "BASE_DATA=$BASE_DATA is not a data directory (no manifest.json)"
    [ -f "$FLICKR_SRC" ] || die "FLICKR_SRC=$FLICKR_SRC not found (the quickstart's raw/test_2016_flickr.de.gz)"
    [ -f "$FLICKR_REF" ] || die "FLICKR_REF=$FLICKR_REF not found (the quickstart's raw/test_2016_flickr.en.gz)"
    STAGE_OUTPUTS+=("$BASE_MODEL" "$BASE_DATA/manifest.json" "$FLICKR_SRC" "$FLICKR_REF")
}

_data_py() { python recipes/lib/wmt14_data.py "$@"; }

_download_news() {  # statmt.org's dev.tgz and test-full.tgz -> $WORK/news/*.gz as in the shared copy
    local entry url md5 dest got
    mkdir -p "$DOWNLOAD_DIR" "$WORK/news" "$WORK/extract"
    for entry in "$DEV_URL" "$TEST_URL"; do
        read -r url md5 <<< "$entry"
        dest=$DOWNLOAD_DIR/$(basename "$url")
        if [ ! -f "$dest" ] || [ "$(md5sum "$dest" | cut -d' ' -f1)" != "$md5" ]; then
            say "data: downloading $url"
            curl -fL --retry 5 --retry-delay 10 -o "$dest.part" "$url" || die "download of $url failed (offline? set WMT14_DIR)"
            mv -f "$dest.part" "$dest"
            got=$(md5sum "$dest" | cut -d' ' -f1)
            [ "$got" = "$md5" ] || die "$url: md5 $got, expected $md5"
        fi
    done
    _data_py extract "$DOWNLOAD_DIR/dev.tgz" "$WORK/extract" dev/newstest2013-ref.de.sgm dev/newstest2013-ref.en.sgm
    _data_py extract "$DOWNLOAD_DIR/test-full.tgz" "$WORK/extract" \
        test-full/newstest2014-deen-src.de.sgm test-full/newstest2014-deen-ref.en.sgm
    local pair src name
    for pair in "dev/newstest2013-ref.de.sgm newstest2013.de" "dev/newstest2013-ref.en.sgm newstest2013.en" \
                "test-full/newstest2014-deen-src.de.sgm newstest2014-ende.de" \
                "test-full/newstest2014-deen-ref.en.sgm newstest2014-ende.en"; do
        read -r src name <<< "$pair"
        _data_py sgm "$WORK/extract/$src" "$WORK/news/$name"
        gzip -9 -n -f "$WORK/news/$name"
    done
    rm -rf "$WORK/extract"
    NEWS_DIR=$WORK/news
}

stage_data() {
    local f have=1
    for f in $NEWS_FILES; do [ -f "$WMT14_DIR/$f" ] || have=0; done
    if [ $have = 1 ]; then
        NEWS_DIR=$WMT14_DIR
        say "data: news from $NEWS_DIR"
    else
        say "data: $WMT14_DIR lacks the newstest files: downloading them"
        _download_news
    fi
    local test_first=$((3003 - NEWS_TEST_LINES + 1)) l
    [ "$NEWS_VALID_LINES" -lt "$test_first" ] || die "NEWS_VALID_LINES + NEWS_TEST_LINES must be <= 3003"
    mkdir -p "$RAW"
    for l in de en; do
        _data_py slice "$NEWS_DIR/newstest2013.$l.gz" "$RAW/train.$l" 1 "$NEWS_TRAIN_LINES"
        _data_py slice "$NEWS_DIR/newstest2014-ende.$l.gz" "$RAW/valid.$l" 1 "$NEWS_VALID_LINES"
        _data_py slice "$NEWS_DIR/newstest2014-ende.$l.gz" "$RAW/test.$l" "$test_first" "$NEWS_TEST_LINES"
        STAGE_OUTPUTS+=("$RAW/train.$l" "$RAW/valid.$l" "$RAW/test.$l")
    done
    _data_py slice "$FLICKR_REF" "$RAW/flickr.en" 1 "$FLICKR_LINES"
    STAGE_OUTPUTS+=("$RAW/flickr.en")
}

stage_preprocess() {
    nmtkit preprocess --source-lang de --target-lang en --trainpref "$RAW/train" --validpref "$RAW/valid" \
        --testpref "$RAW/test" --destdir "$NEWS_BIN" --srcdict "$BASE_DATA" --tgtdict "$BASE_DATA" --force
    STAGE_OUTPUTS+=("$NEWS_BIN/manifest.json")
}

evaluate() {  # evaluate MODEL NAME: RESULTS/NAME.{news,flickr}.{hyp,bleu}
    local model=$1 name=$2 gen=(--beam "$BEAM" --lenpen "$LENPEN" --decoding "$DECODING" --max-len-a "$MAX_LEN_A"
                                 --max-len-b "$MAX_LEN_B" --device "$DEVICE")
    if [ "$DEVICE" != cuda ]; then gen+=(--threads "$THREADS"); fi
    mkdir -p "$RESULTS"
    nmtkit generate "$NEWS_BIN" --path "$model" --gen-subset test "${gen[@]}" --output "$RESULTS/$name.news.hyp"
    nmtkit score --sys "$RESULTS/$name.news.hyp" --ref "$RAW/test.en" > "$RESULTS/$name.news.bleu"
    # the first FLICKR_LINES of the quickstart's test set (all 1000 in the full run), as raw text
    # through the base model's data directory (the same translations as its binarized test split)
    nmtkit generate "$BASE_DATA" --path "$model" --input "$RAW/flickr.de" "${gen[@]}" --output "$RESULTS/$name.flickr.hyp"
    nmtkit score --sys "$RESULTS/$name.flickr.hyp" --ref "$RAW/flickr.en" > "$RESULTS/$name.flickr.bleu"
    STAGE_OUTPUTS+=("$RESULTS/$name.news.bleu" "$RESULTS/$name.flickr.bleu")
}

stage_before() {
    # the flickr source lines to translate (made here, not in `data`: they are no training input)
    _data_py slice "$FLICKR_SRC" "$RAW/flickr.de" 1 "$FLICKR_LINES"
    STAGE_OUTPUTS+=("$RAW/flickr.de")
    evaluate "$BASE_MODEL" before
}

stage_train() {
    device_flags=(--device "$DEVICE" --threads "$THREADS")
    check_run_settings "$CKPT_DIR" "data=$K_PREPROCESS" "base=$K_BASE" "LR=$LR" "WARMUP=$WARMUP" \
        "MAX_TOKENS=$MAX_TOKENS" "DROPOUT=$DROPOUT" "SEED=$SEED"
    nmtkit train "$NEWS_BIN" --finetune-from-model "$BASE_MODEL" --save-dir "$CKPT_DIR" --dropout "$DROPOUT" \
        --lr-scheduler inverse_sqrt --lr "$LR" --warmup-updates "$WARMUP" --max-tokens "$MAX_TOKENS" \
        --max-update "$MAX_UPDATE" --patience "$PATIENCE" --no-epoch-checkpoints --seed "$SEED" \
        --validate-interval-updates "$(s 10 0)" --log-interval "$(s 10 50)" \
        --tensorboard-logdir "$WORK/tensorboard" "${device_flags[@]}"
    show_valid_loss "$CKPT_DIR"
    STAGE_OUTPUTS+=("$FT_MODEL")
}

bleu_of() { sed -n 's/^BLEU = \([0-9.]*\) .*/\1/p' "$1"; }

show_table() {
    local r=$RESULTS
    echo "sacreBLEU before -> after fine-tuning on news ($NEWS_TRAIN_LINES newstest2013 pairs):"
    printf '  %-48s %6s -> %6s\n' "news (newstest2014, last $NEWS_TEST_LINES lines, held out)" \
        "$(bleu_of "$r/before.news.bleu")" "$(bleu_of "$r/after.news.bleu")"
    printf '  %-48s %6s -> %6s\n' "Multi30k test_2016_flickr ($FLICKR_LINES lines)" \
        "$(bleu_of "$r/before.flickr.bleu")" "$(bleu_of "$r/after.flickr.bleu")"
    cat "$r/after.news.bleu" "$r/after.flickr.bleu"
    if [ "$SMOKE" = 1 ]; then
        say "--smoke checks the pipeline, not the model: the quickstart's smoke model fine-tuned" \
            "$MAX_UPDATE updates scores near 0 BLEU; its news validation loss falls (above)"
    fi
}

stage_after() {
    evaluate "$FT_MODEL" after
    show_table
}

[[ $SMOKE =~ ^[01]$ ]] || die "SMOKE must be 0 or 1, got '$SMOKE'"
for v in WARMUP MAX_UPDATE MAX_TOKENS PATIENCE SEED BEAM THREADS NEWS_TRAIN_LINES NEWS_VALID_LINES NEWS_TEST_LINES FLICKR_LINES; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
stages_init "${STAGE:-}" "${LAST_STAGE:-}"
nmtkit_env || die "could not set up the Python environment (recipes/lib/env.sh)"
say "work dir $WORK$(s ' (--smoke)' ''); base model $BASE_MODEL"

K_BASE=$(key base "$BASE_MODEL" "$BASE_DATA" "$FLICKR_REF" "$SMOKE")
run_stage base "$K_BASE" stage_base
# the base model's content, once it exists: another model re-runs everything after `base`
if [ -f "$BASE_MODEL" ]; then K_BASE=$(key "$K_BASE" "$(sha256sum < "$BASE_MODEL" | cut -c1-64)"); fi
K_DATA=$(key data "$K_BASE" "$WMT14_DIR" "$NEWS_TRAIN_LINES" "$NEWS_VALID_LINES" "$NEWS_TEST_LINES" "$FLICKR_LINES")
K_PREPROCESS=$(key preprocess "$K_DATA")
K_BEFORE=$(key before "$K_PREPROCESS" "$BEAM" "$LENPEN" "$DECODING" "$FLICKR_SRC")
K_TRAIN=$(key train "$K_PREPROCESS" "$LR" "$WARMUP" "$MAX_UPDATE" "$MAX_TOKENS" "$DROPOUT" "$PATIENCE" "$SEED")
K_AFTER=$(key after "$K_TRAIN" "$K_BEFORE")
run_stage data "$K_DATA" stage_data
run_stage preprocess "$K_PREPROCESS" stage_preprocess
run_stage before "$K_BEFORE" stage_before
run_stage train "$K_TRAIN" stage_train
run_stage after "$K_AFTER" stage_after show_table
