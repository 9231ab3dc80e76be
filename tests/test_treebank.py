"""Treebank reading, normalization, WSJ splits and the prepared parallel files.

Synthetic treebanks (written to tmp_path) check the layouts and the split rules by hand; the NLTK
sample in ../shared/data/ptb (skipped when absent) checks the real files: PROVENANCE.md gives
199 files, 3914 trees and 94084 real words.
"""

from __future__ import annotations

import gzip
import zipfile

import pytest

from nmtkit.errors import UserError
from nmtkit.io import read_lines
from nmtkit.parsing.prepare import prepare_splits, split_paths, write_split
from nmtkit.parsing.treebank import (
    SPLIT_SCHEMES,
    Document,
    get_split_scheme,
    load_treebank,
    normalize_tree,
    parse_treebank_text,
    read_documents,
    split_documents,
    wsj_number,
)
from nmtkit.parsing.trees import Tree
from nmtkit.scoring.parseval import evaluate
from tests.conftest import WSJ_MRG, WSJ_NORM, shared_file

MRG = WSJ_MRG
NORM1, NORM2 = WSJ_NORM


def norm(text: str) -> str | None:
    t = normalize_tree(Tree.parse(text))
    return None if t is None else t.to_string()


# ----------------------------------------------------------------------------- normalization


def test_normalization_cases():
    # function tags and co-indices go; POS tags (even -LRB-, PRP$, -NONE-like) stay as they are
    assert norm("( (S (NP-SBJ-1 (PRP$ his) (NN dog)) (PP-LOC=2 (IN in) (NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-)))) )") == (
        "(TOP (S (NP (PRP$ his) (NN dog)) (PP (IN in) (NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-)))))"
    )
    # -NONE- goes, and so does every constituent it leaves empty, up the tree
    assert norm("( (S (NP-SBJ (-NONE- *)) (VP (VB Go) (SBAR (-NONE- 0) (S (-NONE- *T*-1)))) (. .)) )") == (
        "(TOP (S (VP (VB Go)) (. .)))"
    )
    # root wrappers: unlabeled with or without a space, TOP, ROOT -> TOP; no wrapper -> wrapped
    for text in ("( (S (NN a)) )", "((S (NN a)))", "(TOP (S (NN a)))", "(ROOT (S (NN a)))", "(S (NN a))"):
        assert norm(text) == "(TOP (S (NN a)))", text
    # a wrapper with several children keeps them all under TOP
    assert norm("( (NP (NN a)) (. .) )") == "(TOP (NP (NN a)) (. .))"
    # nothing left: None
    assert norm("( (S (-NONE- *)) )") is None
    # the input tree is not changed
    t = Tree.parse("( (S (NP-SBJ (-NONE- *)) (VP (VB Go))) )")
    normalize_tree(t)
    assert t.to_string() == "( (S (NP-SBJ (-NONE- *)) (VP (VB Go))))"


# ----------------------------------------------------------------------------------- reading


def test_reading_multi_line_mrg_and_one_tree_per_line(tmp_path):
    trees = parse_treebank_text(MRG.splitlines(), "x.mrg")
    assert [normalize_tree(t).to_string() for t in trees] == [NORM1, NORM2]
    assert trees[0].children[0].children[0].label == "NP-SBJ-1"  # raw: not normalized on reading
    # the same trees one per line, gzipped, with an LDC banner line on top
    p = tmp_path / "a.trees.gz"
    with gzip.open(p, "wt") as f:
        f.write("*x*  Copyright (C) 1990 University of Pennsylvania  *x*\n")
        f.write("".join(t.to_string() + "\n" for t in trees))
    assert [t.to_string() for t in load_treebank(p)] == [t.to_string() for t in trees]


@pytest.mark.parametrize(
    "text, where",
    [
        ("( (S (NN a)) )\n( (S (NN b)\n", "not closed"),
        ("( (S (NN a)) )\nstray words\n", "line 2, column 1"),
        ("( (S (NN a)) ))\n", "line 1"),
    ],
)
def test_malformed_treebank_files_name_the_file_and_line(tmp_path, text, where):
    p = tmp_path / "bad.mrg"
    p.write_text(text)
    with pytest.raises(UserError, match="bad.mrg") as e:
        read_documents(p)
    assert where in str(e.value)


