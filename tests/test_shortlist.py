"""Lexical shortlists (nmtkit.data.shortlist, `nmtkit shortlist`): IBM Model 1 against a plain
reference, the selection rules, the file (round trip, candidates, refusals) and the command."""

from __future__ import annotations

import gzip
import hashlib
import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_file, word_mapping_data_dir

from nmtkit.data import shortlist as sl
from nmtkit.data.dictionary import Dictionary
from nmtkit.data.manifest import load_dictionaries, load_manifest
from nmtkit.errors import UserError


def dictionary(*pieces: str) -> Dictionary:
    d = Dictionary()
    for p in pieces:
        d.add_symbol(p, 1)
    return d


SRC = dictionary("das", "haus", "buch", "ein", "klein", "ist", ">>en<<", "Berlin")
TGT = dictionary("the", "house", "book", "a", "small", ">>en<<", "Berlin", "big")
TEXT = [("das haus", "the house"), ("das buch", "the book"), ("ein buch", "a book"),
        ("das haus ist klein", "the house is small"), ("", "a"), ("ein", ""), ("Berlin", "Berlin")]


def corpus(pairs=TEXT, src=SRC, tgt=TGT) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return [src.encode(s.split()) for s, _ in pairs], [tgt.encode(t.split()) for _, t in pairs]


def reference_ibm1(src_rows, tgt_rows, null: int, n_tgt: int, iterations: int) -> dict[tuple[int, int], float]:
    """IBM Model 1 as Brown et al. (1993) write it, one token at a time: p(t|s) on the pairs
    that share a sentence, uniform 1/n_tgt at first, NULL before every source."""
    pairs = [([null, *map(int, s)], list(map(int, t))) for s, t in zip(src_rows, tgt_rows) if len(s) and len(t)]
    p = {(s, t): 1.0 / n_tgt for ss, tt in pairs for s in ss for t in tt}
    for _ in range(iterations):
        count: dict[tuple[int, int], float] = defaultdict(float)
        total: dict[int, float] = defaultdict(float)
        for ss, tt in pairs:
            for t in tt:
                z = sum(p[(s, t)] for s in ss)
                for s in ss:
                    count[(s, t)] += p[(s, t)] / z
                    total[s] += p[(s, t)] / z
        p = {k: count[k] / total[k[0]] for k in p}
    return p


def as_dict(table: sl.TranslationTable) -> dict[tuple[int, int], float]:
    return {divmod(int(k), table.n_tgt): float(p) for k, p in zip(table.keys, table.prob)}


# ---------------------------------------------------------------------------------------------
# IBM Model 1
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("iterations", [1, 2, 5])
def test_the_table_is_ibm1_computed_token_by_token(iterations):
    src, tgt = corpus()
    table = sl.translation_table(src, tgt, len(SRC), len(TGT), iterations=iterations)
    ref = reference_ibm1(src, tgt, len(SRC), len(TGT), iterations)
    got = as_dict(table)
    assert got.keys() == ref.keys()
    assert max(abs(got[k] - ref[k]) for k in ref) < 1e-9
    sums = defaultdict(float)
    for (s, _), p in got.items():
        sums[s] += p
    assert all(abs(v - 1) < 1e-12 for v in sums.values())  # a distribution per source word


def test_one_round_by_hand():
    """After one round from a uniform start, each target token's unit is shared equally among
    its sentence's source words and NULL: das meets `the` in two sentences of 3 source words
    (2 targets each) and one of 5 (4 targets): count 1/3 + 1/3 + 1/5 of total 2/3 + 2/3 + 4/5."""
    src, tgt = corpus(TEXT[:4])
    got = as_dict(sl.translation_table(src, tgt, len(SRC), len(TGT), iterations=1))
    das, the, house = SRC.index("das"), TGT.index("the"), TGT.index("house")
    assert got[(das, the)] == pytest.approx((1 / 3 + 1 / 3 + 1 / 5) / (2 / 3 + 2 / 3 + 4 / 5), abs=1e-12)
    assert got[(das, house)] == pytest.approx((1 / 3 + 1 / 5) / (2 / 3 + 2 / 3 + 4 / 5), abs=1e-12)
    null = len(SRC)  # NULL meets all 10 target tokens: total 3 * (2/3) + 4/5
    assert got[(null, the)] == pytest.approx((1 / 3 + 1 / 3 + 1 / 5) / (2 + 4 / 5), abs=1e-12)


