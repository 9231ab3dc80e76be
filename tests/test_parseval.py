"""Parseval as EVALB computes it with COLLINS.prm, and the tree reader it relies on.

Each EVALB rule has a hand-made case whose counts are worked out in the comments. Real-tree
checks use the Penn Treebank sample in ../shared/data/ptb, whose PROVENANCE.md records EVALB's
own figures (gold vs itself = 100; gold = oneline vs test = top: recall 94.94, precision 100,
complete match 0).
"""

from __future__ import annotations

import io
import json
import sys
import zipfile

import pytest

from nmtkit.errors import UserError
from nmtkit.io import read_lines
from nmtkit.parsing.trees import (
    Tree,
    TreeError,
    add_root,
    parse_trees,
    remove_empty,
    split_trees,
    strip_function_tags,
    strip_label,
    strip_root,
)
from nmtkit.scoring.parseval import COLLINS, TooManyErrors, evaluate, read_evalb_params, score_sentence
from tests.conftest import shared_file


def one(gold: str, test: str, params=COLLINS):
    return score_sentence(1, gold, test, params)


# ------------------------------------------------------------------------------------ trees


def test_tree_reader_and_writer():
    t = Tree.parse("(TOP (S (NP-SBJ (DT The) (NN dog)) (VP (VBD barked)) (. .)))")
    assert t.label == "TOP" and t.leaves() == ["The", "dog", "barked", "."]
    assert t.preterminals() == [("DT", "The"), ("NN", "dog"), ("VBD", "barked"), (".", ".")]
    assert t.to_string() == "(TOP (S (NP-SBJ (DT The) (NN dog)) (VP (VBD barked)) (. .)))"
    assert t.height() == 5
    # the Penn Treebank's unlabeled outer bracket, with and without a space
    for text in ("( (S (NN a)) )", "((S (NN a)))"):
        u = Tree.parse(text)
        assert u.label == "" and u.children[0].label == "S"
        assert Tree.parse(u.to_string()).to_string() == u.to_string() == "( (S (NN a)))"
    assert strip_root(Tree.parse("( (S (NN a)) )")).to_string() == "(S (NN a))"
    assert strip_root(Tree.parse("(TOP (S (NN a)))")).to_string() == "(S (NN a))"
    assert add_root(Tree.parse("(S (NN a))")).to_string() == "(TOP (S (NN a)))"


@pytest.mark.parametrize("bad", ["(S (NN a)", "(S (NN a)))", "word (S (NN a))"])
def test_tree_reader_errors(bad):
    with pytest.raises(TreeError):
        Tree.parse(bad)


def test_tree_reader_handles_deep_trees_without_recursion():
    depth = 5000
    text = "(X " * depth + "(NN w)" + ")" * depth
    t = Tree.parse(text)
    assert t.height() == depth + 2 and t.leaves() == ["w"]
    assert t.to_string() == text
    assert remove_empty(t).leaves() == ["w"]


def test_normalization_helpers():
    assert [strip_label(x) for x in ("NP-SBJ-1", "NP=2", "PP-LOC=3", "-NONE-", "-LRB-", "S")] == [
        "NP",
        "NP",
        "PP",
        "-NONE-",
        "-LRB-",
        "S",
    ]
    t = Tree.parse(
        "( (S (NP-SBJ-1 (-NONE- *)) (VP (VB Go) (SBAR (-NONE- 0) (S (-NONE- *T*-1)))) (. .)) )"
    )
    cleaned = remove_empty(strip_function_tags(t))
    assert cleaned.to_string() == "( (S (VP (VB Go)) (. .)))"
    assert t.to_string().startswith("( (S (NP-SBJ-1")  # input untouched
    assert remove_empty(Tree.parse("(S (-NONE- *))")) is None


