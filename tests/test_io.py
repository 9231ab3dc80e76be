import gzip
import os

import pytest

from nmtkit.errors import UserError
from nmtkit.io import atomic_write, read_lines, resolve_text_path


def test_read_lines_plain_gz_and_crlf(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\n\nfour")
    with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
        f.write("eins\nzwei\n".encode())
    assert list(read_lines(tmp_path / "a.txt")) == ["one", "two", "", "four"]
    assert list(read_lines(tmp_path / "b.txt.gz")) == ["eins", "zwei"]
    assert resolve_text_path(tmp_path / "b", ".txt") == tmp_path / "b.txt.gz"


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"ok\nstill ok\nbad \xff byte\n")
    with pytest.raises(UserError, match=r"bad.txt:3: invalid UTF-8"):
        list(read_lines(p))


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="file not found"):
        list(read_lines(tmp_path / "nope"))
    with pytest.raises(UserError, match="file not found"):
        resolve_text_path(tmp_path / "nope", ".de")


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(p) as f:
            f.write("half")
            raise RuntimeError("crash")
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]
    with atomic_write(p) as f:
        f.write("new")
    assert p.read_text() == "new"


def test_atomic_write_has_ordinary_permissions(tmp_path):
    p = tmp_path / "perm.txt"
    umask = os.umask(0o022)
    try:
        with atomic_write(p) as f:
            f.write("x")
    finally:
        os.umask(umask)
    assert (p.stat().st_mode & 0o777) == 0o644
