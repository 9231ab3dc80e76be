"""Translation metrics: sacreBLEU, chrF, TER and paper-comparable tokenized BLEU.

Why delegate: sacrebleu is the reference implementation behind published scores and their
signatures, so every metric here is a sacrebleu object (`BLEU`, `CHRF`, `TER`), and bootstrap
confidence intervals and paired significance tests are sacrebleu's own (`corpus_score(...,
n_bootstrap=...)`, `sacrebleu.significance.PairedTest`).

`tok-bleu` reproduces how the paper's WMT14 En-De numbers were computed (tensor2tensor's
`get_ende_bleu.sh`, fairseq's `compound_split_bleu.sh`): Moses tokenization (sacremoses), then
optionally `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`, then Moses `multi-bleu.perl`.
multi-bleu.perl is BLEU on whitespace tokens with no smoothing, closest reference length (ties to
the shorter) and the usual brevity penalty, which is sacrebleu's BLEU with `tokenize='none'` and
`smooth_method='none'`; two byte-level details of the perl script are reproduced on top (see
`_multibleu_prepare`).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from nmtkit.errors import UserError, count
from nmtkit.io import read_lines, require_file

# Metric keys accepted by `--metric` for translation (parseval lives in nmtkit.scoring.parseval).
TRANSLATION_METRICS = ("bleu", "chrf", "chrf++", "ter", "tok-bleu")

# What perl's `\s` matches on bytes (multi-bleu.perl and `perl -ple` read bytes, not UTF-8).
_PERL_WS = " \t\n\r\f\v"

# The tensor2tensor / fairseq compound split, with perl's byte semantics: `\S` is anything but
# ASCII whitespace (re.ASCII), so `a\u00a0-b` is split as perl splits it. Python's re.sub, like
# perl's s///g, takes non-overlapping matches left to right, hence `a-b-c` -> `a ##AT##-##AT## b-c`.
_COMPOUND_RE = re.compile(r"(\S)-(\S)", re.ASCII)

# Characters that Python's str.split() treats as whitespace but perl's split does not. multi-bleu
# keeps them inside tokens; sacrebleu's n-gram extraction would split on them, so they are mapped
# to private-use code points U+F0000+c (a renaming that leaves every n-gram match unchanged, as
# long as the text does not itself contain those private-use characters).
_UNICODE_ONLY_WS_CHARS = (
    "\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)  # == every c with c.isspace() and c not in _PERL_WS (checked by tests/test_score.py)
_UNICODE_ONLY_WS = {ord(c): 0xF0000 + ord(c) for c in _UNICODE_ONLY_WS_CHARS}
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def compound_split(line: str) -> str:
    """`rich-text format` -> `rich ##AT##-##AT## text format`, exactly like the perl one-liner."""
    return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def ascii_lowercase(line: str) -> str:
    """Lowercase A-Z only: what multi-bleu.perl's `-lc` (perl `lc` on bytes) does to UTF-8 text."""
    return line.translate(_ASCII_LOWER)


class MosesTokenizer:
    """Moses `tokenizer.perl -l LANG` through sacremoses (no aggressive hyphen splitting).

    XML escaping (`tokenizer.perl`'s default) is off: it renames tokens (`"` -> `&quot;`) the same
    way on both sides, which leaves BLEU unchanged, except where an escaped character sits between
    two hyphens (`x-'-y`) and the non-overlapping compound split then matches differently.

    Which tokenizer.perl: sacremoses follows it as it was before Moses commit 9fc964d
    (2018-11-07, "split final dots unconditionally"), the one of the paper's time. Since then
    tokenizer.perl also splits the period of a line's last token when the old rules kept it
    (`iPhone 5.`, `p.m.`, `FoxNews.com.`, `II.`); on 16 WMT17 En-De systems that moves
    multi-bleu.perl BLEU by at most 0.01 (docs/score.md). `moses_rules()` says which rule the
    installed sacremoses follows, and the tok-bleu signature records it.
    """

    def __init__(self, lang: str):
        import sacremoses

        self.lang = lang
        self.version = _sacremoses_version()
        self._tok = sacremoses.MosesTokenizer(lang=lang)

    def __call__(self, line: str) -> str:
        return self._tok.tokenize(line, escape=False, return_str=True)


# The Moses tokenizer.perl commit that made it split every line's final period (2018-11-07).
MOSES_FINAL_DOT_COMMIT = "9fc964d"


@functools.lru_cache(maxsize=None)
def moses_rules() -> str:
    """"pre-2018-11" when the installed sacremoses keeps a line-final `U.S.A.` whole, as
    tokenizer.perl did before commit 9fc964d (checked, not assumed: a future sacremoses may
    follow the new rule); "2018-11" when it splits it as tokenizer.perl does since."""
    import sacremoses

    out = sacremoses.MosesTokenizer(lang="en").tokenize("from the U.S.A.", escape=False, return_str=True)
    return "pre-2018-11" if out.endswith(" U.S.A.") else "2018-11"


