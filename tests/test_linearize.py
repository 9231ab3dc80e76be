"""Linearized trees: exact round trips, the strict reader, and `repair` of arbitrary model output.

Real-tree checks run on every tree of the Penn Treebank sample in ../shared/data/ptb (skipped when
absent); repair is checked by hand-worked cases, by seeded random sequences, and by Hypothesis
properties over generated trees and tokens (at the end of the file).
"""

from __future__ import annotations

import random
import re

import pytest

from nmtkit.io import read_lines
from nmtkit.parsing.linearize import (
    PUNCTUATION_TAG_OF_WORD,
    delinearize,
    escape_word,
    fix_punctuation_tags,
    linearize,
    linearize_line,
    mask_tags,
    output_tree_line,
    repair,
    tree_line,
)
from nmtkit.parsing.treebank import normalize_tree
from nmtkit.parsing.trees import Tree, TreeError
from nmtkit.scoring.parseval import TooManyErrors, evaluate
from tests.conftest import shared_file

JOHN = "(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))"


def T(text: str) -> Tree:
    return Tree.parse(text)


def R(seq: str, words: str, pos: str = "keep") -> str:
    return repair(seq, words, pos).to_string()


# ----------------------------------------------------------------------------- linearization


def test_linearize_the_example_in_both_pos_modes():
    assert linearize_line(T(JOHN)) == ("John has a dog .", "(S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S")
    assert linearize_line(T(JOHN), "xx") == ("John has a dog .", "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S")
    # a tree without the TOP root linearizes the same; the way back always adds TOP
    assert linearize_line(T(JOHN).children[0]) == linearize_line(T(JOHN))
    words, seq = linearize(T(JOHN))
    assert delinearize(seq, words).to_string() == JOHN
    assert delinearize(" ".join(seq), " ".join(words)).to_string() == JOHN  # strings are split on spaces
    xx = delinearize(linearize(T(JOHN), "xx")[1], words, "xx")
    assert xx.to_string() == mask_tags(T(JOHN)).to_string() == (
        "(TOP (S (NP (XX John)) (VP (XX has) (NP (XX a) (XX dog))) (XX .)))"
    )
    # several constituents under TOP, and a preterminal directly under it
    t = T("(TOP (NP (NN a)) (VB b))")
    assert linearize_line(t) == ("a b", "(NP NN )NP VB")
    assert delinearize("(NP NN )NP VB", "a b").to_string() == t.to_string()


@pytest.mark.parametrize(
    "bad",
    [
        "(TOP (S (NP (DT the) dog) (VP (VBZ runs))))",  # word directly under a phrase
        "(TOP (S (NP) (VP (VBZ runs))))",  # constituent without words
        "(TOP John)",  # word directly under the root
        "(TOP (S ( (NN a))))",  # unlabeled inner constituent
        "(TOP (S (<unk> a)))",  # a tag that would read back as a special symbol
    ],
)
def test_linearize_refuses_trees_it_cannot_hold_exactly(bad):
    with pytest.raises(TreeError):
        linearize(T(bad))


@pytest.mark.parametrize(
    "seq, words, why",
    [
        ("(S NN )NP", "a", "closes (S"),
        ("(S NN )S )S", "a", "closes nothing"),
        ("(S NN", "a", "not closed"),
        ("(S NN <unk> )S", "a", "not a bracket"),
        ("(S (NP )NP NN )S", "a", "empty constituent"),
        ("(S NN NN )S", "a", "2 preterminals for 1 words"),
        ("(S XX NN )S", "a b", "not a bracket or a placeholder"),
    ],
)
def test_delinearize_is_strict(seq, words, why):
    with pytest.raises(TreeError, match=re.escape(why)):
        delinearize(seq, words, "xx" if "placeholder" in why else "keep")


@pytest.fixture(scope="module")
def sample_trees():
    """Every tree of the sample (3914), normalized: from the one-tree-per-line copy of the .mrg files."""
    lines = read_lines(shared_file("ptb", "wsj_0001-0199.oneline.mrg.gz"))
    trees = [normalize_tree(Tree.parse(line)) for line in lines]
    assert len(trees) == 3914 and all(t is not None for t in trees)
    return trees


