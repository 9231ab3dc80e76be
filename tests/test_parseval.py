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
from nmtkit.scoring.parseval import (
    COLLINS,
    EvalbParams,
    TooManyErrors,
    evaluate,
    evaluate_files,
    modify_label,
    read_evalb_params,
    score_sentence,
)
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


# ------------------------------------------------------- EVALB's output, field by field

# Nine sentences covering every column of EVALB's table: crossing counts 1, 3, 2, 0, 0 (the
# "No crossing" and "2 or less crossing" cut-offs), a wrong POS tag, two error sentences and two
# skipped ones. Counts worked out by hand (gold brackets after deleting TOP and punctuation):
#   1: gold S(0,3) NP(0,2) VP(2,3); test S(0,3) NP(0,1) VP(1,3): 1 match; VP(1,3) crosses
#      NP(0,2); tags: dog NN vs VB -> 2/3; Len 4 (the period counts), Words 3
#   2: gold S X(0,2) Y(2,4) Z(4,6); test S R(1,5) P(1,3) Q(3,5): 1 match; R and P cross X, Q
#      crosses Y -> 3 crossing
#   3: the same gold; test S P(1,3) Q(3,5): 1 of 4 gold, 1 of 3 test, 2 crossing
#   4: identical; 5: "Words unmatch (b|c)" (error); 6: only a period (skip); 7: "Length unmatch
#      (2|3)" (error); 8: only -NONE- (skip); 9: brackets right (complete match), a tag wrong (1/2)
# Totals over the 5 valid sentences: matched 9 of 17 gold and 16 test brackets: recall 52.94,
# precision 56.25, F1 2*9/33 = 54.55; complete 2/5; crossing 6 (1.20 a sentence), none in 2/5,
# at most 2 in 4/5; tags 17/19 = 89.47. EXPECTED_EVALB is what evalb.c (Sekine & Collins,
# compiled from the EVALB distribution) prints on stdout for these two files with COLLINS.prm.
GOLD9 = [
    "(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))",
    "(TOP (S (X (A a) (A b)) (Y (A c) (A d)) (Z (A e) (A f))))",
    "(TOP (S (X (A a) (A b)) (Y (A c) (A d)) (Z (A e) (A f))))",
    "(TOP (S (NP (NN a)) (VP (VB b))))",
    "(TOP (S (NP (NN a)) (VP (VB b))))",
    "(TOP (S (NP (NN a)) (VP (VB b))))",
    "(TOP (S (NP (NN a)) (VP (VB b)) (. .)))",
    "(TOP (S (NP (NN a)) (VP (VB b))))",
    "(TOP (S (NP (NN a)) (VP (VB b))))",
]
TEST9 = [
    "(TOP (S (NP (DT The)) (VP (VB dog) (VBD barked)) (. .)))",
    "(TOP (S (A a) (R (P (A b) (A c)) (Q (A d) (A e))) (A f)))",
    "(TOP (S (A a) (P (A b) (A c)) (Q (A d) (A e)) (A f)))",
    "(TOP (S (NP (NN a)) (VP (VB b))))",
    "(TOP (S (NP (NN a)) (VP (VB c))))",
    "(TOP (. .))",
    "(TOP (S (NP (NN a)) (VP (VB b) (NN x))))",
    "(TOP (-NONE- *))",
    "(TOP (S (NP (NNS a)) (VP (VB b))))",
]
_SUMMARY9 = """Number of sentence        =      9
Number of Error sentence  =      2
Number of Skip  sentence  =      2
Number of Valid sentence  =      5
Bracketing Recall         =  52.94
Bracketing Precision      =  56.25
Bracketing FMeasure       =  54.55
Complete match            =  40.00
Average crossing          =   1.20
No crossing               =  40.00
2 or less crossing        =  80.00
Tagging accuracy          =  89.47
"""
EXPECTED_EVALB = (
    """  Sent.                        Matched  Bracket   Cross        Correct Tag
 ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy
============================================================================
   1    4    0   33.33  33.33     1      3    3      1      3     2    66.67
   2    6    0   25.00  25.00     1      4    4      3      6     6   100.00
   3    6    0   25.00  33.33     1      4    3      2      6     6   100.00
   4    2    0  100.00 100.00     3      3    3      0      2     2   100.00
   5    2    1    0.00   0.00     0      0    0      0      0     0     0.00
   6    2    2    0.00   0.00     0      0    0      0      0     0     0.00
   7    3    1    0.00   0.00     0      0    0      0      0     0     0.00
   8    2    2    0.00   0.00     0      0    0      0      0     0     0.00
   9    2    0  100.00 100.00     3      3    3      0      2     1    50.00
============================================================================
                 52.94  56.25      9    17    16      6     19    17    89.47
=== Summary ===

-- All --
"""
    + _SUMMARY9
    + "\n-- len<=40 --\n"
    + _SUMMARY9
)


