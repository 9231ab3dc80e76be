"""One sitting of GPU figures for nmtkit, every number into one JSON file (recipes/bench/gpu.sh runs it).

    python recipes/bench/gpu_bench.py [--out DIR] [--device auto|cuda|cpu] [--tiny] [--budget SECONDS]

Stages, in this order, each in its own process(es) under its own time limit, so that a stage that
hangs, crashes or runs out of memory is recorded as such and the next one still runs:

  env             torch, CUDA and driver versions, the GPU's name and memory, and a GEMM rate (bf16 on
                  a GPU; fp32 on a CPU, which may lack fast bf16)
                  measured on the spot (8192^3 matmuls timed with CUDA events; a small size on CPU)
  train_step      nmtkit train's update (forward under bf16 autocast, label-smoothed loss, backward,
                  gradient norm, fused AdamW) of transformer_base and transformer_big, eager and
                  torch.compile'd (dynamic shapes, as `nmtkit train --compile`), at growing batch
                  sizes (8k ... 128k target tokens) until one runs out of memory: target tokens/s,
                  MFU against the GEMM rate of `env` and against the datasheet peak, peak memory
                  (recipes/bench/model.py --step train does the measuring)
  quickstart      the quickstart's pipeline on Multi30k De->En with the quickstart's model:
                  preprocess, `nmtkit train` for a fixed wall-clock time (--max-time; data loading,
                  validation, logging and checkpoints included), average-checkpoints, generate (beam
                  4, batch 128) and sacreBLEU: wall time of every step, updates, tokens/s and BLEU
  time_to_bleu    time to quality: `nmtkit train` of the quickstart's model on its data directory,
                  validated on test_2016_flickr (--valid-subset test) with --eval-bleu (beam 4,
                  fairseq's decoding) every few updates and at epoch ends, stopped by --target-bleu
                  35.0 (or its time limit):
                  the training seconds until the target was reached (the log's `end` record) and
                  the process's wall time; then the stopping checkpoint translates the test set
                  with fairseq's decoding (--decoding fairseq, beam 4) and sacreBLEU confirms it
  generate_speed  `nmtkit generate` at batch 128, beam 4, fp32 and bf16, on the test sources
                  repeated: sentences/s and tokens/s from generate's own summary line
  cuda_tests      python -m pytest tests/test_cuda.py -v: pass/fail/skip counts ("absent" without it;
                  counted from the finished tests when it is stopped at its time limit)

The whole run has a budget (--budget, default 560 s on a GPU): every step's time limit is cut so
that the steps after it keep their minimum share, and a step left without its minimum is recorded
as skipped. The JSON (rewritten after every step, so a run killed from outside still leaves the
stages done so far) and a log of every command and its output go to --out (default
$GPU_BENCH_OUT, else $OUT, else runs/gpu_bench); the work files (data, checkpoints) go to --work
(default: a fresh folder under the system's temporary directory), never to --out.

--tiny (for CPU, with --device cpu): the same stages on transformer_tiny, a 2000-pair slice of
Multi30k, a few seconds of training and the `eager` torch.compile backend (dynamo only, no kernel
generation), in about a minute on one CPU thread; tests/test_gpu_bench.py runs it.

Data: NMTKIT_DATA, a folder holding train/val/test_2016_flickr .{de,en}.gz (default:
./.gpu_data/data/multi30k when it exists, else ../shared/data/multi30k). This script imports no
torch itself; it runs every command with the interpreter that runs it (sys.executable).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL_PY = ROOT / "recipes" / "bench" / "model.py"
WORK_MARKER = ".nmtkit-gpu-bench"
# The CUDA tests come last: they passed on every GPU run so far and are counted as far as they
# get, while the figures before them would be lost to a budget spent on the tests first.
STAGES = ("env", "train_step", "quickstart", "time_to_bleu", "generate_speed", "cuda_tests")
M30K = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # split -> Multi30k file stem
GEN_SUMMARY = re.compile(
    r"(?:translated|scored) ([\d,]+) sentences \(([\d,]+) target tokens\) in ([\d.]+)s: ([\d,.]+) sentences/s, "
    r"([\d,.]+) tokens/s; (?:search|scoring) only ([\d.]+)s: ([\d,.]+) sentences/s, ([\d,.]+) tokens/s")
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)\b")
PYTEST_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")  # pytest -v


# ----------------------------------------------------------------------------------- settings --

@dataclass
class Settings:
    """What differs between the GPU run and --tiny (limits in seconds of wall-clock time)."""

    budget: float
    gemm_n: int
    archs: tuple[str, ...]
    dtype: str
    tokens: tuple[int, ...]
    length: int
    vocab: int
    steps: int
    warmup: int
    compile_backend: str
    train_step_limits: dict  # eager / compile -> (limit, minimum)
    train_lines: int  # 0 = all
    valid_lines: int
    test_lines: int
    vocab_size: int
    arch_flags: list[str]
    lr: str
    warmup_updates: int
    max_tokens: int
    train_seconds: float
    log_interval: int
    precision: str
    gen_repeat: int
    gen_precisions: tuple[str, ...]
    threads: int
    target_bleu: float  # time_to_bleu: the BLEU that stops training
    ttq_interval: int  # time_to_bleu: validate every N updates (and at epoch ends)
    limits: dict = field(default_factory=dict)  # step -> (limit, minimum)


def gpu_settings(train_seconds: float | None) -> Settings:
    # Measured (seconds) on one H100: env 4, cuda_tests 124-151 (tests/test_cuda.py, 31 tests;
    # 164 on an H200), train_step eager 13 (base) + 18 (big); compiled: cold inductor compilation
    # of the training step with dynamic shapes takes 95 (base) and 83 (big), so each compiled run
    # gets 110 and measures the first one or two sizes; quickstart 48, generate_speed 2 x 7.
    # time_to_bleu (not yet run on a GPU): at most 100 s of training (the target is 60 s) with
    # its start-up, so that about 90-110 s remain for the CUDA tests, which need 124-164.
    t = 30.0 if train_seconds is None else train_seconds
    return Settings(
        budget=560, gemm_n=8192, archs=("transformer_base", "transformer_big"), dtype="bf16",
        tokens=(8192, 16384, 32768, 65536, 131072), length=32, vocab=37000, steps=10, warmup=3,
        compile_backend="inductor", train_step_limits={"eager": (35, 15), "compile": (110, 45)},
        train_lines=0, valid_lines=0, test_lines=0, vocab_size=8000,
        # the quickstart's model (recipes/quickstart.sh): transformer_base with 3+3 layers, d_model
        # 256, 4 heads, d_ff 1024, all embeddings shared; its schedule and batch size
        arch_flags=["--arch", "transformer_base", "--encoder-layers", "3", "--decoder-layers", "3",
                    "--d-model", "256", "--d-ff", "1024", "--heads", "4", "--share-embeddings", "all",
                    "--dropout", "0.1"],
        lr="1e-3", warmup_updates=400, max_tokens=2048, train_seconds=t, log_interval=50, precision="bf16",
        gen_repeat=4, gen_precisions=("fp32", "bf16"), threads=min(os.cpu_count() or 1, 8),
        target_bleu=35.0, ttq_interval=100,  # the quickstart's updates take ~16 ms: a validation every ~2 s
        limits={"env": (45, 15), "cuda_tests": (180, 30), "data": (20, 5), "preprocess": (45, 15),
                "train": (t + 45, t + 15), "average": (25, 10), "generate": (40, 15), "score": (20, 5),
                "ttq_train": (115, 40), "ttq_generate": (30, 10), "ttq_score": (20, 5),
                "generate_speed": (30, 10)},
    )


def tiny_settings(train_seconds: float | None) -> Settings:
    t = 6.0 if train_seconds is None else train_seconds
    return Settings(
        budget=300, gemm_n=256, archs=("transformer_tiny",), dtype="fp32", tokens=(512, 1024), length=16,
        vocab=1000, steps=3, warmup=1, compile_backend="eager",
        train_step_limits={"eager": (60, 10), "compile": (60, 10)},
        train_lines=2000, valid_lines=200, test_lines=100, vocab_size=1000,
        arch_flags=["--arch", "transformer_tiny"], lr="1e-3", warmup_updates=10, max_tokens=1024,
        train_seconds=t, log_interval=10, precision="fp32", gen_repeat=1, gen_precisions=("fp32", "bf16"),
        threads=1, target_bleu=0.1, ttq_interval=10,  # transformer_tiny in seconds: a token target
        limits={"env": (60, 10), "cuda_tests": (120, 10), "data": (20, 5), "preprocess": (90, 10),
                "train": (t + 60, t + 10), "average": (30, 5), "generate": (60, 10), "score": (30, 5),
                "ttq_train": (t + 60, t + 10), "ttq_generate": (60, 10), "ttq_score": (30, 5),
                "generate_speed": (60, 10)},
    )


# -------------------------------------------------------------------------------- the runner --

class Budget:
    """The run's deadline, and how much of what is left one step may use."""

    def __init__(self, seconds: float):
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allot(self, limit: float, keep: float) -> float:
        """The time limit of a step: its own, cut so that `keep` seconds remain for what follows."""
        return max(0.0, min(limit, self.left() - keep))


