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


@pytest.mark.parametrize("flag", ["--avoid", "--prefix", "--shortlist", "--input"])
def test_a_missing_input_file_is_one_line_naming_its_flag(setup, tmp_path, run_cli, flag):  # noqa: F811
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


# --- property tests (Hypothesis) ---
# A --constraints line is its source, then its tab-separated phrases, each field as written (an
# empty one too: refused later as an empty constraint naming the line) and the line's end (LF,
# CRLF, CRs) part of none. `nmtkit generate`'s input with --constraints, --avoid and --prefix, of
# any lines (tabs, empty fields, only tabs, CR, any character, bytes that are not UTF-8, files of
# unequal length), gives each sentence the phrases of its own lines (what `Translator.terms`
# makes of them), or stops at the first bad line with one line naming file:line.

import dataclasses  # noqa: E402
import re  # noqa: E402

from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nmtkit.generation.inputs import InputSpec, text_items  # noqa: E402
from nmtkit.generation.terms import split_line  # noqa: E402
from tests.test_generate import DE, EN  # noqa: E402

# a field of a line: any character but the tab and the newline, the tricky ones often
FIELD_CHARS = st.one_of(st.characters(exclude_categories=["Cs"], exclude_characters="\t\n"),
                        st.sampled_from("\r\x00\ufeff\u2028\x85\x0b\x1c é€😀"))
FIELD = st.text(FIELD_CHARS, max_size=8)
ENDS = st.sampled_from(["", "\n", "\r\n", "\r", "\r\r\n"])


def _ends_clean(text: str) -> bool:
    return not text.endswith("\r")  # a CR at the very end is the line's end (CRLF), not text


@pytest.mark.fuzz
@given(fields=st.lists(FIELD, min_size=1, max_size=5).filter(lambda f: _ends_clean(f[-1])), end=ENDS)
@example(fields=["", "", ""], end="\r\n")  # only tabs: an empty source and two empty phrases
def test_split_line_gives_the_source_then_every_tab_separated_field(fields, end):
    assert split_line("\t".join(fields) + end) == (fields[0], fields[1:])


@pytest.mark.fuzz
@given(line=st.text(st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from("\t\r\n")), max_size=16))
def test_split_line_of_any_text_splits_at_the_tabs_only(line):
    source, phrases = split_line(line)
    assert "\t".join([source, *phrases]) == line.rstrip("\r\n") and not any("\t" in f for f in [source, *phrases])


SOURCE = st.one_of(st.lists(st.sampled_from(DE), max_size=3).map(" ".join), FIELD)
WORDS = st.lists(st.sampled_from(EN), min_size=1, max_size=2).map(" ".join)
PHRASE = st.one_of(WORDS, WORDS, WORDS, st.sampled_from(["", " "]), FIELD)  # mostly phrases the model can spell
NOT_UTF8 = st.sampled_from([b"\xff", b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])


@dataclasses.dataclass
class TermFile:
    """One file of lines (their text, each ending clean), written with `end` after each line
    (none after the last unless `final`) and with `bad` bytes inserted into one line."""

    lines: list[str]
    end: str = "\n"
    final: bool = True
    bad: tuple[int, int, bytes] | None = None  # (line, byte offset, bytes that are not UTF-8)

    def data(self) -> bytes:
        raw = [s.encode("utf-8") for s in self.lines]
        if self.bad is not None:
            i, at, b = self.bad
            raw[i] = raw[i][:at] + b + raw[i][at:]
        end = self.end.encode()
        return end.join(raw) + (end if raw and self.final else b"")

    def error(self, name: str) -> tuple[int, str] | None:
        """(0-based line, read_lines' message) of the bad line, or None."""
        if self.bad is None:
            return None
        i = self.bad[0]
        raw = self.data().split(self.end.encode())[i]
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return i, f"{name}:{i + 1}: invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
        return None  # the bytes completed a character: not bad after all


@st.composite
def term_files(draw, line: st.SearchStrategy, n: int | None = None) -> TermFile:
    lines = draw(st.lists(line.filter(_ends_clean), min_size=n or 0, max_size=n if n is not None else 4))
    f = TermFile(lines, draw(st.sampled_from(["\n", "\r\n"])), draw(st.booleans()) or not lines or lines[-1] == "")
    if lines and draw(st.integers(0, 7)) == 0:
        i = draw(st.integers(0, len(lines) - 1))
        f.bad = (i, draw(st.integers(0, len(lines[i].encode()))), draw(NOT_UTF8))
    return f


@st.composite
def term_inputs(draw) -> tuple[TermFile, str | None, TermFile | None, TermFile | None]:
    """(input, --constraints, --avoid file, --prefix file): the input's lines a source and its
    phrases, tab-separated; a glossary of phrases, blank lines and whitespace; prefixes, one per
    input line, or one more or fewer."""
    constraints = draw(st.sampled_from([None, "unordered", "ordered"]))
    line = st.tuples(SOURCE, st.lists(PHRASE, max_size=3)).map(lambda t: "\t".join([t[0], *t[1]]))
    source = draw(term_files(line))
    avoid = draw(st.none() | term_files(st.one_of(PHRASE, st.sampled_from(["", "  ", "\t"]))))
    n = len(source.lines) + draw(st.sampled_from([0, 0, 0, -1, 1]))
    prefix = draw(st.none() | term_files(st.one_of(PHRASE, st.just("")), max(0, n)))
    return source, constraints, avoid, prefix