def test_round_trip_is_exact_on_every_sample_tree(sample_trees):
    for i, t in enumerate(sample_trees):
        words, seq = linearize(t, "keep")
        assert words == t.leaves()
        assert delinearize(seq, words, "keep").to_string() == t.to_string(), i
        # repair leaves a valid sequence alone
        assert repair(seq, words, "keep").to_string() == t.to_string(), i
        words_xx, seq_xx = linearize(t, "xx")
        assert words_xx == words
        # xx: identical bracket structure, every tag XX
        assert delinearize(seq_xx, words, "xx").to_string() == mask_tags(t).to_string(), i
        assert [tok for tok in seq_xx if tok[0] in "()"] == [tok for tok in seq if tok[0] in "()"]


def test_parseval_of_gold_against_repaired_gold_linearization(sample_trees):
    gold = [t.to_string() for t in sample_trees]
    repaired = {}
    for pos in ("keep", "xx"):
        repaired[pos] = [repair(s, w, pos) for w, s in (linearize(t, pos) for t in sample_trees)]
    # keep, tags as predicted (what output_tree_line(..., fix_punctuation=False) writes): identical
    r = evaluate(gold, [tree_line(t) for t in repaired["keep"]])
    assert (r.all.f1, r.all.valid, r.all.complete_match, r.all.tagging_accuracy) == (100.0, 3914, 100.0, 100.0)
    assert output_tree_line(*linearize(sample_trees[0])[::-1], fix_punctuation=False) == gold[0]
    # with the punctuation-tag fix (output_tree_line's default), in both modes: 100 on every sentence
    # but one, line 453, whose gold tree tags the word "Wa" as "," (an annotation error; the fix makes
    # it XX, so gold deletes a word that the output keeps: EVALB's "Length unmatch")
    for pos in ("keep", "xx"):
        r = evaluate(gold, [tree_line(fix_punctuation_tags(t)) for t in repaired[pos]])
        assert (r.all.f1, r.all.valid, r.all.complete_match) == (100.0, 3913, 100.0), pos
        assert [(s.line, s.message) for s in r.sentences if s.status] == [
            (453, "Length unmatch (33|34): gold and test have different word counts")
        ]
        # xx: the only right tags are the 63 possessive ' that the fix tags POS (punctuation is not counted)
        assert r.all.correct_tags == (r.all.words if pos == "keep" else 63)
    # without the fix, `xx` trees cannot be scored at all: EVALB keeps every XX-tagged punctuation mark
    with pytest.raises(TooManyErrors):
        evaluate(gold, [tree_line(t) for t in repaired["xx"]])


# ------------------------------------------------------------------------------------ repair


@pytest.mark.parametrize(
    "seq, words, expected",
    [
        # valid input is returned as is
        ("(S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S", "John has a dog .", JOHN),
        # cut off by the length limit: open constituents are closed; the missing word goes where it stopped
        (
            "(S (NP NNP )NP (VP VBZ (NP DT NN",
            "John has a dog .",
            "(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog) (XX .)))))",
        ),
        # a closing label that matches an outer constituent closes everything inside it
        (
            "(S (VP VB (NP DT NN )VP . )S",
            "eat the cake .",
            "(TOP (S (VP (VB eat) (NP (DT the) (NN cake))) (. .)))",
        ),
        # ... also when the match is the outermost open constituent, however deep the stack
        ("(S (NP NN )S VB", "a b", "(TOP (S (NP (NN a))) (VB b))"),
        ("(S (VP (NP NN )S (VP VB )VP", "a b", "(TOP (S (VP (NP (NN a)))) (VP (VB b)))"),
        # a closing label that matches nothing open, or a bare ")", closes the innermost
        ("(S (NP DT NN )VP VB )S", "the dog barked", "(TOP (S (NP (DT the) (NN dog)) (VB barked)))"),
        ("(S (NP DT NN ) VB )", "the dog barked", "(TOP (S (NP (DT the) (NN dog)) (VB barked)))"),
        # stray closing brackets and unknown tokens are dropped
        (")S )NP (S <unk> NN </s> a(b ( <pad> )S )S", "dogs", "(TOP (S (NN dogs)))"),
        # too many preterminals: the rightmost go, and the constituents they leave empty
        ("(S (NP DT NN )NP (VP VB NN )VP )S", "the dog", "(TOP (S (NP (DT the) (NN dog))))"),
        # too few, root closed: appended at the end of the last constituent under TOP
        ("(S NN )S", "a b c", "(TOP (S (NN a) (XX b) (XX c)))"),
        # no brackets at all / several constituents under TOP
        ("", "a b", "(TOP (XX a) (XX b))"),
        ("NN VB", "a b", "(TOP (NN a) (VB b))"),
        ("(NP NN )NP (VP VB )VP", "a b", "(TOP (NP (NN a)) (VP (VB b)))"),
        ("(NP NN )NP VB", "a", "(TOP (NP (NN a)))"),
        # constituents that never get a word vanish
        ("(S (NP )NP (VP (PP )PP VB )VP )S", "go", "(TOP (S (VP (VB go))))"),
        # no words: (TOP), whatever the sequence
        ("(S (NP NN )NP )S", "", "(TOP)"),
        ("", "", "(TOP)"),
    ],
)
def test_repair_hand_made_cases(seq, words, expected):
    assert R(seq, words) == expected