def test_chunking_does_not_change_the_table():
    rng = np.random.default_rng(5)
    src = [rng.integers(4, 40, rng.integers(0, 9)) for _ in range(60)]
    tgt = [rng.integers(4, 30, rng.integers(0, 9)) for _ in range(60)]
    one = sl.translation_table(src, tgt, 40, 30, iterations=3, chunk_pairs=1)
    everything = sl.translation_table(src, tgt, 40, 30, iterations=3, chunk_pairs=10**9)
    some = sl.translation_table(src, tgt, 40, 30, iterations=3, chunk_pairs=150)
    for t in (one, some):
        assert np.array_equal(t.keys, everything.keys) and np.array_equal(t.target_counts, everything.target_counts)
        np.testing.assert_allclose(t.prob, everything.prob, rtol=1e-12, atol=0)
    ref = reference_ibm1(src, tgt, 40, 30, 3)
    assert max(abs(p - ref[k]) for k, p in as_dict(one).items()) < 1e-9


def test_pairs_with_an_empty_side_are_skipped():
    src, tgt = corpus()
    table = sl.translation_table(src, tgt, len(SRC), len(TGT), iterations=2)
    kept = [i for i in range(len(src)) if len(src[i]) and len(tgt[i])]
    alone = sl.translation_table([src[i] for i in kept], [tgt[i] for i in kept], len(SRC), len(TGT), iterations=2)
    assert np.array_equal(table.keys, alone.keys) and np.array_equal(table.prob, alone.prob)
    assert table.target_counts[TGT.index("a")] == 1  # the target `a` of the empty source is not counted
    empty = sl.translation_table([], [], 5, 5, iterations=2)
    assert len(empty.keys) == 0 and empty.target_counts.tolist() == [0] * 5
    with pytest.raises(ValueError, match="2 source sentences but 1 target"):
        sl.translation_table(src[:2], tgt[:1], len(SRC), len(TGT))


# ---------------------------------------------------------------------------------------------
# the rules
# ---------------------------------------------------------------------------------------------


def made_table(probs: dict[tuple[int, int], float], n_src: int, n_tgt: int) -> sl.TranslationTable:
    keys = sorted(s * n_tgt + t for s, t in probs)
    prob = [probs[divmod(k, n_tgt)] for k in keys]
    return sl.TranslationTable(np.array(keys, np.int64), np.array(prob), n_tgt, n_src, np.ones(n_src, np.int64),
                               np.zeros(n_tgt, np.int64))


def test_best_targets_by_probability_ties_by_id_and_tiny_ones_dropped():
    allowed = np.array([False] * 4 + [True] * 6)
    allowed[7] = False  # say, a language tag
    table = made_table({(4, 9): 0.3, (4, 5): 0.3, (4, 6): 0.39989, (4, 8): 0.00009, (4, 7): 0.0001,
                        (5, 8): 0.5, (5, 4): 0.5 - 1e-4, (5, 3): 1e-4, (6, 2): 1.0,  # <unk>/</s>: never
                        (8, 9): 0.7, (8, 4): 0.3, (8, 6): 1e-4, (8, 5): 0.99e-4}, n_src=9, n_tgt=10)
    # (4, 8) and (8, 5) fall below MIN_PROB = 1e-4; (8, 6) is at it; (4, 7) is not allowed
    assert {s: t.tolist() for s, t in sl.best_targets(table, allowed, 2).items()} == {4: [6, 5], 5: [8, 4], 8: [9, 4]}
    assert {s: t.tolist() for s, t in sl.best_targets(table, allowed, 10).items()} == {4: [6, 5, 9], 5: [8, 4],
                                                                                        8: [9, 4, 6]}
    null = made_table({(9, 5): 1.0, (4, 5): 1.0}, n_src=9, n_tgt=10)  # source id 9 is NULL here
    assert {s: t.tolist() for s, t in sl.best_targets(null, allowed, 5).items()} == {4: [5]}
    assert sl.best_targets(table, allowed, 0) == {}


