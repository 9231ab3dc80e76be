"""The one place where a `Transformer` is built for a set of dictionaries, and where checkpoints
become models: `nmtkit train` builds through `build_model`, `nmtkit generate`, the `Translator`
and everything after load through `load_models`.

Why one place: every consumer (training, generation, export, serving, inspection) must make the
same compatibility checks (a checkpoint's dictionaries and languages against the data directory's,
EMA weights present when asked for, a config within `nmtkit.models.registry.LIMITS`, weights that
fit their own config, checked on the meta device before the model is built, and finite) and the
same cast to a precision; the file reading itself is
`nmtkit.checkpoints.load_checkpoint` (weights_only=True, and the checkpoint's layout checked).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nmtkit.device import check_precision
from nmtkit.errors import UserError, first_line
from nmtkit.models.registry import ArchConfig
from nmtkit.models.transformer import Transformer

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def precision_dtype(precision: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a precision name ("fp32", "bf16", "fp16"); a dtype passes through."""
    if isinstance(precision, torch.dtype):
        if precision not in PRECISIONS.values():
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision}")
        return precision
    return PRECISIONS[check_precision(precision)]


def build_model(cfg: ArchConfig, src_dict, tgt_dict) -> Transformer:
    """A freshly initialised Transformer of `cfg` sized to the two dictionaries (the padding id is theirs)."""
    return Transformer(cfg, len(src_dict), len(tgt_dict), pad_idx=src_dict.pad)