def test_evalb_report_is_evalbs_output_byte_for_byte():
    r = evaluate(GOLD9, TEST9)
    assert r.evalb_report() == EXPECTED_EVALB
    a = r.all
    assert (a.sentences, a.error_sentences, a.skip_sentences, a.valid) == (9, 2, 2, 5)
    assert (a.crossing, a.no_crossing, a.two_or_less_crossing, a.complete) == (6, 2, 4, 2)
    assert [s.message for s in r.sentences if s.status] == [
        "Words unmatch (b|c) at word 2",
        "test tree has no words (skipped, as evalb skips it)",
        "Length unmatch (2|3): gold and test have different word counts",
        "test tree has no words (skipped, as evalb skips it)",
    ]


# The same trees under a parameter file with every kind of line. With `EQ_WORD c b` sentence 5
# becomes a valid perfect match; without `DELETE_LABEL -NONE-` the `*` of sentence 8 is a word
# ("Length unmatch (2|1)", an error instead of a skip). Len <= 4 keeps sentences 1, 4-9 (7): valid
# 1, 4, 5, 9 with 10 of 12 brackets matched both ways, complete 3/4, crossing 1 (0.25), tags 7/9.
# All: valid 1-5 and 9, matched 12 of 20 gold and 19 test, complete 3/6, crossing 6, none in 3/6,
# at most 2 in 5/6, tags 19/21. evalb.c prints these figures for this file too.
PRM4 = """# a comment line, then lines of every key
DEBUG 0
MAX_ERROR 3
CUTOFF_LEN 4
LABELED 1
DELETE_LABEL TOP
DELETE_LABEL .
DELETE_LABEL_FOR_LENGTH -NULL-
EQ_LABEL ADVP PRT
EQ_WORD c b
"""


def _totals(n, err, skip, matched, gold, test, complete, words, tags, crossing, none, le2):
    valid = n - err - skip
    return {
        "sentences": n, "error_sentences": err, "skip_sentences": skip, "matched": matched,
        "gold_brackets": gold, "test_brackets": test, "complete": complete, "words": words,
        "correct_tags": tags, "crossing": crossing, "valid_sentences": valid,
        "recall": 100 * matched / gold, "precision": 100 * matched / test,
        "f1": 100 * 2 * matched / (gold + test), "complete_match": 100 * complete / valid,
        "average_crossing": crossing / valid, "no_crossing": 100 * none / valid,
        "two_or_less_crossing": 100 * le2 / valid, "tagging_accuracy": 100 * tags / words,
    }


def test_json_fields_and_len_cutoff_section_under_a_parameter_file(tmp_path):
    prm = tmp_path / "cut4.prm"
    prm.write_text(PRM4)
    params = read_evalb_params(prm)
    assert params == EvalbParams(
        delete_labels=("TOP", "."), delete_labels_for_length=("-NULL-",), eq_labels=(("ADVP", "PRT"),),
        eq_words=(("c", "b"),), labeled=True, max_error=3, cutoff_len=4, source="cut4.prm",
    )
    r = evaluate(GOLD9, TEST9, params, gold_name="g.trees", test_name="t.trees")
    d = r.to_dict()
    all_expected = _totals(9, 2, 1, 12, 20, 19, 3, 21, 19, 6, 3, 5)
    cut_expected = _totals(7, 2, 1, 10, 12, 12, 3, 9, 7, 1, 3, 4)
    assert d.pop("all") == pytest.approx(all_expected)
    assert d.pop("len<=4") == pytest.approx(cut_expected)
    assert d.pop("score") == pytest.approx(100 * 24 / 39)
    assert d == {
        "metric": "parseval",
        "name": "Parseval",
        "signature": "evalb:cut4.prm|labeled:yes|delete:TOP .|eq:ADVP=PRT",
        "lines": 9,
        "params": {
            "source": "cut4.prm", "labeled": True, "delete_labels": ["TOP", "."],
            "delete_labels_for_length": ["-NULL-"], "eq_labels": [["ADVP", "PRT"]], "eq_words": [["c", "b"]],
            "max_error": 3, "cutoff_len": 4,
        },
        "excluded": [
            {"line": 6, "status": "skip", "reason": "test tree has no words (skipped, as evalb skips it)"},
            {"line": 7, "status": "error", "reason": "Length unmatch (2|3): gold and test have different word counts"},
            {"line": 8, "status": "error", "reason": "Length unmatch (2|1): gold and test have different word counts"},
        ],
        "warnings": [
            "t.trees:6: skipped, excluded from the totals: test tree has no words (skipped, as evalb skips it)",
            "t.trees:7: error, excluded from the totals: Length unmatch (2|3): gold and test have different word counts",
            "t.trees:8: error, excluded from the totals: Length unmatch (2|1): gold and test have different word counts",
        ],
    }
    json.dumps(r.to_dict())  # JSON-serializable as it is
    # the summary's second section is titled by CUTOFF_LEN (evalb.c's output for this file)
    assert r.evalb_report().endswith(
        """
-- len<=4 --
Number of sentence        =      7
Number of Error sentence  =      2
Number of Skip  sentence  =      1
Number of Valid sentence  =      4
Bracketing Recall         =  83.33
Bracketing Precision      =  83.33
Bracketing FMeasure       =  83.33
Complete match            =  75.00
Average crossing          =   0.25
No crossing               =  75.00
2 or less crossing        = 100.00
Tagging accuracy          =  77.78
"""
    )