def test_frequent_targets_count_descending_ties_by_id():
    counts = np.array([50, 50, 50, 50, 3, 7, 7, 0, 9, 1])
    allowed = np.array([False] * 4 + [True] * 6)
    allowed[8] = False
    assert sl.frequent_targets(counts, allowed, 3).tolist() == [5, 6, 4]
    assert sl.frequent_targets(counts, allowed, 10).tolist() == [5, 6, 4, 9]  # never a count of 0
    assert sl.frequent_targets(counts, allowed, 0).tolist() == []


def test_allowed_targets_leave_out_specials_tags_and_what_a_line_cannot_hold():
    d = dictionary("a", ">>fr<<", ">>not a tag", "b c", "x\ry", "", "é")
    assert sl.allowed_targets(d).tolist() == [False] * 4 + [True, False, False, False, False, False, True]


def test_build_lists_best_identity_and_frequent_never_specials_nor_tags():
    src = dictionary("das", "haus", ">>en<<", "Berlin", "klein")
    tgt = dictionary("the", "house", ">>en<<", "Berlin", "small", "klein")
    text = [(">>en<< das haus", "the house"), (">>en<< Berlin", "Berlin"), (">>en<< das <unk>", "the <unk> >>en<<"),
            (">>en<< klein", "small")]
    s_rows, t_rows = corpus(text, src, tgt)
    rules = sl.build(s_rows, t_rows, src, tgt, best=2, frequent=2, iterations=3)
    listed = [p for targets in rules.values() for p in targets]
    assert not {"<pad>", "<s>", "</s>", "<unk>", ">>en<<"} & set(listed)
    assert not {"<pad>", "<s>", "</s>", "<unk>"} & set(rules)
    assert list(rules) == ["", "das", "haus", ">>en<<", "Berlin", "klein"]  # always-list, then source order
    assert rules[""] == ["the", "house"]  # the: 2; then house, Berlin, small: 1 each, by id
    assert rules["das"][0] == "the" and len(rules["das"]) == 2
    assert rules["Berlin"] == ["Berlin"]  # its best target is itself: not listed twice
    assert rules["klein"] == ["small", "klein"]  # identity after the best ones
    assert rules[">>en<<"][:1] == ["the"]  # a tag is a key
    no_identity = sl.build(s_rows, t_rows, src, tgt, best=2, frequent=2, iterations=3, identity=False)
    assert no_identity["klein"] == ["small"] and "" in no_identity
    bare = sl.build(s_rows, t_rows, src, tgt, best=0, frequent=0, identity=False)
    assert bare == {}
    assert sl.build(s_rows, t_rows, src, tgt, best=0, frequent=0) == {"Berlin": ["Berlin"], "klein": ["klein"]}


def test_build_reports_its_progress():
    s_rows, t_rows = corpus()
    seen = []
    sl.build(s_rows, t_rows, SRC, TGT, iterations=2, progress=lambda *a: seen.append(a))
    n = len(s_rows)
    assert seen[-1] == ("EM round 2/2", n, n) and ("pairs", n, n) in seen and ("EM round 1/2", n, n) in seen


# ---------------------------------------------------------------------------------------------
# the file
# ---------------------------------------------------------------------------------------------


def test_write_then_load_round_trip(tmp_path):
    s_rows, t_rows = corpus()
    rules = sl.build(s_rows, t_rows, SRC, TGT, best=3, frequent=2, iterations=2)
    p = tmp_path / "shortlist.txt"
    sl.write(p, rules)
    text = p.read_text("utf-8")
    assert text == "".join(f"{k}\t{' '.join(v)}\n" for k, v in rules.items())
    assert text.startswith("\t")  # the always-list first
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left
    short = sl.Shortlist.load(p, SRC, TGT)
    assert short.path == p and short.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    assert len(short) == len(rules) and short.max_ngram == 1
    for key, targets in rules.items():
        row = [SRC.index(key)] if key else []
        want = {0, 1, 2, 3} | {TGT.index(t) for t in rules[""] + targets}
        assert short.candidates([np.array(row, np.int64)]).tolist() == sorted(want)
    moved = {k: v for k, v in rules.items() if k} | {"": rules[""]}
    sl.write(p, moved)
    assert p.read_text("utf-8") == text  # "" first, wherever the dict has it


