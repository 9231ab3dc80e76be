"""A multilingual model in use: the target's tag before each source, never in an output, the
direction asked for in `generate`, `serve`, `attention` and the `Translator`, one line for a
language the model lacks, and the exports translating every direction as native does.

The model is a tiny random Transformer over a real multilingual data directory (built by
`nmtkit preprocess --pairs` from synthetic line-parallel text), with the language tags' output
rows made the most likely tokens, so that a search which did not ban them would output them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from nmtkit.data.languages import tag_token
from nmtkit.errors import UserError

LANGS = ("de", "en", "fr")
PAIRS = [("de", "en"), ("en", "de"), ("fr", "en"), ("en", "fr")]
WORDS = 30
TEST_LINES = 6


def _lines(rng: random.Random, n: int) -> dict[str, list[str]]:
    """Line-parallel text: word K is dK, eK, fK in de, en, fr."""
    out: dict[str, list[str]] = {lang: [] for lang in LANGS}
    for _ in range(n):
        idx = [rng.randrange(WORDS) for _ in range(rng.randint(2, 7))]
        for lang in LANGS:
            out[lang].append(" ".join(f"{lang[0]}{i}" for i in idx))
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(data_dir, checkpoint, raw folder)."""
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.data.multilingual import preprocess_multilingual
    from nmtkit.data.preprocess import PreprocessConfig
    from nmtkit.models import ArchConfig, Transformer

    root = tmp_path_factory.mktemp("mlgen")
    rng = random.Random(0)
    for kind, n in (("train", 200), ("valid", 8), ("test", TEST_LINES)):
        for lang, lines in _lines(rng, n).items():
            (root / f"{kind}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = root / "data"
    preprocess_multilingual(PreprocessConfig(
        source_lang="de", target_lang="en", trainpref=str(root / "train"), validpref=[str(root / "valid")],
        testpref=[str(root / "test")], destdir=str(data), vocab_size=40), PAIRS, 5.0)
    src_dict, tgt_dict = load_dictionaries(data)
    torch.manual_seed(0)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=2, d_model=32, d_ff=64, heads=4,
                     max_source_positions=64, max_target_positions=64, share_embeddings="none")
    m = Transformer(cfg, len(src_dict), len(tgt_dict))
    with torch.no_grad():
        m.tgt_embed.weight.mul_(2.0)
        # every decoder state gets 10 u (the last layer norm's bias), and the tags' output rows are
        # u: their logits are about 10, the others' about +-2, so the tags are the likeliest tokens
        u = torch.nn.functional.normalize(torch.randn(cfg.d_model), dim=0)
        m.decoder_layers[-1].ffn_norm.bias.copy_(10 * u)
        for k, lang in enumerate(LANGS):
            m.out_proj.weight[tgt_dict.index(tag_token(lang))] = u * (1 + 0.01 * k)
    ckpt = root / "model.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": m.state_dict(),
                     "dictionaries": {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256,
                                      "src_size": len(src_dict), "tgt_size": len(tgt_dict),
                                      "src_lang": "de", "tgt_lang": "en"}}, ckpt)
    return data, ckpt, root


@pytest.fixture(scope="module")
def tr(model):
    from nmtkit import Translator

    data, ckpt, _ = model
    return Translator.load(ckpt, data, device="cpu", threads=1, beam=2, max_len_b=6)


def _tag_ids(tr) -> set[int]:
    return {tr.tgt_dict.index(tag_token(lang)) for lang in LANGS}


def test_the_tag_of_the_target_leads_each_source(tr):
    items = tr.encode(["d1 d2", "", "d3"], target_lang=["fr", "en", "en"])
    assert [int(it.ids[0]) for it in (items[0], items[2])] == [tr.src_dict.index(">>fr<<"), tr.src_dict.index(">>en<<")]
    assert [it.lead for it in items] == [1, 0, 1] and len(items[1].ids) == 0  # an empty line stays empty
    assert list(items[0].ids[1:]) == list(tr.source_ids("d1 d2"))
    # a literal tag typed by a user is text, segmented like any other
    (typed,) = tr.encode([">>fr<< d1"], target_lang="en")
    assert list(typed.ids[:2]) != [tr.src_dict.index(">>en<<"), tr.src_dict.index(">>fr<<")]