def expected_items(tr, files: dict, spec: InputSpec) -> tuple[list, str | None]:
    """What text_items must give of `files` ({"in": TermFile, "avoid": ..., "prefix": ...}):
    (source, terms) per sentence, then the message that stops it (or None). Each sentence's
    phrases are those of its lines, checked by `Translator.terms` itself."""
    out: list = []
    glossary = None
    if spec.avoid:
        bad = files["avoid"].error(spec.avoid)
        if bad is not None:
            return out, bad[1]
        glossary = [s.strip() for s in files["avoid"].lines if s.strip()]
        if not glossary:
            return out, f"--avoid {spec.avoid}: no phrase in the file (one phrase per line)"
    src, pre = files["in"], files.get("prefix")
    bad_src = src.error(spec.text)
    bad_pre = pre.error(spec.prefix) if pre is not None else None
    for i, line in enumerate(src.lines):
        if bad_src and bad_src[0] == i:
            return out, bad_src[1]
        fields = line.split("\t") if spec.constraints else [line]
        prefix = None
        if pre is not None:
            if bad_pre and bad_pre[0] == i:
                return out, bad_pre[1]
            if i >= len(pre.lines):
                return out, f"--prefix {spec.prefix} has {i} lines but --input {spec.text} has more"
            prefix = pre.lines[i]
        try:
            terms = tr.terms(fields[1:] or None, glossary, prefix, spec.constraints == "ordered",
                             f"{spec.text}:{i + 1}")
        except UserError as e:
            return out, str(e)
        out.append((fields[0], terms))
    if pre is not None and len(pre.lines) > len(src.lines):
        bad = bad_pre and bad_pre[0] == len(src.lines)  # the line after the input's end is read, once
        return out, bad_pre[1] if bad else f"--prefix {spec.prefix} has more lines than --input {spec.text}"
    return out, None


@pytest.fixture(scope="module")
def terms_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_terms")


@pytest.mark.fuzz
@given(case=term_inputs())
@example(case=(TermFile(["der Hund\t\tdog", "\t\t", "Kind\tred\r\x00"], "\r\n"), "unordered",
               TermFile(["", " cat\t", "\u2028"]), TermFile(["the", "", "a"], final=False)))
def test_generate_terms_files_give_each_line_its_phrases_or_one_line_naming_file_and_line(tr, terms_dir, case):
    source, constraints, avoid, prefix = case
    files = {"in": source, "avoid": avoid, "prefix": prefix}
    paths = {}
    for name, f in files.items():
        if f is not None:
            paths[name] = terms_dir / f"{name}.txt"
            paths[name].write_bytes(f.data())
    spec = InputSpec(text=str(paths["in"]), split=None, data_dir=None, constraints=constraints,
                     avoid=str(paths["avoid"]) if "avoid" in paths else None,
                     prefix=str(paths["prefix"]) if "prefix" in paths else None)
    want, error = expected_items(tr, files, spec)
    got = []
    try:
        for it in text_items(spec, tr, tr.truncations(spec.line_name, spec.name)):
            got.append((it.text, it.terms))
    except UserError as e:
        msg = str(e)
        event("refused: " + re.sub(r"^\S*:\d+: ", "FILE:LINE: ", msg.replace(str(terms_dir), ""))[:40])
        assert msg == error and "\n" not in msg and "\r" not in msg, (msg, error)
        assert any(msg.startswith(f"{p}:") or f" {p}" in msg for p in map(str, paths.values())), msg  # names its file
    else:
        event(f"{len(got)} sentences")
        assert error is None, error
    assert got == want


class CountingDictionary:
    """A Dictionary's symbols and lookups, counting the lookups."""

    def __init__(self, d):
        self.d, self.symbols, self.unk, self.lookups = d, d.symbols, d.unk, 0

    def index(self, sym: str) -> int:
        self.lookups += 1
        return self.d.index(sym)


@pytest.mark.fuzz
@given(words=st.lists(st.one_of(st.sampled_from(EN), FIELD.filter(str.strip)), min_size=1, max_size=6))
@example(words=["street"] * 500)  # 3,000 characters: 7 s of lookups before (cubic), on the server's event loop too
def test_an_avoided_phrase_has_every_spelling_in_lookups_linear_in_its_length(tr, words):
    from nmtkit.generation.terms import TermMaker, _on_paths

    phrase = " ".join(words)
    d = CountingDictionary(tr.tgt_dict)
    terms = TermMaker(tr.tgt_subword, d).make(None, [phrase], None, False, "s")
    w = "".join(tr.tgt_subword.encode(phrase))  # sentencepiece: the pieces joined, word starts marked
    assert d.lookups <= len(w) * max(map(len, tr.tgt_dict.symbols))
    if len(w) < 200:  # the graph of every piece spelling any part of it (cubic: short phrases only)
        every = [(i, j, v) for i in range(len(w)) for j in range(i + 1, len(w) + 1)
                 if (v := tr.tgt_dict.index(w[i:j])) > tr.tgt_dict.unk]
        assert (terms.avoid[0] if terms else None) == _on_paths(every, len(w))
