"""`nmtkit score`: sacreBLEU / chrF / TER, paper-comparable tokenized BLEU, and EVALB parseval."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from nmtkit.cli.app import app
from nmtkit.errors import UserError

_MAX_WARNINGS = 10


def _warn(lines: list[str]) -> None:
    """Print warnings on stderr, at most _MAX_WARNINGS of them and a count of the rest."""
    for w in lines[:_MAX_WARNINGS]:
        print(f"nmtkit: warning: {w}", file=sys.stderr)
    if len(lines) > _MAX_WARNINGS:
        print(f"nmtkit: warning: ... and {len(lines) - _MAX_WARNINGS} more", file=sys.stderr)


def _sys_path(sys_file: Optional[str]) -> str:
    if sys_file is not None:
        return sys_file
    if sys.stdin is None or sys.stdin.isatty():
        raise UserError("no --sys FILE given and stdin is a terminal: pipe the hypotheses in or pass --sys FILE")
    return "-"


@app.command("score")
def score_cmd(
    ref: List[Path] = typer.Option(
        ...,
        "--ref",
        "-r",
        metavar="FILE",
        help="Reference file (plain or .gz), one segment per line; repeat for several references. "
        "For --metric parseval: the gold trees, one per line.",
        show_default=False,
    ),
    sys_file: Optional[str] = typer.Option(
        None,
        "--sys",
        "-s",
        metavar="FILE",
        help="Hypotheses (or test trees), one per line; default: read stdin.",
        show_default=False,
    ),
    metric: str = typer.Option(
        "bleu",
        "--metric",
        "-m",
        metavar="LIST",
        help="Comma list of bleu (sacreBLEU), chrf, chrf++, ter, tok-bleu (Moses-tokenized, multi-bleu.perl), "
        "or parseval (EVALB, alone).",
    ),
    lowercase: bool = typer.Option(
        False, "--lowercase", help="Case-insensitive BLEU/chrF (tok-bleu: ASCII-only, like multi-bleu.perl -lc)."
    ),
    tokenize: Optional[str] = typer.Option(
        None,
        "--tokenize",
        "-t",
        metavar="NAME",
        help="sacreBLEU tokenizer for --metric bleu (13a, intl, none, char, zh, ...). [default: 13a]",
        show_default=False,
    ),
    lang: Optional[str] = typer.Option(
        None,
        "--lang",
        "-l",
        metavar="LANG",
        help="Target language of the Moses tokenizer for tok-bleu (e.g. de, fr). [default: en]",
        show_default=False,
    ),
    compound_split: bool = typer.Option(
        False, "--compound-split", help="tok-bleu: split hyphenated compounds a-b -> a ##AT##-##AT## b (WMT14 En-De)."
    ),
    pretokenized: bool = typer.Option(
        False, "--pretokenized", help="tok-bleu: input is already Moses-tokenized; split on spaces only."
    ),
    confidence: bool = typer.Option(False, "--confidence", help="Add a bootstrap 95% confidence interval (sacrebleu)."),
    confidence_n: int = typer.Option(1000, "--confidence-n", metavar="N", help="Bootstrap resamples for --confidence."),
    paired_bs: Optional[Path] = typer.Option(
        None,
        "--paired-bs",
        metavar="FILE",
        help="A baseline system's output: paired bootstrap resampling test of --sys against it (sacrebleu).",
        show_default=False,
    ),
    paired_bs_n: int = typer.Option(1000, "--paired-bs-n", metavar="N", help="Resamples for --paired-bs."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of text lines."),
    per_sentence: bool = typer.Option(
        False, "--per-sentence", help="parseval: print EVALB's per-sentence table and summary."
    ),
    evalb_param: Optional[Path] = typer.Option(
        None,
        "--evalb-param",
        metavar="FILE",
        help="parseval: an EVALB .prm parameter file instead of the built-in COLLINS.prm settings.",
        show_default=False,
    ),
) -> None:
    """Score hypotheses against references: sacreBLEU, chrF, TER, tokenized BLEU, or parse trees (EVALB)."""
    from nmtkit.io import text_stdout
    from nmtkit.scoring.bleu import TRANSLATION_METRICS, parse_metrics

    metrics = parse_metrics(metric, TRANSLATION_METRICS + ("parseval",))
    out = text_stdout()
    if "parseval" in metrics:
        translation_only = {
            "--lowercase": lowercase,
            "--tokenize": tokenize is not None,
            "--lang": lang is not None,
            "--compound-split": compound_split,
            "--pretokenized": pretokenized,
            "--confidence": confidence,
            "--paired-bs": paired_bs is not None,
        }
        for flag, given in translation_only.items():
            if given:
                raise UserError(f"{flag} does not apply to --metric parseval")
        _parseval(metrics, ref, sys_file, out, json_out, per_sentence, evalb_param)
        return
    for flag, given in (("--per-sentence", per_sentence), ("--evalb-param", evalb_param is not None)):
        if given:
            raise UserError(f"{flag} only applies to --metric parseval")
    _translation(
        metrics,
        ref,
        sys_file,
        out,
        json_out,
        lowercase=lowercase,
        tokenize=tokenize,
        lang=lang,
        compound_split=compound_split,
        pretokenized=pretokenized,
        confidence=confidence,
        confidence_n=confidence_n,
        paired_bs=paired_bs,
        paired_bs_n=paired_bs_n,
    )


def _parseval(metrics, ref, sys_file, out, json_out, per_sentence, evalb_param) -> None:
    from nmtkit.scoring.parseval import COLLINS, evaluate_files, read_evalb_params

    if len(metrics) > 1:
        raise UserError("--metric parseval cannot be combined with translation metrics; run score twice")
    if len(ref) != 1:
        raise UserError(f"--metric parseval takes exactly one --ref (the gold trees), got {len(ref)}")
    params = read_evalb_params(evalb_param) if evalb_param is not None else COLLINS
    test_path = _sys_path(sys_file)
    result = evaluate_files(ref[0], test_path, params)
    _warn(result.warnings)
    if json_out:
        obj = {"sys": "<stdin>" if test_path == "-" else test_path, "ref": str(ref[0])}
        obj.update(result.to_dict())
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        return
    if per_sentence:
        out.write(result.evalb_report())
    out.write(result.format_line() + "\n")


def _translation(
    metrics,
    ref,
    sys_file,
    out,
    json_out,
    *,
    lowercase,
    tokenize,
    lang,
    compound_split,
    pretokenized,
    confidence,
    confidence_n,
    paired_bs,
    paired_bs_n,
) -> None:
    from nmtkit.scoring.bleu import (
        TranslationOptions,
        check_parallel,
        check_tokenizer,
        display_name,
        paired_bootstrap,
        read_text,
        score_translation,
    )

    if tokenize is not None:
        check_tokenizer(tokenize)
        if "bleu" not in metrics:
            raise UserError("--tokenize applies to --metric bleu (sacreBLEU); tok-bleu uses Moses tokenization (--lang)")
    for flag, given in (
        ("--lang", lang is not None),
        ("--compound-split", compound_split),
        ("--pretokenized", pretokenized),
    ):
        if given and "tok-bleu" not in metrics:
            raise UserError(f"{flag} only applies to --metric tok-bleu")
    if pretokenized and lang is not None:
        raise UserError("--lang has no effect with --pretokenized (no Moses tokenization is done)")
    if confidence and confidence_n < 2:
        raise UserError(f"--confidence-n must be >= 2, got {confidence_n}")
    if paired_bs is not None and paired_bs_n < 2:
        raise UserError(f"--paired-bs-n must be >= 2, got {paired_bs_n}")

    opts = TranslationOptions(
        lowercase=lowercase,
        tokenize=tokenize or "13a",
        lang=lang or "en",
        compound_split=compound_split,
        pretokenized=pretokenized,
        confidence_n=confidence_n if confidence else 0,
    )
    refs = [read_text(r, "--ref") for r in ref]
    ref_names = [str(r) for r in ref]
    if len(set(ref_names)) != len(ref_names):
        raise UserError("--ref: the same reference file is given twice")
    for r, name in zip(refs[1:], ref_names[1:]):
        if len(r) != len(refs[0]):
            raise UserError(
                f"line counts differ: reference {ref_names[0]} has {len(refs[0])} lines but reference "
                f"{name} has {len(r)} lines"
            )
    sys_path = _sys_path(sys_file)
    hyps = read_text(sys_path, "--sys")
    check_parallel(hyps, display_name(sys_path), refs, ref_names)
    baseline = None
    if paired_bs is not None:
        baseline = read_text(paired_bs, "--paired-bs")
        check_parallel(baseline, str(paired_bs), refs, ref_names)
        if baseline == hyps:
            _warn(
                [
                    f"--paired-bs {paired_bs} is identical to the hypotheses; sacrebleu reports p = 1/(n+1) "
                    f"for a zero difference (MultEval's convention), which is not evidence of a difference"
                ]
            )

    err = Console(stderr=True, highlight=False)
    with err.status(f"scoring {len(hyps)} lines ({', '.join(metrics)})"):
        scores = score_translation(hyps, refs, metrics, opts)
        paired = paired_bootstrap(hyps, baseline, refs, metrics, opts, paired_bs_n) if baseline is not None else None

    if json_out:
        obj = {
            "sys": display_name(sys_path),
            "refs": ref_names,
            "lines": len(hyps),
            "scores": [s.to_dict() for s in scores],
        }
        if paired is not None:
            obj["paired_bs"] = {
                "baseline": str(paired_bs),
                "n_samples": paired_bs_n,
                "results": [p.to_dict() for p in paired],
            }
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        return
    for s in scores:
        out.write(s.format_line() + "\n")
    if paired is not None:
        out.write(
            f"paired bootstrap resampling ({paired_bs_n} resamples): system {display_name(sys_path)} "
            f"vs baseline {paired_bs} | lines: {len(hyps)}\n"
        )
        for p in paired:
            out.write(p.format_line() + "\n")
