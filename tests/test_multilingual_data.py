"""`nmtkit preprocess --pairs`: the multilingual data directory (nmtkit.data.languages is its
contract), the temperature-sampled learning mix, the joint dictionary and its tags, and every
refusal."""

from __future__ import annotations

import gzip
import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_file
from nmtkit.data import multilingual as ML
from nmtkit.data import subwords
from nmtkit.data.dictionary import NSPECIAL, Dictionary
from nmtkit.data.languages import is_tag, tag_token
from nmtkit.data.manifest import check_entries, load_dictionaries, load_manifest, verify_files
from nmtkit.data.preprocess import PreprocessConfig
from nmtkit.data.shards import load_split
from nmtkit.data.subwords import load_subword_model
from nmtkit.errors import UserError

PAIRS = [("de", "en"), ("en", "de"), ("fr", "en")]
KINDS = ("train", "valid", "test")


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{ln}\n" for ln in lines), encoding="utf-8")


def _head(name: str, n: int) -> list[str]:
    with gzip.open(shared_file("multi30k", name), "rt", encoding="utf-8") as fh:
        return [next(fh).rstrip("\n") for _ in range(n)]


@pytest.fixture(scope="module")
def m30k(tmp_path_factory) -> Path:
    """The first 400/60/60 lines of Multi30k's train/val/test in de, en and fr (line-parallel)."""
    raw = tmp_path_factory.mktemp("m30k")
    for lang in ("de", "en", "fr"):
        for kind, name, n in (("train", "train", 400), ("valid", "val", 60), ("test", "test_2016_flickr", 60)):
            _write(raw / f"{kind}.{lang}", _head(f"{name}.{lang}.gz", n))
    return raw


def _cfg(raw: Path, dest: Path, pairs=PAIRS, **kw) -> PreprocessConfig:
    base = dict(source_lang=pairs[0][0], target_lang=pairs[0][1], trainpref=str(raw / "train"), destdir=str(dest),
                validpref=[str(raw / "valid")], testpref=[str(raw / "test")], vocab_size=400)
    return PreprocessConfig(**(base | kw))


