#!/usr/bin/env bash
# One multilingual model for Multi30k's German, English, French and Czech, from raw text to a
# table of sacreBLEU and off-target rates per direction (docs/multilingual.md, "The recipe").
#
#   bash recipes/multilingual.sh [--smoke]    # or: SMOKE=1 bash recipes/multilingual.sh
#   MODE=english-centric bash recipes/multilingual.sh
#   MODE=english-centric-bt bash recipes/multilingual.sh  # then: zero-shot directions back-translated
#   MODE=pair PAIR=de-en bash recipes/multilingual.sh   # one direction's bilingual baseline
#   MODEL_SIZE=small bash recipes/multilingual.sh       # any mode with a model half as wide
#
# Modes (MODE):
#   all              (default) the 12 directions among de, en, fr, cs are trained and evaluated
#   english-centric  de-en, en-de, fr-en, en-fr, cs-en, en-cs are trained; the 6 directions
#                    without English (de<->fr, de<->cs, fr<->cs) are translated all the same and
#                    scored as zero-shot
#   english-centric-bt  after english-centric (same MODEL_SIZE; its run in EC_WORK): that model
#                    translates the English training text into de, fr and cs (stage backtranslate),
#                    and a new model trains on the English-centric pairs plus the 6 directions
#                    without English, each from those synthetic sources to real targets; no real
#                    de-fr, de-cs or fr-cs pair is used, and the 6 are scored as zero-shot
#   pair             one direction (PAIR=SRC-TGT, two of de en fr cs): the bilingual baseline of
#                    the same model and pipeline, the quickstart's 8000 pieces and 1600 updates
#                    (the twelve baselines together: 19,200 updates, beside all's 8000)
#   table            no training: the three kinds side by side, from the score.txt of the runs
#                    above (all, english-centric, the twelve pairs; in RUNS_ROOT, default runs/ of the
#                    checkout, a relative one taken from the checkout too,
#                    of the same MODEL_SIZE): BLEU per direction, the means, the updates and
#                    target tokens each was trained with, and the targets met or not; then the
#                    zero-shot rows of the English-centric run's LANG_VOCAB=1 translations and of
#                    english-centric-bt's run, where made (NO_RESIDUAL_LAYER=N: the runs with it)
# Model sizes (MODEL_SIZE), the same for every mode:
#   quickstart       (default) the quickstart's model: d_model 256, 3+3 layers, 4 heads, d_ff 1024
#   small            d_model 128 and d_ff 512 (3+3 layers, 4 heads), and half the pieces (4000 for
#                    a pair, 8000 for four languages): about a quarter of an update's arithmetic, so that
#                    the whole comparison (12 baselines, the 12-direction and the English-centric
#                    model) fits in a few hours of a 2-core CPU instead of a working day
# Stages (each skipped when its verified output exists, so a re-run continues where it stopped):
#   data        Multi30k task 1 raw text in the four languages: $NMTKIT_DATA if set, else
#               downloaded into a cache
#   backtranslate  (MODE=english-centric-bt only) the English training text translated into de,
#               fr and cs by EC_WORK's average of EC_AVG_N checkpoints (BT_BEAM, BT_LENPEN,
#               BT_DECODING; 29,000 sentences in 2-2.5 minutes per language on one thread at
#               MODEL_SIZE=small): raw/train.SRC-TGT.{SRC,TGT}.gz of the 6 directions without English
#   preprocess  one multilingual data directory for the trained pairs (nmtkit preprocess
#               --pairs): a joint sentencepiece model (VOCAB_SIZE pieces) and dictionary
#   train       the quickstart's model (d_model 256, 3+3 layers, 4 heads, d_ff 1024, shared
#               embeddings) and schedule, the pairs sampled at SAMPLING_TEMPERATURE, for
#               MAX_UPDATE = 8000 updates (the quickstart's 1600 took 20 minutes on 2 CPU cores;
#               a GPU is used when present and is much faster), validated per direction every
#               VALIDATE_INTERVAL updates, a checkpoint every SAVE_INTERVAL_UPDATES updates
#   average     the last AVG_N checkpoints averaged into one model
#   generate    test_2016_flickr (1000 sentences) translated in every evaluated direction, the
#               source language's lines as raw text with --target-lang: beam 4, length penalty
#               0.6, fairseq's decoding (DECODING); one nmtkit generate per target language
#   score       sacreBLEU per direction; one table on stdout: direction, BLEU, zero-shot or not,
#               off-target % (the share of non-empty outputs that langid, restricted to the four
#               languages, says are in another language than the target), then the means over
#               the supervised and the zero-shot directions, and the updates and target tokens
#               the model was trained with (from its training log)
#
# Options:
#   --smoke     CI-sized run of the same pipeline (on CPU, in a separate work directory; SMOKE=1
#               in the environment does the same): the first 2000 lines of every language,
#               1000 pieces, transformer_tiny, 300 updates at learning rate 5e-3 as the
#               quickstart's smoke run (validated at 150 and 300), the first 200 test lines,
#               fairseq's decoding (DECODING). It checks the pipeline, not the model: BLEU stays
#               near 1 (docs/multilingual.md, "The recipe").
# Environment (every setting below can be overridden, e.g. MAX_UPDATE=16000 for a longer run):
#   MODE          all (default), english-centric, english-centric-bt or pair (with PAIR=SRC-TGT)
#   EC_WORK       MODE=english-centric-bt: the English-centric run's work directory (default: its
#                 default, runs/multi30k_4way_english_centric with the suffixes of NMTKIT_WORK)
#   MODEL_SIZE    quickstart (default) or small
#   NMTKIT_DATA   folder holding {train,val,test_2016_flickr}.{de,en,fr,cs}.gz
#   NMTKIT_CACHE  where downloads go (default: ${XDG_CACHE_HOME:-~/.cache}/nmtkit/multi30k)
#   NMTKIT_MULTI30K_URL  download location (default: the GitHub multi30k/dataset task1/raw folder)
#   NMTKIT_WORK   work directory (default: ./runs/multi30k_4way_all, ..._english_centric,
#                 ..._english_centric_bt or ..._pair_de_en, then _small for MODEL_SIZE=small, _noresN
#                 for NO_RESIDUAL_LAYER=N and _smoke for --smoke)
#   STAGE=name    start from this stage (it and every later stage run); LAST_STAGE=name stops after it
#   VOCAB_SIZE, SAMPLING_TEMPERATURE, MAX_UPDATE, MAX_TIME, LR, WARMUP, MAX_TOKENS, DROPOUT,
#   VALIDATE_INTERVAL, SAVE_INTERVAL_UPDATES, AVG_N, BEAM, LENPEN, DECODING (paper|fairseq),
#   DEVICE (auto|cpu|cuda), THREADS, WORKERS, LANG_VOCAB (0|1), LANG_VOCAB_MIN_COUNT,
#   LANG_VOCAB_MIN_RATIO, NO_RESIDUAL_LAYER, EC_AVG_N, BT_BEAM, BT_LENPEN, BT_DECODING: see the
#   settings block
# The off-target column needs langid (the optional extra `langid`: pip install -e '.[langid]');
# the recipe installs it into its environment, and leaves the column out, saying so, when it cannot.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RECIPE_NAME=multilingual

