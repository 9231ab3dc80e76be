"""`nmtkit preprocess`: round trips, counts, cleaning, determinism, checksums and every bad input."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_file
from nmtkit.data import preprocess as P
from nmtkit.data.dictionary import Dictionary
from nmtkit.data.preprocess import PreprocessConfig, load_manifest, preprocess
from nmtkit.data.shards import load_split
from nmtkit.data.subwords import load_subword_model
from nmtkit.data.textfiles import iter_lines
from nmtkit.errors import UserError

WORDS = ("the a man woman dog cat runs sits on in park street red blue small big and with "
         "children play ball near water tree house").split()


def sentence(rng: random.Random, lo: int = 2, hi: int = 9) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def translate(line: str) -> str:
    """A toy 'target language': every word reversed, so the two sides differ but align."""
    return " ".join(w[::-1] for w in line.split())


def write_pair(prefix: Path, src_lines, tgt_lines, gz: bool = False, src="de", tgt="en") -> None:
    for lang, lines in ((src, src_lines), (tgt, tgt_lines)):
        data = "".join(f"{ln}\n" for ln in lines).encode("utf-8")
        p = Path(f"{prefix}.{lang}{'.gz' if gz else ''}")
        p.write_bytes(gzip.compress(data, mtime=0) if gz else data)


@pytest.fixture
def corpus(tmp_path):
    """train (300 pairs), valid (with an empty line), test; returns (dir, {split: (src, tgt)})."""
    rng = random.Random(7)
    d = tmp_path / "raw"
    d.mkdir()
    out = {}
    for split, n in (("train", 300), ("valid", 20), ("test", 15)):
        src = [sentence(rng) for _ in range(n)]
        if split != "train":
            src[3] = ""  # valid/test keep empty lines, in place
        tgt = [translate(s) for s in src]
        write_pair(d / split, src, tgt)
        out[split] = (src, tgt)
    return d, out


def cfg_for(raw: Path, dest: Path, **kw) -> PreprocessConfig:
    base = dict(source_lang="de", target_lang="en", trainpref=str(raw / "train"), destdir=str(dest),
                validpref=[str(raw / "valid")], testpref=[str(raw / "test")], vocab_size=60)
    base.update(kw)
    return PreprocessConfig(**base)


def decoded(data_dir: Path, split: str, lang: str) -> list[str]:
    """shards -> ids -> tokens -> detokenized text, through the public helpers."""
    src_dict, tgt_dict = P.load_dictionaries(data_dir)
    d = src_dict if lang == "de" else tgt_dict
    model = load_subword_model(data_dir, lang)
    ds = load_split(data_dir, split, lang, verify=True)
    return [model.decode(d.string(ds[i])) for i in range(len(ds))]


def shard_files(data_dir: Path) -> dict[str, bytes]:
    """The data files (not the manifest, nor the record of which files were checked, which holds
    this machine's file times)."""
    return {p.name: p.read_bytes() for p in sorted(data_dir.iterdir())
            if p.name not in ("manifest.json", ".nmtkit-verified.json")}


# ---------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bpe, extra", [("sentencepiece", {}), ("subword-nmt", {"bpe_merges": 40}), ("none", {})])
def test_round_trip_raw_shards_ids_text(tmp_path, corpus, bpe, extra):
    raw, lines = corpus
    kw = {"bpe": bpe, **extra}
    if bpe != "sentencepiece":
        kw["vocab_size"] = 8000
    res = preprocess(cfg_for(raw, tmp_path / "data", joined_dictionary=True, **kw))
    assert not res.up_to_date
    m = load_manifest(tmp_path / "data")
    for split in ("train", "valid", "test"):
        src, tgt = lines[split]
        assert decoded(tmp_path / "data", split, "de") == src
        assert decoded(tmp_path / "data", split, "en") == tgt
        assert m["splits"][split]["lines"] == len(src) == m["splits"][split]["sentences"]
        assert m["splits"][split]["unk"] == {"de": 0, "en": 0}
    # the empty valid line is kept, in place, as an empty sentence
    assert load_split(tmp_path / "data", "valid", "de").sizes[3] == 0
    # subword model helpers as generation will use them: raw text in, text out
    model = load_subword_model(tmp_path / "data", "de")
    assert model.kind == bpe
    assert model.decode(model.encode(lines["train"][0][0])) == lines["train"][0][0]
    if bpe == "subword-nmt":
        toks = model.encode("children water")
        assert any(t.endswith("@@") for t in toks) or len(toks) == 2


def test_sentencepiece_on_real_multi30k_loses_nothing_beyond_its_normalization(tmp_path, run_cli):
    """2000 real pairs through the CLI: ids decode to what sentencepiece alone makes of each line."""
    de, en = shared_file("multi30k", "train.de.gz"), shared_file("multi30k", "train.en.gz")
    raw = tmp_path / "raw"
    raw.mkdir()
    src = [ln for _, ln in zip(range(2000), iter_lines(de))]
    tgt = [ln for _, ln in zip(range(2000), iter_lines(en))]
    write_pair(raw / "train", src, tgt, gz=True)
    write_pair(raw / "valid", src[:50], tgt[:50])
    r = run_cli("preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--validpref", raw / "valid",
                "--destdir", tmp_path / "data", "--vocab-size", "1000", "--joined-dictionary")
    assert r.code == 0, r
    assert "written" in r.out and "train" in r.out  # the summary goes to stdout
    m = load_manifest(tmp_path / "data")
    assert m["dictionaries"]["de"]["size"] % 8 == 0 and m["dictionaries"]["joined"] is True
    model = load_subword_model(tmp_path / "data", "de")
    got = decoded(tmp_path / "data", "valid", "de")
    assert got == [model.decode(model.encode(s)) for s in src[:50]]
    assert sum(g == s for g, s in zip(got, src[:50])) >= 45  # NFKC changes a few characters at most


# ---------------------------------------------------------------------------------------------
# dictionaries and cleaning
# ---------------------------------------------------------------------------------------------


def test_dictionary_counts_are_the_training_token_counts(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw / "train", ["a b a", "c a", "b b"], ["x y", "y y", "z"])
    preprocess(cfg_for(raw, tmp_path / "sep", bpe="none", vocab_size=8000, validpref=[], testpref=[],
                       pad_to_multiple=1))
    assert (tmp_path / "sep" / "dict.de.txt").read_text() == "a 3\nb 3\nc 1\n"
    assert (tmp_path / "sep" / "dict.en.txt").read_text() == "y 3\nx 1\nz 1\n"
    preprocess(cfg_for(raw, tmp_path / "joined", bpe="none", vocab_size=8000, validpref=[], testpref=[],
                       joined_dictionary=True, pad_to_multiple=8))
    text = (tmp_path / "joined" / "dict.de.txt").read_text()
    assert text == (tmp_path / "joined" / "dict.en.txt").read_text()
    # 4 specials + 6 tokens = 10 entries, padded to 16 with fairseq's filler
    assert text == "a 3\nb 3\ny 3\nc 1\nx 1\nz 1\n" + "".join(f"madeupword{i:04d} 0\n" for i in range(6))
    # the ids in the shards follow the dictionary: "a b a" -> 4 5 4
    assert load_split(tmp_path / "joined", "train", "de")[0].tolist() == [4, 5, 4]
    assert load_split(tmp_path / "joined", "train", "en")[2].tolist() == [9]


def test_nwords_and_threshold_cut_to_unk(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw / "train", ["a b a", "c a", "b b"], ["x y", "y y", "z"])
    preprocess(cfg_for(raw, tmp_path / "d", bpe="none", vocab_size=8000, validpref=[], testpref=[],
                       pad_to_multiple=1, nwordssrc=5, thresholdtgt=2))
    src_d, tgt_d = P.load_dictionaries(tmp_path / "d")
    assert src_d.symbols[4:] == ["a"] and tgt_d.symbols[4:] == ["y"]
    m = load_manifest(tmp_path / "d")
    assert m["splits"]["train"]["unk"] == {"de": 4, "en": 2}
    assert load_split(tmp_path / "d", "train", "de")[0].tolist() == [4, 3, 4]


def test_a_dictionary_cap_that_makes_most_tokens_unk_warns(tmp_path, corpus, run_cli):
    """`--nwordssrc 2` once mapped every token to <unk> without a word; now the share is named."""
    raw, _ = corpus
    r = _run(run_cli, raw, tmp_path / "a", "--nwordssrc", "6")  # 2 words kept of 25
    assert r.code == 0, r
    unk = load_manifest(tmp_path / "a")["splits"]["train"]["unk"]
    tokens = sum(len(s.split()) for s in (raw / "train.de").read_text().splitlines())
    warn = [x for x in r.err.splitlines() if "warning" in x]
    assert warn == [f"nmtkit: warning: --nwordssrc 6 turns {unk['de'] / tokens:.1%} of the de training tokens "
                    f"({unk['de']:,} of {tokens:,}) into <unk>; raise --nwordssrc (the dictionary size counts "
                    f"the 4 special symbols)"], r.err
    assert unk["de"] > tokens / 2 and unk["en"] == 0
    r = _run(run_cli, raw, tmp_path / "b", "--thresholdtgt", "100000")
    assert r.code == 0 and "--thresholdtgt 100000 turns 100.0% of the en training tokens" in r.err, r
    r = _run(run_cli, raw, tmp_path / "c", "--nwordssrc", "20", "--thresholdtgt", "2")  # most tokens kept
    assert r.code == 0 and "warning" not in r.err, r


def test_cleaning_rules_like_moses_on_train_only(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    src = ["a b c", "", "a " * 11, "a", "a b c d e f g h i j", "a b", "  ", "a b c d"]
    tgt = ["x y z", "x", "x y", "x y", "x y", "x y z w", "x", "x y z"]
    #       keep    empty  too long  short  ratio 10 > 3*2  keep     empty  keep
    write_pair(raw / "train", src, tgt)
    write_pair(raw / "valid", src, tgt)
    preprocess(cfg_for(raw, tmp_path / "d", bpe="none", vocab_size=8000, testpref=[], max_len=10, min_len=2,
                       ratio=3.0))
    m = load_manifest(tmp_path / "d")
    tr = m["splits"]["train"]
    assert tr["lines"] == 8 and tr["sentences"] == 3
    assert tr["cleaning"]["dropped"] == {"empty": 2, "too_long": 1, "too_short": 1, "ratio": 1}
    assert tr["cleaning"]["dropped_total"] == 5
    assert decoded(tmp_path / "d", "train", "de") == ["a b c", "a b", "a b c d"]
    assert decoded(tmp_path / "d", "train", "en") == ["x y z", "x y z w", "x y z"]
    # valid keeps every line, in order, empty and long ones included
    assert m["splits"]["valid"]["sentences"] == 8
    # (e..j never made it into the training dictionary, so they are <unk> here)
    assert decoded(tmp_path / "d", "valid", "de") == [
        "a b c", "", " ".join(["a"] * 11), "a", "a b c d" + " <unk>" * 6, "a b", "", "a b c d"]
    assert m["splits"]["valid"]["unk"] == {"de": 6, "en": 0}


def test_cleaning_mask_order_and_switches():
    keep, why = P.clean_mask(np.array([0, 300, 1, 20, 5]), np.array([3, 3, 1, 2, 5]), 2, 250, 9.0)
    assert keep.tolist() == [False, False, False, False, True]
    assert why == {"empty": 1, "too_long": 1, "too_short": 1, "ratio": 1}
    keep, why = P.clean_mask(np.array([300, 20]), np.array([3, 2]), 1, 0, 0)
    assert keep.tolist() == [True, True] and sum(why.values()) == 0


def test_all_pairs_cleaned_away_is_a_user_error(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw / "train", ["a a a a"], ["x"])
    with pytest.raises(UserError, match="no sentence pair left after cleaning"):
        preprocess(cfg_for(raw, tmp_path / "d", bpe="none", validpref=[], testpref=[], ratio=2.0))
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------------------------------------
# inputs, determinism, layout
# ---------------------------------------------------------------------------------------------


def test_gz_input_gives_the_same_shards(tmp_path, corpus):
    raw, lines = corpus
    gzraw = tmp_path / "gz"
    gzraw.mkdir()
    for split, (s, t) in lines.items():
        write_pair(gzraw / split, s, t, gz=True)
    preprocess(cfg_for(raw, tmp_path / "plain"))
    preprocess(cfg_for(gzraw, tmp_path / "gzout"))
    assert shard_files(tmp_path / "plain") == shard_files(tmp_path / "gzout")
    assert load_manifest(tmp_path / "gzout")["inputs"]["train"]["de"]["path"].endswith("train.de.gz")


def test_workers_1_and_2_write_identical_files(tmp_path, corpus, monkeypatch):
    raw, _ = corpus
    monkeypatch.setattr(P, "CHUNK_LINES", 32)  # many chunks, so the two workers interleave
    preprocess(cfg_for(raw, tmp_path / "w1", workers=1, joined_dictionary=True))
    preprocess(cfg_for(raw, tmp_path / "w2", workers=2, joined_dictionary=True))
    assert shard_files(tmp_path / "w1") == shard_files(tmp_path / "w2")
    m1, m2 = load_manifest(tmp_path / "w1"), load_manifest(tmp_path / "w2")
    assert m1["files"] == m2["files"] and m1["fingerprint"] == m2["fingerprint"]


def test_workers_identical_for_string_tokens(tmp_path, corpus, monkeypatch):
    raw, _ = corpus
    monkeypatch.setattr(P, "CHUNK_LINES", 32)
    preprocess(cfg_for(raw, tmp_path / "w1", bpe="subword-nmt", vocab_size=8000, bpe_merges=30))
    preprocess(cfg_for(raw, tmp_path / "w2", bpe="subword-nmt", vocab_size=8000, bpe_merges=30, workers=2))
    assert shard_files(tmp_path / "w1") == shard_files(tmp_path / "w2")


def test_shard_size_splits_and_reads_back_concatenated(tmp_path, corpus):
    raw, lines = corpus
    preprocess(cfg_for(raw, tmp_path / "d", shard_size=128, bpe="none", vocab_size=8000))
    m = load_manifest(tmp_path / "d")
    assert [s["sentences"] for s in m["splits"]["train"]["shards"]] == [128, 128, 44]
    assert (tmp_path / "d" / "train.en.002.bin").is_file()
    assert decoded(tmp_path / "d", "train", "en") == lines["train"][1]
    ds = load_split(tmp_path / "d", "train", "de")
    assert len(ds) == 300 and ds.sizes.tolist() == [len(s.split()) for s in lines["train"][0]]
    assert ds.shards[0].tokens.dtype == np.uint8  # tiny dictionary: smallest dtype


def test_separate_subword_models_and_dictionaries(tmp_path, corpus):
    raw, lines = corpus
    preprocess(cfg_for(raw, tmp_path / "d", joint_bpe=False, vocab_size=40))
    m = load_manifest(tmp_path / "d")
    assert m["subword"]["files"] == {"de": "spm.de.model", "en": "spm.en.model"}
    src_d, tgt_d = P.load_dictionaries(tmp_path / "d")
    assert (tmp_path / "d" / "spm.de.model").read_bytes() != (tmp_path / "d" / "spm.en.model").read_bytes()
    assert set(src_d.symbols) != set(tgt_d.symbols) and m["dictionaries"]["joined"] is False
    assert decoded(tmp_path / "d", "test", "en") == lines["test"][1]


def test_spm_sample_is_reproducible(tmp_path, corpus):
    raw, _ = corpus
    preprocess(cfg_for(raw, tmp_path / "a", spm_max_lines=200))
    preprocess(cfg_for(raw, tmp_path / "b", spm_max_lines=200))
    assert (tmp_path / "a" / "spm.model").read_bytes() == (tmp_path / "b" / "spm.model").read_bytes()
    preprocess(cfg_for(raw, tmp_path / "c", spm_max_lines=0))
    assert (tmp_path / "a" / "spm.model").read_bytes() != (tmp_path / "c" / "spm.model").read_bytes()


def test_several_test_sets(tmp_path, corpus):
    raw, lines = corpus
    preprocess(cfg_for(raw, tmp_path / "d", bpe="none", testpref=[str(raw / "test"), str(raw / "valid")]))
    assert decoded(tmp_path / "d", "test1", "en") == [" ".join(s.split()) for s in lines["valid"][1]]


# ---------------------------------------------------------------------------------------------
# checksums, reruns, destinations, interruption
# ---------------------------------------------------------------------------------------------


def test_checksum_failure_on_corrupted_shard(tmp_path, corpus, run_cli):
    raw, _ = corpus
    cfg = cfg_for(raw, tmp_path / "d")
    preprocess(cfg)
    p = tmp_path / "d" / "train.en.000.bin"
    data = bytearray(p.read_bytes())
    data[10] ^= 0x01  # same size: only the checksum can tell
    p.write_bytes(bytes(data))
    assert len(load_split(tmp_path / "d", "train", "en", verify=False)) == 300  # no verify: opens
    with pytest.raises(UserError, match=r"train\.en\.000\.bin: checksum mismatch"):
        load_split(tmp_path / "d", "train", "en", verify=True)
    load_split(tmp_path / "d", "train", "de", verify=True)  # the other files are fine
    # rerunning the same preprocess notices the damage and refuses without --force
    r = run_cli("preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--validpref", raw / "valid",
                "--testpref", raw / "test", "--destdir", tmp_path / "d", "--vocab-size", "60")
    assert r.code == 2 and "damaged" in r.err and "train.en.000.bin" in r.err and "Traceback" not in r.err
    r = run_cli("preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--validpref", raw / "valid",
                "--testpref", raw / "test", "--destdir", tmp_path / "d", "--vocab-size", "60", "--force")
    assert r.code == 0, r
    load_split(tmp_path / "d", "train", "en", verify=True)


def test_dictionary_checksum_is_checked(tmp_path, corpus):
    raw, _ = corpus
    preprocess(cfg_for(raw, tmp_path / "d"))
    p = tmp_path / "d" / "dict.en.txt"
    p.write_text(p.read_text().replace(" ", "  ", 1) if False else p.read_text() + "extra 1\n")
    with pytest.raises(UserError, match=r"dict\.en\.txt: checksum mismatch"):
        P.load_dictionaries(tmp_path / "d")


def test_rerun_with_same_inputs_is_up_to_date_and_touches_nothing(tmp_path, corpus):
    raw, _ = corpus
    preprocess(cfg_for(raw, tmp_path / "d"))
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "d").iterdir()}
    res = preprocess(cfg_for(raw, tmp_path / "d", workers=2))  # workers do not change the dataset
    assert res.up_to_date
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "d").iterdir()} == before


