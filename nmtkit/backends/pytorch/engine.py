"""`TorchEngine`: nmtkit's own checkpoints (one, or an ensemble) run by PyTorch.

Loading goes through the one loader (`nmtkit.models.loading.load_models`: the dictionaries and
languages checked against the data directory's, `--ema` weights, the cast to a precision), with
prepacked fp32 linear layers on CPU, or int8 ones with `--quantize int8` (nmtkit.models.quantize).
The search is `nmtkit.search.beam.search`; scores of given targets and attention weights come
from teacher-forced passes (`nmtkit.backends.pytorch.forced`). This engine supports every search
setting, every inspection and terminology (`nmtkit.search.terms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import torch
from nmtkit.backends.engine import Engine, RuntimeOptions
from nmtkit.backends.pytorch import forced
from nmtkit.device import keep_freed_cpu_memory, resolve_device
from nmtkit.errors import UserError
from nmtkit.models.loading import LoadedModels, load_models, precision_dtype
from nmtkit.search.beam import search
from nmtkit.search.config import Hypothesis, SearchConfig, Terms
from nmtkit.search.vocab import RestrictedVocab, term_ids


def collate_source(rows: Sequence[np.ndarray], eos: int, pad: int) -> torch.Tensor:
    """(B, S) long: each row `ids + [</s>]`, right-padded (docs/internals.md)."""
    S = max(len(ids) for ids in rows) + 1
    out = np.full((len(rows), S), pad, dtype=np.int64)
    for r, ids in enumerate(rows):
        n = len(ids)
        out[r, :n] = ids
        out[r, n] = eos
    return torch.from_numpy(out)


def prepare_runtime(device: str | torch.device, precision: str | torch.dtype, threads: int,
                    warn: Callable[[str], None]) -> tuple[torch.device, torch.dtype]:
    """The process-wide part of loading: CPU threads, the device (checked), the precision's dtype;
    on CPU, malloc keeps freed memory for the next decoding step (`keep_freed_cpu_memory`)."""
    dtype = precision_dtype(precision)
    if threads < 0:
        raise UserError(f"--threads must be >= 0 (0 = torch's default), got {threads}")
    if threads:
        torch.set_num_threads(threads)
    dev = resolve_device(str(device))
    if dev.type == "cpu":
        keep_freed_cpu_memory()  # fewer page faults per decoding step (nmtkit.device)
    if dev.type == "cpu" and dtype is torch.float16:
        warn("--precision fp16 on CPU is emulated and slow; bf16 is the fast half precision there")
    return dev, dtype


class TorchEngine(Engine):
    """One checkpoint or an ensemble, loaded as nmtkit `Transformer`s on a torch device."""

    name = "nmtkit"
    display = "nmtkit"
    teacher_forcing = True
    ensembles = True
    runs_ema = True
    quantizes = True
    constraints = True  # nmtkit.search.terms
    shortlists = True  # nmtkit.search.vocab: the output projection over the batch's candidates

    def __init__(self, loaded: LoadedModels, device: torch.device, src_dict, tgt_dict):
        self.loaded = loaded
        self.models = loaded.models
        self.device = device
        self.src_eos, self.src_pad = src_dict.eos, src_dict.pad
        self.tgt = tgt_dict
        self.max_source_tokens = loaded.max_source_tokens
        self.max_target_tokens = loaded.max_target_tokens

    @classmethod
    def prepare(cls, options: RuntimeOptions, warn: Callable[[str], None]) -> tuple[torch.device, torch.dtype]:
        return prepare_runtime(options.device, options.precision, options.threads, warn)

    @classmethod
    def open(cls, source, prepared: tuple[torch.device, torch.dtype], src_dict, tgt_dict, options: RuntimeOptions,
             search_cfg: SearchConfig) -> TorchEngine:
        """Load `source.paths` (a `nmtkit.backends.registry.ModelSource`) for its data directory,
        on `prepared` (`prepare`'s device and dtype)."""
        device, dtype = prepared
        m = source.manifest
        loaded = load_models(list(source.paths), src_dict, tgt_dict, device, dtype, ema=options.ema,
                             langs=(m["source_lang"], m["target_lang"]), quantize=options.quantize, prepack=True)
        return cls(loaded, device, src_dict, tgt_dict)

    def architectures(self) -> list[dict]:
        return [c.to_dict() for c in self.loaded.configs]

    def _source(self, rows: Sequence[np.ndarray]) -> torch.Tensor:
        return collate_source(rows, self.src_eos, self.src_pad).to(self.device)  # (B, S)

    def search(self, sources: Sequence[np.ndarray], cfg: SearchConfig,
               positional_scores: bool = False, terms: Sequence[Terms | None] | None = None) -> list[list[Hypothesis]]:
        vocab = None
        if self.shortlist is not None:  # the union of the batch's candidates, and the terms' own ids
            vocab = RestrictedVocab(self.shortlist.candidates(sources, extra=term_ids(terms)))
        return search(self.models, self._source(sources), cfg, terms, vocab)

    def layers(self, kind: str) -> int:
        return min(len(m.attention_modules(kind)) for m in self.models)

    def heads(self, kind: str) -> int:
        return self.models[0].attention_modules(kind)[0].heads

    def forced_pass(self, sources: Sequence[np.ndarray], targets: Sequence[Sequence[int]], *,
                    cross_layer: int | None = None, want_scores: bool = True
                    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        t, src = self.tgt, self._source(sources)  # (N, S)
        lp, attn = forced.forced_pass(self.models, src, targets, bos=t.bos, eos=t.eos,
                                      pad=t.pad, cross_layer=cross_layer, want_scores=want_scores)
        return (None if lp is None else lp.numpy()), (None if attn is None else attn.numpy())

    def attention(self, source: np.ndarray, target: Sequence[int]) -> tuple[list[float], dict[str, np.ndarray]]:
        model, t = self.models[0], self.tgt
        src = self._source([source])  # (1, S)
        prev, out = forced.collate_targets([target], t.bos, t.eos, t.pad)
        with torch.inference_mode():
            logits, w = model.forward_with_attention(src, prev.to(self.device))
        lp = torch.log_softmax(logits[0].float(), dim=-1).gather(1, out[0].to(self.device)[:, None]).view(-1)
        # (layers, heads, rows, cols) of the one sentence, per kind
        arrays = {kind: torch.stack([w[kind][i][0] for i in sorted(w[kind])]).cpu().numpy() for kind in w}
        return lp.tolist(), arrays

    def __repr__(self) -> str:
        return f"{len(self.models)} model(s) {self.loaded.paths}"

ENGINE = TorchEngine
