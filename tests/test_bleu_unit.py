"""nmtkit.scoring.bleu as a library: every metric against sacreBLEU called directly, the printed
lines and JSON fields written out by hand, and each refusal with its exact message.

(tests/test_score.py covers the CLI, tok-bleu's multi-bleu.perl rules and the WMT17 outputs.)
"""

from __future__ import annotations

import io
import sys
from importlib.metadata import version

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.significance import PairedTest

from nmtkit.errors import UserError
from nmtkit.scoring import bleu as B
from nmtkit.scoring.bleu import (
    TRANSLATION_METRICS,
    MetricScore,
    PairedScore,
    TranslationOptions,
    score_translation,
)

HYPS = ["The cat sat on the mat .", "A dog barked loudly", "It rains"]
REFS = ["The cat sat on a mat .", "The dog barked loudly", "It is raining"]
REFS2 = ["A cat was sitting on the mat .", "A dog barked", "It rains"]


def _one(key, hyps=HYPS, refs=(REFS,), opts=TranslationOptions()):
    (s,) = score_translation(hyps, [list(r) for r in refs], [key], opts)
    return s


@pytest.mark.parametrize("lowercase", [False, True])
def test_bleu_chrf_ter_are_sacrebleu_objects_with_their_details(lowercase):
    hyps = [h.upper() for h in HYPS] if lowercase else HYPS
    opts = TranslationOptions(lowercase=lowercase)
    refs = [REFS, REFS2]
    metric = BLEU(lowercase=lowercase)
    ref = metric.corpus_score(hyps, refs)
    s = _one("bleu", hyps, refs, opts)
    assert (s.metric, s.name, s.score, s.lines) == ("bleu", "BLEU", ref.score, 3)
    assert s.signature == metric.get_signature().format() and s.verbose == ref._verbose
    assert s.details == {"counts": list(ref.counts), "totals": list(ref.totals),
                         "precisions": list(ref.precisions), "bp": ref.bp,
                         "sys_len": ref.sys_len, "ref_len": ref.ref_len}
    assert s.compound_split is False and s.ci_mean is None and s.ci_halfwidth is None
    for key, m, name, nw in (("chrf", CHRF(lowercase=lowercase), "chrF2", 0),
                             ("chrf++", CHRF(word_order=2, lowercase=lowercase), "chrF2++", 2)):
        s = _one(key, hyps, refs, opts)
        assert (s.metric, s.name, s.score) == (key, name, m.corpus_score(hyps, refs).score)
        assert s.signature == m.get_signature().format() and s.verbose == ""
        assert s.details == {"char_order": 6, "word_order": nw, "beta": 2} and s.compound_split is None
    t = TER()  # always sacreBLEU's defaults, case-insensitive like tercom, whatever --lowercase says
    tref = t.corpus_score(hyps, refs)
    s = _one("ter", hyps, refs, opts)
    assert (s.metric, s.name, s.score, s.signature) == ("ter", "TER", tref.score, t.get_signature().format())
    assert s.details == {"num_edits": tref.num_edits, "ref_length": tref.ref_length} and s.compound_split is None


def test_bleu_tokenizer_is_passed_and_checked():
    ref = BLEU(tokenize="char")
    s = _one("bleu", opts=TranslationOptions(tokenize="char"))
    assert s.score == ref.corpus_score(HYPS, [REFS]).score and "tok:char" in s.signature
    assert B.sacrebleu_tokenizers() == list(BLEU.TOKENIZERS)
    with pytest.raises(UserError) as e:
        _one("bleu", opts=TranslationOptions(tokenize="moses"))
    assert str(e.value) == (f"--tokenize: unknown sacreBLEU tokenizer 'moses' "
                            f"(choose from {', '.join(BLEU.TOKENIZERS)})")


def test_confidence_interval_is_sacrebleus_bootstrap():
    s = _one("bleu", opts=TranslationOptions(confidence_n=30))
    ref = BLEU().corpus_score(HYPS, [REFS], n_bootstrap=30)  # same SACREBLEU_SEED: same resamples
    assert (s.score, s.ci_mean, s.ci_halfwidth) == (ref.score, ref._mean, ref._ci)
    assert "bs:30" in s.signature
    for n in (0, 1):  # <= 1 resample: no interval
        s = _one("bleu", opts=TranslationOptions(confidence_n=n))
        assert s.ci_mean is None and s.ci_halfwidth is None and "bs:" not in s.signature