def test_destination_with_different_dataset_is_refused_unless_force(tmp_path, corpus, run_cli):
    raw, _ = corpus
    preprocess(cfg_for(raw, tmp_path / "d"))
    before = shard_files(tmp_path / "d")
    args = ["preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--destdir", tmp_path / "d",
            "--bpe", "none"]
    r = run_cli(*args)
    assert r.code == 2 and "different dataset" in r.err and "--force" in r.err and "bpe" in r.err
    assert shard_files(tmp_path / "d") == before  # untouched
    r = run_cli(*args, "--force")
    assert r.code == 0, r
    assert load_manifest(tmp_path / "d")["subword"]["kind"] == "none"
    assert not (tmp_path / "d" / "spm.model").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp or old dirs left


def test_foreign_nonempty_destination_is_refused_unless_force(tmp_path, corpus, run_cli):
    raw, _ = corpus
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("precious")
    args = ["preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--destdir", dest, "--bpe", "none"]
    r = run_cli(*args)
    assert r.code == 2 and "not empty" in r.err and (dest / "notes.txt").read_text() == "precious"
    # --force replaces only what nmtkit wrote: a folder of the user's is refused, naming what it holds
    r = run_cli(*args, "--force")
    assert r.code == 2 and "notes.txt" in r.err and (dest / "notes.txt").read_text() == "precious", r
    assert not (dest / "manifest.json").exists()