def test_write_refuses_what_cannot_be_a_line(tmp_path):
    for rules in ({}, {"a": []}, {"a": ["b c"]}, {"a\tb": ["c"]}, {"a": ["x\ny"]}):
        with pytest.raises(ValueError):
            sl.write(tmp_path / "x.txt", rules)
    assert not (tmp_path / "x.txt").exists()


NGRAM_FILE = ("\tthe a\n"
              "das\tthe\n"
              "haus\thouse\n"
              "das haus\thouse the\n"
              "haus ist klein\tsmall\n"
              "ist klein\tsmall big\n"
              "ein\ta\n")
NGRAM_RULES = {tuple(k.split(" ")) if k else (): v.split(" ") for k, v in
               (line.split("\t") for line in NGRAM_FILE.splitlines())}


def brute_force(rules: dict[tuple[str, ...], list[str]], sentences: list[list[str]], extra=()) -> list[int]:
    """Every n-gram of every sentence looked up, for n up to the longest key."""
    longest = max(len(k) for k in rules)
    found = {0, 1, 2, 3, *extra} | {TGT.index(t) for t in rules.get((), [])}
    for tokens in sentences:
        for i, n in itertools.product(range(len(tokens)), range(1, longest + 1)):
            if i + n <= len(tokens) and tuple(tokens[i:i + n]) in rules:
                found |= {TGT.index(t) for t in rules[tuple(tokens[i:i + n])]}
    return sorted(found)


def test_candidates_are_the_union_over_every_ngram(tmp_path):
    p = tmp_path / "vmap.txt"
    p.write_text(NGRAM_FILE, encoding="utf-8")
    short = sl.Shortlist.load(p, SRC, TGT)
    assert (len(short), short.max_ngram) == (7, 3)
    rules = NGRAM_RULES
    rng = np.random.default_rng(3)
    words = [w for w in SRC.symbols[4:]]
    for _ in range(200):
        sentences = [list(rng.choice(words, rng.integers(0, 7))) for _ in range(rng.integers(0, 5))]
        extra = [int(x) for x in rng.integers(0, len(TGT), rng.integers(0, 3))]
        got = short.candidates([np.array([SRC.index(w) for w in s], np.int64) for s in sentences], extra)
        assert got.dtype == np.int64 and got.tolist() == brute_force(rules, sentences, extra)
    got = short.candidates([SRC.encode("das haus ist klein".split())])
    assert [TGT[i] for i in got] == ["<pad>", "<s>", "</s>", "<unk>", "the", "house", "a", "small", "big"]
    assert short.candidates([]).tolist() == [0, 1, 2, 3, TGT.index("the"), TGT.index("a")]


def test_a_key_as_long_as_its_sentence_is_found(tmp_path):
    """A key that spans its whole sentence is the sentence's only window of that length: `ist
    klein` alone gets the 2-gram's `small big`, which no unigram lists."""
    p = tmp_path / "vmap.txt"
    p.write_text(NGRAM_FILE, encoding="utf-8")
    short = sl.Shortlist.load(p, SRC, TGT)
    for key in filter(None, NGRAM_RULES):
        assert short.candidates([SRC.encode(list(key))]).tolist() == brute_force(NGRAM_RULES, [list(key)]), key
    got = short.candidates([SRC.encode(["ist", "klein"])])
    assert [TGT[i] for i in got] == ["<pad>", "<s>", "</s>", "<unk>", "the", "a", "small", "big"]


def test_candidates_refuse_ids_outside_the_dictionaries(tmp_path):
    p = tmp_path / "vmap.txt"
    p.write_text("das\tthe\n", encoding="utf-8")
    short = sl.Shortlist.load(p, SRC, TGT)
    assert short.candidates([np.array([SRC.index("das")])]).tolist() == [0, 1, 2, 3, TGT.index("the")]
    with pytest.raises(ValueError, match="source ids must lie in"):
        short.candidates([np.array([len(SRC)])])
    with pytest.raises(ValueError, match="target ids must lie in"):
        short.candidates([], extra=[-1])