def test_repair_xx_mode_accepts_only_the_placeholder():
    assert R("(S XX NN (NP XX )NP )S", "a b", "xx") == "(TOP (S (XX a) (NP (XX b))))"
    assert R("(S NN )S", "a", "xx") == "(TOP (S (XX a)))"  # NN is unknown in xx mode: dropped, then padded


def test_repair_handles_deep_garbage_without_recursion():
    seq = "(X " * 5000 + "NN"
    t = repair(seq, "a b")
    assert t.leaves() == ["a", "b"] and t.height() == 5000 + 3
    assert Tree.parse(tree_line(t)).to_string() == t.to_string()


def test_repair_output_for_an_empty_sentence_is_skipped_by_parseval():
    line = output_tree_line("(S NN )S", "")
    assert line == "(TOP)"
    r = evaluate(["(TOP (S (NN a)))", "(TOP (S (NN b)))"], ["(TOP (S (NN a)))", line])
    assert [s.status for s in r.sentences] == [0, 2] and r.all.f1 == 100.0
    assert r.warnings == ["test:2: skipped, excluded from the totals: test tree has no words (skipped, as evalb skips it)"]


_POOL = [
    "(S", "(NP", "(VP", "(PP", "(SBAR", ")S", ")NP", ")VP", ")PP", ")", ")X", "(",
    "NN", "DT", "VB", "IN", ",", ".", "XX", "<unk>", "</s>", "<s>", "a(b", "((NP", ")NP)", "-LRB-",
]  # fmt: skip


def _check_well_formed(t: Tree, words: list[str]) -> None:
    assert t.label == "TOP"
    assert t.leaves() == words
    assert len(t.preterminals()) == len(words)
    for node in t.subtrees():
        if node is t or node.is_preterminal():
            continue
        assert node.label and "(" not in node.label and ")" not in node.label
        assert node.children and all(isinstance(c, Tree) for c in node.children)
    assert all(isinstance(c, Tree) for c in t.children)
    line = tree_line(t)
    assert "\n" not in line and Tree.parse(line).to_string() == line


def test_repair_property_any_sequence_gives_a_well_formed_tree_with_the_words():
    rng = random.Random(1234)
    for case in range(3000):
        pos = "xx" if case % 3 == 0 else "keep"
        seq = [rng.choice(_POOL) for _ in range(rng.randrange(0, 40))]
        words = [f"w{i}" for i in range(rng.randrange(0, 15))]
        t = repair(seq, words, pos)
        _check_well_formed(t, words)
        # the repaired tree is valid: its linearization reads back strictly, and repair is idempotent
        w2, s2 = linearize(t, pos) if words else ([], [])
        assert w2 == words
        assert delinearize(s2, words, pos).to_string() == t.to_string() == repair(s2, words, pos).to_string()


