#!/usr/bin/env bash
# What the language tags cost (docs/multilingual.md, "Speed"): the same model, with the same
# vocabulary size, trained and decoding on three data directories, in turn, ROUNDS times, so that
# a shared machine's drift falls on all alike:
#   bilingual     de-en, `nmtkit preprocess -s de -t en` (no tags)
#   tagged        de-en alone through `nmtkit preprocess --pairs de-en`: the same sentences with a
#                 target tag on every source, and the multilingual code path (sampler, manifest)
#   multilingual  the 12 directions among Multi30k's de, en, fr, cs (their batches mixed)
#
#   bash recipes/bench/multilingual.sh
#
# Training: MAX_UPDATE updates from scratch per run. Two figures: target tokens per second of
# wall time after the first LOG_INTERVAL updates (the train log's), and target tokens per CPU
# second of the whole process (its user + system time; steadier on a busy machine). Decoding: the
# first TEST_LINES lines of test_2016_flickr.de with each model (--target-lang en but for the
# bilingual one), beam 4, every output exactly OUT_LEN tokens long (--min-len = --max-len-b,
# --max-len-a 0), so that the searches do the same work but for the tag: sentences per second of
# the search (generate's summary line) and per CPU second of the whole process. Each round
# trains the three models, then they decode in turn GEN_RUNS times, each pass starting one model
# later (each round's row: the medians of its runs), so that decoding's smaller differences stand
# out of a machine's drift.
# The 12-direction set is another mix of sentence lengths (its targets are in four languages, its
# sources segmented by a 4-language vocabulary), so its ratio holds more than the tags' cost; the
# tagged one differs from the bilingual one by the tags and the code path only.
# Prints one row per round and kind, then the medians and the ratios to bilingual.
#
# Environment (defaults):
#   NMTKIT_DATA   folder with {train,val,test_2016_flickr}.{de,en,fr,cs}.gz  (default: downloaded from
#                 the multi30k/dataset repository once, as recipes/multilingual.sh does)
#   BENCH_DIR     work folder                            ($HOME/.cache/nmtkit-bench/multilingual)
#   ROUNDS=3 GEN_RUNS=1 MAX_UPDATE=100 LOG_INTERVAL=25 THREADS=1 VOCAB_SIZE=8000 TEST_LINES=1000 OUT_LEN=20
#   D_MODEL=256 D_FF=1024 (the quickstart's model, 3+3 layers, 4 heads; 128 and 512: MODEL_SIZE=small's)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
. recipes/lib/env.sh
nmtkit_env

BENCH_DIR=${BENCH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nmtkit-bench/multilingual}
ROUNDS=${ROUNDS:-3} MAX_UPDATE=${MAX_UPDATE:-100} LOG_INTERVAL=${LOG_INTERVAL:-25} THREADS=${THREADS:-1} GEN_RUNS=${GEN_RUNS:-1}
VOCAB_SIZE=${VOCAB_SIZE:-8000} TEST_LINES=${TEST_LINES:-1000} OUT_LEN=${OUT_LEN:-20}
D_MODEL=${D_MODEL:-256} D_FF=${D_FF:-1024}
for v in ROUNDS GEN_RUNS MAX_UPDATE LOG_INTERVAL THREADS VOCAB_SIZE TEST_LINES OUT_LEN D_MODEL D_FF; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "$v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[ "$MAX_UPDATE" -gt "$LOG_INTERVAL" ] || { echo "MAX_UPDATE must be above LOG_INTERVAL (the first interval is left out)" >&2; exit 2; }
RECIPE_NAME=bench
# shellcheck disable=SC1091
. recipes/lib/stages.sh
# shellcheck disable=SC1091
. recipes/lib/multi30k.sh
multi30k_raw de en fr cs  # RAW: NMTKIT_DATA checked, or the files downloaded once
DATA=$RAW
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
# the data directories depend on the data and the vocabulary size: one folder per pair of them
BENCH_DIR=$BENCH_DIR/v${VOCAB_SIZE}_$(printf '%s' "$(cd "$DATA" && pwd)" | sha256sum | cut -c1-8)
mkdir -p "$BENCH_DIR"
KINDS=(bilingual tagged multilingual)

prep() {  # prep NAME FLAGS...: a data directory, once per data and vocabulary size (its manifest marks it done)
    local dest=$BENCH_DIR/$1; shift
    [ -f "$dest/manifest.json" ] && return
    echo "[prep] $dest (log: $dest.prep.log)"
    python -m nmtkit preprocess "$@" --trainpref "$DATA/train" --validpref "$DATA/val" \
        --destdir "$dest" --vocab-size "$VOCAB_SIZE" --workers 1 --force > "$dest.prep.log" 2>&1 \
        || { echo "[prep] failed; see $dest.prep.log" >&2; tail -n 20 "$dest.prep.log" >&2; exit 1; }
}
prep bilingual -s de -t en --bpe sentencepiece --joined-dictionary
prep tagged --pairs de-en
prep multilingual --pairs de-en,en-de,de-fr,fr-de,de-cs,cs-de,en-fr,fr-en,en-cs,cs-en,fr-cs,cs-fr
gzip -dc "$DATA/test_2016_flickr.de.gz" | sed -n "1,${TEST_LINES}p" > "$BENCH_DIR/test.de"  # sed reads to the end: no SIGPIPE

