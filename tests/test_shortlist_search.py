"""The search over a shortlist's candidates: equal to the full search with every other logit
removed before the softmax, equal to today's search when every id is a candidate, and the
output layer's restricted rows equal to the full layer's columns; the torch engine's batch of
candidates (the file read with the model's own dictionaries, the terms' ids added)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nmtkit.models.quantize import Int8Linear, PackedLinear, convert_linears, packing_available
from nmtkit.search.beam import SearchConfig, search
from nmtkit.search.config import Avoided, Terms
from nmtkit.search.vocab import RestrictedVocab, term_ids
from tests.test_search import src_batch, tiny_transformer

torch.set_num_threads(1)
V = 40
SRCS = [[5, 9, 12, 7], [20, 21], [33, 8, 8, 14, 30, 6], [11]]
CANDIDATES = np.array([0, 1, 2, 3, 5, 6, 9, 12, 14, 17, 20, 21, 25, 30, 33, 38], dtype=np.int64)


class Masked:
    """The reference: a model whose logits outside `ids`, and <pad>'s, are -inf before the search's softmax."""

    def __init__(self, model, ids: np.ndarray):
        self.model = model
        self.drop = torch.ones(V, dtype=torch.bool)
        self.drop[torch.from_numpy(ids)] = False
        self.drop[0] = True

    def encode(self, src):
        return self.model.encode(src)

    def new_cache(self):
        return self.model.new_cache()

    def decode_step(self, prev, enc, cache):
        return self.model.decode_step(prev, enc, cache).masked_fill(self.drop, float("-inf"))


@pytest.fixture(scope="module")
def model():
    return tiny_transformer(vocab=V, seed=11, peak=3.0)


def assert_same(got, want, tol=1e-4):
    assert len(got) == len(want)
    for g_hyps, w_hyps in zip(got, want):
        assert [h.tokens for h in g_hyps] == [h.tokens for h in w_hyps]
        for g, w in zip(g_hyps, w_hyps):
            assert g.score == pytest.approx(w.score, abs=tol)
            assert g.positional_scores == pytest.approx(w.positional_scores, abs=tol)


CONFIGS = [
    SearchConfig(beam=1, max_len_b=12),
    SearchConfig(beam=4, max_len_b=12),
    SearchConfig(beam=5, nbest=3, max_len_b=10, lenpen=1.0, lenpen_form="fairseq", early_stop="beam"),
    SearchConfig(beam=4, max_len_b=12, banned=(6, 9, 39), no_repeat_ngram_size=2, min_len=3, unk_penalty=1.0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["greedy", "beam", "nbest-fairseq", "rules"])
def test_restricted_search_equals_the_masked_full_search(model, cfg):
    vocab = RestrictedVocab(CANDIDATES)
    got = search(model, src_batch(SRCS), cfg, vocab=vocab)
    want = search(Masked(model, CANDIDATES), src_batch(SRCS), cfg)
    assert_same(got, want)
    assert all(set(h.tokens) <= set(CANDIDATES.tolist()) for hyps in got for h in hyps)
    assert any(h.tokens for hyps in got for h in hyps)


def test_every_id_a_candidate_is_todays_search_without_pad(model):
    everything = RestrictedVocab(np.arange(V))
    for cfg in CONFIGS:
        want = search(Masked(model, np.arange(V)), src_batch(SRCS), cfg)
        assert_same(search(model, src_batch(SRCS), cfg, vocab=everything), want, 1e-5)


def test_the_ensemble_over_candidates(model):
    other = tiny_transformer(vocab=V, seed=12, peak=3.0)
    cfg = SearchConfig(beam=3, max_len_b=10)
    got = search([model, other], src_batch(SRCS), cfg, vocab=RestrictedVocab(CANDIDATES))
    want = search([Masked(model, CANDIDATES), Masked(other, CANDIDATES)], src_batch(SRCS), cfg)
    assert_same(got, want)


def test_terms_are_searched_in_positions(model):
    terms = [Terms(prefix=(25,), include=((38, 17),), avoid=(Avoided.sequence((30,)), Avoided.sequence((7, 5)))),
             None, Terms(include=((21,),)), None]
    extra = term_ids(terms)
    assert sorted(extra) == [17, 21, 25, 38]
    cfg = SearchConfig(beam=4, max_len_b=12)
    got = search(model, src_batch(SRCS), cfg, terms=terms, vocab=RestrictedVocab(CANDIDATES))
    want = search(Masked(model, CANDIDATES), src_batch(SRCS), cfg, terms=terms)
    assert_same(got, want)
    first = got[0][0].tokens
    assert first[0] == 25 and 30 not in first
    assert any(first[i:i + 2] == [38, 17] for i in range(len(first) - 1))
    assert 21 in got[2][0].tokens


def pre_norm_transformer(seed: int, peak: float = 3.0):
    """tiny_transformer's model with pre-norm layers, so with a final layer norm in the decoder."""
    from nmtkit.models import ArchConfig, Transformer

    torch.manual_seed(seed)
    cfg = ArchConfig(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0,
                     normalize_before=True, max_source_positions=64, max_target_positions=64)
    m = Transformer(cfg, V, V).eval()
    with torch.no_grad():
        m.tgt_embed.weight.mul_(peak)
    return m