def _sacremoses_version() -> str:
    try:
        from importlib.metadata import version

        return version("sacremoses")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        return "unknown"


@dataclass(frozen=True)
class TranslationOptions:
    """How the translation metrics are computed (one object per `nmtkit score` run)."""

    lowercase: bool = False
    tokenize: str = "13a"  # sacreBLEU's tokenizer for `bleu`
    lang: str = "en"  # Moses tokenizer language for `tok-bleu`
    compound_split: bool = False  # `tok-bleu` only
    pretokenized: bool = False  # `tok-bleu`: input is already Moses-tokenized; split on spaces
    confidence_n: int = 0  # > 1: bootstrap 95% confidence interval with this many resamples


@dataclass
class MetricScore:
    """One corpus-level score with everything needed to reproduce and compare it."""

    metric: str  # the --metric key: bleu, chrf, chrf++, ter, tok-bleu
    name: str  # printed name: BLEU, chrF2, chrF2++, TER, tok-BLEU
    score: float
    signature: str
    lines: int
    verbose: str = ""  # sacrebleu's detail string (precisions, BP, lengths) for BLEU
    details: dict[str, Any] = field(default_factory=dict)
    compound_split: bool | None = None  # None: not a BLEU-family metric
    ci_mean: float | None = None
    ci_halfwidth: float | None = None

    def format_line(self) -> str:
        """`BLEU = 28.30 59.9/... | nrefs:1|...|version:2.6.0 | compound-split: no | lines: 3004`."""
        score = f"{self.score:.2f}"
        if self.ci_mean is not None:
            score += f" (μ = {self.ci_mean:.2f} ± {self.ci_halfwidth:.2f})"
        head = f"{self.name} = {score}"
        if self.verbose:
            head += f" {self.verbose}"
        parts = [head, self.signature]
        if self.compound_split is not None:
            parts.append(f"compound-split: {'yes' if self.compound_split else 'no'}")
        parts.append(f"lines: {self.lines}")
        return " | ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "metric": self.metric,
            "name": self.name,
            "score": self.score,
            "signature": self.signature,
            "lines": self.lines,
        }
        if self.compound_split is not None:
            d["compound_split"] = self.compound_split
        if self.ci_mean is not None:
            d["confidence"] = {"mean": self.ci_mean, "ci95_halfwidth": self.ci_halfwidth}
        d.update(self.details)
        return d


def parse_metrics(spec: str, allowed: Sequence[str]) -> list[str]:
    """Split a comma list such as `bleu,chrf` into validated metric keys (order kept, no repeats)."""
    out: list[str] = []
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name not in allowed:
            raise UserError(f"--metric: unknown metric {raw.strip()!r} (choose from {', '.join(allowed)})")
        if name not in out:
            out.append(name)
    if not out:
        raise UserError(f"--metric: no metric given (choose from {', '.join(allowed)})")
    return out


def sacrebleu_tokenizers() -> list[str]:
    """The tokenizer names that this sacrebleu accepts for BLEU (`--tokenize`)."""
    from sacrebleu.metrics import BLEU

    return list(BLEU.TOKENIZERS)


def check_tokenizer(name: str) -> None:
    allowed = sacrebleu_tokenizers()
    if name not in allowed:
        raise UserError(f"--tokenize: unknown sacreBLEU tokenizer {name!r} (choose from {', '.join(allowed)})")


# ------------------------------------------------------------------------------------ reading


def read_text(path: str | os.PathLike, flag: str) -> list[str]:
    """All lines of a text file (or '-' for stdin); refuse an empty file, naming the flag."""
    name = "<stdin>" if str(path) == "-" else str(path)
    require_file(path, flag)
    lines = list(read_lines(path))
    if not lines:
        raise UserError(f"{flag}: {name} is empty: nothing to score")
    return lines


def check_parallel(hyps: Sequence[str], hyp_name: str, refs: Sequence[Sequence[str]], ref_names: Sequence[str],
                   what: str = "hypotheses") -> None:
    """Hypotheses (or, `what`, the --paired-bs baseline) and every reference must have the same
    number of lines."""
    verb = "have" if what == "hypotheses" else "has"
    for ref, name in zip(refs, ref_names):
        if len(ref) != len(hyps):
            raise UserError(
                f"line counts differ: {what} {hyp_name} {verb} {count(len(hyps), 'line')} but reference "
                f"{name} has {count(len(ref), 'line')}; they must be parallel, one segment per line"
            )


