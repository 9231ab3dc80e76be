#!/usr/bin/env bash
# Start-up of `nmtkit generate` on an export directory, against the import of its runtime alone
# (docs/export.md, Start-up): an untrained tiny model is exported (ONNX, CTranslate2: those whose
# runtime is installed), then, RUNS times each, in turn,
#   A: nmtkit generate --path EXPORT --input -     (empty input: the whole cost before the first sentence)
#   B: python -c "import numpy, RUNTIME"            (the floor: what any program using that runtime pays)
# and prints the median CPU seconds (user + system, the kernel's accounting of each finished
# process) and wall seconds of each, and the median of the A/B ratios taken pair by pair (pairs
# keep the ratio meaningful while a shared machine's speed drifts).
# nmtkit's modules are byte-compiled first (python -m compileall), as pip does when it installs a
# package and as the runtime's own were: with PYTHONDONTWRITEBYTECODE=1 in the environment (set in
# many containers) an editable install is otherwise compiled from source in every timed run.
#
#   bash recipes/bench/startup.sh
#
#   RUNS=15               timed pairs per format (after one untimed pair)
#   BENCH_DIR=DIR         scratch folder (default: ./runs/bench_startup)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
. recipes/lib/env.sh
nmtkit_env onnx,ctranslate2
export OMP_NUM_THREADS=1
python - "${BENCH_DIR:-$(pwd)/runs/bench_startup}" "${RUNS:-15}" <<'EOF'
import importlib.util
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from nmtkit.checkpoints import save_checkpoint
from nmtkit.cli import main
from nmtkit.data.manifest import load_dictionaries
from nmtkit.data.preprocess import PreprocessConfig, preprocess
from nmtkit.models import ArchConfig, Transformer

work, runs = Path(sys.argv[1]), int(sys.argv[2])
RUNTIMES = {"onnx": ("onnxruntime", "onnx"), "ctranslate2": ("ctranslate2",)}


def tiny_checkpoint(root: Path) -> tuple[Path, Path]:
    """A word-mapping data directory (no subword model) and an untrained 1+1-layer checkpoint of it."""
    rng = random.Random(0)
    for split, n in (("train", 40), ("valid", 4)):
        lines = [" ".join(f"w{rng.randrange(8)}" for _ in range(rng.randint(2, 10))) for _ in range(n)]
        (root / f"{split}.de").write_text("\n".join(lines) + "\n")
        (root / f"{split}.en").write_text("\n".join(lines).upper() + "\n")
    data = root / "bin"
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(root / "train"),
                                validpref=[str(root / "valid")], destdir=str(data), bpe="none", joined_dictionary=True))
    src, tgt = load_dictionaries(data)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    torch.manual_seed(0)
    ckpt = root / "tiny.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": Transformer(cfg, len(src), len(tgt)).state_dict(),
                     "dictionaries": {"src_sha256": src.sha256, "tgt_sha256": tgt.sha256, "src_lang": "de",
                                      "tgt_lang": "en"}, "update": 1, "epoch": 1}, ckpt)
    return data, ckpt


def timed(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of `cmd`, empty stdin, its output thrown away."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode()
    p.stderr.close()
    if p.returncode != 0:
        sys.exit(f"[bench] {' '.join(cmd)} failed: {err.strip()}")
    return usage.ru_utime + usage.ru_stime, wall


def export(fmt: str, data: Path, ckpt: Path) -> Path:
    out = work / f"tiny-{fmt}"
    try:
        main(["export", str(data), "--path", str(ckpt), "--format", fmt, "--output", str(out), "--force"])
    except SystemExit as e:
        if e.code != 0:
            sys.exit(f"[bench] nmtkit export --format {fmt} failed")
    return out


shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
data, ckpt = tiny_checkpoint(work)
nmtkit = shutil.which("nmtkit") or sys.exit("[bench] the nmtkit command is not on PATH")
package = importlib.util.find_spec("nmtkit").submodule_search_locations[0]
if subprocess.run([sys.executable, "-m", "compileall", "-q", package], stdout=subprocess.DEVNULL).returncode != 0:
    sys.exit(f"[bench] python -m compileall {package} failed")
missing = {f: m for f, m in RUNTIMES.items() if any(importlib.util.find_spec(x) is None for x in m)}
folders = {fmt: export(fmt, data, ckpt) for fmt in RUNTIMES if fmt not in missing}
print(f"{'export':<12} {'A cpu s':>8} {'B cpu s':>8} {'A/B cpu':>8} {'A wall s':>9} {'B wall s':>9} {'A/B wall':>9}")
for fmt, modules in RUNTIMES.items():
    if fmt in missing:
        print(f"{fmt:<12} not installed ({', '.join(modules)})")
        continue
    folder = folders[fmt]
    a_cmd = [nmtkit, "generate", "--path", str(folder), "--input", "-"]
    b_cmd = [sys.executable, "-c", f"import numpy, {modules[0]}"]
    pairs = [(timed(a_cmd), timed(b_cmd)) for _ in range(runs + 1)][1:]  # the first pair warms the file cache
    med = statistics.median
    print(f"{fmt:<12} {med(a[0] for a, _ in pairs):8.3f} {med(b[0] for _, b in pairs):8.3f} "
          f"{med(a[0] / b[0] for a, b in pairs):8.2f} {med(a[1] for a, _ in pairs):9.3f} "
          f"{med(b[1] for _, b in pairs):9.3f} {med(a[1] / b[1] for a, b in pairs):9.2f}")
EOF
