"""nmtkit: Transformer encoder-decoder models for translation and parsing, as in Vaswani et al. 2017.

`from nmtkit import Translator` is the Python API (docs/api.md). It is imported on first use, so
that `import nmtkit` (and every CLI command that needs no model) does not pay torch's
seconds-long import.
"""

__version__ = "0.1.0"

_LAZY = {"Translator": "nmtkit.generation.translator", "Translation": "nmtkit.generation.translator"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nmtkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["Translation", "Translator", "__version__"]