def test_wsj_number():
    assert wsj_number("wsj_0001.mrg") == 1
    assert wsj_number("/data/parsed/mrg/wsj/23/wsj_2345.mrg") == 2345
    assert wsj_number("wsj_2345.mrg.gz") == 2345
    assert wsj_number("treebank.zip:treebank/combined/wsj_0199.mrg") == 199
    for name in ("wsj_001.mrg", "wsj_0001.pos", "xwsj_0001.mrg", "train.trees"):
        assert wsj_number(name) is None, name


def _fake_ldc(root, sections=range(25)):
    """An LDC-style parsed/mrg/wsj folder: sections 00..24, two documents each, one tree per document
    whose only word names the document (so split membership is visible in the words)."""
    for sec in sections:
        d = root / f"{sec:02d}"
        d.mkdir(parents=True)
        for doc in (2, 1):  # written out of order on purpose
            num = sec * 100 + doc
            (d / f"wsj_{num:04d}.mrg").write_text(f"( (S (NN d{num:04d}) (-NONE- *)) )\n")
    return root


def test_standard_ptb_split_by_section(tmp_path):
    docs = read_documents(_fake_ldc(tmp_path / "wsj"))
    assert len(docs) == 50 and [d.number for d in docs][:4] == [1, 2, 101, 102]  # sorted by path
    assert docs[0].section == 0 and docs[-1].section == 24
    splits = split_documents(docs, "ptb")
    words = {k: [t.leaves()[0] for t in v] for k, v in splits.items()}
    assert words["train"] == [f"d{s * 100 + n:04d}" for s in range(2, 22) for n in (1, 2)]
    assert words["valid"] == ["d2201", "d2202"]
    assert words["test"] == ["d2301", "d2302"]
    # sections 00, 01 and 24 are in no split
    assert not {"d0001", "d0101", "d2401"} & {w for v in words.values() for w in v}


def test_split_errors(tmp_path):
    docs = read_documents(_fake_ldc(tmp_path / "wsj", sections=range(2, 23)))  # no section 23
    with pytest.raises(UserError, match="no documents for test"):
        split_documents(docs, "ptb")
    with pytest.raises(UserError, match="unknown treebank split 'wsj'; known: ptb, sample"):
        get_split_scheme("wsj")
    other = Document("mine.mrg", None, [Tree.parse("(S (NN a))")])
    with pytest.raises(UserError, match="mine.mrg: cannot assign it to a split"):
        split_documents([other], "sample")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no .mrg files in this folder"):
        read_documents(empty)
    with pytest.raises(UserError, match="file not found"):
        read_documents(tmp_path / "nope.mrg")


def test_reading_a_zip_without_extracting(tmp_path):
    z = tmp_path / "tb.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("treebank/combined/wsj_0190.mrg", MRG)
        zf.writestr("treebank/combined/wsj_0001.mrg", "( (S (NN first)) )\n")
        zf.writestr("treebank/tagged/wsj_0001.pos", "not a tree")
    docs = read_documents(z)
    assert [d.number for d in docs] == [1, 190] and [len(d.trees) for d in docs] == [1, 2]
    assert docs[1].name == f"{z}:treebank/combined/wsj_0190.mrg"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tb.zip"]  # nothing extracted
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"PK not really")
    with pytest.raises(UserError, match="cannot read zip"):
        read_documents(bad)


# ----------------------------------------------------------------------------------- prepare


