"""The one place where a `Transformer` is built for a set of dictionaries, and where checkpoints
become models: `nmtkit train` builds through `build_model`, `nmtkit generate`, the `Translator`
and everything after load through `load_models`.

Why one place: every consumer (training, generation, export, serving, inspection) must make the
same compatibility checks (a checkpoint's dictionaries and languages against the data directory's,
EMA weights present when asked for, weights that fit their own config) and the same cast to a
precision; the file reading itself is `nmtkit.checkpoints.load_checkpoint` (weights_only=True).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nmtkit.errors import UserError
from nmtkit.models.registry import ArchConfig
from nmtkit.models.transformer import Transformer

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_model(cfg: ArchConfig, src_dict, tgt_dict) -> Transformer:
    """A freshly initialised Transformer of `cfg` sized to the two dictionaries (the padding id is theirs)."""
    return Transformer(cfg, len(src_dict), len(tgt_dict), pad_idx=src_dict.pad)


@dataclass
class LoadedModels:
    models: list[torch.nn.Module]
    max_source_tokens: int  # tokens before </s> that every model accepts
    max_target_tokens: int  # generated tokens before </s> that every model can position


def load_models(
    paths: list[str], src_dict, tgt_dict, device: torch.device, dtype: torch.dtype, ema: bool = False,
    langs: tuple[str, str] | None = None,
) -> LoadedModels:
    """Build each checkpoint's Transformer, refusing dictionaries (or languages) that differ from the data dir's."""
    from nmtkit.checkpoints import check_same_dictionaries, load_checkpoint

    expected = {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256}
    if langs is not None:
        expected["src_lang"], expected["tgt_lang"] = langs
    models = []
    max_src = max_tgt = math.inf
    for p in paths:
        state = load_checkpoint(p)
        check_same_dictionaries(
            state, f"--path {p}", expected, "it cannot translate with this data directory's dictionaries"
        )
        cfg = ArchConfig.from_dict(state["arch_config"])
        model = build_model(cfg, src_dict, tgt_dict)
        weights = state["model"]
        if ema:
            if state.get("ema") is None:
                raise UserError(f"--ema: {p} holds no EMA weights (train with EMA, or drop --ema)")
            weights = state["ema"]
        try:
            model.load_state_dict(weights)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise UserError(f"--path {p}: weights do not fit its own architecture config: {first}") from None
        del state, weights
        model.eval().to(device=device, dtype=dtype)
        models.append(model)
        max_src = min(max_src, cfg.max_source_positions - 1)  # positions include </s>
        max_tgt = min(max_tgt, cfg.max_target_positions - 1)  # positions include <s>
    return LoadedModels(models, int(max_src), int(max_tgt))
