"""`nmtkit score` for translation: sacreBLEU/chrF/TER delegation, tokenized BLEU, CLI behaviour.

Hand-computed values are worked out in the comments; real-data checks use the WMT17 system
outputs in ../shared/data/wmt17_ende_systems, whose published scores are in scores.tsv.
"""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys

import pytest
import sacrebleu

from nmtkit.scoring.bleu import (
    _UNICODE_ONLY_WS_CHARS,
    TranslationOptions,
    ascii_lowercase,
    compound_split,
    paired_bootstrap,
    read_text,
    score_translation,
)
from tests.conftest import REPO, shared_file

WMT17 = "wmt17_ende_systems"


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))


# --------------------------------------------------------------------------- compound splitting


@pytest.mark.parametrize(
    "line, expected",
    [
        ("rich-text format", "rich ##AT##-##AT## text format"),
        # perl s///g takes non-overlapping matches left to right: after `a-b` is consumed, `-c`
        # has no \S before its hyphen any more, so the second hyphen stays (checked with perl 5).
        ("a-b-c", "a ##AT##-##AT## b-c"),
        ("c-d-e-f", "c ##AT##-##AT## d-e ##AT##-##AT## f"),
        ("x--y", "x ##AT##-##AT## -y"),  # (\S)=x, -, (\S)=- ; then "y" alone
        ("-a- a - b", "-a- a - b"),  # no \S on both sides of any hyphen
        ("ö-ü", "ö ##AT##-##AT## ü"),
        # perl reads bytes: U+00A0 (C2 A0) is not \s there, so it counts as the \S before "-".
        ("a\u00a0-b", "a\u00a0 ##AT##-##AT## b"),
        # ...but with longer parts the scan resumes inside "rechts", so both hyphens split.
        ("Mitte-rechts-Regierung", "Mitte ##AT##-##AT## rechts ##AT##-##AT## Regierung"),
    ],
)
def test_compound_split_matches_perl_one_liner(line, expected):
    assert compound_split(line) == expected


def test_unicode_only_whitespace_table_is_complete():
    expected = {chr(c) for c in range(0x110000) if chr(c).isspace() and chr(c) not in " \t\n\r\f\v"}
    assert set(_UNICODE_ONLY_WS_CHARS) == expected


def test_ascii_lowercase_is_multibleu_lc():
    # perl `lc` on undecoded UTF-8 bytes only lowercases A-Z (checked with perl 5).
    assert ascii_lowercase("ÜBER Straße ÄRGER") == "Über straße Ärger"


# ------------------------------------------------------------------------- hand-computed BLEU

HYP = "the well-known cat sat on a mat."
REF = "the well-known cat sat on the mat."


def test_tok_bleu_with_compound_split_hand_computed():
    # Moses (en) + split: hyp = the well ##AT##-##AT## known cat sat on a mat .   (10 tokens)
    #                     ref = the well ##AT##-##AT## known cat sat on the mat . (10 tokens)
    # matches: 1-grams 9/10 (all but "a"), 2-grams 7/9, 3-grams 5/8, 4-grams 4/7, BP = 1
    # BLEU = (9/10 * 7/9 * 5/8 * 4/7) ** (1/4) = (1/4) ** (1/4) = 70.7107
    (s,) = score_translation([HYP], [[REF]], ["tok-bleu"], TranslationOptions(compound_split=True))
    assert s.details["counts"] == [9, 7, 5, 4] and s.details["totals"] == [10, 9, 8, 7]
    assert s.score == pytest.approx(100 * 0.25**0.25, abs=1e-9)
    assert s.compound_split is True
    assert "tok:moses-en" in s.signature and "smooth:none" in s.signature
    line = s.format_line()
    assert line.startswith("tok-BLEU = 70.71 ") and "compound-split: yes" in line and line.endswith("lines: 1")


def test_tok_bleu_without_split_and_sacrebleu_hand_computed():
    # Without splitting: 8 tokens each; 1-grams 7/8, 2-grams 5/7, 3-grams 3/6, 4-grams 2/5
    # BLEU = (7/8 * 5/7 * 3/6 * 2/5) ** (1/4) = (1/8) ** (1/4) = 59.4604
    # sacreBLEU 13a keeps "well-known" whole and splits "mat." the same way: same counts, and
    # with no zero count its exp smoothing changes nothing.
    tok, bleu = score_translation([HYP], [[REF]], ["tok-bleu", "bleu"])
    for s in (tok, bleu):
        assert s.score == pytest.approx(100 * 0.125**0.25, abs=1e-9)
    assert bleu.compound_split is False and "tok:13a" in bleu.signature


