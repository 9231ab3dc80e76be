"""fairseq's flags that nmtkit spells otherwise or does without, per command, with the nmtkit way.

`nmtkit.cli.main` prints `nmtkit: error: FLAG: HINT` (exit status 2) instead of "No such option"
when an unknown option is one of these; any other unknown option keeps click's message. The full
table, fairseq's flags that nmtkit spells the same included, is docs/fairseq.md (the tests check
that every flag a hint names exists in that command's --help, and that the doc lists every flag
here).
"""

from __future__ import annotations

_DROP_SUBWORDS = "nmtkit removes subwords itself; drop it"
_SEGMENTS = "nmtkit segments raw text with DATA_DIR's subword model itself; drop it"
_TASK = "nmtkit reads what DATA_DIR holds from its manifest.json; drop it"
_DATASET_IMPL = "nmtkit reads its own memory-mapped shards; drop it"
_USER_DIR = "plug-in code is not supported"


def _languages(command: str) -> str:
    where = "DATA_DIR" if command == "train" else "DATA_DIR (or the export directory)"
    if command == "serve":
        return (f"nmtkit serve takes the language pair from {where}; drop it (a multilingual model's target "
                'is each request\'s "target_lang")')
    return f"nmtkit {command} takes the language pair from {where}; drop it"


def _decoding(command: str) -> dict[str, str]:
    """fairseq-generate's / fairseq-interactive's flags shared by `generate` and `serve`."""
    return {
        "--remove-bpe": _DROP_SUBWORDS,
        "--post-process": _DROP_SUBWORDS,
        "--tokenizer": _SEGMENTS,
        "--bpe": _SEGMENTS,
        "--bpe-codes": _SEGMENTS,
        "--sentencepiece-model": _SEGMENTS,
        "-s": _languages(command),
        "--source-lang": _languages(command),
        "-t": _languages(command),
        "--target-lang": _languages(command),
        "--cpu": "use --device cpu",
        "--fp16": "use --precision fp16",
        "--bf16": "use --precision bf16",
        "--unkpen": "use --unk-penalty",
        "--sampling-topk": "use --topk",
        "--sampling-topp": "use --topp",
        "--unnormalized": "use --lenpen 0",
        "--diverse-beam-groups": "diverse beam search is not supported",
        "--diverse-beam-strength": "diverse beam search is not supported",
        "--diversity-rate": "diverse beam search is not supported",
        "--match-source-len": "not supported; --min-len, --max-len-a and --max-len-b bound the output length",
        "--replace-unk": "not supported",
        "--model-overrides": "not supported: a checkpoint keeps its own architecture",
        "--task": _TASK,
        "--dataset-impl": _DATASET_IMPL,
        "--num-workers": "nmtkit reads the data itself; drop it",
        "--user-dir": _USER_DIR,
    }


# generate spells fairseq's -s/-t itself: a multilingual model's direction (docs/multilingual.md)
_LANGUAGE_FLAGS = ("-s", "--source-lang", "-t", "--target-lang")
GENERATE = {k: v for k, v in _decoding("generate").items() if k not in _LANGUAGE_FLAGS} | {
    "--max-sentences": "use --batch-size",
    "--results-path": "use --output FILE (--format fairseq for fairseq's S-/H-/D-/P- lines)",
    "--sacrebleu": "nmtkit generate prints translations; score them with nmtkit score --ref REF (sacreBLEU)",
    "--scoring": "nmtkit generate prints translations; score them with nmtkit score --ref REF (sacreBLEU)",
    "--skip-invalid-size-inputs-valid-test":
        "nmtkit truncates a source longer than the model accepts, with a warning; drop it",
    "--prefix-size": "use --prefix FILE: the target prefix of each --input line (docs/generate.md, Terminology)",
}