def test_signature_of_unlabeled_parameters_without_deletions(tmp_path):
    prm = tmp_path / "bare.prm"
    prm.write_text("LABELED 0\nEQ_LABEL A B\nEQ_LABEL C D\n")
    r = evaluate(["(S (NN a))"], ["(S (NN a))"], read_evalb_params(prm))
    assert r.signature() == "evalb:bare.prm|labeled:no|delete:-|eq:A=B C=D"
    prm.write_text("DELETE_LABEL TOP\nDELETE_LABEL ,\n")
    r = evaluate(["(S (NN a))"], ["(S (NN a))"], read_evalb_params(prm))
    assert r.signature() == "evalb:bare.prm|labeled:yes|delete:TOP ,|eq:-"
    assert evaluate(["(S (NN a))"], ["(S (NN a))"]).signature() == (
        "evalb:COLLINS.prm|labeled:yes|delete:TOP -NONE- , : `` '' .|eq:ADVP=PRT"
    )


@pytest.mark.parametrize(
    "gold, test, totals_row, fmeasure",
    [
        # evalb.c prints the bracket columns of the totals row only when both sides have brackets,
        # and F1 = 2pr/(p+r) unguarded: 0/0 is glibc's "-nan" (outputs of evalb.c, one sentence each)
        ("(TOP (NN a) (VB b))", "(TOP (S (NN a) (VB b)))", "      2     2   100.00", "  -nan"),
        ("(TOP (S (NN a) (VB b)))", "(TOP (NN a) (VB b))", "      2     2   100.00", "  -nan"),
        ("(TOP (S (NN a) (VB b)))", "(TOP (VP (NN a) (VB b)))",
         "                  0.00   0.00      0     1     1      0      2     2   100.00", "  -nan"),
    ],
)
def test_totals_row_without_brackets_and_nan_f1(gold, test, totals_row, fmeasure):
    report = evaluate([gold], [test]).evalb_report().splitlines()
    assert report[5] == totals_row
    assert report[6] == "=== Summary ==="
    assert report[15] == f"Bracketing FMeasure       = {fmeasure}"


def test_f1_of_half_a_percent():
    # 1 of 200 gold and of 200 test brackets: p = r = 0.5, p + r = 1, F1 = 0.50 (evalb.c: 0.50)
    g = "(TOP " + "(X " * 100 + "(NN a)" + ")" * 100 + ")"
    one_x = "(TOP " + "(Y " * 99 + "(X (NN a))" + ")" * 99 + ")"
    no_x = "(TOP " + "(Y " * 100 + "(NN a)" + ")" * 100 + ")"
    r = evaluate([g, g], [one_x, no_x])
    assert (r.all.matched, r.all.gold_brackets, r.all.test_brackets) == (1, 200, 200)
    assert "Bracketing FMeasure       =   0.50\n" in r.evalb_report()