def test_tok_bleu_zero_precision_is_zero_like_multibleu():
    # hyp "a b c d" vs ref "a b d c": 3-gram and 4-gram precision 0. multi-bleu.perl (no
    # smoothing) gives 0.00; sacreBLEU's exp smoothing gives (100 * 100/3 * 25 * 25) ** (1/4).
    tok, bleu = score_translation(["a b c d"], [["a b d c"]], ["tok-bleu", "bleu"], TranslationOptions(pretokenized=True))
    assert tok.score == 0.0
    assert bleu.score == pytest.approx((100 * 100 / 3 * 25 * 25) ** 0.25, abs=1e-9)


def test_brevity_penalty_and_multi_reference_closest_length():
    opts = TranslationOptions(pretokenized=True)
    # all n-grams match; hyp 4 tokens, ref 6 tokens: BP = exp(1 - 6/4)
    (s,) = score_translation(["a b c d"], [["a b c d e f"]], ["tok-bleu"], opts)
    assert s.score == pytest.approx(100 * math.exp(-0.5), abs=1e-9)
    # two references of 6 and 5 tokens: the closest length (5) counts: BP = exp(1 - 5/4)
    (s,) = score_translation(["a b c d"], [["a b c d e f"], ["a b c d e"]], ["tok-bleu"], opts)
    assert s.score == pytest.approx(100 * math.exp(-0.25), abs=1e-9)
    assert "nrefs:2" in s.signature
    # lengths 3 and 5 are equally close to 4: multi-bleu takes the shorter, so BP = 1
    (s,) = score_translation(["a b c d"], [["a b c"], ["a b c d e"]], ["tok-bleu"], opts)
    assert s.score == pytest.approx(100.0)


def test_tok_bleu_keeps_non_ascii_whitespace_inside_tokens_like_perl():
    # perl's split leaves "a\u00a0b" one token (hyp_len 2, no 3-grams: BLEU 0); Python's
    # str.split alone would make it 3 tokens.
    (s,) = score_translation(["a\u00a0b c"], [["a\u00a0b c"]], ["tok-bleu"], TranslationOptions(pretokenized=True))
    assert s.details["sys_len"] == 2 and s.score == 0.0


def test_tok_bleu_lowercase_ascii_only():
    # "ÜBER" -> "Über" (not "über"): no match with "über", as with multi-bleu.perl -lc.
    opts = TranslationOptions(pretokenized=True, lowercase=True)
    (s,) = score_translation(["ÜBER A B C"], [["über a b c"]], ["tok-bleu"], opts)
    assert s.details["counts"] == [3, 2, 1, 0]
    (s,) = score_translation(["ÜBER A B C"], [["Über a b c"]], ["tok-bleu"], opts)
    assert s.score == pytest.approx(100.0) and "case:lc-ascii" in s.signature


def test_bleu_chrf_ter_equal_sacrebleu_on_hand_made_sentences():
    hyps = ["The cat is on the mat.", "There is a dog in the garden!", "Hello world"]
    refs = ["The cat sat on the mat.", "A dog is in the garden!", "Hello, world"]
    bleu, chrf, ter = score_translation(hyps, [refs], ["bleu", "chrf", "ter"])
    assert bleu.score == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert chrf.score == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert ter.score == sacrebleu.corpus_ter(hyps, [refs]).score
    (lc,) = score_translation(hyps, [refs], ["bleu"], TranslationOptions(lowercase=True))
    assert lc.score == sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score and "case:lc" in lc.signature


# ------------------------------------------------------------------------------ real WMT17 data


def _claims() -> dict[str, dict[str, str]]:
    with open(shared_file(WMT17, "scores.tsv"), encoding="utf-8") as fh:
        return {row["system_file"]: row for row in csv.DictReader(fh, delimiter="\t")}


@pytest.mark.parametrize("system", ["newstest2017.uedin-nmt.4722.en-de.gz", "newstest2017.C-3MA.4959.en-de.gz"])
def test_bleu_and_chrf_equal_sacrebleu_and_published_on_wmt17(system):
    ref = read_text(shared_file(WMT17, "newstest2017-ende.ref.de.gz"), "--ref")
    hyp = read_text(shared_file(WMT17, system), "--sys")
    claim = _claims()[system]
    chrf_claim = claim["claimed_chrF(chrF++.py -nw 0)"]  # official chrF++.py value (C-3MA: 51.9533)
    scores = score_translation(hyp, [ref], ["bleu", "chrf"] if chrf_claim else ["bleu"])
    bleu = scores[0]
    assert bleu.score == sacrebleu.corpus_bleu(hyp, [ref]).score
    assert f"{bleu.score:.2f}" == f"{float(claim['claimed_mteval_v13a_BLEU']):.2f}"  # mteval-v13a.pl
    assert bleu.verbose in claim["sacrebleu_detail"] and bleu.lines == 3004
    if chrf_claim:
        chrf = scores[1]
        assert chrf.score == sacrebleu.corpus_chrf(hyp, [ref]).score
        assert f"{chrf.score:.2f}" == f"{float(chrf_claim):.2f}"


