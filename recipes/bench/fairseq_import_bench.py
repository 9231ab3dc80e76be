"""What recipes/bench/fairseq_import.sh measures (its header says how to run it).

1. `nmtkit import-fairseq` of the fairseq checkpoint, with the yardstick's data-bin dictionary
   and sentencepiece model.
2. Agreement: fairseq-generate (beam 4, --lenpen 0.6, --max-len-a 1 --max-len-b 50) run with
   --batch-size 1, where its output limit is each sentence's own (fairseq counts the source with
   its </s>: 1 x (n + 1) + 50), against `nmtkit generate --decoding fairseq` with the same beam and
   length penalty and --max-len-b 51 (nmtkit counts n tokens: the same n + 51). Compared token by
   token (the H- lines): how many of the 1000 hypotheses are identical.
3. Speed and BLEU at --batch-size 128 for both (fairseq then limits a batch by its longest source;
   the agreement of these outputs is printed too). Process wall time, the median of --runs runs.
   sacreBLEU (13a) of the sentencepiece-decoded hypotheses against test_2016_flickr.en.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import time
from pathlib import Path

SEARCH = ["--beam", "4", "--lenpen", "0.6", "--max-len-a", "1"]


def run(cmd: list, log: Path) -> float:
    """Run `cmd` (stdout to `log`); return its wall time in seconds."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        p = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"FAILED (rc={p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr[-3000:]}")
    return wall


def hypotheses(path: Path) -> dict[int, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("H-"):
            sid, _score, tokens = line.split("\t")
            out[int(sid[2:])] = tokens
    return out


def bleu(hyps: dict[int, str], refs: list[str], spm_model: Path) -> float:
    import sacrebleu
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    sys_lines = [sp.decode(hyps[i].split()) for i in range(len(refs))]
    return sacrebleu.corpus_bleu(sys_lines, [refs]).score


def agree(a: dict[int, str], b: dict[int, str]) -> int:
    return sum(a.get(i) == b.get(i) for i in a)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--anchors-dir", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    fs_bin = a.anchors_dir / "venv-fairseq" / "bin"
    data_bin = a.anchors_dir / "data-bin" / "multi30k_de_en_spm8k"
    spm_model = a.anchors_dir / "data" / "spm" / "spm8k.model"
    src = a.data / "test_2016_flickr.de.gz"
    with gzip.open(a.data / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as fh:
        refs = fh.read().splitlines()
    nm = [sys.executable, "-m", "nmtkit"]

    model, data_dir = a.work / "model.pt", a.work / "data"
    wall = run([*nm, "import-fairseq", a.ckpt, "-o", model, "--data-dir", data_dir, "--force", "-s", "de", "-t", "en",
                "--data", data_bin, "--bpe", "sentencepiece", "--sentencepiece-model", spm_model], a.work / "import.log")
    print(f"[import] {a.ckpt} -> {model}, {data_dir} ({wall:.1f} s)", file=sys.stderr)

    fairseq = [fs_bin / "fairseq-generate", data_bin, "--path", a.ckpt, "--gen-subset", "test", "-s", "de", "-t", "en",
               *SEARCH, "--max-len-b", "50", "--cpu", "--no-progress-bar"]
    nmtkit = [*nm, "generate", data_dir, "--path", model, "--input", src, "--decoding", "fairseq", *SEARCH,
              "--format", "fairseq", "-q", "--device", "cpu", "--threads", str(a.threads)]
    outs, times = {}, {}
    jobs = {"fairseq-generate, batch 1": fairseq + ["--batch-size", "1"],
            "nmtkit, --max-len-b 51": nmtkit + ["--max-len-b", "51", "--batch-size", "128"],
            "fairseq-generate, batch 128": fairseq + ["--batch-size", "128"],
            "nmtkit, batch 128": nmtkit + ["--max-len-b", "50", "--batch-size", "128"]}
    for name, cmd in jobs.items():
        runs = a.runs if "128" in name else 1
        log = a.work / (name.replace(" ", "_").replace(",", "").replace("-", "") + ".out")
        times[name] = statistics.median(run(cmd, log) for _ in range(runs))
        outs[name] = hypotheses(log)
        print(f"[decode] {name}: {len(outs[name])} hypotheses, {times[name]:.1f} s", file=sys.stderr)

    same = agree(outs["fairseq-generate, batch 1"], outs["nmtkit, --max-len-b 51"])
    same128 = agree(outs["fairseq-generate, batch 128"], outs["nmtkit, batch 128"])
    n = len(refs)
    print(f"agreement (per-sentence limit n+51 on both): {same} of {n} hypotheses identical")
    print(f"agreement at batch 128 (fairseq limits a batch by its longest source): {same128} of {n}")
    print("| decoder | BLEU | wall s | sent/s |")
    print("| --- | --- | --- | --- |")
    for name in jobs:
        print(f"| {name} | {bleu(outs[name], refs, spm_model):.2f} | {times[name]:.1f} | {n / times[name]:.1f} |")
    ratio = times["fairseq-generate, batch 128"] / times["nmtkit, batch 128"]
    print(f"nmtkit / fairseq-generate decode speed at batch 128 (process wall time, {a.threads} threads): {ratio:.2f}x")


if __name__ == "__main__":
    main()