@pytest.fixture(scope="module")
def built(m30k, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("ml") / "data"
    result = ML.preprocess_multilingual(_cfg(m30k, dest), PAIRS, 5.0)
    assert not result.up_to_date and result.destdir == dest
    return dest


def _pair_split(d: Path, m: dict, name: str, lang: str):
    """A pair's split of one language (any of the directory's languages, not only the first pair's)."""
    return load_split(d, name, lang, manifest=m)


# ---------------------------------------------------------------------------------------------
# the layout
# ---------------------------------------------------------------------------------------------


def test_the_directory_has_the_contracts_layout(built):
    m = load_manifest(built)  # check_entries accepts it
    verify_files(built, m)
    assert (m["source_lang"], m["target_lang"]) == ("de", "en")  # the first pair's
    assert m["dictionaries"] == {"joined": True, **{lang: {"file": "dict.txt", "size": m["dictionaries"]["de"]["size"]}
                                                    for lang in ("de", "en", "fr")}}
    assert m["subword"]["files"] == {"de": "spm.model", "en": "spm.model", "fr": "spm.model"} and m["subword"]["joint"]
    assert list(m["splits"]) == [f"{k}.{s}-{t}" for s, t in PAIRS for k in KINDS]
    ml = m["multilingual"]
    assert ml["pairs"] == ["de-en", "en-de", "fr-en"] and ml["langs"] == ["de", "en", "fr"]
    assert ml["tags"] == {"de": ">>de<<", "en": ">>en<<", "fr": ">>fr<<"} and ml["spm_temperature"] == 5.0
    assert ml["sentences"] == {p: {"train": 400, "valid": 60, "test": 60} for p in ml["pairs"]}
    for name, split in m["splits"].items():
        s, t = name.split(".")[1].split("-")
        shard = split["shards"][0]
        assert shard[s]["bin"] == f"{name}.{s}.000.bin" and shard[t]["idx"] == f"{name}.{t}.000.idx"
    on_disk = {p.name for p in built.iterdir()} - {"manifest.json", ".nmtkit-verified.json"}
    assert on_disk == set(m["files"])
    assert {n for n in on_disk if n.startswith("dict")} == {"dict.txt"}
    assert load_split(built, "train.de-en", "de").sizes.sum() == m["splits"]["train.de-en"]["tokens"]["de"]
    src_dict, tgt_dict = load_dictionaries(built, m)
    assert src_dict is tgt_dict


def test_sources_start_with_the_target_tag_and_hold_the_encoded_text(built, m30k):
    """Every source sentence is [tag of the pair's target] + the text's pieces; every target is
    its text's pieces alone (valid and test keep every line, so they compare line by line)."""
    m = load_manifest(built)
    d, _ = load_dictionaries(built, m)
    spm = load_subword_model(built, "fr", m)
    tag_ids = {d.index(tag_token(lang)) for lang in ("de", "en", "fr")}
    assert tag_ids == {4, 5, 6}
    for s, t in PAIRS:
        for kind in KINDS:
            name = f"{kind}.{s}-{t}"
            src, tgt = _pair_split(built, m, name, s), _pair_split(built, m, name, t)
            assert len(src) == len(tgt) == m["splits"][name]["sentences"]
            assert all(src[i][0] == d.index(tag_token(t)) for i in range(len(src)))
            assert not any(set(src[i][1:].tolist()) & tag_ids or set(tgt[i].tolist()) & tag_ids for i in range(len(src)))
            if kind == "train":
                continue
            for lang, ds, strip in ((s, src, 1), (t, tgt, 0)):
                raw = (m30k / f"{kind}.{lang}").read_text(encoding="utf-8").splitlines()
                assert [ds[i][strip:].tolist() for i in range(len(ds))] == [d.encode(spm.encode(x)).tolist() for x in raw]


def test_tags_come_first_with_their_training_counts_and_the_pieces_counts_are_all_pairs(built):
    m = load_manifest(built)
    d = Dictionary.load(built / "dict.txt")
    # >>en<<: the train sentences of de-en and fr-en; >>de<<: en-de's; fr is no target: count 0, kept
    assert d.symbols[NSPECIAL:NSPECIAL + 3] == [">>de<<", ">>en<<", ">>fr<<"]
    assert d.counts[NSPECIAL:NSPECIAL + 3] == [400, 800, 0]
    assert not any(is_tag(p) for p in subwords.SentencePieceModel(built / "spm.model").pieces())
    counts = Counter()
    for s, t in PAIRS:
        name = f"train.{s}-{t}"
        for lang, skip in ((s, 1), (t, 0)):
            ds = _pair_split(built, m, name, lang)
            counts.update(x for i in range(len(ds)) for x in ds[i][skip:].tolist())
    pieces = {i: c for i, c in enumerate(d.counts) if i >= NSPECIAL + 3 and not d.symbols[i].startswith("madeupword")}
    assert {i: counts.get(i, 0) for i in pieces} == pieces
    assert len(d) % 8 == 0


def test_the_joint_dictionary_keeps_the_tags_whatever_the_caps():
    pieces = {"a": 5, "b": 3, "c": 3, ">>xx<<": 99}  # a piece spelled like a tag stays out
    d = ML.joint_dictionary(pieces, {"en": 2, "de": 0}, nwords=6)
    assert d.symbols == ["<pad>", "<s>", "</s>", "<unk>", ">>de<<", ">>en<<"]
    d = ML.joint_dictionary(pieces, {"en": 2, "de": 0}, nwords=8, pad_to_multiple=4)
    assert d.symbols[4:] == [">>de<<", ">>en<<", "a", "b"] and d.counts[4:] == [0, 2, 5, 3]
    d = ML.joint_dictionary(pieces, {"en": 2, "de": 0}, threshold=4, pad_to_multiple=8)
    assert d.symbols[4:] == [">>de<<", ">>en<<", "a", "madeupword0000"]
    assert ML.joint_dictionary(pieces, {"en": 2, "de": 0}).symbols[4:] == [">>de<<", ">>en<<", "a", "b", "c"]


# ---------------------------------------------------------------------------------------------
# the learning mix
# ---------------------------------------------------------------------------------------------


def _formula(n: dict[str, int], t: float, size: int) -> dict[str, float]:
    z = sum(v ** (1 / t) for v in n.values())
    return {k: size * v ** (1 / t) / z for k, v in n.items()}


@pytest.mark.parametrize("t, max_lines", [(1.0, 0), (1.0, 555), (2.0, 0), (5.0, 300), (5.0, 10**6), (0.5, 100)])
def test_the_learning_mix_follows_n_to_the_power_one_over_t(t, max_lines):
    n = {"de": 1000, "en": 100, "fr": 10}
    got = ML.sample_lines(n, t, max_lines)
    size = 1110 if max_lines in (0, 10**6) else max_lines
    assert sum(got.values()) == size
    want = _formula(n, t, size)
    assert all(abs(got[k] - want[k]) < 1 for k in n), (got, want)


def test_the_learning_mix_at_t_1_is_proportional_and_large_t_near_uniform():
    n = {"de": 1000, "en": 100, "fr": 10}
    assert ML.sample_lines(n, 1.0, 0) == n
    assert ML.sample_lines(n, 1.0, 555) == {"de": 500, "en": 50, "fr": 5}
    # T = 2: shares sqrt(n) = 31.62 : 10 : 3.162 of 1110 lines = 783.8, 247.9, 78.4 (largest remainders round up)
    assert ML.sample_lines(n, 2.0, 0) == {"de": 784, "en": 248, "fr": 78}
    far = ML.sample_lines(n, 1000.0, 0)
    assert all(abs(v - 370) <= 3 for v in far.values()), far
    assert ML.sample_lines({"de": 10, "en": 0}, 5.0, 0) == {"de": 10, "en": 0}


def _synthetic(rng: random.Random, lang: str, n: int) -> list[str]:
    words = [f"{lang}{w}" for w in ("hat", "sol", "mir", "kop", "tun", "lev", "daz", "bor")]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 6))) for _ in range(n)]


