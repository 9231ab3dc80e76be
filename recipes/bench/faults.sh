#!/usr/bin/env bash
# The faults nmtkit is hardened against, attacked again on a tiny set-up built from nothing, and a
# table of what held: one row per attack, `held`, `BROKEN` or `not available`, with its evidence
# (exit status, the one line the command printed, seconds, peak RSS where they matter).
#
#   bash recipes/bench/faults.sh                 # every row: about 1 minute on 2 CPU cores
#   bash recipes/bench/faults.sh --only 1,3      # some groups only
#   bash recipes/bench/faults.sh --keep          # keep the work folder (its path is printed)
#
# The set-up, in a new temporary folder removed at the end: a data directory of a word-mapping task
# (400 lines, whitespace tokens, a joined dictionary) and an untrained tiny checkpoint of it (1+1
# layers, d_model 16), made in a second by nmtkit's own preprocessing, as the tests make theirs.
# No network, CPU only; the servers listen on 127.0.0.1 (4e's on 0.0.0.0, and nothing connects
# to it). Every command runs as a process of its own, with its own timeout (60-180 s; a row whose
# command hangs is BROKEN with "timed out").
#
# The rows (held = all of it):
#  1 output policy: each refused with exit 2 and one line, the file's bytes unchanged
#    1a  nmtkit attention --format npz -o CHECKPOINT (the checkpoint it reads)
#    1b  nmtkit generate -o DATA/manifest.json
#    1c  nmtkit generate -o DATA/dict.en.txt
#    1d  nmtkit generate -o DIRECTORY (a folder holding a file: unchanged)
#  2 bounded loads: crafted checkpoints (torch.save, no nmtkit code), refused with exit 2 and one
#    line within 15 s and 1 GiB peak RSS (the child's ru_maxrss; before: 22 s and 4.4 GB)
#    2a, 2b  max_source_positions = 2**22, to generate and to export
#    2c, 2d  one NaN weight, to generate and to export
#  3 killed exports
#    3a  an export killed with SIGKILL while it copies files: the next export into the same folder
#        says "removed ..., left by an interrupted 'nmtkit export'" and leaves only its own output
#    3b  an export --force killed between its two renames (its earlier export moved aside): the
#        next export (another --output) puts the earlier one back, byte for byte, and removes the rest
#  4 the server, started under `ulimit -n 1024` (flags from `nmtkit serve --help`: a row whose
#    flag is missing is "not available")
#    4a  1,100 connections send part of their headers: /health and /translate still answer 200
#        (within 10 s), no traceback or "Too many open files" in the log, the server still running
#    4b  an upload stalled mid-body, then SIGTERM (--graceful-timeout 5): exit 0 within 5 s, the
#        upload's connection closed
#    4c  GET /a%0a2026-01-01...%1b[31m: 404, no raw control character and no forged line in the log
#    4d  a client that closes mid-body: exactly one log line (499, "client went away"), no traceback
#    4e  --host 0.0.0.0: one warning line that the server is reachable beyond loopback
#    4f  GET /info: no absolute path anywhere in the answer
#  5 training, 2 gloo processes on the CPU
#    5a  kill -9 of the torchrun launcher once a checkpoint is saved: both workers exit (143)
#        within 5 s, each with its one line, and the save directory's lock is free
#    5b  rank 1 SIGSTOPped (ranks started by hand, --ddp-timeout 5): rank 0 exits with status 2
#        and one error line 4.5-20 s later; rank 1, continued, exits non-zero; the lock is free
#
# Exit status: 0 only if every row held; 1 if any row is BROKEN or not available.
# Needs Linux, the serve and ctranslate2 extras (the `test` extra holds both: what this installs
# when they are missing) and `bash`. Described in docs/testing.md, "Faults checked".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env test
export OMP_NUM_THREADS=1
exec python recipes/bench/faults.py "$@"