def _random_tree(rng: random.Random, words: list[str]) -> Tree:
    """A random well-formed tree over `words` (every word under its own preterminal)."""
    labels, tags = ["S", "NP", "VP", "PP", "ADJP", "SBAR"], ["NN", "DT", "VB", "IN", "JJ", ",", "."]
    items: list[Tree] = [Tree(rng.choice(tags), [w]) for w in words]
    while len(items) > 1 or rng.random() < 0.3:
        i = rng.randrange(len(items))
        j = rng.randrange(i, min(len(items), i + 3)) + 1
        items[i:j] = [Tree(rng.choice(labels), items[i:j])]
    return Tree("TOP", items)


def test_repair_property_valid_sequences_are_unchanged():
    rng = random.Random(99)
    for _ in range(1500):
        words = [f"w{i}" for i in range(rng.randrange(1, 12))]
        t = _random_tree(rng, words)
        for pos in ("keep", "xx"):
            w, s = linearize(t, pos)
            expect = (t if pos == "keep" else mask_tags(t)).to_string()
            assert delinearize(s, w, pos).to_string() == repair(s, w, pos).to_string() == expect


def test_repaired_random_output_always_scores():
    # what `nmtkit generate | nmtkit score --metric parseval` sees from a model emitting garbage
    rng = random.Random(7)
    gold, test = [], []
    for _ in range(200):
        words = rng.choice(["The dog barked .", "`` Yes , ' he said ' .", "It 's 5 % -- or less ."]).split()
        gold.append(_random_tree(rng, words))
        gold[-1] = fix_punctuation_tags(gold[-1])  # gold trees tag punctuation as PTB does
        seq = [rng.choice(_POOL) for _ in range(rng.randrange(0, 30))]
        test.append(output_tree_line(seq, words, rng.choice(["keep", "xx"])))
    r = evaluate([g.to_string() for g in gold], test)
    assert r.all.valid == 200 and r.all.error_sentences == r.all.skip_sentences == 0


# ------------------------------------------------------------------------------ punctuation


def test_fix_punctuation_tags():
    t = T("(TOP (S (XX ``) (XX Yes) (, x) (XX ,) (XX ') (NN the) (XX investors) (NN ') (XX ?) (XX '') (XX --)))")
    assert fix_punctuation_tags(t).to_string() == (
        "(TOP (S (`` ``) (XX Yes) (XX x) (, ,) (POS ') (NN the) (XX investors) (POS ') (. ?) ('' '') (: --)))"
    )
    # a lone ' closes a single quote opened by ` earlier, or sits right before ''
    t = T("(TOP (S (XX `) (XX Hi) (XX ') (XX said) (XX ') (XX '')))")
    assert fix_punctuation_tags(t).to_string() == "(TOP (S (`` `) (XX Hi) ('' ') (XX said) ('' ') ('' '')))"
    # other tags that make EVALB delete a word are reset too
    t = T("(TOP (S (-NONE- a) (TOP b) (NN c)))")
    assert fix_punctuation_tags(t).to_string() == "(TOP (S (XX a) (XX b) (NN c)))"
    # a predicted '' or POS on ' is kept; the input is not changed
    t = T("(TOP (S (POS ') ('' ')))")
    assert fix_punctuation_tags(t).to_string() == t.to_string()
    assert set(PUNCTUATION_TAG_OF_WORD.values()) == {",", ".", ":", "``", "''"}


def test_tree_line_escapes_parentheses_in_words():
    assert escape_word("a(b)") == "a-LRB-b-RRB-" and escape_word("dog") == "dog"
    t = repair("(S NN NN )S", ["(", "x)"])
    assert t.leaves() == ["(", "x)"]  # the tree keeps the words; only the line escapes them
    assert tree_line(t) == "(TOP (S (NN -LRB-) (NN x-RRB-)))"


def test_bad_arguments():
    with pytest.raises(ValueError, match="part-of-speech mode"):
        linearize(T(JOHN), "tags")
    with pytest.raises(ValueError, match="part-of-speech mode"):
        repair("", "a", "XX")
    with pytest.raises(ValueError, match="whitespace"):
        repair("", ["a b"])


# ---- behaviour pinned down by the mutation benchmark (recipes/bench/mutation.sh linearize) ----


def _err(fn, *args) -> str:
    with pytest.raises((TreeError, ValueError)) as e:
        fn(*args)
    return str(e.value)


