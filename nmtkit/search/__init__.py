"""The one search: its settings and results (`config`, no torch) and the batched beam search,
greedy search and sampling over nmtkit's Transformers (`beam`, torch).

Neither is imported here, so that `nmtkit.search.config` stays free of torch's import."""