def test_force_replaces_a_dataset_holding_an_interrupted_write_of_its_record(tmp_path, corpus, run_cli):
    """A kill while a check rewrote the record of checked files leaves its temporary file: the
    dataset's own, replaced with it by --force, not a user's file that blocks --force."""
    raw, _ = corpus
    dest = tmp_path / "d"
    preprocess(cfg_for(raw, dest))
    leftover = dest / "..nmtkit-verified.json.ab12cd34.tmp"  # nmtkit.io.atomic_write's temporary name
    leftover.write_text("{")
    args = ["preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--destdir", dest, "--bpe", "none"]
    r = run_cli(*args, "--force")
    assert r.code == 0, r
    assert not leftover.exists()
    assert load_manifest(dest)["subword"]["kind"] == "none"


def test_force_replaces_only_the_datasets_own_files(tmp_path, corpus, run_cli):
    """A user's files beside an nmtkit dataset (a note, a folder of checkpoints) are never deleted:
    --force refuses, naming them, and the dataset is untouched."""
    raw, _ = corpus
    dest = tmp_path / "d"
    preprocess(cfg_for(raw, dest))
    (dest / "precious.txt").write_text("mine")
    (dest / "runs").mkdir()
    (dest / "runs" / "checkpoint_last.pt").write_bytes(b"x")

    def snapshot():
        return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}

    before = snapshot()
    args = ["preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--destdir", dest, "--bpe", "none"]
    r = run_cli(*args)
    assert r.code == 2 and "different dataset" in r.err and "precious.txt, runs/" in r.err, r
    assert "choose another --destdir" in r.err and "pass --force" not in r.err
    r = run_cli(*args, "--force")
    err = [x for x in r.err.splitlines() if x.strip()]
    assert r.code == 2 and len(err) == 1 and "(precious.txt, runs/)" in err[0] and "manifest.json lists" in err[0], r
    assert snapshot() == before  # everything kept, the user's files included
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    # without those files, --force replaces the dataset
    (dest / "precious.txt").unlink()
    (dest / "runs" / "checkpoint_last.pt").unlink()
    (dest / "runs").rmdir()
    assert run_cli(*args, "--force").code == 0
    assert load_manifest(dest)["subword"]["kind"] == "none" and not (dest / "spm.model").exists()


