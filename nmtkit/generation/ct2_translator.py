"""`CTranslate2Translator`: the `Translator` interface on an export directory, run by CTranslate2.

    from nmtkit import Translator
    tr = Translator.load("m30k-ct2", lenpen_form="fairseq")     # a directory made by `nmtkit export`
    tr.translate(["Ein Mann schläft.", ""])                     # -> ["A man sleeps.", ""]

Why a subclass of `Translator` rather than a second API: `nmtkit generate --path EXPORT_DIR`, the
Python API and the server call `translate` / `translate_nbest` / `translate_items` and get the same
`Translation` / `Hypothesis` objects whichever runtime is behind them. Everything between the text
and the token ids is inherited unchanged, on the export's copies of the data directory's files:
subword segmentation and detokenization (`nmtkit.data.subwords`), the dictionaries, truncation of
over-long inputs, sorting and batching (`make_batches`), the empty-line rule, and the parsing
model's tree repair (`nmtkit.parsing.pipeline.tree_writer`). Only the search runs elsewhere:
`ctranslate2.Translator.translate_batch` on the dictionaries' tokens.

How nmtkit's search settings map onto CTranslate2 (docs/export.md has the table):
- beam search is fairseq's (`--early-stop beam`, the default on an export directory): the `beam`
  best extensions that are not `</s>` stay live, a `</s>` extension among the step's `beam` best
  candidates finishes a hypothesis, a sentence stops with `beam` finished ones. `--lenpen-form
  fairseq` is CTranslate2's `length_penalty` once `</s>` is counted in |Y| (`return_end_token`);
  with `--lenpen 0` a vanishing penalty (1e-30, whose power is exactly 1.0 in float32) keeps
  CTranslate2 from its early exit, which fairseq's rule does not have.
- the output limit `floor(a * src_len + b)` is per sentence in nmtkit and per call in
  CTranslate2, so a batch is split into runs of sentences with the same limit (sorting by length
  makes these runs long; with `--max-len-a 0` a batch stays whole). At the limit nmtkit allows
  only `</s>`; CTranslate2 (`max_decoding_length` = the limit) stops its best candidates there
  without it: those hypotheses are closed by `</s>` and rescored exactly (`score_batch`), which
  gives nmtkit's forced-`</s>` hypotheses and scores. The choice among hypotheses can still
  differ for a sentence whose search reaches its limit, since CTranslate2 ranks its last-step
  candidates before their `</s>` is scored and keeps `beam` of them (docs/export.md: about 3% of
  sentences under a limit of half the source length, none under the usual limits).
- nmtkit bans `<pad>` and `<s>` after its softmax. CTranslate2 is run without bans, so its
  log-probabilities are nmtkit's; a sentence whose hypotheses hold `<pad>` or `<s>` (an
  undertrained model: label smoothing gives them eps / V) is searched again with them suppressed
  (`suppress_sequences`), which renormalizes over the other tokens, so its hypotheses are
  rescored. `--min-len` and `--no-repeat-ngram-size` are CTranslate2's own bans, also before its
  softmax: their scores (rarely their choices) differ from native by that renormalization.
- greedy search and sampling (`--sampling --topk --topp --temperature`, `--beam` samples, scores
  without the temperature) map one to one. `--seed` (`seed`) is CTranslate2's global seed, set
  when the translator is loaded; CTranslate2 seeds each of its worker threads' generators once,
  at their first sample, so the same seed reproduces a run of a freshly loaded translator (as
  `nmtkit generate` is), not each call as nmtkit's own sampling does.
- refused, in one line naming the flag: `--lenpen-form gnmt` (unless `--lenpen 0`), `--early-stop
  bound|none` with a beam, `--unk-penalty`, `--ema` (chosen at export time), ensembles.

`Hypothesis.positional_scores` (fairseq format's P- lines) cost a forced-decoding pass
(`score_batch`); they are filled when `rescore` is set (`nmtkit generate --format fairseq` sets
it), and then `logprob` and `score` come from that pass too.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence

from nmtkit.errors import UserError
from nmtkit.generation.search import Hypothesis, SearchConfig, length_penalty
from nmtkit.generation.translator import Item, Translator, apply_search_settings, make_batches, warn_stderr

# CTranslate2's length penalty for `--lenpen 0` in beam search: pow(|Y|, 1e-30) is exactly 1.0 in
# float32, so scores are unchanged, and a non-zero penalty turns off CTranslate2's early exit
# (stop when the best candidate is `</s>`), leaving fairseq's rule (`beam` finished hypotheses).
NO_PENALTY = 1e-30


def export_search(info: dict) -> SearchConfig:
    """SearchConfig's defaults for an export: fairseq's stopping rule (the one CTranslate2 has),
    and the output limit of a parsing model (input + 300) as on its data directory."""
    from nmtkit.generation.translator import default_search

    return dataclasses.replace(default_search(info["data"]), early_stop="beam")


def check_supported(cfg: SearchConfig) -> None:
    """Refuse, in one line naming the flag, a search setting CTranslate2 cannot honour."""
    if cfg.lenpen_form != "fairseq" and cfg.lenpen != 0:
        raise UserError(
            f"--lenpen-form {cfg.lenpen_form}: CTranslate2 has only fairseq's length penalty |Y|^alpha; "
            "pass --lenpen-form fairseq (lenpen_form='fairseq' in the API), or --lenpen 0"
        )
    if cfg.early_stop != "beam" and cfg.beam > 1 and not cfg.sampling:
        raise UserError(
            f"--early-stop {cfg.early_stop}: CTranslate2's beam search stops as fairseq's does; "
            "use --early-stop beam (the default on an export directory)"
        )
    if cfg.unk_penalty != 0:
        raise UserError("--unk-penalty: CTranslate2 cannot penalize <unk> (only ban it); "
                        "translate without --unk-penalty, or with the checkpoint and its data directory")


def runtime_device(device, ct2) -> tuple[str, int]:
    """(device, index) for ctranslate2.Translator from nmtkit's --device (auto, cpu, cuda, cuda:N)."""
    name = str(device)
    count = ct2.get_cuda_device_count()
    if name == "auto":
        return ("cuda", 0) if count > 0 else ("cpu", 0)
    if name == "cpu":
        return "cpu", 0
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise UserError(f"--device {name}: expected cuda or cuda:N")
        index = int(index_text)
        if index >= count:
            raise UserError(f"--device {name}: CTranslate2 sees {count} CUDA device(s)")
        return "cuda", index
    raise UserError(f"--device {name}: the CTranslate2 runtime runs on auto, cpu, cuda or cuda:N")


