#!/usr/bin/env bash
# Benchmark `nmtkit generate` on Multi30k test_2016_flickr (1,000 sentences, de->en), beam 4, CPU.
#
#   CKPT=path/to/checkpoint.pt bash recipes/bench/generate.sh
#
# Prints, for batch sizes 1, 16 and 128: sentences/s and target tokens/s (subwords without </s>)
# of the whole process and of the search alone, the peak RSS of the process, and sacreBLEU; the
# median of RUNS runs. Compare with ../shared/anchors (fairseq-generate, CTranslate2 float32) run
# on the same machine in the same sitting; report ratios, since shared machines drift.
#
#   CKPT=FILE          the model: a trained d_model=256, 3+3-layer Transformer on Multi30k de-en, e.g.
#                      from `nmtkit train` with --encoder-layers 3 --decoder-layers 3 --d-model 256
#                      --d-ff 1024 --heads 4 (required)
#   DATA=DIR           the data directory it was trained on; its `test` split must be
#                      test_2016_flickr (default: preprocess Multi30k into $BENCH_DIR/data with a joint
#                      sentencepiece 8k model and a joined dictionary, as the anchors do)
#   NMTKIT_DATA=DIR    Multi30k folder with train/val/test_2016_flickr .de/.en(.gz)
#                      (default: ../shared/data/multi30k)
#   BATCH_SIZES=1,16,128  THREADS=2  RUNS=3  BEAM=4  LENPEN=0.6
#   LENPEN_FORM=fairseq  the anchors' fairseq-generate and CTranslate2 use |Y|^alpha; gnmt = the paper
#   EXTRA="..."        more `nmtkit generate` flags (e.g. "--precision bf16")
#   BENCH_DIR=DIR      scratch folder (default: ./work/bench_generate)
#   OMP_WAIT_POLICY=PASSIVE  set it when the machine is busy with other work: OpenMP's default
#                      spinning then makes THREADS=2 many times slower (docs/generate.md, Speed)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env
if [ -z "${CKPT:-}" ]; then
    echo "[bench] set CKPT=path/to/checkpoint.pt (a d_model=256 3+3-layer model trained on Multi30k de-en)" >&2
    exit 2
fi
bench=${BENCH_DIR:-$(pwd)/work/bench_generate}
m30k=${NMTKIT_DATA:-$(pwd)/../shared/data/multi30k}
mkdir -p "$bench"
if [ -z "${DATA:-}" ]; then
    DATA=$bench/data
    echo "[bench] preprocessing Multi30k into $DATA (skipped when up to date)" >&2
    nmtkit preprocess -s de -t en --trainpref "$m30k/train" --validpref "$m30k/val" \
        --testpref "$m30k/test_2016_flickr" --destdir "$DATA" --vocab-size 8000 --joined-dictionary >&2
fi
ref=$m30k/test_2016_flickr.en
[ -f "$ref" ] || ref=$ref.gz
python recipes/bench/generate_bench.py --data "$DATA" --ckpt "$CKPT" --ref "$ref" --work "$bench" \
    --batch-sizes "${BATCH_SIZES:-1,16,128}" --threads "${THREADS:-2}" --runs "${RUNS:-3}" \
    --beam "${BEAM:-4}" --lenpen "${LENPEN:-0.6}" --lenpen-form "${LENPEN_FORM:-fairseq}" --extra "${EXTRA:-}"