def test_split_trees_reproduces_the_oneline_file():
    # PROVENANCE.md: oneline.mrg = the .mrg files cut into top-level trees, whitespace runs -> " ".
    with zipfile.ZipFile(shared_file("ptb", "treebank.zip")) as z:
        names = sorted(n for n in z.namelist() if n.startswith("treebank/combined/wsj_0") and n.endswith(".mrg"))
        cut = [tree for n in names[:20] for tree in split_trees(z.read(n).decode("utf-8").splitlines())]
    oneline = list(read_lines(shared_file("ptb", "wsj_0001-0199.oneline.mrg.gz")))
    assert len(cut) == 233 and cut == oneline[: len(cut)]


def test_top_file_round_trips_and_parse_counts():
    top = list(read_lines(shared_file("ptb", "wsj_0001-0199.top.mrg.gz")))
    trees = [Tree.parse(line) for line in top]
    assert [t.to_string() for t in trees] == top
    # PROVENANCE.md: 3914 trees, 100676 leaves of which 6592 are -NONE- empty elements
    assert len(trees) == 3914
    assert sum(len(t.leaves()) for t in trees) == 100676
    assert sum(tag == "-NONE-" for t in trees for tag, _ in t.preterminals()) == 6592
    assert len(parse_trees("(A (B b)) (C (D d))")) == 2


# ------------------------------------------------------------------------- EVALB, rule by rule


def test_punctuation_is_not_counted_and_does_not_shift_spans():
    # gold: S(0,3) NP(0,2) VP(2,3); the "." is deleted before spans are taken, so the test's VP
    # that swallowed the period still spans (2,3). Len counts the period (4), Words do not (3).
    s = one(
        "(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))",
        "(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked) (. .))))",
    )
    assert (s.status, s.matched, s.gold_brackets, s.test_brackets) == (0, 3, 3, 3)
    assert (s.length, s.words, s.correct_tags) == (4, 3, 3)
    # A period tagged NN in the test is a word there but not in the gold: "Length unmatch".
    s = one("(TOP (S (NP (NN Dogs)) (VP (VBP bark)) (. .)))", "(TOP (S (NP (NN Dogs)) (VP (VBP bark)) (NN .)))")
    assert s.status == 1 and "Length unmatch (2|3)" in s.message


def test_root_and_preterminals_are_not_constituents():
    gold = "(TOP (S (NP (NNP John)) (VP (VBD ran))))"  # S(0,2) NP(0,1) VP(1,2); TOP deleted
    s = one(gold, "(TOP (S (NP (NN John)) (VP (VBZ ran))))")  # other POS tags: brackets 3/3, tags 0/2
    assert (s.matched, s.gold_brackets, s.test_brackets, s.correct_tags, s.words) == (3, 3, 3, 0, 2)
    s = one(gold, "(ROOT (S (NP (NNP John)) (VP (VBD ran))))")  # ROOT is not deleted: 4 test brackets
    assert (s.matched, s.gold_brackets, s.test_brackets) == (3, 3, 4)
    assert f"{s.precision:.2f}" == "75.00" and s.recall == 100.0
    s = one(gold, "(S (NP (NNP John)) (VP (VBD ran)))")  # no root at all: same as (TOP ...)
    assert (s.matched, s.test_brackets) == (3, 3)


def test_advp_equals_prt_and_function_tags_are_stripped():
    gold = "(TOP (S (NP-SBJ-1 (PRP He)) (VP (VBD gave) (PRT (RP up)) (NP-TMP=2 (NN today)))))"
    s = one(gold, "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up)) (NP (NN today)))))")
    assert (s.matched, s.gold_brackets, s.test_brackets) == (5, 5, 5)
    s = one(gold, "(TOP (S (NP (PRP He)) (VP (VBD gave) (PP (RP up)) (NP (NN today)))))")
    assert s.matched == 4
    # POS tags are compared raw (EQ_LABEL applies, modify_label does not)
    s = one("(TOP (S (NP (NN-HL x)) (VP (VB y))))", "(TOP (S (NP (NN x)) (VP (VB y))))")
    assert (s.matched, s.correct_tags) == (3, 1)