def test_malformed_trees_are_error_sentences_with_the_side_named():
    ok = "(TOP (S (NN a) (VB b)))"
    cases = [
        (ok, "(TOP (S (NN a) (VB b))", "test tree: cannot read tree: unbalanced brackets: 1 '(' not closed at end of line"),
        ("(TOP (S (NN a) (VB b))", ok, "gold tree: cannot read tree: unbalanced brackets: 1 '(' not closed at end of line"),
        ("(TOP (S (NN a) (VB b))", "(TOP (S a (VB b)))", "gold tree: cannot read tree: unbalanced brackets: 1 '(' not closed at end of line"),
        (ok, "(TOP (S a (VB b)))", "test tree: more than two elements in a bracket (S has a bare word)"),
        (ok, "( (S (NN a)) b)", "test tree: more than two elements in a bracket (<unlabeled> has a bare word)"),
        ("(TOP (S a (VB b) c))", ok, "gold tree: more than two elements in a bracket (S has a bare word)"),
    ]
    for gold, test, message in cases:
        s = score_sentence(3, gold, test)
        assert (s.status, s.message) == (1, message), (gold, test)
        assert (s.matched, s.gold_brackets, s.test_brackets, s.words) == (0, 0, 0, 0)


def test_modify_label_cuts_at_the_first_dash_or_equals_only():
    assert [modify_label(x) for x in ("NP-SBJ-1", "NP=2", "PP-LOC=3", "NX", "NX-TTL", "-NONE-", "S", "")] == [
        "NP", "NP", "PP", "NX", "NX", "", "S", "",
    ]


def test_root_convention_warnings_name_each_convention():
    s = "(S (NP (NN a)) (VP (VB b)))"
    outer, top, root = f"( {s} )", f"(TOP {s})", f"(ROOT {s})"
    tail = ("; EVALB (COLLINS.prm) counts such a bracket as a constituent, so recall/precision are not "
            "comparable (give both files the same root, e.g. `(TOP ...)`, which COLLINS.prm deletes)")
    outer_w = "the unlabeled outer bracket `( (S ...) )`"
    for gold, test, expected in [
        ([outer], [top], f"most gold trees have {outer_w}, most test trees have no counted root wrapper"),
        ([s], [root], "most gold trees have no counted root wrapper, most test trees have a root bracket `(ROOT ...)`"),
        ([outer], [root], f"most gold trees have {outer_w}, most test trees have a root bracket `(ROOT ...)`"),
        # the majority decides: 2 of 3 gold trees have the outer bracket (the first one does not)
        ([top, outer, outer], [top, top, top], f"most gold trees have {outer_w}, most test trees have no counted root wrapper"),
        ([top, top, top], [root, outer, outer], f"most gold trees have no counted root wrapper, most test trees have {outer_w}"),
    ]:
        r = evaluate(gold, test)
        assert r.warnings == ["root conventions differ: " + expected + tail], (gold, test)
    # the same convention on both sides, or none counted (TOP is deleted, like no root): no warning
    for gold, test in [([outer], [outer]), ([top], [s]), ([s], [top]), ([root, root], [root, root])]:
        assert evaluate(gold, test).warnings == [], (gold, test)


def test_too_many_errors_message_lists_the_first_three():
    gold = ["(TOP (S (NN a)))"] * 12
    test = [f"(TOP (S (NN z{i})))" for i in range(1, 13)]
    with pytest.raises(TooManyErrors) as e:
        evaluate(gold, test, test_name="t.trees")
    assert str(e.value) == (
        "t.trees: 12 sentences with errors exceed MAX_ERROR 10 of COLLINS.prm (evalb stops here too); first: "
        "line 1: Words unmatch (a|z1) at word 1; line 2: Words unmatch (a|z2) at word 1; "
        "line 3: Words unmatch (a|z3) at word 1; fix the trees or raise MAX_ERROR in a parameter file "
        "given with --evalb-param"
    )


def test_default_names_in_messages():
    with pytest.raises(UserError) as e:
        evaluate(["(S (NN a))"] * 2, ["(S (NN a))"])
    assert str(e.value) == (
        "line counts differ: test trees test have 1 line but gold trees gold have 2 lines; "
        "they must be parallel, one tree per line"
    )
    with pytest.raises(UserError) as e:
        evaluate([], [])
    assert str(e.value) == "gold is empty: no trees to score"
    r = evaluate(["(S (NN a))"], ["(S (NN b))"])
    assert r.warnings == ["test:1: error, excluded from the totals: Words unmatch (a|b) at word 1"]


# ----------------------------------------------------------------------- files and .prm lines


