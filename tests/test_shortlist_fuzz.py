"""The shortlist file's parser (nmtkit.data.shortlist) on any input: each file reads as the rules
a plain reference reader finds in it, or is refused with one line `FILE:LINE: ...` naming the
line the reference refuses first; never another exception."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nmtkit.data import shortlist as sl
from nmtkit.data.dictionary import Dictionary
from nmtkit.errors import UserError

# the CI profile's examples, at least 200 (the parser is fast); the fuzz profile's 10,000 as they are
EXAMPLES = settings(max_examples=max(200, settings.default.max_examples), deadline=None)


def dictionary(*pieces: str) -> Dictionary:
    d = Dictionary()
    for p in pieces:
        d.add_symbol(p, 1)
    return d


SRC_PIECES = ["a", "b", "▁c", "ü", ">>fr<<", "a\u2028"]
TGT_PIECES = ["A", "B", "▁C", "ü", "\ufeffZ"]
SRC, TGT = dictionary(*SRC_PIECES), dictionary(*TGT_PIECES)
CONTROL = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]} - {"\t"}


def reference(text: str) -> tuple[dict[tuple[int, ...], list[int]], int | None]:
    """(the rules of `text`, the 1-based line of the first line refused or None), read plainly."""
    lines = text.split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    rules: dict[tuple[int, ...], list[int]] = {}
    for number, line in enumerate(lines, start=1):
        if line == "" or any(c in CONTROL for c in line) or line.count("\t") != 1:
            return rules, number
        source, targets = line.split("\t")
        src = source.split(" ") if source else []
        tgt = targets.split(" ") if targets else []
        if not tgt or "" in src or "" in tgt or not all(p in SRC for p in src) or not all(p in TGT for p in tgt):
            return rules, number
        key = tuple(SRC._index[p] for p in src)
        if key in rules:
            return rules, number
        rules[key] = [TGT._index[p] for p in tgt]
    return rules, (1 if not rules else None)


def check(path, data: bytes) -> None:
    """What `Shortlist.load` and `parse` make of `data`, against the reference."""
    path.write_bytes(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        rules, bad = {}, data.count(b"\n", 0, e.start) + 1
    else:
        rules, bad = reference(text)
    try:
        got = sl.parse(path, data, SRC, TGT)
    except UserError as e:
        msg = str(e)
        assert bad is not None and msg.startswith(f"{path}:{bad}: ") and "\n" not in msg and "\r" not in msg, msg
        with pytest.raises(UserError) as again:
            sl.Shortlist.load(path, SRC, TGT)
        assert str(again.value) == msg
        return
    assert bad is None and got == rules
    short = sl.Shortlist.load(path, SRC, TGT)
    assert len(short) == len(rules) and short.max_ngram == max(map(len, rules))


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_shortlist")


_ANY = st.characters(exclude_categories=["Cs"])
_PIECE = st.one_of(st.sampled_from(SRC_PIECES + TGT_PIECES + ["", "<unk>", "<pad>", "zz", "a\r", "A\x00", "a b"]),
                   st.text(_ANY, max_size=3))
_PIECES = st.lists(_PIECE, max_size=4).map(" ".join)
_GOOD = st.builds(lambda s, t: f"{' '.join(s)}\t{' '.join(t)}", st.lists(st.sampled_from(SRC_PIECES), max_size=3),
                  st.lists(st.sampled_from(TGT_PIECES), min_size=1, max_size=3))
_LINE = st.one_of(
    _GOOD,
    st.builds(lambda s, t: f"{s}\t{t}", _PIECES, _PIECES),  # any pieces, known or not
    st.builds(lambda s, t: f"{s}\t{t}", st.sampled_from(["", "a", "a b", "b ▁c a", ">>fr<<"]),
              st.sampled_from(["A", "A B", "▁C ü", "\ufeffZ"])),
    st.sampled_from(["", "\t", "a", "a\tA\tB", "a\tA ", "a  b\tA", "\tA", "a\tA\r", " \tA", "a\u2028\tA"]),
    st.text(st.sampled_from("ab\tA \r\x0b\x85\u2028▁"), max_size=8),
)


@pytest.mark.fuzz
@EXAMPLES
@given(lines=st.lists(st.one_of(_GOOD, _LINE), max_size=8), final=st.sampled_from(["", "\n", "\n\n", "\r\n"]))
@example(lines=["a\tA", "a\tB"], final="\n")  # a repeated key
@example(lines=["\tA", "a b\tB", "\tA"], final="")  # a repeated always-list
@example(lines=[], final="\n\n")  # blank lines only: no rules
@example(lines=["a\tA", "", "b\tB"], final="\n")  # a blank line inside
def test_any_text_reads_as_its_rules_or_one_line(fuzz_dir, lines, final):
    check(fuzz_dir / "vmap.txt", ("\n".join(lines) + final).encode("utf-8"))


@pytest.mark.fuzz
@EXAMPLES
@given(data=st.one_of(
    st.binary(max_size=40),
    st.lists(st.one_of(st.sampled_from([b"a\tA\n", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\t", b"\n", b" "]),
                       _LINE.map(lambda s: s.encode("utf-8"))), max_size=8).map(b"".join)))
@example(data=b"a\tA\n\xc3")  # a truncated character on the last line
@example(data=b"\xef\xbb\xbfa\tA\n")  # a byte order mark
def test_any_bytes_read_as_rules_or_one_line(fuzz_dir, data):
    check(fuzz_dir / "bytes.txt", data)