def test_a_pre_norm_model_over_candidates():
    """The restricted output layer reads the decoder's final layer norm, as the full one does."""
    pre = pre_norm_transformer(seed=7)
    assert pre.decoder_norm is not None
    for cfg in CONFIGS[:2]:
        got = search(pre, src_batch(SRCS), cfg, vocab=RestrictedVocab(CANDIDATES))
        assert_same(got, search(Masked(pre, CANDIDATES), src_batch(SRCS), cfg))
        assert any(h.tokens for hyps in got for h in hyps)


def test_restricted_vocab_maps_ids_and_refuses_bad_candidates():
    v = RestrictedVocab(CANDIDATES)
    assert v.positions([0, 3, 5, 38, 4, 39]) == [0, 3, 4, 15, None, None]
    cfg = v.config(SearchConfig(banned=(4, 9, 38)))
    assert cfg.banned == (6, 15)
    t = v.terms(Terms(prefix=(5,), include=((9, 12),), avoid=(Avoided(2, ((0, 1, 6), (0, 2, 7), (1, 2, 12))),)))
    assert t.prefix == (4,) and t.include == ((6, 7),)
    assert t.avoid[0].edges == ((0, 1, 5), (1, 2, 7))  # the edge through 7 (not a candidate) is gone
    with pytest.raises(ValueError):
        v.terms(Terms(prefix=(4,)))
    for bad in ([0, 1, 2], [0, 1, 2, 3, 9, 5], [0, 1, 2, 4, 5], [0, 1, 2, 3, 5, 5]):
        with pytest.raises(ValueError):
            RestrictedVocab(np.array(bad))


def _linear(bias: bool) -> torch.nn.Linear:
    torch.manual_seed(4)
    lin = torch.nn.Linear(24, V, bias=bias)
    with torch.no_grad():
        lin.weight.mul_(3)
    return lin


@pytest.mark.parametrize("bias", [True, False])
def test_int8_rows_equal_the_full_layers_columns_exactly(bias):
    full = Int8Linear(_linear(bias).weight, _linear(bias).bias)
    ids = torch.from_numpy(CANDIDATES)
    x = torch.randn(7, 24)
    assert torch.equal(full.rows(ids)(x), full(x)[:, ids])


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN fp32 linear ops")
def test_packed_rows_equal_the_full_layers_columns():
    lin = _linear(True)
    ids = torch.from_numpy(CANDIDATES)
    x = torch.randn(20, 24)
    packed = PackedLinear(lin.weight, lin.bias, keep_source=True)
    torch.testing.assert_close(packed.rows(ids)(x), lin(x)[:, ids], rtol=1e-5, atol=1e-5)
    # a count of rows above 16 is packed with zero rows up to its bucket (one oneDNN kernel per
    # bucket, not per count): the real columns only come out
    more = torch.arange(2, 23)  # 21 rows -> a bucket of 24
    got = packed.rows(more)(x)
    assert got.shape == (20, 21)
    torch.testing.assert_close(got, lin(x)[:, more], rtol=1e-5, atol=1e-5)
    int8 = Int8Linear(lin.weight, lin.bias, emulate=True)
    assert torch.equal(int8.rows(more)(x), int8(x)[:, more])
    with pytest.raises(ValueError):
        PackedLinear(lin.weight, lin.bias).rows(ids)


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN fp32 linear ops")
def test_only_the_output_projection_keeps_its_fp32_matrix():
    """The attention layers' own `out_proj` are packed without their fp32 matrix (only the model's
    output projection needs it, for `rows`); tied, that matrix is the target embedding's, no copy."""
    m = tiny_transformer(vocab=V, seed=5)
    convert_linears(m, "packed")
    kept = [name for name, module in m.named_modules() if getattr(module, "source", None) is not None]
    assert kept == ["out_proj"]
    assert m.out_proj.source.data_ptr() == m.tgt_embed.weight.data_ptr()


