#!/usr/bin/env bash
# Rebuilds the fairseq fixtures of tests/test_fairseq_import.py with fairseq 0.12.2 (README.md here).
#   FAIRSEQ_VENV  fairseq's venv (default: the yardstick's, $HOME/.cache/nmtkit-anchors/venv-fairseq,
#                 built by ../shared/anchors/setup_fairseq.sh)
#   NMTKIT_PY     a Python with sentencepiece, sacremoses and subword-nmt (nmtkit's own venv)
#   WORK          scratch folder (default: a new temporary one)
#   FIXTURES      which to build (default: "a b c"); the sentencepiece text of A is made for A and C
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FS=${FAIRSEQ_VENV:-$HOME/.cache/nmtkit-anchors/venv-fairseq}/bin
PY=${NMTKIT_PY:-python}
WORK=${WORK:-$(mktemp -d)}
FIXTURES=" ${FIXTURES:-a b c} "
want() { [[ "$FIXTURES" == *" $1 "* ]]; }
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
C=$WORK/corpus
"$PY" "$HERE/make_corpus.py" "$C"

# ---- fixture A: post-norm `transformer`, shared embeddings (joined dictionary), sentencepiece --------
A=$WORK/a; mkdir -p "$A/sp"
"$PY" - "$C" "$A" <<'PYEOF'
import sys, sentencepiece as spm
c, a = sys.argv[1], sys.argv[2]
spm.SentencePieceTrainer.train(input=[f"{c}/train.src", f"{c}/train.tgt"], model_prefix=f"{a}/spm", vocab_size=120,
                               model_type="bpe", character_coverage=1.0, normalization_rule_name="identity",
                               minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=f"{a}/spm.model")
for split in ("train", "valid", "test"):
    for side in ("src", "tgt"):
        lines = open(f"{c}/{split}.{side}", encoding="utf-8").read().splitlines()
        with open(f"{a}/sp/{split}.{side}", "w", encoding="utf-8") as fh:
            fh.writelines(" ".join(p) + "\n" for p in sp.encode(lines, out_type=str))
PYEOF
COMMON=(--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32
        --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 4 --decoder-attention-heads 4
        --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.005 --lr-scheduler inverse_sqrt --warmup-updates 100
        --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 2000 --max-update 400
        --no-epoch-checkpoints --seed 1 --cpu --num-workers 0 --log-interval 100)
if want a; then
"$FS/fairseq-preprocess" --source-lang src --target-lang tgt --trainpref "$A/sp/train" --validpref "$A/sp/valid" \
    --testpref "$A/sp/test" --destdir "$A/bin" --joined-dictionary --workers 1
"$FS/fairseq-train" "$A/bin" --arch transformer --share-all-embeddings --dropout 0.1 "${COMMON[@]}" --save-dir "$A/ckpt"
"$FS/fairseq-generate" "$A/bin" --path "$A/ckpt/checkpoint_last.pt" --gen-subset test --beam 5 --lenpen 1 \
    --batch-size 16 --cpu > "$A/generate.out"
fi

# ---- fixture C: transformer_iwslt_de_en with GELU, separate dictionaries, the decoder's input and -------
# ---- output embeddings tied (not the encoder's); A's sentencepiece text ---------------------------------
if want c; then
C3=$WORK/c
"$FS/fairseq-preprocess" --source-lang src --target-lang tgt --trainpref "$A/sp/train" --validpref "$A/sp/valid" \
    --testpref "$A/sp/test" --destdir "$C3/bin" --workers 1
"$FS/fairseq-train" "$C3/bin" --arch transformer_iwslt_de_en --activation-fn gelu \
    --share-decoder-input-output-embed --dropout 0.1 "${COMMON[@]}" --save-dir "$C3/ckpt"
"$FS/fairseq-generate" "$C3/bin" --path "$C3/ckpt/checkpoint_last.pt" --gen-subset test --beam 5 --lenpen 1 \
    --batch-size 16 --cpu > "$C3/generate.out"