# shellcheck disable=SC1091
. recipes/lib/options.sh
recipe_options "${BASH_SOURCE[0]}" "$@"   # --smoke (SMOKE=1 in the environment is the same), --help

# ---------------------------------------------------------------- settings -------------------
MODE=${MODE:-all}
PAIR=${PAIR:-}
MODEL_SIZE=${MODEL_SIZE:-quickstart}
case $MODEL_SIZE in
    quickstart) D_MODEL=256 D_FF=1024 SIZE_TAG="" PIECES_PER_LANG=4000 ;;
    small) D_MODEL=128 D_FF=512 SIZE_TAG=_small PIECES_PER_LANG=2000 ;;
    *) echo "[multilingual] error: MODEL_SIZE must be quickstart or small, got '$MODEL_SIZE'" >&2; exit 2 ;;
esac
LANGS="de en fr cs"
# NO_RESIDUAL_LAYER=N: encoder layer N's self-attention without its residual (Liu et al., 2021),
# against the zero-shot directions' off-target outputs; its runs get their own work directory
NO_RESIDUAL_LAYER=${NO_RESIDUAL_LAYER:-}
if ! [[ $NO_RESIDUAL_LAYER =~ ^([1-9][0-9]*)?$ ]]; then
    echo "[multilingual] error: NO_RESIDUAL_LAYER must be an encoder layer's number (1 = the first)," \
        "got '$NO_RESIDUAL_LAYER'" >&2
    exit 2
