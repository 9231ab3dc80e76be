#!/usr/bin/env bash
# Sequence-level knowledge distillation (Kim and Rush 2016): a small, fast student learns from
# the translations of a teacher, then is averaged, quantized to int8 and scored beside it.
#
#   bash recipes/distill.sh [--smoke]         # or: SMOKE=1 bash recipes/distill.sh
#
# Stages (each skipped when its verified output exists, so a re-run continues where it stopped):
#   teacher     the teacher: $TEACHER if it exists (a checkpoint, several joined by ':' for an
#               ensemble, or an export directory; used as it is, read only), else the quickstart's
#               averaged model (recipes/quickstart.sh is run up to its average stage)
#   distill     the teacher translates the training source with beam search (BEAM_DISTILL)
#   data        the student's training text: the source with the teacher's translations, and with
#               MIX_ORIGINAL=1 the original pairs as well (both, one after the other)
#   preprocess  nmtkit preprocess --srcdict/--tgtdict: the teacher's own sentencepiece model and
#               dictionaries (the student reads and writes the same pieces)
#   train       the student (STUDENT_ARCH, default transformer_student_6_1_small: 6+1 layers,
#               d_model 128, pre-norm, the shape measured against the quickstart's model) on the
#               distilled text, validated on the real validation pairs
#   average     the student's last AVG_N checkpoints averaged
#   shortlist   a lexical shortlist from the distilled pairs (nmtkit shortlist), for both models
#               (they share the teacher's pieces)
#   evaluate    teacher and student, fp32, int8 (--quantize int8 on CPU) and int8 with the shortlist,
#               on test_2016_flickr: sacreBLEU and sentences/s at batch 1 and at batch 128, one table
#               on stdout (an export teacher: without the shortlist rows); then the command of
#               recipes/bench/deploy.sh that adds every engine, peak RSS and size on disk
#
# Options:
#   --smoke     CI-sized run of the same pipeline: the quickstart's --smoke model as teacher, its
#               2000 training sentences, transformer_tiny as the student for 300 updates, 50 test
#               lines, on CPU. It checks the pipeline, not the models: both score near 1 BLEU.
# Environment (each setting below can be overridden):
#   QUICKSTART_WORK  the quickstart's work directory (default ./runs/multi30k_de_en[_smoke])
#   TEACHER, TEACHER_DATA  the teacher and its data directory (TEACHER_DATA: not needed for an
#                    export directory); default: the quickstart's average_lastN.pt and data
#   RAW_DIR          train/val/test_2016_flickr .de.gz/.en.gz (default: the quickstart's raw/)
#   NMTKIT_WORK      this recipe's work directory (default ./runs/distill_de_en[_smoke])
#   STAGE=name / LAST_STAGE=name  start from / stop after a stage
#   EXTRA_TRAIN_ARGS more `nmtkit train` flags for the student, e.g. another width for a registry
#                    shape: STUDENT_ARCH=transformer_student_6_1 EXTRA_TRAIN_ARGS="--d-model 256 --d-ff 1024
#                    --heads 4" (the quickstart's widths with 6+1 layers)
#   DECODING         paper or fairseq (default): the length penalty and stopping rule of the
#                    teacher's translations and of the evaluation
#   STUDENT_ARCH, MIX_ORIGINAL, BEAM_DISTILL, LR, WARMUP, MAX_UPDATE, MAX_TOKENS, SAVE_INTERVAL_UPDATES,
#   AVG_N, SEED, BEAM, LENPEN, DEVICE, THREADS, TEST_LINES
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RECIPE_NAME=distill

# shellcheck disable=SC1091
. recipes/lib/options.sh
recipe_options "${BASH_SOURCE[0]}" "$@"   # --smoke (SMOKE=1 in the environment is the same), --help

