"""Scoring: translation metrics (sacreBLEU, chrF, TER, tokenized BLEU) and EVALB parseval."""

from nmtkit.scoring.bleu import (
    TRANSLATION_METRICS,
    MetricScore,
    PairedScore,
    TranslationOptions,
    compound_split,
    paired_bootstrap,
    score_translation,
)
from nmtkit.scoring.parseval import COLLINS, EvalbParams, ParsevalResult, evaluate, read_evalb_params

__all__ = [
    "COLLINS",
    "EvalbParams",
    "MetricScore",
    "PairedScore",
    "ParsevalResult",
    "TRANSLATION_METRICS",
    "TranslationOptions",
    "compound_split",
    "evaluate",
    "paired_bootstrap",
    "read_evalb_params",
    "score_translation",
]