_CRASH_RUNNER = """
import os, sys
from nmtkit import workdir as W
from nmtkit.data import install as I
from nmtkit.data.preprocess import PreprocessConfig, preprocess

k, fallback, raw, dest = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], sys.argv[4]
state = {"n": 0, "on": False}

def step(fn):
    def wrapped(*a, **kw):
        r = fn(*a, **kw)
        if state["on"]:
            state["n"] += 1
            if state["n"] == k:
                os._exit(137)  # a kill -9 right after this step: no cleanup runs
        return r
    return wrapped

real_install = I.install
def install(*a, **kw):
    state["on"] = True
    try:
        return real_install(*a, **kw)
    finally:
        state["on"] = False

I.install = install
W.exchange = (lambda a, b: False) if fallback else step(W.exchange)
os.rename, os.replace, os.unlink, os.rmdir = step(os.rename), step(os.replace), step(os.unlink), step(os.rmdir)
preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=raw + "/train", destdir=dest,
                            bpe="none", force=True))
print("finished after", state["n"], "steps")
"""


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "two-renames"])
def test_kill_at_every_step_of_a_force_install_leaves_a_complete_dataset(tmp_path, corpus, fallback):
    """`preprocess --force` killed after each file operation of the install (the atomic swap, or
    on systems without it the two renames, then every deletion of the old files): DESTDIR holds
    a complete, verified dataset, the old or the new one; the next run restores or finishes and
    leaves no hidden directory behind."""
    import shutil
    import subprocess
    import sys

    from nmtkit.data.manifest import verify_files

    raw, _ = corpus
    template = tmp_path / "template"
    preprocess(cfg_for(raw, template, validpref=[], testpref=[]))  # the old dataset: sentencepiece, 7 files
    old_fp = load_manifest(template)["fingerprint"]
    runner = tmp_path / "runner.py"
    runner.write_text(_CRASH_RUNNER)
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    crashes = 0
    for k in range(1, 100):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        shutil.copytree(template, out / "d")
        r = subprocess.run([sys.executable, str(runner), str(k), "1" if fallback else "0", str(raw), str(out / "d")],
                           cwd=repo, capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            assert "finished" in r.stdout
            break
        assert r.returncode == 137, r.stderr
        crashes += 1
        if (out / "d").exists():  # the swap and every later step: DESTDIR is complete
            m = load_manifest(out / "d")
            verify_files(out / "d", m)
            assert sorted(p.name for p in (out / "d").iterdir()) == sorted([*m["files"], "manifest.json",
                                                                            ".nmtkit-verified.json"])
        else:  # only between the two renames of the fallback; the hint names where the data is
            assert fallback and k == 1, k
            with pytest.raises(UserError, match="interrupted 'nmtkit preprocess --force' left the previous dataset"):
                load_manifest(out / "d")
        # the next run (without --force: the first would refuse a different dataset) restores or finishes
        logs = []
        res = preprocess(cfg_for(raw, out / "d", validpref=[], testpref=[], bpe="none", force=True), log=logs.append)
        m = load_manifest(out / "d")
        assert m["fingerprint"] == res.manifest["fingerprint"] != old_fp
        verify_files(out / "d", m)
        assert [p.name for p in out.iterdir()] == ["d"], (k, list(out.iterdir()), logs)
    else:
        pytest.fail("the install never finished")
    # the swap (or 2 renames), 9 deletions (7 files, the manifest and the record of checked files),
    # the folder's: each killed once
    assert crashes == (12 if fallback else 11), crashes


def test_next_run_removes_leftovers_of_dead_runs_only(tmp_path, corpus):
    import fcntl
    import os

    raw, _ = corpus
    out = tmp_path / "out"
    out.mkdir()
    dead = out / ".d.abcd1234.partial"  # a build a killed run left
    dead.mkdir()
    (dead / "train.de.000.bin").write_bytes(b"x" * 100)
    live = out / ".d.live0000.partial"  # the build of a run still going (it holds the lock)
    live.mkdir()
    other = out / ".d.x.abcd1234.partial"  # another destination's (--destdir d.x)
    other.mkdir()
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        logs = []
        preprocess(cfg_for(raw, out / "d"), log=logs.append)
        assert sorted(p.name for p in out.iterdir()) == sorted([".d.live0000.partial", ".d.x.abcd1234.partial", "d"])
        assert any(".d.abcd1234.partial, left by an interrupted" in line for line in logs), logs
    finally:
        os.close(fd)


def test_destination_containing_the_inputs_is_refused_even_with_force(tmp_path, corpus, run_cli):
    raw, _ = corpus
    r = run_cli("preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--destdir", raw, "--force")
    assert r.code == 2 and "contains the input file" in r.err
    assert (raw / "train.de").is_file()


def test_interrupted_run_leaves_nothing_that_looks_complete(tmp_path, corpus, monkeypatch):
    raw, _ = corpus

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(P, "_remap_shard", boom)  # interrupt after the shards are half written
    with pytest.raises(KeyboardInterrupt):
        preprocess(cfg_for(raw, tmp_path / "d"))
    assert not (tmp_path / "d").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    monkeypatch.undo()

    # an existing dataset survives an interrupted --force rebuild unchanged
    preprocess(cfg_for(raw, tmp_path / "d"))
    before = shard_files(tmp_path / "d")
    monkeypatch.setattr(P, "_remap_shard", boom)
    with pytest.raises(KeyboardInterrupt):
        preprocess(cfg_for(raw, tmp_path / "d", bpe="none", vocab_size=8000, force=True))
    assert shard_files(tmp_path / "d") == before
    load_split(tmp_path / "d", "train", "de", verify=True)


def test_directory_without_manifest_is_never_taken_for_complete(tmp_path, corpus):
    """What a killed run (or a copy cut short) looks like: shards present, no manifest."""
    raw, _ = corpus
    preprocess(cfg_for(raw, tmp_path / "d"))
    (tmp_path / "d" / "manifest.json").unlink()
    with pytest.raises(UserError, match="not a complete nmtkit data directory"):
        load_split(tmp_path / "d", "train", "de")
    with pytest.raises(UserError, match="not empty and holds no complete nmtkit dataset"):
        preprocess(cfg_for(raw, tmp_path / "d"))
    m = json.loads(json.dumps({"format": "nmtkit-data", "format_version": 1, "complete": False}))
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="marked incomplete"):
        load_manifest(tmp_path / "d")