# ---------------------------------------------------------------- settings -------------------
WORK=${NMTKIT_WORK:-$ROOT/runs/distill_de_en$(s _smoke "")}
QUICKSTART_WORK=${QUICKSTART_WORK:-$ROOT/runs/multi30k_de_en$(s _smoke "")}
QS_AVG_N=$(s 2 5)   # the quickstart's number of averaged checkpoints (its AVG_N default)
TEACHER=${TEACHER:-$QUICKSTART_WORK/checkpoints/average_last$QS_AVG_N.pt}
TEACHER_DATA=${TEACHER_DATA:-$QUICKSTART_WORK/data}
RAW_DIR=${RAW_DIR:-$QUICKSTART_WORK/raw}
STUDENT_ARCH=${STUDENT_ARCH:-$(s transformer_tiny transformer_student_6_1_small)}
EXTRA_TRAIN_ARGS=${EXTRA_TRAIN_ARGS:-}
MIX_ORIGINAL=${MIX_ORIGINAL:-0}
BEAM_DISTILL=${BEAM_DISTILL:-4}
# The length penalty and stopping rule of every translation here (the teacher's of the training
# source, and the evaluation's): fairseq's by default. With the paper's (DECODING=paper, the
# quickstart's) the quickstart's model stops early (brevity penalty 0.87 on test_2016_flickr),
# and a student trained on those translations learns to stop earlier still (docs/archs.md,
# "Students of the quickstart's model, measured").
DECODING=${DECODING:-fairseq}
# The student: a larger learning rate than the paper's for a small model on small data, with
# fairseq's inverse_sqrt schedule (as the quickstart); dropout and label smoothing are the student
# shape's own (none for transformer_student_tiny, as in Bergamot's recipe; 0.1 for the others).
# 6400 updates: the default student, half the quickstart model's width, came within 1.0 BLEU of
# it there (34.4 at 3200); about 30 minutes of training on 2 CPU cores (docs/archs.md).
LR=${LR:-$(s 5e-3 1e-3)}
WARMUP=${WARMUP:-$(s 50 400)}
MAX_TOKENS=${MAX_TOKENS:-$(s 1024 2048)}
MAX_UPDATE=${MAX_UPDATE:-$(s 300 6400)}
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(s 10 100)}
AVG_N=${AVG_N:-$(s 2 5)}
SEED=${SEED:-1}
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
MAX_LEN_A=1 MAX_LEN_B=50
TEST_LINES=${TEST_LINES:-$(s 50 1000)}
DEVICE=${DEVICE:-$(s cpu auto)}
THREADS=${THREADS:-$(s 1 "$(nproc)")}
# ---------------------------------------------------------------------------------------------

# shellcheck disable=SC1091
. recipes/lib/stages.sh
# shellcheck disable=SC1091
. recipes/lib/env.sh

RAW=$WORK/raw
DATA_BIN=$WORK/data
CKPT_DIR=$WORK/checkpoints
AVG_CKPT=$CKPT_DIR/average_last$AVG_N.pt
SHORTLIST=$WORK/shortlist.txt
RESULTS=$WORK/results
STAMP_DIR=$WORK/stamps
STAGES=(teacher distill data preprocess train average shortlist evaluate)

_is_export() { [ -f "$1/nmtkit.json" ]; }

_teacher_flags() {  # TEACHER_FLAGS: the DATA_DIR argument (none for an export) and --path
    TEACHER_FLAGS=()
    if ! _is_export "$TEACHER"; then TEACHER_FLAGS+=("$TEACHER_DATA"); fi
    TEACHER_FLAGS+=(--path "$TEACHER")
}

