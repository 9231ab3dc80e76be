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