fi
WORK=${NMTKIT_WORK:-$ROOT/runs/multi30k_4way_${MODE//-/_}${PAIR:+_${PAIR//-/_}}$SIZE_TAG${NO_RESIDUAL_LAYER:+_nores$NO_RESIDUAL_LAYER}$(s _smoke "")}
SMOKE_TRAIN_LINES=2000              # --smoke: the first 2000 lines of every language
TEST_LINES=$(s 200 1000)            # test_2016_flickr lines translated (1000: all of it)
if [ "$MODE" = pair ]; then  # the quickstart's vocabulary and budget for one pair
    VOCAB_SIZE=${VOCAB_SIZE:-$(s 1000 $((2 * PIECES_PER_LANG)))}
    MAX_UPDATE=${MAX_UPDATE:-$(s 300 1600)}
    VALIDATE_INTERVAL=${VALIDATE_INTERVAL:-$(s 150 400)}
    SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(s 10 100)}  # the last 5: updates 1200-1600, as the quickstart's
fi
VOCAB_SIZE=${VOCAB_SIZE:-$(s 1000 $((4 * PIECES_PER_LANG)))}  # joint over four languages: the quickstart's 8000 for two
WORKERS=${WORKERS:-1}
# The quickstart's model and schedule (recipes/quickstart.sh): transformer_base with 3+3 layers,
# d_model 256, 4 heads, d_ff 1024, all embeddings shared; inverse_sqrt at 1e-3 after 400 warmup
# updates, 2048 tokens a batch. Twelve directions share it, so it trains five times as long
# (8000 updates, 2.7 epochs of the 12 x 29000 pairs); the directions' batches are mixed.
if [ "$SMOKE" = 1 ]; then
    ARCH_FLAGS=(--arch transformer_tiny)
else
    ARCH_FLAGS=(--arch transformer_base --encoder-layers 3 --decoder-layers 3 --d-model "$D_MODEL"
                --d-ff "$D_FF" --heads 4 --share-embeddings all --dropout "${DROPOUT:-0.1}")
fi
if [ -n "$NO_RESIDUAL_LAYER" ]; then ARCH_FLAGS+=(--encoder-no-residual-layer "$NO_RESIDUAL_LAYER"); fi
SAMPLING_TEMPERATURE=${SAMPLING_TEMPERATURE:-5}  # equal-sized pairs here: every T gives equal shares
LR=${LR:-$(s 5e-3 1e-3)}
WARMUP=${WARMUP:-$(s 50 400)}
MAX_TOKENS=${MAX_TOKENS:-$(s 1024 2048)}
MAX_UPDATE=${MAX_UPDATE:-$(s 300 8000)}
MAX_TIME=${MAX_TIME:-}                  # optional wall-clock cap, e.g. 2h (results then vary)
VALIDATE_INTERVAL=${VALIDATE_INTERVAL:-$(s 150 2000)}  # also at epoch ends; 0: there only
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(s 10 500)}
AVG_N=${AVG_N:-$(s 2 5)}
SEED=${SEED:-1}
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
# fairseq's rules (its length penalty, stopping once the beam has finished hypotheses): with the
# paper's (DECODING=paper, the quickstart's), these models' outputs stop early, a word or two when
# zero-shot (the English-centric small model's supervised en->X: 3-5 BLEU less, docs/multilingual.md,
# "The comparison, measured"),
# and one word gives langid nothing to judge
DECODING=${DECODING:-fairseq}
# LANG_VOCAB=1: every direction into a language decodes with that language's vocabulary as a
# shortlist (nmtkit shortlist --language: pieces seen LANG_VOCAB_MIN_COUNT times or more, and at
# least LANG_VOCAB_MIN_RATIO times as frequent as in any other target language), into
# results_langvocab/ and score_langvocab.txt beside the plain ones: against zero-shot off-target
LANG_VOCAB=${LANG_VOCAB:-0}
LANG_VOCAB_MIN_COUNT=${LANG_VOCAB_MIN_COUNT:-1}
LANG_VOCAB_MIN_RATIO=${LANG_VOCAB_MIN_RATIO:-0.2}
# MODE=english-centric-bt: the English-centric model's average of EC_AVG_N checkpoints translates
# with its own settings (the test sets' BEAM, LENPEN and DECODING can change without translating
# the training text again)
EC_AVG_N=${EC_AVG_N:-$(s 2 5)}
BT_BEAM=${BT_BEAM:-4}
BT_LENPEN=${BT_LENPEN:-0.6}
BT_DECODING=${BT_DECODING:-fairseq}
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
RESULTS=$WORK/results$([ "$LANG_VOCAB" != 1 ] || echo _langvocab)
SCORE_FILE=$WORK/score$([ "$LANG_VOCAB" != 1 ] || echo _langvocab).txt
STAMP_DIR=$WORK/stamps
STAGES=(data preprocess train average generate score)
if [ "$MODE" = english-centric-bt ]; then STAGES=(data backtranslate preprocess train average generate score); fi

case $MODE in
    all) TRAINED="de-en en-de de-fr fr-de de-cs cs-de en-fr fr-en en-cs cs-en fr-cs cs-fr"; ZERO_SHOT="" ;;
    english-centric) TRAINED="de-en en-de fr-en en-fr cs-en en-cs"; ZERO_SHOT="de-fr fr-de de-cs cs-de fr-cs cs-fr" ;;
    english-centric-bt)  # English-centric data, and the 6 others from the English-centric model
        TRAINED="de-en en-de fr-en en-fr cs-en en-cs"; ZERO_SHOT="de-fr fr-de de-cs cs-de fr-cs cs-fr" ;;
    pair)
        [[ $PAIR =~ ^(de|en|fr|cs)-(de|en|fr|cs)$ && ${PAIR%-*} != "${PAIR#*-}" ]] ||
            die "MODE=pair needs PAIR=SRC-TGT, two different languages of de en fr cs, got '$PAIR'"
        TRAINED=$PAIR ZERO_SHOT="" LANGS="${PAIR%-*} ${PAIR#*-}" ;;
    table) TRAINED="" ZERO_SHOT="" ;;
    *) die "MODE must be all, english-centric, english-centric-bt, pair or table, got '$MODE'" ;;
