"""`CTranslate2Engine`: an export directory's model searched by CTranslate2.

    from nmtkit import Translator
    tr = Translator.load("m30k-ct2", lenpen_form="fairseq")     # a directory made by `nmtkit export`
    tr.translate(["Ein Mann schläft.", ""])                     # -> ["A man sleeps.", ""]

The `Translator` does everything between the text and the token ids, on the export's copies of
the data directory's files (segmentation, dictionaries, truncation, batching, the empty-line
rule, detokenization, tree repair); this engine only searches:
`ctranslate2.Translator.translate_batch` on the dictionaries' tokens. It imports no torch.

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
- refused, in one line naming the flag (`unsupported`, and the class attributes read by
  `nmtkit.backends.registry.check_combination`): `--lenpen-form gnmt` (unless `--lenpen 0`),
  `--early-stop bound|none` with a beam, `--unk-penalty`, `--ema` and `--quantize` (chosen at
  export time), ensembles, scores of given targets, alignments and attention, and terminology
  (constraints, avoided phrases, prefixes: `Engine.constraints` is False).
- a lexical shortlist is CTranslate2's own vocabulary map (`use_vmap`), the export's vmap.txt: the
  same candidates per batch and the same distribution over them as nmtkit's search. Not its
  rescoring: `score_batch` has no vocabulary map, so a hypothesis closed at the output limit, and
  the per-token scores asked for (`--format fairseq`), are scored over the whole vocabulary.

`Hypothesis.positional_scores` (fairseq format's P- lines) cost a forced-decoding pass
(`score_batch`); they are filled when the caller asks for them (`nmtkit generate --format
fairseq` does), and then `logprob` and `score` come from that pass too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nmtkit.backends.ctranslate2.convert import import_ctranslate2
from nmtkit.backends.engine import Engine, RuntimeOptions
from nmtkit.device import check_precision, parse_device
from nmtkit.errors import UserError, first_line
from nmtkit.search.config import DECODING_PRESETS, Hypothesis, SearchConfig, length_penalty, output_limit

# CTranslate2's length penalty for `--lenpen 0` in beam search: pow(|Y|, 1e-30) is exactly 1.0 in
# float32, so scores are unchanged, and a non-zero penalty turns off CTranslate2's early exit
# (stop when the best candidate is `</s>`), leaving fairseq's rule (`beam` finished hypotheses).
NO_PENALTY = 1e-30


def unsupported(cfg: SearchConfig) -> str | None:
    """The one line refusing a search setting CTranslate2 cannot honour, naming the flag; or None."""
    if cfg.lenpen_form != "fairseq" and cfg.lenpen != 0:
        return (f"--lenpen-form {cfg.lenpen_form}: CTranslate2 has only fairseq's length penalty |Y|^alpha; "
                "pass --lenpen-form fairseq (lenpen_form='fairseq' in the API), or --lenpen 0")
    if cfg.early_stop != "beam" and cfg.beam > 1 and not cfg.sampling:
        return (f"--early-stop {cfg.early_stop}: CTranslate2's beam search stops as fairseq's does; "
                "use --early-stop beam (the default on an export directory)")
    if cfg.unk_penalty != 0:
        return ("--unk-penalty: CTranslate2 cannot penalize <unk> (only ban it); "
                "translate without --unk-penalty, or with the checkpoint and its data directory")
    return None


def runtime_device(device: str, ct2) -> tuple[str, int]:
    """(device, index) for ctranslate2.Translator from nmtkit's --device (auto, cpu, cuda, cuda:N)."""
    req = parse_device(device)
    count = ct2.get_cuda_device_count()
    if req.kind == "auto":
        return ("cuda", 0) if count > 0 else ("cpu", 0)
    if req.kind == "cpu":
        return "cpu", 0
    if req.kind == "cuda":
        index = req.index or 0
        if index >= count:
            raise UserError(f"--device {req.name}: CTranslate2 sees {count} CUDA device(s)")
        return "cuda", index
    raise UserError(f"--device {req.name}: the CTranslate2 runtime runs on auto, cpu, cuda or cuda:N")


def compute_type(precision: str, quantization: str) -> str:
    """CTranslate2's compute type for nmtkit's --precision: fp32 keeps the export's own weight type
    (`default`: int8 stays int8), bf16 / fp16 compute in that half precision (int8 weights stay int8)."""
    if check_precision(precision) == "fp32":
        return "default"
    half = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    return f"int8_{half}" if quantization.startswith("int8") else half


