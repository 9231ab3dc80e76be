#!/usr/bin/env bash
# The README's test command: install nmtkit with its test extras and run the whole test suite.
#   bash recipes/test.sh                        # the whole suite (pyproject.toml's testpaths: tests/)
#   bash recipes/test.sh tests/test_export.py   # test paths replace that selection: this file alone
#   bash recipes/test.sh -x -k bleu             # options alone apply to the whole suite
# The arguments go to pytest unchanged, and pytest uses testpaths only when no path is given.
# Paths are relative to the checkout's root (the script runs there). Tests that read the real
# data skip without it: NMTKIT_SHARED, docs/testing.md "The real data".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. recipes/lib/env.sh
nmtkit_env test
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
python -m pytest "$@"