esac
[ "$MODE" = pair ] || [ -z "$PAIR" ] || die "PAIR=$PAIR needs MODE=pair (MODE is $MODE)"
if [ "$MODE" = table ]; then  # the comparison from the runs' score files; no stage runs
    python3 - "${RUNS_ROOT:-$ROOT/runs}" "$SIZE_TAG$(s _smoke "")" "$MODEL_SIZE" "$NO_RESIDUAL_LAYER" <<'EOF'
import re, sys
root, tag, size, nores = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
dirs = ["de-en", "en-de", "de-fr", "fr-de", "de-cs", "cs-de", "en-fr", "fr-en", "en-cs", "cs-en", "fr-cs", "cs-fr"]
# NO_RESIDUAL_LAYER=N: the English-centric model trained with it, beside the plain 12-direction and bilingual ones
ec_tag = f"{tag}_nores{nores}" if nores else tag
runs = {"all": f"{root}/multi30k_4way_all{tag}", "english-centric": f"{root}/multi30k_4way_english_centric{ec_tag}",
        **{d: f"{root}/multi30k_4way_pair_{d.replace('-', '_')}{tag}" for d in dirs}}

def read(path, want):  # a score.txt: {direction: (BLEU, zero-shot, off-target %)}, updates, target tokens
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    rows = {m[0]: (float(m[1]), m[2] == "yes", float(m[3]) if m[3] else None) for m in
            re.findall(r"^([a-z]{2}-[a-z]{2}) +(\d+\.\d\d)  (yes|no) *(?: +(\d+\.\d))?$", text, re.M)}
    upd = re.search(r"^trained with (\d+) updates, (\d+) target tokens", text, re.M)
    absent = [d for d in want if d not in rows]
    if absent or upd is None:
        print(f"[multilingual] error: {path}: " + (f"no row for {', '.join(absent)}" if absent else
              "no 'trained with N updates, T target tokens' line") + "; run its score stage again", file=sys.stderr)
        sys.exit(2)
    return rows, int(upd[1]), int(upd[2])


def share(a, b):  # a as a percentage of b, or n/a where b is 0
    return f"{a / b:.0%}" if b else "n/a"


scores, missing = {}, []
for name, work in runs.items():
    try:
        scores[name] = read(f"{work}/score.txt", dirs if name in ("all", "english-centric") else [name])
    except OSError:
        missing.append(f"{name} ({work}/score.txt)")
if missing:
    print(f"[multilingual] error: MODE=table needs every run's score.txt (MODEL_SIZE={size}); missing: "
          + ", ".join(missing), file=sys.stderr)
    sys.exit(2)
multi, ec = scores["all"][0], scores["english-centric"][0]
if nores:
    print(f"English-centric: encoder layer {nores}'s self-attention without its residual (NO_RESIDUAL_LAYER={nores})")
bi = {d: scores[d][0][d] for d in dirs}
# zero-shot and off-target: the English-centric model's; ZS/12-dir and ZS/bi: its zero-shot BLEU
# as a share of the 12-direction model's and of the bilingual model's on the same direction
print(f"{'direction':<10} {'12-dir':>7} {'bilingual':>9} {'En-centric':>10}  zero-shot  {'off-target %':>12}  "
      f"{'ZS/12-dir':>10}  {'ZS/bi':>6}")
for d in dirs:
    m, b, (e, zs, off) = multi[d][0], bi[d][0], ec[d]
    ratios = f"  {share(e, m):>10}  {share(e, b):>6}" if zs else ""
    print(f"{d:<10} {m:7.2f} {b:9.2f} {e:10.2f}  {'yes' if zs else 'no':<9}  "
          f"{off if off is not None else float('nan'):12.1f}{ratios}")
mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
m_mean, b_mean = mean([multi[d][0] for d in dirs]), mean([bi[d][0] for d in dirs])
print(f"{'mean':<10} {m_mean:7.2f} {b_mean:9.2f} {mean([ec[d][0] for d in dirs]):10.2f}")
pair_updates = sum(scores[d][1] for d in dirs)
print(f"updates: 12-direction {scores['all'][1]}, bilingual {pair_updates} (12 models, "
      f"{sum(scores[d][2] for d in dirs)} target tokens), English-centric {scores['english-centric'][1]}; "
      f"target tokens: 12-direction {scores['all'][2]}, English-centric {scores['english-centric'][2]}")
zs = [d for d in dirs if ec[d][1]]
verdict = lambda ok: "met" if ok else "not met"  # noqa: E731
print(f"target: 12-direction mean {m_mean:.2f} >= bilingual mean {b_mean:.2f} with at most their updates "
      f"({scores['all'][1]} <= {pair_updates}): {verdict(m_mean >= b_mean and scores['all'][1] <= pair_updates)}")
