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