class CTranslate2Engine(Engine):
    """An export directory (`nmtkit export`) searched by CTranslate2. Not thread-safe."""

    name = "ctranslate2"
    display = "CTranslate2"
    shortlists = True  # the export's vmap.txt (`use_shortlist`)
    search_defaults = DECODING_PRESETS["fairseq"]

    def __init__(self, runtime, *, info: dict, src_dict, tgt_dict, device: str, compute_type: str):
        from nmtkit.models.registry import ArchConfig

        self.runtime = runtime  # the ctranslate2.Translator
        self.info = info
        self.device = device
        self.compute_type = compute_type
        self.arch = ArchConfig.from_dict(info["arch_config"])
        self.max_source_tokens = self.arch.max_source_positions - 1  # positions include </s>
        self.max_target_tokens = self.arch.max_target_positions - 1  # positions include <s>
        self.src_dict, self.tgt_dict = src_dict, tgt_dict
        self._tgt_ids = {tgt_dict[i]: i for i in range(len(tgt_dict))}
        self.use_vmap = False  # `use_shortlist`: CTranslate2 applies the export's vmap.txt

    @classmethod
    def prepare(cls, options: RuntimeOptions, warn: Callable[[str], None]) -> tuple[str, int]:
        if options.threads < 0:
            raise UserError(f"--threads must be >= 0 (0 = the runtime's default), got {options.threads}")
        return runtime_device(options.device, import_ctranslate2())

    @classmethod
    def open(cls, source, prepared: tuple[str, int], src_dict, tgt_dict, options: RuntimeOptions,
             search_cfg: SearchConfig) -> CTranslate2Engine:
        """Load export directory `source.paths[0]` (a `nmtkit.backends.registry.ModelSource`) on
        `prepared` (`prepare`'s device and index)."""
        path, info = source.paths[0], source.info
        dev, index = prepared
        ct2 = import_ctranslate2()
        ctype = compute_type(options.precision, info["runtime"].get("quantization", "float32"))
        if search_cfg.seed is not None:  # before the worker threads exist: each seeds itself from it once
            ct2.set_random_seed(search_cfg.seed)
        try:
            runtime = ct2.Translator(str(path), device=dev, device_index=index, compute_type=ctype,
                                     intra_threads=options.threads)
        except (ValueError, RuntimeError) as e:
            raise UserError(f"{path}: CTranslate2 cannot load it on {dev} with --precision {options.precision} "
                            f"(compute type {ctype}): {first_line(e)}") from None
        return cls(runtime, info=info, src_dict=src_dict, tgt_dict=tgt_dict,
                   device=f"{dev}:{index}" if dev == "cuda" else dev, compute_type=ctype)

    @classmethod
    def unsupported(cls, cfg: SearchConfig) -> str | None:
        return unsupported(cfg)

    def architectures(self) -> list[dict]:
        return [self.arch.to_dict()]

    def use_shortlist(self, shortlist) -> None:
        """CTranslate2 restricts its output layer itself (`use_vmap`), to the union of the
        candidates of the batch's source tokens, from the vocabulary map in the export directory:
        `shortlist` must be that file, or one with the same bytes."""
        entry = self.info.get("shortlist")
        if entry is None:
            raise UserError(f"--shortlist: this CTranslate2 export has no vocabulary map (CTranslate2 reads it from "
                            f"the export directory); export again with nmtkit export --shortlist {shortlist.path}")
        if shortlist.sha256 != entry["sha256"]:
            raise UserError(f"--shortlist {shortlist.path}: not the export's own vocabulary map {entry['file']}, "
                            f"which CTranslate2 applies; give that file")
        self.shortlist, self.use_vmap = shortlist, True

    # -- searching

    def search(self, sources: Sequence[np.ndarray], cfg: SearchConfig,
               positional_scores: bool = False) -> list[list[Hypothesis]]:
        """One CTranslate2 call per output limit (a batch sorted by length gives long runs)."""
        runs: dict[int, list[int]] = {}
        for r, ids in enumerate(sources):
            runs.setdefault(output_limit(len(ids), cfg), []).append(r)
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for limit, rows in runs.items():
            tokens = [self.src_dict.string(sources[r]) for r in rows]
            for r, hyps in zip(rows, self._search(tokens, cfg, limit, positional_scores)):
                results[r] = hyps
        return results

    def _search(self, source: list[list[str]], cfg: SearchConfig, limit: int, rescore: bool) -> list[list[Hypothesis]]:
        """nmtkit's hypotheses for a run of sources with output limit `limit`, best first."""
        if limit == 0:  # only </s> is allowed: the empty hypothesis, scored (CTranslate2 needs a step)
            hyps = [Hypothesis(tokens=[], score=0.0, logprob=0.0) for _ in source]
            self._rescore([(h, src, []) for h, src in zip(hyps, source)], cfg)
            return [[h] * (cfg.beam if cfg.sampling else 1) for h in hyps]
        out, redo = self._translate_without_bans(source, cfg, limit)
        return [self._hypotheses(src, res, cfg, rescore or k in redo) for k, (src, res) in enumerate(zip(source, out))]

    def _translate_without_bans(self, source: list[list[str]], cfg: SearchConfig, limit: int) -> tuple[list, set[int]]:
        """CTranslate2's results, and the sources searched again because they held <pad> / <s>.

        CTranslate2 scores with the full softmax, as nmtkit does, and may then emit <pad> / <s>,
        which nmtkit bans (an undertrained model gives them label smoothing's eps / V). Those
        sentences are searched again with them suppressed; that renormalizes over the other
        tokens, so their scores are recomputed exactly (by the caller).
        """
        out = self._translate(source, cfg, limit, suppress=False)
        t = self.tgt_dict
        banned = ({t[t.pad], t[t.bos]} | {t[i] for i in cfg.banned}) - {t[t.eos]}
        redo = [i for i, res in enumerate(out) if any(tok in banned for hyp in res.hypotheses for tok in hyp)]
        if redo:
            for i, res in zip(redo, self._translate([source[i] for i in redo], cfg, limit, suppress=True)):
                out[i] = res
        return out, set(redo)

    def _hypotheses(self, src: list[str], res, cfg: SearchConfig, rescore: bool) -> list[Hypothesis]:
        """One source's CTranslate2 result as nmtkit's hypotheses, best first: those stopped at
        the limit closed by </s> and rescored, all rescored with `rescore`."""
        eos = self.tgt_dict[self.tgt_dict.eos]
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
        return hyps[: cfg.nbest]

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

    def _options(self, cfg: SearchConfig, limit: int, suppress: bool = False) -> dict:
        """translate_batch's keyword arguments for `cfg` and a run of sentences with output `limit`."""
        t = self.tgt_dict
        alpha = cfg.lenpen if cfg.lenpen_form == "fairseq" else 0.0  # gnmt only with lenpen 0 (checked)
        opts = dict(max_input_length=0, max_decoding_length=limit, min_decoding_length=min(cfg.min_len, limit),
                    return_scores=True, return_end_token=True, no_repeat_ngram_size=cfg.no_repeat_ngram_size,
                    use_vmap=self.use_vmap)
        if suppress:
            opts["suppress_sequences"] = ([[t[t.pad]]] + ([[t[t.bos]]] if t.bos != t.eos else [])
                                          + [[t[i]] for i in cfg.banned])
        if cfg.sampling:
            samples = 1 if cfg.topk == 1 else cfg.beam  # top-1 sampling is greedy: one sample, repeated
            opts.update(beam_size=1, num_hypotheses=samples, length_penalty=alpha, sampling_topk=cfg.topk,
                        sampling_topp=cfg.topp if cfg.topp > 0 else 1.0, sampling_temperature=cfg.temperature)
        elif cfg.beam == 1:
            opts.update(beam_size=1, num_hypotheses=1, length_penalty=alpha, sampling_topk=1)
        else:
            # every finished hypothesis comes back (not only nbest): the ones stopped at the limit
            # are closed by </s> and rescored, and may then rank lower
            opts.update(beam_size=cfg.beam, num_hypotheses=cfg.beam, length_penalty=alpha or NO_PENALTY,
                        patience=1.0, sampling_topk=1)
        return opts

    def _translate(self, source: list[list[str]], cfg: SearchConfig, limit: int, suppress: bool) -> list:
        try:
            return self.runtime.translate_batch(source, **self._options(cfg, limit, suppress))
        except (ValueError, RuntimeError) as e:  # e.g. --topk over the vocabulary size
            raise UserError(f"CTranslate2 refused the search settings: {first_line(e)}") from None

    def __repr__(self) -> str:
        return f"CTranslate2 compute_type={self.compute_type}"


ENGINE = CTranslate2Engine
