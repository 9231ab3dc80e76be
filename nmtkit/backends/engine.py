"""`Engine`: the model work of a `Translator`, on one runtime.

Why a seam here: everything between the text and the token ids (dictionaries, subword models,
truncation, batching, empty lines, search settings, detokenization, tree repair) is the same
whichever runtime holds the weights, and lives once in `nmtkit.generation.translator`. An engine
only runs the model: it searches a batch of source ids, scores given targets, and may return
attention. Each runtime is one subclass in its format's package (`nmtkit.backends.pytorch`,
`nmtkit.backends.ctranslate2`), opened by `nmtkit.backends.registry`.

An engine declares what it supports in class attributes, so that a setting it cannot honour is
refused once, in one line naming the flag: `unsupported(cfg)` for the search settings (called by
`Translator.search_config`), `teacher_forcing` for scores of given targets, alignments and attention,
`ensembles`, `runs_ema` and `quantizes` for the load options (`registry.check_combination`),
`constraints` for terminology (phrases to include or avoid, target prefixes: `require_terms`).

Source rows are numpy arrays of source dictionary ids without `</s>` (the engine adds it, as
each runtime wants it); targets are lists of target ids without `</s>`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from nmtkit.errors import UserError
from nmtkit.search.config import Hypothesis, SearchConfig

QUANTIZE_CHOICES = ("none", "int8")  # --quantize (nmtkit.models.quantize applies int8)


@dataclass(frozen=True)
class RuntimeOptions:
    """How to run a model: the flags `generate`, `serve`, `attention` and `Translator.load` share."""

    device: str = "auto"  # parsed once by nmtkit.device.parse_device
    precision: str = "fp32"
    threads: int = 0  # the runtime's CPU threads (0: its default); process-wide for torch
    ema: bool = False
    quantize: str | None = None  # "int8": int8 linear layers (nmtkit's own CPU engine only)


class Engine:
    """One loaded model (or ensemble) on one runtime. Subclasses set the class attributes and
    implement `search`; `forced_pass`, `attention`, `layers` and `heads` where `teacher_forcing`
    is True (nothing else asks an engine about its attention)."""

    name: ClassVar[str]  # the runtime as /info reports it: "nmtkit", "ctranslate2", ...
    display: ClassVar[str]  # how refusals name it: "CTranslate2"
    teacher_forcing: ClassVar[bool] = False  # scores of given targets, alignments and attention weights
    ensembles: ClassVar[bool] = False  # several models averaged
    runs_ema: ClassVar[bool] = False  # --ema chosen at load time (an export chose it when written)
    quantizes: ClassVar[bool] = False  # --quantize at load time (an export chose it when written)
    # `Terms` in `search` (phrases that must or must not appear, a forced prefix): a constrained
    # search of its own; an engine without one refuses them in `require_terms`'s one line
    constraints: ClassVar[bool] = False
    # a lexical shortlist (`use_shortlist`): the output layer restricted per batch to the union of
    # the candidates of its source pieces (docs/generate.md, "Lexical shortlists")
    shortlists: ClassVar[bool] = False
    shortlist = None  # the one in use (`use_shortlist`), or None
    # search settings (SearchConfig's names) that differ from SearchConfig's defaults when not
    # given: what the runtime's own search does (CTranslate2 has only fairseq's rules)
    search_defaults: ClassVar[dict] = {}

    device: object  # where it runs (a torch.device, or the runtime's name): str() for messages and /info
    max_source_tokens: int  # source tokens (without </s>) every model accepts
    max_target_tokens: int  # target tokens (without </s>) every model can produce

    @classmethod
    def prepare(cls, options: RuntimeOptions, warn: Callable[[str], None]):
        """The process-wide, cheap part of loading (threads, the device checked), whose result
        `open` takes: a mistake in the flags is reported before a command writes or listens."""
        raise NotImplementedError

    @classmethod
    def open(cls, source, prepared, src_dict, tgt_dict, options: RuntimeOptions, search_cfg: SearchConfig) -> Engine:
        """Load `source` (a `nmtkit.backends.registry.ModelSource`) with its dictionaries;
        `search_cfg` is the load-time search (a runtime may need its seed now)."""
        raise NotImplementedError

    @classmethod
    def unsupported(cls, cfg: SearchConfig) -> str | None:
        """The one line refusing a search setting this runtime cannot honour, or None."""
        return None

    @classmethod
    def check_search(cls, cfg: SearchConfig) -> None:
        """UserError with `unsupported`'s line: the one place a search setting is refused
        (`Translator.search_config` at every call, `nmtkit serve` before it listens)."""
        refusal = cls.unsupported(cfg)
        if refusal is not None:
            raise UserError(refusal)

    @classmethod
    def require_teacher_forcing(cls, what: str) -> None:
        """UserError unless this runtime can teacher-force given targets (scores, alignments,
        attention weights): the line `Translator` and `nmtkit attention` give."""
        if not cls.teacher_forcing:
            raise UserError(f"{what} needs nmtkit's own model: load the checkpoint and its data directory "
                            f"(an export directory is run by {cls.display}, which exposes no attention or "
                            "forced scores)")

    @classmethod
    def require_terms(cls) -> None:
        """UserError unless this runtime's search honours `Terms` (constraints, avoided phrases,
        prefixes): the line `Translator` gives before any search."""
        if not cls.constraints:
            raise UserError(f"constraints, avoided phrases and target prefixes: {cls.display} has no constrained "
                            "search; translate with the checkpoint and its data directory (nmtkit's own search)")

    @classmethod
    def require_shortlists(cls) -> None:
        """UserError unless this runtime can restrict its output layer to a shortlist's candidates:
        the line `Translator` gives before the model is loaded."""
        if not cls.shortlists:
            raise UserError(f"--shortlist: {cls.display} cannot restrict its output layer; translate with the "
                            "checkpoint and its data directory, or an ONNX or CTranslate2 export")

    def use_shortlist(self, shortlist) -> None:
        """Search every later batch over `shortlist`'s candidates for its sources (a
        `nmtkit.data.shortlist.Shortlist` read with this model's dictionaries)."""
        self.shortlist = shortlist

    def architectures(self) -> list[dict]:
        """Each model's architecture (`ArchConfig.to_dict()`), for /info."""
        raise NotImplementedError

    def search(self, sources: Sequence[np.ndarray], cfg: SearchConfig,
               positional_scores: bool = False) -> list[list[Hypothesis]]:
        """Up to `cfg.nbest` hypotheses per source row, best first, in order. `cfg` is complete
        (the dictionary's ids and the output cap set). `positional_scores`: the caller needs the
        per-token log-probabilities (an engine may otherwise leave them out). An engine that
        declares `constraints` also takes `terms=`: per row its `Terms` or None (passed only when
        some row has terms)."""
        raise NotImplementedError

    def layers(self, kind: str) -> int:
        """Attention layers of `kind` (enc-self, dec-self, cross) in every model (their minimum)."""
        raise NotImplementedError

    def heads(self, kind: str) -> int:
        """Heads of one attention layer of `kind` (the first model's)."""
        raise NotImplementedError

    def forced_pass(self, sources: Sequence[np.ndarray], targets: Sequence[Sequence[int]], *,
                    cross_layer: int | None = None, want_scores: bool = True
                    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Teacher-force `targets` on `sources`: (token log-probs (N, T) float32, 0 after each
        row's </s>; the ensemble's mean) and, with `cross_layer` (0-based, negative from the
        top), that layer's cross-attention averaged over heads and models (N, T, S)."""
        raise NotImplementedError

    def attention(self, source: np.ndarray, target: Sequence[int]) -> tuple[list[float], dict[str, np.ndarray]]:
        """One model's every attention weight for one pair: (the target's token log-probs, </s>
        last; {kind: (layers, heads, rows, columns) float32})."""
        raise NotImplementedError
