# Sourced by the recipes with a CPU smoke mode (quickstart, multilingual, distill, finetune): their
# one option and their help, in one place.
#   recipe_options SCRIPT "$@"   --smoke (or SMOKE=1 in the environment); -h/--help prints SCRIPT's
#                                header comment; anything else is refused in one line (RECIPE_NAME)
#   s SMOKE_VALUE FULL_VALUE     the value for this run
recipe_options() {
    local script=$1 arg
    shift
    SMOKE=${SMOKE:-0}
    for arg in "$@"; do
        case $arg in
            --smoke) SMOKE=1 ;;
            -h|--help) sed -n '2,/^set -euo/p' "$script" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
            *) echo "[${RECIPE_NAME:-recipe}] error: unknown option $arg (see --help)" >&2; exit 2 ;;
        esac
    done
}

s() { if [ "$SMOKE" = 1 ]; then echo "$1"; else echo "$2"; fi; }
