"""transformers' generate on a Hugging Face export against `nmtkit generate` (docs/export.md).

Exports CKPT with `nmtkit export --format huggingface`, then translates the test set with nmtkit
(fairseq's length penalty and stopping rule, the rules transformers has) and with transformers'
MarianMTModel.generate on the export (its generation_config.json, nmtkit's per-sentence output
limit as max_new_tokens; inputs of one length searched together), greedy and beam, and prints:
the lines whose hypotheses agree, the lines that differ (named, with whether a hypothesis reached
the output limit), and what transformers gives on those with nmtkit's rule at the limit (only
</s>, with its own log-probability; transformers' forced </s> scores 0), plus the search times.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import torch


def read(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


class EndAtTheLimit:
    """nmtkit's rule at the output limit: only </s>, with the model's own log-probability."""

    def __init__(self, eos: int, last: int):
        self.eos, self.last = eos, last

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] == self.last:
            keep = scores[:, self.eos].clone()
            scores[:] = -float("inf")
            scores[:, self.eos] = keep
        return scores


def hf_search(model, enc: list[list[int]], beam: int, max_len_b: int, nmtkit_limit: bool = False) -> list[list[int]]:
    """Hypotheses (ids, without the start and </s>) of transformers' generate, per input."""
    from transformers import LogitsProcessorList

    eos = model.generation_config.eos_token_id
    out: list[list[int] | None] = [None] * len(enc)
    for n in sorted({len(e) for e in enc}):
        rows = [i for i, e in enumerate(enc) if len(e) == n]
        for start in range(0, len(rows), 64):
            part = rows[start:start + 64]
            ids = torch.tensor([enc[i] for i in part])
            kw = {}
            if nmtkit_limit:
                kw = dict(forced_eos_token_id=None,
                          logits_processor=LogitsProcessorList([EndAtTheLimit(eos, 1 + (n - 1) + max_len_b)]))
            with torch.inference_mode():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=beam,
                                     max_new_tokens=(n - 1) + max_len_b + 1, do_sample=False, **kw)
            for i, row in zip(part, gen.tolist()):
                row = row[1:]
                out[i] = row[: row.index(eos)] if eos in row else [t for t in row if t != model.config.pad_token_id]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--lenpen", type=float, default=0.6)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import MarianMTModel, MarianTokenizer

    from nmtkit import Translator
    from nmtkit.backends.export import ExportOptions, export

    out = Path(args.work) / "hf"
    export(ExportOptions(data_dir=args.data, path=args.ckpt, output=str(out), format="huggingface", force=True))
    texts = read(args.src)
    tok = MarianTokenizer.from_pretrained(out)
    model = MarianMTModel.from_pretrained(out).eval()
    native = Translator.load(args.ckpt, args.data, threads=args.threads, lenpen=args.lenpen, lenpen_form="fairseq",
                             early_stop="beam", warn=lambda m: None)
    items = native.encode(texts)
    enc = [tok(t).input_ids for t in texts]
    same_ids = sum(e == item.ids.tolist() + [model.config.eos_token_id] for e, item in zip(enc, items))
    print(f"lines: {len(texts)}; source ids identical (MarianTokenizer vs nmtkit): {same_ids}")
    for beam in (1, args.beam):
        t0 = time.perf_counter()
        want = [r[0].hypothesis.tokens for r in native.translate_nbest(texts, beam=beam)]
        t1 = time.perf_counter()
        got = hf_search(model, enc, beam, 50)
        t2 = time.perf_counter()
        differ = [i for i in range(len(texts)) if got[i] != want[i]]
        print(f"beam {beam}: identical hypotheses {len(texts) - len(differ)}/{len(texts)}; "
              f"nmtkit {t1 - t0:.1f}s, transformers {t2 - t1:.1f}s ({args.threads} thread(s))")
        if differ:
            fixed = hf_search(model, [enc[i] for i in differ], beam, 50, nmtkit_limit=True)
            for i, f in zip(differ, fixed):
                limit = len(items[i].ids) + 50
                at = [name for name, h in (("nmtkit", want[i]), ("transformers", got[i])) if len(h) == limit]
                print(f"  line {i + 1}: lengths nmtkit {len(want[i])} / transformers {len(got[i])} "
                      f"(limit {limit}; at the limit: {', '.join(at) or 'neither'}); with nmtkit's rule at the "
                      f"limit transformers gives {'the same' if f == want[i] else 'still another'} hypothesis")
                print(f"    nmtkit:       {native.tgt_subword.decode(native.tgt_dict.string(want[i]))}")
                print(f"    transformers: {tok.decode(got[i], skip_special_tokens=True)}")


if __name__ == "__main__":
    main()
