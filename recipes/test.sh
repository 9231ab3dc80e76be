#!/usr/bin/env bash
# The README's test command: install nmtkit with its test extras and run the whole test suite.
#   bash recipes/test.sh [extra pytest arguments]   # e.g. tests/test_export.py: that file alone
# Without a test path pytest runs pyproject.toml's testpaths (tests/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. recipes/lib/env.sh
nmtkit_env test
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python -m pytest "$@"
