"""Scores of given translations, word alignments and attention (docs/inspect.md):
`nmtkit generate --score-reference / --print-alignment`, `Translator.score / attention`.

References: the beam search's own reported scores (forced decoding must reproduce them), tiny
models trained here to copy and to reverse their input (their alignments must be the diagonal
and the anti-diagonal on held-out sentences), and hand-computed merges of subwords into words.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from nmtkit.forced import (
    Attention,
    PairScore,
    hard_alignment,
    merge_groups,
    punctuation_words,
    word_alignment,
    word_index,
    word_strings,
)
from nmtkit.search.beam import length_penalty
from tests.test_generate import COMMON, TEST_SRC, lines, setup  # noqa: F401 - fixture
from tests.test_parsing_pipeline import make_checkpoint, parsing_dir  # noqa: F401 - fixture

torch.set_num_threads(1)
N_WORDS = 16


# ------------------------------------------------------------------------ tiny trained models


def _task_data(root: Path, reverse: bool, seed: int = 0) -> Path:
    """A `--bpe none` data dir of sentences of 3-10 distinct-or-not words wK -> WK, copied or reversed."""
    from nmtkit.data.preprocess import PreprocessConfig, preprocess

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(N_WORDS)]
    for split, n in (("train", 2000), ("valid", 20)):
        src, tgt = [], []
        for _ in range(n):
            s = [rng.choice(words) for _ in range(rng.randint(3, 10))]
            t = [w.upper() for w in s]
            src.append(" ".join(s))
            tgt.append(" ".join(t[::-1] if reverse else t))
        (root / f"{split}.de").write_text("\n".join(src) + "\n")
        (root / f"{split}.en").write_text("\n".join(tgt) + "\n")
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(root / "train"),
                                validpref=[str(root / "valid")], destdir=str(root / "bin"), bpe="none",
                                joined_dictionary=True))
    return root / "bin"


def _train(data: Path, steps: int, out: Path, seed: int = 0) -> Path:
    """Plain-PyTorch training of a 2+1-layer model (one decoder layer: its cross-attention is the
    alignment's source) on the data dir's train split; saved as an nmtkit checkpoint."""
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.data.shards import load_split
    from nmtkit.backends.pytorch.forced import collate_targets
    from nmtkit.models import ArchConfig, Transformer

    sd, td = load_dictionaries(data)
    src, tgt = load_split(data, "train", "de"), load_split(data, "train", "en")
    torch.manual_seed(seed)
    cfg = ArchConfig(encoder_layers=2, decoder_layers=1, d_model=64, d_ff=128, heads=4, dropout=0.0,
                     max_source_positions=64, max_target_positions=64)
    model = Transformer(cfg, len(sd), len(td))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    rng = random.Random(seed)
    for _ in range(steps):
        idx = [rng.randrange(len(src)) for _ in range(32)]
        S = max(len(src[i]) for i in idx) + 1
        s = torch.zeros(32, S, dtype=torch.long)
        for r, i in enumerate(idx):
            s[r, :len(src[i])] = torch.from_numpy(src[i].astype(np.int64))
            s[r, len(src[i])] = sd.eos
        prev, gold = collate_targets([tgt[i].tolist() for i in idx], td.bos, td.eos, td.pad)
        loss = torch.nn.functional.cross_entropy(model(s, prev).reshape(-1, len(td)), gold.reshape(-1),
                                                 ignore_index=td.pad)
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": model.state_dict(),
                     "dictionaries": {"src_sha256": sd.sha256, "tgt_sha256": td.sha256, "src_size": len(sd),
                                      "tgt_size": len(td), "src_lang": "de", "tgt_lang": "en"}}, out)
    return out


def _held_out(n: int, seed: int) -> list[list[str]]:
    """Sentences of distinct words (so that each target word has one right source word)."""
    rng = random.Random(seed)
    return [[f"w{i}" for i in rng.sample(range(N_WORDS), rng.randint(3, 10))] for _ in range(n)]


@pytest.fixture(scope="module")
def copier(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy")
    data = _task_data(root, reverse=False)
    return data, _train(data, 800, root / "copy.pt")


@pytest.fixture(scope="module")
def reverser(tmp_path_factory):
    root = tmp_path_factory.mktemp("rev")
    data = _task_data(root, reverse=True)
    return data, _train(data, 500, root / "rev.pt")


def _pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in p.split("-")) for p in text.split()]


@pytest.mark.parametrize("task", ["copier", "reverser"])
def test_print_alignment_of_a_copy_model_is_the_diagonal_and_of_a_reverser_the_anti_diagonal(task, request, run_cli,
                                                                                                tmp_path):
    data, ckpt = request.getfixturevalue(task)
    sents = _held_out(30, seed=7)
    f = tmp_path / "in.de"
    f.write_text("\n".join(" ".join(s) for s in sents) + "\n")
    r = run_cli("generate", data, "--path", ckpt, "--input", f, "--format", "fairseq", "--print-alignment",
                "--quiet", "--threads", "1")
    assert r.code == 0, r
    out = lines(r.out)
    hyps = {int(x.split("\t")[0][2:]): x.split("\t")[2].split() for x in out if x.startswith("H-")}
    aligns = {int(x.split("\t")[0][2:]): _pairs(x.split("\t")[1]) for x in out if x.startswith("A-")}
    assert sorted(aligns) == list(range(len(sents)))
    right = links = good = 0
    for i, s in enumerate(sents):
        want = [w.upper() for w in s]
        if task == "reverser":
            want = want[::-1]
        if hyps[i] != want:
            continue
        right += 1
        n = len(s)
        assert [t for _, t in aligns[i]] == list(range(n))  # one pair per target token, in order
        links += n
        good += sum(src == (n - 1 - t if task == "reverser" else t) for src, t in aligns[i])
    assert right >= 27, f"{task} translates only {right}/30 held-out sentences right"  # guard: it learnt
    if task == "copier":
        assert good == links
    else:  # a few pairs of a half-hour-of-CPU-free model may point next door; nearly all do not
        assert good >= 0.95 * links, (good, links)


def test_alignment_words_plain_format_and_the_flag_alone(copier, run_cli, tmp_path):
    data, ckpt = copier
    f = tmp_path / "in.de"
    f.write_text("w1 w2 w3\n\nw4 w5 w6 w7\n")
    base = ("generate", data, "--path", ckpt, "--input", f, "--quiet", "--threads", "1")
    plain = lines(run_cli(*base).out)
    # the flag alone, last or before another option; "subword" spelled out; = words on --bpe none
    for args in (("--print-alignment",), ("--print-alignment", "--print-scores"), ("--print-alignment", "subword"),
                 ("--print-alignment", "words"), ("--print-alignment=words",)):
        r = run_cli(*base, *args)
        assert r.code == 0, (args, r)
        got = lines(r.out)
        assert len(got) == 3
        cols = [x.split("\t") for x in got]
        assert [c[-2] for c in cols] == plain  # hypotheses unchanged; the alignment is a last column
        assert cols[1][-1] == ""  # an empty input: no pairs
        assert cols[0][-1] == "0-0 1-1 2-2" and cols[2][-1] == "0-0 1-1 2-2 3-3"  # source-target


def test_score_reference_of_beam_hypotheses_reproduces_their_scores(copier, run_cli, tmp_path):
    """nbest 1 and 5: each hypothesis fed back as a raw reference gets the beam's score (and the
    same per-token log-probs), in both length penalty forms; the split's own targets score too."""
    data, ckpt = copier
    sents = [" ".join(s) for s in _held_out(6, seed=3)]
    f = tmp_path / "in.de"
    f.write_text("\n".join(sents) + "\n")
    for nbest, pen in ((1, ()), (5, ()), (5, ("--lenpen-form", "fairseq", "--lenpen", "1.0"))):
        common = ("--path", ckpt, "--quiet", "--threads", "1", "--beam", "5", *pen)
        args = (*common, "--format", "fairseq")
        r = run_cli("generate", data, "--input", f, "--nbest", nbest, *args)
        assert r.code == 0, r
        out = lines(r.out)
        h = [x.split("\t") for x in out if x.startswith("H-")]
        p = [x.split("\t")[1] for x in out if x.startswith("P-")]
        assert len(h) == nbest * len(sents)
        src2, ref2 = tmp_path / "s2", tmp_path / "r2"
        src2.write_text("".join(sents[int(x[0][2:])] + "\n" for x in h))
        ref2.write_text("".join(x[2] + "\n" for x in h))
        r = run_cli("generate", data, "--input", src2, "--score-reference", "--reference", ref2, *args)
        assert r.code == 0, r
        out2 = lines(r.out)
        h2 = [x.split("\t") for x in out2 if x.startswith("H-")]
        p2 = [x.split("\t")[1] for x in out2 if x.startswith("P-")]
        assert [x[2] for x in h2] == [x[2] for x in h]
        assert [float(x[1]) for x in h2] == pytest.approx([float(x[1]) for x in h], abs=1e-4)
        for a, b in zip(p2, p):
            assert [float(v) for v in a.split()] == pytest.approx([float(v) for v in b.split()], abs=2e-4)
        # plain format: SCORE LOGPROB TOKENS [per-token] per pair, in order
        r = run_cli("generate", data, "--input", src2, "--score-reference", "--reference", ref2, "--print-scores",
                    *common)
        assert r.code == 0, r
        rows = [x.split("\t") for x in lines(r.out)]
        assert len(rows) == len(h)
        for row, hx, px in zip(rows, h, p):
            toks = [float(v) for v in px.split()]
            assert len(row) == 4 and int(row[2]) == len(hx[2].split()) + 1 == len(toks)
            assert float(row[0]) == pytest.approx(float(hx[1]), abs=1e-4)
            assert float(row[1]) == pytest.approx(sum(toks), abs=1e-3)
    # an empty reference is the empty translation: </s> alone
    src2.write_text("w1 w2\n")
    ref2.write_text("\n")
    r = run_cli("generate", data, "--path", ckpt, "--input", src2, "--score-reference", "--reference", ref2, "--quiet")
    assert r.code == 0 and lines(r.out)[0].split("\t")[2] == "1", r
    # the binarized valid split against its own target side: scores equal the raw-text path's
    r = run_cli("generate", data, "--path", ckpt, "--gen-subset", "valid", "--score-reference", "--quiet")
    assert r.code == 0, r
    split_rows = lines(r.out)
    raw = Path(data).parent
    r = run_cli("generate", data, "--path", ckpt, "--input", raw / "valid.de", "--reference", raw / "valid.en",
                "--score-reference", "--quiet")
    assert r.code == 0, r
    assert len(split_rows) == 20 and [x.split("\t")[2] for x in lines(r.out)] == [x.split("\t")[2] for x in split_rows]
    assert [float(x.split("\t")[0]) for x in lines(r.out)] == pytest.approx(
        [float(x.split("\t")[0]) for x in split_rows], abs=1e-5)