stage_teacher() {
    local first=${TEACHER%%:*}
    if [ -e "$first" ]; then
        say "teacher: using $TEACHER"
    else
        say "teacher: $TEACHER not found: running recipes/quickstart.sh$(s ' --smoke' '') in $QUICKSTART_WORK"
        env -u STAGE LAST_STAGE=average SMOKE="$SMOKE" NMTKIT_WORK="$QUICKSTART_WORK" bash recipes/quickstart.sh
        [ -f "$TEACHER" ] || die "the quickstart did not write $TEACHER"
    fi
    _is_export "$first" || [ -f "$TEACHER_DATA/manifest.json" ] \
        || die "TEACHER_DATA=$TEACHER_DATA is not a data directory (no manifest.json)"
    local f
    for f in train.de.gz train.en.gz val.de.gz val.en.gz test_2016_flickr.de.gz test_2016_flickr.en.gz; do
        [ -f "$RAW_DIR/$f" ] || die "RAW_DIR=$RAW_DIR has no $f"
    done
    mkdir -p "$RAW"
    # the test lines scored, and the teacher's dictionaries for the student (an export's copies)
    python recipes/lib/wmt14_data.py slice "$RAW_DIR/test_2016_flickr.de.gz" "$RAW/test.de" 1 "$TEST_LINES"
    python recipes/lib/wmt14_data.py slice "$RAW_DIR/test_2016_flickr.en.gz" "$RAW/test.en" 1 "$TEST_LINES"
    STAGE_OUTPUTS+=("$RAW/test.de" "$RAW/test.en")
}

gen_flags() {  # GEN: the search flags of every translation here
    GEN=(--beam "$1" --lenpen "$LENPEN" --decoding "$DECODING" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B"
         --device "$DEVICE")
    if [ "$DEVICE" != cuda ]; then GEN+=(--threads "$THREADS"); fi
}

stage_distill() {
    _teacher_flags
    gen_flags "$BEAM_DISTILL"
    mkdir -p "$RAW"
    nmtkit generate "${TEACHER_FLAGS[@]}" --input "$RAW_DIR/train.de.gz" "${GEN[@]}" --output "$RAW/distilled.en"
    STAGE_OUTPUTS+=("$RAW/distilled.en")
}

