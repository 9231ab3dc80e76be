"""Dictionary: fairseq-compatible ordering, cuts, padding, the file format and its errors."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from nmtkit.data.dictionary import Dictionary
from nmtkit.errors import UserError

COUNTS = {"b": 3, "a": 3, "c": 5, "d": 1, "e": 2}


def test_specials_are_fixed():
    d = Dictionary()
    assert (d.pad, d.bos, d.eos, d.unk) == (0, 1, 2, 3)
    assert d.symbols == ["<pad>", "<s>", "</s>", "<unk>"]
    assert len(d) == 4


def test_from_counts_orders_by_count_then_alphabetically():
    d = Dictionary.from_counts(COUNTS)
    assert d.symbols[4:] == ["c", "a", "b", "e", "d"]
    assert [d.index(t) for t in "cabed"] == [4, 5, 6, 7, 8]
    assert d.counts[4:] == [5, 3, 3, 2, 1]


def test_nwords_counts_the_specials_and_threshold_drops_rare_tokens():
    assert Dictionary.from_counts(COUNTS, nwords=6).symbols[4:] == ["c", "a"]
    assert Dictionary.from_counts(COUNTS, threshold=3).symbols[4:] == ["c", "a", "b"]
    assert Dictionary.from_counts(COUNTS, nwords=8, threshold=2).symbols[4:] == ["c", "a", "b", "e"]


def test_pad_to_multiple_adds_fairseq_madeupwords():
    d = Dictionary.from_counts(COUNTS, pad_to_multiple=8)  # 4 specials + 5 tokens = 9 -> 16
    assert len(d) == 16
    assert d.symbols[9:] == [f"madeupword{i:04d}" for i in range(7)]
    assert d.counts[9:] == [0] * 7
    assert len(Dictionary.from_counts({"x": 1, "y": 1, "z": 1, "w": 1}, pad_to_multiple=8)) == 8


def test_specials_in_counts_are_ignored_and_cannot_be_faked_by_text():
    d = Dictionary.from_counts({"<s>": 10, "</s>": 4, "<unk>": 7, "x": 1})
    assert d.symbols[4:] == ["x"]
    assert d.index("<s>") == d.unk and d.index("</s>") == d.unk and d.index("<pad>") == d.unk
    assert d.index("<unk>") == d.unk
    assert d.index("never-seen") == d.unk


def test_encode_and_string():
    d = Dictionary.from_counts(COUNTS)
    ids = d.encode(["a", "zzz", "c"])
    assert ids.dtype == np.int64 and ids.tolist() == [5, 3, 4]
    # pad, bos and eos are dropped; <unk> stays visible
    assert d.string([1, 5, 3, 4, 2, 0, 0]) == ["a", "<unk>", "c"]
    assert d.string(np.array([6, 7], dtype=np.uint16)) == ["b", "e"]


def test_save_load_round_trip_and_sha256(tmp_path):
    d = Dictionary.from_counts(COUNTS, pad_to_multiple=8)
    p = tmp_path / "dict.txt"
    sha = d.save(p)
    text = p.read_text(encoding="utf-8")
    assert text.startswith("c 5\na 3\nb 3\ne 2\nd 1\nmadeupword0000 0\n")
    assert "<pad>" not in text and "<unk>" not in text
    assert sha == hashlib.sha256(p.read_bytes()).hexdigest() == d.sha256
    d2 = Dictionary.load(p)
    assert d2 == d and d2.sha256 == sha
    assert not list(tmp_path.glob(".*tmp"))  # atomic write left no temporary file


def test_load_accepts_unicode_tokens_and_crlf(tmp_path):
    p = tmp_path / "d.txt"
    p.write_bytes("▁Mädchen 12\r\nx@@ 3\r\n".encode("utf-8"))
    d = Dictionary.load(p)
    assert d.symbols[4:] == ["▁Mädchen", "x@@"] and d.counts[4:] == [12, 3]


@pytest.mark.parametrize(
    "content, line, what",
    [
        ("a 3\nb\n", 2, "malformed"),
        ("a 3\nb x\n", 2, "malformed"),
        ("a 3\nb -1\n", 2, "malformed"),
        ("a 3\n\nb 1\n", 2, "empty line"),
        ("a 3\nb 2\na 1\n", 3, "duplicate"),
        ("<unk> 3\n", 1, "special"),
    ],
)
def test_load_rejects_malformed_lines_naming_file_and_line(tmp_path, content, line, what):
    p = tmp_path / "dict.de.txt"
    p.write_text(content, encoding="utf-8")
    with pytest.raises(UserError) as e:
        Dictionary.load(p)
    assert f"{p}:{line}:" in str(e.value) and what in str(e.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(UserError, match="dictionary not found"):
        Dictionary.load(tmp_path / "nope.txt")


# ---- behaviour pinned down by the mutation benchmark (recipes/bench/mutation.sh dictionary) ----


def test_membership_equality_and_special_counts():
    d = Dictionary.from_counts(COUNTS)
    assert d.counts[:4] == [0, 0, 0, 0]  # specials carry no count (they are not in the file)
    assert "a" in d and "<pad>" in d and "zzz" not in d
    same = Dictionary.from_counts(COUNTS)
    assert d == same and not (d != same)
    # equal symbols, other counts / equal counts, other symbols / not a Dictionary: all unequal
    assert d != Dictionary.from_counts({**COUNTS, "d": 2, "e": 2})  # e, d tie -> d first: other symbols
    other_counts = Dictionary.from_counts(COUNTS)
    other_counts.counts[4] += 1
    assert d != other_counts
    renamed = Dictionary.from_counts({"b": 3, "a": 3, "f": 5, "d": 1, "e": 2})
    assert renamed.counts == d.counts and d != renamed
    assert d != "c a b e d" and d != object()


def test_add_symbol_appends_or_adds_to_the_count():
    d = Dictionary()
    assert d.add_symbol("x") == 4 and d.counts[4] == 0  # default count 0
    assert d.add_symbol("y", 5) == 5
    assert d.add_symbol("y", 2) == 5 and d.add_symbol("y") == 5  # existing: same id, count added
    assert d.symbols == ["<pad>", "<s>", "</s>", "<unk>", "x", "y"] and d.counts[4:] == [0, 7]


def test_from_counts_takes_pairs_merges_repeats_and_keeps_zero_counts():
    d = Dictionary.from_counts([("a", 1), ("b", 2), ("a", 2), ("z", 0)])  # a: 1 + 2 = 3
    assert d.symbols[4:] == ["a", "b", "z"] and d.counts[4:] == [3, 2, 0]
    # threshold defaults to 0: a count-0 token is kept (fairseq's finalize keeps everything then)
    assert Dictionary.from_counts({"z": 0}).symbols[4:] == ["z"]
    with pytest.raises(ValueError, match=r"^pad_to_multiple must be >= 1, got 0$"):
        Dictionary.from_counts(COUNTS, pad_to_multiple=0)


@pytest.mark.parametrize("nwords, expect", [(0, "cabed"), (-1, "cabed"), (1, ""), (4, ""), (5, "c"), (9, "cabed")])
def test_nwords_limit_includes_the_specials(nwords, expect):
    # <= 0: no limit; otherwise at most nwords symbols including the 4 specials (never fewer than them)
    assert Dictionary.from_counts(COUNTS, nwords=nwords).symbols[4:] == list(expect)


def test_pad_to_multiple_two_and_one():
    assert len(Dictionary.from_counts(COUNTS, pad_to_multiple=2)) == 10  # 9 -> 10
    assert Dictionary.from_counts(COUNTS, pad_to_multiple=2).symbols[9:] == ["madeupword0000"]
    assert len(Dictionary.from_counts(COUNTS, pad_to_multiple=1)) == 9


def test_load_token_with_a_space_splits_at_the_last_one(tmp_path):
    # fairseq reads `line.rsplit(" ", 1)`: everything before the last space is the token
    p = tmp_path / "d.txt"
    p.write_text("a b 3\n", encoding="utf-8")
    d = Dictionary.load(p)
    assert d.symbols[4:] == ["a b"] and d.counts[4:] == [3]


def test_load_exact_messages(tmp_path):
    p = tmp_path / "dict.txt"
    p.write_bytes(b"a 3\n\xff 2\n")
    with pytest.raises(UserError) as e:
        Dictionary.load(p)
    assert str(e.value) == f"{p}: invalid UTF-8 at byte 4"
    p.write_text(" 3\n", encoding="utf-8")  # empty token
    with pytest.raises(UserError) as e:
        Dictionary.load(p)
    assert str(e.value) == f"{p}:1: malformed dictionary line ' 3' (expected 'token count')"
    long = "x" * 70 + " y"
    p.write_text(long + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        Dictionary.load(p)
    assert str(e.value) == f"{p}:1: malformed dictionary line {'x' * 60!r} (expected 'token count')"
    p.write_text("a 3\n</s> 1\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        Dictionary.load(p)
    assert str(e.value) == f"{p}:2: special symbol '</s>' (specials are implied, not listed)"
    p.write_text("a 3\nb 2\na 1\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        Dictionary.load(p)
    assert str(e.value) == f"{p}:3: duplicate token 'a' (specials are implied, not listed)"


# ---- load_dictionaries: a joined dictionary is parsed once, every file still checked ----------

def _data_dir(root, joined: bool):
    from nmtkit.data.preprocess import PreprocessConfig, preprocess

    (root / "train.de").write_text("ein hund läuft\nzwei katzen\n")
    (root / "train.en").write_text("a dog runs\ntwo cats\n")
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(root / "train"),
                                destdir=str(root / "bin"), bpe="none", joined_dictionary=joined))
    return root / "bin"


@pytest.mark.parametrize("joined", [True, False])
def test_load_dictionaries_parses_a_joined_dictionary_once(tmp_path, joined):
    from nmtkit.data.manifest import load_dictionaries

    data = _data_dir(tmp_path, joined)
    src, tgt = load_dictionaries(data)
    assert (src is tgt) is joined
    assert src.sha256 == Dictionary.load(data / "dict.de.txt").sha256
    assert tgt.sha256 == Dictionary.load(data / "dict.en.txt").sha256
    assert ("dog" in tgt) and (("hund" in tgt) is joined)


def test_load_dictionaries_checks_the_second_file_of_a_joined_pair(tmp_path):
    from nmtkit.data.manifest import load_dictionaries

    data = _data_dir(tmp_path, joined=True)
    p = data / "dict.en.txt"
    b = bytearray(p.read_bytes())
    b[0] ^= 0x01  # same size: only the checksum can tell
    p.write_bytes(bytes(b))
    with pytest.raises(UserError, match=r"dict\.en\.txt: checksum mismatch with manifest\.json"):
        load_dictionaries(data)


# --- property tests (Hypothesis) ---
# Dictionary.load reads any file: what it accepts is what `_reference` (a regular expression per
# line) accepts, token for token; what it refuses is refused with one line naming file:line (or
# the byte offset of invalid UTF-8). save -> load gives the same dictionary and the same bytes.

import re  # noqa: E402
import sys  # noqa: E402

from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nmtkit.data.dictionary import SPECIALS  # noqa: E402

# tokens: any character but the line end (surrogates cannot be written as UTF-8), the tricky ones often
_CHARS = st.one_of(st.characters(exclude_categories=["Cs"], exclude_characters="\n"),
                   st.sampled_from(" \r\t\x00\ufeff\u2028\x85▁@²٣<>/"))
_TOKEN = st.text(_CHARS, min_size=1, max_size=8).filter(lambda t: t not in SPECIALS)
_COUNT = st.one_of(st.integers(0, 1000), st.integers(0, 10**40))


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_dictionary")


@pytest.mark.fuzz
@given(entries=st.lists(st.tuples(_TOKEN, _COUNT), max_size=20, unique_by=lambda e: e[0]))
@example(entries=[("a b", 3), (" ", 0), ("x\r", 1), ("\ufeffy", 10**30), ("madeupword0000", 0)])
def test_save_load_round_trip_of_any_tokens(fuzz_dir, entries):
    d = Dictionary()
    for tok, c in entries:
        d.add_symbol(tok, c)
    p = fuzz_dir / "round.txt"
    sha = d.save(p)
    back = Dictionary.load(p)
    assert back == d and back.symbols[4:] == [t for t, _ in entries]
    assert back.to_text() == p.read_bytes().decode("utf-8") == d.to_text()
    assert sha == back.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()


_LINE = re.compile(r"(.+) ([0-9]+)", re.DOTALL)


def _reference(text: str) -> tuple[list[tuple[str, int]], int | None]:
    """(the entries a file holds, then the 1-based line of the first refused line, or None)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    entries: list[tuple[str, int]] = []
    for i, line in enumerate(lines, start=1):
        m = _LINE.fullmatch(line[:-1] if line.endswith("\r") else line)
        if m is None or len(m[2]) > sys.get_int_max_str_digits() or m[1] in SPECIALS \
                or m[1] in (t for t, _ in entries):
            return entries, i
        entries.append((m[1], int(m[2])))
    return entries, None


