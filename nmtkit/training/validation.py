"""Validation during training: label-smoothed loss on the valid split, and optionally BLEU.

Why BLEU here and not only loss: the paper selects models by dev BLEU, and loss and BLEU can
disagree late in training. BLEU is sacreBLEU on detokenized text: hypotheses are decoded
(greedy, or beam with --eval-bleu-beam) with nmtkit.generation, mapped back to text with the
data dir's dictionary and subword model; references are the valid targets decoded the same way
from the shards (the data dir keeps no raw text), so an <unk> in a reference stays "<unk>". The
figure is a validation signal; test scores come from `nmtkit generate | nmtkit score`.

In DDP each rank evaluates every world_size-th batch and the sums (or hypotheses) are gathered,
so the result is the same as on one process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from nmtkit.data.batching import TokenDataset, collate, filter_by_size, make_batches
from nmtkit.training import distributed as D
from nmtkit.training.loss import bits_per_token, fused_label_smoothed_cross_entropy, perplexity


@dataclass
class ValidResult:
    loss: float  # bits per target token, label-smoothed
    nll_loss: float  # bits per target token, no smoothing
    ppl: float
    ntokens: int
    bleu: float | None = None
    skipped: int = 0


class Validator:
    """Holds the valid split's fixed batches; evaluates a model on them."""

    def __init__(
        self,
        src_ds: TokenDataset,
        tgt_ds: TokenDataset,
        *,
        max_tokens: int | None,
        max_sentences: int | None,
        max_source_positions: int,
        max_target_positions: int,
        pad_multiple: int,
        info: D.DistInfo,
    ):
        self.src_ds, self.tgt_ds, self.pad_multiple, self.info = src_ds, tgt_ds, pad_multiple, info
        f = filter_by_size(src_ds.sizes, tgt_ds.sizes, max_source_positions=max_source_positions,
                           max_target_positions=max_target_positions, max_tokens=max_tokens,
                           pad_multiple=pad_multiple)
        self.filter = f
        batches = make_batches(f.indices, src_ds.sizes, tgt_ds.sizes, max_tokens=max_tokens,
                               max_sentences=max_sentences, pad_multiple=pad_multiple, shuffle=False)
        # every batch is used (no equal-count requirement: no gradient all-reduce here)
        self.batches = batches[info.rank :: info.world_size]
        self.n_pairs = len(f.indices)

    @torch.no_grad()
    def loss(self, model: torch.nn.Module, device: torch.device, autocast: Callable, epsilon: float) -> ValidResult:
        was_training = model.training
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, ntokens
        weight, bias = model.output_projection()  # (V, D), (V,) or None
        for idx in self.batches:
            b = collate(self.src_ds, self.tgt_ds, idx, self.pad_multiple).to(device)
            with autocast():  # no (B, T, V) logits: the loss projects a chunk of positions at a time
                hidden = model(b.src_tokens, b.prev_output_tokens, features_only=True)  # (B, T, D)
                loss, nll, n = fused_label_smoothed_cross_entropy(hidden, weight, b.target, epsilon, bias=bias)
            sums[0] += loss.double()
            sums[1] += nll.double()
            sums[2] += n
        D.all_reduce_sum(sums, self.info)
        model.train(was_training)
        loss_sum, nll_sum, ntok = sums.tolist()
        nll_bits = bits_per_token(nll_sum, int(ntok))
        return ValidResult(bits_per_token(loss_sum, int(ntok)), nll_bits, perplexity(nll_bits), int(ntok),
                           skipped=self.filter.skipped)

    @torch.no_grad()
    def bleu(
        self,
        model: torch.nn.Module,
        device: torch.device,
        autocast: Callable,
        to_text: Callable[[list[int]], str],
        *,
        beam: int,
        lenpen: float,
        max_len_a: float,
        max_len_b: int,
        max_target_positions: int,
        decoding: str = "paper",
    ) -> float:
        """Corpus sacreBLEU (13a, cased) of decoded valid sources against the valid targets;
        `decoding`: the length penalty and stopping rule (search.config.DECODING_PRESETS)."""
        import sacrebleu

        from nmtkit.search.beam import search
        from nmtkit.search.config import DECODING_PRESETS, SearchConfig

        was_training = model.training
        model.eval()
        scfg = SearchConfig(beam=beam, lenpen=lenpen, max_len_a=max_len_a, max_len_b=max_len_b,
                            max_len_cap=max_target_positions - 1, **DECODING_PRESETS[decoding])
        local: list[tuple[int, str, str]] = []
        for idx in self.batches:
            b = collate(self.src_ds, self.tgt_ds, idx, self.pad_multiple).to(device)
            with autocast():
                hyps = search(model, b.src_tokens, scfg)
            for k, i in enumerate(idx.tolist()):
                ref_ids = [int(x) for x in np.asarray(self.tgt_ds[i])]
                local.append((i, to_text(hyps[k][0].tokens), to_text(ref_ids)))
        model.train(was_training)
        gathered = [x for part in D.all_gather_objects(local, self.info) for x in part]
        gathered.sort(key=lambda t: t[0])
        if not gathered:
            return math.nan
        hyps_text = [h for _, h, _ in gathered]
        refs_text = [r for _, _, r in gathered]
        return float(sacrebleu.corpus_bleu(hyps_text, [refs_text]).score)
