#!/usr/bin/env bash
# Reproduce the WMT14 English->German results of "Attention Is All You Need" (Table 2):
# base 27.3 BLEU, big 28.4 BLEU on newstest2014.
#
#   bash recipes/wmt14_en_de/run.sh [base|big]          # the full run (GPUs strongly advised)
#   SMOKE=1 bash recipes/wmt14_en_de/run.sh             # every stage in a few minutes on CPU
#   STAGE=average bash recipes/wmt14_en_de/run.sh base  # start from one stage
#
# Stages: download prepare preprocess train average generate score. Each is skipped when its
# verified output exists, so an interrupted run continues when the same command is run again
# (training resumes from its last checkpoint). Every setting below can be overridden from the
# environment, e.g. `WORK=/data/ende MAX_UPDATE=50000 bash recipes/wmt14_en_de/run.sh`; changing
# one re-runs the stage it belongs to and the stages after it. See docs/reproducing.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
RECIPE_NAME=wmt14_en_de

# ---------------------------------------------------------------- settings (all of them) -------
MODEL=${1:-${MODEL:-base}}          # base | big
SMOKE=${SMOKE:-0}                   # 1: CPU smoke run on slices of ../shared/data/wmt14
m() { if [ "$MODEL" = big ]; then echo "$2"; else echo "$1"; fi; }   # m BASE_VALUE BIG_VALUE
s() { if [ "$SMOKE" = 1 ]; then echo "$1"; else echo "$2"; fi; }     # s SMOKE_VALUE FULL_VALUE
PAIR_NAME=wmt14_en_de SRC=en TGT=de
WORK=${WORK:-$ROOT/runs/$PAIR_NAME$(s _smoke "")}      # everything the recipe writes
DOWNLOAD_DIR=${DOWNLOAD_DIR:-$ROOT/runs/wmt14_download} # archives (shared with wmt14_en_fr)
NMTKIT_SHARED=${NMTKIT_SHARED:-$ROOT/../shared}
SHARED_WMT14=$NMTKIT_SHARED/data/wmt14                 # SMOKE=1 reads its test sets from here

# Data: Europarl v7 + Common Crawl + News Commentary v9 (the WMT14 En-De training data, about
# 4.5M pairs), newstest2013 (dev), newstest2014 full (test). URLs as in fairseq's
# examples/translation/prepare-wmt14en2de.sh (--icml17 variant, News Commentary v9); md5 sums as
# in sockeye_autopilot's third_party list and, for test-full.tgz, sacrebleu's wmt14/full entry.
DOWNLOADS=(
    "https://statmt.org/wmt13/training-parallel-europarl-v7.tgz c52404583294a1b609e56d45b2ed06f5"
    "https://statmt.org/wmt13/training-parallel-commoncrawl.tgz 7e0acbe86b0d7816300e14650f5b2bd4"
    "https://statmt.org/wmt14/training-parallel-nc-v9.tgz 92e42b68f9d3c2ae9722e6d1c2623e21"
    "https://statmt.org/wmt14/dev.tgz 88ba3fc60b2278d59277122e1c7dd6e7"
    "https://statmt.org/wmt14/test-full.tgz a8cd784e006feb32ac6f3d9ec7eb389a"
)
TRAIN_CORPORA=(   # ARCHIVE SOURCE_MEMBER TARGET_MEMBER
    "training-parallel-europarl-v7.tgz training/europarl-v7.de-en.en training/europarl-v7.de-en.de"
    "training-parallel-commoncrawl.tgz commoncrawl.de-en.en commoncrawl.de-en.de"
    "training-parallel-nc-v9.tgz training/news-commentary-v9.de-en.en training/news-commentary-v9.de-en.de"
)
DEV_SGM=("dev.tgz dev/newstest2013-src.en.sgm dev/newstest2013-ref.de.sgm")
TEST_SGM=("test-full.tgz test-full/newstest2014-deen-src.en.sgm test-full/newstest2014-deen-ref.de.sgm")
# SMOKE=1: newstest2014 lines 1..2000 stand in for the training corpora, the first 200 lines of
# newstest2013 for dev, the last 200 lines of newstest2014 for test. Nothing is downloaded.
SMOKE_FILES=(newstest2014-ende.en.gz newstest2014-ende.de.gz newstest2013.en.gz newstest2013.de.gz)
SMOKE_TEST_PREFIX=newstest2014-ende
SMOKE_TRAIN_LINES=${SMOKE_TRAIN_LINES:-2000}
SMOKE_VALID_LINES=${SMOKE_VALID_LINES:-200}
SMOKE_TEST_LINES=${SMOKE_TEST_LINES:-200}