def test_write_split_files(tmp_path):
    trees = parse_treebank_text(MRG.splitlines(), "x") + [Tree.parse("( (S (-NONE- *)) )")]
    st = write_split(trees, tmp_path / "train", "keep", split="train")
    assert (st.trees, st.sentences, st.dropped_empty, st.words) == (3, 2, 1, 14)
    paths = split_paths(tmp_path / "train")
    assert [p.name for p in paths.values()] == ["train.words", "train.lin", "train.gold.trees"]
    assert paths["words"].read_text() == "Pierre Vinken will join the board to win .\nMr. Vinken is chairman .\n"
    assert paths["lin"].read_text() == (
        "(S (NP NNP NNP )NP (VP MD (VP VB (NP DT NN )NP (S (VP TO (VP VB )VP )VP )S )VP )VP . )S\n"
        "(S (NP NNP NNP )NP (VP VBZ (NP NN )NP )VP . )S\n"
    )
    assert paths["gold"].read_text() == NORM1 + "\n" + NORM2 + "\n"
    # 2 tokens per constituent + 1 per word: 2*8+9 = 25 and 2*4+5 = 13
    assert (st.target_tokens, st.max_words, st.max_target_tokens) == (38, 9, 25)
    st = write_split(trees, tmp_path / "xx", "xx")
    assert split_paths(tmp_path / "xx")["lin"].read_text().splitlines()[1] == "(S (NP XX XX )NP (VP XX (NP XX )NP )VP XX )S"


def test_write_split_is_all_or_nothing(tmp_path):
    prefix = tmp_path / "valid"
    old = split_paths(prefix)["words"]
    old.write_text("previous\n")
    bad = [Tree.parse("( (S (NN a)) )"), Tree.parse("( (S (NP (DT the) dog)) )")]  # word under a phrase
    with pytest.raises(UserError, match="valid: tree 2: cannot linearize"):
        write_split(bad, prefix, split="valid")
    assert old.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["valid.words"]  # no temporary file left


@pytest.fixture(scope="module")
def sample_docs():
    return read_documents(shared_file("ptb", "treebank.zip"))


def test_sample_treebank_documents_and_split(sample_docs, tmp_path):
    assert [d.number for d in sample_docs] == list(range(1, 200))
    assert sum(len(d.trees) for d in sample_docs) == 3914  # PROVENANCE.md
    # the zip's multi-line trees are the trees of the one-tree-per-line copy
    oneline = list(read_lines(shared_file("ptb", "wsj_0001-0199.oneline.mrg.gz")))
    raw = [t for d in sample_docs for t in d.trees]
    assert [t.to_string() for t in raw] == [Tree.parse(line).to_string() for line in oneline]
    assert SPLIT_SCHEMES["sample"].split_of(179) == "train" and SPLIT_SCHEMES["sample"].split_of(180) == "valid"
    splits = split_documents(sample_docs, "sample")
    sizes = {d.number: len(d.trees) for d in sample_docs}
    expect = {
        "train": sum(sizes[n] for n in range(1, 180)),
        "valid": sum(sizes[n] for n in range(180, 190)),
        "test": sum(sizes[n] for n in range(190, 200)),
    }
    assert {k: len(v) for k, v in splits.items()} == expect == {"train": 3669, "valid": 127, "test": 118}
    assert splits["test"][0] is sample_docs[189].trees[0]  # wsj_0190 opens the test split
    # the standard split needs sections 02-23, which the sample (00-01) does not have
    with pytest.raises(UserError, match="no documents for train, valid, test"):
        split_documents(sample_docs, "ptb")

    stats = prepare_splits(splits, tmp_path, "keep")
    assert {k: s.sentences for k, s in stats.items()} == expect
    assert sum(s.words for s in stats.values()) == 94084 and not any(s.dropped_empty for s in stats.values())
    for name in ("train", "valid", "test"):
        paths = split_paths(tmp_path / name)
        words = list(read_lines(paths["words"]))
        lin = list(read_lines(paths["lin"]))
        gold = list(read_lines(paths["gold"]))
        assert len(words) == len(lin) == len(gold) == expect[name]
        assert all(g.startswith("(TOP (") for g in gold)
        assert [Tree.parse(g).leaves() for g in gold] == [w.split() for w in words]
    # the gold file scores 100 against itself with no warning about root conventions
    r = evaluate(gold, gold)
    assert r.all.f1 == 100.0 and r.all.valid == 118 and not r.warnings