stage_data() {
    # the student's pairs: every source line with its teacher translation (an empty translation
    # keeps its line; preprocess drops such pairs in its cleaning and counts them)
    python - "$RAW_DIR" "$RAW" "$MIX_ORIGINAL" <<'PY'
import gzip, os, sys
src_dir, out, mix = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
read = lambda p: gzip.open(p, "rt", encoding="utf-8").read().splitlines()
src, orig = read(os.path.join(src_dir, "train.de.gz")), read(os.path.join(src_dir, "train.en.gz"))
with open(os.path.join(out, "distilled.en"), encoding="utf-8") as fh:
    dist = fh.read().splitlines()
if len(dist) != len(src):
    sys.exit(f"[distill] error: {len(dist)} teacher translations for {len(src)} source lines")
pairs = list(zip(src, dist)) + (list(zip(src, orig)) if mix else [])
for lang, k in (("de", 0), ("en", 1)):
    tmp = os.path.join(out, f".train.{lang}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(p[k] + "\n" for p in pairs)
    os.replace(tmp, os.path.join(out, f"train.{lang}"))
print(f"[distill] data: {len(pairs)} training pairs ({len(src)} distilled"
      + (f", {len(src)} original)" if mix else ")"), file=sys.stderr)
PY
    STAGE_OUTPUTS+=("$RAW/train.de" "$RAW/train.en")
}

stage_preprocess() {
    local dicts=$TEACHER_DATA
    if _is_export "${TEACHER%%:*}"; then dicts=${TEACHER%%:*}; fi
    nmtkit preprocess --source-lang de --target-lang en --trainpref "$RAW/train" --validpref "$RAW_DIR/val" \
        --testpref "$RAW/test" --destdir "$DATA_BIN" --srcdict "$dicts" --tgtdict "$dicts" --force
    STAGE_OUTPUTS+=("$DATA_BIN/manifest.json")
}

stage_train() {
    check_run_settings "$CKPT_DIR" "data=$K_PREPROCESS" "arch=$STUDENT_ARCH" "LR=$LR" "WARMUP=$WARMUP" \
        "MAX_TOKENS=$MAX_TOKENS" "SEED=$SEED" ${EXTRA_TRAIN_ARGS:+"EXTRA_TRAIN_ARGS=$EXTRA_TRAIN_ARGS"}
    local extra=()
    if [ -n "$EXTRA_TRAIN_ARGS" ]; then read -r -a extra <<< "$EXTRA_TRAIN_ARGS"; fi
    nmtkit train "$DATA_BIN" --arch "$STUDENT_ARCH" "${extra[@]}" --save-dir "$CKPT_DIR" \
        --lr-scheduler inverse_sqrt --lr "$LR" --warmup-updates "$WARMUP" --max-tokens "$MAX_TOKENS" \
        --max-update "$MAX_UPDATE" --save-interval-updates "$SAVE_INTERVAL_UPDATES" \
        --keep-last-updates "$AVG_N" --no-epoch-checkpoints --seed "$SEED" --log-interval 50 \
        --device "$DEVICE" --threads "$THREADS"
    show_valid_loss "$CKPT_DIR"
    STAGE_OUTPUTS+=("$CKPT_DIR/checkpoint_last.pt")
}

stage_shortlist() {
    nmtkit shortlist "$DATA_BIN" --output "$SHORTLIST"
    STAGE_OUTPUTS+=("$SHORTLIST")
}

evaluate() {  # evaluate NAME QUANTIZE BATCH DATA_OR_EMPTY --path MODEL [--shortlist FILE]: RESULTS/NAME.{hyp,bleu,speed}
    local name=$1 quantize=$2 batch=$3
    shift 3
    gen_flags "$BEAM"
    local q=()
    if [ "$quantize" != none ] && [ "$DEVICE" = cpu ]; then q=(--quantize "$quantize"); fi
    nmtkit generate "$@" --input "$RAW/test.de" "${GEN[@]}" "${q[@]}" --batch-size "$batch" \
        --output "$RESULTS/$name.hyp" 2> "$RESULTS/$name.log"
    sed -n 's/.*search only [0-9.]*s: \([0-9,.]*\) sentences\/s.*/\1/p' "$RESULTS/$name.log" | tr -d , \
        > "$RESULTS/$name.speed"
    nmtkit score --sys "$RESULTS/$name.hyp" --ref "$RAW/test.en" > "$RESULTS/$name.bleu"
    STAGE_OUTPUTS+=("$RESULTS/$name.bleu" "$RESULTS/$name.speed")
}

bleu_of() { sed -n 's/^BLEU = \([0-9.]*\) .*/\1/p' "$1"; }

show_table() {
    local r=$RESULTS who q
    echo "test_2016_flickr ($TEST_LINES lines), beam $BEAM: sacreBLEU, sentences/s of the search at batch 1 and 128" \
        "(int8+sl: int8 with the lexical shortlist $SHORTLIST)"
    local student="student ($STUDENT_ARCH)" w label
    w=$(( ${#student} > 8 ? ${#student} : 8 ))  # the model column as wide as its longest name
    printf "  %-${w}s %-8s %7s %10s %10s\n" model weights BLEU "batch 1" "batch 128"
    for who in teacher student; do
        for q in fp32 int8 int8+sl; do
            [ -f "$r/$who.$q.b128.bleu" ] || continue
            label=$who; [ "$who" = student ] && label=$student
            printf "  %-${w}s %-8s %7s %10s %10s\n" "$label" "$q" \
                "$(bleu_of "$r/$who.$q.b128.bleu")" "$(cat "$r/$who.$q.b1.speed")" "$(cat "$r/$who.$q.b128.speed")"
        done
    done
    if [ "$SMOKE" = 1 ]; then
        say "--smoke checks the pipeline, not the models: the smoke teacher and a $MAX_UPDATE-update" \
            "student both score near 1 BLEU"
    fi
    if [ -f "$TEACHER" ]; then  # one checkpoint (not an ensemble or an export): it can be exported
        say "every engine (CTranslate2, ONNX Runtime), peak RSS and size on disk:" \
            "$(printf '%q ' NMTKIT_DATA="$RAW_DIR" SHORTLIST="$SHORTLIST" LIMIT="$TEST_LINES" BEAM="$BEAM" \
                LENPEN="$LENPEN" bash \
                "$ROOT/recipes/bench/deploy.sh" --model teacher "$TEACHER" "$TEACHER_DATA" \
                --model student "$AVG_CKPT" "$DATA_BIN")"
    fi
}

stage_evaluate() {
    mkdir -p "$RESULTS"
    _teacher_flags
    local q b tq
    for q in fp32 int8; do
        for b in 1 128; do
            tq=$([ $q = int8 ] && echo int8 || echo none)
            # an export's weights were chosen when it was made (nmtkit export --quantization)
            if _is_export "${TEACHER%%:*}"; then tq=none; fi
            evaluate "teacher.$q.b$b" "$tq" "$b" "${TEACHER_FLAGS[@]}"
            evaluate "student.$q.b$b" "$([ $q = int8 ] && echo int8 || echo none)" "$b" "$DATA_BIN" --path "$AVG_CKPT"
        done
    done
    for b in 1 128; do
        if ! _is_export "${TEACHER%%:*}"; then
            evaluate "teacher.int8+sl.b$b" int8 "$b" "${TEACHER_FLAGS[@]}" --shortlist "$SHORTLIST"
        fi
        evaluate "student.int8+sl.b$b" int8 "$b" "$DATA_BIN" --path "$AVG_CKPT" --shortlist "$SHORTLIST"
    done
    show_table
}

[[ $SMOKE =~ ^[01]$ ]] || die "SMOKE must be 0 or 1, got '$SMOKE'"
[[ $MIX_ORIGINAL =~ ^[01]$ ]] || die "MIX_ORIGINAL must be 0 or 1, got '$MIX_ORIGINAL'"
[[ $DECODING =~ ^(paper|fairseq)$ ]] || die "DECODING must be paper or fairseq, got '$DECODING'"
for v in BEAM_DISTILL WARMUP MAX_TOKENS MAX_UPDATE SAVE_INTERVAL_UPDATES AVG_N SEED BEAM THREADS TEST_LINES; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
stages_init "${STAGE:-}" "${LAST_STAGE:-}"
nmtkit_env || die "could not set up the Python environment (recipes/lib/env.sh)"
say "work dir $WORK$(s ' (--smoke)' ''); teacher $TEACHER; student $STUDENT_ARCH${EXTRA_TRAIN_ARGS:+ $EXTRA_TRAIN_ARGS}"

K_TEACHER=$(key teacher "$TEACHER" "$TEACHER_DATA" "$RAW_DIR" "$SMOKE" "$TEST_LINES")
run_stage teacher "$K_TEACHER" stage_teacher
# the teacher's content, once it exists: another teacher re-runs everything after `teacher`
if [ -f "$TEACHER" ]; then K_TEACHER=$(key "$K_TEACHER" "$(sha256sum < "$TEACHER" | cut -c1-64)"); fi
K_DISTILL=$(key distill "$K_TEACHER" "$BEAM_DISTILL" "$LENPEN" "$DECODING")
K_DATA=$(key data "$K_DISTILL" "$MIX_ORIGINAL")
K_PREPROCESS=$(key preprocess "$K_DATA")
K_TRAIN=$(key train "$K_PREPROCESS" "$STUDENT_ARCH" ${EXTRA_TRAIN_ARGS:+"$EXTRA_TRAIN_ARGS"} "$LR" "$WARMUP" "$MAX_TOKENS" "$MAX_UPDATE" \
    "$SAVE_INTERVAL_UPDATES" "$SEED")
K_AVERAGE=$(key average "$K_TRAIN" "$AVG_N")
K_SHORTLIST=$(key shortlist "$K_PREPROCESS")
K_EVALUATE=$(key evaluate "$K_AVERAGE" "$K_SHORTLIST" "$BEAM" "$LENPEN" "$DECODING")
run_stage distill "$K_DISTILL" stage_distill
run_stage data "$K_DATA" stage_data
run_stage preprocess "$K_PREPROCESS" stage_preprocess
run_stage train "$K_TRAIN" stage_train
run_stage average "$K_AVERAGE" stage_average
run_stage shortlist "$K_SHORTLIST" stage_shortlist
run_stage evaluate "$K_EVALUATE" stage_evaluate show_table
