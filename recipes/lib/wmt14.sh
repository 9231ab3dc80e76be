# Stage functions shared by recipes/wmt14_en_de/run.sh and recipes/wmt14_en_fr/run.sh.
#
# The run.sh scripts hold every setting (see their top); this file only turns settings into
# commands:
#   download    fetch the statmt.org archives into DOWNLOAD_DIR, verify their md5 (SMOKE: check the
#               $NMTKIT_SHARED/data/wmt14 files instead, docs/testing.md "The real data"; nothing is downloaded)
#   prepare     extract the corpora, concatenate them into RAW_DIR/train.{SRC,TGT} (pairs with
#               invalid UTF-8 dropped, non-printing characters -> spaces, as Moses'
#               remove-non-printing-char.perl), newstest2013 -> valid, newstest2014 (full, 3003
#               lines) -> test, both from the SGM files exactly as sacreBLEU extracts them
#               (SMOKE: slices of the shared newstest files)
#   preprocess  nmtkit preprocess: joint sentencepiece BPE on the raw text, joined dictionary,
#               cleaning (--max-len, --ratio on subword tokens, as fairseq's prepare scripts)
#   train       nmtkit train (through torchrun when more than one device or node)
#   average     nmtkit average-checkpoints: the last AVG_N timed checkpoints
#   generate    nmtkit generate: newstest2014 with beam BEAM, lenpen LENPEN, max len a*input+b
#   score       nmtkit score: tok-bleu (the paper's metric) and sacreBLEU, next to the paper
# Each stage is skipped when its verified output exists (recipes/lib/stages.sh); STAGE=name starts
# from one stage, LAST_STAGE=name stops after one.

_wmt14_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091
. "$_wmt14_lib/stages.sh"
# shellcheck disable=SC1091
. "$_wmt14_lib/env.sh"

STAGES=(download prepare preprocess train average generate score)

_int() {  # _int NAME: the variable NAME must hold an integer >= 0
    [[ ${!1} =~ ^[0-9]+$ ]] || die "$1 must be a non-negative integer, got '${!1}'"
}

