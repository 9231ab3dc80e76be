"""`Translator`: a model (or an ensemble) loaded once with its data directory, then called many times.

    from nmtkit import Translator
    tr = Translator.load("ckpt/avg5.pt", "data-bin")            # beam 4, lenpen 0.6, ...: the CLI's defaults
    tr.translate(["Ein Mann schläft.", ""])                    # -> ["A man sleeps.", ""]

Why a class: loading (checkpoint files, dictionaries, subword models, the move to a device and a
precision) costs seconds, a translation milliseconds; a Python program, a server or a notebook
loads once and translates many times. `nmtkit generate` is this class plus reading and writing
(`nmtkit.generation.generator`), so the API and the CLI cannot drift apart: the same
segmentation, batching, truncation warnings, empty-line rule, search and detokenization.

What it does with raw text, in order (docs/api.md):
- each sentence is segmented with the data directory's own subword model and mapped to ids with
  its source dictionary (the segmentation the model was trained on);
- an empty or whitespace-only sentence gives an empty output without running the model;
- a sentence longer than every model accepts (`max_source_positions - 1` tokens) is truncated
  to that length, with a warning naming it;
- sentences are sorted by length and cut into batches (`batch_size` / `max_tokens`), searched,
  and put back in input order; batching never changes the result;
- the best hypothesis is detokenized with the target subword model, or, on a parsing data
  directory, repaired into a bracketed tree over the sentence's own words (docs/parsing.md).

Search settings have SearchConfig's names and defaults (one place: `SearchConfig`), except
`max_len_b`, which defaults to 300 on a parsing data directory as in `nmtkit generate`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nmtkit.device import keep_freed_cpu_memory, resolve_device
from nmtkit.errors import UserError
from nmtkit.generation import forced
from nmtkit.generation.search import Hypothesis, SearchConfig, search
from nmtkit.models.loading import LoadedModels, load_models, precision_dtype

MAX_WARNINGS = 20  # over-long inputs named one by one; beyond that only counted
DEFAULT_BATCH_SIZE = 128  # sentences per batch when neither batch_size nor max_tokens is given
_IDS = ("pad", "bos", "eos", "unk")  # SearchConfig fields that come from the target dictionary
# The search settings a caller may give (SearchConfig's fields without the dictionary's ids).
SEARCH_SETTINGS = tuple(f.name for f in dataclasses.fields(SearchConfig) if f.name not in _IDS)


def warn_stderr(msg: str) -> None:
    """The default warning sink: one line on stderr, as `nmtkit generate` prints it."""
    print(f"nmtkit: warning: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass
class Item:
    """One input sentence."""

    index: int  # 0-based position in the input (line number - 1)
    ids: np.ndarray  # source dictionary ids without </s>, already truncated to the model limit
    target_ids: np.ndarray | None = None  # reference (binarized splits only), for T- lines
    text: str | None = None  # the raw input line (raw text only): a parsing model's tree gets its words


class Truncations:
    """Collects the over-long inputs; names the first MAX_WARNINGS of them as they happen.

    `where(index)` names input `index` (0-based) for the user, e.g. `news.en:12`.
    """

    def __init__(self, warn: Callable[[str], None], where: Callable[[int], str], what: str, limit: int):
        self.warn, self.where, self.what, self.limit = warn, where, what, limit
        self.count = 0

    def __call__(self, index: int, ids: np.ndarray) -> np.ndarray:
        if len(ids) <= self.limit:
            return ids
        self.count += 1
        if self.count <= MAX_WARNINGS:
            self.warn(
                f"{self.where(index)}: {len(ids)} tokens, truncated to {self.limit} "
                f"(the model accepts {self.limit + 1} source positions including </s>)"
            )
        return ids[: self.limit]

    def summary(self) -> None:
        if self.count > MAX_WARNINGS:
            self.warn(f"{self.what}: {self.count} inputs in all were truncated ({MAX_WARNINGS} named above)")


def make_batches(items: list[Item], max_tokens: int | None, batch_size: int | None) -> list[list[Item]]:
    """Sort by source length (longest first) and cut into batches.

    A batch holds at most `batch_size` sentences and at most `max_tokens` padded source tokens
    (rows x longest row, </s> included); a single sentence over `max_tokens` still forms a batch
    of its own. Empty sentences are left out: they need no model call.
    """
    todo = sorted((it for it in items if len(it.ids) > 0), key=lambda it: (-len(it.ids), it.index))
    batches: list[list[Item]] = []
    cur: list[Item] = []
    width = 0
    for it in todo:
        w = max(width, len(it.ids) + 1)
        if cur and (
            (batch_size is not None and len(cur) + 1 > batch_size)
            or (max_tokens is not None and w * (len(cur) + 1) > max_tokens)
        ):
            batches.append(cur)
            cur, w = [], len(it.ids) + 1
        cur.append(it)
        width = w
    if cur:
        batches.append(cur)
    return batches


def collate_source(batch: list[Item], eos: int, pad: int) -> torch.Tensor:
    """(B, S) long: each row `ids + [</s>]`, right-padded (docs/internals.md)."""
    S = max(len(it.ids) for it in batch) + 1
    out = np.full((len(batch), S), pad, dtype=np.int64)
    for r, it in enumerate(batch):
        n = len(it.ids)
        out[r, :n] = it.ids
        out[r, n] = eos
    return torch.from_numpy(out)


# ---------------------------------------------------------------------------------------------
# settings


def prepare_runtime(device: str | torch.device, precision: str | torch.dtype, threads: int,
                    warn: Callable[[str], None]) -> tuple[torch.device, torch.dtype]:
    """The process-wide part of loading: CPU threads, the device (checked), the precision's dtype;
    on CPU, malloc keeps freed memory for the next decoding step (`keep_freed_cpu_memory`).

    A separate step so that `nmtkit generate` keeps its order of checks (device before --output).
    """
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


def default_search(manifest: dict) -> SearchConfig:
    """SearchConfig's defaults, with the output limit of a parsing data directory (input + 300,
    the paper's section 6.3) when the manifest says `"task": "parsing"`."""
    if manifest.get("task") == "parsing":
        from nmtkit.parsing.pipeline import PARSING_MAX_LEN_B

        return SearchConfig(max_len_b=PARSING_MAX_LEN_B)
    return SearchConfig()