def test_a_small_language_weighs_more_in_the_mix_and_per_pair_files_win(tmp_path, monkeypatch):
    """de-en from line-parallel P.de/P.en (300 lines), fr-en from fairseq's P.fr-en.fr/.en (30,
    preferred over P.fr, which holds other text): the mix holds fr lines as sample_lines says."""
    rng = random.Random(3)
    raw = tmp_path / "raw"
    raw.mkdir()
    text = {lang: _synthetic(rng, lang, 300) for lang in ("de", "en", "fr")}
    small = {"fr": _synthetic(rng, "fx", 30), "en": _synthetic(rng, "en", 30)}
    for lang in ("de", "en", "fr"):
        _write(raw / f"train.{lang}", text[lang])
    for lang in ("fr", "en"):
        _write(raw / f"train.fr-en.{lang}", small[lang])
    seen: list[str] = []
    learn = subwords.learn_sentencepiece

    def spy(lines, vocab_size):  # the real learner, on the lines it is given, which are kept
        return learn((seen.append(x) or x for x in lines), vocab_size)

    monkeypatch.setattr(subwords, "learn_sentencepiece", spy)
    pairs = [("de", "en"), ("fr", "en")]
    cfg = _cfg(raw, tmp_path / "out", pairs, validpref=[], testpref=[], vocab_size=60)
    m = ML.preprocess_multilingual(cfg, pairs, 5.0).manifest
    assert m["inputs"]["train.fr-en"]["fr"]["path"] == str(raw / "train.fr-en.fr")
    assert m["inputs"]["train.de-en"]["de"]["path"] == str(raw / "train.de")
    take = ML.sample_lines({"de": 300, "en": 330, "fr": 30}, 5.0, 10**6)
    assert m["subword"]["sample_lines"] == take
    got = Counter(x.split()[0][:2] for x in seen)  # each line's language, by its words' prefix
    assert "fr" not in got  # P.fr is not read: fr-en has its own files
    assert all(abs(got[k] - take[lang]) <= 0.15 * take[lang] for k, lang in (("de", "de"), ("en", "en"), ("fx", "fr"))), \
        (got, take)
    assert take["fr"] / sum(take.values()) > 3 * 30 / 660
    d = Dictionary.load(tmp_path / "out" / "dict.txt")
    fr = _pair_split(tmp_path / "out", m, "train.fr-en", "fr")
    assert len(fr) == 30 and d.string(fr[0][1:])[0].startswith("▁fx")


def test_a_small_nwordssrc_keeps_the_tags(tmp_path):
    rng = random.Random(5)
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("de", "en", "fr"):
        _write(raw / f"train.{lang}", _synthetic(rng, lang, 60))
    cfg = _cfg(raw, tmp_path / "out", validpref=[], testpref=[], vocab_size=60, nwordssrc=9)
    m = ML.preprocess_multilingual(cfg, PAIRS, 5.0).manifest
    d = Dictionary.load(tmp_path / "out" / "dict.txt")
    assert d.symbols[4:7] == [">>de<<", ">>en<<", ">>fr<<"] and len(d) == 16  # 9 entries, padded to 8s
    assert [s.startswith("madeupword") for s in d.symbols[7:]] == [False] * 2 + [True] * 7
    assert m["dictionaries"]["fr"]["size"] == 16
    src = _pair_split(tmp_path / "out", m, "train.fr-en", "fr")
    assert all(src[i][0] == d.index(">>en<<") for i in range(len(src)))
    assert m["splits"]["train.fr-en"]["unk"]["fr"] > 0  # the cut pieces became <unk>, the tags did not