def compute_type(precision: str, quantization: str) -> str:
    """CTranslate2's compute type for nmtkit's --precision: fp32 keeps the export's own weight type
    (`default`: int8 stays int8), bf16 / fp16 compute in that half precision (int8 weights stay int8)."""
    from nmtkit.models.loading import PRECISIONS

    if precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return "default"
    half = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    return f"int8_{half}" if quantization.startswith("int8") else half


def subword_model(export_dir: str | os.PathLike, data: dict, lang: str):
    """Language `lang`'s subword model in an export directory: the data directory's file, read by
    `nmtkit.data.subwords` as `load_subword_model` reads it there (`data` is nmtkit.json's copy of
    the manifest entries; `load_export` has checked the file's sha256)."""
    from nmtkit.data.manifest import subword_model_path
    from nmtkit.data.subwords import load_model_file

    kind = data["subword"].get("kinds", {}).get(lang, data["subword"]["kind"])
    return load_model_file(kind, subword_model_path(export_dir, lang, data))


def limit_of(n_src: int, cfg: SearchConfig) -> int:
    """nmtkit's per-sentence output limit (generation.search.max_lengths) for `n_src` source tokens."""
    lim = max(math.floor(cfg.max_len_a * float(n_src) + cfg.max_len_b), 0)
    return lim if cfg.max_len_cap is None else min(lim, max(cfg.max_len_cap, 0))