@pytest.mark.parametrize("kind", [None, "int8", "packed"])
def test_restricted_output_of_each_kernel(kind):
    if kind == "packed" and not packing_available():
        pytest.skip("this torch build has no oneDNN fp32 linear ops")
    m = tiny_transformer(vocab=V, seed=5)
    if kind is not None:
        convert_linears(m, kind)
    ids = torch.from_numpy(CANDIDATES)
    h = torch.randn(3, 2, 32)
    torch.testing.assert_close(m.restricted_output(ids)(h), m.output_logits(h)[..., ids], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the torch engine: a model with separate dictionaries, through the Translator
# ---------------------------------------------------------------------------------------------

DE = "der Hund Katze Haus läuft springt rot blau klein Kind".split()
EN = "the dog cat house runs jumps red blue small child".split()


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    """(data directory, checkpoint): a word-for-word corpus preprocessed with separate source and
    target dictionaries (no word in both) and a random model whose outputs are a few tokens."""
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.data.preprocess import PreprocessConfig, preprocess
    from nmtkit.models import ArchConfig, Transformer

    root = tmp_path_factory.mktemp("separate")
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, len(DE), rng.integers(1, 6)) for _ in range(100)]
    for lang, words in (("de", DE), ("en", EN)):
        (root / f"train.{lang}").write_text("".join(" ".join(words[i] for i in r) + "\n" for r in rows),
                                            encoding="utf-8")
    data = root / "data"
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(root / "train"), destdir=str(data),
                                bpe="none"))
    src_dict, tgt_dict = load_dictionaries(data)
    assert set(DE).isdisjoint(tgt_dict.symbols) and set(EN).isdisjoint(src_dict.symbols)
    torch.manual_seed(0)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, heads=4, share_embeddings="decoder",
                     max_source_positions=32, max_target_positions=32)
    model = Transformer(cfg, len(src_dict), len(tgt_dict))
    with torch.no_grad():
        model.tgt_embed.weight.mul_(2.0)
    ckpt = root / "model.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": model.state_dict(),
                     "dictionaries": {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256,
                                      "src_size": len(src_dict), "tgt_size": len(tgt_dict),
                                      "src_lang": "de", "tgt_lang": "en"}}, ckpt)
    return data, ckpt


def load_translator(separate, tmp_path, rules: dict[str, list[str]], **settings):
    from nmtkit import Translator
    from nmtkit.data.shortlist import write

    data, ckpt = separate
    write(tmp_path / "shortlist.txt", rules)
    return Translator.load(ckpt, data, shortlist=tmp_path / "shortlist.txt", threads=1, warn=lambda msg: None,
                           **settings)


def test_the_translator_reads_a_shortlist_with_the_models_dictionaries(separate, tmp_path):
    """Keys are source pieces and targets target pieces: each sentence's outputs use only the
    words the file lists for its words (and the always-list)."""
    rules = {"": ["the"], "Hund": ["dog"], "Katze": ["cat", "small"], "rot": ["red"]}
    tr = load_translator(separate, tmp_path, rules, min_len=2, max_len_b=6, nbest=2)
    item, = tr.encode(["der Hund"])
    assert {tr.tgt_dict[i] for i in tr.engine.shortlist.candidates([item.ids])} == {
        "<pad>", "<s>", "</s>", "<unk>", "the", "dog"}
    seen = set()
    for text in ["der Hund", "rot Katze springt", "Kind läuft"]:
        allowed = {"<unk>", *rules[""], *(t for w in text.split() for t in rules.get(w, []))}
        words = {w for t in tr.translate_nbest([text])[0] for w in t.text.split()}
        assert words and words <= allowed, (text, words)
        seen |= words
    assert len(seen - {"<unk>"}) >= 2


def test_the_engine_adds_the_terms_ids_to_the_candidates(separate, tmp_path):
    """Constraints and a prefix whose words no rule lists for the batch can be produced all the
    same (`Shortlist.candidates(extra=...)`); nothing else outside the rules is."""
    tr = load_translator(separate, tmp_path, {"": ["the"], "Hund": ["dog"]}, beam=4, max_len_b=8)
    out = tr.translate(["der Hund läuft", "Kind"], constraints=[["blue house"], None], prefix=[None, "red child"])
    assert "blue house" in out[0] and out[1].startswith("red child"), out
    assert {w for o in out for w in o.split()} <= {"the", "dog", "blue", "house", "red", "child", "<unk>"}