def test_a_search_without_the_ban_would_output_tags_and_no_output_holds_one(tr):
    """The fixture makes tags likely: the engine's search with banned=() finds them; every path
    through the translator never does."""
    import dataclasses

    items = tr.encode(["d1 d2 d3", "d4 d5"], target_lang="en")
    cfg = tr.search_config(min_len=3)  # at least 3 tokens: the empty output would win otherwise
    assert set(cfg.banned) == _tag_ids(tr)
    unbanned = tr.engine.search([it.ids for it in items], dataclasses.replace(cfg, banned=()), False)
    assert any(t in _tag_ids(tr) for hyps in unbanned for h in hyps for t in h.tokens)
    for lang in LANGS:
        rows = tr.translate_nbest(["d1 d2 d3", "d4 d5"], target_lang=lang, nbest=2, min_len=3)
        for row in rows:
            for t in row:
                assert not set(t.hypothesis.tokens) & _tag_ids(tr) and ">>" not in t.text
        sampled = tr.translate(["d1 d2 d3"], target_lang=lang, sampling=True, beam=3, seed=1, min_len=3)
        assert ">>" not in sampled[0]


def test_a_language_the_model_lacks_or_none_is_one_line_naming_its_languages(tr):
    with pytest.raises(UserError, match=r"give the target language \(de, en, fr\)"):
        tr.translate(["d1"])
    with pytest.raises(UserError, match=r"'cs' is not one of the model's languages \(de, en, fr\)"):
        tr.translate(["d1"], target_lang="cs")
    with pytest.raises(UserError, match=r"one per sentence \(2\), got 1"):
        tr.translate(["d1", "d2"], target_lang=["en"])
    with pytest.raises(UserError, match=r"must be a language \(a str\)"):
        tr.translate(["d1"], target_lang=[3])


def test_sentences_into_several_languages_in_one_call_equal_one_call_per_language(tr):
    src = ["d1 d2", "e3 e4 e5", "f6", "d7 d8 d9"]
    langs = ["en", "de", "en", "fr"]
    mixed = tr.translate(src, target_lang=langs)
    alone = [tr.translate([s], target_lang=lang)[0] for s, lang in zip(src, langs)]
    assert mixed == alone


def test_a_default_target_at_load_and_alignments_count_the_sentences_own_tokens(model, tr):
    from nmtkit import Translator

    data, ckpt, _ = model
    fr = Translator.load(ckpt, data, device="cpu", threads=1, beam=2, max_len_b=6, target_lang="fr")
    assert fr.translate(["d1 d2"]) == tr.translate(["d1 d2"], target_lang="fr")
    with pytest.raises(UserError, match="'xx' is not one of"):
        Translator.load(ckpt, data, device="cpu", target_lang="xx")
    items = tr.encode(["d1 d2 d3"], target_lang="en")
    hyps = tr.translate_items(items, min_len=3)
    (align,) = tr.align_items(items, hyps)[0]
    n_text = len(items[0].ids) - 1
    assert align and all(0 <= s < n_text for s, _ in align)
    att = tr.attention("d1 d2 d3", target_lang="en")
    assert att.source_tokens[0] == ">>en<<" and len(att.source_tokens) == len(items[0].ids) + 1


def _cli(run_cli, *args):
    return run_cli("generate", *map(str, args), "--quiet", "--threads", "1", "--beam", "2", "--max-len-b", "6")