class CTranslate2Translator(Translator):
    """An export directory (`nmtkit export`) translated by CTranslate2; build it with
    `Translator.load(EXPORT_DIR)` or `CTranslate2Translator.load`. Not thread-safe: one call at a time."""

    def __init__(self, runtime, *, export_dir: str | os.PathLike, info: dict, src_dict, tgt_dict, tgt_subword,
                 device: str, compute_type: str, search: SearchConfig, max_tokens: int | None = None,
                 batch_size: int | None = None, warn: Callable[[str], None] | None = None):
        from nmtkit.models.registry import ArchConfig

        self.loaded = None  # no torch models: the weights live in `runtime`
        self.models = []
        self.runtime = runtime  # the ctranslate2.Translator
        self.info = info
        self.compute_type = compute_type
        self.arch = ArchConfig.from_dict(info["arch_config"])
        self.rescore = False  # exact per-token scores through a forced-decoding pass (fairseq's P- lines)
        self._init_text(data_dir=export_dir, manifest=info["data"], src_dict=src_dict, tgt_dict=tgt_dict,
                        tgt_subword=tgt_subword, device=device, search=search, max_tokens=max_tokens,
                        batch_size=batch_size, warn=warn)
        self._tgt_ids = {tgt_dict[i]: i for i in range(len(tgt_dict))}

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: str = "auto", precision: str = "fp32", ema: bool = False,
             threads: int = 0, max_tokens: int | None = None, batch_size: int | None = None,
             warn: Callable[[str], None] | None = None, search: SearchConfig | None = None,
             **search_settings) -> CTranslate2Translator:
        """Load export directory `path` (the arguments are `Translator.load`'s; `threads` are
        CTranslate2's intra-op threads, 0 = its default)."""
        from nmtkit.data.manifest import load_dictionaries
        from nmtkit.export.ctranslate2 import import_ctranslate2
        from nmtkit.export.directory import load_export

        if ema:
            raise UserError(f"--ema: {path} holds the weights chosen when it was exported "
                            "(nmtkit export --ema); drop --ema")
        if threads < 0:
            raise UserError(f"--threads must be >= 0 (0 = the runtime's default), got {threads}")
        info = load_export(path)
        if info["runtime"].get("name") != "ctranslate2":
            raise UserError(f"{path}: exported for {info['runtime'].get('name')!r}, not ctranslate2")
        ct2 = import_ctranslate2()
        dev, index = runtime_device(device, ct2)
        ctype = compute_type(precision, info["runtime"].get("quantization", "float32"))
        cfg = apply_search_settings(search if search is not None else export_search(info), search_settings)
        check_supported(cfg)
        if cfg.seed is not None:  # before the worker threads exist: each seeds itself from it once
            ct2.set_random_seed(cfg.seed)
        manifest = info["data"]
        src_dict, tgt_dict = load_dictionaries(path, manifest)
        tgt_subword = subword_model(path, manifest, manifest["target_lang"])
        try:
            runtime = ct2.Translator(str(path), device=dev, device_index=index, compute_type=ctype,
                                     intra_threads=threads)
        except (ValueError, RuntimeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"{path}: CTranslate2 cannot load it on {dev} with --precision {precision} "
                            f"(compute type {ctype}): {first}") from None
        return cls(runtime, export_dir=path, info=info, src_dict=src_dict, tgt_dict=tgt_dict,
                   tgt_subword=tgt_subword, device=f"{dev}:{index}" if dev == "cuda" else dev, compute_type=ctype,
                   search=cfg, max_tokens=max_tokens, batch_size=batch_size, warn=warn or warn_stderr)

    @property
    def src_subword(self):
        """The export's copy of the source subword model (loaded on first use)."""
        if self._src_subword is None:
            self._src_subword = subword_model(self.data_dir, self.manifest, self.src_lang)
        return self._src_subword

    # -- the model's limits and the search settings

    @property
    def max_source_tokens(self) -> int:
        return self.arch.max_source_positions - 1  # positions include </s>

    @property
    def max_target_tokens(self) -> int:
        return self.arch.max_target_positions - 1  # positions include <s>

    def search_config(self, **overrides) -> SearchConfig:
        cfg = apply_search_settings(self.search, overrides) if overrides else self.search
        check_supported(cfg)
        top = self.max_target_tokens
        cap = top if cfg.max_len_cap is None else min(cfg.max_len_cap, top)
        t = self.tgt_dict
        return dataclasses.replace(cfg, max_len_cap=cap, pad=t.pad, bos=t.bos, eos=t.eos, unk=t.unk)

    def _options(self, cfg: SearchConfig, limit: int, suppress: bool = False) -> dict:
        """translate_batch's keyword arguments for `cfg` and a run of sentences with output `limit`."""
        t = self.tgt_dict
        alpha = cfg.lenpen if cfg.lenpen_form == "fairseq" else 0.0  # gnmt only with lenpen 0 (checked)
        opts = dict(max_input_length=0, max_decoding_length=limit, min_decoding_length=min(cfg.min_len, limit),
                    return_scores=True, return_end_token=True, no_repeat_ngram_size=cfg.no_repeat_ngram_size)
        if suppress:
            opts["suppress_sequences"] = [[t[t.pad]]] + ([[t[t.bos]]] if t.bos != t.eos else [])
        if cfg.sampling:
            samples = 1 if cfg.topk == 1 else cfg.beam  # top-1 sampling is greedy: one sample, repeated
            opts.update(beam_size=1, num_hypotheses=samples, length_penalty=alpha, sampling_topk=cfg.topk,
                        sampling_topp=cfg.topp if cfg.topp > 0 else 1.0, sampling_temperature=cfg.temperature)
        elif cfg.beam == 1:
            opts.update(beam_size=1, num_hypotheses=1, length_penalty=alpha, sampling_topk=1)
        else:
            # every finished hypothesis comes back (not only nbest): the ones stopped at the limit
            # are closed by </s> and rescored below, and may then rank lower
            opts.update(beam_size=cfg.beam, num_hypotheses=cfg.beam, length_penalty=alpha or NO_PENALTY,
                        patience=1.0, sampling_topk=1)
        return opts

    # -- translating

    def translate_items(self, items: Sequence[Item], *, on_batch: Callable[[int], None] | None = None,
                        **search_settings) -> dict[int, list[Hypothesis]]:
        """Up to `nbest` hypotheses (best first) for every non-empty item, keyed by `item.index`
        (the interface of `Translator.translate_items`)."""
        cfg = self.search_config(**search_settings)
        results: dict[int, list[Hypothesis]] = {}
        for batch in make_batches(list(items), self.max_tokens, self.batch_size):
            runs: dict[int, list[Item]] = {}
            for it in batch:  # one CTranslate2 call per output limit (in length order)
                runs.setdefault(limit_of(len(it.ids), cfg), []).append(it)
            for limit, run in runs.items():
                for it, hyps in zip(run, self._search(run, cfg, limit)):
                    results[it.index] = hyps
            if on_batch is not None:
                on_batch(len(batch))
        return results

    def _search(self, run: list[Item], cfg: SearchConfig, limit: int) -> list[list[Hypothesis]]:
        """nmtkit's hypotheses for a run of items with output limit `limit`, best first."""
        source = [self.src_dict.string(it.ids) for it in run]
        if limit == 0:  # only </s> is allowed: the empty hypothesis, scored (CTranslate2 needs a step)
            hyps = [Hypothesis(tokens=[], score=0.0, logprob=0.0) for _ in run]
            self._rescore([(h, src, []) for h, src in zip(hyps, source)], cfg)
            return [[h] * (cfg.beam if cfg.sampling else 1) for h in hyps]
        out = self._translate(source, cfg, limit, suppress=False)
        t = self.tgt_dict
        banned = {t[t.pad], t[t.bos]} - {t[t.eos]}
        redo = [i for i, res in enumerate(out) if any(tok in banned for hyp in res.hypotheses for tok in hyp)]
        if redo:
            # CTranslate2 scores with the full softmax, as nmtkit does, and may then emit <pad> / <s>,
            # which nmtkit bans (an undertrained model gives them label smoothing's eps / V). Those
            # sentences are searched again with them suppressed; that renormalizes over the other
            # tokens, so their scores are recomputed exactly.
            for i, res in zip(redo, self._translate([source[i] for i in redo], cfg, limit, suppress=True)):
                out[i] = res
        eos = t[t.eos]
        results = []
        for k, (src, res) in enumerate(zip(source, out)):
            rescore = self.rescore or k in redo
            hyps, todo = [], []
            for tokens, score in zip(res.hypotheses, res.scores):
                ended = bool(tokens) and tokens[-1] == eos
                body = tokens[:-1] if ended else tokens  # not ended: `limit` tokens, closed by </s> below
                ids = [self._tgt_ids[tok] for tok in body]
                lp = length_penalty(float(len(ids) + 1), cfg.lenpen, cfg.lenpen_form)
                h = Hypothesis(tokens=ids, score=float(score), logprob=float(score) * lp)
                hyps.append(h)
                if rescore or not ended:
                    todo.append((h, src, body))
            self._rescore(todo, cfg)
            if cfg.sampling and cfg.topk == 1:
                hyps = hyps * cfg.beam  # top-1 samples are all the greedy output
            hyps.sort(key=lambda h: h.score, reverse=True)
            results.append(hyps[: cfg.nbest])
        return results

    def _rescore(self, todo: list[tuple[Hypothesis, list[str], list[str]]], cfg: SearchConfig) -> None:
        """Exact log-probabilities of (hypothesis, source tokens, target tokens) by forced decoding of
        `target + </s>`: per-token scores, their sum and the length-penalised score, set in place."""
        if not todo:
            return
        scored = self.runtime.score_batch([src for _, src, _ in todo], [body for _, _, body in todo], max_input_length=0)
        for (h, _, body), sr in zip(todo, scored):
            h.positional_scores = [float(x) for x in sr.log_probs]
            h.logprob = float(sum(h.positional_scores))
            h.score = h.logprob / length_penalty(float(len(body) + 1), cfg.lenpen, cfg.lenpen_form)

    def _translate(self, source: list[list[str]], cfg: SearchConfig, limit: int, suppress: bool) -> list:
        try:
            return self.runtime.translate_batch(source, **self._options(cfg, limit, suppress))
        except (ValueError, RuntimeError) as e:  # e.g. --topk over the vocabulary size
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"CTranslate2 refused the search settings: {first}") from None

    def __repr__(self) -> str:
        return (f"CTranslate2Translator({self.data_dir}, {self.src_lang}->{self.tgt_lang}, {self.task}, "
                f"device={self.device}, compute_type={self.compute_type}, beam={self.search.beam})")