# Subwords and cleaning: joint sentencepiece BPE on the raw text (the paper: shared BPE, ~37K);
# training pairs with a side over MAX_LEN subword tokens or a length ratio over RATIO are dropped
# (fairseq's prepare script: clean-corpus-n.perl -ratio 1.5 ... 1 250 on BPE tokens).
VOCAB_SIZE=${VOCAB_SIZE:-$(s 1000 37000)}
SPM_MAX_LINES=${SPM_MAX_LINES:-1000000}   # sentencepiece learns from a reproducible sample
MAX_LEN=${MAX_LEN:-250}
RATIO=${RATIO:-1.5}
WORKERS=${WORKERS:-$(s 1 "$(nproc)")}      # preprocessing processes (output does not depend on it)

# Model and training (section 5): Adam (0.9, 0.98, 1e-9), the paper's learning rate
# (d_model^-0.5 * min(u^-0.5, u * WARMUP^-1.5), times LR_SCALE), ~25K source + 25K target tokens
# per update, a checkpoint every 10 minutes, 100K (base) / 300K (big) updates.
ARCH=${ARCH:-$(s transformer_tiny "$(m transformer_base transformer_big)")}
MAX_UPDATE=${MAX_UPDATE:-$(s 40 "$(m 100000 300000)")}
WARMUP=${WARMUP:-$(s 40 4000)}
LR_SCALE=${LR_SCALE:-1.0}
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE:-$(s 2048 25000)}  # = MAX_TOKENS x processes x UPDATE_FREQ
MAX_TOKENS_PER_DEVICE=${MAX_TOKENS_PER_DEVICE:-$(s 1024 "$(m 12500 6250)")}  # memory cap per process
# MAX_TOKENS, UPDATE_FREQ: computed from the two above and the process count unless set
# Checkpoints every 10 minutes (the paper) and also every 1500 (base) / 600 (big) updates, which
# were the paper's 10 minutes at its 0.4 / 1.0 s per update: on hardware faster than 8 P100s the
# last AVG_N checkpoints then still span the paper's share of training (e.g. the last 7500 base
# updates), and a run shorter than AVG_N x 10 minutes still has AVG_N checkpoints to average.
SAVE_INTERVAL_MINUTES=${SAVE_INTERVAL_MINUTES:-$(s 0 10)}
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES:-$(s 20 "$(m 1500 600)")}
AVG_N=${AVG_N:-$(s 2 "$(m 5 20)")}      # checkpoints averaged: the last 5 (base) / 20 (big)
KEEP_LAST=${KEEP_LAST:-$AVG_N}         # timed checkpoints kept (each one holds Adam's state too)
SEED=${SEED:-1}
LOG_INTERVAL=${LOG_INTERVAL:-$(s 10 100)}
EXTRA_TRAIN_ARGS=${EXTRA_TRAIN_ARGS:-}  # more `nmtkit train` flags, e.g. "--compile"

# Devices: all visible GPUs (CUDA_VISIBLE_DEVICES) of each node, one process each, through
# torchrun when there is more than one process. NGPUS, NPROC_PER_NODE and PRECISION (bf16 where
# the GPU supports it, else fp16; fp32 on CPU) are detected unless set.
DEVICE=${DEVICE:-$(s cpu auto)}         # auto | cpu | cuda
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-}            # node 0's address, reachable from every node (NNODES > 1)
MASTER_PORT=${MASTER_PORT:-29500}
THREADS=${THREADS:-$(s 1 "$(nproc)")}   # CPU threads (DEVICE=cpu; SMOKE: 1, robust on a busy machine)

# Decoding and scoring (section 6): beam 4, alpha 0.6, at most input length + 50 tokens;
# tokenized BLEU with compound splitting (the paper's number) and sacreBLEU.
BEAM=${BEAM:-4}
LENPEN=${LENPEN:-0.6}
MAX_LEN_A=${MAX_LEN_A:-1}
MAX_LEN_B=${MAX_LEN_B:-50}
COMPOUND_SPLIT=1
PAPER_BLEU=$(m 27.3 28.4) PAPER_TABLE="Table 2"
# -----------------------------------------------------------------------------------------------

. recipes/lib/wmt14.sh
wmt14_main
