"""`nmtkit score` as a library: its settings (`ScoreOptions`), and scoring hypothesis files
against reference files into a report (`score_translation_files`, `score_parseval_file`).

Why here and not in the CLI: the rules between the flags (which apply to which metric), the
checks on the files (line counts, a reference given twice) and the report's text and JSON forms
are the scoring's contract; the CLI (nmtkit.cli.score) only parses flags, shows a spinner and
prints.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from nmtkit.errors import UserError, count
from nmtkit.settings import setting
from nmtkit.scoring.bleu import (
    TRANSLATION_METRICS,
    MetricScore,
    PairedScore,
    TranslationOptions,
    check_parallel,
    check_tokenizer,
    display_name,
    paired_bootstrap,
    parse_metrics,
    read_text,
    score_translation,
)

# flags of the translation metrics, refused with --metric parseval
_TRANSLATION_ONLY = (("--lowercase", "lowercase"), ("--tokenize", "tokenize"), ("--lang", "lang"),
                     ("--compound-split", "compound_split"), ("--pretokenized", "pretokenized"),
                     ("--confidence", "confidence"), ("--paired-bs", "paired_bs"))


@dataclass
class ScoreOptions:
    """`nmtkit score`'s settings; each field is one flag, with its default and help text."""

    ref: list[Path] = setting(flag="--ref", aliases=("-r",), metavar="FILE", show_default=False, parse=list, help="Reference file (plain or .gz), one segment per line; repeat for several references. For --metric parseval: the gold trees, one per line.")
    # None: stdin (the CLI refuses a terminal)
    sys: str | None = setting(None, flag="--sys", aliases=("-s",), metavar="FILE", show_default=False, help="Hypotheses (or test trees), one per line; default: read stdin.")
    metric: str = setting("bleu", flag="--metric", aliases=("-m",), metavar="LIST", help="Comma list of bleu (sacreBLEU), chrf, chrf++, ter, tok-bleu (Moses-tokenized, multi-bleu.perl), or parseval (EVALB, alone).")
    lowercase: bool = setting(False, flag="--lowercase", help="Case-insensitive BLEU/chrF (tok-bleu: ASCII-only, like multi-bleu.perl -lc).")
    # None: 13a (given at all only with --metric bleu)
    tokenize: str | None = setting(None, flag="--tokenize", aliases=("-t",), metavar="NAME", show_default=False, help="sacreBLEU tokenizer for --metric bleu (13a, intl, none, char, zh, ...). [default: 13a]")
    # None: en (given at all only with --metric tok-bleu)
    lang: str | None = setting(None, flag="--lang", aliases=("-l",), metavar="LANG", show_default=False, help="Target language of the Moses tokenizer for tok-bleu (e.g. de, fr). [default: en]")
    compound_split: bool = setting(False, flag="--compound-split", help="tok-bleu: split hyphenated compounds a-b -> a ##AT##-##AT## b (WMT14 En-De).")
    pretokenized: bool = setting(False, flag="--pretokenized", help="tok-bleu: input is already Moses-tokenized; split on spaces only.")
    confidence: bool = setting(False, flag="--confidence", help="Add a bootstrap 95% confidence interval (sacrebleu).")
    confidence_n: int = setting(1000, flag="--confidence-n", metavar="N", help="Bootstrap resamples for --confidence.")
    paired_bs: Optional[Path] = setting(None, flag="--paired-bs", metavar="FILE", show_default=False, help="A baseline system's output: paired bootstrap resampling test of --sys against it (sacrebleu).")
    paired_bs_n: int = setting(1000, flag="--paired-bs-n", metavar="N", help="Resamples for --paired-bs.")
    json: bool = setting(False, flag="--json", help="Print one JSON object instead of text lines.")
    per_sentence: bool = setting(False, flag="--per-sentence", help="parseval: print EVALB's per-sentence table and summary.")
    evalb_param: Optional[Path] = setting(None, flag="--evalb-param", metavar="FILE", show_default=False, help="parseval: an EVALB .prm parameter file instead of the built-in COLLINS.prm settings.")

    @property
    def metrics(self) -> list[str]:
        return parse_metrics(self.metric, TRANSLATION_METRICS + ("parseval",))

    def validate(self) -> None:
        """UserError naming the flag for every combination that cannot be scored (before any file is read)."""
        metrics = self.metrics
        if "parseval" in metrics:
            for flag, name in _TRANSLATION_ONLY:
                if getattr(self, name) not in (None, False):
                    raise UserError(f"{flag} does not apply to --metric parseval")
            if len(metrics) > 1:
                raise UserError("--metric parseval cannot be combined with translation metrics; run score twice")
            if len(self.ref) != 1:
                raise UserError(f"--metric parseval takes exactly one --ref (the gold trees), got {len(self.ref)}")
            return
        for flag, given in (("--per-sentence", self.per_sentence), ("--evalb-param", self.evalb_param is not None)):
            if given:
                raise UserError(f"{flag} only applies to --metric parseval")
        if self.tokenize is not None:
            check_tokenizer(self.tokenize)
            if "bleu" not in metrics:
                raise UserError("--tokenize applies to --metric bleu (sacreBLEU); tok-bleu uses Moses tokenization (--lang)")
        for flag, given in (("--lang", self.lang is not None), ("--compound-split", self.compound_split),
                            ("--pretokenized", self.pretokenized)):
            if given and "tok-bleu" not in metrics:
                raise UserError(f"{flag} only applies to --metric tok-bleu")
        if self.pretokenized and self.lang is not None:
            raise UserError("--lang has no effect with --pretokenized (no Moses tokenization is done)")
        if self.confidence and self.confidence_n < 2:
            raise UserError(f"--confidence-n must be >= 2, got {self.confidence_n}")
        if self.paired_bs is not None and self.paired_bs_n < 2:
            raise UserError(f"--paired-bs-n must be >= 2, got {self.paired_bs_n}")

    def translation_options(self) -> TranslationOptions:
        return TranslationOptions(
            lowercase=self.lowercase, tokenize=self.tokenize or "13a", lang=self.lang or "en",
            compound_split=self.compound_split, pretokenized=self.pretokenized,
            confidence_n=self.confidence_n if self.confidence else 0,
        )


