"""fp32 search outputs pinned to the ones of the code before the decoding-speed work.

Why: the decoding loop and the decoder's incremental step are optimised for speed; the other
search tests check exactness against brute force and a plain reference, but only this one
checks that the fp32 hypotheses (tokens, and scores to 1e-5) did not move at all, on real
Transformers of several shapes, beams 1/4/5, n-best lists, ensembles, both length-penalty
forms, the early-stopping rules, the per-step rules and seeded sampling; with torch's linear
layers and with the prepacked fp32 ones that decoding uses on CPU.

The models are small Transformers trained for a few seconds to reverse sequences, stored as
weights (tests/golden/search_models.pt, rounded to fp16 values to halve the file; they are
loaded as fp32) so that their outputs do not depend on the platform's training numerics; tests/golden/search_outputs.json holds what the code of commit 452d2b0 (the
last one before the speed work) produced. Regenerate only on purpose (a deliberate change of
results): `PYTHONPATH=. python tests/test_search_golden.py --regenerate`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).resolve().parent / "golden"
MODELS = GOLDEN / "search_models.pt"
OUTPUTS = GOLDEN / "search_outputs.json"
PAD, BOS, EOS = 0, 1, 2

# name -> (ArchConfig fields, vocabulary size, training steps, seed)
ARCHS = {
    "post": (dict(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4), 12, 120, 0),
    # pre-norm, learned positions, untied output projection, d_k != d_v
    "pre": (dict(encoder_layers=1, decoder_layers=2, d_model=32, d_ff=48, heads=2, d_k=8, d_v=16,
                 normalize_before=True, learned_pos=True, share_embeddings="none"), 12, 150, 1),
    # a vocabulary wide enough for the grouped top-k of the search (V // 8 >= 4 * beam)
    "wide": (dict(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4,
                  share_embeddings="decoder"), 300, 400, 2),
}

SOURCES = {
    "post": [[4, 5, 6, 7, 8], [9], [10, 11, 4, 4, 5, 6, 7, 8], [6, 6], [11, 10, 9, 8, 7, 6, 5, 4, 4, 11], [7, 4, 9]],
    "wide": [[40, 5, 260, 7, 8], [299], [10, 110, 4, 4, 5, 60, 7, 8, 150], [6, 6], [200, 201, 202, 13]],
}
SOURCES["pre"] = SOURCES["post"]

# (label, model names (several = an ensemble), search settings)
CASES = [
    ("greedy", ["post"], dict(beam=1)),
    ("beam4", ["post"], dict(beam=4)),
    ("beam4-nbest4", ["post"], dict(beam=4, nbest=4)),
    ("beam5-nbest2-fairseq", ["post"], dict(beam=5, nbest=2, lenpen=1.0, lenpen_form="fairseq")),
    ("beam4-early-beam", ["post"], dict(beam=4, nbest=2, early_stop="beam")),
    ("beam4-early-none", ["post"], dict(beam=4, early_stop="none", lenpen=0.0)),
    ("beam3-rules", ["post"], dict(beam=3, nbest=3, min_len=6, no_repeat_ngram_size=2, unk_penalty=0.5)),
    ("beam4-long", ["post"], dict(beam=4, nbest=2, min_len=12, max_len_a=2.0, max_len_b=3)),
    ("greedy-pre", ["pre"], dict(beam=1, min_len=3)),
    ("beam4-pre", ["pre"], dict(beam=4, nbest=4, lenpen=0.6, lenpen_form="fairseq")),
    ("greedy-wide", ["wide"], dict(beam=1)),
    ("beam4-wide", ["wide"], dict(beam=4, nbest=3)),
    ("beam5-wide-fairseq", ["wide"], dict(beam=5, nbest=5, lenpen=1.2, lenpen_form="fairseq", early_stop="beam")),
    ("ensemble-beam4", ["post", "pre"], dict(beam=4, nbest=2)),
    ("ensemble-greedy", ["post", "pre"], dict(beam=1)),
    ("ensemble-self", ["post", "post"], dict(beam=4, nbest=4)),
    ("sampling", ["post"], dict(beam=3, nbest=3, sampling=True, topk=4, seed=7)),
    ("sampling-topp", ["wide"], dict(beam=4, nbest=2, sampling=True, topp=0.9, temperature=1.5, seed=11)),
]


def _cfg(name: str):
    from nmtkit.models import ArchConfig

    fields, vocab, _, _ = ARCHS[name]
    return ArchConfig(dropout=0.0, max_source_positions=64, max_target_positions=64, **fields), vocab


def _train(name: str) -> dict:
    """A Transformer trained briefly to reverse sequences of the symbols 4..V-1 (half-trained on
    purpose: beams hold different histories and search has real choices)."""
    from nmtkit.models import Transformer

    _, _, steps, seed = ARCHS[name]
    cfg, vocab = _cfg(name)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    m = Transformer(cfg, vocab, vocab)
    opt = torch.optim.Adam(m.parameters(), lr=5e-3)
    B, L = 32, 10
    pos, rows = torch.arange(L), torch.arange(B)
    for _ in range(steps):
        lens = torch.randint(1, L + 1, (B,), generator=g)
        toks = torch.randint(4, vocab, (B, L), generator=g)
        real = pos < lens[:, None]
        rev = toks.gather(1, torch.where(real, lens[:, None] - 1 - pos, pos))
        src = torch.cat([torch.where(real, toks, PAD), torch.zeros(B, 1, dtype=torch.long)], 1)
        src[rows, lens] = EOS
        out = torch.cat([torch.where(real, rev, PAD), torch.zeros(B, 1, dtype=torch.long)], 1)
        out[rows, lens] = EOS
        inp = torch.cat([torch.full((B, 1), BOS), torch.where(real, rev, PAD)], 1)
        loss = torch.nn.functional.cross_entropy(m(src, inp).reshape(-1, vocab), out.reshape(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.state_dict()


def _half(state: dict) -> dict:
    """fp16 copies, tied matrices kept as one tensor (stored once)."""
    done: dict = {}
    return {k: done.setdefault(v.data_ptr(), v.half()) for k, v in state.items()}


def load_models() -> dict:
    from nmtkit.models import Transformer

    weights = torch.load(MODELS, weights_only=True)
    models = {}
    for name in ARCHS:
        cfg, vocab = _cfg(name)
        m = Transformer(cfg, vocab, vocab)
        m.load_state_dict({k: v.float() for k, v in weights[name].items()})
        models[name] = m.eval()
    return models


def src_batch(rows: list[list[int]]) -> torch.Tensor:
    S = max(len(r) for r in rows) + 1
    out = torch.full((len(rows), S), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r) + 1] = torch.tensor(list(r) + [EOS])
    return out


def run_case(models: dict, names: list[str], settings: dict) -> list[list[dict]]:
    from nmtkit.search.beam import SearchConfig, search

    torch.manual_seed(0)
    srcs = SOURCES[names[0]]
    ms = [models[n] for n in names]
    out = search(ms if len(ms) > 1 else ms[0], src_batch(srcs), SearchConfig(**settings))
    return [[{"tokens": h.tokens, "score": h.score, "positional_scores": h.positional_scores} for h in hyps]
            for hyps in out]


@pytest.fixture(scope="module", params=["torch", "packed"])
def models(request):
    """The models as built (torch's nn.Linear), and with the prepacked oneDNN fp32 linear layers
    that `nmtkit generate` and the Translator use on CPU (nmtkit.models.quantize)."""
    from nmtkit.models.quantize import convert_linears, packing_available

    torch.set_num_threads(1)
    ms = load_models()
    if request.param == "packed":
        if not packing_available():
            pytest.skip("this torch build has no oneDNN")
        for m in ms.values():
            convert_linears(m, "packed")
    return ms


@pytest.fixture(scope="module")
def golden():
    return json.loads(OUTPUTS.read_text(encoding="utf-8"))


@pytest.mark.parametrize("label,names,settings", CASES, ids=[c[0] for c in CASES])
def test_outputs_equal_the_pre_optimisation_ones(models, golden, label, names, settings):
    want = golden[label]
    got = run_case(models, names, settings)
    assert [[h["tokens"] for h in hyps] for hyps in got] == [[h["tokens"] for h in hyps] for hyps in want]
    for g_hyps, w_hyps in zip(got, want):
        for g, w in zip(g_hyps, w_hyps):
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
            assert g["positional_scores"] == pytest.approx(w["positional_scores"], abs=1e-5)


def test_golden_cases_are_not_trivial(golden):
    """Guard: the pinned outputs differ between settings and hold beams of distinct hypotheses,
    so agreeing with them means something."""
    assert golden["beam4"] != golden["greedy"]
    assert golden["beam5-nbest2-fairseq"] != golden["beam4-nbest4"]
    assert golden["ensemble-beam4"] != golden["beam4"]
    for label in ("beam4-nbest4", "beam4-pre", "beam4-wide"):
        assert any(len({tuple(h["tokens"]) for h in hyps}) > 1 for hyps in golden[label])
    assert any(len(h[0]["tokens"]) > 0 for h in golden["greedy-wide"])


if __name__ == "__main__":
    if "--regenerate" not in sys.argv:
        sys.exit("usage: PYTHONPATH=. python tests/test_search_golden.py --regenerate [--retrain]")
    torch.set_num_threads(1)
    GOLDEN.mkdir(exist_ok=True)
    if "--retrain" in sys.argv or not MODELS.exists():
        torch.save({name: _half(_train(name)) for name in ARCHS}, MODELS)
    ms = load_models()
    result = {label: run_case(ms, names, settings) for label, names, settings in CASES}
    OUTPUTS.write_text(json.dumps(result, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {OUTPUTS}")
