"""Lexical shortlists in the ONNX export (docs/export.md): `nmtkit export --shortlist` writes a
decoder whose output layer's weight is an optional input, fed per batch with the candidates'
columns; the numpy search runs over those candidates.

The references: the numpy search over a model of the candidates equals the full search with every
other logit (and <pad>'s: `nmtkit.search.vocab`) removed before the softmax (pure numpy); ONNX
Runtime over the candidates equals nmtkit's own torch search over the same candidates; an export
without a shortlist keeps today's graph. Skipped when onnxruntime is not installed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nmtkit.errors import UserError
from nmtkit.search import arrays
from nmtkit.search.config import SearchConfig
from nmtkit.search.vocab import RestrictedVocab

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install -e '.[onnx]' in the nmtkit checkout")
pytest.importorskip("onnx", reason="onnx is not installed: pip install -e '.[onnx]' in the nmtkit checkout")

from tests.test_onnx import POST, PRE, tiny, wm  # noqa: E402,F401 - wm: the exported word-mapping model

V = 40
CANDIDATES = np.array([0, 1, 2, 3, 5, 6, 9, 12, 14, 17, 20, 21, 25, 30, 33, 38], dtype=np.int64)
SRCS = [[5, 9, 12, 7], [20, 21], [33, 8, 8, 14, 30, 6], [11], [4, 4, 4, 4, 4]]
CONFIGS = {  # --min-len: outputs of a few tokens from random models
    "beam": SearchConfig(beam=4, max_len_a=1.0, max_len_b=4, min_len=3),
    "greedy": SearchConfig(beam=1, max_len_a=1.0, max_len_b=4, min_len=3),
    "banned-nbest": SearchConfig(beam=4, nbest=3, max_len_a=1.0, max_len_b=4, banned=(6, 9, 39), min_len=3),
    "fairseq-rules": SearchConfig(beam=3, max_len_b=10, lenpen=1.0, lenpen_form="fairseq", early_stop="beam",
                                  no_repeat_ngram_size=2, unk_penalty=1.0, min_len=2),
}


def src_array(rows) -> np.ndarray:
    """(B, S) int64: each row `ids + [</s>]`, right-padded with <pad>."""
    out = np.zeros((len(rows), max(map(len, rows)) + 1), np.int64)
    for r, ids in enumerate(rows):
        out[r, : len(ids)], out[r, len(ids)] = ids, 2
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(np.float32)


def without_pad(x: np.ndarray) -> np.ndarray:
    """Logits (N, C) with <pad>'s (column 0) -inf: a shortlist's distribution (`nmtkit.search.vocab`)."""
    x = x.astype(np.float64)
    x[:, 0] = -np.inf
    return x


def assert_same(got, want, tol):
    assert len(got) == len(want)
    for g_hyps, w_hyps in zip(got, want):
        assert [h.tokens for h in g_hyps] == [h.tokens for h in w_hyps]
        assert [h.score for h in g_hyps] == pytest.approx([h.score for h in w_hyps], abs=tol)
        for g, w in zip(g_hyps, w_hyps):
            assert g.positional_scores == pytest.approx(w.positional_scores, abs=tol)


# ---------------------------------------------------------------- the numpy search, over a toy model


class HashToy:
    """tests/test_search.py's hash-table model over numpy: the logits of a step are a fixed random
    row picked by a hash of the source and the history (dictionary ids). `ids` (C,): the model
    over those candidates (positions in, log-softmax over C out, <pad> -inf); `masked`: the full
    vocabulary with every other logit -inf before the softmax (the reference); `pad`: <pad>'s
    logit left as drawn (else -inf, as a trained model nearly has it)."""

    M = 10007

    def __init__(self, vocab: int, seed: int, ids: np.ndarray | None = None, masked: bool = False,
                 pad: bool = False):
        self.table = np.random.default_rng(seed).standard_normal((self.M, vocab)).astype(np.float32) * 3
        if not pad:
            self.table[:, 0] = -np.inf
        self.ids, self.masked = ids, masked

    def encode(self, src: np.ndarray) -> np.ndarray:
        return (src * np.arange(1, src.shape[1] + 1) * 7919).sum(1) % self.M  # (B,)

    def new_cache(self):
        return None

    def step(self, prev: np.ndarray, enc: np.ndarray, cache):
        if self.ids is not None and not self.masked:
            prev = self.ids[prev]  # positions -> ids
        h = ((enc if cache is None else cache) * 131 + prev * 17 + 3) % self.M  # (N,)
        logits = self.table[h]  # (N, V)
        if self.ids is not None and self.masked:
            drop = np.ones(logits.shape[1], bool)
            drop[self.ids[1:]] = False
            logits = np.where(drop, -np.inf, logits)
        elif self.ids is not None:
            logits = without_pad(logits[:, self.ids])  # (N, C)
        return log_softmax(logits), h

    def select_enc(self, enc: np.ndarray, order: np.ndarray) -> np.ndarray:
        return enc[order]

    def select_cache(self, cache: np.ndarray, order: np.ndarray) -> np.ndarray:
        return cache[order]


@pytest.mark.parametrize("name", CONFIGS)
def test_every_id_a_candidate_is_the_full_numpy_search(name):
    """On a model that gives <pad> nothing (which a shortlist takes from it)."""
    cfg = CONFIGS[name]
    everything = np.arange(V)
    got = arrays.search(HashToy(V, 2, everything), src_array(SRCS), cfg, RestrictedVocab(everything))
    assert_same(got, arrays.search(HashToy(V, 2), src_array(SRCS), cfg), 1e-5)


@pytest.mark.parametrize("name", [*CONFIGS, "sampling"])
def test_numpy_search_over_candidates_equals_the_masked_full_search(name):
    """Positions in the search, ids in the results: banned ids mapped to positions (6 and 9 are
    candidates, 39 is not), and the same samples for the same seed (the same distributions)."""
    cfg = CONFIGS.get(name) or SearchConfig(sampling=True, beam=3, nbest=3, max_len_b=8, seed=5, topk=5)
    got = arrays.search(HashToy(V, 3, CANDIDATES, pad=True), src_array(SRCS), cfg, RestrictedVocab(CANDIDATES))
    want = arrays.search(HashToy(V, 3, CANDIDATES, masked=True, pad=True), src_array(SRCS), cfg)
    assert_same(got, want, 1e-5)
    tokens = [t for hyps in got for h in hyps for t in h.tokens]
    assert len(set(tokens)) >= 6 and set(tokens) <= set(CANDIDATES.tolist()) - set(cfg.banned)
    full = arrays.search(HashToy(V, 3, pad=True), src_array(SRCS), cfg)
    assert [h.tokens for hs in got for h in hs] != [h.tokens for hs in full for h in hs]  # the shortlist matters


# ------------------------------------------------------------------------------- the ONNX graphs


def export_graphs(model, folder, quantization="float32", shortlist=True):
    """`nmtkit export --format onnx [--shortlist]`'s graphs of `model` in `folder`: the loaded
    graphs, the output layer's weight (D, V) as the engine reads it, and the export's record."""
    from nmtkit.backends.onnx import convert
    from nmtkit.backends.onnx.engine import Graphs, read_output_weight

    folder.mkdir()
    tokens = [str(i) for i in range(model.tgt_vocab_size)]
    record = convert.write(convert.prepare(model, tokens, tokens), folder, quantization, shortlist=shortlist)
    weight = read_output_weight(folder) if shortlist else None
    return Graphs.load(folder, threads=1), weight, record


@pytest.fixture(scope="module")
def clear(tmp_path_factory):
    """A pre-norm model with clear margins, its shortlist export's folder, graphs, output weight
    and record."""
    torch.set_num_threads(1)
    model = tiny(PRE, V, seed=3)
    folder = tmp_path_factory.mktemp("sl") / "m"
    return (model, *export_graphs(model, folder), folder)


@pytest.mark.parametrize("name", CONFIGS)
def test_onnx_search_over_candidates_equals_torch_search_over_them(clear, name):
    from nmtkit.search.beam import search

    model, graphs, weight, record, _ = clear
    assert record["check"]["shortlist_max_logprob_diff"] < 1e-4
    cfg, vocab = CONFIGS[name], RestrictedVocab(CANDIDATES)
    got = arrays.search(graphs.restricted(vocab.ids, weight), src_array(SRCS), cfg, vocab)
    with torch.inference_mode():
        want = search(model, torch.from_numpy(src_array(SRCS)), cfg, vocab=vocab)
    assert_same(got, want, 1e-3)
    tokens = [t for hyps in got for h in hyps for t in h.tokens]
    assert len(set(tokens)) >= 5 and set(tokens) <= set(CANDIDATES.tolist()) - set(cfg.banned)
    full = arrays.search(graphs, src_array(SRCS), cfg)
    assert [h.tokens for hs in got for h in hs] != [h.tokens for hs in full for h in hs]  # the shortlist matters


def test_a_restricted_step_is_the_full_steps_columns_renormalised(clear):
    _, graphs, weight, _, _ = clear
    ids = CANDIDATES
    enc = graphs.select_enc(graphs.encode(src_array(SRCS)), np.repeat(np.arange(len(SRCS)), 2))
    prev = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], np.int64)  # <s>, then candidates
    restricted, cache = graphs.restricted(ids, weight), None
    for t in range(4):
        lp, _ = restricted.step(np.searchsorted(ids, prev), enc, cache)  # (N, C)
        full, cache = graphs.step(prev, enc, cache)  # (N, V)
        assert lp.shape == (10, len(ids)) and full.shape == (10, V)
        np.testing.assert_allclose(lp, log_softmax(without_pad(full[:, ids])), atol=1e-5)
        prev = ids[4 + (np.arange(10) * 3 + t) % (len(ids) - 4)]


def test_an_export_without_a_shortlist_keeps_its_graph(clear, tmp_path):
    """No weight input and the output layer a MatMul with a constant weight (which ONNX Runtime
    pre-packs), stepping as the shortlist graph does when nothing is fed."""
    import onnx

    model, sl_graphs, _, _, sl_folder = clear
    graphs, _, record = export_graphs(model, tmp_path / "plain", shortlist=False)
    assert "shortlist_max_logprob_diff" not in record["check"]
    dec, sl_dec = (onnx.load(str(f / "decoder.onnx")).graph for f in (tmp_path / "plain", sl_folder))
    assert [i.name for i in dec.input] + ["out_proj_weight"] == [i.name for i in sl_dec.input]
    assert [o.name for o in sl_graphs.decoder.get_overridable_initializers()] == ["out_proj_weight"]
    assert graphs.decoder.get_overridable_initializers() == []
    assert graphs.decoder.get_outputs()[0].shape == ["rows", V]
    initializers = {i.name for i in dec.initializer}
    assert "out_proj" in initializers and "out_proj_weight" not in initializers
    assert any(n.op_type == "MatMul" and n.input[1] == "out_proj" for n in dec.node)
    for cfg in CONFIGS.values():
        assert_same(arrays.search(graphs, src_array(SRCS), cfg), arrays.search(sl_graphs, src_array(SRCS), cfg), 1e-5)


def test_the_check_refuses_a_restriction_that_differs(clear, tmp_path, monkeypatch):
    """The export's own check is real: columns that are not the graph's are refused in one line."""
    from nmtkit.backends.onnx import convert, engine

    model = clear[0]
    real = engine.read_output_weight
    monkeypatch.setattr(convert, "read_output_weight", lambda folder: real(folder) * np.float32(1.01))
    (tmp_path / "m").mkdir()
    tokens = [str(i) for i in range(V)]
    with pytest.raises(UserError, match=r"^the ONNX decoder in .* does not restrict its output layer correctly: "
                                        r"log-probabilities over a shortlist differ from the renormalised full ones"):
        convert.write(convert.prepare(model, tokens, tokens), tmp_path / "m", "float32", shortlist=True)


def test_int8_with_a_shortlist_keeps_its_output_layer_float(tmp_path):
    """int8 leaves the fed output layer float32: every id a candidate gives the int8 export
    without a shortlist within the int8 tolerance, and its own unfed graph within float32
    rounding."""
    import onnx

    from nmtkit.backends.onnx.convert import INT8_TOLERANCE

    model = tiny(POST, V, seed=0, peak=1.0)
    sl, weight, record = export_graphs(model, tmp_path / "sl", "int8")
    plain, _, _ = export_graphs(model, tmp_path / "plain", "int8", shortlist=False)
    assert record["check"]["int8_shortlist_max_logprob_diff"] < 1e-4
    ops = [n.op_type for n in onnx.load(str(tmp_path / "sl" / "decoder.onnx")).graph.node]
    assert ops.count("MatMulInteger") == 6 * POST.decoder_layers  # the output layer is not among them
    everything = np.arange(V)
    every = sl.restricted(everything, weight)  # <pad> aside: the full distribution
    enc_a, enc_b, enc_c = (g.encode(src_array(SRCS)) for g in (every, plain, sl))
    caches, prev = [None, None, None], np.ones(len(SRCS), np.int64)
    for t in range(5):
        (a, caches[0]), (b, caches[1]), (c, caches[2]) = (
            g.step(prev, e, k) for g, e, k in zip((every, plain, sl), (enc_a, enc_b, enc_c), caches))
        top = b.argmax(1)[:, None]
        assert np.abs(np.take_along_axis(a, top, 1) - np.take_along_axis(b, top, 1)).max() <= INT8_TOLERANCE
        np.testing.assert_allclose(a, log_softmax(without_pad(c)), atol=1e-5)
        prev = b.argmax(1)
    cfg = CONFIGS["beam"]
    got = arrays.search(every, src_array(SRCS), cfg, RestrictedVocab(everything))
    assert [h.tokens for hs in got for h in hs] == [h.tokens for hs in arrays.search(sl, src_array(SRCS), cfg)
                                                    for h in hs]


def test_loading_a_shortlist_export_prints_nothing(clear, capfd):
    """ONNX Runtime warns (on the process's stderr) that a fed initializer is not constant-folded;
    the engine's sessions keep that to themselves."""
    from nmtkit.backends.onnx.engine import Graphs

    capfd.readouterr()
    Graphs.load(clear[-1], threads=1)
    assert capfd.readouterr().err == ""


# ----------------------------------------------------------------------------- end to end


def write_shortlist(path, rules: dict[str, list[str]]):
    from nmtkit.data.shortlist import write

    write(path, rules)
    return path


RULES = {"": ["W1"], "w0": ["W0", "W5"], "w2": ["W2"], "w3": ["W3", "W7"], "w5": ["W5"], "w7": ["W7", "W8"]}
OTHER_RULES = {**RULES, "w1": ["W1", "W9"], "w4": ["W4"]}


@pytest.fixture(scope="module")
def wm_shortlist(wm):
    """The word-mapping model exported with a shortlist (`nmtkit export --shortlist`)."""
    from nmtkit.cli import main

    sl = write_shortlist(wm["root"] / "shortlist.txt", RULES)
    out = wm["root"] / "m-onnx-sl"
    with pytest.raises(SystemExit) as e:
        main(["export", str(wm["data"]), "--path", str(wm["ckpt"]), "--format", "onnx", "--output", str(out),
              "--shortlist", str(sl)])
    assert e.value.code == 0
    return {**wm, "shortlist": sl, "sl_out": out}


def test_generate_with_a_shortlist_on_the_export_equals_native(wm_shortlist, tmp_path):
    """Translator.load(export, shortlist=...) gives native's hypotheses over the same candidates,
    for the export's own shortlist and for another file (which the ONNX engine accepts)."""
    from nmtkit import Translator

    w = wm_shortlist
    info = json.loads((w["sl_out"] / "nmtkit.json").read_text())
    assert info["shortlist"]["file"] == "shortlist.txt"
    assert (w["sl_out"] / "shortlist.txt").read_bytes() == w["shortlist"].read_bytes()
    other = write_shortlist(tmp_path / "other.txt", OTHER_RULES)
    lines = [x for x in w["inputs"].read_text(encoding="utf-8").splitlines() if x.strip()]
    settings = dict(threads=1, min_len=2, nbest=2)
    for path, rules in ((w["shortlist"], RULES), (other, OTHER_RULES)):
        mine = Translator.load(w["sl_out"], shortlist=path, **settings).translate_nbest(lines)
        native = Translator.load(w["ckpt"], w["data"], shortlist=path, **settings).translate_nbest(lines)
        for x, y in zip(mine, native):
            assert [t.hypothesis.tokens for t in x] == [t.hypothesis.tokens for t in y]
            assert [t.score for t in x] == pytest.approx([t.score for t in y], abs=1e-3)
        words = {word for row in mine for t in row for word in t.text.split()}
        assert len(words) >= 3 and words <= {p for targets in rules.values() for p in targets} | {"<unk>"}
    full = Translator.load(w["sl_out"], **settings).translate_nbest(lines)
    assert [t.text for row in full for t in row] == [
        t.text for row in Translator.load(w["out"], **settings).translate_nbest(lines) for t in row]


def test_an_export_without_a_shortlist_refuses_one(wm_shortlist):
    from nmtkit import Translator

    with pytest.raises(UserError, match=r"^--shortlist: this ONNX export's decoder cannot restrict its output layer; "
                                        r"export again with nmtkit export --format onnx --shortlist .*shortlist\.txt$"):
        Translator.load(wm_shortlist["out"], shortlist=wm_shortlist["shortlist"], threads=1)


def test_without_onnx_a_shortlist_says_what_to_install(wm_shortlist, monkeypatch):
    import sys

    from nmtkit import Translator

    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(UserError, match=r"^--shortlist: reading the ONNX export's output layer needs the onnx "
                                        r"package: pip install"):
        Translator.load(wm_shortlist["sl_out"], shortlist=wm_shortlist["shortlist"], threads=1)
