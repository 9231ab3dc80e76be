"""`OnnxEngine`: an export directory's graphs run by ONNX Runtime, searched by nmtkit's own rules.

    from nmtkit import Translator
    tr = Translator.load("m30k-onnx")                 # a directory made by `nmtkit export --format onnx`
    tr.translate(["Ein Mann schläft.", ""])          # -> ["A man sleeps.", ""]

The `Translator` does everything between text and ids on the export's copies of the data
directory's files; this engine runs the encoder graph once per batch and the decoder-step graph
once per step, and searches with `nmtkit.search.arrays`, the native search's rules over numpy:
the same defaults (the GNMT length penalty, the exact `--early-stop bound`), every length
penalty and stopping rule, `--nbest`, `--min-len`, `--no-repeat-ngram-size`, `--unk-penalty`,
and sampling (numpy's generator, seeded by `--seed`: other samples than native's). It imports
no torch (nor onnx: only onnxruntime and numpy).

A lexical shortlist (`use_shortlist`) needs an export made with `nmtkit export --shortlist`,
whose decoder takes the output layer's weight as an optional input: per batch the engine feeds it
the columns of the batch's candidates but <pad> (the weight read once from the graph's
initializer, with onnx, when a shortlist is first used), and the search runs over those
candidates, <pad> holding its position at -inf (`nmtkit.search.vocab`). Any shortlist read with
the model's dictionaries serves, not only the export's own copy.

Refused in one line (`prepare` and the class attributes): a device other than the CPU,
`--precision` other than fp32 (an int8 export is chosen when exported), `--ema` and `--quantize`
(chosen at export time), ensembles, and scores of given targets, alignments and attention.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmtkit.backends.engine import Engine, RuntimeOptions
from nmtkit.device import parse_device
from nmtkit.errors import UserError, first_line
from nmtkit.search.config import Hypothesis, SearchConfig
from nmtkit.search.vocab import RestrictedVocab

INSTALL_HINT = "pip install -e '.[onnx]' in the nmtkit checkout"
# the graphs of an export directory; written by convert.py, which builds on this runtime side
ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
# a shortlist export's decoder input (and initializer): the output layer's weight (D, V), fed as
# the columns of a batch's candidates (D, C) to compute C logits (convert.py's module docstring)
OUTPUT_WEIGHT = "out_proj_weight"


def import_onnxruntime():
    """The onnxruntime module, or a one-line UserError saying how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"the ONNX Runtime is not installed: {INSTALL_HINT}") from None
    return onnxruntime