def test_format_line_and_to_dict_by_hand():
    s = MetricScore("bleu", "BLEU", 28.3049, "nrefs:1|tok:13a", 3, verbose="60.0/40.0 (BP = 1.000)",
                    details={"bp": 1.0}, compound_split=False)
    assert s.format_line() == "BLEU = 28.30 60.0/40.0 (BP = 1.000) | nrefs:1|tok:13a | compound-split: no | lines: 3"
    assert s.to_dict() == {"metric": "bleu", "name": "BLEU", "score": 28.3049, "signature": "nrefs:1|tok:13a",
                           "lines": 3, "compound_split": False, "bp": 1.0}
    s = MetricScore("tok-bleu", "tok-BLEU", 5.0, "sig", 1, compound_split=True, ci_mean=4.996, ci_halfwidth=0.125)
    assert s.format_line() == "tok-BLEU = 5.00 (μ = 5.00 ± 0.12) | sig | compound-split: yes | lines: 1"
    assert s.to_dict() == {"metric": "tok-bleu", "name": "tok-BLEU", "score": 5.0, "signature": "sig", "lines": 1,
                           "compound_split": True, "confidence": {"mean": 4.996, "ci95_halfwidth": 0.125}}
    s = MetricScore("chrf", "chrF2", 51.0, "sig", 2, details={"beta": 2})
    assert s.format_line() == "chrF2 = 51.00 | sig | lines: 2"
    assert s.to_dict() == {"metric": "chrf", "name": "chrF2", "score": 51.0, "signature": "sig", "lines": 2, "beta": 2}


def test_paired_score_format_line_and_to_dict_by_hand():
    p = PairedScore("bleu", "BLEU", 20.0, 20.5, 1.25, 22.0, 21.875, 1.5, 0.0123, "sig")
    assert p.format_line() == ("BLEU: system 22.00 (μ = 21.88 ± 1.50) vs baseline 20.00 (μ = 20.50 ± 1.25) | "
                               "p = 0.0123 (significant at p < 0.05) | sig")
    assert p.format_line(alpha=0.01).endswith("p = 0.0123 (not significant at p < 0.01) | sig")
    assert "p = 0.0500 (not significant at p < 0.05)" in PairedScore(
        "bleu", "BLEU", 1, 1, 1, 1, 1, 1, 0.05, "s").format_line()  # p must be below alpha
    assert p.to_dict() == {"metric": "bleu", "name": "BLEU",
                           "system": {"score": 22.0, "mean": 21.875, "ci95_halfwidth": 1.5},
                           "baseline": {"score": 20.0, "mean": 20.5, "ci95_halfwidth": 1.25},
                           "p_value": 0.0123, "signature": "sig"}


def test_parse_metrics():
    assert B.parse_metrics(" BLEU, chrf,,bleu ,TER", TRANSLATION_METRICS) == ["bleu", "chrf", "ter"]
    with pytest.raises(UserError) as e:
        B.parse_metrics("bleu, Blue ", TRANSLATION_METRICS)
    assert str(e.value) == "--metric: unknown metric 'Blue' (choose from bleu, chrf, chrf++, ter, tok-bleu)"
    with pytest.raises(UserError) as e:
        B.parse_metrics(" , ", ("bleu", "ter"))
    assert str(e.value) == "--metric: no metric given (choose from bleu, ter)"