@pytest.mark.parametrize("nbest", [1, 5])
@pytest.mark.parametrize("form", ["gnmt", "fairseq"])
def test_forced_scores_equal_the_beam_scores_on_a_sentencepiece_model(setup, nbest, form):  # noqa: F811
    """The random-initialised model of test_generate (sentencepiece, an ensemble too): token ids of
    each hypothesis fed back (no detokenization in between) give its score and log-probs."""
    from nmtkit import Translator
    from nmtkit.generation.items import Item

    data, ckpt, ckpt2, _ = setup
    for paths in ([ckpt], [ckpt, ckpt2]):
        tr = Translator.load(paths, data, threads=1, max_len_b=6, beam=5, nbest=nbest, lenpen_form=form,
                             lenpen=1.0 if form == "fairseq" else 0.6, warn=lambda m: None)
        items = tr.encode([s for s in TEST_SRC if s.strip()])
        results = tr.translate_items(items)
        fed = [Item(k, it.ids, np.array(h.tokens, dtype=np.int64)) for it in items
               for k, h in [(it.index * 10 + j, h) for j, h in enumerate(results[it.index])]]
        scores, _ = tr.score_items(fed)
        n = 0
        for it in items:
            for j, h in enumerate(results[it.index]):
                (got,) = scores[it.index * 10 + j]
                assert got.tokens == h.tokens
                assert got.score == pytest.approx(h.score, abs=1e-4)
                assert got.positional_scores == pytest.approx(h.positional_scores, abs=1e-4)
                n += 1
        assert n == nbest * len(items)