# one line of a dictionary file: valid, or mutated (no count, a bad count, empty, a special symbol...)
_BAD_COUNT = st.sampled_from(["", "-1", "+1", "x", "1.5", "1_000", "²", "٣", "３", "0x10", "9" * 5000, " 3", "3 "])
_FILE_LINE = st.one_of(
    st.builds(lambda t, c: f"{t} {c}", _TOKEN, _COUNT),
    st.builds(lambda t, c: f"{t} {c}", _TOKEN, _BAD_COUNT),
    st.builds(lambda t, c: f"{t} {c}", st.sampled_from([*SPECIALS, "", "a", "a "]), _COUNT),
    st.sampled_from(["", "\r", "a", " ", "a\t3", "a 007", "a 3\r", "\ufeffa 3"]),
    _TOKEN,
)


@pytest.mark.fuzz
@given(lines=st.lists(_FILE_LINE, max_size=12), eol=st.sampled_from(["\n", "\r\n"]), final=st.booleans())
@example(lines=["a ²"], eol="\n", final=True)  # str.isdigit accepts it, int() refused: a traceback
@example(lines=["a " + "9" * 5000], eol="\n", final=True)  # more digits than int() converts: a traceback
@example(lines=["a 3", "a 1"], eol="\n", final=False)
@example(lines=["a 3", "\r"], eol="\n", final=False)  # a last line of a lone CR was read as no line
def test_load_accepts_exactly_token_count_lines(fuzz_dir, lines, eol, final):
    text = eol.join(lines) + (eol if final and lines else "")
    p = fuzz_dir / "dict.xx.txt"
    p.write_text(text, encoding="utf-8", newline="")
    entries, bad = _reference(text)
    try:
        d = Dictionary.load(p)
    except UserError as e:
        msg = str(e)
        assert bad is not None and msg.startswith(f"{p}:{bad}: ") and "\n" not in msg and "\r" not in msg, msg
        return
    assert bad is None and list(zip(d.symbols[4:], d.counts[4:])) == entries
    q = fuzz_dir / "again.txt"
    d.save(q)
    assert Dictionary.load(q) == d  # what was read can be written back