SERVE = _decoding("serve") | {
    "--max-sentences": "use --max-batch-sentences",
    "--batch-size": "use --max-batch-sentences",
    "--max-tokens": "use --max-batch-tokens",
    "--buffer-size": "nmtkit serve batches concurrent requests itself (--max-batch-sentences, --max-wait-ms); drop it",
    "--input": "nmtkit serve translates what POST /translate sends; for a file use nmtkit generate --input FILE",
    "-i": "nmtkit serve translates what POST /translate sends; for a file use nmtkit generate --input FILE",
    "--print-alignment": "nmtkit serve sends translations only; use nmtkit generate --print-alignment",
    "--score-reference": "nmtkit serve sends translations only; use nmtkit generate --score-reference",
    "--constraints": 'give each request\'s "constraints" field (docs/serve.md)',
    "--prefix-size": 'give each request\'s "prefix" field (docs/serve.md)',
}

_TORCHRUN = "torchrun starts and connects the processes (torchrun --nproc_per_node N -m nmtkit train ...); drop it"

TRAIN = {
    "-a": "use --arch (nmtkit archs lists the names)",
    "-s": _languages("train"),
    "--source-lang": _languages("train"),
    "-t": _languages("train"),
    "--target-lang": _languages("train"),
    "--task": _TASK,
    "--dataset-impl": _DATASET_IMPL,
    "--num-workers": "nmtkit loads the batches itself; drop it",
    "--user-dir": _USER_DIR,
    "--cpu": "use --device cpu",
    "--fp16": "use --precision fp16",
    "--bf16": "use --precision bf16",
    "--amp": "use --precision fp16 (autocast with dynamic loss scaling)",
    "--memory-efficient-fp16": "use --precision fp16",
    "--memory-efficient-bf16": "use --precision bf16",
    "--max-sentences": "use --batch-size",
    "--optimizer": "nmtkit always trains with Adam (--adam-betas, --adam-eps; AdamW with --weight-decay); drop it",
    "--criterion": "nmtkit always trains with label-smoothed cross-entropy (--label-smoothing EPS, 0 = none); drop it",
    "--share-all-embeddings": "use --share-embeddings all",
    "--share-decoder-input-output-embed": "use --share-embeddings decoder",
    "--encoder-embed-dim": "use --d-model (one width for encoder and decoder)",
    "--decoder-embed-dim": "use --d-model (one width for encoder and decoder)",
    "--encoder-ffn-embed-dim": "use --d-ff (one size for encoder and decoder)",
    "--decoder-ffn-embed-dim": "use --d-ff (one size for encoder and decoder)",
    "--encoder-attention-heads": "use --heads (one count for encoder and decoder)",
    "--decoder-attention-heads": "use --heads (one count for encoder and decoder)",
    "--encoder-normalize-before": "use --normalize-before (encoder and decoder)",
    "--decoder-normalize-before": "use --normalize-before (encoder and decoder)",
    "--encoder-learned-pos": "use --learned-pos (encoder and decoder)",
    "--decoder-learned-pos": "use --learned-pos (encoder and decoder)",
    "--relu-dropout": "use --activation-dropout",
    "--activation-fn": "not supported: the feed-forward network uses ReLU, as in the paper",
    "--keep-interval-updates": "use --keep-last-updates",
    "--save-interval":
        "not supported: checkpointEPOCH.pt is written at every epoch end (--no-epoch-checkpoints: never); "
        "see --save-interval-updates and --save-interval-minutes",
    "--keep-best-checkpoints": "not supported: nmtkit keeps one checkpoint_best.pt",
    "--no-last-checkpoints": "not supported: checkpoint_last.pt is what training resumes from",
    "--no-save": "not supported",
    "--restore-file": "nmtkit resumes from SAVE_DIR/checkpoint_last.pt itself; "
                      "to start from other weights use --finetune-from-model FILE",
    "--stop-time-hours": "use --max-time, e.g. --max-time 12h",
    "--validate-interval":
        "not supported: nmtkit validates at every epoch end; more often with --validate-interval-updates",
    "--disable-validation": "use --no-validate",
    "--maximize-best-checkpoint-metric":
        "nmtkit knows that higher bleu and lower loss are better; drop it",
    "--eval-bleu-args": "use --eval-bleu-beam, --eval-bleu-lenpen, --eval-bleu-max-len-a and --eval-bleu-max-len-b",
    "--eval-bleu-detok": "nmtkit detokenizes with DATA_DIR's subword model itself; drop it",
    "--eval-bleu-detok-args": "nmtkit detokenizes with DATA_DIR's subword model itself; drop it",
    "--eval-bleu-remove-bpe": _DROP_SUBWORDS,
    "--eval-tokenized-bleu": "not supported: --eval-bleu computes sacreBLEU on detokenized text",
    "--eval-bleu-print-samples": "not supported",
    "--store-ema": "use --ema-decay D (e.g. 0.9999)",
    "--log-format": "use --no-progress-bar for plain log lines; every record is also in SAVE_DIR/train_log.jsonl",
    "--log-file": "nmtkit writes SAVE_DIR/train_log.jsonl itself; drop it",
    "--wandb-project": "not supported; --tensorboard-logdir writes TensorBoard curves",
    "--skip-invalid-size-inputs-valid-test": "nmtkit skips (and counts) pairs longer than the model accepts; drop it",
    "--distributed-world-size": _TORCHRUN,
    "--distributed-rank": _TORCHRUN,
    "--distributed-init-method": _TORCHRUN,
    "--distributed-port": _TORCHRUN,
    "--ddp-backend": "nmtkit uses PyTorch DistributedDataParallel under torchrun; drop it",
}