def test_generate_takes_the_direction_and_refuses_a_missing_one(model, tr, run_cli):
    data, ckpt, root = model
    r = _cli(run_cli, data, "--path", ckpt, "--input", root / "test.de")
    assert r.code == 2 and r.err == "nmtkit: error: --target-lang: the model is multilingual; give the target language (de, en, fr)\n"
    r = _cli(run_cli, data, "--path", ckpt, "--input", root / "test.de", "--target-lang", "cs")
    assert r.code == 2 and "'cs' is not one of the model's languages (de, en, fr)" in r.err
    r = _cli(run_cli, data, "--path", ckpt, "--input", root / "test.de", "-t", "fr")
    assert r.code == 0, r
    src = (root / "test.de").read_text(encoding="utf-8").splitlines()
    assert r.out.splitlines() == tr.translate(src, target_lang="fr")
    # a binarized split is one direction: test.de-en, its sources tagged already
    r = _cli(run_cli, data, "--path", ckpt, "--gen-subset", "test", "-t", "en")
    assert r.code == 2 and "give --source-lang and --target-lang" in r.err
    r = _cli(run_cli, data, "--path", ckpt, "--gen-subset", "test", "-s", "de", "-t", "fr")
    assert r.code == 2 and "no split 'test.de-fr'" in r.err and "de-en" in r.err
    r = _cli(run_cli, data, "--path", ckpt, "--gen-subset", "test", "-s", "de", "-t", "en")
    assert r.code == 0, r
    assert r.out.splitlines() == tr.translate(src, target_lang="en")


def test_generate_fairseq_lines_and_alignments_hold_no_tag(model, run_cli):
    data, ckpt, root = model
    r = _cli(run_cli, data, "--path", ckpt, "--input", root / "test.de", "-t", "en", "--format", "fairseq",
             "--print-alignment", "--min-len", "3")
    assert r.code == 0, r
    lines = r.out.splitlines()
    assert not [x for x in lines if ">>" in x]  # S- lines show the sentence's own pieces: no tag
    pieces = {x.split("\t")[0][2:]: len(x.split("\t")[1].split()) for x in lines if x.startswith("S-")}
    aligned = [x for x in lines if x.startswith("A-")]
    assert len(aligned) == TEST_LINES
    for x in aligned:  # source positions index the S- line's pieces
        n = pieces[x.split("\t")[0][2:]]
        assert all(0 <= int(p.split("-")[0]) < n for p in x.split("\t")[1].split())


def test_a_bilingual_model_accepts_its_own_languages_only(run_cli, tmp_path):
    from conftest import word_mapping_data_dir

    data = word_mapping_data_dir(tmp_path, 40, 4, 10, seed=0)
    from nmtkit import Translator
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer

    s, t = load_dictionaries(data)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                     max_source_positions=32, max_target_positions=32)
    ckpt = tmp_path / "bi.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": Transformer(cfg, len(s), len(t)).state_dict(),
                     "dictionaries": {"src_sha256": s.sha256, "tgt_sha256": t.sha256, "src_size": len(s),
                                      "tgt_size": len(t), "src_lang": "de", "tgt_lang": "en"}}, ckpt)
    bi = Translator.load(ckpt, data, device="cpu", threads=1)
    assert bi.translate(["w1 w2"], target_lang="en") == bi.translate(["w1 w2"])
    assert bi.search_config().banned == ()
    with pytest.raises(UserError, match="translates de into en only"):
        bi.translate(["w1"], target_lang="fr")
    (tmp_path / "in.txt").write_text("w1 w2\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", tmp_path / "in.txt", "-t", "fr", "--quiet")
    assert r.code == 2 and r.err == "nmtkit: error: --target-lang fr: the model translates de into en only\n"
    r = run_cli("generate", data, "--path", ckpt, "--input", tmp_path / "in.txt", "-s", "de", "-t", "en", "--quiet")
    assert r.code == 0 and r.out.splitlines() == bi.translate(["w1 w2"])


