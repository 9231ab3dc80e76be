"""Subword models (nmtkit.data.subwords) by themselves, fast: sentencepiece and subword-nmt trained
on tiny texts and applied by hand, decoding of hypotheses cut off mid-word, the refusals' exact
messages, and load_subword_model on a data directory written by hand."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sentencepiece as spm

from nmtkit.data import subwords
from nmtkit.data.subwords import (
    SentencePieceModel,
    SubwordNmtModel,
    WhitespaceModel,
    count_words,
    learn_sentencepiece,
    learn_subword_nmt,
    load_model_file,
    load_subword_model,
    model_filename,
)
from nmtkit.errors import UserError

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "cat", "runs", "home"]


def _text() -> list[str]:
    """~8,400 characters; 'ß' occurs once (0.01% of the characters, below sentencepiece's
    default character_coverage of 0.9995)."""
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(6)) for _ in range(300)] + ["straße"]


@pytest.fixture(scope="module")
def spm_proto() -> bytes:
    return learn_sentencepiece(iter(_text()), 60)


def _python_c(code: str) -> list[str]:
    """`python -c CODE` importing the nmtkit these tests import (the mutated copy under a mutation
    tool): `-c` puts the working directory first on sys.path, so the package's folder goes before it."""
    root = str(Path(subwords.__file__).resolve().parents[2])
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {root!r}); {code}"]


# ---------------------------------------------------------------------------------------------
# sentencepiece
# ---------------------------------------------------------------------------------------------


def test_sentencepiece_model_is_bpe_with_full_character_coverage():
    from sentencepiece import sentencepiece_model_pb2

    proto = learn_sentencepiece(iter(_text()), 60)
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(proto)
    assert m.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE
    assert m.trainer_spec.character_coverage == 1.0
    assert len(m.pieces) == 60
    # the one 'ß' of the text is a piece of its own, not <unk> (the default coverage drops it)
    sp = SentencePieceModel(model_proto=proto)
    assert "ß" in sp.pieces()
    assert sp.sp.unk_id() not in sp.encode_ids(["straße"])[0]


