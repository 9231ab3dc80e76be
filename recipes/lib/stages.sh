# Sourced by recipes: run a pipeline of named stages, skipping each one whose verified output
# already exists, and restarting from a named stage with STAGE=name.
#
# A stage's stamp file (STAMP_DIR/NAME.stamp) is written last, after the stage succeeded. It holds
#   key KEY                a hash of the stage's settings and of the previous stage's key
#   file SIZE PATH         one line per output file, with its size in bytes
# and the stage is skipped only when the key is the same and every file is still there with that
# size. Once a stage runs, every stage after it runs too (its inputs are new). Each key also
# includes the previous stage's key, so changing a setting of one stage re-runs it and every stage
# after it; deleting or truncating an output re-runs the stage that wrote it and the later ones.
#
# Use:
#   STAGES=(prepare train score); STAMP_DIR=...; stages_init "${STAGE:-}" "${LAST_STAGE:-}"
#   run_stage prepare "$key_prepare" stage_prepare      # the function sets STAGE_OUTPUTS=(files)
#   run_stage score "$key_score" stage_score show_score  # optional: what to do when up to date
#
# STAGE=name: stages before NAME are not run (nor checked); NAME and every later stage run even
# when up to date (each one is itself safe to re-run: downloads are verified, not repeated;
# preprocessing finds its output up to date; training resumes from its last checkpoint).
# LAST_STAGE=name: stop after NAME (e.g. prepare the data on one machine, train on another).

say() { echo "[${RECIPE_NAME:-recipe}] $*" >&2; }
die() { echo "[${RECIPE_NAME:-recipe}] error: $*" >&2; exit 2; }

# key VALUE... -> sha256 of the values (NUL-separated, so "a b" "c" != "a" "b c")
key() { printf '%s\0' "$@" | sha256sum | cut -c1-64; }

_fsize() { stat -c %s "$1" 2>/dev/null || stat -f %z "$1"; }

stamp_ok() {  # stamp_ok FILE KEY: true when FILE records KEY and every output it lists is intact
    local f=$1 want=$2 kind size path
    [ -f "$f" ] || return 1
    { read -r kind size path; } < "$f" || return 1
    [ "$kind" = key ] && [ "$size" = "$want" ] || return 1
    while read -r kind size path; do
        [ "$kind" = file ] || continue
        [ -f "$path" ] && [ "$(_fsize "$path")" = "$size" ] || return 1
    done < <(tail -n +2 "$f")
}

stamp_write() {  # stamp_write FILE KEY OUTPUT...: atomically (temporary name, then rename)
    local f=$1 k=$2 p
    shift 2
    mkdir -p "$(dirname "$f")"
    {
        echo "key $k"
        for p in "$@"; do
            [ -f "$p" ] || die "stage output $p is missing"
            echo "file $(_fsize "$p") $(cd "$(dirname "$p")" && pwd)/$(basename "$p")"
        done
    } > "$f.tmp.$$"
    mv -f "$f.tmp.$$" "$f"
}

_stage_index() {  # _stage_index NAME: its position in STAGES, or -1
    local i
    for i in "${!STAGES[@]}"; do if [ "${STAGES[$i]}" = "$1" ]; then echo "$i"; return 0; fi; done
    echo -1
}