variants = [("", ec)]
# LANG_VOCAB=1's translations of the English-centric model, and the model trained with its
# back-translations (MODE=english-centric-bt), when made
for path, title, label in [
        (f"{runs['english-centric']}/score_langvocab.txt",
         "English-centric with each target language's vocabulary (LANG_VOCAB=1)",
         " (with each target language's vocabulary, LANG_VOCAB=1)"),
        (f"{root}/multi30k_4way_english_centric_bt{ec_tag}/score.txt",
         "English-centric data and back-translated sources (MODE=english-centric-bt)",
         " (back-translated sources, MODE=english-centric-bt)")]:
    try:
        v = read(path, dirs)[0]
    except OSError:
        continue
    variants.append((label, v))
    print(f"{title}, zero-shot directions:")
    for d in zs:
        print(f"{d:<10} BLEU {v[d][0]:6.2f}  off-target {v[d][2] if v[d][2] is not None else float('nan'):5.1f} %"
              f"  ZS/12-dir {share(v[d][0], multi[d][0]):>4}  ZS/bi {share(v[d][0], bi[d][0]):>4}")
for label, v in variants if zs else []:
    if all(v[d][2] is not None for d in zs):
        off = mean([v[d][2] for d in zs])
        print(f"target: zero-shot off-target at most 5%{label}: mean {off:.1f}%, worst "
              f"{max(v[d][2] for d in zs):.1f}%: {verdict(all(v[d][2] <= 5 for d in zs))}")
    low = min(zs, key=lambda d: v[d][0] / multi[d][0] if multi[d][0] else float("inf"))
    print(f"target: zero-shot BLEU at least 60% of the 12-direction model's on the same direction{label}: "
          f"lowest {share(v[low][0], multi[low][0])} ({low}): {verdict(v[low][0] >= 0.6 * multi[low][0])}")
EOF
    exit
fi
EVALUATED="$TRAINED $ZERO_SHOT"
PAIRS=$TRAINED  # the pairs of the data directory: with MODE=english-centric-bt the zero-shot ones too
if [ "$MODE" = english-centric-bt ]; then
    PAIRS="$TRAINED $ZERO_SHOT"
    # the English-centric run of the same size, whose averaged model writes the synthetic sources
    EC_WORK=${EC_WORK:-$ROOT/runs/multi30k_4way_english_centric$SIZE_TAG${NO_RESIDUAL_LAYER:+_nores$NO_RESIDUAL_LAYER}$(s _smoke "")}
    EC_CKPT=$EC_WORK/checkpoints/average_last$EC_AVG_N.pt
    for f in "$EC_CKPT" "$EC_WORK/data/manifest.json"; do
        [ -f "$f" ] || die "MODE=english-centric-bt translates with the English-centric model, but $f is missing" \
            "(run MODE=english-centric with the same MODEL_SIZE first, or set EC_WORK; EC_AVG_N=$EC_AVG_N)"
    done
fi

stage_data() {
    local f
    # shellcheck disable=SC2086
    multi30k_raw $LANGS
    # --smoke trains on the first SMOKE_TRAIN_LINES lines only (the same images in every
    # language); test.LANG.gz: the first TEST_LINES test lines, translated; val stays complete.
    mkdir -p "$WORK/raw"
    # shellcheck disable=SC2086
    python - "$RAW" "$WORK/raw" "$(s "$SMOKE_TRAIN_LINES" 0)" "$TEST_LINES" $LANGS <<'EOF'
import gzip, os, sys
src, dst, n_train, n_test, langs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
for split, name_in, n in (("train", "train", n_train), ("val", "val", 0),
                          ("test_2016_flickr", "test_2016_flickr", 0), ("test", "test_2016_flickr", n_test)):
    for lang in langs:
        with gzip.open(os.path.join(src, f"{name_in}.{lang}.gz"), "rb") as fh:
            lines = fh.readlines()
        if split == "test" and len(lines) < n:  # generate relies on N lines per direction
            sys.exit(f"[multilingual] error: {src}/{name_in}.{lang}.gz has {len(lines)} lines, not {n}")
        tmp = os.path.join(dst, f".{split}.{lang}.gz.tmp")
        with gzip.open(tmp, "wb") as fo:
            fo.writelines(lines[:n] if n else lines)
        os.replace(tmp, os.path.join(dst, f"{split}.{lang}.gz"))
EOF
    # shellcheck disable=SC2086
    for f in $(multi30k_files $LANGS); do STAGE_OUTPUTS+=("$WORK/raw/$f"); done
    for f in $LANGS; do STAGE_OUTPUTS+=("$WORK/raw/test.$f.gz"); done
}