REFUSALS = [
    (b"das\tthe\nhaus house\n", 2, "no tab in the line; expected SOURCE<TAB>TARGET1 TARGET2"),
    (b"das\tthe\thouse\n", 1, "2 tabs in the line; expected SOURCE<TAB>"),
    (b"das\t\n", 1, "no target pieces after the tab; expected at least one"),
    (b"das\tthe  house\n", 1, "empty target piece (two spaces in a row, or a space at an end)"),
    (b"das\tthe \n", 1, "empty target piece"),
    (b"das  haus\tthe\n", 1, "empty source piece"),
    (b"das\tthe\n\thouse\n\tthe\n", 3, "the always-list (empty source) repeated (first at line 2); expected one"),
    (b"das\tthe\nhaus\thouse\ndas\tthe\n", 3, "source 'das' repeated (first at line 1)"),
    (b"das\tthe\nein\tzebra\n", 2, "target piece 'zebra' is not in the target dictionary"),
    (b"das\t<unk>\nein zebra\ta\n", 2, "source piece 'zebra' is not in the source dictionary"),
    (b"das\tthe\r\n", 1, "carriage return in the line (a Windows line end?); expected LF line ends"),
    (b"das\tthe\x00\n", 1, "control character '\\x00' at column 8; pieces hold no control characters"),
    ("das\tthe\x85\n".encode(), 1, "control character '\\x85' at column 8"),
    (b"das\tthe\n\nhaus\thouse\n", 2, "empty line; expected SOURCE<TAB>"),
    (b"das\tthe\n\xff\n", 2, "invalid UTF-8 (byte 0xff); expected a UTF-8 text file"),
    (b"", 1, "empty file (no rules)"),
    (b"\n\n", 1, "empty file (no rules)"),
    (b"\xef\xbb\xbfdas\tthe\n", 1, "source piece '\\ufeffdas' is not in the source dictionary"),
]


@pytest.mark.parametrize("data,line,message", REFUSALS)
def test_a_bad_file_is_one_line_naming_file_and_line(tmp_path, data, line, message):
    p = tmp_path / "vmap.txt"
    p.write_bytes(data)
    with pytest.raises(UserError) as e:
        sl.Shortlist.load(p, SRC, TGT)
    text = str(e.value)
    assert text.startswith(f"{p}:{line}: ") and message in text and "\n" not in text, text


def test_blank_lines_may_end_the_file_and_specials_may_be_listed(tmp_path):
    p = tmp_path / "vmap.txt"
    p.write_bytes(b"das\tthe <unk>\n\n\n")
    assert sl.Shortlist.load(p, SRC, TGT).candidates([np.array([SRC.index("das")])]).tolist() == [0, 1, 2, 3, 4]
    p.write_bytes(b"das\tthe")  # no final newline
    assert len(sl.Shortlist.load(p, SRC, TGT)) == 1


def test_a_missing_file_or_a_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match="shortlist file not found"):
        sl.Shortlist.load(tmp_path / "nope.txt", SRC, TGT)
    with pytest.raises(UserError, match="is a directory; expected a shortlist file"):
        sl.Shortlist.load(tmp_path, SRC, TGT)


# ---------------------------------------------------------------------------------------------
# nmtkit shortlist
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return word_mapping_data_dir(tmp_path_factory.mktemp("shortlist"), 300, 5, 12, seed=4)


def test_the_command_writes_a_shortlist_beside_the_vocabulary(data_dir, run_cli):
    r = run_cli("shortlist", data_dir, "--best", "3", "--frequent", "4")
    out = data_dir / sl.DEFAULT_NAME
    assert r.code == 0, r
    assert r.out == f"{out}: 12 source keys, 4.0 target pieces per key on average, 4 always-candidates\n"
    assert "IBM Model 1 on the 300 sentence pairs of 'train', 5 EM rounds" in r.err
    src, tgt = load_dictionaries(data_dir)
    short = sl.Shortlist.load(out, src, tgt)
    rules = dict(line.split("\t") for line in out.read_text("utf-8").splitlines())
    for i in range(12):  # the task maps wK to WK: IBM-1 finds it first
        assert rules[f"w{i}"].split(" ")[0] == f"W{i}"
        assert rules[f"w{i}"].split(" ")[-1] == f"w{i}"  # the joint dictionary: identity
        assert tgt.index(f"W{i}") in short.candidates([src.encode([f"w{i}"])])
    assert len(rules[""].split(" ")) == 4