def check_weights(weights: dict, cfg: ArchConfig, src_vocab_size: int, tgt_vocab_size: int, where: str,
                  pad_idx: int = 0) -> None:
    """Refuse weights whose names or shapes do not fit `cfg` and the vocabulary sizes, before any model is built.

    Why before: building a model allocates what its config asks for, so a crafted config (a huge
    d_ff next to small tensors) would take gigabytes before `load_state_dict` noticed the
    mismatch. The reference is the same model on the meta device, which allocates nothing; its
    size is bounded first by the number of stored tensors (each layer stores several). What no
    stored tensor backs (the sinusoid tables computed from max_*_positions x d_model, the number
    of heads) was bounded before, by `ArchConfig.validate`'s limits (`arch_config_of`).
    `weights` has passed `nmtkit.checkpoints.check_structure` (a dict of tensors).
    """
    bad = f"{where}: weights do not fit its own architecture config"
    layers = cfg.encoder_layers + cfg.decoder_layers
    if layers > len(weights):
        raise UserError(f"{bad}: it asks for {layers} layers but only {len(weights)} tensors are stored")
    with torch.device("meta"):
        expected = Transformer(cfg, src_vocab_size, tgt_vocab_size, pad_idx=pad_idx).state_dict()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    if missing or unexpected:
        parts = [f"{what} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                 for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
        raise UserError(f"{bad}: {'; '.join(parts)}")
    for k, ref in expected.items():
        w = weights[k]
        if tuple(w.shape) != tuple(ref.shape):
            raise UserError(f"{bad}: {k} has shape {tuple(w.shape)} where the config needs {tuple(ref.shape)}")
        if w.is_floating_point() != ref.is_floating_point():
            raise UserError(f"{bad}: {k} is {w.dtype} where the model has {ref.dtype}")


def arch_config_of(state: dict, where: str) -> ArchConfig:
    """The checkpoint's ArchConfig, or a UserError naming `where` if the stored settings are invalid."""
    try:
        return ArchConfig.from_dict(state["arch_config"])
    except UserError as e:
        raise UserError(f"{where}: invalid architecture config in the checkpoint: {e}") from None


@dataclass
class LoadedModels:
    """The models of one or several checkpoints (an ensemble), ready for inference (eval mode,
    on their device, in their precision), with the limits that all of them accept."""

    models: list[torch.nn.Module]
    max_source_tokens: int  # tokens before </s> that every model accepts
    max_target_tokens: int  # generated tokens before </s> that every model can position
    configs: list[ArchConfig] = field(default_factory=list)  # one per model, in `paths` order
    paths: list[str] = field(default_factory=list)


def load_models(
    paths: str | os.PathLike | Sequence[str | os.PathLike], src_dict, tgt_dict,
    device: torch.device | str = "cpu", dtype: torch.dtype | str = torch.float32, ema: bool = False,
    langs: tuple[str, str] | None = None, quantize: str | None = None, prepack: bool = False,
) -> LoadedModels:
    """Build each checkpoint's Transformer, refusing dictionaries (or languages) that differ from the data dir's.

    `paths`: one checkpoint or several (an ensemble); `dtype`: a torch dtype or a precision name
    ("fp32", "bf16", "fp16"); `langs`: the data directory's (source, target) languages, which
    tell a de->en model from an en->de one when the dictionary is joined (same file both ways).
    Every refusal is a `UserError` of one line naming the checkpoint (as `--path P`), among them
    a config over the registry's limits and weights holding NaN or infinite values.

    `quantize="int8"` (CPU, fp32 only) and `prepack=True` (CPU, fp32) replace the linear layers by
    the inference-only kernels of `nmtkit.models.quantize` (int8, or oneDNN with prepacked fp32
    weights): what decoding wants, but such models have no linear weights in their state_dict,
    so consumers of the weights themselves (export, inspection) leave both off.
    """
    paths = _checkpoint_paths(paths)
    dtype = precision_dtype(dtype)
    device = torch.device(device)
    kernel = _linear_kernel(quantize, prepack, device, dtype)
    expected = {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256}
    if langs is not None:
        expected["src_lang"], expected["tgt_lang"] = langs
    models, configs = [], []
    max_src = max_tgt = math.inf
    for p in paths:
        model, cfg = _load_one(p, src_dict, tgt_dict, expected, ema)
        _prepare_for_inference(model, device, dtype, kernel)
        models.append(model)
        configs.append(cfg)
        max_src = min(max_src, cfg.max_source_positions - 1)  # positions include </s>
        max_tgt = min(max_tgt, cfg.max_target_positions - 1)  # positions include <s>
    return LoadedModels(models, int(max_src), int(max_tgt), configs, paths)


def _checkpoint_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """`paths` as a list of strings (one path is a list of one), refused when empty: an ensemble
    of no model cannot translate."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("--path is required (give it several times for an ensemble)")
    return paths


def _linear_kernel(quantize: str | None, prepack: bool, device: torch.device, dtype: torch.dtype) -> str | None:
    """What replaces the linear layers: "int8" (`quantize`, refused where it cannot run),
    "packed" (`prepack`, only where oneDNN serves it: CPU, fp32, no quantization) or None."""
    from nmtkit.models.quantize import check_quantize, packing_available

    quantize = check_quantize(quantize, device, dtype)
    if quantize is not None:
        return quantize
    pack = prepack and device.type == "cpu" and dtype == torch.float32 and packing_available()
    return "packed" if pack else None


def _load_one(p: str, src_dict, tgt_dict, expected: dict, ema: bool) -> tuple[Transformer, ArchConfig]:
    """The Transformer of checkpoint `p` and its config, after every check against the data
    directory and its own config; its tensors are still the file's (mapped, in its dtype)."""
    from nmtkit.checkpoints import (
        check_finite,
        check_same_dictionaries,
        load_checkpoint,
    )

    # mapped, not read: a training checkpoint's optimizer state is never touched
    state = load_checkpoint(p, mmap=True)
    check_same_dictionaries(
        state, f"--path {p}", expected, "it cannot translate with this data directory's dictionaries"
    )
    cfg = arch_config_of(state, f"--path {p}")
    weights = _weights_of(state, p, ema)
    check_weights(weights, cfg, len(src_dict), len(tgt_dict), f"--path {p}", pad_idx=src_dict.pad)
    check_finite(weights, "ema" if ema else "model", f"--path {p}", "use an earlier checkpoint")
    try:
        # the checkpoint's own tensors become the parameters: no random init, no copy
        model = Transformer.from_state_dict(cfg, len(src_dict), len(tgt_dict), weights, pad_idx=src_dict.pad)
    except RuntimeError as e:
        raise UserError(f"--path {p}: weights do not fit its own architecture config: {first_line(e)}") from None
    return model, cfg


def _weights_of(state: dict, p: str, ema: bool) -> dict:
    """The checkpoint's raw weights, or with `ema` its EMA weights, refused where it has none."""
    if not ema:
        return state["model"]
    if state.get("ema") is None:
        raise UserError(f"--ema: {p} holds no EMA weights (train with EMA, or drop --ema)")
    return state["ema"]


def _prepare_for_inference(model: Transformer, device: torch.device, dtype: torch.dtype, kernel: str | None) -> None:
    """Put `model` in eval mode on its device and precision, with its linear layers replaced by
    `kernel`'s (see `_linear_kernel`), in place."""
    from nmtkit.models.quantize import convert_linears

    model.eval().to(device=device, dtype=dtype)
    if kernel is not None:
        convert_linears(model, kernel)
        # The converted layers hold copies; what is left still lives in the mapped file,
        # whose pages read for the conversion would stay resident while any tensor of it
        # lives: copy the rest (embeddings, norms; 8 MB on the quickstart model) so that
        # the mapping goes with the checkpoint's state.
        for t in model.parameters():
            t.data = t.data.clone()