def test_linearize_messages_are_exact():
    assert _err(linearize, T(JOHN), "tags") == "part-of-speech mode must be one of keep, xx, got 'tags'"
    assert _err(linearize, T("(TOP John)")) == "word 'John' directly under the root (every word needs a part-of-speech tag)"
    assert _err(linearize, T("(TOP (S (<unk> a)))")) == "part-of-speech tag '<unk>' of word 'a' cannot be linearized"
    assert _err(linearize, Tree("TOP", [Tree("S", [Tree("", ["a"])])])) == (
        "part-of-speech tag '' of word 'a' cannot be linearized")
    assert _err(linearize, Tree("TOP", [Tree("S", [Tree("N N", ["a"])])])) == (
        "part-of-speech tag 'N N' of word 'a' cannot be linearized")
    assert _err(linearize, T("(TOP (S ( (NN a))))")) == "constituent label '' cannot be linearized"
    assert _err(linearize, T("(TOP (<x> (NN a)))")) == "constituent label '<x>' cannot be linearized"
    assert _err(linearize, T("(TOP (S (NP) (VB a)))")) == "constituent (NP ) has no words; normalize the tree first"
    assert _err(linearize, T("(TOP (S (NP (DT the) dog)))")) == (
        "word 'dog' is not under its own part-of-speech tag in (NP ...)")
    # a two-character <> is not a special symbol: it is a tag like any other
    assert linearize_line(T("(TOP (S (<> a)))")) == ("a", "(S <> )S")


@pytest.mark.parametrize(
    "seq, words, pos, message",
    [
        ("(S NN <unk> )S", "a", "keep", "token 3 '<unk>' is not a bracket or a tag"),
        ("(S NN )S", "a", "xx", "token 2 'NN' is not a bracket or a placeholder"),
        ("(S XX )S )S", "a", "xx", "token 4 ')S' closes nothing"),
        ("(S NN )NP", "a", "keep", "token 3 ')NP' closes (S"),
        ("(S (NP NN )VP )S", "a", "keep", "token 4 ')VP' closes (NP"),  # names the innermost, not (S
        ("(S NN )", "a", "keep", "token 3 ')' closes (S"),
        ("(S (NP )NP NN )S", "a", "keep", "token 3 ')NP' closes an empty constituent"),
        ("(S (NP NN", "a", "keep", "2 constituent(s) not closed at the end: (S (NP"),
        ("(S NN NN )S", "a", "keep", "2 preterminals for 1 words"),
        ("(S NN )S", "a b", "keep", "1 preterminals for 2 words"),
        ("( NN", "a", "keep", "token 1 '(' is not a bracket or a tag"),
        ("(<s> NN )<s>", "a", "keep", "token 1 '(<s>' is not a bracket or a tag"),
        ("(S NN )S(", "a", "keep", "token 3 ')S(' is not a bracket or a tag"),
        ("(S a(b )S", "a", "keep", "token 2 'a(b' is not a bracket or a tag"),
        ("(S <a> )S", "a", "keep", "token 2 '<a>' is not a bracket or a tag"),
    ],
)
def test_delinearize_messages_are_exact(seq, words, pos, message):
    assert _err(delinearize, seq, words, pos) == message


def test_word_and_mode_checks_are_exact():
    assert _err(repair, "", ["x", "a b"]) == (
        "word 2 'a b' is empty or contains whitespace; words are whitespace-split tokens")
    assert _err(delinearize, "NN", [""]) == "word 1 '' is empty or contains whitespace; words are whitespace-split tokens"
    assert _err(repair, "", "a", "XX") == "part-of-speech mode must be one of keep, xx, got 'XX'"
    assert _err(delinearize, "", "a", "x") == "part-of-speech mode must be one of keep, xx, got 'x'"
    # the 2-character "<>" is a tag, "<a>" (3 characters) a special symbol that repair drops
    assert R("(S <> <a> )S", "w") == "(TOP (S (<> w)))"
    assert delinearize("(S <> )S", "w").to_string() == "(TOP (S (<> w)))"


