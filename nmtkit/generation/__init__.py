"""Inference: batched beam search, greedy search and sampling (`nmtkit.generation.search`), and
the `generate` driver that reads inputs, batches them, runs the search and writes outputs
(`nmtkit.generation.generator`).

The search function is `nmtkit.generation.search.search`; it is not re-exported here, so that
`nmtkit.generation.search` always names the module.
"""

from nmtkit.generation.search import Hypothesis, SearchConfig, length_penalty

__all__ = ["Hypothesis", "SearchConfig", "length_penalty"]