class Bench:
    def __init__(self, a: argparse.Namespace, s: Settings):
        self.a, self.s = a, s
        self.out, self.work = Path(a.out), Path(a.work)
        self.skip = set(a.skip)
        self.py = sys.executable
        self.budget = Budget(a.budget or s.budget)
        self.log_fh = open(self.out / "gpu_bench.log", "a", encoding="utf-8")  # noqa: SIM115 - closed by main()
        self.result: dict = {"schema": 1, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "tiny": a.tiny, "device_requested": a.device, "budget_s": a.budget or s.budget,
                             "host": platform.node(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                             "stages": {}}
        self.device = "cpu" if a.device == "cpu" else a.device  # auto is resolved by the env stage
        self.gemm_tflops: float | None = None
        self.data_dir: Path | None = None
        self.model_ckpt: Path | None = None
        self.raw: Path | None = None

    # ---- output
    def say(self, msg: str) -> None:
        line = f"[gpu-bench {time.monotonic() - self.budget.start:6.1f}s] {msg}"
        print(line, flush=True)
        self.log(line)

    def log(self, text: str) -> None:
        self.log_fh.write(text if text.endswith("\n") else text + "\n")
        self.log_fh.flush()

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.budget.start, 1)
        path = self.out / "gpu_bench.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.result, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    # ---- processes
    def env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(os.cpu_count() or 1))
        if self.a.tiny:
            env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def run(self, name: str, cmd: list[str], timeout: float, cwd: Path | None = None) -> dict:
        """Run `cmd` (its output into the log) for at most `timeout` s; -> rc, wall_s, timed_out, output."""
        self.log(f"\n===== {name}: {' '.join(map(str, cmd))}  (time limit {timeout:.0f}s)")
        t0 = time.monotonic()
        proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd or ROOT, env=self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        chunks: list[str] = []

        def pump() -> None:
            for raw in iter(proc.stdout.readline, b""):
                text = raw.decode("utf-8", "replace")
                chunks.append(text)
                self.log_fh.write(text)
                self.log_fh.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            self._stop(proc)
        try:  # what the command left running in its group (worker processes) must not outlive it
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        reader.join(timeout=10)
        wall = time.monotonic() - t0
        self.log(f"===== {name}: exit {proc.returncode}{' (time limit reached)' if timed_out else ''} "
                 f"after {wall:.1f}s")
        return {"rc": proc.returncode, "wall_s": round(wall, 2), "timed_out": timed_out, "output": "".join(chunks)}

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        """SIGTERM to the command's process group (nmtkit train then saves and exits), SIGKILL after 5 s."""
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def step(self, name: str, cmd: list[str], keep: float, limit: tuple[float, float] | None = None) -> dict:
        """A limited command as one step of a stage: -> a record with status ok/failed/timeout/skipped."""
        lim, minimum = limit or self.s.limits[name]
        timeout = self.budget.allot(lim, keep)
        if timeout < minimum:
            self.say(f"{name}: skipped, {self.budget.left():.0f}s left and {keep:.0f}s kept for later steps")
            return {"status": "skipped", "reason": f"no time left ({self.budget.left():.0f}s, needs {minimum}s)"}
        r = self.run(name, cmd, timeout)
        rec = {"status": "timeout" if r["timed_out"] else ("ok" if r["rc"] == 0 else "failed"), "rc": r["rc"],
               "wall_s": r["wall_s"], "time_limit_s": round(timeout, 1)}
        if rec["status"] != "ok":
            rec["output_tail"] = r["output"][-2000:]
        rec["_output"] = r["output"]
        self.say(f"{name}: {rec['status']} in {r['wall_s']:.1f}s")
        return rec

    def score(self, name: str, hyp: Path, keep: float) -> dict:
        """`nmtkit score` of `hyp` against the test references as step `name`: its record, with
        `bleu` and `score_line` read from the output (failed without a 'BLEU = ' line)."""
        sc = self.step(name, [self.py, "-m", "nmtkit", "score", "--sys", hyp, "--ref", self.raw / "test.en.gz",
                              "--metric", "bleu"], keep=keep)
        m = re.search(r"^BLEU = (\d+\.\d+).*$", sc.pop("_output", ""), re.MULTILINE)
        if m:
            sc["bleu"], sc["score_line"] = float(m.group(1)), m.group(0)
        elif sc["status"] == "ok":
            sc["status"], sc["reason"] = "failed", "no 'BLEU = ' line in the output"
        return sc

    def keep_after(self, stage: str) -> float:
        """The minimum time the stages after `stage` need."""
        s, out = self.s, 0.0
        later = STAGES[STAGES.index(stage) + 1:]
        for st in later:
            if st in self.skip:
                continue
            if st == "cuda_tests":
                out += s.limits["cuda_tests"][1]
            elif st == "train_step":
                out += len(s.archs) * (s.train_step_limits["eager"][1] + s.train_step_limits["compile"][1])
            elif st == "quickstart":
                out += sum(s.limits[k][1] for k in ("data", "preprocess", "train", "average", "generate", "score"))
            elif st == "time_to_bleu":
                out += sum(s.limits[k][1] for k in ("ttq_train", "ttq_generate", "ttq_score"))
            elif st == "generate_speed":
                out += len(s.gen_precisions) * s.limits["generate_speed"][1]
        return out

    # ------------------------------------------------------------------------------- stages --
    def main(self) -> int:
        a = self.a
        self.say(f"out {self.out}, work {self.work}, budget {self.budget.left():.0f}s, python {self.py}"
                 f"{', tiny' if a.tiny else ''}")
        for stage in STAGES:
            if stage in self.skip:
                self.result["stages"][stage] = {"status": "skipped", "reason": "--skip"}
                continue
            self.say(f"--- {stage}")
            t0 = time.monotonic()
            try:
                rec = getattr(self, f"stage_{stage}")()
            except Exception as e:  # noqa: BLE001 - a bug in one stage must not lose the others
                rec = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
                self.say(f"{stage}: driver error {type(e).__name__}: {e}")
            rec["stage_wall_s"] = round(time.monotonic() - t0, 2)
            if isinstance(rec.get("steps"), dict):
                rec["wall_s"] = {k: v.get("wall_s") for k, v in rec["steps"].items()}
            self.result["stages"][stage] = strip_private(rec)
            self.save()
        self.result["summary"] = self.summary()
        self.save()
        self.print_summary()
        done = ("ok", "absent", "not_reached")  # a target not reached in time is a figure, not a failure
        bad = [k for k, v in self.result["stages"].items() if v.get("status") not in done
               and not (v.get("status") == "skipped" and v.get("reason") == "--skip")]
        return 1 if bad else 0

    def stage_env(self) -> dict:
        probe = self.work / "env.json"
        cmd = [self.py, __file__, "--probe-env", str(probe), "--device", self.a.device,
               "--gemm-n", str(self.s.gemm_n)]
        rec = self.step("env", cmd, keep=self.keep_after("env"))
        if probe.exists():
            rec.update(json.loads(probe.read_text("utf-8")))
        if rec.get("device"):
            self.device = rec["device"]
        elif self.a.device == "auto":
            self.device = "cpu"
        self.gemm_tflops = (rec.get("gemm") or {}).get("tflops")
        if rec["status"] == "ok" and not self.gemm_tflops:
            rec["status"] = "failed"
        if self.device == "cpu" and not self.a.tiny:
            self.say("env: no CUDA device; the full-size stages will mostly run out of time (use --tiny on CPU)")
        return rec

    def stage_cuda_tests(self) -> dict:
        test = Path(self.a.cuda_tests)
        test = test if test.is_absolute() else ROOT / test
        if not test.exists():
            self.say(f"cuda_tests: {self.a.cuda_tests} is absent")
            return {"status": "absent", "file": self.a.cuda_tests}
        # -v: one line per finished test, so a run stopped at its time limit still counts them
        cmd = [self.py, "-m", "pytest", str(test), "-v", "-rfEs", "--durations=10", "-p", "no:cacheprovider"]
        rec = self.step("cuda_tests", cmd, keep=self.keep_after("cuda_tests"))
        rec.update(parse_pytest(rec.pop("_output", "")))
        if rec["status"] == "failed" and rec.get("rc") == 5:  # pytest: no tests collected
            rec["status"] = "ok"
        return rec

    def stage_train_step(self) -> dict:
        s = self.s
        runs, results = [], []
        lim = s.train_step_limits
        order = [(arch, False) for arch in s.archs] + [(arch, True) for arch in s.archs]
        for i, (arch, comp) in enumerate(order):
            later = sum(lim["compile" if c else "eager"][1] for _, c in order[i + 1:])
            kind = "compile" if comp else "eager"
            jl = self.work / f"train_step_{arch}_{kind}.jsonl"
            jl.unlink(missing_ok=True)
            cmd = [self.py, MODEL_PY, "--arch", arch, "--device", self.device, "--dtype", s.dtype,
                   "--step", "train", "--tokens", ",".join(map(str, s.tokens)), "--length", str(s.length),
                   "--vocab", str(s.vocab), "--steps", str(s.steps), "--warmup", str(s.warmup), "--json", jl]
            if self.device == "cpu":
                cmd += ["--threads", str(s.threads)]
            if comp:
                cmd += ["--compile", "--dynamic", "--compile-backend", s.compile_backend]
            if self.gemm_tflops:
                cmd += ["--peak-tflops", f"{self.gemm_tflops:.4g}"]
            rec = self.step(f"train_step {arch} {kind}", cmd, keep=self.keep_after("train_step") + later,
                            limit=lim[kind])
            rec.pop("_output", None)
            sizes = [json.loads(ln) for ln in jl.read_text("utf-8").splitlines() if ln.strip()] if jl.exists() else []
            ok = [r for r in sizes if r.get("status") == "ok"]
            best = max(ok, key=lambda r: r["max_tokens"]) if ok else None
            oom = next((r["max_tokens"] for r in sizes if r.get("status") == "oom"), None)
            run = {"arch": arch, "compile": comp, **{k: rec[k] for k in rec if k in ("status", "wall_s", "reason",
                                                                                       "time_limit_s", "output_tail")},
                   "largest_fitting_max_tokens": best["max_tokens"] if best else None,
                   "first_oom_max_tokens": oom,
                   "search_complete": bool(oom) or (len(ok) == len(s.tokens)),
                   "sizes": sizes}
            if best:
                for k in ("tgt_tok_per_s", "ms_per_step", "tflops", "mfu_measured", "mfu_datasheet", "peak_mem_mib",
                          "peak_reserved_mib", "peak_rss_mb", "warmup_s", "params"):
                    if k in best:
                        run[k] = best[k]
                # a size that fits but was cut by the time limit leaves a partial search: still a result
                if run["status"] == "timeout":
                    run["status"] = "partial"
            elif run["status"] == "ok":
                run["status"] = "failed"
            runs.append(run)
            results.append(run["status"])
            if best:
                mfu = run.get("mfu_measured")
                self.say(f"train_step {arch} {kind}: max-tokens {best['max_tokens']}: {best['tgt_tok_per_s']:,.0f} "
                         f"tgt tok/s" + (f", MFU {100 * mfu:.1f}% of measured GEMM" if mfu else "")
                         + (f", peak {best['peak_mem_mib']:,.0f} MiB" if "peak_mem_mib" in best else ""))
        status = "ok" if all(r == "ok" for r in results) else ("partial" if any(r in ("ok", "partial")
                                                                                 for r in results) else "failed")
        return {"status": status, "gemm_tflops_measured": self.gemm_tflops, "runs": runs}

    def _quickstart_data(self) -> dict:
        s = self.s
        src = Path(os.environ.get("NMTKIT_DATA") or default_data())
        raw = self.work / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        n = {"train": s.train_lines, "valid": s.valid_lines, "test": s.test_lines}
        t0 = time.monotonic()
        missing = [f"{M30K[sp]}.{lang}.gz" for sp in M30K for lang in ("de", "en")
                   if not (src / f"{M30K[sp]}.{lang}.gz").exists()]
        if missing:
            return {"status": "failed", "reason": f"NMTKIT_DATA={src} lacks {', '.join(missing)}"}
        lines = {}
        for split, stem in M30K.items():
            for lang in ("de", "en"):
                with gzip.open(src / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as fh:
                    text = fh.readlines()
                if n[split]:
                    text = text[: n[split]]
                lines[split] = len(text)
                with gzip.open(raw / f"{split}.{lang}.gz", "wt", encoding="utf-8") as fo:
                    fo.writelines(text)
        self.raw = raw
        return {"status": "ok", "source": str(src), "lines": lines, "wall_s": round(time.monotonic() - t0, 2)}

    def stage_quickstart(self) -> dict:
        s, py, w = self.s, self.py, self.work
        keep_stage = self.keep_after("quickstart")
        order = ["data", "preprocess", "train", "average", "generate", "score"]

        def keep(step: str) -> float:
            return keep_stage + sum(s.limits[k][1] for k in order[order.index(step) + 1:])

        steps: dict = {}
        rec = {"status": "failed", "steps": steps, "arch_flags": s.arch_flags, "train_seconds": s.train_seconds,
               "precision": s.precision, "max_tokens": s.max_tokens}
        steps["data"] = self._quickstart_data()
        self.say(f"data: {steps['data']['status']} {steps['data'].get('lines', steps['data'].get('reason'))}")
        if steps["data"]["status"] != "ok":
            return rec
        data, ckpt = w / "data-bin", w / "checkpoints"
        dev = ["--device", self.device] + (["--threads", str(s.threads)] if self.device == "cpu" else [])
        steps["preprocess"] = self.step("preprocess", [
            py, "-m", "nmtkit", "preprocess", "--source-lang", "de", "--target-lang", "en",
            "--trainpref", self.raw / "train", "--validpref", self.raw / "valid", "--testpref", self.raw / "test",
            "--destdir", data, "--bpe", "sentencepiece", "--vocab-size", str(s.vocab_size), "--joined-dictionary",
            "--workers", str(s.threads), "--force"], keep=keep("preprocess"))
        steps["preprocess"].pop("_output", None)
        if steps["preprocess"]["status"] != "ok":
            return rec
        self.data_dir = data
        save_minutes = max(s.train_seconds / 6, 1.0) / 60  # about 6 timed checkpoints, the last 5 averaged
        tr = self.step("train", [
            py, "-m", "nmtkit", "train", data, *s.arch_flags, "--save-dir", ckpt,
            "--lr-scheduler", "inverse_sqrt", "--lr", s.lr, "--warmup-updates", str(s.warmup_updates),
            "--max-tokens", str(s.max_tokens), "--max-time", f"{s.train_seconds:g}",
            "--save-interval-minutes", f"{save_minutes:.6f}", "--keep-last-updates", "5",
            "--no-epoch-checkpoints", "--seed", "1", "--log-interval", str(s.log_interval), "--no-progress-bar",
            "--precision", s.precision, *dev], keep=keep("train"))
        tr.pop("_output", None)
        tr.update(read_train_log(ckpt / "train_log.jsonl"))
        if (ckpt / "train_log.jsonl").exists():
            shutil.copyfile(ckpt / "train_log.jsonl", self.out / "train_log.jsonl")
        steps["train"] = tr
        self.say(f"train: {tr.get('updates')} updates, {tr.get('epochs_done')} epochs, "
                 f"{tr.get('tgt_tok_per_s_mean') or 0:,.0f} tgt tok/s, end reason {tr.get('end_reason')}")
        if not (ckpt / "checkpoint_last.pt").exists():
            tr["status"] = "failed" if tr["status"] == "ok" else tr["status"]
            return rec
        if tr["status"] == "timeout":  # stopped from outside after saving: what it trained is still usable
            tr["status"] = "partial"
        n_upd = len(list(ckpt.glob("checkpoint_*_*.pt")))
        model = ckpt / "checkpoint_last.pt"
        if n_upd:
            avg = ckpt / "average.pt"
            av = self.step("average", [py, "-m", "nmtkit", "average-checkpoints", "--inputs", ckpt,
                                       "--num-update-checkpoints", str(min(5, n_upd)), "--output", avg],
                           keep=keep("average"))
            av.pop("_output", None)
            av["checkpoints"] = min(5, n_upd)
            if av["status"] == "ok":
                model = avg
        else:
            av = {"status": "skipped", "reason": "no timed checkpoint was written; checkpoint_last.pt is used"}
        steps["average"] = av
        self.model_ckpt = model
        hyp = w / "test.hyp.en"
        gen = self.step("generate", [
            py, "-m", "nmtkit", "generate", data, "--path", model, "--gen-subset", "test", "--beam", "4",
            "--lenpen", "0.6", "--max-len-a", "1", "--max-len-b", "50", "--batch-size", "128",
            "--output", hyp, *dev], keep=keep("generate"))
        gen.update(parse_generate(gen.pop("_output", "")))
        steps["generate"] = gen
        if gen["status"] != "ok":
            return rec
        shutil.copyfile(hyp, self.out / "test.hyp.en")
        sc = self.score("score", hyp, keep=keep("score"))
        steps["score"] = sc
        self.say(f"score: {sc.get('score_line', sc['status'])}")
        rec["bleu"] = sc.get("bleu")
        rec["status"] = "ok" if all(v["status"] in ("ok", "skipped", "partial") for v in steps.values()) \
            and sc["status"] == "ok" else "failed"
        if rec["status"] == "ok" and any(v["status"] == "partial" for v in steps.values()):
            rec["status"] = "partial"
        return rec

    def stage_time_to_bleu(self) -> dict:
        s, py = self.s, self.py
        if self.data_dir is None or self.raw is None:
            return {"status": "skipped", "reason": "needs the quickstart stage's data directory"}
        order = ["ttq_train", "ttq_generate", "ttq_score"]

        def keep(step: str) -> float:
            return self.keep_after("time_to_bleu") + sum(s.limits[k][1] for k in order[order.index(step) + 1:])

        ckpt, dev = self.work / "time_to_bleu", ["--device", self.device] + (
            ["--threads", str(s.threads)] if self.device == "cpu" else [])
        steps: dict = {}
        rec = {"status": "failed", "steps": steps, "target_bleu": s.target_bleu, "arch_flags": s.arch_flags,
               "validate_interval_updates": s.ttq_interval, "valid_subset": "test (test_2016_flickr)",
               "precision": s.precision, "max_tokens": s.max_tokens}
        # training stops itself (--max-time) well before the step's limit, so that a target not
        # reached still ends with a saved checkpoint and an `end` record, not SIGKILL mid-validation
        cap = max(self.budget.allot(s.limits["ttq_train"][0], keep("ttq_train")) - 15, 1)
        tr = self.step("ttq_train", [
            py, "-m", "nmtkit", "train", self.data_dir, *s.arch_flags, "--save-dir", ckpt,
            "--lr-scheduler", "inverse_sqrt", "--lr", s.lr, "--warmup-updates", str(s.warmup_updates),
            "--max-tokens", str(s.max_tokens), "--valid-subset", "test", "--eval-bleu", "--eval-bleu-beam", "4",
            "--eval-bleu-decoding", "fairseq",
            "--eval-bleu-max-len-a", "1", "--eval-bleu-max-len-b", "50", "--target-bleu", f"{s.target_bleu:g}",
            "--validate-interval-updates", str(s.ttq_interval), "--no-epoch-checkpoints", "--seed", "1",
            "--log-interval", str(s.log_interval), "--no-progress-bar", "--precision", s.precision,
            "--max-time", f"{cap:.0f}", *dev], keep=keep("ttq_train"))
        tr.pop("_output", None)
        if tr["status"] == "skipped":
            return {**rec, "status": "skipped", "reason": tr["reason"]}
        tr.update(time_to_bleu(ckpt / "train_log.jsonl"))
        steps["train"] = tr
        rec.update({k: tr.get(k) for k in ("reached", "seconds_to_target", "update_at_target", "valid_bleu")})
        rec["wall_s_to_target"] = tr.get("wall_s") if tr.get("reached") else None
        self.say(f"time to BLEU {s.target_bleu:g}: " + (
            f"{tr['seconds_to_target']:.1f} s of training ({tr['wall_s']:.1f} s process), update "
            f"{tr['update_at_target']}" if tr.get("reached") else
            f"not reached ({tr['status']}; validation BLEU {tr.get('valid_bleu')})"))
        if not (ckpt / "checkpoint_last.pt").exists():
            return rec
        hyp = self.work / "time_to_bleu.hyp.en"
        gen = self.step("ttq_generate", [
            py, "-m", "nmtkit", "generate", self.data_dir, "--path", ckpt / "checkpoint_last.pt",
            "--gen-subset", "test", "--beam", "4", "--decoding", "fairseq", "--max-len-a", "1", "--max-len-b", "50",
            "--batch-size", "128", "--output", hyp, *dev], keep=keep("ttq_generate"))
        gen.pop("_output", None)
        steps["generate"] = gen
        if gen["status"] != "ok":
            return rec
        sc = self.score("ttq_score", hyp, keep=keep("ttq_score"))
        steps["score"] = sc
        rec["test_bleu_fairseq_decoding"] = sc.get("bleu")
        self.say(f"time_to_bleu checkpoint, fairseq's decoding: {sc.get('score_line', sc['status'])}")
        ran = tr["status"] in ("ok", "timeout") and gen["status"] == "ok" and sc["status"] == "ok"
        rec["status"] = ("ok" if tr.get("reached") else "not_reached") if ran else "failed"
        return rec

    def stage_generate_speed(self) -> dict:
        s = self.s
        if self.model_ckpt is None or self.data_dir is None or self.raw is None:
            return {"status": "skipped", "reason": "needs the quickstart stage's model"}
        src = self.work / "speed.de"
        with gzip.open(self.raw / "test.de.gz", "rt", encoding="utf-8") as fh:
            text = fh.read()
        src.write_text(text * s.gen_repeat, encoding="utf-8")
        n_lines = text.count("\n") * s.gen_repeat
        runs = []
        for i, prec in enumerate(s.gen_precisions):
            later = (len(s.gen_precisions) - i - 1) * s.limits["generate_speed"][1]
            dev = ["--device", self.device] + (["--threads", str(s.threads)] if self.device == "cpu" else [])
            r = self.step(f"generate_speed {prec}", [
                self.py, "-m", "nmtkit", "generate", self.data_dir, "--path", self.model_ckpt, "--input", src,
                "--beam", "4", "--lenpen", "0.6", "--max-len-a", "1", "--max-len-b", "50", "--batch-size", "128",
                "--precision", prec, "--output", self.work / f"speed.{prec}.hyp", *dev],
                keep=self.keep_after("generate_speed") + later, limit=s.limits["generate_speed"])
            r.update(parse_generate(r.pop("_output", "")))
            if r["status"] == "ok" and "sentences_per_s" not in r:
                r["status"], r["reason"] = "failed", "no summary line in generate's output"
            runs.append({"precision": prec, "batch_size": 128, "beam": 4, **r})
            if "search_sentences_per_s" in r:
                self.say(f"generate {prec}: {r['sentences_per_s']:,.1f} sentences/s (process), "
                         f"{r['search_sentences_per_s']:,.1f} sentences/s (search only)")
        status = "ok" if all(r["status"] == "ok" for r in runs) else (
            "partial" if any(r["status"] == "ok" for r in runs) else "failed")
        return {"status": status, "input_sentences": n_lines, "repeat": s.gen_repeat, "runs": runs}

    # ------------------------------------------------------------------------------ summary --
    def summary(self) -> dict:
        st = self.result["stages"]
        env = st.get("env", {})
        out = {"device": self.device, "gpu": env.get("gpu_name"), "torch": env.get("torch"),
               "gemm_tflops": (env.get("gemm") or {}).get("tflops"),
               "cuda_tests": {k: st.get("cuda_tests", {}).get(k) for k in ("status", "passed", "failed", "skipped",
                                                                          "errors")},
               "train_step": {}, "quickstart_bleu": st.get("quickstart", {}).get("bleu"), "generate": {},
               "time_to_bleu": {k: st.get("time_to_bleu", {}).get(k) for k in (
                   "target_bleu", "reached", "seconds_to_target", "wall_s_to_target", "test_bleu_fairseq_decoding")}}
        for r in st.get("train_step", {}).get("runs", []):
            out["train_step"][f"{r['arch']}{' compiled' if r['compile'] else ''}"] = {
                k: r.get(k) for k in ("largest_fitting_max_tokens", "tgt_tok_per_s", "mfu_measured", "mfu_datasheet",
                                      "peak_mem_mib", "status")}
        for r in st.get("generate_speed", {}).get("runs", []):
            out["generate"][r["precision"]] = {k: r.get(k) for k in ("sentences_per_s", "search_sentences_per_s",
                                                                    "status")}
        out["stage_status"] = {k: v.get("status") for k, v in st.items()}
        return out

    def print_summary(self) -> None:
        s = self.result["summary"]
        lines = [(f"device {s['device']} ({s['gpu'] or 'no GPU'}), torch {s['torch']}, "
                  f"GEMM {s['gemm_tflops'] or 0:.4g} TFLOP/s")]
        ct = s["cuda_tests"]
        lines.append(f"cuda tests: {ct['status']}" + (f" ({ct['passed']} passed, {ct['failed']} failed, "
                                                        f"{ct['skipped']} skipped, {ct['errors']} errors)"
                                                        if ct.get("passed") is not None else ""))
        for name, r in s["train_step"].items():
            if r.get("tgt_tok_per_s"):
                mfu = f", MFU {100 * r['mfu_measured']:.1f}%" if r.get("mfu_measured") else ""
                mem = f", peak {r['peak_mem_mib']:,.0f} MiB" if r.get("peak_mem_mib") else ""
                lines.append(f"train step {name}: max-tokens {r['largest_fitting_max_tokens']}, "
                             f"{r['tgt_tok_per_s']:,.0f} tgt tok/s{mfu}{mem} [{r['status']}]")
            else:
                lines.append(f"train step {name}: {r['status']}")
        lines.append(f"quickstart BLEU: {s['quickstart_bleu']}")
        t = s["time_to_bleu"]
        if t["reached"] is None:  # skipped, or it failed before training
            lines.append(f"time to BLEU: {s['stage_status'].get('time_to_bleu')}")
        else:
            lines.append(f"time to BLEU {t['target_bleu']}: " + (
                f"{t['seconds_to_target']} s of training ({t['wall_s_to_target']} s process)" if t["reached"] else
                "not reached") + f"; test BLEU with fairseq's decoding {t['test_bleu_fairseq_decoding']}")
        for prec, r in s["generate"].items():
            lines.append(f"generate {prec} batch 128: {r.get('sentences_per_s')} sentences/s "
                         f"(search only {r.get('search_sentences_per_s')}) [{r['status']}]")
        lines.append("stages: " + ", ".join(f"{k} {v}" for k, v in s["stage_status"].items()))
        lines.append(f"results: {self.out / 'gpu_bench.json'} (log: {self.out / 'gpu_bench.log'}), "
                     f"{self.result['elapsed_s']:.0f}s")
        for ln in lines:
            self.say(ln)


# ------------------------------------------------------------------------------------ helpers --

def strip_private(obj):
    """Drop the captured outputs (keys starting with "_") before the record goes into the JSON."""
    if isinstance(obj, dict):
        return {k: strip_private(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, list):
        return [strip_private(v) for v in obj]
    return obj


def parse_pytest(output: str) -> dict:
    """Counts from pytest's summary line, or from its -v lines when it was stopped before one;
    the failing tests, the test running when it was stopped, and the slowest durations."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "xfailed": 0, "xpassed": 0}
    summary = next((ln for ln in reversed(lines) if ln.startswith("=") and (PYTEST_COUNT.search(ln)
                                                                          or "no tests ran" in ln)), "")
    per_test = [(m.group(1), m.group(2)) for m in map(PYTEST_LINE.match, lines) if m]
    if summary:
        for n, what in PYTEST_COUNT.findall(summary):
            key = "errors" if what.startswith("error") else what
            if key in counts:
                counts[key] = int(n)
    else:
        names = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "errors",
                 "XFAIL": "xfailed", "XPASS": "xpassed"}
        for _, what in per_test:
            counts[names[what]] += 1
    out = {**counts, "summary_line": summary.strip("= ") or "(no summary: stopped before the end; counted "
                                                           "from the finished tests)",
           "failures": [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))][:30]
           or [f"{t} {w}" for t, w in per_test if w in ("FAILED", "ERROR")][:30],
           "skip_reasons": [ln for ln in lines if ln.startswith("SKIPPED ")][:30],
           "slowest": [ln.strip() for ln in lines if re.match(r"^\s*[\d.]+s (call|setup|teardown) ", ln)][:10]}
    last = lines[-1] if lines else ""
    if not summary and "::" in last and not PYTEST_LINE.match(last):
        out["running_when_stopped"] = last.split()[0]
    return out


def default_data() -> Path:
    carried = ROOT / ".gpu_data" / "data" / "multi30k"
    return carried if carried.is_dir() else ROOT.parent / "shared" / "data" / "multi30k"


def num(text: str) -> float:
    return float(text.replace(",", ""))


def parse_generate(output: str) -> dict:
    """generate's summary line (stderr) -> sentences/s and tokens/s of the process and of the search."""
    m = GEN_SUMMARY.search(" ".join(output.split()))
    if not m:
        return {}
    return {"sentences": int(num(m.group(1))), "target_tokens": int(num(m.group(2))),
            "total_s": num(m.group(3)), "sentences_per_s": num(m.group(4)), "tokens_per_s": num(m.group(5)),
            "search_s": num(m.group(6)), "search_sentences_per_s": num(m.group(7)),
            "search_tokens_per_s": num(m.group(8)), "summary_line": m.group(0)}


def log_records(path: Path) -> list[dict]:
    """The records of a train_log.jsonl (none when it is missing; a line cut by a kill is skipped)."""
    recs = []
    if path.exists():
        for ln in path.read_text("utf-8").splitlines():
            try:
                recs.append(json.loads(ln))
            except ValueError:
                continue
    return recs


def time_to_bleu(path: Path) -> dict:
    """From a train_log.jsonl of a run with --eval-bleu --target-bleu: whether the target was
    reached, the training seconds until then (the `end` record's elapsed_s: validations and the
    final checkpoint's save included), the update, and every validation's BLEU."""
    recs = log_records(path)
    valid = [(r.get("update"), r.get("bleu")) for r in recs if r.get("type") == "valid"]
    end = next((r for r in reversed(recs) if r.get("type") == "end"), {})
    reached = end.get("reason") == "target_bleu"
    return {"reached": reached, "valid_bleu": valid, "end_reason": end.get("reason"),
            "seconds_to_target": end.get("elapsed_s") if reached else None,
            "update_at_target": end.get("update") if reached else None}


def read_train_log(path: Path) -> dict:
    """The figures of a train_log.jsonl: updates, epochs, tokens/s, the last validation, the end."""
    if not path.exists():
        return {}
    recs = log_records(path)
    start = next((r for r in recs if r.get("type") == "start"), {})
    trains = [r for r in recs if r.get("type") == "train"]
    valids = [r for r in recs if r.get("type") == "valid"]
    end = next((r for r in reversed(recs) if r.get("type") == "end"), {})
    rates = [r["tgt_tok_per_s"] for r in trains[1:] or trains if isinstance(r.get("tgt_tok_per_s"), (int, float))]
    out = {"params": start.get("params"), "device": start.get("device"), "train_pairs": start.get("train_pairs"),
           "batches_per_epoch": start.get("batches_per_epoch"), "updates": end.get("update"),
           "epoch": end.get("epoch"), "epochs_done": (end.get("epoch") or 1) - 1 if end else None,
           "end_reason": end.get("reason"),
           "train_elapsed_s": end.get("elapsed_s"), "oom_skips": end.get("oom_skips"),
           "nan_skips": end.get("nan_skips"),
           "tgt_tok_per_s_mean": round(sum(rates) / len(rates), 1) if rates else None,
           "last_train_loss": trains[-1].get("loss") if trains else None,
           "checkpoint_saves": sum(1 for r in recs if r.get("type") == "checkpoint"),
           "checkpoint_seconds": round(sum(r.get("seconds") or 0 for r in recs if r.get("type") == "checkpoint"), 2)}
    if end.get("update") and end.get("elapsed_s"):
        out["updates_per_s"] = round(end["update"] / end["elapsed_s"], 2)
    if valids:
        out["last_valid"] = {k: valids[-1].get(k) for k in ("update", "epoch", "loss", "nll_loss", "ppl")}
    return out


# ------------------------------------------------------------------------------ the env probe --

def probe_env(path: str, device: str, n: int) -> None:
    """Runs in its own process: versions, the device, and the GEMM rate -> JSON at `path`: bf16 on
    a GPU (the training's precision there), fp32 on a CPU, which may have no fast bf16 at all (a
    CPU is not judged by a precision it does not train in)."""
    rec: dict = {}

    def write() -> None:
        Path(path).write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")

    import torch

    rec.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
               cpu_threads=torch.get_num_threads())
    try:
        import triton

        rec["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - not installed (CPU builds)
        rec["triton"] = None
    use_cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    if device == "cuda" and not use_cuda:
        rec["device"] = "cpu"
        rec["error"] = "--device cuda but torch.cuda.is_available() is False"
        write()
        sys.exit(1)
    rec["device"] = "cuda" if use_cuda else "cpu"
    if use_cuda:
        p = torch.cuda.get_device_properties(0)
        rec.update(gpu_name=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(p.total_memory / 2**30, 2), capability=f"{p.major}.{p.minor}",
                   multiprocessors=p.multi_processor_count, bf16_supported=torch.cuda.is_bf16_supported(),
                   cudnn=torch.backends.cudnn.version(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
        free, _total = torch.cuda.mem_get_info()
        rec["gpu_memory_free_gib"] = round(free / 2**30, 2)
        try:
            query = "--query-gpu=driver_version,clocks.max.sm,power.limit,temperature.gpu,utilization.gpu"
            smi = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], check=False,
                                 capture_output=True, text=True, timeout=15)
            rec["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            rec["nvidia_smi"] = f"unavailable: {e}"
    write()
    dev = torch.device("cuda" if use_cuda else "cpu")
    dtype = torch.bfloat16 if use_cuda else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    iters = 20 if use_cuda else 3
    for _ in range(3):
        torch.mm(a, b, out=c)
    rates = []
    for _ in range(3):  # the best of three timed rounds
        if use_cuda:
            torch.cuda.synchronize()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(iters):
                torch.mm(a, b, out=c)
            t1.record()
            torch.cuda.synchronize()
            sec = t0.elapsed_time(t1) / 1e3 / iters
        else:
            t = time.perf_counter()
            for _ in range(iters):
                torch.mm(a, b, out=c)
            sec = (time.perf_counter() - t) / iters
        rates.append(2 * n**3 / sec / 1e12)
    # four significant digits: a small CPU GEMM runs at a few GFLOP/s, which two decimals of
    # TFLOP/s would round to zero
    rec["gemm"] = {"n": n, "dtype": "bf16" if use_cuda else "fp32", "iters": iters,
                   "tflops": float(f"{max(rates):.4g}"), "tflops_rounds": [float(f"{r:.4g}") for r in rates],
                   "timer": "cuda events" if use_cuda else "perf_counter"}
    if use_cuda:
        try:
            sys.path.insert(0, str(ROOT / "recipes" / "bench"))
            from model import gpu_peak  # the datasheet table of recipes/bench/model.py

            peak = gpu_peak(rec["gpu_name"])
            rec["datasheet_bf16_tflops"] = peak / 1e12 if peak else None
            if peak:
                rec["gemm"]["fraction_of_datasheet"] = round(max(rates) * 1e12 / peak, 3)
        except Exception as e:  # noqa: BLE001 - the table is a nicety
            rec["datasheet_error"] = f"{type(e).__name__}: {e}"
    write()


# ------------------------------------------------------------------------------------- main --

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("GPU_BENCH_OUT") or os.environ.get("OUT") or "runs/gpu_bench",
                   help="where gpu_bench.json, gpu_bench.log, train_log.jsonl and test.hyp.en go")
    p.add_argument("--work", default=os.environ.get("GPU_BENCH_WORK"),
                   help="scratch folder, emptied first (default: a new temporary folder)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="transformer_tiny on a slice of the data (CPU, a minute)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run (default 480 on a GPU, 300 with --tiny)")
    p.add_argument("--train-seconds", type=float, default=None,
                   help="--max-time of the quickstart training (default 30; 6 with --tiny)")
    p.add_argument("--cuda-tests", default="tests/test_cuda.py", metavar="FILE",
                   help="the test file of the cuda_tests stage (default: tests/test_cuda.py)")
    p.add_argument("--skip", default="", help=f"comma-separated stages to leave out ({', '.join(STAGES)})")
    p.add_argument("--probe-env", default=None, help=argparse.SUPPRESS)
    p.add_argument("--gemm-n", type=int, default=8192, help=argparse.SUPPRESS)  # (the env probe's size)
    a = p.parse_args(argv)
    a.skip = [x.strip() for x in a.skip.split(",") if x.strip()]
    unknown = [x for x in a.skip if x not in STAGES]
    if unknown:
        p.error(f"--skip: unknown stage(s) {', '.join(unknown)} (stages: {', '.join(STAGES)})")
    return a


def prepare_work(work: str | None) -> Path:
    """A fresh scratch folder: a new temporary one, or --work emptied (only if this script made it)."""
    if not work:
        return Path(tempfile.mkdtemp(prefix="nmtkit-gpu-bench-"))
    w = Path(work)
    if w.exists() and any(w.iterdir()):
        if not (w / WORK_MARKER).exists():
            sys.exit(f"gpu_bench: --work {w} is not empty and was not made by this script; choose another")
        shutil.rmtree(w)
    w.mkdir(parents=True, exist_ok=True)
    (w / WORK_MARKER).write_text("scratch folder of recipes/bench/gpu_bench.py; emptied on every run\n")
    return w


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.probe_env:
        probe_env(a.probe_env, a.device, a.gemm_n)
        return 0
    s = tiny_settings(a.train_seconds) if a.tiny else gpu_settings(a.train_seconds)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("gpu_bench.json", "gpu_bench.log", "train_log.jsonl", "test.hyp.en"):
        (out / name).unlink(missing_ok=True)
    a.work = str(prepare_work(a.work))
    bench = Bench(a, s)
    try:
        return bench.main()
    finally:
        bench.log_fh.close()
        if not os.environ.get("GPU_BENCH_KEEP_WORK") and not os.environ.get("GPU_BENCH_WORK"):
            shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