def test_none_elements_and_emptied_constituents_are_removed():
    # gold after massaging: S(0,2) VP(0,2) ADVP(1,2); NP-SBJ, SBAR and the inner S cover no word.
    gold = "(TOP (S (NP-SBJ (-NONE- *)) (VP (VB Go) (ADVP (RB home)) (SBAR (-NONE- 0) (S (-NONE- *T*-1)))) (. .)))"
    s = one(gold, "(TOP (S (VP (VB Go) (ADVP (RB home))) (. .)))")
    assert (s.matched, s.gold_brackets, s.test_brackets) == (3, 3, 3)
    assert (s.length, s.words) == (3, 2)  # Len: Go home . (no -NONE-); Words: Go home


def test_crossing_and_duplicate_spans():
    # gold S(0,3) A(0,2) vs test S(0,3) A(1,3): 1 match; test A crosses gold A
    s = one("(TOP (S (A (X a) (X b)) (X c)))", "(TOP (S (X a) (A (X b) (X c))))")
    assert (s.matched, s.gold_brackets, s.test_brackets, s.crossing) == (1, 2, 2, 1)
    # evalb.c individual_result's printf layout
    assert s.evalb_row() == "   1    3    0   50.00  50.00     1      2    2      1      3     3   100.00"
    # two gold NPs over the same span, one in the test: each test bracket matches once
    s = one("(TOP (S (NP (NP (NN a))) (VP (VB b))))", "(TOP (S (NP (NN a)) (VP (VB b))))")
    assert (s.matched, s.gold_brackets, s.test_brackets) == (3, 4, 3)


def test_unlabeled_outer_bracket_counts_like_evalb():
    # "( (S ...) )" has a bracket with the empty label over the whole sentence, which COLLINS.prm
    # does not delete: gold 4 brackets, test 3 -> recall 75, precision 100, no complete match.
    r = evaluate(["( (S (NP (NN a)) (VP (VB b))) )"], ["(TOP (S (NP (NN a)) (VP (VB b))))"])
    assert (r.all.matched, r.all.gold_brackets, r.all.test_brackets, r.all.complete) == (3, 4, 3, 0)
    assert any("root conventions differ" in w for w in r.warnings)


def test_mismatched_words_and_empty_lines_are_excluded_and_reported():
    gold = ["(TOP (S (NP (NN a)) (VP (VB b))))"] * 4
    test = [
        "(TOP (S (NP (NN a)) (VP (VB b))))",  # 3/3
        "(TOP (S (NP (NN a)) (VP (VB c))))",  # Words unmatch -> error
        "",  # no words -> skipped
        "(TOP (S (NP (NN a)) (VP (VB b) (NN x))))",  # Length unmatch -> error
    ]
    r = evaluate(gold, test, test_name="t.trees")
    assert [s.status for s in r.sentences] == [0, 1, 2, 1]
    assert (r.all.sentences, r.all.valid, r.all.error_sentences, r.all.skip_sentences) == (4, 1, 2, 1)
    assert (r.all.matched, r.all.gold_brackets, r.all.test_brackets) == (3, 3, 3)
    assert "Words unmatch (b|c)" in r.sentences[1].message
    assert any(w.startswith("t.trees:2: error") for w in r.warnings)
    assert any(w.startswith("t.trees:3: skipped") for w in r.warnings)
    report = r.evalb_report()
    assert "Number of Error sentence  =      2" in report and "Number of Skip  sentence  =      1" in report


def test_max_error_stops_like_evalb():
    # evalb.c: `if (Error_count++ > Max_error) exit(1)`: with MAX_ERROR 10 the 12th error stops it.
    gold = ["(TOP (S (NN a)))"] * 12
    bad = "(TOP (S (NN z)))"
    r = evaluate(gold, [bad] * 11 + ["(TOP (S (NN a)))"])
    assert r.all.error_sentences == 11 and r.all.valid == 1
    with pytest.raises(TooManyErrors, match="MAX_ERROR 10"):
        evaluate(gold, [bad] * 12)