stage_backtranslate() {  # MODE=english-centric-bt: raw/train.SRC-TGT.{SRC,TGT}.gz of the 6 zero-shot directions
    # Back-translation through English (Sennrich et al. 2016; the zero-shot directions as in Gu et
    # al. 2019): the English-centric model translates the English training text into each source
    # language; each zero-shot direction SRC-TGT pairs that synthetic SRC with the real TGT of the
    # same lines (Multi30k's languages are line-parallel: TGT's pair with English shares its English).
    local gen=() src dir
    if [ "$DEVICE" != cuda ]; then gen+=(--threads "$THREADS"); fi
    gzip -dc "$WORK/raw/train.en.gz" > "$WORK/raw/.bt.en"  # once, for every source language
    for src in $(for dir in $ZERO_SHOT; do echo "${dir%-*}"; done | sort -u); do
        nmtkit generate "$EC_WORK/data" --path "$EC_CKPT" --input "$WORK/raw/.bt.en" --target-lang "$src" \
            --beam "$BT_BEAM" --lenpen "$BT_LENPEN" --decoding "$BT_DECODING" --max-len-a "$MAX_LEN_A" \
            --max-len-b "$MAX_LEN_B" --device "$DEVICE" --output "$WORK/raw/.bt.$src" "${gen[@]}"
        for dir in $ZERO_SHOT; do
            [ "${dir%-*}" = "$src" ] || continue
            gzip -c "$WORK/raw/.bt.$src" > "$WORK/raw/.train.$dir.$src.gz"
            mv -f "$WORK/raw/.train.$dir.$src.gz" "$WORK/raw/train.$dir.$src.gz"
            cp -f "$WORK/raw/train.${dir#*-}.gz" "$WORK/raw/.train.$dir.${dir#*-}.gz"
            mv -f "$WORK/raw/.train.$dir.${dir#*-}.gz" "$WORK/raw/train.$dir.${dir#*-}.gz"
            STAGE_OUTPUTS+=("$WORK/raw/train.$dir.$src.gz" "$WORK/raw/train.$dir.${dir#*-}.gz")
        done
        rm -f "$WORK/raw/.bt.$src"
    done
    rm -f "$WORK/raw/.bt.en"
}

stage_preprocess() {
    local dir f
    if [ "$MODE" = english-centric-bt ]; then  # never the real pairs: preprocess would fall back on them
        for dir in $ZERO_SHOT; do
            for f in "$WORK/raw/train.$dir.${dir%-*}.gz" "$WORK/raw/train.$dir.${dir#*-}.gz"; do
                [ -f "$f" ] || die "$f is missing: run the backtranslate stage (STAGE=backtranslate)"
            done
        done
    fi
    nmtkit preprocess --pairs "$(echo "$PAIRS" | tr ' ' ,)" \
        --trainpref "$WORK/raw/train" --validpref "$WORK/raw/val" --testpref "$WORK/raw/test_2016_flickr" \
        --destdir "$DATA_BIN" --vocab-size "$VOCAB_SIZE" --workers "$WORKERS" --force
    STAGE_OUTPUTS+=("$DATA_BIN/manifest.json")
}

stage_train() {
    local cap=()
    if [ -n "$MAX_TIME" ]; then cap=(--max-time "$MAX_TIME"); fi
    check_run_settings "$CKPT_DIR" "data=$K_PREPROCESS" "arch=${ARCH_FLAGS[*]}" "LR=$LR" \
        "WARMUP=$WARMUP" "MAX_TOKENS=$MAX_TOKENS" "SAMPLING_TEMPERATURE=$SAMPLING_TEMPERATURE" "SEED=$SEED"
    nmtkit train "$DATA_BIN" "${ARCH_FLAGS[@]}" --save-dir "$CKPT_DIR" \
        --sampling-temperature "$SAMPLING_TEMPERATURE" \
        --lr-scheduler inverse_sqrt --lr "$LR" --warmup-updates "$WARMUP" \
        --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" "${cap[@]}" \
        --validate-interval-updates "$VALIDATE_INTERVAL" \
        --save-interval-updates "$SAVE_INTERVAL_UPDATES" --keep-last-updates "$AVG_N" \
        --no-epoch-checkpoints --seed "$SEED" --log-interval 50 --device "$DEVICE" --threads "$THREADS"
    show_valid_loss "$CKPT_DIR"
    STAGE_OUTPUTS+=("$CKPT_DIR/checkpoint_last.pt")
}

stage_generate() {  # RESULTS/SRC-TGT.hyp for every evaluated direction, from the raw source text
    # One `nmtkit generate` per target language (its start-up, not the search, is most of a
    # small run's time): the test sources of the directions into it, one file after the other.
    local gen=() tgt dirs dir i
    if [ "$DEVICE" != cuda ]; then gen+=(--threads "$THREADS"); fi  # CPU threads
    mkdir -p "$RESULTS"
    for tgt in $LANGS; do
        dirs=$(for dir in $EVALUATED; do [ "${dir#*-}" != "$tgt" ] || echo "$dir"; done)
        [ -n "$dirs" ] || continue
        for dir in $dirs; do gzip -dc "$WORK/raw/test.${dir%-*}.gz"; done > "$RESULTS/into_$tgt.src"
        local vocab=()
        if [ "$LANG_VOCAB" = 1 ]; then
            nmtkit shortlist "$DATA_BIN" --language "$tgt" --min-count "$LANG_VOCAB_MIN_COUNT" \
                --min-ratio "$LANG_VOCAB_MIN_RATIO" \
                --output "$RESULTS/shortlist.$tgt.txt" >&2  # its summary line: the recipe's stdout is the table
            vocab=(--shortlist "$RESULTS/shortlist.$tgt.txt")
        fi
        nmtkit generate "$DATA_BIN" --path "$AVG_CKPT" --input "$RESULTS/into_$tgt.src" --target-lang "$tgt" \
            --beam "$BEAM" --lenpen "$LENPEN" --decoding "$DECODING" --max-len-a "$MAX_LEN_A" \
            --max-len-b "$MAX_LEN_B" --device "$DEVICE" --output "$RESULTS/into_$tgt.hyp" "${gen[@]}" "${vocab[@]}"
        i=0
        for dir in $dirs; do  # the test sets are line-parallel: TEST_LINES lines per direction
            sed -n "$((i * TEST_LINES + 1)),$(((i + 1) * TEST_LINES))p" "$RESULTS/into_$tgt.hyp" > "$RESULTS/$dir.hyp"
            STAGE_OUTPUTS+=("$RESULTS/$dir.hyp")
            i=$((i + 1))
        done
        rm -f "$RESULTS/into_$tgt.src" "$RESULTS/into_$tgt.hyp"
    done
}