def test_fix_punctuation_tags_counts_nested_single_quotes():
    """The `'` rule keeps a count of the single quotes opened by "`" and not yet closed: each
    closing `''`-tagged `'` (predicted or decided) closes one; a `POS` never does; a `'` with no
    quote open and nothing after it is a possessive (PTB tags `the Joneses '` POS)."""
    def fix(text):
        return fix_punctuation_tags(T(text)).to_string()

    # one quote: the first ' closes it, the last one (end of the sentence) is a possessive
    assert fix("(TOP (S (XX `) (XX Go) (XX ') (XX ,) (XX said) (XX the) (XX Joneses) (XX ')))") == (
        "(TOP (S (`` `) (XX Go) ('' ') (, ,) (XX said) (XX the) (XX Joneses) (POS ')))")
    # two nested quotes: both ' close one
    assert fix("(TOP (S (XX `) (XX He) (XX said) (XX `) (XX no) (XX ') (XX today) (XX ')))") == (
        "(TOP (S (`` `) (XX He) (XX said) (`` `) (XX no) ('' ') (XX today) ('' ')))")
    # a predicted POS inside the quote is kept and closes nothing: the next ' still closes the quote
    assert fix("(TOP (S (XX `) (XX The) (XX players) (POS ') (XX coach) (XX ')))") == (
        "(TOP (S (`` `) (XX The) (XX players) (POS ') (XX coach) ('' ')))")
    # a predicted '' with no quote open is kept and closes nothing (the count never goes below 0)
    assert fix("(TOP (S (XX the) (XX Joneses) ('' ') (XX `) (XX house) (XX ')))") == (
        "(TOP (S (XX the) (XX Joneses) ('' ') (`` `) (XX house) ('' ')))")


def test_tree_line_escapes_a_word_with_only_one_kind_of_parenthesis():
    assert tree_line(repair("NN", ["("])) == "(TOP (NN -LRB-))"
    assert tree_line(repair("NN", [")"])) == "(TOP (NN -RRB-))"
    assert tree_line(repair("NN NN", [":(", ":)"])) == "(TOP (NN :-LRB-) (NN :-RRB-))"


def test_output_tree_line_repairs_in_the_given_pos_mode():
    # xx: NN is unknown (dropped) and the missing word gets XX; keep: NN is a tag like any other
    assert output_tree_line("(S NN XX )S", "a b", pos="xx") == "(TOP (S (XX a) (XX b)))"
    assert output_tree_line("(S NN XX )S", "a b", pos="keep") == "(TOP (S (NN a) (XX b)))"


# --- property tests (Hypothesis) ---
# Normalized trees over any labels, tags and words the tree reader gives (unicode, NUL, NBSP,
# -LRB-, lone surrogates): linearize refuses in one line, or its two lines (words, tokens) read
# back, by delinearize and by repair, to the tree itself (tags masked in xx mode). repair of any
# tokens gives a well-formed tree over exactly the words.

from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nmtkit.parsing.linearize import POS_MODES  # noqa: E402

_NOT_IN_WORDS = " \t\n\r\f\v()"  # the tree reader's separators: ASCII whitespace and parentheses
_TEXT = st.text(st.one_of(st.characters(exclude_characters=_NOT_IN_WORDS), st.characters(categories=["Cs"])),
                min_size=1, max_size=4)
_WORD = st.one_of(st.sampled_from(["-LRB-", "-RRB-", "``", "'", ".", ",", "<unk>", "XX", "\x00", "é", "a\xa0b",
                                   "\u2028", "\x85"]), _TEXT)
_TAG = st.one_of(st.sampled_from(["NN", "DT", ",", ".", "-LRB-", "PRP$", "XX", "<>", "<x", "<s>", "N\xa0N"]), _TEXT)
_LABEL = st.one_of(st.sampled_from(["S", "NP", "VP", "SBAR", "X", "<x>", "N\xa0P", "\x85"]), _TEXT)
def _tree_of(shape: tuple) -> Tree:
    """(label, [child, ...]) -> Tree, a word staying a string. Trees are drawn as such shapes
    and built once: Hypothesis prints nested `st.builds` calls in time that grows too fast."""
    label, kids = shape
    return Tree(label, [_tree_of(k) if isinstance(k, tuple) else k for k in kids])