# ---------------------------------------------------------------------------------------------
# bad input through the CLI: one red line, exit 2, nothing written
# ---------------------------------------------------------------------------------------------


def _run(run_cli, raw: Path, dest: Path, *extra):
    return run_cli("preprocess", "-s", "de", "-t", "en", "--trainpref", raw / "train", "--destdir", dest,
                   "--bpe", "none", *extra)


def _nothing_written(tmp_path: Path, dest: Path) -> bool:
    return not dest.exists() and not [p for p in dest.parent.iterdir() if p.name.startswith(".")]


def test_mismatched_line_counts(tmp_path, run_cli):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.de").write_text("a\nb\nc\n")
    (raw / "train.en").write_text("x\ny\n")
    r = _run(run_cli, raw, tmp_path / "out")
    assert r.code == 2, r
    assert "line counts differ" in r.err and "train.de has 3 lines" in r.err and "train.en has 2" in r.err
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert _nothing_written(tmp_path, tmp_path / "out")


def test_mismatched_valid_line_counts_name_the_flag(tmp_path, run_cli, corpus):
    raw, _ = corpus
    (raw / "valid.en").write_text("only one line\n")
    r = _run(run_cli, raw, tmp_path / "out", "--validpref", raw / "valid")
    assert r.code == 2 and "--validpref" in r.err and "has 20 lines" in r.err and "has 1 line" in r.err and "1 lines" not in r.err
    assert _nothing_written(tmp_path, tmp_path / "out")


def test_invalid_utf8_names_file_and_line(tmp_path, run_cli):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.de").write_bytes(b"gut\nauch gut\nkaputt \xff hier\n")
    (raw / "train.en").write_text("good\nalso good\nbroken here\n")
    r = _run(run_cli, raw, tmp_path / "out")
    assert r.code == 2 and f"{raw / 'train.de'}:3: invalid UTF-8" in r.err
    assert _nothing_written(tmp_path, tmp_path / "out")


def test_invalid_utf8_in_gz_names_file_and_line(tmp_path, run_cli):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.de.gz").write_bytes(gzip.compress(b"ok\n" * 5000 + b"\xc3\x28\n"))
    (raw / "train.en").write_text("ok\n" * 5001)
    r = _run(run_cli, raw, tmp_path / "out")
    assert r.code == 2 and "train.de.gz:5001: invalid UTF-8" in r.err


