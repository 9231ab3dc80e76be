#!/usr/bin/env bash
# A soak of `nmtkit serve`: one server on 127.0.0.1 (a free port) under mixed clients for a while
# (valid requests with random beam and nbest, invalid ones, slow bodies sent byte by byte,
# oversized ones, clients that go away mid-request, the page, /health, /info and /attention),
# then whether it stayed correct and kept nothing: one line each on stdout.
#
#   bash recipes/bench/serve_soak.sh                          # 10 minutes on a tiny model built from nothing
#   bash recipes/bench/serve_soak.sh --seconds 60 --json soak.json
#   bash recipes/bench/serve_soak.sh --path CKPT DATA_DIR --input FILE   # your model, your sentences
#
#   --seconds S        the load after the warm-up (default 600)
#   --warmup S         seconds of the same load first, before the start's RSS and descriptors are
#                      read (default: a quarter of --seconds, 2 to 150: the RSS settles first)
#   --path CKPT DATA   the model (default: a random 1+1-layer model of a word-mapping data directory,
#                      recipes/bench/faults.py's set-up, in a temporary folder)
#   --input FILE       the sentences sent (the first --pool non-empty lines, .gz allowed); needed with --path
#   --clients N        threads sending valid requests (8); every other kind has one thread
#   --threads N        the server's --threads (1)
#   --max-beam, --max-sentences, --max-chars   the server's request limits (4, 8, 200)
#   --search-flags ".."  search flags for the server and for the reference `nmtkit generate`
#   --json FILE        the figures as JSON too
#
# It prints: requests answered by kind (and 503s, requests left without an answer); answers that
# differ from `nmtkit generate --batch-size 1` on the same sentences with the same flags; statuses
# other than expected; 5xx other than 503 (from the clients and in the server's log); the server's
# RSS and open file descriptors after the warm-up and at the end; its exit status on SIGTERM.
# Exit status 0 when all hold (0 wrong answers, 0 unexpected statuses, 0 such 5xx, RSS within 5%,
# descriptors equal, exit 0 with no traceback, every answer due received); 1 otherwise, naming them.
# Needs Linux (/proc) and the serve extra (installed when missing); the clients use the standard
# library. Described in docs/testing.md, "Soak of the server".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env serve
export OMP_NUM_THREADS=1
exec python recipes/bench/serve_soak.py "$@"
