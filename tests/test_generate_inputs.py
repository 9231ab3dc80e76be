"""`nmtkit.generation.inputs` on its own: how generate names its inputs in messages and counts
the lines of a text file (the progress bar's total, --reference's line check)."""

from __future__ import annotations

import gzip

import pytest

from nmtkit.errors import UserError
from nmtkit.generation.inputs import InputSpec
from nmtkit.io import count_lines


def test_inputs_are_named_as_messages_name_them():
    split = InputSpec(None, "test", "data-bin")
    assert (split.name, split.line_name(0)) == ("split 'test'", "data-bin split 'test', sentence 1")
    assert InputSpec("news.de", None, None).line_name(11) == "news.de:12"
    assert InputSpec("-", None, None).name == "<stdin>"
    assert not InputSpec("-", None, None).has_terms and InputSpec("-", None, None, prefix="p.txt").has_terms


def test_count_lines_counts_as_read_lines_reads(tmp_path):
    plain, last, gz = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt.gz"
    plain.write_bytes(b"x\n\ny\n")
    last.write_bytes(b"x\ny")  # no newline after the last line: still a line
    gz.write_bytes(gzip.compress(b"1\n2\n3\n"))
    assert count_lines(str(plain)) == 3 and count_lines(str(last)) == 2
    assert count_lines(str(gz)) is None  # the progress bar's total is not worth a pass
    assert count_lines(str(gz), exact=True) == 3
    with pytest.raises(UserError, match="file not found"):
        count_lines(str(tmp_path / "missing.txt"), exact=True)
    assert count_lines(str(tmp_path / "missing.txt")) is None