def test_parameter_files(tmp_path):
    unlabeled = tmp_path / "unlabeled.prm"
    unlabeled.write_text("# comment\nLABELED 0\nDELETE_LABEL TOP\nEQ_WORD colour color\n")
    p = read_evalb_params(unlabeled)
    gold, test = "(TOP (S (NP (NN colour)) (VP (VB b))))", "(TOP (S (PP (NN color)) (ADJP (VB b))))"
    assert one(gold, test, p).matched == 3  # unlabeled; colour == color
    assert one(gold, test.replace("color", "colour")).matched == 1  # COLLINS: labeled
    bad = tmp_path / "bad.prm"
    bad.write_text("LABELED 1\nDELETE_LABELS TOP\n")
    with pytest.raises(UserError, match="bad.prm:2: unknown EVALB parameter 'DELETE_LABELS'"):
        read_evalb_params(bad)
    bad.write_text("QUOTE_LABEL POS\n")
    with pytest.raises(UserError, match="QUOTE_LABEL"):
        read_evalb_params(bad)
    # the real COLLINS.prm reads as the built-in defaults (last: skips without ../shared)
    params = read_evalb_params(shared_file("ptb", "COLLINS.prm"))
    assert params.delete_labels == COLLINS.delete_labels
    assert params.delete_labels_for_length == ("-NONE-",) and params.eq_labels == (("ADVP", "PRT"),)
    assert (params.labeled, params.max_error, params.cutoff_len) == (True, 10, 40)


# ------------------------------------------------------------------------------ real trees


@pytest.fixture(scope="module")
def ptb():
    top = list(read_lines(shared_file("ptb", "wsj_0001-0199.top.mrg.gz")))
    oneline = list(read_lines(shared_file("ptb", "wsj_0001-0199.oneline.mrg.gz")))
    return top, oneline


def test_gold_against_itself_is_100(ptb):
    top, _ = ptb
    r = evaluate(top, top)
    a = r.all
    assert (a.sentences, a.valid, a.error_sentences, a.skip_sentences) == (3914, 3914, 0, 0)
    assert a.recall == a.precision == a.f1 == a.complete_match == a.tagging_accuracy == 100.0
    # the counts evalb prints for this file (PROVENANCE.md check, re-run with evalb.c)
    assert (a.matched, a.words, r.cutoff.sentences) == (73459, 83355, 3629)
    assert not r.warnings


def test_oneline_gold_vs_top_test_reproduces_the_root_gotcha(ptb):
    top, oneline = ptb
    r = evaluate(oneline, top)
    # PROVENANCE.md, measured with EVALB + COLLINS.prm: recall 94.94, precision 100, complete 0 %
    assert f"{r.all.recall:.2f}" == "94.94" and r.all.precision == 100.0 and r.all.complete_match == 0.0
    assert r.all.gold_brackets - r.all.test_brackets == 3914  # one outer bracket per sentence
    assert any("root conventions differ" in w for w in r.warnings)


def test_known_perturbations_give_hand_computed_scores(ptb):
    top, _ = ptb
    gold = top[:50]
    # Sentence 1, "Pierre Vinken , 61 years old , will join the board as a nonexecutive director
    # Nov. 29 .": 18 tokens, 15 words without punctuation; 11 constituents: S(0,15) NP-SBJ(0,5)
    # NP(0,2) ADJP(2,5) NP(2,4) VP(5,15) VP(6,15) NP(7,9) PP-CLR(9,13) NP(10,13) NP-TMP(13,15).
    s1 = score_sentence(1, gold[0], gold[0])
    assert (s1.length, s1.words, s1.gold_brackets) == (18, 15, 11)
    base = evaluate(gold, gold).all
    # Perturbation: PP-CLR relabeled NP (a wrong label) and the ADJP bracket deleted (its
    # children attached to NP-SBJ): gold 11, test 10, matched 9.
    t = Tree.parse(gold[0])
    np_sbj = t.children[0].children[0]
    adjp = np_sbj.children[2]
    assert adjp.label == "ADJP"
    np_sbj.children[2:3] = adjp.children
    pp = t.children[0].children[1].children[1].children[2]
    assert pp.label == "PP-CLR"
    pp.label = "NP"
    test = [t.to_string()] + gold[1:]
    r = evaluate(gold, test)
    s = r.sentences[0]
    assert (s.matched, s.gold_brackets, s.test_brackets) == (9, 11, 10)
    assert s.evalb_row().startswith("   1   18    0   81.82  90.00     9     11   10      0     15    15   100.00")
    a = r.all
    assert (a.matched, a.gold_brackets, a.test_brackets) == (base.matched - 2, base.gold_brackets, base.gold_brackets - 1)
    assert a.recall == pytest.approx(100 * (base.matched - 2) / base.gold_brackets)
    assert a.precision == pytest.approx(100 * (base.matched - 2) / (base.gold_brackets - 1))
    assert a.complete == 49 and a.tagging_accuracy == 100.0


