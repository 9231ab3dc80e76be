#!/usr/bin/env bash
# Every property test of a parser of outside input (the `fuzz` mark, docs/testing.md "Fuzzed
# parsers"), run long: 10,000 fresh examples each by default, then a table per test of the
# examples run, the failures and the slowest input with its time. Not part of CI (CI runs the same
# tests with 60 derandomized examples each).
#
#   bash recipes/bench/fuzz.sh [--examples N] [pytest arguments, e.g. tests/test_dictionary.py]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
examples=10000
if [ "${1:-}" = "--examples" ]; then
    [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "--examples takes a whole number >= 1, got '${2:-}'" >&2; exit 2; }
    examples=$2
    shift 2
fi
. recipes/lib/env.sh
nmtkit_env test
export OMP_NUM_THREADS=1 HYPOTHESIS_PROFILE=fuzz NMTKIT_FUZZ_EXAMPLES=$examples
exec python -m pytest -m fuzz -q -p no:cacheprovider --hypothesis-show-statistics "$@"