def test_the_command_writes_elsewhere_and_refuses_bad_flags_and_outputs(data_dir, run_cli, tmp_path):
    out = tmp_path / "sl.txt"
    out.write_text("an earlier output\n")
    r = run_cli("shortlist", data_dir, "-o", out, "--no-identity", "--iterations", "1", "--best", "1",
                "--frequent", "0")
    assert r.code == 0 and r.out.startswith(f"{out}: 12 source keys, 1.0 target pieces per key"), r
    assert not out.read_text("utf-8").startswith("\t")  # no always-list with --frequent 0
    cases = [
        (("--best", "-1"), "--best must be >= 0, got -1"),
        (("--frequent", "-2"), "--frequent must be >= 0, got -2"),
        (("--iterations", "0"), "--iterations must be >= 1, got 0"),
        (("-o", data_dir / "dict.de.txt"), f"--output {data_dir / 'dict.de.txt'} is dict.de.txt, a file of the "
                                           f"data directory {data_dir}"),
        (("-o", data_dir / "manifest.json"), "is manifest.json, a file of the data directory"),
        (("-o", tmp_path), f"--output {tmp_path} is a directory; give a file name"),
        (("--split", "test"), "no split 'test'"),
        (("--best", "0", "--frequent", "0", "--no-identity"), "no rules for a shortlist"),
    ]
    for args, message in cases:
        r = run_cli("shortlist", data_dir, *args)
        lines = [ln for ln in r.err.splitlines() if ln.startswith("nmtkit: error:")]
        assert r.code == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in r.err, (args, r)
    r = run_cli("shortlist", tmp_path / "nowhere")
    assert r.code == 2 and "data directory not found" in r.err and "Traceback" not in r.err


def test_the_command_writes_the_builders_rules_for_its_flags(data_dir, run_cli, tmp_path):
    """The file is `build`'s rules for every flag given, --iterations among them: one EM round
    ranks the targets of several pieces otherwise than five do on this corpus."""
    src, tgt = load_dictionaries(data_dir)
    rows = sl.training_rows(data_dir, load_manifest(data_dir))
    out, want = tmp_path / "sl.txt", tmp_path / "want.txt"
    r = run_cli("shortlist", data_dir, "-o", out, "--iterations", "1", "--best", "3", "--frequent", "2",
                "--no-identity")
    assert r.code == 0, r
    sl.write(want, sl.build(*rows, src, tgt, best=3, frequent=2, iterations=1, identity=False))
    assert out.read_text("utf-8") == want.read_text("utf-8")
    sl.write(want, sl.build(*rows, src, tgt, best=3, frequent=2, iterations=sl.ITERATIONS, identity=False))
    assert out.read_text("utf-8") != want.read_text("utf-8")  # the rounds matter here


def test_the_command_refuses_an_output_in_an_export_directory(data_dir, run_cli, tmp_path):
    (tmp_path / "nmtkit.json").write_text("{}")
    r = run_cli("shortlist", data_dir, "-o", tmp_path / "vmap.txt")
    assert r.code == 2 and "is inside the export directory" in r.err and "Traceback" not in r.err


def test_the_command_on_a_multilingual_directory_keys_the_tags(tmp_path, run_cli):
    import random

    from nmtkit.data import multilingual as ML
    from nmtkit.data.preprocess import PreprocessConfig

    rng = random.Random(2)
    raw = tmp_path / "raw"
    raw.mkdir()
    words = ["hat", "sol", "mir", "kop"]
    lines = [[rng.choice(words) for _ in range(rng.randint(2, 5))] for _ in range(60)]
    for lang in ("de", "en", "fr"):
        (raw / f"train.{lang}").write_text("".join(" ".join(lang + w for w in ln) + "\n" for ln in lines))
    pairs = [("de", "en"), ("en", "fr")]
    cfg = PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(raw / "train"),
                           destdir=str(tmp_path / "data"), vocab_size=40)
    ML.preprocess_multilingual(cfg, pairs, 5.0)
    r = run_cli("shortlist", tmp_path / "data", "--frequent", "0")
    assert r.code == 0, r
    assert "on the 120 sentence pairs" in r.err  # both pairs, one table
    rules = dict(line.split("\t") for line in (tmp_path / "data" / sl.DEFAULT_NAME).read_text("utf-8").splitlines())
    assert ">>en<<" in rules and ">>fr<<" in rules
    assert not any(t.startswith(">>") for targets in rules.values() for t in targets.split(" "))
    en, fr = set(rules[">>en<<"].split(" ")), set(rules[">>fr<<"].split(" "))
    assert any("en" in t for t in en) and not any("fr" in t for t in en)  # >>en<< maps to English pieces
    assert any("fr" in t for t in fr) and not any("en" in t for t in fr)