@dataclass
class TranslationInputs:
    """The hypotheses, references and (for --paired-bs) the baseline, read and checked parallel."""

    hyps: list[str]
    refs: list[list[str]]
    sys_name: str
    ref_names: list[str]
    baseline: list[str] | None = None
    baseline_name: str | None = None
    warnings: list[str] = field(default_factory=list)


def sys_path(sys_file: str | None) -> str:
    """The hypotheses' path: `sys_file`, else "-" (stdin) unless stdin is a terminal (UserError)."""
    if sys_file is not None:
        return sys_file
    if sys.stdin is None or sys.stdin.isatty():
        raise UserError("no --sys FILE given and stdin is a terminal: pipe the hypotheses in or pass --sys FILE")
    return "-"


def _warn_if_blank(warnings: list[str], flag: str, name: str, lines: list[str]) -> None:
    """An all-blank system output scores 0 everywhere: almost surely a failed run, so say so."""
    if all(not line.strip() for line in lines):
        warnings.append(f"{flag} {name}: all {count(len(lines), 'line')} are empty or blank; its scores are "
                        f"those of an empty output (did the translation run fail?)")


def read_translation_inputs(ref_paths: list[Path], sys_file: str | None, paired_bs: Path | None = None) -> TranslationInputs:
    """Read every file (`sys_file` None = stdin); UserError on a missing file or unequal line counts."""
    refs = [read_text(r, "--ref") for r in ref_paths]
    ref_names = [str(r) for r in ref_paths]
    if len(set(ref_names)) != len(ref_names):
        raise UserError("--ref: the same reference file is given twice")
    for r, name in zip(refs[1:], ref_names[1:]):
        if len(r) != len(refs[0]):
            raise UserError(
                f"line counts differ: reference {ref_names[0]} has {count(len(refs[0]), 'line')} but reference "
                f"{name} has {count(len(r), 'line')}"
            )
    path = sys_path(sys_file)
    hyps = read_text(path, "--sys")
    inputs = TranslationInputs(hyps, refs, display_name(path), ref_names)
    check_parallel(hyps, inputs.sys_name, refs, ref_names)
    _warn_if_blank(inputs.warnings, "--sys", inputs.sys_name, hyps)
    if paired_bs is not None:
        inputs.baseline, inputs.baseline_name = read_text(paired_bs, "--paired-bs"), str(paired_bs)
        check_parallel(inputs.baseline, inputs.baseline_name, refs, ref_names, what="baseline (--paired-bs)")
        _warn_if_blank(inputs.warnings, "--paired-bs", inputs.baseline_name, inputs.baseline)
        if inputs.baseline == hyps:
            inputs.warnings.append(
                f"--paired-bs {paired_bs} is identical to the hypotheses; sacrebleu reports p = 1/(n+1) "
                f"for a zero difference (MultEval's convention), which is not evidence of a difference"
            )
    return inputs


