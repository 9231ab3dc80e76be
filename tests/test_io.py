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


# --- property tests (Hypothesis) ---
# read_lines reads any bytes: what it yields is defined by `_expected_lines` (split at b"\n" only,
# one trailing b"\r" removed, everything else kept: a lone CR, NUL, a BOM), and what it refuses
# is refused with one line naming file:line, after exactly the lines before it.

import zlib  # noqa: E402

from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# pieces of a line: text (any character a file can hold, the tricky ones often), and byte
# sequences that are not UTF-8 (a lone continuation byte, a cut sequence, an overlong form, an
# encoded surrogate, bytes above U+10FFFF)
_TEXT = st.text(st.one_of(st.characters(exclude_categories=["Cs"]),
                          st.sampled_from("\r\x00\ufeff\u2028\x85\x0b\x1c é€😀 ")), max_size=12)
_INVALID = st.sampled_from([b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xc0\xaf", b"\xed\xa0\x80",
                            b"\xf4\x90\x80\x80", b"\xfe\xfe"])
_PIECE = st.one_of(_TEXT.map(lambda s: s.encode("utf-8")), _INVALID,
                   st.sampled_from([b"\n", b"\r\n", b"\r", b"\n\n", b"\r\r\n", b"\xef\xbb\xbf"]))
_DATA = st.one_of(st.lists(_PIECE, max_size=12).map(b"".join), st.binary(max_size=64))


def _expected_lines(data: bytes) -> tuple[list[str], tuple[int, int, int] | None]:
    """(the lines read, then (line, byte, column) of the first invalid UTF-8, or None)."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    lines = []
    for i, raw in enumerate(parts, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return lines, (i, raw[e.start], e.start + 1)
        lines.append(text[:-1] if text.endswith("\r") else text)
    return lines, None


def _read(path) -> tuple[list[str], UserError | None]:
    """What read_lines yields of `path`, and the UserError that ended it (or None)."""
    got = []
    try:
        for line in read_lines(path):
            got.append(line)
    except UserError as e:
        return got, e
    return got, None


def _one_line(e: UserError) -> str:
    msg = str(e)
    assert "\n" not in msg and "\r" not in msg and msg.strip() == msg and msg, repr(msg)
    return msg


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_io")


@pytest.mark.fuzz
@given(data=_DATA)
@example(data=b"\xef\xbb\xbfa\r\r\nb\x00\rc\n\n")  # BOM and NUL kept, a lone CR kept, CR CR LF loses one CR
@example(data=b"ok\nbad \xff\n")
def test_read_lines_reads_any_bytes_as_defined_or_names_file_and_line(fuzz_dir, data):
    p = fuzz_dir / "any.txt"
    p.write_bytes(data)
    lines, bad = _expected_lines(data)
    got, err = _read(p)
    assert got == lines
    if bad is None:
        assert err is None
    else:
        line, byte, col = bad
        assert _one_line(err) == f"{p}:{line}: invalid UTF-8 (byte 0x{byte:02x} at column {col})"


@pytest.mark.fuzz
@given(data=_DATA, level=st.integers(0, 9), members=st.integers(1, 3))
def test_read_lines_reads_valid_gzip_like_the_plain_file(fuzz_dir, data, level, members):
    """Any compression level, one member or several (concatenated .gz files read as one)."""
    p = fuzz_dir / "valid.txt.gz"
    cut = [len(data) * k // members for k in range(members + 1)]
    p.write_bytes(b"".join(gzip.compress(data[a:b], compresslevel=level, mtime=0) for a, b in zip(cut, cut[1:])))
    lines, bad = _expected_lines(data)
    got, err = _read(p)
    assert got == lines
    assert (err is None) == (bad is None)
    if err is not None:
        assert _one_line(err).startswith(f"{p}:{bad[0]}: invalid UTF-8")


def _damaged_gzip(draw_data: bytes, how: str, at: int, value: int) -> bytes:
    z = gzip.compress(draw_data, mtime=0)
    at %= len(z)
    if how == "truncate":
        return z[:at]
    if how == "flip":
        return z[:at] + bytes([z[at] ^ (value or 1)]) + z[at + 1:]
    return z + bytes([value]) * (at % 5 + 1)  # trailing bytes after the member


@pytest.mark.fuzz
@given(data=st.lists(_TEXT, max_size=20).map(lambda ls: "".join(f"{s}\n" for s in ls).encode("utf-8")),
       how=st.sampled_from(["truncate", "flip", "trail"]), at=st.integers(0, 10_000), value=st.integers(0, 255))
@example(data=b"hello world\n" * 100, how="flip", at=10, value=0xFF)  # zlib.error: a traceback before
@example(data=b"one\ntwo\n", how="truncate", at=15, value=0)
def test_read_lines_of_a_damaged_gzip_is_all_or_a_prefix_then_file_and_line(fuzz_dir, data, how, at, value):
    """A truncated, corrupt or trailed .gz: either all its lines (a change that gzip does not see,
    like the header's time or trailing zeros), or the lines before the damage (gzip checks its
    CRC only at the end, so for a flip these may differ) and one line naming file:line."""
    p = fuzz_dir / "damaged.txt.gz"
    p.write_bytes(_damaged_gzip(data, how, at, value))
    lines, _ = _expected_lines(data)
    got, err = _read(p)
    if err is None:
        assert got == lines or (how == "truncate" and got == [] and p.stat().st_size == 0)
        return
    msg = _one_line(err)
    assert msg.startswith(f"{p}:{len(got) + 1}: "), msg
    if how != "flip":
        assert got == lines[:len(got)]


def test_read_lines_names_the_line_of_a_corrupt_gzip(tmp_path):
    """Corrupt deflate data raised zlib.error, which read_lines let through as a traceback."""
    p = tmp_path / "c.txt.gz"
    z = bytearray(gzip.compress(b"hello world\n" * 100, mtime=0))
    z[10] ^= 0xFF  # the first byte of the deflate stream (after the 10 of the header)
    p.write_bytes(bytes(z))
    got, err = _read(p)
    assert got == [] and str(err).startswith(f"{p}:1: cannot read: Error -3 while decompressing data")
    p.write_bytes(gzip.compress(b"one\ntwo\n" * 1000, mtime=0)[:-12])  # truncated: the end missing
    got, err = _read(p)
    assert str(err) == f"{p}:{len(got) + 1}: cannot read: Compressed file ended before the end-of-stream " \
                       "marker was reached"


def test_read_json_refuses_what_json_cannot_turn_into_values(tmp_path):
    """A number of more digits than Python converts (ValueError) and nesting deeper than the
    stack (RecursionError) were tracebacks; now the one line of any other invalid JSON."""
    from nmtkit.io import read_json

    p = tmp_path / "x.json"
    for text, why in [("9" * 5000, "Exceeds the limit (4300 digits) for integer string conversion"),
                      ("[" * 100_000, "maximum recursion depth exceeded"),
                      ("{", "Expecting property name enclosed in double quotes")]:
        p.write_text(text, encoding="utf-8")
        with pytest.raises(UserError) as e:
            read_json(p)
        assert str(e.value).startswith(f"{p}: not valid JSON: {why}") and "\n" not in str(e.value)
