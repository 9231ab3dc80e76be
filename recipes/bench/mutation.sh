#!/usr/bin/env bash
# Mutation-testing benchmark (mutmut 3, optional extra `mutation`; not part of CI): mutates each
# core module and runs only the tests that cover it, then prints a table per module of mutants
# generated, killed, survived, timed out, not reached by a test, and the score. See docs/testing.md.
#
#   bash recipes/bench/mutation.sh [MODULE ...]     # default: all modules (about 2 hours, 2 cores)
#   bash recipes/bench/mutation.sh --list           # the modules and the tests each one runs
#
# Environment (defaults):
#   MUTATION_WORKERS=2           mutants tested at once (one CPU core each)
#   MUTATION_BUDGET=7200         seconds for the whole run; each module gets what is left divided by
#                                the modules still to run, and one stopped there is reported partial
#   NICE=0                       niceness of the run (use 15 on a shared machine)
# Work folders: .mutation/MODULE/ (mutmut's state; `cd .mutation/MODULE && mutmut show NAME`
# prints a mutant's diff). Each run starts them afresh.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
. recipes/lib/env.sh
nmtkit_env test,mutation
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
NICE=${NICE:-0}
[[ $NICE =~ ^[0-9]+$ ]] || { echo "NICE must be a number 0-19, got '$NICE'" >&2; exit 2; }
exec nice -n "$NICE" python recipes/bench/mutation.py "$@"
