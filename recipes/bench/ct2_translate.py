"""CTranslate2's side of recipes/bench/generate.sh: translate raw text with an `nmtkit export`
directory through CTranslate2's own Python API, timed like `nmtkit generate`.

The input is segmented with the data directory's subword model and the output detokenized with
it (what `nmtkit generate --input` does), so both sides see the same subword ids; CTranslate2
does its own batching (`max_batch_size`, sorted by length), search and threading. Prints one JSON
line: load seconds (model only), translate seconds (translate_batch alone), sentences, target
tokens (subwords without </s>). Empty input lines give empty output lines, as in nmtkit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="an `nmtkit export --format ctranslate2` directory")
    ap.add_argument("--data", required=True, help="the data directory (its subword model segments the input)")
    ap.add_argument("--src-lang", required=True)
    ap.add_argument("--tgt-lang", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--compute-type", default="float32")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda needs CTranslate2's CUDA libraries (its PyPI wheel: CUDA 12's cuBLAS)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    ap.add_argument("--max-len", type=int, default=256, help="max_decoding_length")
    ap.add_argument("--use-vmap", action="store_true", help="apply the export's vocabulary map (vmap.txt)")
    a = ap.parse_args()
    if not Path(a.model, "model.bin").is_file():
        from nmtkit.errors import UserError

        raise UserError(f"--model {a.model}: not a CTranslate2 export (no model.bin)")

    t0 = time.perf_counter()
    import ctranslate2

    from nmtkit.data.subwords import load_subword_model

    src_sp, tgt_sp = load_subword_model(a.data, a.src_lang), load_subword_model(a.data, a.tgt_lang)
    translator = ctranslate2.Translator(a.model, device=a.device, compute_type=a.compute_type,
                                        intra_threads=a.threads, inter_threads=1)
    load_s = time.perf_counter() - t0
    with open(a.input, encoding="utf-8") as fh:
        lines = [line.rstrip("\n") for line in fh]
    todo = [i for i, line in enumerate(lines) if line.strip()]
    tokens = [src_sp.encode(lines[i]) for i in todo]
    t1 = time.perf_counter()
    results = translator.translate_batch(tokens, beam_size=a.beam, length_penalty=a.lenpen,
                                         max_batch_size=a.batch_size, max_decoding_length=a.max_len,
                                         use_vmap=a.use_vmap) if tokens else []
    translate_s = time.perf_counter() - t1
    out = [""] * len(lines)
    n_tok = 0
    for i, r in zip(todo, results):
        hyp = r.hypotheses[0]
        n_tok += len(hyp)
        out[i] = tgt_sp.decode(hyp)
    from nmtkit.io import atomic_write

    with atomic_write(a.output) as fh:  # a complete file or none: the bench reads it back
        fh.write("".join(line + "\n" for line in out))
    json.dump({"load_s": load_s, "translate_s": translate_s, "sentences": len(lines), "tokens": n_tok}, sys.stdout)
    print()


if __name__ == "__main__":
    from nmtkit.errors import UserError

    try:
        main()
    except (UserError, OSError) as e:  # a data directory that is not one, a missing file: one line
        sys.exit(f"ct2_translate.py: {e}")