def test_read_text_check_parallel_and_names(tmp_path, monkeypatch):
    p = tmp_path / "hyp.txt"
    p.write_text("a b\n\nc\n", encoding="utf-8")
    assert B.read_text(p, "--sys") == ["a b", "", "c"]
    with pytest.raises(UserError) as e:
        B.read_text(tmp_path, "--ref")
    assert str(e.value) == f"--ref {tmp_path} is a directory, not a file"
    with pytest.raises(UserError) as e:
        B.read_text(tmp_path / "no.txt", "--ref")
    assert str(e.value) == f"--ref {tmp_path / 'no.txt'}: no such file"
    (tmp_path / "e.txt").write_bytes(b"")
    with pytest.raises(UserError) as e:
        B.read_text(tmp_path / "e.txt", "--sys")
    assert str(e.value) == f"--sys: {tmp_path / 'e.txt'} is empty: nothing to score"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\ny\n"), encoding="utf-8"))
    assert B.read_text("-", "--sys") == ["x", "y"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8"))
    with pytest.raises(UserError) as e:
        B.read_text("-", "--sys")
    assert str(e.value) == "--sys: <stdin> is empty: nothing to score"
    assert B.display_name("-") == "<stdin>" and B.display_name(p) == str(p)
    B.check_parallel(["a", "b"], "h", [["x", "y"], ["z", "w"]], ["r1", "r2"])
    with pytest.raises(UserError) as e:
        B.check_parallel(["a", "b"], "h.txt", [["x", "y"], ["z"]], ["r1.txt", "r2.txt"])
    assert str(e.value) == ("line counts differ: hypotheses h.txt have 2 lines but reference r2.txt has 1 line; "
                            "they must be parallel, one segment per line")
    with pytest.raises(UserError) as e:
        B.check_parallel(["a"], "base.txt", [["x", "y"]], ["r1.txt"], what="baseline (--paired-bs)")
    assert str(e.value) == ("line counts differ: baseline (--paired-bs) base.txt has 1 line but reference r1.txt "
                            "has 2 lines; they must be parallel, one segment per line")


def test_score_translation_refusals():
    with pytest.raises(UserError) as e:
        score_translation([], [[]], ["bleu"])
    assert str(e.value) == "no hypotheses to score (empty input)"
    with pytest.raises(UserError) as e:
        score_translation(HYPS, [REFS], ["bleu", "chrf"], TranslationOptions(compound_split=True))
    assert str(e.value) == "--compound-split only applies to --metric tok-bleu (Moses-tokenized BLEU)"


def test_moses_tokenizer_and_multibleu_preparation():
    tok = B.MosesTokenizer("en")
    assert tok.lang == "en" and tok.version == version("sacremoses") == B._sacremoses_version()
    assert tok('He said "hi", didn\'t he?') == 'He said " hi " , didn \'t he ?'  # no &quot; escaping
    opts = TranslationOptions(compound_split=True, lowercase=True)
    # compound split, then ASCII-only lowercasing (of ##AT## too, as multi-bleu -lc), then U+00A0 renamed to U+F00A0 (kept in its token)
    assert B._multibleu_prepare(["Rich-Text ÜBER\u00a0X"], opts, None) == ["rich ##at##-##at## text Über\U000f00a0x"]
    assert B._multibleu_prepare(["A-b"], TranslationOptions(), None) == ["A-b"]
    assert B._multibleu_prepare(["A-b,c"], TranslationOptions(), tok) == ["A-b , c"]


def test_tok_bleu_signature_records_what_was_done():
    s = _one("tok-bleu", opts=TranslationOptions(pretokenized=True, lowercase=True))
    assert s.name == "tok-BLEU" and s.metric == "tok-bleu" and s.compound_split is False
    assert s.signature == f"nrefs:1|case:lc-ascii|eff:no|tok:pretokenized|smooth:none|version:{sacrebleu.__version__}"
    s = _one("tok-bleu", opts=TranslationOptions(lang="de", compound_split=True))
    assert s.compound_split is True
    assert s.signature == (f"nrefs:1|case:mixed|eff:no|tok:moses-de|smooth:none|sacremoses:{version('sacremoses')}"
                           f"|moses:pre-2018-11|version:{sacrebleu.__version__}")
    # the score is sacreBLEU's unsmoothed BLEU of the Moses-tokenized, split lines
    tok = B.MosesTokenizer("de")
    prep = lambda lines: [B.compound_split(tok(x)) for x in lines]  # noqa: E731
    ref = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(prep(HYPS), [prep(REFS)])
    assert s.score == ref.score and s.verbose == ref._verbose


# Lines whose last token keeps its period under Moses tokenizer.perl as it was before commit 9fc964d
# (2018-11-07) and loses it since; outputs of `tokenizer.perl -l de -no-escape` at 06f519d
# (2018-09-06, "before") and at the repository's head (2021, "since"), run with perl 5.36.
MOSES_FINAL_DOT = [
    # input, before 9fc964d (= sacremoses, what tok-bleu does), since 9fc964d
    ("Das ist schwer wie ein iPhone 5.", "Das ist schwer wie ein iPhone 5.", "Das ist schwer wie ein iPhone 5 ."),
    ("So am I.", "So am I.", "So am I ."),
    ("Er kam aus den U.S.A.", "Er kam aus den U.S.A.", "Er kam aus den U.S.A ."),
    ("Hallo Welt.", "Hallo Welt .", "Hallo Welt ."),
]


@pytest.mark.parametrize("line,before,since", MOSES_FINAL_DOT)
def test_moses_tokenization_is_tokenizer_perl_before_november_2018(line, before, since):
    """tok-bleu's tokenizer equals tokenizer.perl of the paper's time, not today's: the two differ
    on a line-final period after a number, an abbreviation or a dotted name (docs/score.md)."""
    assert B.MosesTokenizer("de")(line) == before
    assert (before == since) == (line == "Hallo Welt.")  # only a plain word's period was split before
    assert B.moses_rules() == "pre-2018-11"


def test_moses_rules_follow_the_installed_sacremoses(monkeypatch):
    import sacremoses

    class SplitsFinalDots(sacremoses.MosesTokenizer):  # what a sacremoses with the 2018-11 rule would do
        def tokenize(self, text, **kw):
            out = super().tokenize(text, **kw)
            return out[:-1] + " ." if out.endswith(".") and not out.endswith(" .") else out

    B.moses_rules.cache_clear()
    monkeypatch.setattr(sacremoses, "MosesTokenizer", SplitsFinalDots)
    try:
        assert B.moses_rules() == "2018-11"
    finally:
        B.moses_rules.cache_clear()


def test_paired_bootstrap_is_sacrebleus_paired_test():
    base = ["The cat sat on mat", "A dog barked", "It is rain"]
    with pytest.raises(UserError) as e:
        B.paired_bootstrap(HYPS, base, [REFS], ["bleu"], n_samples=1)
    assert str(e.value) == "--paired-bs-n must be >= 2, got 1"
    out = B.paired_bootstrap(HYPS, base, [REFS, REFS2], ["bleu", "chrf"], n_samples=25)
    for p, key, metric in zip(out, ("bleu", "chrf"), (BLEU(), CHRF())):
        sigs, res = PairedTest([("baseline", base), ("system", HYPS)], {key: metric}, references=[REFS, REFS2],
                               test_type="bs", n_samples=25)()
        (name,) = [k for k in res if k != "System"]
        bl, sy = res[name]
        assert (p.metric, p.name) == (key, name)
        assert (p.baseline, p.baseline_mean, p.baseline_ci) == (bl.score, bl.mean, bl.ci)
        assert (p.system, p.system_mean, p.system_ci, p.p_value) == (sy.score, sy.mean, sy.ci, sy.p_value)
        assert p.signature == sigs[name].format()
    (t,) = B.paired_bootstrap(HYPS, base, [REFS], ["tok-bleu"], TranslationOptions(pretokenized=True), n_samples=5)
    assert t.name == "tok-BLEU" and "tok:pretokenized" in t.signature
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    assert t.system == metric.corpus_score(HYPS, [REFS]).score
    assert t.baseline == metric.corpus_score(base, [REFS]).score


def test_sacremoses_version_falls_back_to_unknown(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert B._sacremoses_version() == "unknown"


def test_paired_bootstrap_sample_counts_and_moses_tokenization():
    base = ["The cat sat on mat", "A dog barked", "It is rain"]
    (two,) = B.paired_bootstrap(HYPS, base, [REFS], ["bleu"], n_samples=2)  # 2 is the smallest allowed
    assert two.system == BLEU().corpus_score(HYPS, [REFS]).score
    default = B.paired_bootstrap(HYPS, base, [REFS], ["bleu"])[0]
    explicit = B.paired_bootstrap(HYPS, base, [REFS], ["bleu"], n_samples=1000)[0]
    assert default == explicit
    # tok-bleu with Moses tokenization on both systems (one tokenizer, shared through the cache)
    (t,) = B.paired_bootstrap(HYPS, base, [REFS], ["tok-bleu"], TranslationOptions(lang="en"), n_samples=2)
    tok = B.MosesTokenizer("en")
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    assert t.system == metric.corpus_score([tok(h) for h in HYPS], [[tok(r) for r in REFS]]).score
    assert t.baseline == metric.corpus_score([tok(h) for h in base], [[tok(r) for r in REFS]]).score
    assert "tok:moses-en" in t.signature


def test_two_resamples_give_an_interval_and_ter_has_no_verbose_part():
    s = _one("bleu", opts=TranslationOptions(confidence_n=2))
    ref = BLEU().corpus_score(HYPS, [REFS], n_bootstrap=2)
    assert (s.ci_mean, s.ci_halfwidth) == (ref._mean, ref._ci) and "bs:2" in s.signature
    t = _one("ter")
    assert t.verbose == "" and t.format_line() == f"TER = {t.score:.2f} | {t.signature} | lines: 3"


def test_a_tokenizer_sacrebleu_cannot_load_is_one_user_error(monkeypatch):
    import sacrebleu.metrics

    class NoMecab(BLEU):  # what BLEU(tokenize="ja-mecab") raises without its optional package
        def __init__(self, *a, **k):
            raise ImportError("Please install mecab-python3\n   (pip install sacrebleu[ja])")

    monkeypatch.setattr(sacrebleu.metrics, "BLEU", NoMecab)
    with pytest.raises(UserError) as e:
        _one("bleu", opts=TranslationOptions(tokenize="ja-mecab"))
    assert str(e.value) == ("--tokenize ja-mecab: sacreBLEU cannot use this tokenizer here: "
                            "Please install mecab-python3 (pip install sacrebleu[ja])")


def test_tok_bleu_does_not_warn_that_its_tokenized_input_looks_tokenized(caplog):
    """tok-bleu scores Moses-tokenized text on purpose: sacreBLEU's "you forgot to detokenize"
    warning (logged once 100 hypotheses end in " .") would be wrong there, so it is suppressed."""
    import logging

    hyps = [f"sentence number {i} ." for i in range(100)]
    refs = [f"sentence {i} ." for i in range(100)]
    caplog.set_level(logging.WARNING, logger="sacrebleu")
    BLEU(tokenize="none", smooth_method="none").corpus_score(hyps, [refs])  # the control: sacreBLEU warns
    assert any("forgot to detokenize" in r.getMessage() for r in caplog.records)
    caplog.clear()
    (s,) = score_translation(hyps, [refs], ["tok-bleu"], TranslationOptions(pretokenized=True))
    (p,) = B.paired_bootstrap(hyps, hyps[::-1], [refs], ["tok-bleu"], TranslationOptions(pretokenized=True),
                              n_samples=2)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("sacrebleu")] == []
    # per line 3 of 4 unigrams, 1 of 3 bigrams ("i ."), 0 of 2 trigrams: unsmoothed BLEU 0
    assert s.details["counts"][:3] == [300, 100, 0] and s.details["totals"][:3] == [400, 300, 200]
    assert s.score == 0.0 and p.system == 0.0


def test_one_moses_tokenizer_per_run_shared_by_system_and_baseline(monkeypatch):
    """paired_bootstrap prepares the system and the baseline separately; the Moses tokenizer (which
    loads its nonbreaking-prefix lists when built) is built once and shared through the cache."""
    built = []

    class Counting(B.MosesTokenizer):
        def __init__(self, lang):
            built.append(lang)
            super().__init__(lang)

    monkeypatch.setattr(B, "MosesTokenizer", Counting)
    base = ["The cat sat on mat", "A dog barked", "It is rain"]
    B.paired_bootstrap(HYPS, base, [REFS], ["tok-bleu"], TranslationOptions(lang="de"), n_samples=2)
    assert built == ["de"]
    score_translation(HYPS, [REFS], ["bleu", "tok-bleu"], TranslationOptions(lang="fr"))
    assert built == ["de", "fr"]
    score_translation(HYPS, [REFS], ["tok-bleu"], TranslationOptions(pretokenized=True))
    assert built == ["de", "fr"]  # pretokenized input needs no tokenizer


def test_the_library_refuses_an_unknown_metric_key():
    """parse_metrics validates --metric for the CLI; a library caller passing a bad key directly
    still gets one clear UserError, not a KeyError from inside."""
    for call in (lambda: score_translation(HYPS, [REFS], ["bleu4"]),
                 lambda: B.paired_bootstrap(HYPS, HYPS, [REFS], ["bleu4"], n_samples=2)):
        with pytest.raises(UserError) as e:
            call()
        assert str(e.value) == "--metric: unknown translation metric 'bleu4'"