def test_a_language_vocabulary_holds_the_pieces_of_that_languages_targets(tmp_path, run_cli):
    """--language LANG: every piece of the targets in LANG (of every pair into it, counted from
    the shards) as the always-list, in dictionary order; no keys; --min-count drops the rare
    ones; a language that no pair translates into, a bad code, a bad count: one line each."""
    import random
    from collections import Counter

    from nmtkit.data import multilingual as ML
    from nmtkit.data.preprocess import PreprocessConfig
    from nmtkit.data.shards import load_split

    rng = random.Random(3)
    raw = tmp_path / "raw"
    raw.mkdir()
    words = ["hat", "sol", "mir", "kop", "lun"]
    lines = [[rng.choice(words) for _ in range(rng.randint(2, 5))] for _ in range(80)]
    lines[0] = ["zzqx"]  # a word that occurs once, in every language
    for lang in ("de", "en", "fr"):  # and one all share, "qq": on every German and English line, 5 French ones
        (raw / f"train.{lang}").write_text("".join(" ".join(lang + w for w in ln) + (" qq" if lang != "fr" or k < 5 else "")
                                                   + "\n" for k, ln in enumerate(lines)))
    cfg = PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(raw / "train"),
                           destdir=str(tmp_path / "data"), vocab_size=60)
    ML.preprocess_multilingual(cfg, [("de", "en"), ("en", "fr"), ("de", "fr")], 5.0)
    data = tmp_path / "data"
    src, tgt = load_dictionaries(data)

    def counts(*pairs: str) -> Counter:
        c = Counter()
        for p in pairs:
            rows = load_split(data, f"train.{p}", p[-2:])
            c.update(int(t) for i in range(len(rows)) for t in rows[i])
        return c

    fr = counts("en-fr", "de-fr")
    r = run_cli("shortlist", data, "--language", "fr")
    assert r.code == 0, r
    out = data / "shortlist.fr.txt"
    want = [tgt.symbols[i] for i in sorted(fr) if i >= 4]
    assert r.out == f"{out}: the fr vocabulary, {len(want)} pieces of the 160 'train' targets in fr, always candidates\n"
    (line,) = out.read_text("utf-8").splitlines()
    assert line == "\t" + " ".join(want)
    assert any("fr" in p for p in want) and not any("en" in p or "de" in p for p in want)
    short = sl.Shortlist.load(out, src, tgt)
    assert short.max_ngram == 0 and len(short) == 1
    # whatever the source, the candidates are the specials and the French pieces
    assert short.candidates([np.array([4, 5, 6])]).tolist() == [0, 1, 2, 3, *sorted(i for i in fr if i >= 4)]
    # the English vocabulary (de-en's targets alone), the pieces seen once left out
    en = counts("de-en")
    r = run_cli("shortlist", data, "--language", "en", "--min-count", "2", "-o", tmp_path / "en.txt")
    assert r.code == 0, r
    twice = [tgt.symbols[i] for i in sorted(en) if i >= 4 and en[i] >= 2]
    assert (tmp_path / "en.txt").read_text("utf-8") == "\t" + " ".join(twice) + "\n"
    assert len(twice) < len([i for i in en if i >= 4])  # zzqx's pieces were seen once
    # --min-ratio 2: a piece's share of the French target tokens at least twice its share of the
    # English ones (the other target language); ties and pieces English lacks kept
    r = run_cli("shortlist", data, "--language", "fr", "--min-ratio", "2", "-o", tmp_path / "fr2.txt")
    assert r.code == 0, r
    n_fr, n_en = sum(fr.values()), sum(en.values())
    distinct = [tgt.symbols[i] for i in sorted(fr) if i >= 4 and fr[i] / n_fr >= 2 * en.get(i, 0) / n_en]
    assert (tmp_path / "fr2.txt").read_text("utf-8") == "\t" + " ".join(distinct) + "\n"
    assert "▁qq" in want and "▁qq" not in distinct  # English's far more than French's
    assert "▁frhat" in distinct and "▁frsol" in distinct
    for flags, message in [(["--language", "de"], f"--language de: no pair of {data} translates into it "
                                                  "(its target languages: en, fr)"),
                           (["--language", "../x"], "--language must be a language code such as de or pt_br, got '../x'"),
                           (["--language", "fr", "--min-count", "0"], "--min-count must be >= 1, got 0"),
                           (["--language", "fr", "--min-ratio", "-1"], "--min-ratio must be >= 0, got -1.0"),
                           (["--language", "fr", "--min-ratio", "nan"], "--min-ratio must be >= 0, got nan"),
                           (["--language", "fr", "--min-ratio", "inf"], "--min-ratio must be >= 0, got inf"),
                           (["--language", "fr", "--min-count", "9999"],
                            "no target piece of fr in 'train' passes --min-count 9999 and --min-ratio 0")]:
        r = run_cli("shortlist", data, *flags, "-o", tmp_path / "bad.txt")
        assert r.code == 2 and message in r.err and "Traceback" not in r.err, (flags, r.err)
        assert not (tmp_path / "bad.txt").exists()