# ---------------------------------------------------------------------------------------------
# the command line: summary, refusals, reruns, atomic install
# ---------------------------------------------------------------------------------------------


def _cli(run_cli, raw: Path, dest: Path, *extra):
    return run_cli("preprocess", "--trainpref", raw / "train", "--destdir", dest, "--vocab-size", "60", *extra)


@pytest.fixture
def tiny(tmp_path) -> Path:
    rng = random.Random(11)
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("de", "en", "fr"):
        _write(raw / f"train.{lang}", _synthetic(rng, lang, 80))
    return raw


def test_the_summary_has_a_row_per_pair_and_split_and_a_rerun_is_up_to_date(tiny, tmp_path, run_cli):
    dest = tmp_path / "out"
    r = _cli(run_cli, tiny, dest, "--pairs", "de-en,fr-en", "--spm-temperature", "2")
    assert r.code == 0, r
    head, *rows = r.out.splitlines()
    assert head.startswith(f"{dest}: written; 2 pairs (de-en, fr-en)") and "--spm-temperature 2" in head
    assert [row.split()[:3] for row in rows[1:3]] == [["train.de-en", "80", "80"], ["train.fr-en", "80", "80"]]
    assert "learned sentencepiece model spm.model" in r.err and "de-en: encoded train" in r.err
    before = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    r = _cli(run_cli, tiny, dest, "--pairs", "de-en,fr-en", "--spm-temperature", "2")
    assert r.code == 0 and r.out.startswith(f"{dest}: up to date"), r
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir() if p.name in before} == before
    r = _cli(run_cli, tiny, dest, "--pairs", "de-en,fr-en")  # another temperature: another dataset
    assert r.code == 2 and "already holds a different dataset (spm_temperature 2.0 -> 5.0)" in r.err, r


@pytest.mark.parametrize("args, message", [
    (("--pairs", "de_en"), "--pairs: 'de_en' is not a pair SRC-TGT"),
    (("--pairs", "de-en,de-de"), "--pairs: 'de-de' translates a language into itself"),
    (("--pairs", "de-en", "--source-lang", "de"), "--source-lang does not apply with --pairs"),
    (("--pairs", "de-en", "-t", "en"), "--target-lang does not apply with --pairs"),
    (("--pairs", "de-en", "--bpe", "subword-nmt"), "--bpe subword-nmt does not apply with --pairs"),
    (("--pairs", "de-en", "--separate-bpe"), "--separate-bpe does not apply with --pairs"),
    (("--pairs", "de-en", "--nwordstgt", "9"), "--nwordstgt/--thresholdtgt do not apply with --pairs"),
    (("--pairs", "de-en", "--spm-temperature", "0"), "--spm-temperature must be a number > 0, got 0.0"),
    (("-s", "de", "-t", "en", "--spm-temperature", "2"), "--spm-temperature applies to --pairs"),
    (("--pairs", "de-en,cs-en"), "--trainpref {raw}/train: file not found: {raw}/train.cs (nor .gz; nor "
                                 "{raw}/train.cs-en.cs)"),
])
def test_refusals_are_one_line(tiny, tmp_path, run_cli, args, message):
    r = _cli(run_cli, tiny, tmp_path / "out", *args)
    err = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(err) == 1 and message.format(raw=tiny) in err[0], r
    assert not (tmp_path / "out").exists()


def test_unequal_line_counts_and_a_half_present_per_pair_naming_name_the_files(tiny, tmp_path, run_cli):
    _write(tiny / "train.fr-en.fr", ["a b"] * 5)
    _write(tiny / "train.fr-en.en", ["a b"] * 4)
    r = _cli(run_cli, tiny, tmp_path / "out", "--pairs", "de-en,fr-en")
    assert r.code == 2 and r.err.strip().splitlines() == [
        f"nmtkit: error: --trainpref: line counts differ: {tiny}/train.fr-en.fr has 5 lines, "
        f"{tiny}/train.fr-en.en has 4 lines"], r
    (tiny / "train.fr-en.en").unlink()  # per-pair naming for fr only: the missing en file is named
    r = _cli(run_cli, tiny, tmp_path / "out", "--pairs", "de-en,fr-en")
    assert r.code == 2 and f"file not found: {tiny}/train.fr-en.en" in r.err, r
    (tiny / "train.de").write_bytes(b"gut\n\xff\n" + b"x\n" * 78)
    r = _cli(run_cli, tiny, tmp_path / "out", "--pairs", "de-en")
    assert r.code == 2 and f"{tiny}/train.de:2: invalid UTF-8" in r.err, r