def test_serve_requests_name_their_language(tr):
    from nmtkit.serving.app import Limits, RequestError, check_target_lang, parse_request
    from nmtkit.serving.batcher import Batcher

    limits = Limits()
    req = parse_request(json.dumps({"text": ["d1 d2", "d3"], "target_lang": "fr"}).encode(), limits)
    assert req.target_lang == ["fr", "fr"]
    req = parse_request(json.dumps({"text": ["d1 d2", "d3"], "target_lang": ["fr", "en"]}).encode(), limits)
    check_target_lang(tr, req)
    for body, status, msg in (
        ({"text": ["a", "b"], "target_lang": ["fr"]}, 400, '"target_lang" must be a language'),
        ({"text": ["a"], "target_lang": 3}, 400, '"target_lang" must be a language'),
    ):
        with pytest.raises(RequestError) as e:
            parse_request(json.dumps(body).encode(), limits)
        assert (e.value.status, e.value.message.startswith(msg)) == (status, True)
    for body, msg in (({"text": ["a"]}, "give the target language (de, en, fr)"),
                      ({"text": ["a"], "target_lang": "cs"}, "'cs' is not one of the model's languages")):
        with pytest.raises(RequestError) as e:
            check_target_lang(tr, parse_request(json.dumps(body).encode(), limits))
        assert e.value.status == 400 and msg in e.value.message
    # two requests into two languages share a batch and get what each alone gets
    b = Batcher(tr, max_batch_sentences=8, max_wait=0.2).start()
    try:
        j1 = b.submit(["d1 d2", "d3"], {}, None, ["fr", "fr"])
        j2 = b.submit(["d4"], {}, None, ["en"])
        r1, r2 = j1.future.result(timeout=60), j2.future.result(timeout=60)
    finally:
        b.close()
    assert [row[0].text for row in r1] == tr.translate(["d1 d2", "d3"], target_lang="fr")
    assert [row[0].text for row in r2] == tr.translate(["d4"], target_lang="en")


@pytest.mark.parametrize("fmt", ["ctranslate2", "onnx"])
def test_exports_translate_every_direction_as_native_does(model, tr, run_cli, tmp_path, fmt):
    from nmtkit import Translator

    pytest.importorskip("ctranslate2" if fmt == "ctranslate2" else "onnxruntime")
    data, ckpt, root = model
    out = tmp_path / fmt
    r = run_cli("export", data, "--path", ckpt, "--format", fmt, "--output", out)
    assert r.code == 0, r
    ex = Translator.load(out, device="cpu", threads=1, beam=2, max_len_b=6, lenpen_form="fairseq", early_stop="beam")
    native = Translator.load(model[1], data, device="cpu", threads=1, beam=2, max_len_b=6,
                             lenpen_form="fairseq", early_stop="beam")
    assert ex.langs == list(LANGS)
    src = (root / "test.de").read_text(encoding="utf-8").splitlines()
    for lang in LANGS:
        got = ex.translate_nbest(src, target_lang=lang)
        want = native.translate_nbest(src, target_lang=lang)
        for g, w in zip(got, want):
            assert ">>" not in g[0].text
            assert abs(g[0].score - w[0].score) < 1e-3 or g[0].text == w[0].text
        assert np.mean([g[0].text == w[0].text for g, w in zip(got, want)]) >= 0.8


def test_the_hugging_face_export_reads_the_tag_as_marian_does_and_bans_it(model, tr, run_cli, tmp_path):
    """MarianMT's convention: `>>fr<< text` through MarianTokenizer gives nmtkit's tagged source
    ids, and greedy search in plain transformers gives nmtkit's output, the tags suppressed by the
    export's generation config."""
    pytest.importorskip("transformers")
    from transformers import MarianMTModel, MarianTokenizer

    data, ckpt, root = model
    r = run_cli("export", data, "--path", ckpt, "--format", "huggingface", "--output", tmp_path / "hf")
    assert r.code == 0, r
    tok = MarianTokenizer.from_pretrained(tmp_path / "hf")
    hf = MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    assert set(hf.generation_config.suppress_tokens) == {0, 1} | _tag_ids(tr)
    src = (root / "test.de").read_text(encoding="utf-8").splitlines()
    for lang in ("en", "fr"):
        items = tr.encode(src, target_lang=lang)
        want = [r[0].hypothesis.tokens for r in tr.translate_nbest(src, target_lang=lang, beam=1, min_len=3)]
        for text, item, w in zip(src, items, want):
            ids = tok(f">>{lang}<< {text}").input_ids
            assert ids == item.ids.tolist() + [2]
            with torch.inference_mode():
                out = hf.generate(torch.tensor([ids]), num_beams=1, do_sample=False, min_new_tokens=3,
                                  max_new_tokens=len(ids) - 1 + 6 + 1)[0].tolist()[1:]
            out = out[: out.index(2)] if 2 in out else out
            limit = len(item.ids) + 6  # nmtkit's output limit here: source tokens + max_len_b
            assert out == w or (len(w) == limit and out[:limit] == w)
