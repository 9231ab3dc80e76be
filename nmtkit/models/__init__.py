"""The Transformer model (`transformer`), its attention (`attention`) and named configs (`registry`).

The registry is imported eagerly (it is plain dataclasses); the model classes, which need torch,
are imported on first use, so that `nmtkit score` or `nmtkit archs --help` do not pay torch's
seconds-long import.
"""

from nmtkit.models.registry import ARCH_NOTES, ARCHS, ArchConfig, apply_overrides, arch_field_specs, get_arch

_TORCH_NAMES = ("DecoderCache", "EncoderOut", "Transformer", "count_parameters")


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        from nmtkit.models import transformer

        return getattr(transformer, name)
    raise AttributeError(f"module 'nmtkit.models' has no attribute {name!r}")


__all__ = [
    "ARCHS",
    "ARCH_NOTES",
    "ArchConfig",
    "DecoderCache",
    "EncoderOut",
    "Transformer",
    "apply_overrides",
    "arch_field_specs",
    "count_parameters",
    "get_arch",
]