PREPROCESS = {
    "--padding-factor": "use --pad-to-multiple",
    "--dataset-impl": "nmtkit writes its own memory-mapped shards; drop it",
    "--only-source": "not supported: nmtkit preprocess binarizes parallel text (or treebanks)",
    "--align-suffix": "not supported",
    "--dict-only": "not supported",
    "--user-dir": _USER_DIR,
}

SCORE = {
    "--sacrebleu": "sacreBLEU is nmtkit score's default (--metric bleu); drop it",
    "--ignore-case": "use --lowercase",
    "-o": "not supported: BLEU counts n-grams up to 4",
    "--order": "not supported: BLEU counts n-grams up to 4",
    "--sentence-bleu": "not supported",
    "-i": "use --sys FILE (default: stdin)",
    "--input": "use --sys FILE (default: stdin)",
    "--metrics": "use --metric with a comma list, e.g. --metric bleu,chrf,ter",
    "--test-set": "not supported: give the reference file with --ref",
    "--language-pair":
        "not needed: give the reference file with --ref (--tokenize zh, ja-mecab or ko-mecab for those targets)",
    "-b": "not supported; --json prints the scores as JSON",
    "--score-only": "not supported; --json prints the scores as JSON",
    "-f": "use --json for JSON output",
    "--format": "use --json for JSON output",
    "-w": "not supported",
    "--width": "not supported",
    "--chrf-word-order": "use --metric chrf++ (word order 2)",
    "--smooth-method": "not supported: bleu uses sacreBLEU's exp smoothing, tok-bleu none (as multi-bleu.perl)",
    "--paired-ar": "not supported; use --paired-bs (paired bootstrap resampling)",
}

AVERAGE_CHECKPOINTS = {
    "--checkpoint-upper-bound": "not supported; give the checkpoint files to average as arguments",
}

HINTS: dict[str, dict[str, str]] = {
    "preprocess": PREPROCESS,
    "train": TRAIN,
    "average-checkpoints": AVERAGE_CHECKPOINTS,
    "generate": GENERATE,
    "serve": SERVE,
    "score": SCORE,
}


def hint(command: str, option: str) -> str | None:
    """`OPTION: the nmtkit way` when OPTION is a fairseq flag `nmtkit COMMAND` lacks, else None."""
    text = HINTS.get(command, {}).get(option)
    return f"{option}: {text}" if text is not None else None
