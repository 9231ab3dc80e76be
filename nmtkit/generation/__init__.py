"""Translating with a trained model, whatever runs it: the `Translator` (the Python API and the
one opener, `translator`), its inputs and batches (`items`), the `nmtkit generate` driver
(`generator`) and `nmtkit attention` (`inspection`). The runtime-neutral side of forced decoding
(scores, alignments, attention of given targets) is `nmtkit.forced`, below this package.

The model work is an engine's (`nmtkit.backends`); the search and its settings are
`nmtkit.search`. The search's settings and results are re-exported here (no torch imported).
"""

from nmtkit.search.config import Hypothesis, SearchConfig, length_penalty

__all__ = ["Hypothesis", "SearchConfig", "length_penalty"]