def test_evaluate_files_names_files_and_flags(tmp_path, monkeypatch):
    gold = tmp_path / "gold.trees"
    gold.write_text("(S (NN a) (VB b))\n(S (NN a) (VB b))\n")
    short = tmp_path / "short.trees"
    short.write_text("(S (NN a) (VB b))\n")
    missing = tmp_path / "nope.trees"
    for args, message in [
        ((missing, short), f"--ref {missing}: no such file"),
        ((gold, missing), f"--sys {missing}: no such file"),
        ((gold, tmp_path), f"--sys {tmp_path} is a directory, not a file"),
        ((gold, short), f"line counts differ: test trees {short} have 1 line but gold trees {gold} have 2 lines; "
                        "they must be parallel, one tree per line"),
    ]:
        with pytest.raises(UserError) as e:
            evaluate_files(*args)
        assert str(e.value) == message
    with pytest.raises(UserError) as e:
        evaluate_files(gold, missing, gold_flag="-r", test_flag="-s")
    assert str(e.value) == f"-s {missing}: no such file"
    empty = tmp_path / "empty.trees"
    empty.write_text("")
    with pytest.raises(UserError) as e:
        evaluate_files(gold, empty)
    assert str(e.value) == f"--sys: {empty} is empty: nothing to score"
    # the test side from stdin is named <stdin> in the per-line warnings
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"(S (NN a) (VB b))\n(S (NN a) (VB c))\n")))
    r = evaluate_files(gold, "-")
    assert r.warnings == ["<stdin>:2: error, excluded from the totals: Words unmatch (b|c) at word 2"]
    # the parameters given reach the scoring: unlabeled, S vs VP over the same span match
    test = tmp_path / "test.trees"
    test.write_text("(VP (NN a) (VB b))\n(VP (NN a) (VB b))\n")
    prm = tmp_path / "u.prm"
    prm.write_text("LABELED 0\n")
    assert evaluate_files(gold, test).all.matched == 0
    assert evaluate_files(gold, test, read_evalb_params(prm)).all.matched == 2


def test_parameter_file_defaults_are_evalbs_not_collins(tmp_path):
    # evalb.c's built-in defaults: nothing deleted, no EQ pairs, LABELED 1, MAX_ERROR 10, CUTOFF_LEN 40
    prm = tmp_path / "min.prm"
    prm.write_text("DELETE_LABEL TOP\n")
    assert read_evalb_params(prm) == EvalbParams(
        delete_labels=("TOP",), delete_labels_for_length=(), eq_labels=(), eq_words=(),
        labeled=True, max_error=10, cutoff_len=40, source="min.prm",
    )


def test_parameter_file_lines_like_evalb(tmp_path):
    prm = tmp_path / "ws.prm"
    # trailing blanks and tabs are cut (COLLINS.prm has `LABELED 1` followed by spaces); lines
    # shorter than 3 characters are ignored; a no-break space is not C whitespace and stays
    prm.write_text("LABELED 0 \t \nDELETE_LABEL TOP  \n\nab\n  \nDELETE_LABEL \u00a0X\u00a0\nMAX_ERROR 7 extra\n")
    p = read_evalb_params(prm)
    assert p.delete_labels == ("TOP", "\u00a0X\u00a0") and p.labeled is False and p.max_error == 7


@pytest.mark.parametrize(
    "text, message",
    [
        ("LABELED 1\nDEBUG\n", "2: DEBUG has no value"),
        ("ABC\n", "1: ABC has no value"),
        ("A B\n", "1: unknown EVALB parameter 'A'"),  # 3 characters: read, not ignored
        ("# c\nDELETE_LABELS TOP\n", "2: unknown EVALB parameter 'DELETE_LABELS'"),
        (" DELETE_LABEL TOP\n", "1: unknown EVALB parameter ''"),  # evalb: the key is what precedes the first blank
        ("MAX_ERROR ten\n", "1: MAX_ERROR needs an integer, got 'ten'"),
        ("CUTOFF_LEN 4.5\n", "1: CUTOFF_LEN needs an integer, got '4.5'"),
        ("EQ_LABEL ADVP\n", "1: EQ_LABEL requires two values, got 'ADVP'"),
        ("EQ_WORD a b c\n", "1: EQ_WORD requires two values, got 'a b c'"),
        ("QUOTE_LABEL POS\n", "1: QUOTE_LABEL (evalb's quote re-insertion) is not supported"),
    ],
)
def test_parameter_file_refusals_name_file_and_line(tmp_path, text, message):
    prm = tmp_path / "bad.prm"
    prm.write_text(text)
    with pytest.raises(UserError) as e:
        read_evalb_params(prm)
    assert str(e.value) == f"--evalb-param {prm}:{message}"


def test_parameter_file_missing(tmp_path):
    with pytest.raises(UserError) as e:
        read_evalb_params(tmp_path / "none.prm")
    assert str(e.value) == f"--evalb-param {tmp_path / 'none.prm'}: no such file"


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