def test_sentencepiece_training_is_quiet_and_deterministic():
    # a fresh process: sentencepiece's log level is process-wide, so only a first training shows
    # whether the INFO chatter (dozens of lines by default) is switched off
    code = ("import json; from nmtkit.data.subwords import learn_sentencepiece; "
            "sys.stdout.buffer.write(learn_sentencepiece(iter(json.load(sys.stdin)), 60))")
    r = subprocess.run(_python_c(code), input=json.dumps(_text()).encode(), capture_output=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stderr == b""
    assert r.stdout == learn_sentencepiece(iter(_text()), 60)  # the same bytes in another process


def test_sentencepiece_encode_decode(spm_proto, tmp_path):
    sp = SentencePieceModel(model_proto=spm_proto)
    line = "the lazy dog runs home"
    pieces = sp.encode(line)
    assert all(isinstance(p, str) for p in pieces)
    assert "".join(pieces).replace("\u2581", " ").strip() == line  # pieces spell the line
    assert sp.decode(pieces) == line
    assert sp.encode_batch([line, "cat"]) == [pieces, sp.encode("cat")]
    ids = [sp.sp.piece_to_id(p) for p in pieces]
    assert sp.encode_ids([line]) == [ids]
    assert sp.encode_ids([line, line], num_threads=2) == [ids, ids]
    assert [sp.pieces()[i] for i in ids] == pieces
    # a hypothesis cut off mid-word decodes to the pieces it has
    assert sp.decode(pieces[:-1]) == "".join(pieces[:-1]).replace("\u2581", " ").strip()
    # the same model from a file
    (tmp_path / "spm.model").write_bytes(spm_proto)
    assert SentencePieceModel(tmp_path / "spm.model").encode(line) == pieces
    assert load_model_file("sentencepiece", tmp_path / "spm.model").encode(line) == pieces


def test_sentencepiece_load_refusals(tmp_path):
    with pytest.raises(UserError) as e:
        SentencePieceModel(model_proto=b"not a model")
    assert str(e.value).startswith("<model>: cannot load sentencepiece model: ")
    p = tmp_path / "spm.model"
    p.write_bytes(b"not a model")
    with pytest.raises(UserError) as e:
        SentencePieceModel(p)
    assert str(e.value).startswith(f"{p}: cannot load sentencepiece model: ")


def test_sentencepiece_training_refusals(monkeypatch):
    with pytest.raises(UserError) as e:
        learn_sentencepiece(iter(_text()), 4000)
    msg = str(e.value)
    # one line: sentencepiece's own last line, after our prefix
    assert msg.startswith("--vocab-size 4000: sentencepiece cannot train on this text: ") and "\n" not in msg
    assert msg.endswith("Vocabulary size too high (4000). Please set it to a value <= 137.")

    # stand-ins for the library's error texts: several lines (the last is kept), and none at all
    def fails(text):
        def train(**kw):
            raise RuntimeError(text)
        return train

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", fails("trainer said:\nthe real reason\n"))
    with pytest.raises(UserError) as e:
        learn_sentencepiece(iter(["a"]), 8)
    assert str(e.value) == "--vocab-size 8: sentencepiece cannot train on this text: the real reason"
    monkeypatch.setattr(spm.SentencePieceTrainer, "train", fails(""))
    with pytest.raises(UserError) as e:
        learn_sentencepiece(iter(["a"]), 8)
    assert str(e.value) == "--vocab-size 8: sentencepiece cannot train on this text: RuntimeError('')"


# ---------------------------------------------------------------------------------------------
# subword-nmt
# ---------------------------------------------------------------------------------------------

# Sennrich et al.'s example, merged by hand. Words end in </w> (on their last character); pair counts:
# (e, s) = newest 6 + widest 3 = 9 and (s, t</w>) = 9 tie; subword-nmt takes the larger pair on a tie,
# ('s', 't</w>'). Then (e, st</w>) = 9. Then (w, e) is only "lower"'s 2 (newest is now n e w est</w>),
# so (l, o) = low 5 + lower 2 = 7 is the largest ((e, w) and (w, est</w>) are 6).
COUNTS = Counter({"low": 5, "lower": 2, "newest": 6, "widest": 3})
CODES3 = "#version: 0.2\ns t</w>\ne st</w>\nl o\n"


def test_learn_subword_nmt_by_hand():
    assert learn_subword_nmt(COUNTS, 3) == CODES3
    # the same counts in any order (a Counter's order is its insertion order)
    assert learn_subword_nmt(Counter(dict(reversed(list(COUNTS.items())))), 3) == CODES3
    assert learn_subword_nmt(COUNTS, 1) == "#version: 0.2\ns t</w>\n"


def test_apply_subword_nmt_by_hand(tmp_path):
    m = SubwordNmtModel(codes_text=CODES3)
    # lowest: l o w e s t</w> -> (s t</w>) l o w e st</w> -> (e st</w>) l o w est</w> -> (l o) lo w est</w>
    # newer: no merge applies (no "s t", "e st" or "l o" in it)
    assert m.encode("lowest  newer\n") == ["lo@@", "w@@", "est", "n@@", "e@@", "w@@", "e@@", "r"]
    assert m.decode(m.encode("lowest newer")) == "lowest newer"
    assert m.encode_batch(["low", "est"]) == [["lo@@", "w"], ["est"]]
    # hypotheses cut off mid-word: the dangling "@@" goes, the pieces join
    assert m.decode(["lo@@", "w@@"]) == "low"
    assert m.decode(["a@@", "b", "c@@", "d@@"]) == "ab cd"
    assert m.decode([]) == ""
    p = tmp_path / "bpe.codes"
    p.write_text(CODES3, encoding="utf-8")
    assert SubwordNmtModel(p).encode("lowest") == ["lo@@", "w@@", "est"]
    assert load_model_file("subword-nmt", p).encode("lowest") == ["lo@@", "w@@", "est"]


def test_subword_nmt_codes_are_read_as_utf8_in_any_locale(tmp_path):
    import locale

    if sys.flags.utf8_mode:
        pytest.skip("Python's UTF-8 mode is on: open() reads UTF-8 whatever the locale")
    p = tmp_path / "bpe.codes"
    p.write_text("#version: 0.2\nü b</w>\n", encoding="utf-8")
    here = SubwordNmtModel(p).encode("aüb üb")
    assert here == ["a@@", "üb", "üb"]
    # in an ASCII locale open() without encoding= would fail on the "ü" (in-process: a subprocess
    # in that locale could not carry a mutation tool's non-ASCII mutant names in its environment)
    old = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")
        if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
            pytest.skip("the C locale is UTF-8 on this platform")
        there = SubwordNmtModel(p).encode("aüb üb")
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
    assert there == here


def test_subword_nmt_load_refusals(tmp_path, monkeypatch):
    cases = [
        ("#version: 0.2\na b\nx\n", "invalid line 3 in BPE codes file: x"),  # subword-nmt would sys.exit(1)
        ("#version: 0.2\n", "invalid line 2 in BPE codes file:"),  # no merge at all
        ("#version: zz\na b\n", "invalid literal for int() with base 10: 'zz'"),
    ]
    for text, why in cases:
        with pytest.raises(UserError) as e:
            SubwordNmtModel(codes_text=text)
        assert str(e.value) == f"<codes>: cannot load subword-nmt codes: {why}"
    p = tmp_path / "bpe.codes"
    p.write_text(cases[0][0], encoding="utf-8")
    with pytest.raises(UserError) as e:
        SubwordNmtModel(p)
    assert str(e.value) == f"{p}: cannot load subword-nmt codes: invalid line 3 in BPE codes file: x"
    with pytest.raises(UserError) as e:
        SubwordNmtModel(tmp_path / "absent.codes")
    assert str(e.value).startswith(f"{tmp_path / 'absent.codes'}: cannot load subword-nmt codes: [Errno 2] ")
    p.write_bytes(b"#version: 0.2\n\xff b\n")  # not UTF-8
    with pytest.raises(UserError, match=r"cannot load subword-nmt codes: 'utf-8' codec can't decode"):
        SubwordNmtModel(p)

    # a stand-in for a subword-nmt that exits without saying why
    import subword_nmt.apply_bpe

    class Exits:
        def __init__(self, *a, **kw):
            sys.exit(1)

    monkeypatch.setattr(subword_nmt.apply_bpe, "BPE", Exits)
    with pytest.raises(UserError) as e:
        SubwordNmtModel(codes_text=CODES3)
    assert str(e.value) == "<codes>: cannot load subword-nmt codes: subword-nmt refused them"


def test_learn_subword_nmt_refuses_to_learn_nothing():
    why = ("subword-nmt learned no merge operation from this text (a merge needs a pair of adjacent "
           "characters seen at least twice); use --bpe sentencepiece or none, or more text")
    for counts, merges in [
        (Counter({"a": 4, "b": 2}), 10),  # one-character words: no pair at all
        (Counter(), 10),
        (Counter({"ab": 1, "cd": 1}), 10),  # no pair seen twice
        (COUNTS, 0),
    ]:
        with pytest.raises(UserError) as e:
            learn_subword_nmt(counts, merges)
        assert str(e.value) == f"--bpe-merges {merges}: {why}", counts
    # one two-character word seen twice is enough for a merge
    assert learn_subword_nmt(Counter({"a": 4, "ab": 2}), 10) == "#version: 0.2\na b</w>\n"


def test_count_words():
    assert count_words(["a b  a", "", " c\tb "]) == Counter({"a": 2, "b": 2, "c": 1})
    acc = Counter({"a": 1})
    assert count_words(["a d"], acc) is acc
    assert acc == Counter({"a": 2, "d": 1})


# ---------------------------------------------------------------------------------------------
# whitespace, file names, kinds
# ---------------------------------------------------------------------------------------------


def test_whitespace_model_and_kinds():
    m = load_model_file("none", None)
    assert isinstance(m, WhitespaceModel) and m.kind == "none"
    assert m.encode(" a  b\tc\n") == ["a", "b", "c"] and m.decode(["a", "b"]) == "a b"
    assert m.encode_batch(["x y", ""]) == [["x", "y"], []]
    assert [model_filename(k, None) for k in ("sentencepiece", "subword-nmt", "none")] == \
        ["spm.model", "bpe.codes", None]
    assert model_filename("sentencepiece", "de") == "spm.de.model" and model_filename("subword-nmt", "en") == "bpe.en.codes"
    with pytest.raises(UserError) as e:
        load_model_file("bpe", None)
    assert str(e.value) == "unknown subword model kind 'bpe' (expected one of sentencepiece, subword-nmt, none)"


# ---------------------------------------------------------------------------------------------
# load_subword_model: a data directory written by hand (manifest.json as docs/formats.md describes)
# ---------------------------------------------------------------------------------------------


def _data_dir(tmp_path: Path, subword: dict, files: dict[str, bytes]) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    manifest = {"format": "nmtkit-data", "format_version": 1, "complete": True, "source_lang": "de",
                "target_lang": "en", "subword": subword, "splits": {},
                "files": {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_load_subword_model_per_language_kinds(tmp_path):
    # a parsing-style directory: subword-nmt on the source, no model on the (tree) target side
    d = _data_dir(tmp_path, {"kind": "subword-nmt", "kinds": {"de": "subword-nmt", "en": "none"},
                             "files": {"de": "bpe.codes", "en": None}},
                  {"bpe.codes": CODES3.encode(), "train.de.000.bin": b"\x01\x02"})
    de, en = load_subword_model(d, "de"), load_subword_model(d, "en")
    assert de.kind == "subword-nmt" and de.encode("lowest") == ["lo@@", "w@@", "est"]
    assert isinstance(en, WhitespaceModel)
    # only the model's own file is checked: a corrupt shard is load_split's business
    (d / "train.de.000.bin").write_bytes(b"\x09\x09")
    assert load_subword_model(d, "de").encode("low") == ["lo@@", "w"]
    (d / "bpe.codes").write_text(CODES3 + "a b\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        load_subword_model(d, "de")
    assert str(e.value) == f"{d / 'bpe.codes'}: checksum mismatch with manifest.json (corrupt or modified file)"


def test_load_subword_model_of_an_older_directory(tmp_path, spm_proto):
    # no "kinds": one kind for both sides
    d = _data_dir(tmp_path, {"kind": "sentencepiece", "joint": True, "files": {"de": "spm.model", "en": "spm.model"}},
                  {"spm.model": spm_proto})
    sp = SentencePieceModel(model_proto=spm_proto)
    for lang in ("de", "en"):
        m = load_subword_model(d, lang)
        assert m.kind == "sentencepiece" and m.encode("the lazy cat") == sp.encode("the lazy cat")
    (tmp_path / "x").mkdir()
    d2 = _data_dir(tmp_path / "x", {"kind": "none", "files": {"de": None, "en": None}}, {})
    assert isinstance(load_subword_model(d2, "en"), WhitespaceModel)


def test_preprocess_refuses_codes_without_merges(tmp_path, run_cli):
    # before: subword-nmt's own two-line error and exit 1 (--bpe-merges 0), or "internal error"
    # (a text of one-character words); now one line and exit 2, and no data directory
    why = ("subword-nmt learned no merge operation from this text (a merge needs a pair of adjacent "
           "characters seen at least twice); use --bpe sentencepiece or none, or more text")
    (tmp_path / "train.en").write_text("a b\nc d\n", encoding="utf-8")
    for merges, source in (("0", "ab ab c\nd e f\n"), ("10", "a b c\nd e f\n")):
        (tmp_path / "train.de").write_text(source, encoding="utf-8")
        r = run_cli("preprocess", "--source-lang", "de", "--target-lang", "en", "--trainpref", tmp_path / "train",
                    "--destdir", tmp_path / "bin", "--bpe", "subword-nmt", "--bpe-merges", merges)
        assert r.code == 2, r
        assert r.err.strip().splitlines()[-1] == f"nmtkit: error: --bpe-merges {merges}: {why}"
        assert not (tmp_path / "bin" / "manifest.json").exists()


def test_moses_before_sentencepiece_gives_the_same_pieces_by_ids_and_by_strings():
    """Behind Moses, preprocess's id path (`encode_ids`) and generation's string path (`encode`)
    segment alike: the ids name the pieces `encode` gives, and both see the tokenized text
    (`&` escaped, the final period split off), not the raw one."""
    from nmtkit.data.subwords import MosesPretokenized

    inner = SentencePieceModel(Path(__file__).parent / "golden" / "fairseq" / "a" / "spm.model")
    moses = MosesPretokenized(inner, "en")
    lines = ["Pipisu & texuxu, supira.", "rate-mo su tesu!"]
    pieces = inner.pieces()
    known = lambda toks: [t if t in pieces else "<unk>" for t in toks]  # noqa: E731 (id 0 names no character)
    by_ids = [[pieces[i] for i in ids] for ids in moses.encode_ids(lines)]
    assert by_ids == [known(moses.encode(x)) for x in lines]
    assert by_ids == [known(inner.encode("Pipisu &amp; texuxu , supira .")), known(inner.encode("rate @-@ mo su tesu !"))]
    assert by_ids[0] != known(inner.encode(lines[0]))


# --- property tests (Hypothesis) ---
# The subword-nmt codes reader (SubwordNmtModel): any file is either codes that segment every
# line (and decode back to it) or refused with one line naming the file (and the line, for a
# line that is not a pair). What it accepts is `_codes_reference`'s (subword-nmt's own rules:
# an optional "#version: X.Y" first line, then one "A B" pair per line; the file read as UTF-8
# text, so "\r" and "\r\n" end lines too).

import re  # noqa: E402

from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_UNIT = st.builds(lambda s, end: s + end, st.text("abcé", min_size=1, max_size=3), st.sampled_from(["", "</w>"]))
_VERSION = st.sampled_from(["#version: 0.2", "#version: 0.1", "#version: 0.2.0", "#version: 1.0", "#version: 0.3",
                            "#version: zz", "#version:", "#version: 0.٢", "#version: " + "9" * 5000, "#version 0.2",
                            "\ufeff#version: 0.2", ""])
_CODE_LINE = st.one_of(
    st.builds(lambda a, b: f"{a} {b}", _UNIT, _UNIT),
    st.builds(lambda a, b, pad: f"{pad}{a} {b}{pad}", _UNIT, _UNIT, st.sampled_from([" ", "\r", "  "])),
    st.sampled_from(["", "a", "a b c", "a  b", "a\tb", "a\x0bb", "a\u2028 b", "\x00 a", "@@ a", "</w> a", " "]),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=6),
)


def _codes_reference(data: bytes) -> str | None:
    """None for codes subword-nmt applies, else what the refusal must start with ("" for any: a
    file that is not UTF-8 fails where the decoder meets the bad bytes, maybe after the version)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    first = 1
    if lines[0].startswith("#version:"):
        try:
            version = tuple(int(x) for x in re.sub(r"(\.0+)*$", "", lines[0].split()[-1]).split("."))
        except ValueError:
            return ""
        first = 2
        lines = lines[1:]
    else:
        version = (0, 1)
    body = "\n".join(lines).rstrip("\n").split("\n")
    for i, item in enumerate(body):
        if len(item.strip("\r\n ").split(" ")) != 2:
            return f"invalid line {i + first} in BPE codes file:"
    return None if version in ((0, 1), (0, 2)) else "version "


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_subwords")


@pytest.mark.fuzz
@given(version=_VERSION, lines=st.lists(_CODE_LINE, max_size=8), eol=st.sampled_from(["\n", "\r\n", "\r"]),
       damage=st.sampled_from([b"", b"\xff", b"\xc3", b"\xed\xa0\x80"]), words=st.lists(st.text("abcé", min_size=1,
                                                                                             max_size=6), max_size=4))
@example(version="#version: 1.0", lines=["a b"], eol="\n", damage=b"", words=["ab"])  # NotImplementedError before
@example(version="#version: 0.2", lines=["a b", "x"], eol="\n", damage=b"", words=[])
def test_codes_file_is_codes_that_segment_or_one_line(fuzz_dir, version, lines, eol, damage, words):
    data = (eol.join(([version] if version else []) + lines) + eol).encode("utf-8") + damage
    p = fuzz_dir / "bpe.codes"
    p.write_bytes(data)
    want = _codes_reference(data)
    try:
        m = SubwordNmtModel(p)
    except UserError as e:
        msg = str(e)
        assert want is not None and msg.startswith(f"{p}: cannot load subword-nmt codes: {want}"), (msg, want)
        assert "\n" not in msg and "\r" not in msg
        return
    assert want is None
    line = " ".join(words)
    tokens = m.encode(line)
    assert all(tokens) and m.decode(tokens) == line  # every word segmented, and joined back


def test_codes_of_a_version_subword_nmt_does_not_apply_are_refused(tmp_path):
    """"#version: 1.0" loaded, then the first word longer than one character raised
    NotImplementedError (a traceback) from subword-nmt's encode."""
    p = tmp_path / "bpe.codes"
    for version, shown in [("1.0", "1"), ("0.3", "0.3"), ("2.1.0", "2.1")]:
        p.write_text(f"#version: {version}\na b\n", encoding="utf-8")
        with pytest.raises(UserError) as e:
            SubwordNmtModel(p)
        assert str(e.value) == f"{p}: cannot load subword-nmt codes: version {shown} (subword-nmt applies versions 0.1 and 0.2)"
    p.write_text("#version: 0.2.0\na b</w>\n", encoding="utf-8")  # trailing zeros are subword-nmt's 0.2
    assert SubwordNmtModel(p).encode("ab") == ["ab"]
