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
`max_len_b`, which defaults to 300 on a parsing data directory as in `nmtkit generate`, and
`early_stop`, which is the engine's own rule (fairseq's on CTranslate2).

The model work is an engine's (`nmtkit.backends.engine`): nmtkit's own checkpoints on PyTorch,
or a directory made by `nmtkit export` on its runtime. `load` is the one opener: it decides once
what the path is (`nmtkit.backends.registry`) and holds no other branch on the engine; what an
engine cannot do is refused in one line from what it declares. Importing this module imports no
torch: an export run by a torch-free engine never loads it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nmtkit.backends.engine import Engine, RuntimeOptions
from nmtkit.backends.registry import ModelSource, check_quantize, describe
from nmtkit.data.languages import check_direction, langs_of, tag_token
from nmtkit.errors import UserError
from nmtkit.generation.items import DEFAULT_BATCH_SIZE, Item, Truncations, make_batches, warn_stderr
from nmtkit.generation.terms import TermMaker
from nmtkit.search.config import (DECODING_PRESETS, Hypothesis, SearchConfig, Terms, apply_search_settings, check_terms,
                                  default_search, output_limit)

if TYPE_CHECKING:  # imported where used: translating needs none of forced decoding
    from nmtkit import forced


def check_text(text: str, where: str) -> None:
    """UserError naming `where` unless `text` is valid Unicode text (encodable as UTF-8).

    A command-line argument with bytes that are not UTF-8 reaches Python with each bad byte as a
    lone surrogate (U+DC80..U+DCFF, `surrogateescape`); a Python caller can pass any lone
    surrogate ("\\ud800"). Neither can be segmented, so either is named here, before segmentation.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        c = ord(text[e.start])
        what = f"byte 0x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"lone surrogate U+{c:04X}"
        raise UserError(f"{where}: not valid UTF-8 text ({what} at column {e.start + 1})") from None


def decoding_settings(settings: dict) -> dict:
    """A caller's search settings with `decoding` ("paper" or "fairseq", as `--decoding`)
    replaced by the length penalty and stopping rule it names; a `lenpen_form` or `early_stop`
    given beside it wins, as a flag given beside `--decoding` does."""
    if "decoding" not in settings:
        return settings
    settings = dict(settings)
    decoding = settings.pop("decoding")
    if decoding is None:
        return settings
    if not isinstance(decoding, str) or decoding not in DECODING_PRESETS:
        raise UserError(f"decoding must be one of {', '.join(DECODING_PRESETS)}, got {decoding!r}")
    return {**DECODING_PRESETS[decoding], **settings}


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

    def __init__(self, engine: Engine, source: ModelSource, *, src_dict, tgt_dict, tgt_subword, search: SearchConfig,
                 max_tokens: int | None = None, batch_size: int | None = None,
                 warn: Callable[[str], None] | None = None):
        for name, v in (("max_tokens", max_tokens), ("batch_size", batch_size)):
            if v is not None and v < 1:
                raise UserError(f"{name} must be >= 1, got {v}")
        self.engine = engine
        self.model_source = source  # what the model path is: checkpoints or an export
        self.data_dir = source.folder  # the data directory, or the export directory's copies of its files
        self.manifest = manifest = source.manifest
        self.src_lang, self.tgt_lang = manifest["source_lang"], manifest["target_lang"]
        # a multilingual model's languages ([] for a bilingual one) and the target asked for when a
        # call names none (`load(..., target_lang=)`, `generate --target-lang`)
        self.langs = langs_of(manifest)
        self.target_lang: str | None = None
        self.task = manifest.get("task", "translation")
        self.src_dict, self.tgt_dict, self.tgt_subword = src_dict, tgt_dict, tgt_subword
        self.search = search  # the load-time settings (SearchConfig's names); per call overrides apply on top
        self.max_tokens = max_tokens
        self.batch_size = DEFAULT_BATCH_SIZE if batch_size is None and max_tokens is None else batch_size
        self.warn = warn or warn_stderr
        self.positional_scores = False  # per-token scores of every hypothesis, even where they cost a pass
        self._src_subword = None
        self._text_of = None
        self._term_maker = None
        if self.task == "parsing":  # one bracketed tree per sentence, of its own words (docs/parsing.md)
            from nmtkit.parsing.pipeline import tree_writer

            self._text_of = tree_writer(self.data_dir, manifest, None, None, src_dict, self.src_lang)

    # -- loading: the one opener

    @classmethod
    def load(cls, path: str | os.PathLike | Sequence[str | os.PathLike], data_dir: str | os.PathLike | None = None, *,
             device: str = "auto", precision: str = "fp32", ema: bool = False, threads: int = 0,
             max_tokens: int | None = None, batch_size: int | None = None, quantize: str | None = None,
             warn: Callable[[str], None] | None = None, search: SearchConfig | None = None,
             target_lang: str | None = None, shortlist: str | os.PathLike | None = None,
             **search_settings) -> Translator:
        """Load checkpoint `path` (or a list of them: an ensemble) for the data directory it was trained on.

        `data_dir` is required: its dictionaries must be the checkpoints' (checked by sha256, and
        the language pair), and its subword models segment the input and detokenize the output.
        `device`: auto, cpu, cuda, cuda:N or mps; `precision`: fp32, bf16 or fp16; `ema`: the
        checkpoints' EMA weights; `threads`: the runtime's CPU threads (0 = its default; torch's
        setting is process-wide). `quantize`: "int8" for int8 linear layers on CPU (faster; scores
        stay fp32; docs/generate.md gives the BLEU cost), None or "none" for the model's own weights.
        `max_tokens` / `batch_size`: batch limits (default 128 sentences).
        `warn`: where warnings go (default: stderr). `search_settings`: SearchConfig's fields
        (beam, lenpen, lenpen_form, max_len_a, max_len_b, min_len, no_repeat_ngram_size,
        unk_penalty, nbest, early_stop, sampling, topk, topp, temperature, seed, max_len_cap),
        the defaults of every later call, and `decoding`, `nmtkit generate --decoding`'s one word
        for the length penalty and stopping rule: "paper" (lenpen_form gnmt, early_stop bound)
        or "fairseq" (lenpen_form fairseq, early_stop beam); a lenpen_form or early_stop given
        beside it wins. `search`: a whole SearchConfig to start from instead of the defaults.

        `path` may instead be a directory made by `nmtkit export` (without `data_dir`): it is then
        run by that format's engine (CTranslate2: `nmtkit.backends.ctranslate2.engine`), with the
        export's own dictionaries and subword models, behind the same interface.

        `target_lang`: a multilingual model's target language when a call names none (each of
        `translate`, `translate_nbest`, `encode`, `score` and `attention` takes `target_lang=`
        too); a bilingual model accepts only its own target language or None.

        `shortlist`: a lexical shortlist file (`nmtkit shortlist`; docs/generate.md, "Lexical
        shortlists"): every search restricts the output layer to the union of its batch's
        candidates (faster; scores normalised over the candidates). Scores of given targets and
        attention are unaffected.
        """
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        source = describe(paths, data_dir, ema=ema, api=True)
        check_quantize(source, quantize, api=True)
        options = RuntimeOptions(str(device), precision, threads, ema, quantize)
        source.check()  # the files first: the defaults depend on the data directory's manifest
        if search is None:
            search = cls.search_defaults(source)
        search = apply_search_settings(search, decoding_settings(search_settings))
        tr = cls.open(source, options, max_tokens=max_tokens, batch_size=batch_size,
                      warn=warn, search=search, shortlist=shortlist)
        tr.set_target_lang(target_lang)
        return tr

    @classmethod
    def open(cls, source: ModelSource, options: RuntimeOptions, *, search: SearchConfig, prepared=None,
             max_tokens: int | None = None, batch_size: int | None = None,
             warn: Callable[[str], None] | None = None, shortlist: str | os.PathLike | None = None) -> Translator:
        """`load` for a model already described (`nmtkit.backends.registry.describe`) and the
        load-time search its caller decided (a command's flags; `load`'s `search_defaults` with
        its settings): the search checked against the engine before anything is read, then the
        files the description names (`ModelSource.check`), the engine's process-wide set-up
        (`prepared`: its result, when the caller ran it already, as `nmtkit generate` does to
        check the device before its --output), the dictionaries and subword models, then the engine."""
        warn = warn or warn_stderr
        source.engine.check_search(search)
        source.check()
        if prepared is None:
            prepared = source.engine.prepare(options, warn)
        src_dict, tgt_dict = source.dictionaries()
        tgt_subword = source.subword_model(source.manifest["target_lang"])
        shortlisted = None
        if shortlist is not None:  # read before the model: a bad file costs no load
            from nmtkit.data.shortlist import Shortlist

            source.engine.require_shortlists()
            shortlisted = Shortlist.load(shortlist, src_dict, tgt_dict)
        engine = source.engine.open(source, prepared, src_dict, tgt_dict, options, search)
        if shortlisted is not None:
            engine.use_shortlist(shortlisted)
        tr = cls(engine, source, src_dict=src_dict, tgt_dict=tgt_dict, tgt_subword=tgt_subword, search=search,
                 max_tokens=max_tokens, batch_size=batch_size, warn=warn)
        return tr

    @staticmethod
    def search_defaults(source: ModelSource) -> SearchConfig:
        """SearchConfig's defaults for `source`: the output limit of its data (a parsing model's
        input + 300) and its engine's own rules (CTranslate2 has only fairseq's length penalty
        and stopping rule)."""
        return dataclasses.replace(default_search(source.manifest), **source.engine.search_defaults)

    # -- properties

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def src_subword(self):
        """The source subword model (loaded on first use: a binarized split never needs it)."""
        if self._src_subword is None:
            self._src_subword = self.model_source.subword_model(self.src_lang)
        return self._src_subword

    @property
    def max_source_tokens(self) -> int:
        """Source tokens (without </s>) that every model accepts; longer inputs are truncated."""
        return self.engine.max_source_tokens

    def search_config(self, **overrides) -> SearchConfig:
        """The complete SearchConfig a call runs with: the load-time settings with `overrides`,
        the target dictionary's special ids, and the output limit capped by the models' positions.
        An override the engine cannot honour is refused here, in the engine's one line (the
        load-time settings were checked by `open`). `decoding` ("paper", "fairseq") stands for
        its lenpen_form and early_stop, as in `load`."""
        cfg = self.search
        overrides = decoding_settings(overrides)
        if overrides:
            cfg = apply_search_settings(cfg, overrides)
            self.engine.check_search(cfg)
        top = self.engine.max_target_tokens
        cap = top if cfg.max_len_cap is None else min(cfg.max_len_cap, top)
        t = self.tgt_dict
        banned = tuple(t.index(tag_token(lang)) for lang in self.langs)  # no output holds a language tag
        return dataclasses.replace(cfg, max_len_cap=cap, pad=t.pad, bos=t.bos, eos=t.eos, unk=t.unk, banned=banned)

    # -- languages (a multilingual model: nmtkit.data.languages)

    def set_target_lang(self, lang: str | None, where: str = "target_lang") -> None:
        """The target language of calls that name none, checked (None: every call must name one
        on a multilingual model)."""
        if lang is not None:
            self.tag_id(lang, where)
        self.target_lang = lang

    def tag_id(self, target_lang: str | None, where: str = "target_lang") -> int | None:
        """The source tag id that asks a multilingual model for `target_lang` (or this translator's
        `target_lang`); None on a bilingual model, which needs none and accepts only its own target
        language. An unknown or missing language is one line naming the model's languages."""
        lang = target_lang if target_lang is not None else self.target_lang
        if not self.langs:
            if lang is not None and lang != self.tgt_lang:
                raise UserError(f"{where}: {lang!r}: the model translates {self.src_lang} into {self.tgt_lang} only")
            return None
        if lang is not None and not isinstance(lang, str):
            raise UserError(f"{where} must be a language (a str), got {type(lang).__name__}")
        _, lang = check_direction(self.manifest, None, lang, where)
        return self.src_dict.index(tag_token(lang))

    def tag_ids(self, target_lang, n: int, where: str = "target_lang") -> list[int | None]:
        """One tag id per sentence: `target_lang` is one language for all, or a list with one per
        sentence; `where` names it in errors (serve: '"target_lang"')."""
        if isinstance(target_lang, (list, tuple)):
            if len(target_lang) != n:
                raise UserError(f"{where} must be one language or a list with one per sentence ({n}), "
                                f"got {len(target_lang)} entries")
            return [self.tag_id(lang, f"{where}[{i}]") for i, lang in enumerate(target_lang)]
        return [self.tag_id(target_lang, where)] * n

    # -- text <-> items

    def truncations(self, where: Callable[[int], str], what: str) -> Truncations:
        """A truncation counter for one input: `where(i)` names input i in its warning."""
        return Truncations(self.warn, where, what, self.max_source_tokens)

    def items(self, lines: Iterable[str], trunc: Truncations, tags: Sequence[int | None] | None = None) -> Iterator[Item]:
        """Items of raw sentences (lazily, for streaming): subword-encoded, mapped to ids, truncated.
        A sentence that is not text (`check_text`) is a UserError naming it by `trunc.where`.
        On a multilingual model each non-empty sentence starts with its target's tag (`tags[i]`,
        else this translator's `target_lang`); an empty one stays empty (no model call)."""
        default = self.tag_id(None) if tags is None else None
        for i, line in enumerate(lines):
            check_text(line, trunc.where(i))
            tag = default if tags is None else tags[i]
            if not line.strip():
                yield Item(i, np.zeros(0, dtype=np.int64), text=line)
            else:  # a tag counts against the source limit and is never cut off
                yield Item(i, trunc(i, self.source_ids(line, tag)), text=line, lead=int(tag is not None))

    def source_ids(self, line: str, tag: int | None = None) -> np.ndarray:
        """Source dictionary ids of one raw sentence, after the language tag `tag` when given."""
        ids = self.src_dict.encode(self.src_subword.encode(line))
        return ids if tag is None else np.concatenate(([tag], ids)).astype(ids.dtype)

    def encode(self, sentences: Sequence[str], target_lang: str | Sequence[str] | None = None) -> list[Item]:
        """Items of a list of raw sentences; over-long ones are truncated with a warning naming
        `sentence N` (1-based). `target_lang`: a multilingual model's target, one for all or one
        per sentence (default: the translator's `target_lang`)."""
        if isinstance(sentences, str):
            raise UserError("translate takes a list of sentences, got one str; wrap it: translate([text])")
        sentences = list(sentences)
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise UserError(f"sentence {i + 1} is a {type(s).__name__}, not a str")
        tags = self.tag_ids(target_lang, len(sentences))
        trunc = self.truncations(lambda i: f"sentence {i + 1}", "translate")
        items = list(self.items(sentences, trunc, tags))
        trunc.summary()
        return items

    def text(self, item: Item, pieces: list[str]) -> str:
        """The output text of hypothesis `pieces` (target subword tokens) for `item`: detokenized,
        or a tree over the item's words on a parsing data directory (`[]` gives the flat tree)."""
        if self._text_of is not None:
            return self._text_of(item, pieces)
        return self.tgt_subword.decode(pieces)

    # -- terminology (docs/generate.md, "Terminology")

    def terms(self, constraints: Sequence[str] | None = None, avoid: Sequence[str] | None = None,
              prefix: str | None = None, ordered: bool = False, where: str = "sentence") -> Terms | None:
        """One sentence's terms from text (None when it has none): `constraints`, phrases its
        output must contain (`ordered`: in this order); `avoid`, phrases it must not contain (in
        any segmentation); `prefix`, text it must start with. Segmented with the target subword
        model; a mistake is a UserError naming `where` (`nmtkit.generation.terms`)."""
        if self._term_maker is None:
            self._term_maker = TermMaker(self.tgt_subword, self.tgt_dict)
        return self._term_maker.make(constraints, avoid, prefix, ordered, where)

    def attach_terms(self, items: Sequence[Item], constraints=None, avoid=None, prefix=None, ordered: bool = False,
                     where: Callable[[int], str] = lambda i: f"sentence {i + 1}") -> None:
        """Set each item's terms from per-sentence lists (None: no sentence has any): constraints
        and avoid hold one list of phrases (or None) per item, prefix one string (or None)."""
        for name, v in (("constraints", constraints), ("avoid", avoid), ("prefix", prefix)):
            if v is not None and (isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or len(v) != len(items)):
                got = f"{len(v)} entries" if isinstance(v, Sequence) and not isinstance(v, str) else repr(v)[:40]
                raise UserError(f"{name} must be a list with one entry per sentence ({len(items)}), got {got}")
        for k, it in enumerate(items):
            c, a, p = (None if v is None else v[k] for v in (constraints, avoid, prefix))
            it.terms = self.terms(c, a, p, ordered, where(it.index))

    def _check_terms(self, items: Sequence[Item], cfg: SearchConfig) -> None:
        """Refuse, naming the sentence, terms the engine or the search cannot honour
        (`check_terms`: sampling, the beam, the output limit) or that an empty sentence has."""
        todo = [it for it in items if it.terms]
        if not todo:
            return
        self.engine.require_terms()
        for it in todo:
            if len(it.ids) == 0 and (it.terms.include or it.terms.prefix):
                raise UserError(f"{it.terms.where}: an empty sentence has no translation to constrain")
            check_terms(it.terms, cfg, output_limit(len(it.ids), cfg))

    def _search(self, batch: list[Item], cfg: SearchConfig) -> list[list[Hypothesis]]:
        """The engine's search of one batch; with terms, a sentence no output could satisfy is a
        UserError naming it (a rule such as --no-repeat-ngram-size may forbid its phrases)."""
        ids = [it.ids for it in batch]
        terms = [it.terms for it in batch]
        if not any(terms):
            return self.engine.search(ids, cfg, self.positional_scores)
        found = self.engine.search(ids, cfg, self.positional_scores, terms=terms)
        for it, hyps in zip(batch, found):
            if it.terms and (not hyps or hyps[0].score == float("-inf")):
                raise UserError(f"{it.terms.where}: no output within the output limit starts with its prefix, contains "
                                "its constraints and avoids its phrases under these search settings "
                                "(--min-len, --no-repeat-ngram-size)")
        return found

    # -- translating

    def translate_items(self, items: Sequence[Item], *, on_batch: Callable[[int], None] | None = None,
                        **search_settings) -> dict[int, list[Hypothesis]]:
        """Up to `nbest` hypotheses (best first) for every non-empty item, keyed by `item.index`.

        The lower-level call: items may come from `encode` or from a binarized split
        (`nmtkit.data.shards.load_split`); empty items get no entry (no model call).
        `on_batch(n)` is called after each batch of n sentences (progress bars).
        """
        results: dict[int, list[Hypothesis]] = {}
        for batch, found in self.translate_batches(items, **search_settings):
            for it, hyps in zip(batch, found):
                results[it.index] = hyps
            if on_batch is not None:
                on_batch(len(batch))
        return results

    def translate_batches(self, items: Sequence[Item], **search_settings
                          ) -> Iterator[tuple[list[Item], list[list[Hypothesis]]]]:
        """(batch, its hypotheses) for each batch of `translate_items`, as each is searched: a
        caller that writes in input order can write what is complete without waiting for the rest.
        Every item's terms are checked before the first search."""
        cfg = self.search_config(**search_settings)
        self._check_terms(items, cfg)
        for batch in make_batches(list(items), self.max_tokens, self.batch_size):
            yield batch, self._search(batch, cfg)

    def _run(self, sentences: Sequence[str], settings: dict, terms: dict,
             target_lang=None) -> list[tuple[Item, list[Hypothesis] | None]]:
        """(item, hypotheses) per sentence in order; None for an empty sentence (no model call).
        `terms`: `attach_terms`' keyword arguments."""
        items = self.encode(sentences, target_lang)
        if any(v is not None for k, v in terms.items() if k != "ordered"):
            self.attach_terms(items, **terms)
        results = self.translate_items(items, **settings)
        return [(it, results.get(it.index)) for it in items]

    def _empty_text(self, item: Item) -> str:
        """The output of a sentence without hypotheses: "" (a flat tree of its words when parsing)."""
        return "" if self._text_of is None else self._text_of(item, [])

    def translate_nbest(self, sentences: Sequence[str], *, constraints=None, avoid=None, prefix=None,
                        ordered: bool = False, target_lang: str | Sequence[str] | None = None,
                        **search_settings) -> list[list[Translation]]:
        """Per sentence, its hypotheses best first (at most `nbest`), as `Translation`s; the
        terminology arguments are `translate`'s.

        An empty or whitespace-only sentence gives one empty translation with score 0 (the
        certain, empty, output; no model call). A search that found fewer than `nbest`
        hypotheses (tiny vocabularies) gives fewer: no padding, unlike the CLI's fixed line count.
        """
        out = []
        terms = dict(constraints=constraints, avoid=avoid, prefix=prefix, ordered=ordered)
        for it, hyps in self._run(sentences, search_settings, terms, target_lang):
            if hyps is None:
                out.append([Translation(self._empty_text(it), [], Hypothesis(tokens=[], score=0.0, logprob=0.0))])
                continue
            row = []
            for h in hyps:
                pieces = self.tgt_dict.string(h.tokens)
                row.append(Translation(self.text(it, pieces), pieces, h))
            out.append(row)
        return out

    def translate(self, sentences: Sequence[str], *, constraints=None, avoid=None, prefix=None,
                  ordered: bool = False, target_lang: str | Sequence[str] | None = None,
                  **search_settings) -> list[str]:
        """One output text per sentence, in order: the best hypothesis, detokenized (a tree on a
        parsing data directory); `""` for an empty sentence. Per-call `search_settings` override
        the load-time ones for this call only.

        Terminology (docs/generate.md), each a list with one entry per sentence, or None:
        `constraints`, per sentence a list of phrases (raw text) its output must contain, in any
        order, or in the given order with `ordered=True`; `avoid`, per sentence a list of phrases
        its output must not contain; `prefix`, per sentence the text its output must begin with
        (or None). `translate(["Der Hauptbahnhof ist dort."], constraints=[["central station"]])`.

        `target_lang`: on a multilingual model, the language to translate into, one for all
        sentences or a list with one per sentence (default: `load`'s `target_lang`).
        """
        terms = dict(constraints=constraints, avoid=avoid, prefix=prefix, ordered=ordered)
        return [
            self.text(it, self.tgt_dict.string(hyps[0].tokens)) if hyps else self._empty_text(it)
            for it, hyps in self._run(sentences, search_settings, terms, target_lang)
        ]

    # -- given targets: scores, attention weights, alignments (nmtkit.forced)

    def target_ids(self, text: str, where: str) -> np.ndarray:
        """Target dictionary ids of one raw target sentence (segmented with the target subword
        model). UserError naming `where` for a piece outside the dictionary (its score would be
        that of <unk>: nothing to learn from), a target that is not text (`check_text`) or a target
        longer than the model accepts. An empty target is the empty translation (</s> alone),
        which the search may output too."""
        check_text(text, where)
        pieces = self.tgt_subword.encode(text)
        ids = self.tgt_dict.encode(pieces)
        unknown = [p for p, i in zip(pieces, ids) if i == self.tgt_dict.unk]
        if unknown:
            shown = ", ".join(repr(p) for p in dict.fromkeys(unknown[:5]))
            raise UserError(f"{where}: target token(s) {shown} not in the target dictionary "
                            f"({len(self.tgt_dict)} symbols); a score or an alignment of <unk> says nothing")
        limit = self.engine.max_target_tokens
        if len(ids) > limit:
            raise UserError(f"{where}: the target has {len(ids)} tokens; the model accepts at most {limit}")
        return ids

    def _needs_forced(self, what: str) -> None:
        """UserError unless the engine can teacher-force given targets (`Engine.require_teacher_forcing`)."""
        self.engine.require_teacher_forcing(what)

    def _layer(self, layer: int, kind: str = "cross") -> int:
        """A 0-based (negative: from the top) layer index checked against every model."""
        n = self.engine.layers(kind)
        if not -n <= layer < n:
            raise UserError(f"{kind} attention layer {layer} (0-based) is out of range: the model has {n} layers")
        return layer

    def score_items(self, items: Sequence[Item], *, alignment_layer: int | None = None, words: bool = False,
                    on_batch: Callable[[int], None] | None = None
                    ) -> tuple[dict[int, list[Hypothesis]], dict[int, list[list[tuple[int, int]]]]]:
        """Score each item's `target_ids` given its source (forced decoding, batched).

        Returns ({index: [the target as a Hypothesis with the search's score]}, {index: [its
        subword alignment]}, the second only with `alignment_layer` (0-based, -1 = last); with
        `words`, pairs of words instead (`word_alignment`)). The score is `logprob / lp(|Y|)`
        with this translator's lenpen and lenpen_form: a beam hypothesis fed back gets the score
        the search reported (unk_penalty and the search's length rules are not applied: this is
        the model's probability of the given text).
        """
        scores: dict[int, list[Hypothesis]] = {}
        aligns: dict[int, list[list[tuple[int, int]]]] = {}
        for batch, found, batch_aligns in self.score_batches(items, alignment_layer=alignment_layer, words=words):
            scores.update((it.index, hyps) for it, hyps in zip(batch, found))
            aligns.update(batch_aligns)
            if on_batch is not None:
                on_batch(len(batch))
        return scores, aligns

    def score_batches(self, items: Sequence[Item], *, alignment_layer: int | None = None, words: bool = False
                      ) -> Iterator[tuple[list[Item], list[list[Hypothesis]], dict[int, list[list[tuple[int, int]]]]]]:
        """(batch, its scores, its alignments) for each batch of `score_items`, as each is scored
        (the alignments {} without `alignment_layer`). Every check is made before the first pass."""
        self._needs_forced("scoring given translations")
        from nmtkit import forced

        cfg = self.search_config()
        layer = None if alignment_layer is None else self._layer(alignment_layer)
        todo = [it for it in items if it.target_ids is not None]
        # make_batches leaves out empty sources (translation needs no model call for them);
        # scoring runs them too, as a source of </s> alone
        empty = [it for it in todo if len(it.ids) == 0]
        for batch in make_batches(todo, self.max_tokens, self.batch_size) + ([empty] if empty else []):
            targets = [[int(x) for x in it.target_ids] for it in batch]
            lp, attn = self.engine.forced_pass([it.ids for it in batch], targets, cross_layer=layer)
            found, aligns = [], {}
            for r, (it, tgt) in enumerate(zip(batch, targets)):
                if attn is not None:
                    aligns[it.index] = [forced.hard_alignment(attn[r], len(it.ids), len(tgt), it.lead)]
                ps = forced.pair_score(lp[r, :len(tgt) + 1].tolist(), cfg.lenpen, cfg.lenpen_form)
                found.append([Hypothesis(tgt, ps.score, ps.logprob, ps.positional_scores)])
            yield batch, found, self._in_words(batch, dict(zip((it.index for it in batch), found)), aligns) if words else aligns

    def align_items(self, items: Sequence[Item], results: dict[int, list[Hypothesis]],
                    layer: int = -1, words: bool = False) -> dict[int, list[list[tuple[int, int]]]]:
        """Subword alignments (source, target) of each item's hypotheses (`translate_items`'s
        results), from the head-averaged cross-attention of decoder `layer` (0-based, -1 = the
        last, as fairseq), averaged over an ensemble's models: one teacher-forced pass per batch.
        `words`: pairs of words instead (`word_alignment`)."""
        from nmtkit import forced

        self._needs_forced("alignments")
        layer = self._layer(layer)
        out: dict[int, list[list[tuple[int, int]]]] = {}
        todo = [it for it in items if results.get(it.index)]
        for batch in make_batches(todo, self.max_tokens, self.batch_size):
            rows = [(it, h) for it in batch for h in results[it.index]]
            _, attn = self.engine.forced_pass([it.ids for it, _ in rows], [h.tokens for _, h in rows],
                                              cross_layer=layer, want_scores=False)
            for r, (it, h) in enumerate(rows):
                out.setdefault(it.index, []).append(forced.hard_alignment(attn[r], len(it.ids), len(h.tokens), it.lead))
        return self._in_words(items, results, out) if words else out

    def _in_words(self, items: Sequence[Item], results: dict[int, list[Hypothesis]],
                  aligns: dict[int, list[list[tuple[int, int]]]]) -> dict[int, list[list[tuple[int, int]]]]:
        """Each item's subword alignments turned into pairs of words (`word_alignment`)."""
        for it in items:
            if it.index in aligns:
                hyps = results.get(it.index, [])
                aligns[it.index] = [self.word_alignment(it, h.tokens, a) for h, a in zip(hyps, aligns[it.index])]
        return aligns

    def source_pieces(self, item: Item) -> list[str]:
        """The item's source subword pieces as segmented (raw text), or its dictionary strings
        (binarized splits: an <unk> shows as "<unk>"); a language tag first, as the model sees it."""
        if item.text is not None:
            tag = [self.src_dict[int(i)] for i in item.ids[:item.lead]]
            return tag + self.src_subword.encode(item.text)[:len(item.ids) - item.lead]
        return [self.src_dict[int(i)] for i in item.ids]

    def word_alignment(self, item: Item, target_tokens: Sequence[int],
                       pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Subword pairs of a hypothesis -> pairs of words, the words of the detokenized source
        and output (a word is aligned to every word one of its pieces is aligned to)."""
        if self.task == "parsing":
            raise UserError("--print-alignment words: a parsing model's output is a tree, not words; "
                            "use --print-alignment (subword)")
        from nmtkit import forced

        src_pieces = self.source_pieces(item)[item.lead:]  # alignments count the sentence's own tokens
        tgt_pieces = [self.tgt_dict[int(i)] for i in target_tokens]
        src_words = forced.word_index(src_pieces, self.src_subword.kind)
        tgt_words = forced.word_index(tgt_pieces, self.tgt_subword.kind)
        return forced.word_alignment(pairs, src_words, tgt_words)

    def score(self, sources: Sequence[str], targets: Sequence[str], *,
              target_lang: str | Sequence[str] | None = None) -> list[forced.PairScore]:
        """The model's scores of given translations, in order: per pair its log-probability
        (</s> included), |Y| (target tokens + </s>), the length-normalized score the search
        would report for it (this translator's lenpen and lenpen_form) and the per-token
        log-probabilities. An ensemble scores with the mean of its models' log-probabilities.

        Sources and targets are raw text, segmented like `translate`'s input; an empty source,
        a target piece outside the dictionary or lists of different lengths are UserErrors (an
        empty target is the empty translation).
        """
        self._needs_forced("score")
        if isinstance(sources, str) or isinstance(targets, str):
            raise UserError("score takes two lists of sentences; wrap single ones: score([src], [tgt])")
        sources, targets = list(sources), list(targets)
        if len(sources) != len(targets):
            raise UserError(f"score: {len(sources)} sources but {len(targets)} targets (one target per source)")
        items = self.encode(sources, target_lang)
        for it, tgt in zip(items, targets):
            if not isinstance(tgt, str):
                raise UserError(f"target {it.index + 1} is a {type(tgt).__name__}, not a str")
            if len(it.ids) == 0:
                raise UserError(f"source {it.index + 1}: empty source sentence (every pair needs a source and a target)")
            it.target_ids = self.target_ids(tgt, f"target {it.index + 1}")
        scores, _ = self.score_items(items)
        from nmtkit import forced

        out = []
        for it in items:
            h = scores[it.index][0]
            out.append(forced.PairScore(h.logprob, len(h.positional_scores), h.score, h.positional_scores))
        return out

    def attention(self, src: str, tgt: str | None = None, *, target_lang: str | None = None,
                  **search_settings) -> forced.Attention:
        """Every attention weight of the model for `src` and a target: `tgt` (raw text) when given,
        else the model's own best translation (search settings as in `translate`, overridable
        here). One model only (load one checkpoint). See `nmtkit.forced.Attention`:
        per-layer, per-head arrays with the token strings; `.words()` merges subwords."""
        self._needs_forced("attention")
        if not isinstance(src, str) or (tgt is not None and not isinstance(tgt, str)):
            raise UserError("attention takes one source sentence (a str) and optionally one target (a str)")
        (item,) = self.encode([src], target_lang)
        return self.attention_of_item(item, tgt, **search_settings)

    def attention_of_item(self, item: Item, tgt: str | None = None, *, where: str = "attention",
                          target_where: str | None = None, **search_settings) -> forced.Attention:
        """`attention` for an Item (raw text from `encode`, or a binarized split's): the target is
        `tgt` (raw text), else the item's `target_ids`, else the model's own translation. Errors
        name the sentence as `where` (and a bad target as `target_where`)."""
        self._needs_forced("attention")
        if len(self.model_source.paths) > 1:
            raise UserError(f"attention is per model: this translator holds {len(self.model_source.paths)}; load one checkpoint")
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
        from nmtkit import forced

        t = self.tgt_dict
        lp, w = self.engine.attention(item.ids, tokens)
        cfg = self.search_config()
        src_pieces = self.source_pieces(item)
        tgt_pieces = [t[i] for i in tokens]
        sw = forced.word_index(src_pieces, self.src_subword.kind)
        tw = forced.word_index(tgt_pieces, self.tgt_subword.kind)
        n_sw, n_tw = (sw[-1] + 1 if sw else 0), (tw[-1] + 1 if tw else 0)
        eos = forced.EOS_SYMBOL
        return forced.Attention(
            source_tokens=src_pieces + [eos], target_tokens=tgt_pieces + [eos],
            decoder_inputs=[forced.BOS_SYMBOL] + tgt_pieces,
            enc_self=w["enc-self"], dec_self=w["dec-self"], cross=w["cross"],
            score=forced.pair_score(lp, cfg.lenpen, cfg.lenpen_form), target_given=given,
            source_word_of=sw + [n_sw], target_word_of=tw + [n_tw],
            source_words=forced.word_strings(src_pieces, sw, self.src_subword.decode) + [eos],
            target_words=forced.word_strings(tgt_pieces, tw, self.tgt_subword.decode) + [eos],
        )

    def __repr__(self) -> str:
        if self.langs:
            return (f"Translator({self.engine!r}, multilingual {'/'.join(self.langs)}, {self.task}, "
                    f"device={self.device}, beam={self.search.beam})")
        return (f"Translator({self.engine!r}, {self.src_lang}->{self.tgt_lang}, {self.task}, "
                f"device={self.device}, beam={self.search.beam})")

