"""The Transformer model (`transformer`), its attention (`attention`) and named configs (`registry`)."""

from nmtkit.models.registry import ARCH_NOTES, ARCHS, ArchConfig, apply_overrides, arch_field_specs, get_arch
from nmtkit.models.transformer import DecoderCache, EncoderOut, Transformer, count_parameters

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