_pos() {  # _pos NAME: the variable NAME must hold an integer >= 1
    [[ ${!1} =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '${!1}'"
}

wmt14_setup() {
    # Devices, batch arithmetic and paths derived from the settings; then the stage keys.
    # Settings are checked first, so that a mistake costs no time.
    case $MODEL in base|big) ;; *) die "model must be base or big, got '$MODEL'" ;; esac
    for v in NODE_RANK MAX_UPDATE MAX_LEN SAVE_INTERVAL_UPDATES SEED; do _int "$v"; done
    for v in NNODES TOKENS_PER_UPDATE MAX_TOKENS_PER_DEVICE AVG_N BEAM VOCAB_SIZE WORKERS THREADS; do _pos "$v"; done
    [ "$NODE_RANK" -lt "$NNODES" ] || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
    [ "$NNODES" = 1 ] || [ -n "$MASTER_ADDR" ] || die "NNODES=$NNODES needs MASTER_ADDR (node 0's address)"
    case $DEVICE in auto|cpu|cuda) ;; *) die "DEVICE must be auto, cpu or cuda, got '$DEVICE'" ;; esac
    stages_init "${STAGE:-}" "${LAST_STAGE:-}"
    nmtkit_env || die "could not set up the Python environment (recipes/lib/env.sh)"

    # Devices: the GPUs this process may see (CUDA_VISIBLE_DEVICES is honoured), unless DEVICE=cpu.
    if [ -z "${NGPUS:-}" ]; then
        if [ "$DEVICE" = cpu ]; then
            NGPUS=0
        else
            NGPUS=$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
        fi
    fi
    _int NGPUS
    if [ "$NGPUS" -gt 0 ] && [ "$DEVICE" = auto ]; then DEVICE=cuda; fi
    if [ "$NGPUS" = 0 ]; then
        [ "$DEVICE" != cuda ] || die "DEVICE=cuda but no CUDA device is visible (torch.cuda.device_count() = 0)"
        DEVICE=cpu
    fi
    NPROC_PER_NODE=${NPROC_PER_NODE:-$((NGPUS > 0 ? NGPUS : 1))}
    _pos NPROC_PER_NODE
    WORLD=$((NNODES * NPROC_PER_NODE))
    if [ -z "${PRECISION:-}" ]; then
        if [ "$DEVICE" = cuda ]; then
            PRECISION=$(python -c 'import torch; print("bf16" if torch.cuda.is_bf16_supported() else "fp16")')
        else
            PRECISION=fp32
        fi
    fi

    # ~TOKENS_PER_UPDATE source and target tokens per update = MAX_TOKENS x WORLD x UPDATE_FREQ.
    if [ -z "${MAX_TOKENS:-}" ]; then
        MAX_TOKENS=$(( (TOKENS_PER_UPDATE + WORLD - 1) / WORLD ))
        [ "$MAX_TOKENS" -le "$MAX_TOKENS_PER_DEVICE" ] || MAX_TOKENS=$MAX_TOKENS_PER_DEVICE
    fi
    _pos MAX_TOKENS
    UPDATE_FREQ=${UPDATE_FREQ:-$(( (TOKENS_PER_UPDATE + MAX_TOKENS * WORLD - 1) / (MAX_TOKENS * WORLD) ))}
    _pos UPDATE_FREQ

    RAW_DIR=$WORK/raw
    DATA_BIN=$WORK/data
    CKPT_DIR=${CKPT_DIR:-$WORK/checkpoints/$MODEL}
    AVG_CKPT=$CKPT_DIR/average_last$AVG_N.pt
    RESULTS=$WORK/results/$MODEL
    HYP=$RESULTS/newstest2014.hyp.$TGT
    SCORE_FILE=$RESULTS/newstest2014.score.txt
    STAMP_DIR=$WORK/stamps

    # Stage keys: each one hashes the stage's settings and the previous stage's key.
    K_DOWNLOAD=$(key download "$SMOKE" "${DOWNLOADS[@]}" "$SHARED_WMT14")
    K_PREPARE=$(key prepare "$K_DOWNLOAD" "$SRC" "$TGT" "${TRAIN_CORPORA[@]}" "${DEV_SGM[@]}" \
        "${TEST_SGM[@]}" "$SMOKE_TRAIN_LINES" "$SMOKE_VALID_LINES" "$SMOKE_TEST_LINES" \
        "$(sha256sum < "$_wmt14_lib/wmt14_data.py")")
    K_PREPROCESS=$(key preprocess "$K_PREPARE" "$VOCAB_SIZE" "$SPM_MAX_LINES" "$MAX_LEN" "$RATIO")
    K_TRAIN=$(key train "$K_PREPROCESS" "$ARCH" "$TOKENS_PER_UPDATE" "$MAX_TOKENS" "$UPDATE_FREQ" \
        "$WORLD" "$MAX_UPDATE" "$WARMUP" "$LR_SCALE" "$SAVE_INTERVAL_MINUTES" \
        "$SAVE_INTERVAL_UPDATES" "$PRECISION" "$SEED" "$EXTRA_TRAIN_ARGS")
    K_AVERAGE=$(key average "$K_TRAIN" "$AVG_N")
    K_GENERATE=$(key generate "$K_AVERAGE" "$BEAM" "$LENPEN" "$MAX_LEN_A" "$MAX_LEN_B")
    K_SCORE=$(key score "$K_GENERATE" "$COMPOUND_SPLIT" "$PAPER_BLEU")
}

wmt14_summary() {
    local smoke=""
    if [ "$SMOKE" = 1 ]; then smoke=" (SMOKE=1: a CPU-sized run on slices of the shared test sets)"; fi
    say "$PAIR_NAME $MODEL$smoke: work dir $WORK"
    say "  arch $ARCH, $MAX_UPDATE updates, warmup $WARMUP, average of the last $AVG_N checkpoints"
    say "  devices: $NNODES node(s) x $NPROC_PER_NODE process(es) on $DEVICE ($PRECISION);" \
        "update = --max-tokens $MAX_TOKENS x $WORLD x --update-freq $UPDATE_FREQ" \
        "= $((MAX_TOKENS * WORLD * UPDATE_FREQ)) tokens per side (padding included)"
}