@pytest.mark.fuzz
@given(data=st.one_of(st.binary(max_size=40),
                      st.lists(st.one_of(st.sampled_from([b"a 1\n", b"\xff", b"\xc3", b"\xed\xa0\x80", b" ", b"\n"]),
                                         _FILE_LINE.map(lambda s: s.encode("utf-8"))), max_size=8).map(b"".join)))
def test_load_of_any_bytes_is_a_dictionary_or_one_line(fuzz_dir, data):
    p = fuzz_dir / "bytes.txt"
    p.write_bytes(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        with pytest.raises(UserError) as err:
            Dictionary.load(p)
        assert str(err.value) == f"{p}: invalid UTF-8 at byte {e.start}"
        return
    entries, bad = _reference(text)
    try:
        d = Dictionary.load(p)
    except UserError as e:
        assert bad is not None and str(e).startswith(f"{p}:{bad}: ") and "\n" not in str(e)
        return
    assert bad is None and list(zip(d.symbols[4:], d.counts[4:])) == entries


def test_load_refuses_counts_that_int_cannot_read(tmp_path):
    """"²" passed str.isdigit and int() raised ValueError (a traceback); so did a count of more
    digits than Python converts; "٣" (Arabic-Indic three) was read as 3, which `save` writes back
    as other bytes than the file's."""
    p = tmp_path / "dict.txt"
    for count in ("²", "9" * 5000, "٣"):
        p.write_text(f"a 1\nb {count}\n", encoding="utf-8")
        with pytest.raises(UserError) as e:
            Dictionary.load(p)
        assert str(e.value) == f"{p}:2: malformed dictionary line {('b ' + count)[:60]!r} (expected 'token count')"


def test_load_of_a_path_the_system_cannot_stat_is_one_line(tmp_path):
    """A name longer than the file system's (ENAMETOOLONG from is_file()) was a traceback."""
    p = tmp_path / ("x" * 300)
    with pytest.raises(UserError) as e:
        Dictionary.load(p)
    assert str(e.value) == f"{p}: cannot read the dictionary: File name too long"
