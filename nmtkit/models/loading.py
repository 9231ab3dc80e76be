"""The one place where a `Transformer` is built for a set of dictionaries, and where checkpoints
become models: `nmtkit train` builds through `build_model`, `nmtkit generate`, the `Translator`
and everything after load through `load_models`.

Why one place: every consumer (training, generation, export, serving, inspection) must make the
same compatibility checks (a checkpoint's dictionaries and languages against the data directory's,
EMA weights present when asked for, weights that fit their own config, checked on the meta device
before the model is built) and the same cast to a precision; the file reading itself is
`nmtkit.checkpoints.load_checkpoint` (weights_only=True, and the checkpoint's layout checked).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from nmtkit.errors import UserError
from nmtkit.models.registry import ArchConfig
from nmtkit.models.transformer import Transformer

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def precision_dtype(precision: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a precision name ("fp32", "bf16", "fp16"); a dtype passes through."""
    if isinstance(precision, torch.dtype):
        if precision not in PRECISIONS.values():
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision}")
        return precision
    if precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def build_model(cfg: ArchConfig, src_dict, tgt_dict) -> Transformer:
    """A freshly initialised Transformer of `cfg` sized to the two dictionaries (the padding id is theirs)."""
    return Transformer(cfg, len(src_dict), len(tgt_dict), pad_idx=src_dict.pad)


def check_weights(weights: dict, cfg: ArchConfig, src_vocab_size: int, tgt_vocab_size: int, where: str,
                  pad_idx: int = 0) -> None:
    """Refuse weights whose names or shapes do not fit `cfg` and the vocabulary sizes, before any model is built.

    Why before: building a model allocates what its config asks for, so a crafted config (a huge
    d_ff next to small tensors) would take gigabytes before `load_state_dict` noticed the
    mismatch. The reference is the same model on the meta device, which allocates nothing; its
    size is bounded first by the number of stored tensors (each layer stores several).
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
    Every refusal is a `UserError` of one line naming the checkpoint (as `--path P`).

    `quantize="int8"` (CPU, fp32 only) and `prepack=True` (CPU, fp32) replace the linear layers by
    the inference-only kernels of `nmtkit.models.quantize` (int8, or oneDNN with prepacked fp32
    weights): what decoding wants, but such models have no linear weights in their state_dict,
    so consumers of the weights themselves (export, inspection) leave both off.
    """
    from nmtkit.models.quantize import check_quantize, convert_linears, packing_available

    from nmtkit.checkpoints import check_same_dictionaries, load_checkpoint

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [str(p) for p in paths]
    if not paths:
        raise UserError("--path is required (give it several times for an ensemble)")
    dtype = precision_dtype(dtype)
    device = torch.device(device)
    quantize = check_quantize(quantize, device, dtype)
    pack = prepack and quantize is None and device.type == "cpu" and dtype == torch.float32 and packing_available()
    expected = {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256}
    if langs is not None:
        expected["src_lang"], expected["tgt_lang"] = langs
    models, configs = [], []
    max_src = max_tgt = math.inf
    for p in paths:
        # mapped, not read: a training checkpoint's optimizer state is never touched
        state = load_checkpoint(p, mmap=True)
        check_same_dictionaries(
            state, f"--path {p}", expected, "it cannot translate with this data directory's dictionaries"
        )
        cfg = arch_config_of(state, f"--path {p}")
        weights = state["model"]
        if ema:
            if state.get("ema") is None:
                raise UserError(f"--ema: {p} holds no EMA weights (train with EMA, or drop --ema)")
            weights = state["ema"]
        check_weights(weights, cfg, len(src_dict), len(tgt_dict), f"--path {p}", pad_idx=src_dict.pad)
        try:
            # the checkpoint's own tensors become the parameters: no random init, no copy
            model = Transformer.from_state_dict(cfg, len(src_dict), len(tgt_dict), weights, pad_idx=src_dict.pad)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise UserError(f"--path {p}: weights do not fit its own architecture config: {first}") from None
        del state, weights
        model.eval().to(device=device, dtype=dtype)
        if quantize is not None or pack:
            convert_linears(model, quantize or "packed")
            # The converted layers hold copies; what is left still lives in the mapped file,
            # whose pages read for the conversion would stay resident while any tensor of it
            # lives: copy the rest (embeddings, norms; 8 MB on the quickstart model) so that
            # the mapping goes with `state`.
            for t in model.parameters():
                t.data = t.data.clone()
        models.append(model)
        configs.append(cfg)
        max_src = min(max_src, cfg.max_source_positions - 1)  # positions include </s>
        max_tgt = min(max_tgt, cfg.max_target_positions - 1)  # positions include <s>
    return LoadedModels(models, int(max_src), int(max_tgt), configs, paths)