_PRETERMINAL = st.tuples(_TAG, st.lists(_WORD, min_size=1, max_size=1))
_CONSTITUENT = st.recursive(_PRETERMINAL, lambda kids: st.tuples(_LABEL, st.lists(kids, min_size=1, max_size=4)),
                            max_leaves=16)
_NORMALIZED = st.lists(_CONSTITUENT, min_size=1, max_size=3).map(lambda items: _tree_of(("TOP", items)))


def _one_line(e: Exception) -> str:
    assert len(str(e).splitlines()) == 1, str(e)
    return str(e)


@pytest.mark.fuzz
@given(t=_NORMALIZED, pos=st.sampled_from(POS_MODES))
@example(t=T("(TOP (S (NN a\xa0b)))"), pos="keep")  # linearized, then refused by delinearize (a ValueError)
@example(t=T("(TOP (0\x85 (NN w)))"), pos="keep")  # linearized; its line read back as the label 0
@example(t=T("(TOP (\x85 (NN w) w))"), pos="keep")  # the label broke the message's line in two
def test_linearize_then_delinearize_or_repair_gives_the_tree_over_the_same_words(t, pos):
    try:
        words, seq = linearize(t, pos)
    except TreeError as e:
        _one_line(e)
        event("refused by linearize")
        return
    src, tgt = " ".join(words), " ".join(seq)  # the two lines prepare writes
    assert src.split() == words == t.leaves() and tgt.split() == seq
    expect = t if pos == "keep" else mask_tags(t)
    assert delinearize(tgt, src, pos) == repair(tgt, src, pos) == expect
    event("round trip")


_SEQ_TOKEN = st.one_of(st.sampled_from(_POOL), _TEXT, st.text(max_size=4),
                       st.builds(lambda b, x: b + x, st.sampled_from(["(", ")"]), _TEXT))


@pytest.mark.fuzz
@given(seq=st.lists(_SEQ_TOKEN, max_size=30), words=st.lists(_WORD, max_size=8), pos=st.sampled_from(POS_MODES))
def test_repair_of_any_tokens_gives_a_well_formed_tree_over_the_words(seq, words, pos):
    words = [w for w in words if not any(c.isspace() for c in w)]  # what a line of words can hold
    t = repair(seq, words, pos)
    _check_well_formed(t, words)
    assert repair(" ".join(linearize(t, pos)[1]) if words else "", words, pos) == t  # repair is idempotent


@pytest.mark.fuzz
@given(words=st.lists(_WORD, min_size=1, max_size=4))
def test_words_a_line_cannot_hold_are_refused_in_one_line(words):
    if all(w and not any(c.isspace() for c in w) for w in words):
        assert repair("", words).leaves() == words
        return
    with pytest.raises(ValueError) as e:
        repair("", words)
    assert "is empty or contains whitespace" in _one_line(e.value)


def test_deep_trees_linearize_and_read_back_without_recursion():
    depth = 10_000
    t = T("(TOP " + "(S " * depth + "(NN a)" + ")" * depth + ")")
    words, seq = linearize(t)
    assert words == ["a"] and len(seq) == 2 * depth + 1
    assert delinearize(seq, words) == t == repair(seq, words)
    assert Tree.parse(output_tree_line(seq, words)) == fix_punctuation_tags(t)
    assert repair(seq[: depth], words).leaves() == ["a"]  # cut off: the word goes where it stopped


def test_a_label_or_word_that_a_line_cannot_hold_is_refused_by_linearize():
    """The tree reader splits at ASCII whitespace only, a line of tokens at every space: a word
    with a no-break space was linearized, then delinearize raised a ValueError (a traceback); a
    label ending in NEL was linearized to a line that read back as another label."""
    assert _err(linearize, T("(TOP (S (NN a\xa0b)))")) == (
        "word 'a\\xa0b' is empty or holds whitespace; a line of words cannot hold it as one word")
    assert _err(linearize, T("(TOP (0\x85 (NN w)))")) == "constituent label '0\\x85' cannot be linearized"
    assert _err(linearize, Tree("TOP", [Tree("S", [Tree("NN", [""])])])) == (
        "word '' is empty or holds whitespace; a line of words cannot hold it as one word")
    assert _err(linearize, T("(TOP (\x85 (NN w) w))")) == "constituent label '\\x85' cannot be linearized"