# --- download -----------------------------------------------------------------------------------

_md5() { if command -v md5sum > /dev/null; then md5sum "$1" | cut -d' ' -f1; else md5 -q "$1"; fi; }

_fetch() {  # _fetch URL DEST: resumable download to DEST.part, renamed when complete
    local url=$1 dest=$2
    if command -v curl > /dev/null; then
        curl -fL --retry 5 --retry-delay 10 -C - -o "$dest.part" "$url"
    elif command -v wget > /dev/null; then
        wget -c -O "$dest.part" "$url"
    else
        die "neither curl nor wget is installed; download $url into $(dirname "$dest") yourself"
    fi
    mv -f "$dest.part" "$dest"
}

stage_download() {
    if [ "$SMOKE" = 1 ]; then
        # SMOKE stands the shared newstest files in for the corpora: nothing is downloaded.
        local f
        for f in "${SMOKE_FILES[@]}"; do
            [ -f "$SHARED_WMT14/$f" ] || die "SMOKE=1 needs $SHARED_WMT14/$f (set NMTKIT_SHARED to a folder laid out as docs/testing.md, 'The real data', describes)"
            STAGE_OUTPUTS+=("$SHARED_WMT14/$f")
        done
        return 0
    fi
    mkdir -p "$DOWNLOAD_DIR"
    local entry url md5 dest got
    for entry in "${DOWNLOADS[@]}"; do
        read -r url md5 <<< "$entry"
        dest=$DOWNLOAD_DIR/$(basename "$url")
        if [ -f "$dest" ]; then
            say "download: verifying $dest"
            got=$(_md5 "$dest")
            if [ "$got" != "$md5" ]; then
                say "download: $dest has md5 $got, expected $md5: downloading it again"
                mv -f "$dest" "$dest.bad"
            fi
        fi
        if [ ! -f "$dest" ]; then
            say "download: $url"
            _fetch "$url" "$dest" || die "download of $url failed (rerun to resume)"
            got=$(_md5 "$dest")
            if [ "$got" != "$md5" ]; then
                mv -f "$dest" "$dest.bad"
                die "$url: md5 $got, expected $md5 (kept as $dest.bad; rerun to download again)"
            fi
        fi
        rm -f "$dest.bad"
        STAGE_OUTPUTS+=("$dest")
    done
}

# --- prepare ------------------------------------------------------------------------------------

_data_py() { python "$_wmt14_lib/wmt14_data.py" "$@"; }

_extract() {  # _extract ARCHIVE MEMBER...: into $WORK/extract (only the members needed)
    local archive=$DOWNLOAD_DIR/$1
    shift
    mkdir -p "$WORK/extract"
    say "prepare: extracting $* from $(basename "$archive")"
    _data_py extract "$archive" "$WORK/extract" "$@"
}

_check_lines() {  # _check_lines FILE EXPECTED
    local n
    n=$(_data_py lines "$1")
    [ "$n" = "$2" ] || die "$1 has $n lines, expected $2"
}