# --- property tests (Hypothesis) ---
# Trees over any labels and words the bracket syntax can hold (unicode, NUL, NBSP, -LRB-, lone
# surrogates) are written and read back unchanged; any string is read as trees or refused in one
# line; a treebank file reads the same from a folder, a .zip and as text; write_split writes
# three files that read back to each other, or refuses in one line and writes nothing; trees
# 10,000 levels deep are read, written, compared and normalized without recursion.

import dataclasses  # noqa: E402

from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nmtkit.parsing.linearize import POS_MODES, delinearize, mask_tags  # noqa: E402
from nmtkit.parsing.trees import TreeError, read_trees  # noqa: E402

_NOT_IN_WORDS = " \t\n\r\f\v()"  # what ends a label or a word: ASCII whitespace and parentheses
_SPECIAL_WORDS = ["-LRB-", "-RRB-", "-LCB-", "-NONE-", "*T*-1", "0", "``", "''", ".", "<unk>", "TOP", "a\xa0b",
                  "\xa0", "\x85", "\u2028", "\x1c", "\x00", "\ufeff", "é", "𝔘", "NP-SBJ-1", "=2"]


def _word_chars(surrogates: bool):
    """Characters of labels and words; lone surrogates only where no file is written."""
    chars = st.characters(codec="utf-8", exclude_characters=_NOT_IN_WORDS)
    return st.one_of(chars, st.characters(categories=["Cs"])) if surrogates else chars


def _words(surrogates: bool = True):
    return st.one_of(st.sampled_from(_SPECIAL_WORDS), st.text(_word_chars(surrogates), min_size=1, max_size=5))


def _tree_of(shape: tuple) -> Tree:
    """(label, [child, ...]) -> Tree, a word staying a string. Trees are drawn as such shapes
    and built once: Hypothesis prints nested `st.builds` calls in time that grows too fast."""
    label, kids = shape
    return Tree(label, [_tree_of(k) if isinstance(k, tuple) else k for k in kids])


def _trees(words, max_leaves: int = 20):
    """Trees whose nodes have any labels (the empty one too) and any number of children."""
    labels = st.one_of(st.just(""), words)
    node = lambda kids: st.tuples(labels, st.lists(kids, max_size=4))  # noqa: E731
    return node(st.recursive(words, node, max_leaves=max_leaves)).map(_tree_of)


def _without_empty_words(t: Tree) -> Tree:
    return Tree(t.label, [_without_empty_words(c) if isinstance(c, Tree) else c for c in t.children if c != ""])


@pytest.mark.fuzz
@given(t=_trees(_words()))
@example(t=Tree("", [Tree("-LRB-", ["-LRB-"]), "\xa0", Tree("", [])]))
def test_a_tree_reads_back_from_its_string(t):
    text = str(t)
    assert Tree.parse(text) == t
    assert repr(Tree.parse(text)) == repr(t)


@pytest.mark.fuzz
@given(t=_trees(st.one_of(_words(), st.just(""))))
def test_empty_words_are_the_one_thing_a_string_cannot_hold(t):
    """An empty word is written as nothing, so it reads back as no word; all else is kept."""
    assert Tree.parse(str(t)) == _without_empty_words(t)


def _mutated(text: str, data) -> str:
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        text = text[:at] + data.draw(st.sampled_from(["", "(", ")", " ", "\n", "x", "(S ", "\xa0", "\x00"])) \
            + text[at + data.draw(st.integers(0, 2)):]
    return text


def _brackety(surrogates: bool = True):
    return st.text(st.one_of(st.sampled_from(list("()  \t\n\r\x0b\x0c")), _word_chars(surrogates)), max_size=40)