# --------------------------------------------------------------------------------------- CLI


@pytest.fixture
def trees(tmp_path):
    gold = tmp_path / "gold.trees"
    gold.write_text("(TOP (S (A (X a) (X b)) (X c)))\n(TOP (S (NP (NN a)) (VP (VB b))))\n")
    test = tmp_path / "test.trees"
    test.write_text("(TOP (S (X a) (A (X b) (X c))))\n(TOP (S (NP (NN a)) (VP (VB b))))\n")
    return gold, test


def test_cli_parseval_summary_table_and_json(run_cli, trees, monkeypatch):
    gold, test = trees
    r = run_cli("score", "--metric", "parseval", "--ref", gold, "--sys", test)
    assert r.code == 0, r
    # 1 + 3 matched of 2 + 3 gold and 2 + 3 test: recall = precision = 80
    assert r.out.startswith("Parseval F1 = 80.00 (recall = 80.00 precision = 80.00 complete match = 50.00")
    assert r.out.rstrip().endswith("| lines: 2")
    r = run_cli("score", "-m", "parseval", "-r", gold, "-s", test, "--per-sentence")
    assert r.code == 0, r
    lines = r.out.splitlines()
    assert lines[1] == " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy"
    assert lines[3] == "   1    3    0   50.00  50.00     1      2    2      1      3     3   100.00"
    assert "Bracketing FMeasure       =  80.00" in r.out and "-- len<=40 --" in r.out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(test.read_bytes())))
    r = run_cli("score", "-m", "parseval", "-r", gold, "--json")
    assert r.code == 0, r
    obj = json.loads(r.out)
    assert obj["sys"] == "<stdin>" and obj["all"]["matched"] == 4 and obj["score"] == pytest.approx(80.0)
    assert obj["len<=40"]["sentences"] == 2 and obj["params"]["eq_labels"] == [["ADVP", "PRT"]]


def test_cli_parseval_errors(run_cli, trees, tmp_path):
    gold, test = trees
    for args, needle in [
        (("-r", gold, "-r", test, "-s", test), "exactly one --ref"),
        (("-r", gold, "-s", test, "--lowercase"), "--lowercase does not apply"),
        (("-r", gold, "-s", tmp_path / "nope.trees"), "nope.trees"),
        (("-r", gold, "-s", test, "--evalb-param", tmp_path / "none.prm"), "none.prm"),
    ]:
        r = run_cli("score", "-m", "parseval", *args)
        assert r.code == 2 and needle in r.err and "Traceback" not in r.err, (args, r)
    short = tmp_path / "short.trees"
    short.write_text("(TOP (S (NN a)))\n")
    r = run_cli("score", "-m", "parseval", "-r", gold, "-s", short)
    assert r.code == 2 and "have 1 line but" in r.err and "have 2 lines" in r.err and "1 lines" not in r.err
    wrong = tmp_path / "wrong.trees"
    wrong.write_text("(TOP (S (A (X a) (X b)) (X c)))\n(TOP (S (NP (NN a)) (VP (VB zz))))\n")
    r = run_cli("score", "-m", "parseval", "-r", gold, "-s", wrong)
    assert r.code == 0 and "wrong.trees:2: error" in r.err and "Words unmatch (b|zz)" in r.err
    assert "1 valid, 1 error, 0 skipped" in r.out