@dataclass
class TranslationReport:
    """The scores of one system (and its paired test against a baseline), as text or JSON."""

    inputs: TranslationInputs
    scores: list[MetricScore]
    paired: list[PairedScore] | None = None
    paired_bs_n: int = 0

    def to_dict(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "sys": self.inputs.sys_name,
            "refs": self.inputs.ref_names,
            "lines": len(self.inputs.hyps),
            "scores": [s.to_dict() for s in self.scores],
        }
        if self.paired is not None:
            obj["paired_bs"] = {
                "baseline": self.inputs.baseline_name,
                "n_samples": self.paired_bs_n,
                "results": [p.to_dict() for p in self.paired],
            }
        return obj

    def text(self, as_json: bool = False) -> str:
        """What `nmtkit score` prints: one line per metric (and per paired result), or one JSON line."""
        if as_json:
            return json.dumps(self.to_dict(), ensure_ascii=False) + "\n"
        lines = [s.format_line() for s in self.scores]
        if self.paired is not None:
            lines.append(f"paired bootstrap resampling ({self.paired_bs_n} resamples): system {self.inputs.sys_name} "
                         f"vs baseline {self.inputs.baseline_name} | lines: {len(self.inputs.hyps)}")
            lines += [p.format_line() for p in self.paired]
        return "".join(line + "\n" for line in lines)


def score_translation_files(inputs: TranslationInputs, opts: ScoreOptions) -> TranslationReport:
    """Score `inputs` with `opts`' metrics (and the paired bootstrap test when it has a baseline)."""
    metrics, topts = opts.metrics, opts.translation_options()
    scores = score_translation(inputs.hyps, inputs.refs, metrics, topts)
    paired = None
    if inputs.baseline is not None:
        paired = paired_bootstrap(inputs.hyps, inputs.baseline, inputs.refs, metrics, topts, opts.paired_bs_n)
    return TranslationReport(inputs, scores, paired, opts.paired_bs_n)


def score_parseval_file(opts: ScoreOptions):
    """EVALB on --sys (or stdin) against the one --ref: (the test path, "-" = stdin; ParsevalResult)."""
    from nmtkit.scoring.parseval import COLLINS, evaluate_files, read_evalb_params

    params = read_evalb_params(opts.evalb_param) if opts.evalb_param is not None else COLLINS
    test_path = sys_path(opts.sys)
    return test_path, evaluate_files(opts.ref[0], test_path, params)


def parseval_text(opts: ScoreOptions, test_path: str, result) -> str:
    """What `nmtkit score --metric parseval` prints: the summary line (after EVALB's table with
    --per-sentence), or one JSON line."""
    if opts.json:
        obj = {"sys": "<stdin>" if test_path == "-" else test_path, "ref": str(opts.ref[0])}
        obj.update(result.to_dict())
        return json.dumps(obj, ensure_ascii=False) + "\n"
    return (result.evalb_report() if opts.per_sentence else "") + result.format_line() + "\n"