def test_translator_score_and_attention(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    tr = Translator.load(ckpt, data, threads=1, max_len_b=6, warn=lambda m: None)
    srcs = ["der Hund läuft", "die Katze"]
    outs = [t[0] for t in tr.translate_nbest(srcs)]
    refs = ["the dog runs", "the cat"]
    got = tr.score(srcs, refs)
    assert all(isinstance(x, PairScore) for x in got)
    for g in got:  # the parts agree: |Y| counts </s>, score = logprob / lp(|Y|)
        assert g.tokens == len(g.positional_scores) and g.logprob == pytest.approx(sum(g.positional_scores))
        assert g.score == pytest.approx(g.logprob / length_penalty(float(g.tokens), 0.6, "gnmt"))
    # the model's own translation, given as text, scores as the search said when it re-segments alike
    for o, s in zip(outs, tr.score(srcs, [o.text for o in outs])):
        if tr.tgt_subword.encode(o.text) == o.pieces:
            assert s.score == pytest.approx(o.score, abs=1e-4)

    a = tr.attention("der Hund läuft")  # the model's own translation
    best = outs[0]
    assert not a.target_given and a.target_tokens == best.pieces + ["</s>"]
    assert a.decoder_inputs == ["<s>"] + best.pieces
    assert a.source_tokens == tr.src_subword.encode("der Hund läuft") + ["</s>"]
    S, T = len(a.source_tokens), len(a.target_tokens)
    assert a.enc_self.shape == (2, 4, S, S) and a.dec_self.shape == (2, 4, T, T) and a.cross.shape == (2, 4, T, S)
    assert a.score.score == pytest.approx(best.score, abs=1e-4)
    for k in ("enc-self", "dec-self", "cross"):
        np.testing.assert_allclose(a.weights(k).sum(-1), 1.0, atol=1e-5)
    assert (a.dec_self[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    # the alignment of generate's --print-alignment is the argmax of the last layer's mean over heads
    item = tr.encode(["der Hund läuft"])[0]
    al = tr.align_items([item], tr.translate_items([item]))[item.index][0]
    assert al == hard_alignment(torch.from_numpy(a.cross[-1].mean(0)), S - 1, T - 1)

    g = tr.attention("der Hund läuft", "the dog runs")
    assert g.target_given and g.target_tokens == tr.tgt_subword.encode("the dog runs") + ["</s>"]
    assert g.score.score == pytest.approx(got[0].score, abs=1e-5)
    w = g.words()
    assert w.level == "words" and w.source_tokens == ["der", "Hund", "läuft", "</s>"]
    assert w.target_tokens == ["the", "dog", "runs", "</s>"] and w.decoder_inputs == ["<s>", "the", "dog", "runs"]
    np.testing.assert_allclose(w.cross.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(w.enc_self, merge_groups(g.enc_self, g.source_word_of, g.source_word_of))


def test_translator_refusals(setup):  # noqa: F811
    from nmtkit import Translator
    from nmtkit.errors import UserError

    data, ckpt, ckpt2, _ = setup
    tr = Translator.load(ckpt, data, threads=1, max_len_b=6, warn=lambda m: None)
    for call, needle in [
        (lambda: tr.score(["der Hund"], ["the dog", "the cat"]), "score: 1 sources but 2 targets"),
        (lambda: tr.score("der Hund", "the dog"), "score takes two lists"),
        (lambda: tr.score(["der Hund", " "], ["the dog", "the"]), "source 2: empty source sentence"),
        (lambda: tr.score(["der Hund"], ["the QQQ"]), "target 1: target token(s)"),
        (lambda: tr.attention(""), "attention: empty source sentence"),
        (lambda: tr.attention(["der Hund"]), "attention takes one source sentence"),
        (lambda: Translator.load([ckpt, ckpt2], data, warn=lambda m: None).attention("der Hund"),
         "attention is per model: this translator holds 2"),
        (lambda: tr.align_items(tr.encode(["der Hund"]), {}, layer=2), "cross attention layer 2 (0-based) is out of range"),
    ]:
        with pytest.raises(UserError, match=re.escape(needle)):
            call()
    assert tr.score(["der Hund"], [""])[0].tokens == 1  # the empty translation: </s> alone
    # an engine that cannot teacher-force (as CTranslate2's): refused in one line, before any work
    class NoForcing(type(tr.engine)):
        teacher_forcing = False

    tr.engine.__class__ = NoForcing
    for call in (lambda: tr.score(["der Hund"], ["the dog"]), lambda: tr.attention("der Hund"),
                 lambda: tr.attention_of_item(tr.encode(["der Hund"])[0]), lambda: tr.score_items([]),
                 lambda: tr.align_items([], {})):
        with pytest.raises(UserError, match="needs nmtkit's own model: load the checkpoint"):
            call()


def test_merge_groups_by_hand():
    w = np.array([[0.1, 0.2, 0.3, 0.4],
                  [0.4, 0.3, 0.2, 0.1],
                  [0.0, 0.5, 0.5, 0.0]])  # 3 queries x 4 keys
    got = merge_groups(w, [0, 0, 1], [0, 1, 1, 2])  # queries (q0 q1) q2; keys k0 (k1 k2) k3
    want = np.array([[(0.1 + 0.4) / 2, (0.2 + 0.3 + 0.3 + 0.2) / 2, (0.4 + 0.1) / 2],
                     [0.0, 1.0, 0.0]])
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(merge_groups(w[None, None], [0, 1, 2], [0, 1, 2, 3])[0, 0], w)


def test_word_index_and_word_alignment_by_hand():
    assert word_index(["\u2581Ein", "\u2581Hau", "s", "\u2581", "(", "x", "\u2581."], "sentencepiece") == [0, 1, 1, 2, 2, 2, 3]
    assert word_index(["ein", "Hau@@", "s@@", "chen", "."], "subword-nmt") == [0, 1, 1, 1, 2]
    assert word_index(["a", "b"], "none") == [0, 1]
    # pieces: src [A1 A2 | B], tgt [x | y1 y2]: subword pairs -> the union of word pairs
    assert word_alignment([(2, 0), (0, 1), (1, 2)], [0, 0, 1], [0, 1, 1]) == [(1, 0), (0, 1)]


def test_punctuation_words_by_hand():
    spm = lambda g: "".join(g).replace("\u2581", " ").strip()  # sentencepiece's decode
    bpe = lambda g: " ".join(g).replace("@@ ", "")  # subword-nmt's

    def split(pieces, kind, decode):
        w = word_index(pieces, kind)
        return punctuation_words(pieces, w, word_strings(pieces, w, decode))

    # glued punctuation before and after a word is a word; inside a word, or alone, it stays
    pieces = ["\u2581Ein", "\u2581Ball", ",", "\u2581(", "x", ")", "\u2581", "\u00ab", "Hi", "!\u00bb",
              "\u25813", ".", "5", "\u2581...", "</s>"]
    assert split(pieces, "sentencepiece", spm) == (
        [0, 1, 2, 3, 4, 5, 6, 6, 7, 8, 9, 9, 9, 10, 11],
        ["Ein", "Ball", ",", "(", "x", ")", "\u00ab", "Hi", "!\u00bb", "3.5", "...", "</s>"])
    # a piece that mixes letters and punctuation is one row of weights: not split
    assert split(["\u2581Ball,", "\u2581Hund", "."], "sentencepiece", spm) == ([0, 1, 2], ["Ball,", "Hund", "."])
    assert split(["Hun@@", "d@@", ".", "Ball,", "z@@", ".@@", "B"], "subword-nmt", bpe) == (
        [0, 0, 1, 2, 3, 3, 3], ["Hund", ".", "Ball,", "z.B"])
    assert split(["\u2581e", "-", "mail", "."], "sentencepiece", spm) == ([0, 0, 0, 1], ["e-mail", "."])
    assert split(["Ball,", ","], "none", " ".join) == ([0, 1], ["Ball,", ","])
    # pieces that do not spell their word's text (a normalizing detokenizer): the word stays whole
    w = [0, 0]
    assert punctuation_words(["\u2581Hund", "."], w, ["Hund \u3002"]) == ([0, 0], ["Hund \u3002"])
    # generate's word alignment keeps its whitespace words
    assert word_index(["\u2581Ball", ",", "\u2581Hund", "."], "sentencepiece") == [0, 0, 1, 1]


def test_attention_words_with_split_punctuation_merge_by_hand():
    rng = np.random.default_rng(0)

    def rows(*shape):
        w = rng.random(shape)
        return (w / w.sum(-1, keepdims=True)).astype(np.float32)

    src = ["\u2581Ball", ",", "\u2581da", "</s>"]
    tgt = ["\u2581ball", ",", "</s>"]
    a = Attention(src, tgt, ["<s>", "\u2581ball", ","], rows(1, 2, 4, 4), np.tril(rows(1, 2, 3, 3)), rows(1, 2, 3, 4),
                  PairScore(-1.0, 3, -1.0), True, source_word_of=[0, 0, 1, 2], target_word_of=[0, 0, 1],
                  source_words=["Ball,", "da", "</s>"], target_words=["ball,", "</s>"])
    whole = a.words()
    assert whole.source_tokens == ["Ball,", "da", "</s>"] and whole.cross.shape == (1, 2, 2, 3)
    p = a.words(split_punctuation=True)
    assert p.source_tokens == ["Ball", ",", "da", "</s>"] and p.target_tokens == ["ball", ",", "</s>"]
    assert p.decoder_inputs == ["<s>", "ball", ","] and p.source_words == p.source_tokens
    np.testing.assert_allclose(p.cross, a.cross)  # every piece is a word of its own here
    np.testing.assert_allclose(p.enc_self, a.enc_self)
    assert p.words(split_punctuation=True) is p


def test_words_alignment_on_sentencepiece_output_uses_detokenized_words(setup, run_cli):  # noqa: F811
    data, ckpt, _, root = setup
    args = ("generate", data, "--path", ckpt, "--input", root / "test.de", *COMMON, "--format", "fairseq",
            "--nbest", "2")
    sub = lines(run_cli(*args, "--print-alignment").out)
    words = lines(run_cli(*args, "--print-alignment", "words").out)
    assert [x for x in sub if not x.startswith("A-")] == [x for x in words if not x.startswith("A-")]
    src = {x.split("\t")[0][2:]: x.split("\t")[1].split() for x in sub if x.startswith("S-")}
    hyps = [(x.split("\t")[0][2:], x.split("\t")[2].split(), y.split("\t")[2])
            for x, y in zip([x for x in sub if x.startswith("H-")], [x for x in sub if x.startswith("D-")])]
    a_sub = [x.split("\t")[1] for x in sub if x.startswith("A-")]
    a_words = [x.split("\t")[1] for x in words if x.startswith("A-")]
    assert len(a_sub) == len(hyps) == len(a_words) and any(a_sub)
    for (i, pieces, detok), s_al, w_al in zip(hyps, a_sub, a_words):
        assert [t for _, t in _pairs(s_al)] == list(range(len(pieces)))
        sw, tw = word_index(src[i], "sentencepiece"), word_index(pieces, "sentencepiece")
        assert _pairs(w_al) == word_alignment(_pairs(s_al), sw, tw)
        if pieces:
            assert tw[-1] + 1 == len(detok.split())  # the words are the detokenized output's


def test_print_alignment_keeps_hypotheses_and_layer_choice(setup, run_cli):  # noqa: F811
    data, ckpt, ckpt2, _ = setup
    base = ("generate", data, "--path", ckpt, *COMMON, "--format", "fairseq", "--nbest", "3")
    plain = lines(run_cli(*base).out)
    for extra in (("--print-alignment",), ("--print-alignment", "--alignment-layer", "1")):
        out = lines(run_cli(*base, *extra).out)
        assert [x for x in out if not x.startswith("A-")] == plain
        assert sum(x.startswith("A-") for x in out) == sum(x.startswith("H-") for x in out)
    last = lines(run_cli(*base, "--print-alignment", "--alignment-layer", "2").out)
    assert last == lines(run_cli(*base, "--print-alignment").out)  # the default is the last layer
    ens = lines(run_cli(*base, "--path", ckpt2, "--print-alignment").out)
    assert sum(x.startswith("A-") for x in ens) == sum(x.startswith("H-") for x in ens)


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("case,needle", [
    ("mismatch", r"--reference .*ref has 2 lines but --input .*src has 3; they must be line-aligned pairs"),
    ("empty_src", r"src:2: empty source line"),
    ("unknown", r"ref:1: target token\(s\) 'zzz' not in the target dictionary"),
    ("layer", r"--alignment-layer 2 is out of range: the model has 1 decoder layers \(1\.\.1\)"),
    ("layer0", r"--alignment-layer is 1-based"),
    ("level", r"--print-alignment must be subword \(the default when given alone\) or words, got 'hard'"),
    ("no_ref", r"--score-reference with --input needs --reference FILE"),
    ("ref_only", r"--reference applies to --score-reference"),
    ("layer_only", r"--alignment-layer applies to --print-alignment"),
    ("nbest", r"--nbest applies to the search"),
])
def test_bad_inputs_are_one_line_exit_2_and_write_nothing(reverser, run_cli, tmp_path, case, needle):
    data, ckpt = reverser
    src, ref, out = tmp_path / "src", tmp_path / "ref", tmp_path / "out"
    src.write_text("w1 w2\nw3\nw4 w5\n")
    ref.write_text("W2 W1\nW3\nW5 W4\n")
    args = ["--input", src, "--score-reference", "--reference", ref]
    if case == "mismatch":
        ref.write_text("W2 W1\nW3\n")
    elif case == "empty_src":
        src.write_text("w1 w2\n \nw4 w5\n")
    elif case == "unknown":
        ref.write_text("W2 zzz W1\nW3\nW5 W4\n")
    elif case in ("layer", "layer0"):
        args += ["--print-alignment", "--alignment-layer", "2" if case == "layer" else "0"]
    elif case == "level":
        args += ["--print-alignment", "hard"]
    elif case == "no_ref":
        args = ["--input", src, "--score-reference"]
    elif case == "ref_only":
        args = ["--input", src, "--reference", ref]
    elif case == "layer_only":
        args = ["--input", src, "--alignment-layer", "1"]
    elif case == "nbest":
        args += ["--nbest", "2", "--beam", "4"]
    r = run_cli("generate", data, "--path", ckpt, *args, "--output", out, "--quiet")
    assert r.code == 2, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert re.search(needle, r.err), r.err
    assert not out.exists() and r.out == ""


# ------------------------------------------------------------------------ nmtkit attention


def test_attention_command_png_json_npz(setup, run_cli, tmp_path):  # noqa: F811
    import json

    from nmtkit import Translator

    data, ckpt, _, _ = setup
    base = ("attention", data, "--path", ckpt, "--max-len-b", "6", "--threads", "1")
    r = run_cli(*base, "--source", "der Hund läuft", "--source", "die Katze", "--target", "the dog runs",
                "--target", "the cat", "--kind", "enc-self", "--layer", "1", "--heads", "2,4", "-o", tmp_path / "a.png")
    assert r.code == 0, r
    pngs = [tmp_path / "a-1.png", tmp_path / "a-2.png"]
    assert r.out.split() == [str(p) for p in pngs]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the paper's drawing: lines from queries to keys, one color per head; one query alone
    for extra in ((), ("--query", "2")):
        r = run_cli(*base, "--source", "der Hund läuft", "--kind", "enc-self", "--style", "lines", *extra,
                    "-o", tmp_path / "l.png")
        assert r.code == 0, r
        assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # json: the chosen kind / layer / heads, equal to Translator.attention's arrays
    out = tmp_path / "a.json"
    r = run_cli(*base, "--source", "der Hund läuft", "--kind", "cross", "--heads", "1,3", "--format", "json", "-o", out)
    assert r.code == 0, r
    doc = json.loads(out.read_text())
    tr = Translator.load(ckpt, data, threads=1, max_len_b=6, warn=lambda m: None)
    a = tr.attention("der Hund läuft")
    assert (doc["kind"], doc["layer"], doc["layers"], doc["heads"], doc["level"]) == ("cross", 2, 2, [1, 3], "subword")
    (s,) = doc["sentences"]
    assert s["rows"] == a.target_tokens and s["columns"] == a.source_tokens and s["target_given"] is False
    np.testing.assert_allclose(np.array(s["weights"]), a.cross[1][[0, 2]], atol=1e-6)
    # npz at word level from the binarized test split with its own targets; dec-self
    out = tmp_path / "a.npz"
    r = run_cli(*base, "--gen-subset", "test", "--index", "0", "--index", "3", "--split-target", "--kind", "dec-self",
                "--level", "words", "--format", "npz", "-o", out)
    assert r.code == 0, r
    z = np.load(out)
    assert str(z["kind"]) == "dec-self" and list(z["heads"]) == [1, 2, 3, 4] and int(z["layer"]) == 2
    for i in (0, 1):
        w = z[f"weights_{i}"]
        assert w.shape == (4, len(z[f"rows_{i}"]), len(z[f"columns_{i}"]))
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        assert z[f"columns_{i}"][0] == "<s>" and z[f"rows_{i}"][-1] == "</s>"
    # the split's own targets (REFS of test_generate), merged into words
    assert list(z["rows_0"]) == ["the", "dog", "cat", "</s>"] and list(z["columns_0"]) == ["<s>", "the", "dog", "cat"]
    assert list(z["rows_1"]) == ["the", "tree", "runs", "</s>"]


def _drawn(monkeypatch) -> list[dict]:
    """What `nmtkit attention` passes to the figure functions, one dict per picture (none drawn)."""
    import nmtkit.figures.attention as figures

    calls: list[dict] = []

    def fake(style):
        def draw(weights, rows, cols, heads, title, out, *args, query=None):
            calls.append({"style": style, "weights": weights, "rows": list(rows), "cols": list(cols),
                          "heads": list(heads), "title": title, "query": query})
            Path(out).write_bytes(b"")
            return Path(out)
        return draw

    monkeypatch.setattr(figures, "draw_heads", fake("heatmap"))
    monkeypatch.setattr(figures, "draw_lines", fake("lines"))
    return calls


def test_attention_titles_name_a_target_only_when_the_picture_shows_one(setup, run_cli, tmp_path, monkeypatch):  # noqa: F811
    data, ckpt, _, _ = setup
    calls = _drawn(monkeypatch)
    base = ("attention", data, "--path", ckpt, "--max-len-b", "6", "--threads", "1", "--source", "der Hund läuft")
    for kind in ("enc-self", "cross", "dec-self"):
        for given in ((), ("--target", "the dog runs")):
            r = run_cli(*base, *given, "--kind", kind, "-o", tmp_path / "t.png")
            assert r.code == 0, r
    titles = [c["title"] for c in calls]
    assert len(titles) == 6
    for t in titles[:2]:  # the source alone: no translation, no log-prob
        assert t == "enc-self attention, encoder layer 2 of 2\n(subword level)"
    for t, kind, what in zip(titles[2:], ("cross", "cross", "dec-self", "dec-self"), ("the model's translation",
                                                                                      "given target") * 2):
        assert re.fullmatch(rf"{kind} attention, decoder layer 2 of 2\n\(subword level; target: {what}, "
                            r"log-prob -\d+\.\d\d\)", t), t


def test_attention_lines_draw_one_head_unless_heads_says(setup, run_cli, tmp_path, monkeypatch):  # noqa: F811
    data, ckpt, _, _ = setup
    calls = _drawn(monkeypatch)
    base = ("attention", data, "--path", ckpt, "--max-len-b", "6", "--threads", "1", "--source", "der Hund läuft",
            "--kind", "enc-self", "-o", tmp_path / "h.png")
    for extra in ((), ("--heads", "all"), ("--heads", "2,3"), ("--heads", "4")):
        assert run_cli(*base, "--style", "lines", *extra).code == 0
    assert run_cli(*base).code == 0  # a heatmap grid: every head
    assert run_cli(*base, "--heads", "3").code == 0
    assert [(c["style"], c["heads"], c["weights"].shape[0]) for c in calls] == [
        ("lines", [1], 1), ("lines", [1, 2, 3, 4], 4), ("lines", [2, 3], 2), ("lines", [4], 1),
        ("heatmap", [1, 2, 3, 4], 4), ("heatmap", [3], 1)]
    # the arrays keep every head whatever the style
    r = run_cli(*base[:-2], "--style", "lines", "--format", "json", "-o", tmp_path / "h.json")
    assert r.code == 0, r
    import json

    assert json.loads((tmp_path / "h.json").read_text())["heads"] == [1, 2, 3, 4]


def test_attention_query_takes_a_position_or_a_token(setup, run_cli, tmp_path, monkeypatch):  # noqa: F811
    data, ckpt, _, _ = setup
    calls = _drawn(monkeypatch)
    base = ("attention", data, "--path", ckpt, "--max-len-b", "6", "--threads", "1", "--kind", "enc-self",
            "--style", "lines", "-o", tmp_path / "q.png")
    for level, query in (("words", "Hund"), ("words", "1"), ("words", "</s>"), ("subword", "2")):
        r = run_cli(*base, "--source", "der Hund läuft", "--level", level, "--query", query)
        assert r.code == 0, r
    assert [c["rows"][c["query"]] for c in calls[:3]] == ["Hund", "Hund", "</s>"]
    assert calls[1]["query"] == 1 and calls[3]["query"] == 2
    # the subword level: a piece as labelled, or its text without "▁"; per sentence its own position
    pieces = calls[3]["rows"]
    word = next(p for p in pieces if p.startswith("\u2581") and len(p) > 1 and pieces.count(p) == 1
                and p[1:] not in pieces)  # an exact label is found first
    for q in (word, word[1:]):
        n = len(calls)
        r = run_cli(*base, "--source", "der Hund läuft", "--source", "läuft der Hund", "--query", q)
        assert r.code == 0, r
        assert [c["rows"][c["query"]] for c in calls[n:]] == [word, word]
        assert calls[n]["query"] < calls[n + 1]["query"]  # the word comes later in the second sentence


def test_attention_words_split_glued_punctuation_and_alignments_keep_whitespace_words(setup, run_cli, tmp_path):  # noqa: F811
    import json

    from nmtkit import Translator

    data, ckpt, _, _ = setup
    out = tmp_path / "p.json"
    r = run_cli("attention", data, "--path", ckpt, "--max-len-b", "6", "--threads", "1", "--source", "(der) Hund.",
                "--kind", "enc-self", "--level", "words", "--format", "json", "-o", out)
    assert r.code == 0, r
    (s,) = json.loads(out.read_text())["sentences"]
    assert s["rows"] == s["columns"] == ["(", "der", ")", "Hund", ".", "</s>"]
    np.testing.assert_allclose(np.array(s["weights"]).sum(-1), 1.0, atol=1e-5)
    tr = Translator.load(ckpt, data, threads=1, max_len_b=6, warn=lambda m: None)
    a = tr.attention("(der) Hund.")
    assert a.words().source_tokens == ["(der)", "Hund.", "</s>"]  # Python's words(): the whitespace words
    p = a.words(split_punctuation=True)
    assert p.source_tokens == s["rows"] and p.level == "words"
    np.testing.assert_allclose(p.enc_self[-1], np.array(s["weights"]), atol=1e-6)
    np.testing.assert_allclose(p.cross.sum(-1), 1.0, atol=1e-5)
    assert p.dec_self.shape[-1] == len(p.decoder_inputs) == len(p.target_tokens)
    # generate's word alignment still counts whitespace words: "Hund." is source word 1
    assert word_index(tr.source_pieces(tr.encode(["(der) Hund."])[0]), "sentencepiece")[-1] == 1


@pytest.mark.parametrize("args,needle", [
    (("--source", "der Hund", "--layer", "3"), r"--layer 3 is out of range: the model has 2 decoder layers \(1\.\.2, "),
    (("--source", "der Hund", "--kind", "enc-self", "--layer", "0"),
     r"--layer is 1-based \(1 = the lowest layer\), got 0$"),  # refused before the model is loaded
    (("--source", "der Hund", "--heads", "2,5"),
     r"--heads 5 is out of range: the model has 4 heads in each decoder layer \(1\.\.4\)$"),
    (("--source", "der Hund", "--heads", "5,6"), r"--heads 5,6 are out of range: the model has 4 heads .*\(1\.\.4\)$"),
    (("--source", "der Hund", "--kind", "enc-self", "--heads", "0,2,7"),
     r"--heads are 1-based \(1 = the first head\), got 0$"),  # refused before the model is loaded
    (("--source", "der Hund", "--kind", "enc-self", "--heads", "2,7,9"),
     r"--heads 7,9 are out of range: the model has 4 heads in each encoder layer \(1\.\.4\)$"),
    (("--source", "der Hund", "--style", "lines", "--heads", "all,2"), r"--heads takes head numbers"),
    (("--source", "der Hund", "--heads", "x"), r"--heads takes head numbers"),
    (("--source", "der Hund", "--source", " "), r"--source 2: empty source sentence"),
    (("--source", "der Hund", "--target", "the zzzq"), r"--target 1: target token\(s\) .* not in the target dictionary"),
    (("--source", "a", "--source", "b", "--target", "the"), r"--target: 1 given for 2 --source sentences"),
    (("--gen-subset", "test", "--index", "99"), r"--index 99: split 'test' has 7 sentences \(0\.\.6\)"),
    (("--gen-subset", "test"), r"--gen-subset needs --index N"),
    (("--source", "der", "--kind", "self"), r"--kind must be one of enc-self, dec-self, cross, got 'self'"),
    ((), r"give a sentence: --source TEXT"),
    (("--source", "der Hund", "--query", "1"), r"--query applies to --style lines"),
    (("--source", "der Hund", "--style", "lines", "--query", "99"), r"--query 99: --source 1 has \d+ query tokens"),
    (("--source", "der Hund", "--kind", "enc-self", "--style", "lines", "--query", "-1"),
     r"--query is a 0-based token position, got -1$"),  # refused before the model is loaded
    (("--source", "der Hund", "--kind", "enc-self", "--style", "lines", "--query", " "), r"--query takes a 0-based"),
    (("--source", "Hund Hund Katze", "--kind", "enc-self", "--level", "words", "--style", "lines", "--query", "Hund"),
     (r"--query 'Hund': --source 1 has it 2 times among its query tokens at the words level, at positions 0, 1: "
      r"give the one you mean, e.g. --query 0$")),
    (("--source", "der Hund", "--kind", "enc-self", "--level", "words", "--style", "lines", "--query", "Katze"),
     (r"--query 'Katze': --source 1 has no such query token at the words level; its 3 query tokens are "
      r"0:der 1:Hund 2:</s> \(give a token or its position\)$")),
    (("--source", "der Hund", "--style", "arrows"), r"--style must be one of heatmap, lines"),
])
def test_attention_command_bad_input(setup, run_cli, tmp_path, args, needle):  # noqa: F811
    data, ckpt, _, _ = setup
    out = tmp_path / "x.png"
    r = run_cli("attention", data, "--path", ckpt, "--max-len-b", "6", *args, "-o", out)
    assert r.code == 2, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert re.search(needle, r.err), r.err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_attention_command_without_matplotlib_says_which_extra(setup, run_cli, tmp_path, monkeypatch):  # noqa: F811
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    data, ckpt, _, _ = setup
    r = run_cli("attention", data, "--path", ckpt, "--source", "der Hund", "-o", tmp_path / "x.png")
    assert r.code == 2 and "pip install -e '.[plot]' in the nmtkit checkout" in r.err and len(r.err.strip().splitlines()) == 1, r
    r = run_cli("attention", data, "--path", ckpt, "--source", "der Hund", "--format", "json", "-o", tmp_path / "x.json")
    assert r.code == 0, r  # arrays need no matplotlib


def test_docs_python_example_runs(setup, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, ckpt, _, _ = setup
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "avg5.pt").symlink_to(ckpt)
    (tmp_path / "data-bin").symlink_to(data, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    text = (Path(__file__).resolve().parents[1] / "docs" / "inspect.md").read_text(encoding="utf-8")
    code = re.search(r"## Python\n\n```python\n(.*?)```", text, re.DOTALL).group(1)
    scope: dict = {}
    exec(compile(code, "docs/inspect.md", "exec"), scope)  # noqa: S102 - the documented example itself
    s, a, w = scope["s"], scope["a"], scope["w"]
    assert s.tokens == len(s.positional_scores) and a.target_given and w.level == "words"
    assert scope["head_mean"].shape == (len(a.target_tokens), len(a.source_tokens))
    assert capsys.readouterr().out.strip()


def test_parsing_data_dir_scores_its_split_and_refuses_word_alignments(parsing_dir, run_cli, tmp_path):  # noqa: F811
    _, data, _ = parsing_dir
    ckpt = make_checkpoint(data, tmp_path / "p.pt")
    r = run_cli("generate", data, "--path", ckpt, "--score-reference", "--print-alignment", "--quiet", "--threads", "1")
    assert r.code == 0, r
    rows = [x.split("\t") for x in lines(r.out)]
    assert rows and all(len(x) == 4 and float(x[0]) < 0 for x in rows)
    out = tmp_path / "o"
    r = run_cli("generate", data, "--path", ckpt, "--print-alignment", "words", "--max-len-b", "5", "-o", out, "--quiet")
    assert r.code == 2 and "a parsing model's output is a tree" in r.err and not out.exists(), r


def test_score_reference_reads_the_source_from_stdin(copier, run_cli, tmp_path, monkeypatch):
    import io
    import sys

    data, ckpt = copier
    src, ref = tmp_path / "s", tmp_path / "r"
    src.write_text("w1 w2 w3\nw4\n")
    ref.write_text("W1 W2 W3\nW5\n")
    args = ("--path", ckpt, "--score-reference", "--reference", ref, "--quiet", "--threads", "1")
    want = lines(run_cli("generate", data, "--input", src, *args).out)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(src.read_bytes())))
    got = lines(run_cli("generate", data, "--input", "-", *args).out)
    assert got == want and len(got) == 2
    assert float(got[0].split("\t")[0]) > float(got[1].split("\t")[0])  # the copy beats the wrong word