@pytest.mark.fuzz
@given(data=st.data(), kind=st.sampled_from(["tree", "mutated", "brackets", "text"]))
@example(data=None, kind="(NN a) b")
def test_any_string_is_read_as_trees_or_refused_in_one_line(data, kind):
    if data is None:
        text = kind
    elif kind in ("tree", "mutated"):
        text = " ".join(str(t) for t in data.draw(st.lists(_trees(_words(), 8), max_size=3)))
        text = _mutated(text, data) if kind == "mutated" else text
    else:
        text = data.draw(_brackety() if kind == "brackets" else st.text())
    try:
        t = Tree.parse(text)
    except TreeError as e:
        assert len(str(e).splitlines()) == 1, str(e)
        event("refused")
    else:
        assert Tree.parse(str(t)) == t
        event("read")


_BANNER_LINE = "*x*  Copyright (C) 1990 University of Pennsylvania  *x*"


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_treebank")


def _read(read, path) -> list[Tree] | str:
    """The trees `read(path)` gives, or its refusal's message (one line naming the file)."""
    try:
        return read(path)
    except UserError as e:
        assert len(str(e).splitlines()) == 1 and str(path) in str(e), str(e)
        return "refused"


@pytest.mark.fuzz
@given(data=st.data(), eol=st.sampled_from(["\n", "\r\n", "\r"]))
@example(data=None, eol="\n")  # NEL in a word: a line break to str.splitlines (the .zip reader), not to files
def test_a_treebank_reads_the_same_from_a_file_a_zip_and_text(fuzz_dir, data, eol):
    if data is None:
        lines = ["( (S (NN a\x85b)", "  (NN c\u2028d)) )"]
    else:
        pretty = st.builds(lambda t, n: str(t).replace(" ", "\n  ", n), _trees(_words(False), 8), st.integers(0, 9))
        lines = data.draw(st.lists(st.one_of(pretty, _brackety(False), st.just(_BANNER_LINE), st.just("")), max_size=4))
    text = eol.join(lines)
    mrg = fuzz_dir / "wsj_0001.mrg"
    mrg.write_bytes(text.encode("utf-8"))
    zipped = fuzz_dir / "tb.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("treebank/combined/wsj_0001.mrg", text.encode("utf-8"))
    from_file = _read(read_documents, mrg)
    from_zip = _read(read_documents, zipped)
    from_text = _read(lambda name: [Document(name, 1, parse_treebank_text(text.split("\n"), name))], "text")
    assert [d.trees for d in from_file] == [d.trees for d in from_zip] == [d.trees for d in from_text] \
        if from_file != "refused" else from_zip == from_text == "refused"
    event("read" if from_file != "refused" else "refused")


# raw treebank trees: PTB-like labels with function tags, -NONE- elements, words under phrases,
# empty constituents, and words with unicode spaces (which no line of words can hold as one word)
_TAGS = st.one_of(st.sampled_from(["NN", "DT", "-NONE-", ",", ".", "-LRB-", "PRP$", "<unk>", "", "N\xa0N"]),
                  _words(False))
_LABELS = st.one_of(st.sampled_from(["S", "NP-SBJ-1", "VP", "PP-LOC=2", "", "TOP", "ROOT", "-NONE-", "<x>"]),
                    _words(False))
_PRETERMINALS = st.tuples(_TAGS, st.lists(_words(False), min_size=1, max_size=1))
_RAW_TREES = st.tuples(_LABELS, st.lists(st.recursive(
    st.one_of(_PRETERMINALS, _PRETERMINALS, _words(False)),
    lambda kids: st.tuples(_LABELS, st.lists(kids, max_size=3)), max_leaves=12), max_size=3)).map(_tree_of)


