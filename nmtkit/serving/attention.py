"""`POST /attention` of `nmtkit serve`: one sentence's cross-attention, for the page's heatmap.

    {"text": "a sentence", "target"?: "its translation", "layer"?: -1, "head"?: null, "target_lang"?: "fr"}
    -> {"source_tokens": [...], "target_tokens": [...], "layer": 5, "head": null, "layers": 6,
        "heads": 8, "weights": [[...], ...], "score": -0.41, "target_given": true}

`weights` has one row per target token (its pieces, then "</s>") and one column per source token
(pieces, then "</s>"): the weights of one layer (0-based; negative counts from the top) and one
head, or with `head` null the mean over the heads, rounded to 4 decimals. Without `target` the
model's own translation (the server's search settings) is used; the page sends the translation it
shows, so the pass is teacher-forced on exactly that output.

Why one layer and head per request: all of them for a 1000-character sentence would be tens of
megabytes of JSON; one is at most a few hundred kilobytes, and the page asks again when the user
picks another. The limits are /translate's: the body size, the sentence length (of the text and
of the target), and the queue (an attention pass runs on the batcher's worker thread like a
translation, `Batcher.submit_call`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FIELDS = ("text", "target", "layer", "head", "target_lang")


@dataclass
class AttentionRequest:
    """A checked /attention request (nmtkit.serving.app.parse_attention_request)."""

    text: str
    target: str | None
    layer: int = -1
    head: int | None = None
    target_lang: str | None = None  # a multilingual model's target language


def attention_call(req: AttentionRequest):
    """What the batcher's worker runs: the translator's attention for `req`, as the answer's
    dict. UserError (an empty sentence, a layer or head out of range, an engine without attention
    weights) reaches the handler, which answers 400."""
    import numpy as np

    from nmtkit.errors import UserError

    def call(translator: Any) -> dict:
        # the ranges first, so that a bad request costs no pass through the model
        layers, heads = translator.engine.layers("cross"), translator.engine.heads("cross")
        if not -layers <= req.layer < layers:
            raise UserError(f'"layer" {req.layer} is out of range: the model has {layers} layers (0-based)')
        if req.head is not None and not 0 <= req.head < heads:
            raise UserError(f'"head" {req.head} is out of range: the model has {heads} heads (0-based)')
        att = translator.attention(req.text, req.target, target_lang=req.target_lang)
        cross = att.cross  # (layers, heads, T, S)
        layer = req.layer % layers
        w = cross[layer].mean(axis=0) if req.head is None else cross[layer, req.head]  # (T, S)
        return {"source_tokens": att.source_tokens, "target_tokens": att.target_tokens,
                "layer": layer, "head": req.head, "layers": layers, "heads": heads,
                "weights": np.round(w.astype(np.float64), 4).tolist(),
                "score": att.score.score, "target_given": att.target_given}

    return call