def test_ter_equals_sacrebleu_on_wmt17_prefix():
    ref = read_text(shared_file(WMT17, "newstest2017-ende.ref.de.gz"), "--ref")[:300]
    hyp = read_text(shared_file(WMT17, "newstest2017.FBK.4870.en-de.gz"), "--sys")[:300]
    (ter,) = score_translation(hyp, [ref], ["ter"])
    assert ter.score == sacrebleu.corpus_ter(hyp, [ref]).score
    assert "case:lc|tok:tercom" in ter.signature


def test_paired_bootstrap_equals_sacrebleu_cli():
    ref = read_text(shared_file(WMT17, "newstest2017-ende.ref.de.gz"), "--ref")
    sys_ = {
        name: read_text(shared_file(WMT17, f"newstest2017.{name}.en-de.gz"), "--sys")
        for name in ("LIUM-NMT.4900", "LMU-nmt-single.4893")
    }
    # 26.56 vs 26.60: `sacrebleu REF -i LIUM LMU --paired-bs` (sacrebleu 2.6.0, seed 12345)
    # prints p = 0.3267 and LMU "26.5 ± 0.7"; the same test through nmtkit must agree.
    (close,) = paired_bootstrap(sys_["LMU-nmt-single.4893"], sys_["LIUM-NMT.4900"], [ref], ["bleu"], n_samples=1000)
    assert close.p_value == pytest.approx(0.3267, abs=1e-4)
    assert f"{close.system_mean:.1f} {close.system_ci:.1f}" == "26.5 0.7"
    assert "bs:1000|seed:12345" in close.signature
    assert close.system == sacrebleu.corpus_bleu(sys_["LMU-nmt-single.4893"], [ref]).score
    assert close.baseline == sacrebleu.corpus_bleu(sys_["LIUM-NMT.4900"], [ref]).score


# --------------------------------------------------------------------------------------- CLI


@pytest.fixture
def files(tmp_path):
    hyps = ["The cat is on the mat.", "There is a dog in the well-kept garden!", "Hello world"]
    refs = ["The cat sat on the mat.", "A dog is in the well-kept garden!", "Hello, world"]
    refs2 = ["The cat was on the mat.", "There is a dog in the garden!", "Hello world!"]
    return {
        "hyps": hyps,
        "refs": refs,
        "refs2": refs2,
        "sys": _write(tmp_path / "hyp.txt", hyps),
        "ref": _write(tmp_path / "ref.txt", refs),
        "ref2": _write(tmp_path / "ref2.txt", refs2),
    }


def test_cli_default_is_sacrebleu_line(run_cli, files):
    r = run_cli("score", "--ref", files["ref"], "--sys", files["sys"])
    assert r.code == 0, r
    expected = sacrebleu.corpus_bleu(files["hyps"], [files["refs"]])
    line = r.out.strip()
    assert line.startswith(f"BLEU = {expected.score:.2f} ")
    assert f"| nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__} |" in line
    assert line.endswith("| compound-split: no | lines: 3")


def test_cli_multi_reference_equals_sacrebleu(run_cli, files):
    r = run_cli("score", "-r", files["ref"], "-r", files["ref2"], "--sys", files["sys"], "--metric", "bleu,chrf", "--json")
    assert r.code == 0, r
    obj = json.loads(r.out)
    refs = [files["refs"], files["refs2"]]
    bleu, chrf = obj["scores"]
    assert bleu["score"] == sacrebleu.corpus_bleu(files["hyps"], refs).score
    assert chrf["score"] == sacrebleu.corpus_chrf(files["hyps"], refs).score
    assert "nrefs:2" in bleu["signature"] and obj["lines"] == 3 and len(obj["refs"]) == 2


def test_cli_json_fields(run_cli, files):
    r = run_cli("score", "-r", files["ref"], "-s", files["sys"], "-m", "bleu,tok-bleu,ter", "--compound-split", "--json")
    assert r.code == 0, r
    obj = json.loads(r.out)  # exactly one JSON object
    assert obj["sys"] == str(files["sys"]) and obj["lines"] == 3
    bleu, tok, ter = obj["scores"]
    assert bleu["metric"] == "bleu" and bleu["compound_split"] is False
    assert len(bleu["counts"]) == 4 and bleu["sys_len"] > 0 and bleu["signature"].startswith("nrefs:1|")
    assert tok["metric"] == "tok-bleu" and tok["compound_split"] is True and "tok:moses-en" in tok["signature"]
    assert ter["name"] == "TER" and "num_edits" in ter