cpu() {  # cpu FILE CMD...: run CMD, its user + system CPU seconds into FILE
    local out=$1; shift
    python - "$out" "$@" <<'PY'
import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
open(sys.argv[1], "w").write(f"{usage.ru_utime + usage.ru_stime:.3f}\n")
sys.exit(os.waitstatus_to_exitcode(status))
PY
}

ARCH=(--arch transformer_base --encoder-layers 3 --decoder-layers 3 --d-model "$D_MODEL" --d-ff "$D_FF"
      --heads 4 --share-embeddings all --dropout 0.1)
OPT=(--lr-scheduler inverse_sqrt --lr 1e-3 --warmup-updates 400 --max-tokens 2048 --seed 1 --device cpu
     --threads "$THREADS" --no-progress-bar --no-validate --no-epoch-checkpoints --log-interval "$LOG_INTERVAL"
     --max-update "$MAX_UPDATE")
GEN=(--input "$BENCH_DIR/test.de" --beam 4 --max-len-a 0 --max-len-b "$OUT_LEN" --min-len "$OUT_LEN"
     --device cpu --threads "$THREADS")
RESULTS=$BENCH_DIR/results.tsv
: > "$RESULTS"
for round in $(seq "$ROUNDS"); do
    for kind in "${KINDS[@]}"; do
        run=$BENCH_DIR/run_$kind
        rm -rf "$run" "$run".gen*
        cpu "$run.train_cpu" python -m nmtkit train "$BENCH_DIR/$kind" "${ARCH[@]}" "${OPT[@]}" --save-dir "$run" \
            > "$run.log" 2>&1 || { tail -n 20 "$run.log" >&2; exit 1; }
    done
    for g in $(seq "$GEN_RUNS"); do  # the round's models decode in turn, GEN_RUNS times, each pass
        for i in "${!KINDS[@]}"; do  # starting one model later, so that a drift within a pass falls on all alike
            kind=${KINDS[$(( (g - 1 + i) % ${#KINDS[@]} ))]}
            run=$BENCH_DIR/run_$kind
            lang=(); [ "$kind" = bilingual ] || lang=(--target-lang en)
            cpu "$run.gen$g.cpu" python -m nmtkit generate "$BENCH_DIR/$kind" --path "$run/checkpoint_last.pt" ${lang[@]+"${lang[@]}"} \
                "${GEN[@]}" --output "$run.hyp" 2> "$run.gen$g.log" || { tail -n 20 "$run.gen$g.log" >&2; exit 1; }
        done
    done
    for kind in "${KINDS[@]}"; do
        python - "$BENCH_DIR/run_$kind" "$round" "$kind" "$LOG_INTERVAL" "$RESULTS" "$GEN_RUNS" "$ROOT/recipes/bench" <<'PY'
import json, statistics, sys
run, rnd, kind, first, out, gen_runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
sys.path.insert(0, sys.argv[7])
from generate_bench import parse_summary  # generate's summary line, as every bench reads it
recs = [r for r in map(json.loads, open(f"{run}/train_log.jsonl", encoding="utf-8")) if r["type"] == "train"]
late = [r for r in recs if r["update"] > first]
if not late:
    sys.exit(f"[bench] no train records after update {first} in {run}/train_log.jsonl")
search, per_cpu = [], []
for g in range(1, gen_runs + 1):
    sentences, _, search_s = parse_summary(open(f"{run}.gen{g}.log", encoding="utf-8").read(), f"{run}.gen{g}.log")
    search.append(sentences / search_s)
    per_cpu.append(sentences / float(open(f"{run}.gen{g}.cpu").read()))
train_cpu = float(open(f"{run}.train_cpu").read())
wall_rate = sum(r["tgt_tokens"] for r in late) / sum(r["wall_s"] for r in late)
cpu_rate = sum(r["tgt_tokens"] for r in recs) / train_cpu
med = statistics.median
row = [rnd, kind, f"{wall_rate:.1f}", f"{cpu_rate:.1f}", f"{med(search):.1f}", f"{med(per_cpu):.2f}"]
print("  ".join(row))
open(out, "a", encoding="utf-8").write("\t".join(row) + "\n")
PY
    done
done
python - "$RESULTS" "${KINDS[@]}" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1], encoding="utf-8").read().splitlines()]
kinds = sys.argv[2:]
rounds = sorted({r[0] for r in rows}, key=int)
val = {(r[0], r[1]): [float(x) for x in r[2:]] for r in rows}
med = statistics.median
cols = ("train tok/s (wall)", "train tok/CPU s", "search sent/s", "generate sent/CPU s")
print("\n" + f"{'':<18}" + "".join(f"{c:>21}" for c in cols))
for kind in kinds:
    print(f"{kind:<18}" + "".join(f"{med(val[(n, kind)][i] for n in rounds):>21.1f}" for i in range(4)))
for kind in kinds[1:]:  # per round, kind / bilingual; then the median of the rounds' ratios
    ratios = [med(val[(n, kind)][i] / val[(n, kinds[0])][i] for n in rounds) for i in range(4)]
    print(f"{kind + ' / bi':<18}" + "".join(f"{r:>20.3f}x" for r in ratios))
PY
