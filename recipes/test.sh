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
# Two worker processes (pytest-xdist), each taking whole test files (--dist loadfile: a file's
# module fixtures, such as a trained model or a recipe's smoke run, are built once), one thread
# each: the suite's tests are mostly small and single-threaded, so two at once use both cores.
# NMTKIT_TEST_WORKERS=0 runs everything in this one process (pdb, -s); N runs N workers.
workers=${NMTKIT_TEST_WORKERS:-2}
[[ $workers =~ ^[0-9]+$ ]] || { echo "NMTKIT_TEST_WORKERS must be a whole number, got '$workers'" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$([ "$workers" = 0 ] && echo 2 || echo 1)}
python -m pytest -n "$workers" --dist loadfile "$@"