@pytest.mark.fuzz
@given(trees=st.lists(_RAW_TREES, max_size=3), pos=st.sampled_from(POS_MODES))
@example(trees=[Tree.parse("( (S (NN a\xa0b)) )")], pos="keep")  # a ValueError (traceback) from delinearize
def test_write_split_writes_files_that_read_back_or_refuses_in_one_line(fuzz_dir, trees, pos):
    prefix = fuzz_dir / "train"
    paths = split_paths(prefix)
    for p in paths.values():
        p.unlink(missing_ok=True)
    try:
        stats = write_split(trees, prefix, pos, split="train")
    except UserError as e:
        assert len(str(e).splitlines()) == 1 and str(e).startswith("train: tree "), str(e)
        assert not any(p.exists() for p in paths.values())
        event("refused")
        return
    words, lin, gold = (list(read_lines(paths[k])) for k in ("words", "lin", "gold"))
    assert len(words) == len(lin) == len(gold) == stats.sentences == len(trees) - stats.dropped_empty
    for w, s, g in zip(words, lin, gold):
        tree = Tree.parse(g)
        assert tree.leaves() == w.split(" ") == w.split()
        assert delinearize(s, w, pos) == (tree if pos == "keep" else mask_tags(tree))
    event("written")


def test_a_word_with_a_unicode_space_is_refused_by_write_split(tmp_path):
    """A no-break space is a word character to the tree reader but a space to every line of
    words: linearize refuses the word (delinearize raised a ValueError, a traceback)."""
    with pytest.raises(UserError, match=r"^train: tree 1: cannot linearize it: word 'a\\xa0b' is empty or holds"):
        write_split([Tree.parse("( (S (NN a\xa0b)) )")], tmp_path / "train", split="train")
    assert list(tmp_path.iterdir()) == []


def test_a_zip_member_splits_lines_as_a_file_does(tmp_path):
    """str.splitlines also breaks at NEL, U+2028 and \\x1c-\\x1e, which a word may hold; the file
    reader breaks lines at \\n only, so the .zip reader does too."""
    text = "( (S (NN a\x85b) (NN c\u2028d) (NN e\x1cf)) )\n"
    z = tmp_path / "tb.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("wsj_0001.mrg", text)
    (tmp_path / "wsj_0001.mrg").write_text(text, encoding="utf-8")
    assert read_documents(z)[0].trees == read_documents(tmp_path / "wsj_0001.mrg")[0].trees
    assert read_documents(z)[0].trees[0].leaves() == ["a\x85b", "c\u2028d", "e\x1cf"]


# ---- deep trees ----

DEEP = 10_000


def test_trees_10000_levels_deep_are_read_written_compared_and_normalized(tmp_path):
    text = "( " + "(S " * DEEP + "(NN a)" + ")" * DEEP + " )"
    t = Tree.parse(text)
    assert t.height() == DEEP + 3 and t.leaves() == ["a"]
    assert Tree.parse(str(t)) == t and t != Tree.parse(str(t).replace("(NN a)", "(NN b)"))
    assert repr(t).startswith("Tree(label='', children=[Tree(label='S', children=[Tree(label='S'")
    assert normalize_tree(t).height() == DEEP + 3
    p = tmp_path / "deep.trees"
    p.write_text(text + "\n" + text + "\n", encoding="utf-8")
    assert [x == t for x in read_trees(p)] == [True, True]
    assert read_treebank_file_trees(p) == [t, t]
    stats = write_split([t], tmp_path / "deep", split="deep")
    assert stats.sentences == 1 and stats.max_target_tokens == 2 * DEEP + 1


def read_treebank_file_trees(path) -> list[Tree]:
    return [t for d in read_documents(path) for t in d.trees]


def test_dataclass_repr_and_eq_are_kept():
    """`Tree` writes its own __repr__ and __eq__ (no recursion); they agree with the dataclass's."""
    @dataclasses.dataclass
    class Reference:
        label: str
        children: list = dataclasses.field(default_factory=list)

    Reference.__qualname__ = "Tree"

    def ref(t):
        return Reference(t.label, [ref(c) if isinstance(c, Tree) else c for c in t.children])

    t = Tree.parse("(TOP (S (NP (NN a) (NN 'b\")) ( (VB c)) (X) d))")
    assert repr(t) == repr(ref(t))
    assert t == Tree.parse(str(t)) and t != Tree.parse("(TOP)") and Tree("a", ["x"]) != Tree("a", [Tree("x")])
    assert (t == "x") is False and t.__eq__("x") is NotImplemented