fi

# ---- fixture B: pre-norm transformer_wmt_en_de_big_t2t, learned positions, separate dictionaries, -------
# ---- Moses tokenization (sacremoses) and joint subword-nmt codes, as the published WMT models ----------
if want b; then
B=$WORK/b; mkdir -p "$B/tok"
"$PY" - "$C" "$B" <<'PYEOF'
import io, sys
from collections import Counter
from sacremoses import MosesTokenizer
from subword_nmt.learn_bpe import learn_bpe
from subword_nmt.apply_bpe import BPE
c, b = sys.argv[1], sys.argv[2]
tok = MosesTokenizer(lang="en")  # fairseq's --tokenizer moses: aggressive dash splits, escaping
toks = {}
for split in ("train", "valid", "test"):
    for side in ("src", "tgt"):
        lines = open(f"{c}/{split}.{side}", encoding="utf-8").read().splitlines()
        toks[split, side] = [tok.tokenize(l, aggressive_dash_splits=True, return_str=True, escape=True) for l in lines]
counts = Counter(w for side in ("src", "tgt") for l in toks["train", side] for w in l.split())
vocab = io.StringIO("".join(f"{w} {n}\n" for w, n in counts.most_common()))
with open(f"{b}/bpecodes", "w", encoding="utf-8") as fh:
    learn_bpe(vocab, fh, 60, is_dict=True)
bpe = BPE(open(f"{b}/bpecodes", encoding="utf-8"))
for (split, side), lines in toks.items():
    with open(f"{b}/tok/{split}.{side}", "w", encoding="utf-8") as fh:
        fh.writelines(bpe.process_line(l) + "\n" for l in lines)
PYEOF
"$FS/fairseq-preprocess" --source-lang src --target-lang tgt --trainpref "$B/tok/train" --validpref "$B/tok/valid" \
    --testpref "$B/tok/test" --destdir "$B/bin" --workers 1
"$FS/fairseq-train" "$B/bin" --arch transformer_wmt_en_de_big_t2t --encoder-learned-pos --decoder-learned-pos \
    --max-source-positions 256 --max-target-positions 256 --dropout 0.1 "${COMMON[@]}" --save-dir "$B/ckpt"
"$FS/fairseq-generate" "$B/bin" --path "$B/ckpt/checkpoint_last.pt" --gen-subset test --beam 5 --lenpen 1 \
    --batch-size 16 --cpu > "$B/generate.out"
fi

# ---- with A: an OmegaConf DictConfig as fairseq pickles one (fairseq >= 0.10 may store `cfg` so) -------
if want a; then
"$FS/python" -c "
import torch
from omegaconf import OmegaConf
cfg = OmegaConf.create({'model': {'_name': 'transformer', 'arch': 'transformer', 'dropout': 0.3,
                                  'share_all_embeddings': True, 'layers': [1, 2]},
                        'task': {'source_lang': 'de', 'target_lang': None}})
torch.save({'args': None, 'cfg': cfg, 'model': {'w': torch.ones(2)}}, '$HERE/omegaconf_cfg.pt')
"
fi

# ---- what is kept -------------------------------------------------------------------------------------------
for x in a b c; do
    want "$x" || continue
    mkdir -p "$HERE/$x"
    cp "$WORK/$x/ckpt/checkpoint_last.pt" "$HERE/$x/checkpoint.pt"
    cp "$WORK/$x/bin/dict.src.txt" "$WORK/$x/bin/dict.tgt.txt" "$HERE/$x/"
    cp "$C/test.src" "$HERE/$x/test.src"
    cp "$WORK/$x/generate.out" "$HERE/$x/generate.out"
done
want a && cp "$A/spm.model" "$HERE/a/spm.model"
want b && cp "$B/bpecodes" "$HERE/b/bpecodes"
want c && cp "$A/spm.model" "$HERE/c/spm.model"
echo "fixtures written under $HERE (scratch: $WORK)"
