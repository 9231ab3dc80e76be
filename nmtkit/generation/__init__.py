"""Inference: batched beam search, greedy search and sampling (search.py), and the `generate`
driver that reads inputs, batches them, runs the search and writes outputs (generator.py)."""

from nmtkit.generation.search import Hypothesis, SearchConfig, length_penalty, search

__all__ = ["Hypothesis", "SearchConfig", "length_penalty", "search"]
