#!/usr/bin/env bash
# The README's main command: Multi30k German->English with nmtkit, from raw text onwards.
#
#   bash recipes/quickstart.sh [--smoke]
#
# Stages (one function each, run in order):
#   env         use the active virtual environment or create ./.venv; install nmtkit
#   data        Multi30k task 1 raw text: $NMTKIT_DATA if set, else downloaded into a cache
#   preprocess  sentencepiece (8000 pieces, joint De+En), joined dictionary, binarized shards;
#               rerunning finds the verified output up to date and does nothing
#   (training, checkpoint averaging, generation and scoring are not available yet)
#
# Options:
#   --smoke     CI-sized run: the first 2000 training pairs (full valid/test), 1000 pieces,
#               written to a separate work directory.
# Environment:
#   NMTKIT_DATA   folder holding train.{de,en}.gz, val.{de,en}.gz, test_2016_flickr.{de,en}.gz
#   NMTKIT_CACHE  where downloads go (default: ${XDG_CACHE_HOME:-~/.cache}/nmtkit/multi30k)
#   NMTKIT_MULTI30K_URL  download location (default: the GitHub multi30k/dataset task1/raw folder)
#   NMTKIT_WORK   work directory (default: ./work/multi30k_de_en, or ./work/multi30k_de_en_smoke)
#   WORKERS       preprocessing worker processes (default: 1; the output does not depend on it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MULTI30K_URL=${NMTKIT_MULTI30K_URL:-https://github.com/multi30k/dataset/raw/master/data/task1/raw}
MULTI30K_FILES="train.de.gz train.en.gz val.de.gz val.en.gz test_2016_flickr.de.gz test_2016_flickr.en.gz"
SMOKE=0
for arg in "$@"; do
    case $arg in
        --smoke) SMOKE=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "quickstart: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$SMOKE" = 1 ]; then
    WORK=${NMTKIT_WORK:-$(pwd)/work/multi30k_de_en_smoke}
    VOCAB=1000
else
    WORK=${NMTKIT_WORK:-$(pwd)/work/multi30k_de_en}
    VOCAB=8000
fi
DATA_BIN=$WORK/data   # the preprocessed data directory (later stages train from it)

say() { echo "[quickstart] $*" >&2; }

stage_env() {
    # shellcheck disable=SC1091
    . recipes/lib/env.sh
    nmtkit_env
}

stage_data() {
    if [ -n "${NMTKIT_DATA:-}" ]; then
        RAW=$NMTKIT_DATA
        for f in $MULTI30K_FILES; do
            [ -f "$RAW/$f" ] || { echo "quickstart: NMTKIT_DATA=$RAW has no $f" >&2; exit 2; }
        done
        say "data: using $RAW"
        return
    fi
    RAW=${NMTKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nmtkit/multi30k}
    mkdir -p "$RAW"
    for f in $MULTI30K_FILES; do
        [ -s "$RAW/$f" ] && continue
        say "data: downloading $MULTI30K_URL/$f"
        python - "$MULTI30K_URL/$f" "$RAW/$f" <<'EOF'
import gzip, os, sys, urllib.request
url, dest = sys.argv[1], sys.argv[2]
tmp = dest + ".part"
try:
    with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as fh:
        fh.write(r.read())
    with gzip.open(tmp) as g:  # a truncated or HTML download fails here, not later
        while g.read(1 << 20):
            pass
except Exception as e:
    if os.path.exists(tmp):
        os.unlink(tmp)
    sys.exit(f"quickstart: cannot download {url}: {e}\n"
             "  (offline?) Put the six Multi30k files in a folder and set NMTKIT_DATA to it.")
os.replace(tmp, dest)
EOF
    done
    say "data: $RAW"
}

stage_smoke_slice() {
    # --smoke trains on the first 2000 pairs only; valid and test stay complete.
    TRAIN_PREF=$RAW/train
    [ "$SMOKE" = 1 ] || return 0
    mkdir -p "$WORK/raw"
    TRAIN_PREF=$WORK/raw/train
    python - "$RAW" "$WORK/raw" <<'EOF'
import gzip, os, sys
src, dst = sys.argv[1], sys.argv[2]
for lang in ("de", "en"):
    with gzip.open(os.path.join(src, f"train.{lang}.gz"), "rb") as fh:
        lines = [fh.readline() for _ in range(2000)]
    tmp = os.path.join(dst, f".train.{lang}.tmp")
    with open(tmp, "wb") as fo:
        fo.writelines(lines)
    os.replace(tmp, os.path.join(dst, f"train.{lang}"))
EOF
}

stage_preprocess() {
    say "preprocess: $DATA_BIN"
    nmtkit preprocess --source-lang de --target-lang en \
        --trainpref "$TRAIN_PREF" --validpref "$RAW/val" --testpref "$RAW/test_2016_flickr" \
        --destdir "$DATA_BIN" --bpe sentencepiece --vocab-size "$VOCAB" --joined-dictionary \
        --workers "${WORKERS:-1}"
}

stage_not_yet() {
    say "preprocessed data is in $DATA_BIN"
    say "training, checkpoint averaging, generation and scoring are not available in nmtkit yet;"
    say "the quickstart stops after preprocessing."
}

stage_env
stage_data
stage_smoke_slice
stage_preprocess
stage_not_yet