show_score() {
    cat "$SCORE_FILE"
    if [ "$SMOKE" = 1 ]; then
        say "--smoke checks the pipeline, not the model: transformer_tiny after $MAX_UPDATE updates on" \
            "$SMOKE_TRAIN_LINES lines per language scores near 1 BLEU"
    fi
}

score_table() {  # the table on stdout: BLEU from the score lines, off-target % by langid
    python - "$RESULTS" "$TRAINED" "$ZERO_SHOT" <<'EOF'
import re, sys
results, trained, zero = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
try:
    import langid
    langid.set_languages(["cs", "de", "en", "fr"])  # Multi30k's four, whichever the model knows
except ImportError:
    langid = None
    print("[multilingual] the off-target column is left out: langid is missing "
          "(pip install -e '.[langid]')", file=sys.stderr)

def off_target(d):  # % of the non-empty outputs identified as another language than the target
    with open(f"{results}/{d}.hyp", encoding="utf-8") as fh:
        hyps = [h for h in fh.read().split("\n") if h.strip()]
    return 100.0 * sum(langid.classify(h)[0] != d.split("-")[1] for h in hyps) / max(len(hyps), 1)

rows = []
for d in trained + zero:
    with open(f"{results}/{d}.bleu", encoding="utf-8") as fh:
        bleu = float(re.match(r"BLEU = (\d+\.\d+) ", fh.read()).group(1))
    rows.append((d, bleu, d in zero, off_target(d) if langid else None))
print(f"{'direction':<10} {'BLEU':>6}  zero-shot" + ("  off-target %" if langid else ""))
for d, bleu, z, off in rows:
    print(f"{d:<10} {bleu:6.2f}  {'yes' if z else 'no':<9}" + (f"  {off:12.1f}" if langid else ""))
for name, z in (("supervised", False), ("zero-shot", True)):
    sel = [r for r in rows if r[2] == z]
    if sel:
        off = f", off-target {sum(r[3] for r in sel) / len(sel):.1f} %" if langid else ""
        print(f"mean over the {len(sel)} {name} directions: BLEU {sum(r[1] for r in sel) / len(sel):.2f}{off}")
EOF
}

trained_with() {  # trained_with LOG: the updates and target tokens of the run's train records
    python - "$1" <<'EOF'
import json, sys
train = []  # the records of the run that made the checkpoints (a resumed run drops the rest)
with open(sys.argv[1], encoding="utf-8") as fh:
    for rec in map(json.loads, fh):
        if rec["type"] == "start" and rec.get("resumed"):
            train = [t for t in train if t["update"] <= rec["update"]]
        elif rec["type"] == "train":
            train.append(rec)
covered, tokens = sum(t["updates"] for t in train), sum(t["tgt_tokens"] for t in train)
last = train[-1]["update"] if train else 0
print(f"trained with {last} updates, {tokens} target tokens" +
      (f" (tokens counted over the {covered} updates the log covers)" if covered != last else ""))
EOF
}

stage_score() {
    local dir
    for dir in $EVALUATED; do
        nmtkit score --sys "$RESULTS/$dir.hyp" --ref "$WORK/raw/test.${dir#*-}.gz" --metric bleu > "$RESULTS/$dir.bleu"
        STAGE_OUTPUTS+=("$RESULTS/$dir.bleu")
    done
    { score_table; trained_with "$CKPT_DIR/train_log.jsonl"; } > "$SCORE_FILE.tmp"
    mv -f "$SCORE_FILE.tmp" "$SCORE_FILE"
    show_score
    STAGE_OUTPUTS+=("$SCORE_FILE")
}

