"""nmtkit: Transformer encoder-decoder models for translation and parsing, as in Vaswani et al. 2017."""

__version__ = "0.1.0"
