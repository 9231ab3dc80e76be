"""Terminology from text: `Translator.translate(constraints=, avoid=, prefix=, ordered=)`,
`nmtkit generate --constraints/--avoid/--prefix`, `nmtkit serve`'s per-sentence fields, the
engines' refusal and the one-line errors naming the sentence (tiny model of test_generate.py)."""

from __future__ import annotations

import pytest

from nmtkit.errors import UserError
from tests.test_generate import COMMON, lines, setup  # noqa: F401 - fixture

SENTS = ["der Hund läuft", "zwei rot Katze springt", "die Straße", "Kind"]


@pytest.fixture(scope="module")
def tr(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    return Translator.load(ckpt, data, threads=1, max_len_b=8, warn=lambda msg: None)


def pieces_of(tr, text):
    return " ".join(tr.tgt_subword.encode(text))


def test_constraints_appear_and_none_is_todays_output(tr):
    plain = tr.translate(SENTS)
    assert tr.translate(SENTS, constraints=None) == plain
    assert tr.translate(SENTS, constraints=[[]] * len(SENTS), avoid=[None] * len(SENTS)) == plain
    rows = tr.translate_nbest(SENTS, constraints=[["blue street"], ["house"], ["red", "dog"], None], nbest=2)
    for row, want in zip(rows, [["blue street"], ["house"], ["red", "dog"], []]):
        for t in row:
            assert all(pieces_of(tr, w) in " ".join(t.pieces) for w in want), (want, t.pieces)
    assert [r[0].text for r in rows][3] == plain[3]


def test_avoid_and_prefix(tr):
    plain = tr.translate(SENTS)
    word = plain[0].split()[0]
    out = tr.translate(SENTS, avoid=[[word]] * len(SENTS), prefix=["a big", None, None, "the"])
    assert all(word not in o.split() for o in out)
    assert out[0].startswith("a big") and out[3].startswith("the")


@pytest.mark.parametrize("kwargs,message", [
    (dict(constraints=[[""], None, None, None]), "sentence 1: constraint 1 is empty"),
    (dict(constraints=[None, ["€€€"], None, None]), "sentence 2: constraint 1 '€€€' has subword(s)"),
    (dict(constraints=[None, None, ["dog", "cat", "red", "big"], None]), "sentence 3: 4 constraint(s) need a beam of at least 5"),
    (dict(constraints=[None, None, None, ["dog " * 12]]), "sentence 4: the prefix and constraints take"),
    (dict(constraints=[["big dog"], None, None, None], avoid=[["dog"], None, None, None]), "constraint 1 contains an avoided phrase"),
    (dict(constraints=[["dog"]]), "constraints must be a list with one entry per sentence (4)"),
    (dict(constraints=[["dog"], None, None, None], sampling=True), "sentence 1: constraints, avoided phrases and prefixes need beam search"),
])
def test_bad_terms_are_one_line_naming_the_sentence(tr, kwargs, message):
    with pytest.raises(UserError) as e:
        tr.translate(SENTS, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unsatisfiable_under_the_rules_is_said(tr):
    with pytest.raises(UserError, match="sentence 1: no output within the output limit"):
        tr.translate(SENTS[:1], constraints=[["dog dog dog"]], no_repeat_ngram_size=1)


def test_avoid_blocks_every_spelling(tr):
    from nmtkit.generation.terms import TermMaker
    from tests.test_terms import spellings

    tm = TermMaker(tr.tgt_subword, tr.tgt_dict)
    (graph,) = tm.make(None, ["street"], None, False, "s").avoid
    every = spellings(graph)
    canonical = tuple(int(i) for i in tr.tgt_dict.encode(tr.tgt_subword.encode("street")))
    assert canonical in every and len(every) > 1
    for ids in every:  # each spells the same text
        assert "".join(tr.tgt_dict.string(ids)) == "".join(tr.tgt_subword.encode("street"))
    # a long phrase: over 10,000 spellings in a graph of under 100 edges (the search blocks a
    # graph's every spelling: tests/test_terms.py)
    (graph,) = tm.make(None, ["street " * 6], None, False, "s").avoid
    count = [1] + [0] * graph.end  # spellings reaching each position
    for i, j, _ in sorted(graph.edges):
        count[j] += count[i]
    assert count[-1] > 10_000 and len(graph.edges) < 100


# ------------------------------------------------------------------------ nmtkit generate


def test_generate_reads_fairseq_constraints_avoid_and_prefix(setup, tr, tmp_path, run_cli):  # noqa: F811
    data, ckpt, _, _ = setup
    src = tmp_path / "in.de"
    src.write_text("der Hund läuft\tblue street\nzwei rot Katze springt\thouse\n\nKind\n", encoding="utf-8")
    (tmp_path / "avoid.txt").write_text("cat\n\nred\n", encoding="utf-8")
    (tmp_path / "prefix.en").write_text("\nthe\n\n\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", src, "--constraints", "--avoid", tmp_path / "avoid.txt",
                "--prefix", tmp_path / "prefix.en", "--max-len-b", "8", *COMMON[2:])
    assert r.code == 0, r
    want = tr.translate(["der Hund läuft", "zwei rot Katze springt", "", "Kind"],
                        constraints=[["blue street"], ["house"], None, None], avoid=[["cat", "red"]] * 4,
                        prefix=[None, "the", None, None])
    assert lines(r.out) == want
    assert "blue street" in want[0] and want[1].startswith("the")


@pytest.mark.parametrize("text,extra,message", [
    ("der Hund\tdog\nKind\tred\t\n", (), "in.de:2: constraint 2 is empty"),
    ("der Hund\n\tdog\n", (), "in.de:2: an empty sentence has no translation to constrain"),
    ("der Hund\tdog\tcat\tred\n", (), "in.de:1: 3 constraint(s) need a beam of at least 4"),
    ("der Hund\tdog\n", ("--constraints", "sorted"), "--constraints must be unordered"),
])
def test_generate_refuses_bad_constraints_naming_the_line(setup, tmp_path, run_cli, text, extra, message):  # noqa: F811
    data, ckpt, _, _ = setup
    src = tmp_path / "in.de"
    src.write_text(text, encoding="utf-8")
    flags = extra or ("--constraints",)
    r = run_cli("generate", data, "--path", ckpt, "--input", src, *flags, "--beam", "3", *COMMON)
    assert r.code == 2, r
    err = [x for x in r.err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("nmtkit: error: ") and message in err[0], r.err


def test_generate_prefix_file_must_match_the_input(setup, tmp_path, run_cli):  # noqa: F811
    data, ckpt, _, _ = setup
    (tmp_path / "in.de").write_text("der Hund\nKind\n", encoding="utf-8")
    (tmp_path / "p.en").write_text("the\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", tmp_path / "in.de", "--prefix", tmp_path / "p.en", *COMMON)
    assert r.code == 2 and "--prefix" in r.err and "has 1 lines" in r.err, r


@pytest.mark.parametrize("flag", ["--avoid", "--prefix"])
def test_a_missing_terms_file_is_one_line_naming_its_flag(setup, tmp_path, run_cli, flag):  # noqa: F811
    data, ckpt, _, _ = setup
    (tmp_path / "in.de").write_text("der Hund\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", tmp_path / "in.de", flag, tmp_path / "nope.txt", *COMMON)
    assert r.code == 2 and r.err.strip() == f"nmtkit: error: {flag} {tmp_path / 'nope.txt'}: not found", r
    r = run_cli("generate", data, "--path", ckpt, "--input", tmp_path / "in.de", flag, tmp_path, *COMMON)
    assert r.code == 2 and r.err.strip() == f"nmtkit: error: {flag} {tmp_path}: not a file", r


# ------------------------------------------------------------------------ engines


def test_an_engine_without_a_constrained_search_refuses_in_one_line(tr, monkeypatch):
    from nmtkit.backends.registry import engine_class

    ct2 = engine_class("ctranslate2")
    assert not ct2.constraints and type(tr.engine).constraints
    with pytest.raises(UserError, match="^constraints, avoided phrases and target prefixes: CTranslate2 has no "
                                        "constrained search"):
        ct2.require_terms()
    monkeypatch.setattr(type(tr.engine), "constraints", False)
    with pytest.raises(UserError, match="nmtkit has no constrained search"):
        tr.translate(SENTS, prefix=["the", None, None, None])
    assert tr.translate(SENTS) == tr.translate(SENTS, prefix=[None] * 4)  # nothing asked, nothing refused


# ------------------------------------------------------------------------ nmtkit serve


@pytest.fixture(scope="module")
def term_server(setup):  # noqa: F811
    from nmtkit.search.config import SearchConfig
    from tests.test_serve import options, running

    data, ckpt, _, _ = setup
    with running(options(data, ckpt, max_wait_ms=200, search=SearchConfig(max_len_b=8))) as s:
        yield s


def test_serve_per_sentence_fields_equal_the_api(term_server, tr):
    import json

    from tests.test_serve import send

    url, _, _ = term_server
    terms = dict(constraints=[["blue street"], ["house", "dog"], None, None], avoid=[None, None, ["red"], None],
                 prefix=[None, None, None, "the"], ordered=True)
    # sent together, so that they may share a batch with a plain request: each gets its own answer
    conns = [send(url, {"text": SENTS, **terms}), send(url, {"text": SENTS})]
    got = [json.loads(c.getresponse().read()) for c in conns]
    assert got[0]["translations"] == tr.translate(SENTS, **terms)
    assert got[1]["translations"] == tr.translate(SENTS)


@pytest.mark.parametrize("extra,message", [
    ({"constraints": [["dog"]]}, '"constraints" must be a list with one entry per sentence of "text" (4)'),
    ({"avoid": [None, "red", None, None]}, '"avoid"[1] must be null or a list of strings'),
    ({"prefix": [None, ["the"], None, None]}, '"prefix"[1] must be null or a string'),
    ({"ordered": "yes", "constraints": [None] * 4}, '"ordered" must be true or false'),
    ({"constraints": [None, [" "], None, None]}, '"text"[1]: constraint 1 is empty'),
    ({"constraints": [None, None, ["dog", "cat"], None], "beam": 2}, "sentence 3: 2 constraint(s) need a beam of at least 3"),
])
def test_serve_refuses_bad_terms_with_400_naming_the_sentence(term_server, extra, message):
    from tests.test_serve import post

    url, _, _ = term_server
    r = post(url, {"text": SENTS, **extra})
    assert r.status_code == 400 and message in r.json()["error"], r.json()


def test_avoid_blocks_every_subword_nmt_spelling():
    """subword-nmt: every piece but a word's last carries @@; each word is split on its own."""
    from nmtkit.data.dictionary import Dictionary
    from nmtkit.generation.terms import TermMaker

    d = Dictionary()
    for sym in ("ab@@", "a@@", "b@@", "b", "c", "ab", "bc", "x@@"):
        d.add_symbol(sym)

    class Words:  # the canonical segmentation is not used for avoided phrases
        kind = "subword-nmt"

        def encode(self, text):
            return text.split()

    from tests.test_terms import spellings

    def every(text):
        (graph,) = TermMaker(Words(), d).make(None, [text], None, False, "s").avoid
        return {tuple(d.string(ids)) for ids in spellings(graph)}

    assert every("ab c") == {("ab", "c"), ("a@@", "b", "c")}
    assert every("abc") == {("ab@@", "c"), ("a@@", "bc"), ("a@@", "b@@", "c")}
    assert TermMaker(Words(), d).make(None, ["zz"], None, False, "s") is None  # no spelling: nothing to block


    class MosesWords(Words):  # a data directory with a Moses step before its subword model
        def tokenize(self, text):
            return text.replace(".", " .")

    assert TermMaker(MosesWords(), d).make(None, ["ab."], None, False, "s") is None  # no "." piece yet
    d.add_symbol(".")
    (graph,) = TermMaker(MosesWords(), d).make(None, ["ab."], None, False, "s").avoid
    assert {tuple(d.string(ids)) for ids in spellings(graph)} == {("ab", "."), ("a@@", "b", ".")}