def read_output_weight(folder: str | Path) -> np.ndarray:
    """The output layer's weight (D, V) float32 from a shortlist export's decoder graph: the
    initializer that a restricted step replaces by some of its columns. UserError when the onnx
    package is missing or the graph has no such initializer."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise UserError(f"--shortlist: reading the ONNX export's output layer needs the onnx package: "
                        f"{INSTALL_HINT}") from None
    path = Path(folder) / DECODER_FILE
    for init in onnx.load(str(path)).graph.initializer:
        if init.name == OUTPUT_WEIGHT:
            return np.ascontiguousarray(numpy_helper.to_array(init), dtype=np.float32)
    raise UserError(f"{path}: the decoder has no {OUTPUT_WEIGHT} initializer, so it cannot be restricted to a "
                    "shortlist; export again with nmtkit export --format onnx --shortlist FILE")


@dataclass
class EncoderState:
    """The encoder graph's outputs for M sentences, serving `rows` decoder rows (M divides it:
    rows r*g .. r*g + g - 1 read sentence r)."""

    arrays: dict[str, np.ndarray]  # src_bias (M, 1, 1, S), cross_k_i / cross_v_i (M, h, S, d)
    rows: int

    @property
    def memory_rows(self) -> int:
        return self.arrays["src_bias"].shape[0]


class Graphs:
    """The two ONNX Runtime sessions and the array model `nmtkit.search.arrays` searches over
    (over the whole vocabulary, or, made by `restricted`, over a batch's candidates)."""

    def __init__(self, encoder, decoder):
        self.encoder, self.decoder = encoder, decoder
        self.ids: np.ndarray | None = None  # (C,) the candidates of a restricted view
        self._extra: dict[str, np.ndarray] = {}  # a restricted view's OUTPUT_WEIGHT
        ins = {i.name: i for i in decoder.get_inputs()}
        self.layers = sum(1 for n in ins if n.startswith("self_k_"))
        self._empty = [(ins[f"self_{kv}_{i}"].shape[1], ins[f"self_{kv}_{i}"].shape[3])
                       for i in range(self.layers) for kv in "kv"]  # (heads, d) per cache input
        self._cache_names = [f"self_{kv}_{i}" for i in range(self.layers) for kv in "kv"]
        self._outputs = ["log_probs"] + [f"self_{kv}_out_{i}" for i in range(self.layers) for kv in "kv"]

    @classmethod
    def load(cls, folder: str | Path, threads: int = 0) -> Graphs:
        ort = import_onnxruntime()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # no arena: the caches grow every step and the batch shrinks, so an arena keeps the
        # largest of each size class (measured: 45 MiB more peak RSS at batch 128, no faster)
        opts.enable_cpu_mem_arena = False
        # errors only: a shortlist export's decoder makes ONNX Runtime warn at each load that an
        # initializer listed as an input is not constant-folded, which is what it is there for
        opts.log_severity_level = 3
        if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":  # as torch's and CTranslate2's threads:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no spinning on a busy machine
        sessions = [ort.InferenceSession(str(Path(folder) / f), opts, providers=["CPUExecutionProvider"])
                    for f in (ENCODER_FILE, DECODER_FILE)]
        return cls(*sessions)

    def encode(self, src_tokens: np.ndarray) -> EncoderState:
        """src_tokens (B, S) int64 -> the encoder's outputs for B sentences, one decoder row each."""
        names = [o.name for o in self.encoder.get_outputs()]
        arrays = dict(zip(names, self.encoder.run(names, {"src_tokens": src_tokens})))
        return EncoderState(arrays, src_tokens.shape[0])

    def new_cache(self) -> list[np.ndarray] | None:
        return None  # sized at the first step, by the rows it serves

    def empty_cache(self, rows: int) -> list[np.ndarray]:
        """The self-attention caches before the first step: (rows, h, 0, d) each."""
        return [np.zeros((rows, h, 0, d), np.float32) for h, d in self._empty]

    def restricted(self, ids: np.ndarray, weight: np.ndarray) -> Graphs:
        """These sessions as a model over the candidates `ids` (C,) (a `RestrictedVocab`'s:
        ascending, <pad> first), `weight` (D, V) the output layer's (a shortlist export's decoder
        only): tokens in and out are positions among the candidates, and the log-probs (N, C)
        are normalised over them but <pad> (ids[0]), whose column is not fed and stays -inf."""
        view = copy.copy(self)
        view.ids, view._extra = ids, {OUTPUT_WEIGHT: np.ascontiguousarray(weight[:, ids[1:]], dtype=np.float32)}
        return view

    def step(self, prev: np.ndarray, enc: EncoderState, cache: list[np.ndarray] | None):
        """prev (N,) int64 -> ((N, V) float32 log-probs, the caches with this position); in a
        restricted view, prev are positions among the C candidates and the log-probs (N, C)."""
        if cache is None:
            cache = self.empty_cache(len(prev))
        if self.ids is not None:
            prev = self.ids[prev]  # (N,) positions -> dictionary ids for the embedding
        feed = {"tokens": np.ascontiguousarray(prev, dtype=np.int64).reshape(-1, 1), **enc.arrays,
                **dict(zip(self._cache_names, cache)), **self._extra}
        out = self.decoder.run(self._outputs, feed)
        if self.ids is None:
            return out[0], out[1:]
        pad = np.full((len(prev), 1), -np.inf, np.float32)  # <pad>'s position: no candidate
        return np.concatenate([pad, out[0]], axis=1), out[1:]  # (N, C)

    def select_cache(self, cache: list[np.ndarray], order: np.ndarray) -> list[np.ndarray]:
        """Rows reordered in place in the list: each layer's old copy is freed before the next
        one is made (one cache and one layer in memory, not two caches)."""
        for i, c in enumerate(cache):
            cache[i] = c.take(order, axis=0)
        return cache

    def select_enc(self, enc: EncoderState, order: np.ndarray) -> EncoderState:
        """Row i <- old row order[i]: the sentences' rows are kept (or copied per row when the
        new rows no longer come in equal groups per sentence)."""
        m_old = enc.memory_rows
        row_memory = order // (enc.rows // m_old)  # (N',) the sentence of each new row
        starts = np.flatnonzero(np.r_[True, row_memory[1:] != row_memory[:-1]])
        memory = row_memory[starts]
        n, m = row_memory.size, memory.size
        if n % m != 0 or not (row_memory.reshape(m, n // m) == memory[:, None]).all():
            memory = row_memory  # not grouped: one sentence row per decoder row
        elif m == m_old and (memory == np.arange(m)).all():
            return EncoderState(enc.arrays, n)
        return EncoderState({k: v.take(memory, axis=0) for k, v in enc.arrays.items()}, n)


def collate_source(rows: Sequence[np.ndarray], eos: int, pad: int) -> np.ndarray:
    """(B, S) int64: each row `ids + [</s>]`, right-padded (docs/internals.md)."""
    S = max(len(ids) for ids in rows) + 1
    out = np.full((len(rows), S), pad, dtype=np.int64)
    for r, ids in enumerate(rows):
        out[r, : len(ids)] = ids
        out[r, len(ids)] = eos
    return out


class OnnxEngine(Engine):
    """An export directory (`nmtkit export --format onnx`) run by ONNX Runtime. Not thread-safe."""

    name = "onnx"
    display = "ONNX Runtime"
    shortlists = True  # with an export made with --shortlist (`use_shortlist`)

    def __init__(self, graphs: Graphs, *, info: dict, src_dict, tgt_dict, path: str | Path):
        self.graphs = graphs
        self.info = info
        self.path = Path(path)
        self.output_weight: np.ndarray | None = None  # (D, V), read when a shortlist is first used
        self.device = "cpu"
        arch = info["arch_config"]
        self.max_source_tokens = arch["max_source_positions"] - 1  # positions include </s>
        self.max_target_tokens = arch["max_target_positions"] - 1  # positions include <s>
        self.src_dict, self.tgt_dict = src_dict, tgt_dict

    @classmethod
    def prepare(cls, options: RuntimeOptions, warn: Callable[[str], None]) -> int:
        if options.threads < 0:
            raise UserError(f"--threads must be >= 0 (0 = the runtime's default), got {options.threads}")
        if options.precision != "fp32":
            raise UserError(f"--precision {options.precision}: the ONNX export runs in float32 (or the int8 "
                            "chosen when it was exported: nmtkit export --format onnx --quantization int8)")
        req = parse_device(options.device)
        if req.kind not in ("auto", "cpu"):
            raise UserError(f"--device {req.name}: the ONNX Runtime engine runs on the CPU (--device cpu or auto)")
        import_onnxruntime()
        return options.threads

    @classmethod
    def open(cls, source, prepared: int, src_dict, tgt_dict, options: RuntimeOptions,
             search_cfg: SearchConfig) -> OnnxEngine:
        path = source.paths[0]
        try:
            graphs = Graphs.load(path, threads=prepared)
        except Exception as e:  # onnxruntime raises its own exception types for a damaged graph
            raise UserError(f"{path}: ONNX Runtime cannot load its graphs: {first_line(e)}") from None
        return cls(graphs, info=source.info, src_dict=src_dict, tgt_dict=tgt_dict, path=path)

    def architectures(self) -> list[dict]:
        return [dict(self.info["arch_config"])]

    def use_shortlist(self, shortlist) -> None:
        """Restrict every later batch's output layer to `shortlist`'s candidates for its sources.
        The export must have the restrictable decoder (made with --shortlist); the file may be
        any shortlist for the model's dictionaries (the search needs no file of the export's)."""
        if self.info.get("shortlist") is None:
            raise UserError(f"--shortlist: this ONNX export's decoder cannot restrict its output layer; export again "
                            f"with nmtkit export --format onnx --shortlist {shortlist.path}")
        if self.output_weight is None:
            self.output_weight = read_output_weight(self.path)
        self.shortlist = shortlist

    def search(self, sources: Sequence[np.ndarray], cfg: SearchConfig,
               positional_scores: bool = False) -> list[list[Hypothesis]]:
        from nmtkit.search.arrays import search

        if not sources:
            return []
        src = collate_source(sources, self.src_dict.eos, self.src_dict.pad)
        if self.shortlist is None:
            return search(self.graphs, src, cfg)
        vocab = RestrictedVocab(self.shortlist.candidates(sources))  # the union of the batch's candidates
        return search(self.graphs.restricted(vocab.ids, self.output_weight), src, cfg, vocab)

    def __repr__(self) -> str:
        return f"ONNX Runtime {self.info['runtime'].get('quantization', 'float32')}"


ENGINE = OnnxEngine