def test_two_builds_of_the_same_inputs_are_byte_identical(tiny, tmp_path):
    pairs = [("de", "en"), ("en", "de"), ("fr", "en")]
    for name in ("a", "b"):
        ML.preprocess_multilingual(_cfg(tiny, tmp_path / name, pairs, validpref=[], testpref=[], vocab_size=60),
                                   pairs, 5.0)
    files = {name: {p.name: p.read_bytes() for p in (tmp_path / name).iterdir()
                    if p.name not in ("manifest.json", ".nmtkit-verified.json")} for name in ("a", "b")}
    assert files["a"] == files["b"] and len(files["a"]) == 2 + 3 * 4


def test_the_directory_appears_only_complete(tiny, tmp_path, monkeypatch):
    """A failure while the shards are rewritten leaves no DESTDIR and nothing beside it; until the
    swap, DESTDIR does not exist."""
    dest = tmp_path / "out"
    rewrite = ML._rewrite_shard
    calls = []

    def failing(*args, **kw):
        assert not dest.exists()
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return rewrite(*args, **kw)

    monkeypatch.setattr(ML, "_rewrite_shard", failing)
    cfg = _cfg(tiny, dest, [("de", "en"), ("fr", "en")], validpref=[], testpref=[], vocab_size=60)
    with pytest.raises(RuntimeError, match="disk on fire"):
        ML.preprocess_multilingual(cfg, [("de", "en"), ("fr", "en")], 5.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
    monkeypatch.setattr(ML, "_rewrite_shard", rewrite)
    ML.preprocess_multilingual(cfg, [("de", "en"), ("fr", "en")], 5.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "raw"] and (dest / "manifest.json").is_file()


# ---------------------------------------------------------------------------------------------
# the manifest's multilingual entry is checked
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    (lambda m: m["multilingual"].update(pairs=["de-en", "de+fr"]), "multilingual.pairs must be a list of pairs SRC-TGT"),
    (lambda m: m["multilingual"].update(langs=["de", "en"]), "multilingual.langs must be the pairs' languages"),
    (lambda m: m["multilingual"]["tags"].pop("fr"), "multilingual.tags must be an object of each language's tag"),
    (lambda m: m.update(target_lang="fr"), "source_lang/target_lang must be the first pair's languages (de-en), "
                                           "got 'de-fr'"),
    (lambda m: m["dictionaries"].pop("fr"), "dictionaries.fr must be an object with the dictionary's file"),
    (lambda m: m["subword"]["files"].update(fr="../spm.model"), "subword.files.fr must be a file name"),
    (lambda m: m["splits"].update({"train.de-fr": m["splits"]["train.de-en"]}), "splits must be keyed by KIND.SRC-TGT"),
    (lambda m: m["splits"]["valid.fr-en"]["shards"][0].pop("fr"), "shards of the languages fr and en"),
    (lambda m: m.update(multilingual=["de-en"]), "multilingual must be an object"),
])
def test_an_inconsistent_multilingual_entry_is_refused_in_one_line(built, change, message):
    m = json.loads((built / "manifest.json").read_text(encoding="utf-8"))
    check_entries(json.loads(json.dumps(m)), "M")
    change(m)
    with pytest.raises(UserError) as e:
        check_entries(m, "M")
    assert str(e.value).startswith("M: ") and message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_sample_lines_has_no_overflow_at_tiny_temperatures():
    got = ML.sample_lines({"de": 10**9, "en": 10}, 0.01, 1000)
    assert got == {"de": 1000, "en": 0} and not any(math.isnan(v) for v in got.values())
    assert np.isclose(sum(ML.sample_lines({"a": 7, "b": 3}, 3.0, 5).values()), 5)


def test_library_callers_get_the_same_checks(tiny, tmp_path):
    cfg = _cfg(tiny, tmp_path / "out", validpref=[], testpref=[], vocab_size=60)
    for pairs, t, message in [([("de", "en"), ("de", "en")], 5.0, "'de-en' is given twice"),
                              ([("de", "en"), ("fr", "EN")], 5.0, "'fr-EN' is not a pair SRC-TGT"),
                              ([], 5.0, "--pairs: give at least one pair"),
                              ([("de", "en")], float("nan"), "--spm-temperature must be a number > 0")]:
        with pytest.raises(UserError, match=message):
            ML.preprocess_multilingual(cfg, pairs, t)
    assert not (tmp_path / "out").exists()