def test_a_bilingual_directory_has_the_vocabulary_of_its_target_language(data_dir, run_cli, tmp_path):
    r = run_cli("shortlist", data_dir, "--language", "en", "-o", tmp_path / "en.txt")
    assert r.code == 0, r
    src, tgt = load_dictionaries(data_dir)
    from nmtkit.data.shards import load_split

    targets = load_split(data_dir, "train", "en")
    seen = {int(t) for i in range(len(targets)) for t in targets[i]}
    listed = (tmp_path / "en.txt").read_text("utf-8").split("\t")[1].split()
    assert listed == [tgt.symbols[i] for i in sorted(seen) if i >= 4]  # dictionary order, no specials
    r = run_cli("shortlist", data_dir, "--language", "de", "-o", tmp_path / "de.txt")
    assert r.code == 2 and f"--language de: no pair of {data_dir} translates into it (its target languages: en)" in r.err


def test_multi30k_shortlists_cover_the_references(tmp_path, run_cli):
    """On 3,000 Multi30k pairs (words, no subwords): the shortlist of each validation sentence
    holds most of its reference's words (those outside it the search cannot produce) in a few
    percent of the vocabulary, and `Hund` is translated as `dog`."""
    from nmtkit.data.preprocess import PreprocessConfig, preprocess

    for lang in ("de", "en"):
        for name, kind, n in (("train", "train", 3000), ("val", "valid", 200)):
            with gzip.open(shared_file("multi30k", f"{name}.{lang}.gz"), "rt", encoding="utf-8") as fh:
                text = [next(fh) for _ in range(n)]
            (tmp_path / f"{kind}.{lang}").write_text("".join(text), encoding="utf-8")
    data = tmp_path / "bin"
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(tmp_path / "train"),
                                validpref=[str(tmp_path / "valid")], destdir=str(data), bpe="none"))
    assert run_cli("shortlist", data).code == 0
    src, tgt = load_dictionaries(data)
    short = sl.Shortlist.load(data / sl.DEFAULT_NAME, src, tgt)
    rules = dict(line.split("\t") for line in (data / sl.DEFAULT_NAME).read_text("utf-8").splitlines())
    assert rules["Hund"].split(" ")[0] == "dog" and rules["Mann"].split(" ")[0] == "man"
    from nmtkit.data.shards import load_split

    srcs, tgts = load_split(data, "valid", "de"), load_split(data, "valid", "en")
    covered = known = sizes = 0
    for i in range(len(srcs)):
        cands = set(short.candidates([srcs[i]]).tolist())
        ref = [t for t in tgts[i].tolist() if t != tgt.unk]
        covered, known, sizes = covered + sum(t in cands for t in ref), known + len(ref), sizes + len(cands)
    assert covered / known > 0.8  # 0.86: words, 3,000 sentences; unseen words have no rule
    assert sizes / len(srcs) < 0.05 * len(tgt)  # 153 of 4,504