def test_missing_and_empty_training_files(tmp_path, run_cli):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.de").write_text("a\n")
    r = _run(run_cli, raw, tmp_path / "out")
    assert r.code == 2 and "--trainpref" in r.err and "train.en" in r.err and "not found" in r.err
    (raw / "train.en").write_text("")
    (raw / "train.de").write_text("")
    r = _run(run_cli, raw, tmp_path / "out")
    assert r.code == 2 and "empty" in r.err and "--trainpref" in r.err
    assert _nothing_written(tmp_path, tmp_path / "out")


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--workers", "0"], "--workers"),
        (["--shard-size", "0"], "--shard-size"),
        (["--ratio", "0.5"], "--ratio"),
        (["--pad-to-multiple", "0"], "--pad-to-multiple"),
        (["--vocab-size", "100"], "--vocab-size"),  # with --bpe none
        (["--joined-dictionary", "--nwordstgt", "10"], "--nwordstgt"),
        (["--min-len", "5", "--max-len", "3"], "--min-len"),
        (["--testpref", "a,,b"], "--testpref"),
    ],
)
def test_bad_flags_name_the_flag(tmp_path, run_cli, corpus, args, flag):
    raw, _ = corpus
    r = _run(run_cli, raw, tmp_path / "out", *args)
    assert r.code == 2 and flag in r.err and "Traceback" not in r.err
    assert not (tmp_path / "out").exists()


def test_vocab_size_too_large_for_the_text_is_a_user_error(tmp_path, corpus):
    raw, _ = corpus
    with pytest.raises(UserError, match="--vocab-size 5000"):
        preprocess(cfg_for(raw, tmp_path / "d", vocab_size=5000))
    assert not (tmp_path / "d").exists()


def test_same_languages_refused(tmp_path, corpus, run_cli):
    raw, _ = corpus
    r = run_cli("preprocess", "-s", "de", "-t", "de", "--trainpref", raw / "train", "--destdir", tmp_path / "o")
    assert r.code == 2 and "must differ" in r.err


def test_dictionary_file_reloads_equal(tmp_path, corpus):
    raw, _ = corpus
    preprocess(cfg_for(raw, tmp_path / "d", joined_dictionary=True))
    d = Dictionary.load(tmp_path / "d" / "dict.de.txt")
    assert len(d) == load_manifest(tmp_path / "d")["dictionaries"]["de"]["size"]
    assert len(d) % 8 == 0


def test_sentencepiece_learned_in_a_child_process_gives_the_same_model(tmp_path, corpus, monkeypatch):
    """Large corpora learn in a separate process (memory); the model must not depend on it."""
    raw, _ = corpus
    preprocess(cfg_for(raw, tmp_path / "inproc", spm_max_lines=500))
    monkeypatch.setattr(P, "SPM_CHILD_MIN_LINES", 0)
    preprocess(cfg_for(raw, tmp_path / "child", spm_max_lines=500))
    assert shard_files(tmp_path / "inproc") == shard_files(tmp_path / "child")
    with pytest.raises(UserError, match="--vocab-size 5000"):  # errors in the child come back as such
        preprocess(cfg_for(raw, tmp_path / "big", vocab_size=5000))
    assert not (tmp_path / "big").exists()