def display_name(path: str | os.PathLike) -> str:
    return "<stdin>" if str(path) == "-" else str(path)


# ------------------------------------------------------------------------------------ metrics


def _multibleu_prepare(lines: Sequence[str], opts: TranslationOptions, moses: MosesTokenizer | None) -> list[str]:
    """Turn raw lines into what multi-bleu.perl would see, in sacrebleu-splittable form.

    Steps: Moses tokenization (unless pretokenized) -> compound split (optional) -> ASCII-only
    lowercasing (multi-bleu's `-lc` on bytes; optional) -> protect the non-ASCII whitespace that
    perl's `split` keeps inside tokens but Python's `str.split` would split on.
    """
    out = []
    for line in lines:
        if moses is not None:
            line = moses(line)
        if opts.compound_split:
            line = compound_split(line)
        if opts.lowercase:
            line = ascii_lowercase(line)
        out.append(line.translate(_UNICODE_ONLY_WS))
    return out


@dataclass
class _Prepared:
    """A sacrebleu metric object with the hypotheses/references it should see."""

    key: str
    metric: Any
    hyps: list[str]
    refs: list[list[str]]


def _prepare(key: str, hyps: Sequence[str], refs: Sequence[Sequence[str]], opts: TranslationOptions, cache: dict) -> _Prepared:
    from sacrebleu.metrics import BLEU, CHRF, TER

    if key == "bleu":
        check_tokenizer(opts.tokenize)
        try:
            metric = BLEU(lowercase=opts.lowercase, tokenize=opts.tokenize)
        except (ImportError, RuntimeError, OSError) as e:
            reason = " ".join(str(e).split())  # sacrebleu's messages span several lines
            raise UserError(f"--tokenize {opts.tokenize}: sacreBLEU cannot use this tokenizer here: {reason}") from None
        return _Prepared(key, metric, list(hyps), [list(r) for r in refs])
    if key == "chrf":
        return _Prepared(key, CHRF(lowercase=opts.lowercase), list(hyps), [list(r) for r in refs])
    if key == "chrf++":
        return _Prepared(key, CHRF(word_order=2, lowercase=opts.lowercase), list(hyps), [list(r) for r in refs])
    if key == "ter":
        # sacrebleu's TER defaults (case-insensitive, like tercom) are what published TER uses.
        return _Prepared(key, TER(), list(hyps), [list(r) for r in refs])
    if key == "tok-bleu":
        moses = None
        if not opts.pretokenized:
            if "moses" not in cache:
                cache["moses"] = MosesTokenizer(opts.lang)
            moses = cache["moses"]
        # lowercase=False: multi-bleu's ASCII-only lowercasing is applied in _multibleu_prepare.
        metric = BLEU(tokenize="none", smooth_method="none", force=True)
        return _Prepared(
            key,
            metric,
            _multibleu_prepare(hyps, opts, moses),
            [_multibleu_prepare(r, opts, moses) for r in refs],
        )
    raise UserError(f"--metric: unknown translation metric {key!r}")  # the CLI validates earlier (parse_metrics)


def _signature(p: _Prepared, opts: TranslationOptions) -> str:
    sig = p.metric.get_signature()
    if p.key == "tok-bleu":
        _tok_bleu_signature(sig, opts)
    return sig.format()


def _tok_bleu_signature(sig: Any, opts: TranslationOptions) -> None:
    """sacrebleu's signature would say tok:none and case:mixed; record what was really done."""
    sig.update("case", "lc-ascii" if opts.lowercase else "mixed")
    sig.update("tok", "pretokenized" if opts.pretokenized else f"moses-{opts.lang}")
    if not opts.pretokenized:
        sig.update("sacremoses", _sacremoses_version())
        sig.update("moses", moses_rules())  # which tokenizer.perl it equals (see MosesTokenizer)
    version = sig.info.pop("version")  # keep "version" last, as sacrebleu does
    sig.info["version"] = version


def _details(p: _Prepared, score: Any) -> tuple[str, dict[str, Any]]:
    if p.key in ("bleu", "tok-bleu"):
        details = {
            "counts": [int(x) for x in score.counts],
            "totals": [int(x) for x in score.totals],
            "precisions": [float(x) for x in score.precisions],
            "bp": float(score.bp),
            "sys_len": int(score.sys_len),
            "ref_len": int(score.ref_len),
        }
        return score._verbose, details
    if p.key == "ter":
        return "", {"num_edits": float(score.num_edits), "ref_length": float(score.ref_length)}
    return "", {"char_order": score.char_order, "word_order": score.word_order, "beta": score.beta}