stages_init() {  # stages_init START LAST: check STAGE and LAST_STAGE against STAGES
    _START_STAGE=${1:-} _LAST_STAGE=${2:-} _STARTED=1 _STOPPED=0
    local first=0 last=$((${#STAGES[@]} - 1))
    if [ -n "$_START_STAGE" ]; then
        first=$(_stage_index "$_START_STAGE")
        [ "$first" -ge 0 ] || die "STAGE=$_START_STAGE is not a stage; stages: ${STAGES[*]}"
        _STARTED=0
    fi
    if [ -n "$_LAST_STAGE" ]; then
        last=$(_stage_index "$_LAST_STAGE")
        [ "$last" -ge 0 ] || die "LAST_STAGE=$_LAST_STAGE is not a stage; stages: ${STAGES[*]}"
    fi
    [ "$first" -le "$last" ] || die "LAST_STAGE=$_LAST_STAGE comes before STAGE=$_START_STAGE"
}

run_stage() {  # run_stage NAME KEY FUNCTION [FUNCTION_WHEN_UP_TO_DATE]
    local name=$1 k=$2 fn=$3 on_skip=${4:-} stamp="$STAMP_DIR/$1.stamp" forced=0
    if [ "$_STOPPED" = 1 ]; then
        say "$name: not run (LAST_STAGE=$_LAST_STAGE)"
        return 0
    fi
    if [ "$name" = "$_LAST_STAGE" ]; then _STOPPED=1; fi
    if [ "$_STARTED" = 0 ]; then
        if [ "$name" != "$_START_STAGE" ]; then
            say "$name: not run (STAGE=$_START_STAGE)"
            return 0
        fi
        _STARTED=1
    fi
    # After STAGE=name, or once a stage has run, every later stage runs too: its inputs are new.
    if [ -n "$_START_STAGE" ] || [ "${_RAN_ONE:-0}" = 1 ]; then forced=1; fi
    if [ $forced = 0 ] && stamp_ok "$stamp" "$k"; then
        say "$name: up to date ($stamp)"
        [ -z "$on_skip" ] || "$on_skip"
        return 0
    fi
    rm -f "$stamp"
    say "$name: running"
    local t0=$SECONDS
    STAGE_OUTPUTS=()
    "$fn"
    stamp_write "$stamp" "$k" "${STAGE_OUTPUTS[@]}"
    _RAN_ONE=1
    say "$name: done in $((SECONDS - t0)) s"
}

check_run_settings() {  # check_run_settings DIR "name=value"...: one training run per directory
    # Re-running the train stage resumes DIR/checkpoint_last.pt, so a run started with other
    # settings (learning rate, model, data...) must not silently continue under new ones. The
    # settings that define the run are kept in DIR/run_settings.txt; when they differ from the
    # current ones and DIR holds checkpoints, stop and say which differ (nothing is deleted).
    # Stopping settings (e.g. MAX_UPDATE) are not passed here: changing them continues the run.
    local dir=$1 file=$1/run_settings.txt want
    shift
    want=$(printf '%s\n' "$@")
    mkdir -p "$dir"
    if [ -f "$file" ] && [ -f "$dir/checkpoint_last.pt" ] && [ "$(cat "$file")" != "$want" ]; then
        echo "[${RECIPE_NAME:-recipe}] error: $dir holds a training run with other settings:" >&2
        { diff <(echo "$want") "$file" || true; } | sed -n 's/^> /  was: /p; s/^< /  now: /p' >&2
        echo "[${RECIPE_NAME:-recipe}] move or delete $dir to train anew (or restore the settings)" >&2
        exit 2
    fi
    printf '%s\n' "$@" > "$file.tmp.$$"
    mv -f "$file.tmp.$$" "$file"
}

# --- the average and generate stages, the same in every recipe ----------------------------------
# They read the recipe's settings: CKPT_DIR, AVG_N, AVG_CKPT; DATA_BIN, HYP, BEAM, LENPEN,
# MAX_LEN_A, MAX_LEN_B, DEVICE (auto, cpu or cuda), THREADS.

stage_average() {
    nmtkit average-checkpoints --inputs "$CKPT_DIR" --num-update-checkpoints "$AVG_N" --output "$AVG_CKPT"
    STAGE_OUTPUTS+=("$AVG_CKPT")
}

stage_generate() {  # the test split of DATA_BIN into HYP (parsing data: one repaired tree per line)
    mkdir -p "$(dirname "$HYP")"
    local gen=()
    if [ "$DEVICE" != cuda ]; then gen+=(--threads "$THREADS"); fi  # CPU threads
    nmtkit generate "$DATA_BIN" --path "$AVG_CKPT" --gen-subset test --beam "$BEAM" \
        --lenpen "$LENPEN" --max-len-a "$MAX_LEN_A" --max-len-b "$MAX_LEN_B" \
        --device "$DEVICE" --output "$HYP" "${gen[@]}"
    STAGE_OUTPUTS+=("$HYP")
}

show_valid_loss() {  # show_valid_loss CKPT_DIR: the first and last validation loss of its train_log.jsonl
    python - "$1/train_log.jsonl" <<'PY'
import json, sys
valid = []
with open(sys.argv[1], encoding="utf-8") as fh:
    for rec in map(json.loads, fh):
        if rec["type"] == "start" and rec.get("resumed"):  # drop what the interrupted run logged later
            valid = [v for v in valid if v["update"] <= rec["update"]]
        elif rec["type"] == "valid":
            valid.append(rec)
if not valid:
    print("validation loss: none logged (training stopped before its first validation)")
else:
    a, b = valid[0], valid[-1]
    print(f"validation loss (nll, bits per target token): {a['nll_loss']:.3f} at update {a['update']} -> "
          f"{b['nll_loss']:.3f} at update {b['update']} ({len(valid)} validations)")
PY
}