stage_prepare() {
    mkdir -p "$RAW_DIR"
    local l side
    if [ "$SMOKE" = 1 ]; then
        # train: the first SMOKE_TRAIN_LINES of newstest2014; test: its last SMOKE_TEST_LINES
        # (disjoint from train); valid: the first SMOKE_VALID_LINES of newstest2013.
        local test_first=$((3003 - SMOKE_TEST_LINES + 1))
        [ "$SMOKE_TRAIN_LINES" -lt "$test_first" ] || die "SMOKE_TRAIN_LINES + SMOKE_TEST_LINES must be <= 3003"
        for l in "$SRC" "$TGT"; do
            _data_py slice "$SHARED_WMT14/$SMOKE_TEST_PREFIX.$l.gz" "$RAW_DIR/train.$l" 1 "$SMOKE_TRAIN_LINES"
            _data_py slice "$SHARED_WMT14/newstest2013.$l.gz" "$RAW_DIR/valid.$l" 1 "$SMOKE_VALID_LINES"
            _data_py slice "$SHARED_WMT14/$SMOKE_TEST_PREFIX.$l.gz" "$RAW_DIR/test.$l" "$test_first" "$SMOKE_TEST_LINES"
        done
    else
        local entry archive msrc mtgt pairs=()
        rm -rf "$WORK/extract"
        for entry in "${TRAIN_CORPORA[@]}"; do
            read -r archive msrc mtgt <<< "$entry"
            _extract "$archive" "$msrc" "$mtgt"
            pairs+=("$WORK/extract/$msrc:$WORK/extract/$mtgt")
        done
        say "prepare: concatenating ${#pairs[@]} corpora into $RAW_DIR/train.{$SRC,$TGT}"
        _data_py corpus "$RAW_DIR/train" "$SRC" "$TGT" "${pairs[@]}"
        for side in valid test; do
            if [ $side = valid ]; then entry=${DEV_SGM[*]}; else entry=${TEST_SGM[*]}; fi
            read -r archive msrc mtgt <<< "$entry"
            _extract "$archive" "$msrc" "$mtgt"
            _data_py sgm "$WORK/extract/$msrc" "$RAW_DIR/$side.$SRC"
            _data_py sgm "$WORK/extract/$mtgt" "$RAW_DIR/$side.$TGT"
        done
        for l in "$SRC" "$TGT"; do
            _check_lines "$RAW_DIR/valid.$l" 3000   # newstest2013
            _check_lines "$RAW_DIR/test.$l" 3003    # newstest2014, the full set
        done
        rm -rf "$WORK/extract"   # re-creatable from the archives; saves several GB
    fi
    for side in train valid test; do
        STAGE_OUTPUTS+=("$RAW_DIR/$side.$SRC" "$RAW_DIR/$side.$TGT")
    done
}

# --- preprocess ---------------------------------------------------------------------------------

stage_preprocess() {
    # --force: this directory belongs to the recipe; an identical dataset is found up to date and
    # kept, a different one (settings changed) is replaced only once the new one is complete.
    nmtkit preprocess --source-lang "$SRC" --target-lang "$TGT" \
        --trainpref "$RAW_DIR/train" --validpref "$RAW_DIR/valid" --testpref "$RAW_DIR/test" \
        --destdir "$DATA_BIN" --bpe sentencepiece --vocab-size "$VOCAB_SIZE" --joined-dictionary \
        --spm-max-lines "$SPM_MAX_LINES" --max-len "$MAX_LEN" --min-len 1 --ratio "$RATIO" \
        --workers "$WORKERS" --force
    STAGE_OUTPUTS+=("$DATA_BIN/manifest.json")
}

# --- train --------------------------------------------------------------------------------------