def _compound_flag(key: str, opts: TranslationOptions) -> bool | None:
    """Whether compounds were split: only tok-bleu can; None for metrics where it is moot."""
    if key == "tok-bleu":
        return opts.compound_split
    return False if key == "bleu" else None


def _name(key: str, score: Any) -> str:
    return "tok-BLEU" if key == "tok-bleu" else score.name


def score_translation(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str],
    opts: TranslationOptions = TranslationOptions(),
) -> list[MetricScore]:
    """Corpus scores of `hyps` against one or more parallel reference lists, one per metric."""
    if not hyps:
        raise UserError("no hypotheses to score (empty input)")
    if opts.compound_split and "tok-bleu" not in metrics:
        raise UserError("--compound-split only applies to --metric tok-bleu (Moses-tokenized BLEU)")
    cache: dict = {}
    results = []
    for key in metrics:
        p = _prepare(key, hyps, refs, opts, cache)
        n_boot = opts.confidence_n if opts.confidence_n > 1 else 1
        score = p.metric.corpus_score(p.hyps, p.refs, n_bootstrap=n_boot)
        verbose, details = _details(p, score)
        ci_mean = ci_half = None
        if n_boot > 1:
            ci_mean, ci_half = float(score._mean), float(score._ci)
        results.append(
            MetricScore(
                metric=key,
                name=_name(key, score),
                score=float(score.score),
                signature=_signature(p, opts),
                lines=len(hyps),
                verbose=verbose,
                details=details,
                compound_split=_compound_flag(key, opts),
                ci_mean=ci_mean,
                ci_halfwidth=ci_half,
            )
        )
    return results


# ------------------------------------------------------------------------- paired significance


@dataclass
class PairedScore:
    """Paired bootstrap resampling of one metric: the baseline, the system and the p-value."""

    metric: str
    name: str
    baseline: float
    baseline_mean: float
    baseline_ci: float
    system: float
    system_mean: float
    system_ci: float
    p_value: float
    signature: str

    def format_line(self, alpha: float = 0.05) -> str:
        verdict = "significant" if self.p_value < alpha else "not significant"
        return (
            f"{self.name}: system {self.system:.2f} (μ = {self.system_mean:.2f} ± {self.system_ci:.2f}) vs "
            f"baseline {self.baseline:.2f} (μ = {self.baseline_mean:.2f} ± {self.baseline_ci:.2f}) | "
            f"p = {self.p_value:.4f} ({verdict} at p < {alpha:g}) | {self.signature}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "name": self.name,
            "system": {"score": self.system, "mean": self.system_mean, "ci95_halfwidth": self.system_ci},
            "baseline": {"score": self.baseline, "mean": self.baseline_mean, "ci95_halfwidth": self.baseline_ci},
            "p_value": self.p_value,
            "signature": self.signature,
        }


def paired_bootstrap(
    hyps: Sequence[str],
    baseline_hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str],
    opts: TranslationOptions = TranslationOptions(),
    n_samples: int = 1000,
) -> list[PairedScore]:
    """Paired bootstrap resampling (Koehn 2004) of `hyps` against `baseline_hyps`, by sacrebleu.

    sacrebleu's `PairedTest(test_type='bs')` replicates Moses'
    bootstrap-hypothesis-difference-significance.pl: both systems are scored on the same
    `n_samples` resampled test sets; the p-value estimates how likely the observed difference is
    under the null hypothesis that both come from the same process. The RNG seed is
    SACREBLEU_SEED (default 12345), so results are reproducible.
    """
    from sacrebleu.significance import PairedTest

    if n_samples < 2:
        raise UserError(f"--paired-bs-n must be >= 2, got {n_samples}")
    cache: dict = {}
    out = []
    for key in metrics:
        p = _prepare(key, hyps, refs, opts, cache)
        # The same preprocessing for the baseline (Moses tokenization, compound split, ...).
        base = _prepare(key, baseline_hyps, refs, opts, cache).hyps
        test = PairedTest(
            [("baseline", base), ("system", p.hyps)],
            {key: p.metric},
            references=p.refs,
            test_type="bs",
            n_samples=n_samples,
        )
        signatures, results = test()
        (score_name,) = [k for k in results if k != "System"]
        bl, sy = results[score_name]
        sig = signatures[score_name]
        if key == "tok-bleu":
            _tok_bleu_signature(sig, opts)
        out.append(
            PairedScore(
                metric=key,
                name="tok-BLEU" if key == "tok-bleu" else score_name,
                baseline=float(bl.score),
                baseline_mean=float(bl.mean),
                baseline_ci=float(bl.ci),
                system=float(sy.score),
                system_mean=float(sy.mean),
                system_ci=float(sy.ci),
                p_value=float(sy.p_value),
                signature=sig.format(),
            )
        )
    return out
