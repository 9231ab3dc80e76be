"""`nmtkit train --compile`: where torch.compile keeps what it builds, and what it gained.

Why a module of its own: `torch.compile` fuses the step's element-wise work (layer norms,
dropout, residual adds, softmax) into generated kernels, which can make an update faster, but
its cold compilation takes minutes and is paid again by every process unless its cache
survives. Two things make the flag something a user can decide on:

- The cache folder. Inductor keeps compiled graphs in `TORCHINDUCTOR_CACHE_DIR`, by default a
  folder under /tmp, which a reboot or a /tmp cleaner empties. Training points it at the user's
  cache folder (`$XDG_CACHE_HOME/nmtkit/torch-compile`, else `~/.cache/nmtkit/torch-compile`)
  unless the variable is set, so that a later run of the same model starts from the cache.
- The probe. Before the first update of a process, one forward and backward pass of the first
  batch runs through the eager model and through the compiled one (the first compiled pass
  compiles), each timed; the line it prints says what compiling cost and how fast a compiled
  pass is against an eager one on this machine. The passes' gradients are dropped and the random
  number generators restored, so training continues exactly as without the probe (a resumed
  run probes again, with the same effect).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_folder() -> Path:
    """The user's cache folder for compiled graphs (XDG's cache home, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nmtkit" / "torch-compile"


def use_cache_folder() -> tuple[Path, str | None]:
    """Point inductor's cache at `cache_folder()` unless the user chose one; -> (the folder used,
    a note for the user or None). torch sets the variable to its own default under /tmp when
    torch._dynamo is first imported (building an optimizer does), so that value counts as unset;
    inductor reads the variable each time it looks for its cache, so setting it late still works.
    A cache folder that cannot be made leaves torch's default, with a note."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get(CACHE_ENV)
    if chosen and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return Path(os.path.abspath(chosen)), None
    folder = cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return Path(default_cache_dir()), (f"--compile: cannot make the cache folder {folder} ({e.strerror}); "
                                           f"compiled graphs go to torch's default, {default_cache_dir()}")
    os.environ[CACHE_ENV] = str(folder)
    return folder, None


class CompileFailed(Exception):
    """torch.compile could not compile or run the model (`cause`: its error)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class CompileProbe:
    """Seconds of one forward and backward pass of the same batch: eager (the faster of two,
    after one to warm up), the first compiled pass (compiling included) and a compiled one after
    it (the faster of two)."""

    eager_s: float
    first_s: float
    compiled_s: float
    folder: Path

    @property
    def cold_s(self) -> float:
        """What compiling cost: the first compiled pass beyond a compiled pass's time."""
        return max(self.first_s - self.compiled_s, 0.0)

    @property
    def speedup(self) -> float:
        """Compiled passes per eager pass in the same time (> 1: compiling pays on this machine)."""
        return self.eager_s / self.compiled_s if self.compiled_s > 0 else float("inf")

    def line(self) -> str:
        text = (f"--compile: compiling took {self.cold_s:.1f} s (cache: {self.folder}; a later run of the same model "
                f"starts from it); a forward and backward pass of the first batch takes {self.compiled_s * 1000:.0f} ms "
                f"compiled against {self.eager_s * 1000:.0f} ms eager: {self.speedup:.2f}x")
        if self.speedup < 1.0:
            text += "; slower than eager here, so leave --compile off on this machine"
        return text

    def record(self) -> dict:
        """The train log's `compile` record (seconds)."""
        return {"cold_s": round(self.cold_s, 3), "eager_pass_s": round(self.eager_s, 5),
                "compiled_pass_s": round(self.compiled_s, 5), "speedup": round(self.speedup, 4),
                "cache": str(self.folder)}


def probe(run_pass: Callable[[torch.nn.Module], None], eager: torch.nn.Module, compiled: torch.nn.Module,
          device: torch.device, params: list[torch.nn.Parameter], folder: Path) -> CompileProbe:
    """Time `run_pass` (one forward and backward of a fixed batch through the model given) on the
    eager and the compiled model, leaving no trace: gradients dropped, RNG states restored. An
    error of the compiled passes is raised as CompileFailed, one of the eager passes as it is."""
    def timed(model: torch.nn.Module) -> float:  # an error leaves gradients behind: dropped by the caller
        sync()
        t0 = time.perf_counter()
        run_pass(model)
        sync()
        seconds = time.perf_counter() - t0
        for p in params:
            p.grad = None
        return seconds

    def sync() -> None:  # the device's queue drained, so that the clock sees the pass
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()

    def drop_gradients() -> None:
        for p in params:
            p.grad = None

    accelerator = [] if device.type == "cpu" else [device]  # its generator restored too (CUDA, MPS)
    with torch.random.fork_rng(devices=accelerator, device_type=device.type):
        try:
            timed(eager)  # warm-up: the first eager pass allocates and picks kernels
            eager_s = min(timed(eager), timed(eager))
        except BaseException:  # not compiling's fault (out of memory, most likely): raised as it is
            drop_gradients()
            raise
        try:
            first_s = timed(compiled)
            compiled_s = min(timed(compiled), timed(compiled))
        except Exception as e:  # noqa: BLE001 - the caller tells out-of-memory from a failed compilation
            drop_gradients()
            raise CompileFailed(e) from e
    return CompileProbe(eager_s, first_s, compiled_s, folder)