def test_cli_stdin_in_process(run_cli, files, monkeypatch):
    _stdin(monkeypatch, "".join(h + "\n" for h in files["hyps"]))
    r = run_cli("score", "--ref", files["ref"], "--metric", "chrf")
    assert r.code == 0, r
    assert r.out.startswith(f"chrF2 = {sacrebleu.corpus_chrf(files['hyps'], [files['refs']]).score:.2f} | ")


def test_cli_pipe_through_real_process(files):
    proc = subprocess.run(
        [sys.executable, "-m", "nmtkit", "score", "--ref", str(files["ref"]), "--json"],
        input="".join(h + "\n" for h in files["hyps"]).encode(),
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    obj = json.loads(proc.stdout)
    assert obj["sys"] == "<stdin>" and obj["scores"][0]["score"] == sacrebleu.corpus_bleu(files["hyps"], [files["refs"]]).score


def test_cli_confidence_and_paired(run_cli, files, tmp_path):
    r = run_cli("score", "-r", files["ref"], "-s", files["sys"], "--confidence", "--confidence-n", "50", "--json")
    assert r.code == 0, r
    conf = json.loads(r.out)["scores"][0]["confidence"]
    assert conf["ci95_halfwidth"] >= 0 and "bs:50" in json.loads(r.out)["scores"][0]["signature"]
    base = _write(tmp_path / "base.txt", files["refs2"])
    r = run_cli("score", "-r", files["ref"], "-s", files["sys"], "--paired-bs", base, "--paired-bs-n", "20")
    assert r.code == 0, r
    assert "paired bootstrap resampling (20 resamples)" in r.out and "p = " in r.out
    r = run_cli("score", "-r", files["ref"], "-s", files["sys"], "--paired-bs", files["sys"], "--paired-bs-n", "20")
    assert r.code == 0 and "is identical to the hypotheses" in r.err


def _one_error_line(r) -> str:
    assert r.code == 2, r
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    return lines[0]


def test_cli_line_count_mismatch_is_refused(run_cli, files, tmp_path):
    short = _write(tmp_path / "short.txt", files["hyps"][:2])
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", short))
    assert "2 lines" in msg and "3 lines" in msg and "short.txt" in msg and "ref.txt" in msg


def test_cli_wording_of_files_counts_and_the_baseline(run_cli, files, tmp_path):
    """A directory is called a directory, one line is "1 line", a baseline of the wrong length is
    called the baseline (not "hypotheses"), and an all-blank output is flagged."""
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", tmp_path))
    assert msg == f"nmtkit: error: --sys {tmp_path} is a directory, not a file"
    msg = _one_error_line(run_cli("score", "--ref", tmp_path / "nope.txt", "--sys", files["sys"]))
    assert msg == f"nmtkit: error: --ref {tmp_path / 'nope.txt'}: no such file"
    one = _write(tmp_path / "one.txt", files["hyps"][:1])
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", one))
    assert f"hypotheses {one} have 1 line but reference {files['ref']} has 3 lines" in msg
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", files["sys"], "--paired-bs", one))
    assert f"baseline (--paired-bs) {one} has 1 line but reference" in msg and "hypotheses" not in msg
    blank = _write(tmp_path / "blank.txt", ["", "  ", "\t"])
    r = run_cli("score", "--ref", files["ref"], "--sys", blank)
    assert r.code == 0 and r.out.startswith("BLEU = 0.00 "), r
    assert r.err == (f"nmtkit: warning: --sys {blank}: all 3 lines are empty or blank; its scores are those of "
                     "an empty output (did the translation run fail?)\n")
    r = run_cli("score", "--ref", files["ref"], "--sys", files["sys"])
    assert r.code == 0 and "warning" not in r.err


def test_cli_user_errors(run_cli, files, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert "empty" in _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", empty))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nbad \xff byte\nok\n")
    assert "bad.txt:2" in _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", bad))
    assert "blue" in _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", files["sys"], "-m", "blue"))
    assert "missing.txt" in _one_error_line(run_cli("score", "--ref", tmp_path / "missing.txt", "--sys", files["sys"]))
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", files["sys"], "--tokenize", "moses"))
    assert "--tokenize" in msg and "13a" in msg
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", files["sys"], "--compound-split"))
    assert "--compound-split" in msg and "tok-bleu" in msg
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", files["sys"], "--per-sentence"))
    assert "parseval" in msg
    msg = _one_error_line(run_cli("score", "--ref", files["ref"], "--sys", files["sys"], "-m", "bleu,parseval"))
    assert "parseval" in msg