def _check_type(name: str, value) -> None:
    """Search settings are checked against the type of SearchConfig's default (a str beam would
    otherwise fail deep inside the search with a comparison error)."""
    default = getattr(SearchConfig, name)
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "True or False"
    elif isinstance(default, int) or default is None:  # seed, max_len_cap: int or None
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (default is None and value is None)
        kind = "an int" + (" or None" if default is None else "")
    elif isinstance(default, float):
        ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        ok, kind = isinstance(value, str), "a str"
    if not ok:
        raise UserError(f"search setting {name} must be {kind}, got {value!r}")


def apply_search_settings(base: SearchConfig, overrides: dict) -> SearchConfig:
    """`base` with `overrides` applied, every impossible setting refused as a one-line UserError."""
    for name, value in overrides.items():
        if name not in SEARCH_SETTINGS:
            raise UserError(f"unknown search setting {name!r} (known: {', '.join(SEARCH_SETTINGS)})")
        _check_type(name, value)
    try:
        cfg = dataclasses.replace(base, **overrides)
    except ValueError as e:  # SearchConfig's own checks
        raise UserError(f"search settings: {e}") from None
    if cfg.max_len_a < 0 or cfg.max_len_b < 0:
        raise UserError(f"search settings: max_len_a and max_len_b must be >= 0, got {cfg.max_len_a} and {cfg.max_len_b}")
    if cfg.max_len_cap is not None and cfg.max_len_cap < 0:
        raise UserError(f"search settings: max_len_cap must be >= 0, got {cfg.max_len_cap}")
    if not cfg.sampling and (cfg.topk or cfg.topp or cfg.temperature != 1.0):
        raise UserError("search settings: topk, topp and temperature apply only with sampling=True")
    return cfg


def _is_export(path: str) -> bool:
    from nmtkit.export.directory import is_export_dir

    return is_export_dir(path)


def _paths(path) -> list[str]:
    if isinstance(path, (str, os.PathLike)):
        return [str(path)]
    paths = [str(p) for p in path]
    if not paths:
        raise UserError("Translator.load: no checkpoint given (a path, or a list of paths for an ensemble)")
    return paths