def test_workers_do_not_rerun_the_callers_script(tmp_path, corpus):
    """Spawned workers import only nmtkit: an unguarded script calling preprocess runs once."""
    import subprocess
    import sys

    raw, _ = corpus
    script = tmp_path / "unguarded.py"
    script.write_text(
        "print('TOP-LEVEL RAN', flush=True)\n"
        "from nmtkit.data.preprocess import PreprocessConfig, preprocess\n"
        f"preprocess(PreprocessConfig(source_lang='de', target_lang='en', trainpref={str(raw / 'train')!r},\n"
        f"    destdir={str(tmp_path / 'd')!r}, vocab_size=60, workers=2))\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("TOP-LEVEL RAN") == 1
    assert load_manifest(tmp_path / "d")["options"]["workers"] == 2


def test_force_through_a_symlinked_destdir_replaces_the_data_behind_it(tmp_path, corpus):
    """data-bin -> /big/disk/data: the link stays, the dataset behind it is replaced in place."""
    raw, _ = corpus
    real = tmp_path / "disk" / "data"
    real.parent.mkdir()
    preprocess(cfg_for(raw, real))
    link = tmp_path / "data-bin"
    link.symlink_to(real)
    preprocess(cfg_for(raw, link, bpe="none", vocab_size=8000, force=True))
    assert link.is_symlink() and load_manifest(real)["subword"]["kind"] == "none"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data-bin", "disk", "raw"]
    assert [p.name for p in real.parent.iterdir()] == ["data"]


def test_the_record_of_checked_files_spares_hashing_and_misses_no_rewrite(tmp_path, corpus, monkeypatch):
    """Checked files are not hashed again while their size, mtime and inode are what the data
    directory's record holds; a file rewritten in place, or replaced by a copy with its old
    mtime, is hashed again and its corruption named. Entries within RACY_NS of the record's own
    time are never trusted (a change in the same clock tick keeps the mtime)."""
    import os
    import shutil

    from nmtkit.data import manifest as M

    raw, _ = corpus
    d = tmp_path / "d"
    preprocess(cfg_for(raw, d))
    m = load_manifest(d)
    assert (d / M.VERIFIED_NAME).is_file()
    hashed: list[str] = []
    real = M.sha256_file
    monkeypatch.setattr(M, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))

    def check(names=None):
        monkeypatch.setattr(M, "_VERIFIED", set())  # a new process
        hashed.clear()
        M.verify_files(d, m, names)
        return sorted(hashed)

    assert check() == sorted(m["files"])  # just written: every entry is racy, so all are hashed
    old = 1_000_000_000  # files from long ago, recorded now
    for name in m["files"]:
        os.utime(d / name, ns=(old, old))
    (d / M.VERIFIED_NAME).unlink()
    assert check() == sorted(m["files"])  # no record: hashed, then recorded
    assert check() == []  # recorded and unchanged: none hashed
    os.utime(d / M.VERIFIED_NAME, ns=(old + M.RACY_NS // 2,) * 2)  # a record written just after the files
    assert check() == sorted(m["files"])  # racy: hashed, and the record written anew
    assert check() == []  # so once, not at every run
    shard = d / "train.en.000.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))  # in place: a new mtime
    with pytest.raises(UserError, match=r"train\.en\.000\.bin: checksum mismatch"):
        check(["train.en.000.bin"])
    copy = tmp_path / "copy.bin"
    shutil.copyfile(shard, copy)
    os.utime(copy, ns=(old, old))
    os.replace(copy, shard)  # the old mtime, another inode
    with pytest.raises(UserError, match=r"train\.en\.000\.bin: checksum mismatch"):
        check(["train.en.000.bin"])
    assert check(["train.de.000.bin"]) == []  # the other files are still trusted


def test_installed_data_directories_get_the_usual_permissions(tmp_path):
    """The temporary build directory (mkdtemp: 0700) and files made by mkstemp (0600) become the
    umask's permissions when installed, for every writer of data directories (preprocess and
    the importers)."""
    import os
    import stat
    import tempfile

    from nmtkit.data import install

    dest = tmp_path / "d"
    tmp = install.temp_dir(dest)
    fd, name = tempfile.mkstemp(dir=tmp)
    os.close(fd)
    install.install(tmp, dest, None)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((dest / Path(name).name).stat().st_mode) == 0o666 & ~mask


# --- property tests (Hypothesis) ---
# manifest.json and the record of checked files (VERIFIED_NAME), written by hand and then mutated:
# keys missing, values of the wrong type, extra keys, file names that leave the directory, huge
# numbers, text that is not JSON. Every reader (load_manifest, load_dictionaries,
# subword_model_path, load_subword_model, verify_files) either does its work or refuses with one
# line naming the manifest or the file at fault; never a traceback, and never a file outside the
# directory read or recorded.

import copy  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402

from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nmtkit.data import manifest as M  # noqa: E402
from tests.json_mutations import WEIRD_VALUES, mutate, replaced  # noqa: E402

_CODES = "#version: 0.2\ns t</w>\ne st</w>\nl o\n"
_OUTSIDE = "outside.txt"  # a file beside the data directory, which no manifest may reach ("../outside.txt")


def _hand_made_files() -> dict[str, bytes]:
    de, en = Dictionary.from_counts({"hund": 3, "katze": 2}), Dictionary.from_counts({"dog": 3, "cat": 2, "low": 1})
    return {"dict.de.txt": de.to_text().encode(), "dict.en.txt": en.to_text().encode(),
            "bpe.codes": _CODES.encode(), "train.de.000.bin": b"\x01\x02\x03\x04"}


_FILES = _hand_made_files()
_MANIFEST = {
    "format": "nmtkit-data", "format_version": 1, "complete": True, "source_lang": "de", "target_lang": "en",
    "subword": {"kind": "subword-nmt", "kinds": {"de": "subword-nmt", "en": "none"}, "joint": False,
                "files": {"de": "bpe.codes", "en": None}},
    "dictionaries": {"joined": False, "de": {"file": "dict.de.txt", "size": 6}, "en": {"file": "dict.en.txt", "size": 7}},
    "splits": {},
    "files": {n: hashlib.sha256(b).hexdigest() for n, b in _FILES.items()},
}


def _write_data_dir(root: Path, manifest_text: str) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    d = root / "bin"
    d.mkdir(parents=True)
    for name, b in _FILES.items():
        (d / name).write_bytes(b)
    (root / _OUTSIDE).write_bytes(b"not the data directory's\n")
    (d / "manifest.json").write_text(manifest_text, encoding="utf-8")
    return d


# refusals of what the manifest holds rather than of how it is written, in words of their own
_SEMANTIC = ("language ", "unknown subword model kind ")


def _one_line_naming(e: UserError, *names) -> None:
    msg = str(e)
    assert "\n" not in msg and "\r" not in msg and msg, repr(msg)
    assert any(str(n) in msg for n in names) or msg.startswith(_SEMANTIC), msg


def _read_everything(d: Path) -> None:
    """Every reader of the data directory, each either working or refusing with one line."""
    from nmtkit.data.manifest import load_dictionaries, subword_model_path, verify_files

    try:
        m = load_manifest(d)
    except UserError as e:
        _one_line_naming(e, d)
        return
    assert all(M.is_file_name(n) for n in m["files"])
    for read in (lambda: load_dictionaries(d, m), lambda: verify_files(d, m),
                 lambda: subword_model_path(d, "de", m), lambda: subword_model_path(d, "en", m),
                 lambda: load_subword_model(d, "de", m).encode("lowest"), lambda: load_subword_model(d, "en", m)):
        try:
            got = read()
        except UserError as e:
            _one_line_naming(e, d)
            continue
        if isinstance(got, Path):
            assert got.parent == d, got
    rec = d / M.VERIFIED_NAME
    if rec.exists():  # what verify_files recorded: the directory's own files only
        assert all(M.is_file_name(n) and (d / n).is_file() for n in json.loads(rec.read_text()))


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_manifest")


@pytest.mark.fuzz
@given(data=st.data())
def test_any_mutation_of_a_manifest_is_read_or_refused_in_one_line(fuzz_root, data):
    """(Regressions found here have tests of their own below.)"""
    doc = mutate(data, _MANIFEST)
    d = _write_data_dir(fuzz_root, json.dumps(doc))
    M._VERIFIED.clear()  # each example as a new process
    _read_everything(d)


@pytest.mark.fuzz
@given(text=st.one_of(
    st.sampled_from(["", "{", "[]", "null", "1", '"x"', "9" * 5000, "[" * 5000, "{\"format\": " * 3000,
                     json.dumps(_MANIFEST)[:-1], json.dumps(_MANIFEST) + "x",
                     json.dumps(_MANIFEST).replace('"format_version": 1', '"format_version": ' + "9" * 5000)]),
    st.text(max_size=30)))
def test_a_manifest_that_is_not_json_is_refused_in_one_line(fuzz_root, text):
    d = _write_data_dir(fuzz_root, text)
    M._VERIFIED.clear()
    _read_everything(d)


def test_the_hand_made_data_directory_reads(fuzz_root):
    """The property tests' starting point is a good data directory: every reader works on it."""
    from nmtkit.data.manifest import load_dictionaries, subword_model_path, verify_files

    d = _write_data_dir(fuzz_root, json.dumps(_MANIFEST))
    m = load_manifest(d)
    verify_files(d, m)
    src, tgt = load_dictionaries(d, m)
    assert "hund" in src and "dog" in tgt
    assert subword_model_path(d, "de", m) == d / "bpe.codes" and subword_model_path(d, "en", m) is None
    assert load_subword_model(d, "de", m).encode("lowest") == ["lo@@", "w@@", "est"]


@pytest.mark.parametrize("where, value, message", [
    (("files",), {"../outside.txt": "0" * 64}, "files must be keyed by file names in the directory, got '../outside.txt'"),
    (("files",), {"/etc/hostname": "0" * 64}, "files must be keyed by file names in the directory, got '/etc/hostname'"),
    (("files", "dict.de.txt"), ["0" * 64], "files['dict.de.txt'] must be a sha256 (hex), got ['000"),
    (("dictionaries", "de", "file"), "../outside.txt", "dictionaries.de.file must be a file name in the directory, "
                                                       "got '../outside.txt'"),
    (("dictionaries", "en"), None, "dictionaries.en must be an object with the dictionary's file, got None"),
    (("subword", "files", "de"), "/etc/hostname", "subword.files.de must be a file name in the directory or null, "
                                                  "got '/etc/hostname'"),
    (("subword", "files"), ["bpe.codes"], "subword.files must be an object of languages and file names, got ['bpe.codes']"),
    (("subword", "kinds"), "none", "subword.kinds must be an object of languages and kinds, got 'none'"),
    (("subword", "kind"), None, "subword.kind must be a subword model kind, got None"),
    (("source_lang",), ["de"], "source_lang must be a language name, got ['de']"),
    # names with a line break: messages that name them ran over two lines
    (("source_lang",), "\n", "source_lang must be a language name, got '\\n'"),
    (("subword", "files", "de"), "\n", "subword.files.de must be a file name in the directory or null, got '\\n'"),
    (("files",), {"a\u2028b": "0" * 64}, "files must be keyed by file names in the directory, got 'a\\u2028b'"),
    (("files",), {"é" * 128: "0" * 64}, "files must be keyed by file names in the directory, got '" + "é" * 56 + "..."),
    (("files",), None, "files must be an object of file names and sha256s, got None"),
])
def test_manifest_entries_of_the_wrong_type_or_outside_the_directory_are_named(fuzz_root, where, value, message):
    """Before: a KeyError or TypeError traceback at the first reader of the entry, or, for a name
    leaving the directory, a file outside it read, hashed and recorded."""
    d = _write_data_dir(fuzz_root, json.dumps(replaced(_MANIFEST, where, value)))
    with pytest.raises(UserError) as e:
        load_manifest(d)
    assert str(e.value).startswith(f"{d / 'manifest.json'}: {message}"), str(e.value)


def test_manifest_without_dictionaries_or_subword_entries_names_what_is_missing(fuzz_root):
    """A hand-made manifest may lack these sections (load_split needs neither); their readers said
    KeyError."""
    from nmtkit.data.manifest import dictionary_path, subword_model_path

    doc = {k: v for k, v in _MANIFEST.items() if k not in ("dictionaries", "subword")}
    d = _write_data_dir(fuzz_root, json.dumps(doc))
    for read, key in ((lambda: dictionary_path(d, "de"), "dictionaries"), (lambda: subword_model_path(d, "de"), "subword"),
                      (lambda: load_subword_model(d, "en"), "subword")):
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value) == f"{d / 'manifest.json'}: no {key!r} entry; rerun nmtkit preprocess"


# the record of checked files: name -> [size, mtime_ns, inode, sha256], as written or mutated
_RECORD_ENTRY = st.one_of(
    st.just("real"),  # the file's true entry (it is trusted when not racy)
    st.lists(st.one_of(st.integers(), st.text(max_size=4), st.none(), st.booleans(), st.floats()), max_size=5),
    WEIRD_VALUES,
)


@pytest.mark.fuzz
@given(entries=st.dictionaries(st.sampled_from([*_FILES, "../" + _OUTSIDE, "", "x"]), _RECORD_ENTRY, max_size=5),
       raw=st.sampled_from([None, "", "[]", "{", "9" * 5000, "[" * 5000, '{"a": ' * 500 + "1" + "}" * 500]),
       racy=st.booleans(), corrupt=st.booleans())
@example(entries={}, raw="[" * 5000, racy=False, corrupt=False)  # RecursionError: a traceback before
def test_any_record_of_checked_files_never_hides_a_corrupt_file(fuzz_root, entries, raw, racy, corrupt):
    """Whatever the record holds, verify_files trusts exactly its entries that are a file's true
    [size, mtime_ns, inode, sha256] and older than the record by RACY_NS; every other file is
    hashed, so a corrupt one is named."""
    from nmtkit.data.manifest import verify_files

    d = _write_data_dir(fuzz_root, json.dumps(_MANIFEST))
    old = 1_000_000_000
    shard = d / "train.de.000.bin"
    if corrupt:
        shard.write_bytes(b"\x09" + _FILES[shard.name][1:])  # same size
    for name in _FILES:
        os.utime(d / name, ns=(old, old))
    rec = {}
    for name, v in entries.items():
        rec[name] = [*M._stat(d / name), _MANIFEST["files"][name]] if v == "real" and name in _FILES else v
    rec_path = d / M.VERIFIED_NAME
    rec_path.write_text(raw if raw is not None else json.dumps(rec), encoding="utf-8")
    os.utime(rec_path, ns=((old + M.RACY_NS // 2,) * 2) if racy else (old + 2 * M.RACY_NS,) * 2)
    trusted = raw is None and not racy and entries.get(shard.name) == "real"
    M._VERIFIED.clear()
    if corrupt and not trusted:
        with pytest.raises(UserError) as e:
            verify_files(d, load_manifest(d))
        assert str(e.value) == f"{shard}: checksum mismatch with manifest.json (corrupt or modified file)"
    else:
        verify_files(d, load_manifest(d))
    if not corrupt or trusted:  # verified: the record now trusts the files as they are, and no other
        after = json.loads(rec_path.read_text(encoding="utf-8"))
        assert all(after[n] == [*M._stat(d / n), _MANIFEST["files"][n]] for n in _FILES)


def test_a_subword_kind_without_its_file_is_named(fuzz_root):
    """"kinds" deleted from a manifest whose target side has no model file: the target's kind
    is then "subword-nmt", and load_subword_model raised TypeError (open(None))."""
    doc = copy.deepcopy(_MANIFEST)
    del doc["subword"]["kinds"]
    d = _write_data_dir(fuzz_root, json.dumps(doc))
    assert load_subword_model(d, "de").encode("low") == ["lo@@", "w"]
    with pytest.raises(UserError) as e:
        load_subword_model(d, "en")
    assert str(e.value) == f"{d}: its manifest gives 'en' a subword-nmt model but no file (subword.files.en)"