train_command() {  # the nmtkit train command line (as an array in TRAIN_CMD)
    local args=(
        "$DATA_BIN" --arch "$ARCH" --save-dir "$CKPT_DIR"
        --lr-scheduler noam --lr-scale "$LR_SCALE" --warmup-updates "$WARMUP"
        --adam-betas 0.9,0.98 --adam-eps 1e-9
        --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE"
        --save-interval-minutes "$SAVE_INTERVAL_MINUTES" --save-interval-updates "$SAVE_INTERVAL_UPDATES"
        --keep-last-updates "$KEEP_LAST" --no-epoch-checkpoints
        --device "$DEVICE" --precision "$PRECISION" --seed "$SEED" --log-interval "$LOG_INTERVAL"
    )
    if [ "$DEVICE" = cpu ]; then args+=(--threads "$THREADS"); fi
    # shellcheck disable=SC2206
    if [ -n "$EXTRA_TRAIN_ARGS" ]; then args+=($EXTRA_TRAIN_ARGS); fi
    if [ "$WORLD" -gt 1 ]; then
        TRAIN_CMD=(python -m torch.distributed.run --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE")
        if [ "$NNODES" -eq 1 ]; then
            TRAIN_CMD+=(--standalone)
        else
            TRAIN_CMD+=(--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT")
        fi
        TRAIN_CMD+=(-m nmtkit train "${args[@]}")
    else
        TRAIN_CMD=(nmtkit train "${args[@]}")
    fi
}

stage_train() {
    train_command
    check_run_settings "$CKPT_DIR" "data=$K_PREPROCESS" "ARCH=$ARCH" "LR_SCALE=$LR_SCALE" \
        "WARMUP=$WARMUP" "TOKENS_PER_UPDATE=$TOKENS_PER_UPDATE" "SEED=$SEED" \
        "PRECISION=$PRECISION" "EXTRA_TRAIN_ARGS=$EXTRA_TRAIN_ARGS"
    say "train: ${TRAIN_CMD[*]}"
    # Interrupted? Run the recipe again: training resumes from checkpoint_last.pt.
    "${TRAIN_CMD[@]}"
    STAGE_OUTPUTS+=("$CKPT_DIR/checkpoint_last.pt")
}

# --- score (average and generate: recipes/lib/stages.sh) -------------------------------------

show_score() { cat "$SCORE_FILE"; }

stage_score() {
    local split=()
    if [ "$COMPOUND_SPLIT" = 1 ]; then split=(--compound-split); fi
    local tmp=$SCORE_FILE.tmp.$$ n
    n=$(_data_py lines "$RAW_DIR/test.$TGT")
    {
        echo "$PAIR_NAME $MODEL, newstest2014 ($n lines), average of the last $AVG_N checkpoints, beam $BEAM, lenpen $LENPEN:"
        # tok-bleu is the paper's metric (Moses-tokenized multi-bleu.perl BLEU; compound
        # splitting for En-De as tensor2tensor's get_ende_bleu.sh); sacreBLEU is the modern one.
        nmtkit score --sys "$HYP" --ref "$RAW_DIR/test.$TGT" --metric tok-bleu,bleu --lang "$TGT" "${split[@]}" \
            | sed -e "s/^tok-BLEU.*/& | paper: $PAPER_BLEU (${PAPER_TABLE})/" \
                  -e "s/^BLEU.*/& | paper: not reported (sacreBLEU postdates it)/"
    } > "$tmp"
    [ "$(grep -c '^tok-BLEU = \|^BLEU = ' "$tmp")" = 2 ] || { rm -f "$tmp"; die "scoring failed"; }
    mv -f "$tmp" "$SCORE_FILE"
    show_score
    STAGE_OUTPUTS+=("$SCORE_FILE")
}

# --- the pipeline -------------------------------------------------------------------------------

wmt14_main() {
    wmt14_setup
    wmt14_summary
    if [ "$NODE_RANK" -gt 0 ]; then
        # Other nodes only train; node 0 prepares the data (WORK must be on a shared file system)
        # and runs the stages after training.
        local waited=0
        until stamp_ok "$STAMP_DIR/preprocess.stamp" "$K_PREPROCESS"; do
            [ $waited = 1 ] || say "node $NODE_RANK: waiting for node 0 to finish preprocessing into $DATA_BIN"
            waited=1
            sleep 60
        done
        stage_train
        say "node $NODE_RANK: training finished; node 0 averages, translates and scores"
        return 0
    fi
    run_stage download "$K_DOWNLOAD" stage_download
    run_stage prepare "$K_PREPARE" stage_prepare
    run_stage preprocess "$K_PREPROCESS" stage_preprocess
    run_stage train "$K_TRAIN" stage_train
    run_stage average "$K_AVERAGE" stage_average
    run_stage generate "$K_GENERATE" stage_generate
    run_stage score "$K_SCORE" stage_score show_score
}