# ---------------------------------------------------------------------------------------------
# the translator


@dataclass(frozen=True)
class Translation:
    """One hypothesis of one sentence, as text and as the search found it."""

    text: str  # detokenized (a bracketed tree on a parsing data directory)
    pieces: list[str]  # target subword tokens, as fairseq's H- lines print them
    hypothesis: Hypothesis  # ids (without </s>) and scores; an empty input's is tokens=[], score 0

    @property
    def score(self) -> float:
        """What the search ranks by: log-probability / lp(|Y|) (natural log; `--print-scores`)."""
        return self.hypothesis.score

    @property
    def logprob(self) -> float:
        """The sum of the token log-probabilities, </s> included."""
        return self.hypothesis.logprob


class Translator:
    """One model or an ensemble, with its data directory's dictionaries and subword models.

    Build it with `Translator.load`. Not thread-safe: one call at a time.
    """

    def __init__(self, loaded: LoadedModels, *, data_dir: str, manifest: dict, src_dict, tgt_dict, tgt_subword,
                 device: torch.device, search: SearchConfig, max_tokens: int | None = None,
                 batch_size: int | None = None, warn: Callable[[str], None] | None = None):
        self.loaded = loaded
        self.models = loaded.models
        self._init_text(data_dir=data_dir, manifest=manifest, src_dict=src_dict, tgt_dict=tgt_dict,
                        tgt_subword=tgt_subword, device=device, search=search, max_tokens=max_tokens,
                        batch_size=batch_size, warn=warn)

    def _init_text(self, *, data_dir, manifest: dict, src_dict, tgt_dict, tgt_subword, device, search: SearchConfig,
                   max_tokens: int | None, batch_size: int | None, warn: Callable[[str], None] | None) -> None:
        """Everything but the models: dictionaries, subword models, batching and search settings
        (shared with the CTranslate2-backed subclass, `nmtkit.generation.ct2_translator`)."""
        for name, v in (("max_tokens", max_tokens), ("batch_size", batch_size)):
            if v is not None and v < 1:
                raise UserError(f"{name} must be >= 1, got {v}")
        self.data_dir = str(data_dir)
        self.manifest = manifest
        self.src_lang, self.tgt_lang = manifest["source_lang"], manifest["target_lang"]
        self.task = manifest.get("task", "translation")
        self.src_dict, self.tgt_dict, self.tgt_subword = src_dict, tgt_dict, tgt_subword
        self.device = device
        self.search = search  # the load-time settings (SearchConfig's names); per call overrides apply on top
        self.max_tokens = max_tokens
        self.batch_size = DEFAULT_BATCH_SIZE if batch_size is None and max_tokens is None else batch_size
        self.warn = warn or warn_stderr
        self._src_subword = None
        self._text_of = None
        if self.task == "parsing":  # one bracketed tree per sentence, of its own words (docs/parsing.md)
            from nmtkit.parsing.pipeline import tree_writer

            self._text_of = tree_writer(self.data_dir, manifest, None, None, src_dict, self.src_lang)

    # -- loading

    @classmethod
    def load(cls, path: str | os.PathLike | Sequence[str | os.PathLike], data_dir: str | os.PathLike | None = None, *,
             device: str | torch.device = "auto", precision: str = "fp32", ema: bool = False, threads: int = 0,
             max_tokens: int | None = None, batch_size: int | None = None, quantize: str | None = None,
             warn: Callable[[str], None] | None = None, search: SearchConfig | None = None,
             **search_settings) -> Translator:
        """Load checkpoint `path` (or a list of them: an ensemble) for the data directory it was trained on.

        `data_dir` is required: its dictionaries must be the checkpoints' (checked by sha256, and
        the language pair), and its subword models segment the input and detokenize the output.
        `device`: auto, cpu, cuda, cuda:N or mps; `precision`: fp32, bf16 or fp16; `ema`: the
        checkpoints' EMA weights; `threads`: torch's CPU threads (0 = leave torch's choice; this
        is process-wide). `quantize`: "int8" for int8 linear layers on CPU (faster; scores stay
        fp32; docs/generate.md gives the BLEU cost), None or "none" for the model's own weights.
        `max_tokens` / `batch_size`: batch limits (default 128 sentences).
        `warn`: where warnings go (default: stderr). `search_settings`: SearchConfig's fields
        (beam, lenpen, lenpen_form, max_len_a, max_len_b, min_len, no_repeat_ngram_size,
        unk_penalty, nbest, early_stop, sampling, topk, topp, temperature, seed, max_len_cap),
        the defaults of every later call; `search`: a whole SearchConfig to start from instead
        of the defaults.

        `path` may instead be a directory made by `nmtkit export` (without `data_dir`): the
        result is then a `CTranslate2Translator` (nmtkit.generation.ct2_translator), the same
        interface running on CTranslate2, with the export's own dictionaries and subword models.
        """
        paths = _paths(path)
        exported = [p for p in paths if _is_export(p)]
        if exported:  # a directory made by `nmtkit export`: the CTranslate2 runtime (docs/export.md)
            if data_dir is not None or len(paths) > 1:
                raise UserError(f"{exported[0]} is an export directory: it carries its own dictionaries and "
                                "subword models; load it alone, without data_dir (no ensembles of exports)")
            if quantize not in (None, "none"):
                raise UserError(f"quantize: {exported[0]} runs with the weight type chosen when it was exported "
                                "(nmtkit export --quantization int8)")
            from nmtkit.generation.ct2_translator import CTranslate2Translator

            return CTranslate2Translator.load(paths[0], device=device, precision=precision, ema=ema,
                                              threads=threads, max_tokens=max_tokens, batch_size=batch_size,
                                              warn=warn, search=search, **search_settings)
        if data_dir is None:
            raise UserError(
                "Translator.load: data_dir is required: the data directory the checkpoint was trained "
                "with (its dictionaries and subword models), unless path is a directory made by nmtkit export"
            )
        warn = warn or warn_stderr
        dev, dtype = prepare_runtime(device, precision, threads, warn)
        return cls.open(paths, data_dir, dev, dtype, ema=ema, quantize=quantize, max_tokens=max_tokens, batch_size=batch_size,
                        warn=warn, search=search, **search_settings)

    @classmethod
    def open(cls, paths: Sequence[str], data_dir: str | os.PathLike, device: torch.device, dtype: torch.dtype, *,
             ema: bool = False, quantize: str | None = None, max_tokens: int | None = None,
             batch_size: int | None = None, warn: Callable[[str], None] | None = None,
             search: SearchConfig | None = None, **search_settings) -> Translator:
        """`load` without its process-wide set-up (threads, device check): for callers that did it
        already, as `nmtkit generate` does. `device` is a resolved torch.device.

        On CPU the linear layers get prepacked fp32 kernels (or int8 ones with `quantize`):
        nmtkit.models.quantize."""
        from nmtkit.data.manifest import load_dictionaries, load_manifest
        from nmtkit.data.subwords import load_subword_model

        manifest = load_manifest(data_dir)
        src_lang, tgt_lang = manifest["source_lang"], manifest["target_lang"]
        cfg = apply_search_settings(search if search is not None else default_search(manifest), search_settings)
        src_dict, tgt_dict = load_dictionaries(data_dir, manifest)
        tgt_subword = load_subword_model(data_dir, tgt_lang)
        loaded = load_models(list(paths), src_dict, tgt_dict, device, dtype, ema=ema, langs=(src_lang, tgt_lang),
                             quantize=quantize, prepack=True)
        return cls(loaded, data_dir=str(data_dir), manifest=manifest, src_dict=src_dict, tgt_dict=tgt_dict,
                   tgt_subword=tgt_subword, device=device, search=cfg, max_tokens=max_tokens,
                   batch_size=batch_size, warn=warn)

    # -- properties

    @property
    def src_subword(self):
        """The source subword model (loaded on first use: a binarized split never needs it)."""
        if self._src_subword is None:
            from nmtkit.data.subwords import load_subword_model

            self._src_subword = load_subword_model(self.data_dir, self.src_lang)
        return self._src_subword

    @property
    def max_source_tokens(self) -> int:
        """Source tokens (without </s>) that every model accepts; longer inputs are truncated."""
        return self.loaded.max_source_tokens

    def search_config(self, **overrides) -> SearchConfig:
        """The complete SearchConfig a call runs with: the load-time settings with `overrides`,
        the target dictionary's special ids, and the output limit capped by the models' positions."""
        cfg = apply_search_settings(self.search, overrides) if overrides else self.search
        top = self.loaded.max_target_tokens
        cap = top if cfg.max_len_cap is None else min(cfg.max_len_cap, top)
        t = self.tgt_dict
        return dataclasses.replace(cfg, max_len_cap=cap, pad=t.pad, bos=t.bos, eos=t.eos, unk=t.unk)

    # -- text <-> items

    def truncations(self, where: Callable[[int], str], what: str) -> Truncations:
        """A truncation counter for one input: `where(i)` names input i in its warning."""
        return Truncations(self.warn, where, what, self.max_source_tokens)

    def items(self, lines: Iterable[str], trunc: Truncations) -> Iterator[Item]:
        """Items of raw sentences (lazily, for streaming): subword-encoded, mapped to ids, truncated."""
        for i, line in enumerate(lines):
            if line.strip():
                ids = self.src_dict.encode(self.src_subword.encode(line))
            else:
                ids = np.zeros(0, dtype=np.int64)
            yield Item(i, trunc(i, ids), text=line)

    def encode(self, sentences: Sequence[str]) -> list[Item]:
        """Items of a list of raw sentences; over-long ones are truncated with a warning naming
        `sentence N` (1-based)."""
        if isinstance(sentences, str):
            raise UserError("translate takes a list of sentences, got one str; wrap it: translate([text])")
        sentences = list(sentences)
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise UserError(f"sentence {i + 1} is a {type(s).__name__}, not a str")
        trunc = self.truncations(lambda i: f"sentence {i + 1}", "translate")
        items = list(self.items(sentences, trunc))
        trunc.summary()
        return items

    def text(self, item: Item, pieces: list[str]) -> str:
        """The output text of hypothesis `pieces` (target subword tokens) for `item`: detokenized,
        or a tree over the item's words on a parsing data directory (`[]` gives the flat tree)."""
        if self._text_of is not None:
            return self._text_of(item, pieces)
        return self.tgt_subword.decode(pieces)

    # -- translating

    def translate_items(self, items: Sequence[Item], *, on_batch: Callable[[int], None] | None = None,
                        **search_settings) -> dict[int, list[Hypothesis]]:
        """Up to `nbest` hypotheses (best first) for every non-empty item, keyed by `item.index`.

        The lower-level call: items may come from `encode` or from a binarized split
        (`nmtkit.data.shards.load_split`); empty items get no entry (no model call).
        `on_batch(n)` is called after each batch of n sentences (progress bars).
        """
        cfg = self.search_config(**search_settings)
        results: dict[int, list[Hypothesis]] = {}
        for batch in make_batches(list(items), self.max_tokens, self.batch_size):
            src = collate_source(batch, self.src_dict.eos, self.src_dict.pad).to(self.device)  # (B, S)
            for it, hyps in zip(batch, search(self.models, src, cfg)):
                results[it.index] = hyps
            if on_batch is not None:
                on_batch(len(batch))
        return results

    def _run(self, sentences: Sequence[str], settings: dict) -> list[tuple[Item, list[Hypothesis] | None]]:
        """(item, hypotheses) per sentence in order; None for an empty sentence (no model call)."""
        items = self.encode(sentences)
        results = self.translate_items(items, **settings)
        return [(it, results.get(it.index)) for it in items]

    def _empty_text(self, item: Item) -> str:
        """The output of a sentence without hypotheses: "" (a flat tree of its words when parsing)."""
        return "" if self._text_of is None else self._text_of(item, [])

    def translate_nbest(self, sentences: Sequence[str], **search_settings) -> list[list[Translation]]:
        """Per sentence, its hypotheses best first (at most `nbest`), as `Translation`s.

        An empty or whitespace-only sentence gives one empty translation with score 0 (the
        certain, empty, output; no model call). A search that found fewer than `nbest`
        hypotheses (tiny vocabularies) gives fewer: no padding, unlike the CLI's fixed line count.
        """
        out = []
        for it, hyps in self._run(sentences, search_settings):
            if hyps is None:
                out.append([Translation(self._empty_text(it), [], Hypothesis(tokens=[], score=0.0, logprob=0.0))])
                continue
            row = []
            for h in hyps:
                pieces = self.tgt_dict.string(h.tokens)
                row.append(Translation(self.text(it, pieces), pieces, h))
            out.append(row)
        return out

    def translate(self, sentences: Sequence[str], **search_settings) -> list[str]:
        """One output text per sentence, in order: the best hypothesis, detokenized (a tree on a
        parsing data directory); `""` for an empty sentence. Per-call `search_settings` override
        the load-time ones for this call only."""
        return [
            self.text(it, self.tgt_dict.string(hyps[0].tokens)) if hyps else self._empty_text(it)
            for it, hyps in self._run(sentences, search_settings)
        ]

    # -- given targets: scores, attention weights, alignments (nmtkit.generation.forced)

    def target_ids(self, text: str, where: str) -> np.ndarray:
        """Target dictionary ids of one raw target sentence (segmented with the target subword
        model). UserError naming `where` for a piece outside the dictionary (its score would be
        that of <unk>: nothing to learn from) or a target longer than the model accepts. An empty
        target is the empty translation (</s> alone), which the search may output too."""
        pieces = self.tgt_subword.encode(text)
        ids = self.tgt_dict.encode(pieces)
        unknown = [p for p, i in zip(pieces, ids) if i == self.tgt_dict.unk]
        if unknown:
            shown = ", ".join(repr(p) for p in dict.fromkeys(unknown[:5]))
            raise UserError(f"{where}: target token(s) {shown} not in the target dictionary "
                            f"({len(self.tgt_dict)} symbols); a score or an alignment of <unk> says nothing")
        limit = self.loaded.max_target_tokens
        if len(ids) > limit:
            raise UserError(f"{where}: the target has {len(ids)} tokens; the model accepts at most {limit}")
        return ids

    def _own_models(self, what: str) -> None:
        """UserError unless this translator runs nmtkit's own models: forced decoding and attention
        read them directly (a translator without them, like one of an export directory run by
        CTranslate2, has none to read)."""
        if not self.models:
            raise UserError(f"{what} needs nmtkit's own model: load the checkpoint and its data directory "
                            "(an export directory is run by CTranslate2, which exposes no attention or forced scores)")

    def _layer(self, layer: int, kind: str = "cross") -> int:
        """A 0-based (negative: from the top) layer index checked against every model."""
        n = min(len(m.attention_modules(kind)) for m in self.models)
        if not -n <= layer < n:
            raise UserError(f"{kind} attention layer {layer} (0-based) is out of range: the model has {n} layers")
        return layer

    def score_items(self, items: Sequence[Item], *, alignment_layer: int | None = None,
                    on_batch: Callable[[int], None] | None = None
                    ) -> tuple[dict[int, list[Hypothesis]], dict[int, list[list[tuple[int, int]]]]]:
        """Score each item's `target_ids` given its source (forced decoding, batched).

        Returns ({index: [the target as a Hypothesis with the search's score]}, {index: [its
        subword alignment]}, the second only with `alignment_layer` (0-based, -1 = last)). The
        score is `logprob / lp(|Y|)` with this translator's lenpen and lenpen_form: a beam
        hypothesis fed back gets the score the search reported (unk_penalty and the search's
        length rules are not applied: this is the model's probability of the given text).
        """
        self._own_models("scoring given translations")
        cfg = self.search_config()
        t = self.tgt_dict
        layer = None if alignment_layer is None else self._layer(alignment_layer)
        scores: dict[int, list[Hypothesis]] = {}
        aligns: dict[int, list[list[tuple[int, int]]]] = {}
        todo = [it for it in items if it.target_ids is not None]
        # make_batches leaves out empty sources (translation needs no model call for them);
        # scoring runs them too, as a source of </s> alone
        empty = [it for it in todo if len(it.ids) == 0]
        batches = make_batches(todo, self.max_tokens, self.batch_size) + ([empty] if empty else [])
        for batch in batches:
            src = collate_source(batch, self.src_dict.eos, self.src_dict.pad).to(self.device)  # (B, S)
            targets = [[int(x) for x in it.target_ids] for it in batch]
            lp, attn = forced.forced_pass(self.models, src, targets, bos=t.bos, eos=t.eos, pad=t.pad,
                                          cross_layer=layer)
            for r, (it, tgt) in enumerate(zip(batch, targets)):
                ps = forced.pair_score(lp[r, :len(tgt) + 1].tolist(), cfg.lenpen, cfg.lenpen_form)
                scores[it.index] = [Hypothesis(tgt, ps.score, ps.logprob, ps.positional_scores)]
                if attn is not None:
                    aligns[it.index] = [forced.hard_alignment(attn[r], len(it.ids), len(tgt))]
            if on_batch is not None:
                on_batch(len(batch))
        return scores, aligns

    def align_items(self, items: Sequence[Item], results: dict[int, list[Hypothesis]],
                    layer: int = -1) -> dict[int, list[list[tuple[int, int]]]]:
        """Subword alignments (source, target) of each item's hypotheses (`translate_items`'s
        results), from the head-averaged cross-attention of decoder `layer` (0-based, -1 = the
        last, as fairseq), averaged over an ensemble's models: one teacher-forced pass per batch."""
        self._own_models("alignments")
        layer = self._layer(layer)
        t = self.tgt_dict
        out: dict[int, list[list[tuple[int, int]]]] = {}
        todo = [it for it in items if results.get(it.index)]
        for batch in make_batches(todo, self.max_tokens, self.batch_size):
            rows = [(it, h) for it in batch for h in results[it.index]]
            src = collate_source([it for it, _ in rows], self.src_dict.eos, self.src_dict.pad).to(self.device)
            _, attn = forced.forced_pass(self.models, src, [h.tokens for _, h in rows], bos=t.bos, eos=t.eos,
                                         pad=t.pad, cross_layer=layer, want_scores=False)
            for r, (it, h) in enumerate(rows):
                out.setdefault(it.index, []).append(forced.hard_alignment(attn[r], len(it.ids), len(h.tokens)))
        return out

    def source_pieces(self, item: Item) -> list[str]:
        """The item's source subword pieces as segmented (raw text), or its dictionary strings
        (binarized splits: an <unk> shows as "<unk>")."""
        if item.text is not None:
            return self.src_subword.encode(item.text)[:len(item.ids)]
        return [self.src_dict[int(i)] for i in item.ids]

    def word_alignment(self, item: Item, target_tokens: Sequence[int],
                       pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Subword pairs of a hypothesis -> pairs of words, the words of the detokenized source
        and output (a word is aligned to every word one of its pieces is aligned to)."""
        if self.task == "parsing":
            raise UserError("--print-alignment words: a parsing model's output is a tree, not words; "
                            "use --print-alignment (subword)")
        src_words = forced.word_index(self.source_pieces(item), self.src_subword.kind)
        tgt_words = forced.word_index([self.tgt_dict[int(i)] for i in target_tokens], self.tgt_subword.kind)
        return forced.word_alignment(pairs, src_words, tgt_words)

    def score(self, sources: Sequence[str], targets: Sequence[str]) -> list[forced.PairScore]:
        """The model's scores of given translations, in order: per pair its log-probability
        (</s> included), |Y| (target tokens + </s>), the length-normalized score the search
        would report for it (this translator's lenpen and lenpen_form) and the per-token
        log-probabilities. An ensemble scores with the mean of its models' log-probabilities.

        Sources and targets are raw text, segmented like `translate`'s input; an empty source,
        a target piece outside the dictionary or lists of different lengths are UserErrors (an
        empty target is the empty translation).
        """
        self._own_models("score")
        if isinstance(sources, str) or isinstance(targets, str):
            raise UserError("score takes two lists of sentences; wrap single ones: score([src], [tgt])")
        sources, targets = list(sources), list(targets)
        if len(sources) != len(targets):
            raise UserError(f"score: {len(sources)} sources but {len(targets)} targets (one target per source)")
        items = self.encode(sources)
        for it, tgt in zip(items, targets):
            if not isinstance(tgt, str):
                raise UserError(f"target {it.index + 1} is a {type(tgt).__name__}, not a str")
            if len(it.ids) == 0:
                raise UserError(f"source {it.index + 1}: empty source sentence (every pair needs a source and a target)")
            it.target_ids = self.target_ids(tgt, f"target {it.index + 1}")
        scores, _ = self.score_items(items)
        out = []
        for it in items:
            h = scores[it.index][0]
            out.append(forced.PairScore(h.logprob, len(h.positional_scores), h.score, h.positional_scores))
        return out

    def attention(self, src: str, tgt: str | None = None, **search_settings) -> forced.Attention:
        """Every attention weight of the model for `src` and a target: `tgt` (raw text) when given,
        else the model's own best translation (search settings as in `translate`, overridable
        here). One model only (load one checkpoint). See `nmtkit.generation.forced.Attention`:
        per-layer, per-head arrays with the token strings; `.words()` merges subwords."""
        self._own_models("attention")
        if not isinstance(src, str) or (tgt is not None and not isinstance(tgt, str)):
            raise UserError("attention takes one source sentence (a str) and optionally one target (a str)")
        (item,) = self.encode([src])
        return self.attention_of_item(item, tgt, **search_settings)

    def attention_of_item(self, item: Item, tgt: str | None = None, *, where: str = "attention",
                          target_where: str | None = None, **search_settings) -> forced.Attention:
        """`attention` for an Item (raw text from `encode`, or a binarized split's): the target is
        `tgt` (raw text), else the item's `target_ids`, else the model's own translation. Errors
        name the sentence as `where` (and a bad target as `target_where`)."""
        self._own_models("attention")
        if len(self.models) > 1:
            raise UserError(f"attention is per model: this translator holds {len(self.models)}; load one checkpoint")
        if len(item.ids) == 0:
            raise UserError(f"{where}: empty source sentence")
        if tgt is not None:
            tokens = [int(x) for x in self.target_ids(tgt, target_where or f"{where} target")]
        elif item.target_ids is not None:
            tokens = [int(x) for x in item.target_ids]
        else:
            tokens = self.translate_items([item], **search_settings)[item.index][0].tokens
        return self._attention_of(item, tokens, given=tgt is not None or item.target_ids is not None)

    def _attention_of(self, item: Item, tokens: list[int], given: bool) -> forced.Attention:
        model, t = self.models[0], self.tgt_dict
        src = collate_source([item], self.src_dict.eos, self.src_dict.pad).to(self.device)  # (1, S)
        prev, out = forced.collate_targets([tokens], t.bos, t.eos, t.pad)
        with torch.inference_mode():
            logits, w = model.forward_with_attention(src, prev.to(self.device))
        lp = torch.log_softmax(logits[0].float(), dim=-1).gather(1, out[0].to(self.device)[:, None]).view(-1)
        cfg = self.search_config()

        def stack(kind: str) -> np.ndarray:  # (layers, heads, rows, cols) of the one sentence
            return torch.stack([w[kind][i][0] for i in sorted(w[kind])]).cpu().numpy()

        src_pieces = self.source_pieces(item)
        tgt_pieces = [t[i] for i in tokens]
        sw = forced.word_index(src_pieces, self.src_subword.kind)
        tw = forced.word_index(tgt_pieces, self.tgt_subword.kind)
        n_sw, n_tw = (sw[-1] + 1 if sw else 0), (tw[-1] + 1 if tw else 0)
        eos = forced.EOS_SYMBOL
        return forced.Attention(
            source_tokens=src_pieces + [eos], target_tokens=tgt_pieces + [eos],
            decoder_inputs=[forced.BOS_SYMBOL] + tgt_pieces,
            enc_self=stack("enc-self"), dec_self=stack("dec-self"), cross=stack("cross"),
            score=forced.pair_score(lp.tolist(), cfg.lenpen, cfg.lenpen_form), target_given=given,
            source_word_of=sw + [n_sw], target_word_of=tw + [n_tw],
            source_words=forced.word_strings(src_pieces, sw, self.src_subword.decode) + [eos],
            target_words=forced.word_strings(tgt_pieces, tw, self.tgt_subword.decode) + [eos],
        )

    def __repr__(self) -> str:
        return (f"Translator({len(self.models)} model(s) {self.loaded.paths}, {self.src_lang}->{self.tgt_lang}, "
                f"{self.task}, device={self.device}, beam={self.search.beam})")
