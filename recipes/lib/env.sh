# Sourced by recipes: use the active virtual environment, or create and use ./.venv, then make
# sure nmtkit (and, with NMTKIT_EXTRAS=test, its test extras) is installed.
#
# torch is installed first, pinned, so that `pip install nmtkit` finds it satisfied and never pulls
# the multi-GB CUDA build onto a machine without a GPU:
#   NMTKIT_TORCH   the torch requirement to install when torch is missing (default: torch==2.13.0;
#                  on a CPU-only machine without a local CPU wheel, also set
#                  PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)
#   NMTKIT_VENV    where to create the environment when none is active (default: <repo>/.venv)
# The environment is active only inside the recipe: when nmtkit_env activated it (none was active),
# NMTKIT_ENV_ACTIVATED holds its path, so that a recipe can tell the user to
# `source <path>/bin/activate` before running `nmtkit` by hand.
_nmtkit_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

nmtkit_env() {
    local extras=${1:-}
    NMTKIT_ENV_ACTIVATED=""
    if [ -z "${VIRTUAL_ENV:-}" ]; then
        local venv=${NMTKIT_VENV:-$_nmtkit_root/.venv}
        if [ ! -x "$venv/bin/python" ]; then
            echo "[env] creating virtual environment $venv" >&2
            python3 -m venv "$venv" || { echo "[env] python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; return 1; }
        fi
        # shellcheck disable=SC1091
        . "$venv/bin/activate"
        NMTKIT_ENV_ACTIVATED=$venv
    fi
    python -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { echo "[env] nmtkit needs Python 3.10 or newer, found $(python --version 2>&1)" >&2; return 1; }
    if ! python -c 'import torch' 2>/dev/null; then
        echo "[env] installing ${NMTKIT_TORCH:-torch==2.13.0}" >&2
        python -m pip install -q "${NMTKIT_TORCH:-torch==2.13.0}" || return 1
    fi
    local spec="$_nmtkit_root"
    [ -n "$extras" ] && spec="$_nmtkit_root[$extras]"
    # Reinstall only when pyproject.toml changed or a requested extra is missing (editable
    # install: code changes need nothing). The marker holds the pyproject hash and the extras.
    local hash marker have
    hash=$(sha256sum < "$_nmtkit_root/pyproject.toml" | cut -d' ' -f1)
    marker="$VIRTUAL_ENV/.nmtkit-installed"
    have=$(cat "$marker" 2>/dev/null || true)
    local need=0
    [ "${have%% *}" = "$hash" ] || need=1
    python -c 'import importlib.metadata as m; m.version("nmtkit")' 2>/dev/null || need=1
    local e
    for e in ${extras//,/ }; do
        case " ${have#* } " in *" $e "*) ;; *) need=1 ;; esac
    done
    if [ "$need" = 1 ]; then
        echo "[env] installing nmtkit${extras:+[$extras]} (editable) into $VIRTUAL_ENV" >&2
        python -m pip install -q -e "$spec" || return 1
        # keep the extras installed before, unless pyproject changed
        local old=""
        [ "${have%% *}" = "$hash" ] && old=${have#* }
        echo "$hash $old ${extras//,/ }" > "$marker"
    fi
}