[[ $SMOKE =~ ^[01]$ ]] || die "SMOKE must be 0 or 1, got '$SMOKE'"
[[ $LANG_VOCAB =~ ^[01]$ ]] || die "LANG_VOCAB must be 0 or 1, got '$LANG_VOCAB'"
[[ $LANG_VOCAB_MIN_COUNT =~ ^[1-9][0-9]*$ ]] || die "LANG_VOCAB_MIN_COUNT must be a positive integer, got '$LANG_VOCAB_MIN_COUNT'"
[[ $LANG_VOCAB_MIN_RATIO =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "LANG_VOCAB_MIN_RATIO must be a number >= 0, got '$LANG_VOCAB_MIN_RATIO'"
for v in VOCAB_SIZE WORKERS WARMUP MAX_TOKENS MAX_UPDATE VALIDATE_INTERVAL SAVE_INTERVAL_UPDATES AVG_N SEED BEAM THREADS \
         EC_AVG_N BT_BEAM; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer, got '${!v}'"
done
[[ $DECODING =~ ^(paper|fairseq)$ ]] || die "DECODING must be paper or fairseq, got '$DECODING'"
[[ $BT_DECODING =~ ^(paper|fairseq)$ ]] || die "BT_DECODING must be paper or fairseq, got '$BT_DECODING'"
[[ $BT_LENPEN =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "BT_LENPEN must be a number >= 0, got '$BT_LENPEN'"
if [ -n "$NO_RESIDUAL_LAYER" ] && [ "$NO_RESIDUAL_LAYER" -gt "$(s 2 3)" ]; then
    die "NO_RESIDUAL_LAYER=$NO_RESIDUAL_LAYER: the model has $(s 2 3) encoder layers$(s ' (--smoke: transformer_tiny)' '')"
fi
[ "$SAVE_INTERVAL_UPDATES" -gt 0 ] || die "SAVE_INTERVAL_UPDATES must be > 0: the average stage needs update checkpoints"
if [ $((MAX_UPDATE / SAVE_INTERVAL_UPDATES)) -lt "$AVG_N" ]; then
    die "AVG_N=$AVG_N checkpoints to average need MAX_UPDATE / SAVE_INTERVAL_UPDATES >= $AVG_N" \
        "($MAX_UPDATE / $SAVE_INTERVAL_UPDATES saves $((MAX_UPDATE / SAVE_INTERVAL_UPDATES)))"
fi
stages_init "${STAGE:-}" "${LAST_STAGE:-}"
nmtkit_env || die "could not set up the Python environment (recipes/lib/env.sh)"
ACTIVATED=$NMTKIT_ENV_ACTIVATED
if ! python -c 'import langid' 2>/dev/null; then  # the off-target column's language identifier
    nmtkit_env langid || say "could not install the extra langid: the off-target column will be left out"
fi
say "work dir $WORK$(s ' (--smoke)' ''); MODE=$MODE: trains $TRAINED${ZERO_SHOT:+; zero-shot $ZERO_SHOT}$(
    [ "$MODE" != english-centric-bt ] || echo " (trained on sources back-translated by $EC_CKPT)")"

K_DATA=$(key data "${NMTKIT_DATA:-download}" "$MULTI30K_URL" "$SMOKE" "$SMOKE_TRAIN_LINES" "$TEST_LINES" "$LANGS")
K_BACKTRANSLATE=$K_DATA
if [ "$MODE" = english-centric-bt ]; then
    K_BACKTRANSLATE=$(key backtranslate "$K_DATA" "$(sha256sum < "$EC_CKPT")" "$BT_BEAM" "$BT_LENPEN" "$BT_DECODING")
fi
K_PREPROCESS=$(key preprocess "$K_BACKTRANSLATE" "$PAIRS" "$VOCAB_SIZE")
K_TRAIN=$(key train "$K_PREPROCESS" "${ARCH_FLAGS[@]}" "$SAMPLING_TEMPERATURE" "$LR" "$WARMUP" "$MAX_TOKENS" \
    "$MAX_UPDATE" "$MAX_TIME" "$VALIDATE_INTERVAL" "$SAVE_INTERVAL_UPDATES" "$SEED")
K_AVERAGE=$(key average "$K_TRAIN" "$AVG_N")
K_GENERATE=$(key generate "$K_AVERAGE" "$EVALUATED" "$BEAM" "$LENPEN" "$DECODING" "$LANG_VOCAB" "$LANG_VOCAB_MIN_COUNT" "$LANG_VOCAB_MIN_RATIO")
HAVE_LANGID=$(python -c 'import langid' 2>/dev/null && echo yes || echo no)
K_SCORE=$(key score "$K_GENERATE" "$HAVE_LANGID")  # langid installed later: the column is added

run_stage data "$K_DATA" stage_data
if [ "$MODE" = english-centric-bt ]; then run_stage backtranslate "$K_BACKTRANSLATE" stage_backtranslate; fi
run_stage preprocess "$K_PREPROCESS" stage_preprocess
run_stage train "$K_TRAIN" stage_train
run_stage average "$K_AVERAGE" stage_average
run_stage generate "$K_GENERATE" stage_generate
run_stage score "$K_SCORE" stage_score show_score
if [ -n "$ACTIVATED" ]; then
    say "nmtkit is installed in $ACTIVATED; to run it yourself: source $ACTIVATED/bin/activate"
fi
