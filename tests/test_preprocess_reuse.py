"""`nmtkit preprocess --srcdict/--tgtdict`: new text binarized with an existing data directory's
dictionaries and subword model, checked against the subword library and the old dictionary
applied by hand; and every refusal."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nmtkit.data import subwords
from nmtkit.data.dictionary import Dictionary
from nmtkit.data.preprocess import PreprocessConfig, load_manifest, preprocess
from nmtkit.data.shards import load_split
from nmtkit.errors import UserError

OLD_WORDS = "the a man woman dog cat runs sits on in park street red blue small big".split()
NEW_WORDS = "the man dog runs in street market bank shares price rose fell sharply today".split()


def write_corpus(d: Path, words, seed: int, n_train: int = 200) -> Path:
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", 12)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(n)]
        (d / f"{split}.de").write_text("".join(s + "\n" for s in src), encoding="utf-8")
        (d / f"{split}.en").write_text("".join(" ".join(w[::-1] for w in s.split()) + "\n" for s in src),
                                       encoding="utf-8")
    return d


def cfg(raw: Path, dest: Path, **kw) -> PreprocessConfig:
    base = dict(source_lang="de", target_lang="en", trainpref=str(raw / "train"), validpref=[str(raw / "valid")],
                destdir=str(dest), vocab_size=50, max_len=0, ratio=0)
    base.update(kw)
    return PreprocessConfig(**base)


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """A joint-sentencepiece, joined-dictionary data dir learned on OLD_WORDS text."""
    root = tmp_path_factory.mktemp("old")
    raw = write_corpus(root / "raw", OLD_WORDS, seed=1)
    preprocess(cfg(raw, root / "bin", joined_dictionary=True))
    return root / "bin"


@pytest.fixture(scope="module")
def new_raw(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("new") / "raw", NEW_WORDS, seed=2, n_train=80)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def by_hand(old_dir: Path, lang: str, text: list[str]) -> list[list[int]]:
    """The old model's ids for `text`: sentencepiece itself, then the old dictionary's index."""
    import sentencepiece as spm

    m = load_manifest(old_dir)
    sp = spm.SentencePieceProcessor(model_file=str(old_dir / m["subword"]["files"][lang]))
    d = Dictionary.load(old_dir / m["dictionaries"][lang]["file"])
    return [[d.index(p) for p in sp.encode(t, out_type=str)] for t in text]


def shard_ids(data_dir: Path, split: str, lang: str) -> list[list[int]]:
    ds = load_split(data_dir, split, lang, verify=True)
    return [ds[i].tolist() for i in range(len(ds))]


def test_new_text_gets_the_old_models_ids(old, new_raw, tmp_path):
    res = preprocess(cfg(new_raw, tmp_path / "a", srcdict=str(old), tgtdict=str(old)))
    new = tmp_path / "a"
    m_old, m_new = load_manifest(old), res.manifest
    for lang in ("de", "en"):
        # the same dictionary (sha256, which fine-tuning compares) and the same subword model
        assert m_new["files"][f"dict.{lang}.txt"] == m_old["files"][f"dict.{lang}.txt"]
        assert (new / f"dict.{lang}.txt").read_bytes() == (old / f"dict.{lang}.txt").read_bytes()
        for split in ("train", "valid"):
            assert shard_ids(new, split, lang) == by_hand(old, lang, lines(new_raw / f"{split}.{lang}"))
    assert (new / "spm.model").read_bytes() == (old / "spm.model").read_bytes()
    assert m_new["files"]["spm.model"] == m_old["files"]["spm.model"]
    sub = m_new["subword"]
    assert sub["kind"] == "sentencepiece" and sub["joint"] is True and sub["files"] == {"de": "spm.model", "en": "spm.model"}
    assert sub["reused_from"] == {"de": str(old), "en": str(old)} and m_new["dictionaries"]["joined"] is True
    # words the old text never had become pieces of the old model, or <unk> for unseen characters
    assert sum(m_new["splits"]["train"]["unk"].values()) > 0
    assert m_new["options"]["srcdict"] == str(old)


def test_dictionary_files_and_joined_srcdict_alone_give_the_same_data(old, new_raw, tmp_path):
    preprocess(cfg(new_raw, tmp_path / "dir", srcdict=str(old), tgtdict=str(old)))
    preprocess(cfg(new_raw, tmp_path / "files", srcdict=str(old / "dict.de.txt"), tgtdict=str(old / "dict.en.txt")))
    preprocess(cfg(new_raw, tmp_path / "joined", srcdict=str(old), joined_dictionary=True))
    skip = ("manifest.json", ".nmtkit-verified.json")  # (the record holds this machine's file times)
    want = {p.name: p.read_bytes() for p in (tmp_path / "dir").iterdir() if p.name not in skip}
    for other in ("files", "joined"):
        got = {p.name: p.read_bytes() for p in (tmp_path / other).iterdir() if p.name not in skip}
        assert got == want, other


def test_rerun_is_up_to_date_and_old_fingerprints_do_not_move(old, new_raw, tmp_path):
    c = cfg(new_raw, tmp_path / "a", srcdict=str(old), tgtdict=str(old))
    assert not preprocess(c).up_to_date
    assert preprocess(c).up_to_date
    # the flags are left out of the options when not given: data dirs made before them stay up to date
    opts = cfg(new_raw, tmp_path / "b").output_options()
    assert "srcdict" not in opts and "tgtdict" not in opts and "reused" not in opts


def test_separate_models_and_subword_nmt_are_reused_per_language(new_raw, tmp_path):
    raw = write_corpus(tmp_path / "raw", OLD_WORDS, seed=3)
    preprocess(cfg(raw, tmp_path / "sep", joint_bpe=False))
    preprocess(cfg(new_raw, tmp_path / "a", srcdict=str(tmp_path / "sep"), tgtdict=str(tmp_path / "sep")))
    m = load_manifest(tmp_path / "a")
    assert m["subword"]["files"] == {"de": "spm.de.model", "en": "spm.en.model"} and m["subword"]["joint"] is False
    for lang in ("de", "en"):
        assert (tmp_path / "a" / f"spm.{lang}.model").read_bytes() == (tmp_path / "sep" / f"spm.{lang}.model").read_bytes()
        assert shard_ids(tmp_path / "a", "train", lang) == by_hand(tmp_path / "sep", lang, lines(new_raw / f"train.{lang}"))
    assert m["dictionaries"]["joined"] is False
    # subword-nmt: the codes file is copied and applied as subword-nmt applies it
    preprocess(cfg(raw, tmp_path / "bpe", bpe="subword-nmt", bpe_merges=30, vocab_size=8000, joined_dictionary=True))
    preprocess(cfg(new_raw, tmp_path / "b", srcdict=str(tmp_path / "bpe"), joined_dictionary=True))
    mb = load_manifest(tmp_path / "b")
    assert mb["subword"]["kind"] == "subword-nmt" and mb["subword"]["merges"] == 30
    codes = subwords.SubwordNmtModel(tmp_path / "bpe" / "bpe.codes")
    d = Dictionary.load(tmp_path / "bpe" / "dict.de.txt")
    assert shard_ids(tmp_path / "b", "train", "de") == [[d.index(t) for t in codes.encode(s)]
                                                         for s in lines(new_raw / "train.de")]


def test_standalone_dictionary_file_needs_bpe_none(new_raw, tmp_path):
    d = Dictionary.from_counts({"the": 5, "man": 3, "dog": 2, "eht": 5, "nam": 1})
    d.save(tmp_path / "my.dict")
    with pytest.raises(UserError) as e:
        preprocess(cfg(new_raw, tmp_path / "x", srcdict=str(tmp_path / "my.dict"), tgtdict=str(tmp_path / "my.dict")))
    assert str(e.value).startswith(f"--srcdict {tmp_path / 'my.dict'} is not in an nmtkit data directory") and "--bpe none" in str(e.value)
    res = preprocess(cfg(new_raw, tmp_path / "a", srcdict=str(tmp_path / "my.dict"), tgtdict=str(tmp_path / "my.dict"),
                         bpe="none", vocab_size=8000))
    assert res.manifest["subword"]["files"] == {"de": None, "en": None}
    for lang in ("de", "en"):
        assert shard_ids(tmp_path / "a", "train", lang) == [[d.index(w) for w in s.split()]
                                                             for s in lines(new_raw / f"train.{lang}")]


@pytest.mark.parametrize("kw,message", [
    (dict(srcdict="OLD"), "--tgtdict is needed too"),
    (dict(tgtdict="OLD"), "--srcdict is needed too"),
    (dict(srcdict="OLD", tgtdict="OLD", nwordssrc=10), "--nwordssrc does not apply with --srcdict/--tgtdict"),
    (dict(srcdict="OLD", tgtdict="OLD", thresholdtgt=2), "--thresholdtgt does not apply with --srcdict/--tgtdict"),
    (dict(srcdict="OLD", tgtdict="OLD", bpe="subword-nmt"),
     "--bpe subword-nmt does not apply with --srcdict OLD: the text is segmented by that data directory's own subword model (sentencepiece)"),
    (dict(srcdict="OLD/nothing.txt", tgtdict="OLD"), "--srcdict OLD/nothing.txt: no such dictionary file or data directory"),
    (dict(srcdict="RAW", tgtdict="OLD"), "--srcdict RAW: not a dictionary file nor a complete nmtkit data directory"),
    (dict(srcdict="OLD", tgtdict="OLD", source_lang="fr"),
     "--srcdict OLD: the data directory has no 'fr' dictionary (its languages are de and en)"),
])
def test_refusals_name_the_flag(old, new_raw, tmp_path, kw, message):
    kw = {k: v.replace("OLD", str(old)).replace("RAW", str(new_raw)) if isinstance(v, str) else v for k, v in kw.items()}
    raw = new_raw
    if kw.get("source_lang") == "fr":
        raw = tmp_path / "fr"
        raw.mkdir()
        for split in ("train", "valid"):
            (raw / f"{split}.fr").write_bytes((new_raw / f"{split}.de").read_bytes())
            (raw / f"{split}.en").write_bytes((new_raw / f"{split}.en").read_bytes())
    with pytest.raises(UserError) as e:
        preprocess(cfg(raw, tmp_path / "x", **kw))
    assert message.replace("OLD", str(old)).replace("RAW", str(new_raw)) in str(e.value)
    assert not (tmp_path / "x").exists()


def test_joined_flag_with_two_different_dictionaries_and_damaged_or_own_dir(old, new_raw, tmp_path):
    raw = write_corpus(tmp_path / "raw", OLD_WORDS, seed=4)
    preprocess(cfg(raw, tmp_path / "sep"))  # separate dictionaries
    with pytest.raises(UserError, match="--joined-dictionary: --srcdict .* and --tgtdict .* are different dictionaries"):
        preprocess(cfg(new_raw, tmp_path / "x", srcdict=str(tmp_path / "sep"), tgtdict=str(tmp_path / "sep"),
                       joined_dictionary=True))
    # the directory being reused cannot be the destination, even with --force
    with pytest.raises(UserError, match="is the data directory --srcdict reuses"):
        preprocess(cfg(new_raw, tmp_path / "sep", srcdict=str(tmp_path / "sep"), tgtdict=str(tmp_path / "sep"),
                       force=True))
    assert load_manifest(tmp_path / "sep")["inputs"]["train"]["de"]["path"].startswith(str(raw))
    # a damaged dictionary in the reused directory: its checksum names it
    d = tmp_path / "sep" / "dict.en.txt"
    d.write_text(d.read_text(encoding="utf-8").replace(" ", "  ", 1), encoding="utf-8")
    with pytest.raises(UserError, match=r"--tgtdict: .*dict\.en\.txt: checksum mismatch"):
        preprocess(cfg(new_raw, tmp_path / "y", srcdict=str(tmp_path / "sep"), tgtdict=str(tmp_path / "sep")))


def test_cli_flags(old, new_raw, tmp_path, run_cli):
    r = run_cli("preprocess", "-s", "de", "-t", "en", "--trainpref", new_raw / "train", "--destdir", tmp_path / "a",
                "--srcdict", old, "--tgtdict", old)
    assert r.code == 0, r
    assert f"dictionaries reused from {old}" in r.out and "(joined)" in r.out
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["options"]["tgtdict"] == str(old)
    for args, msg in [
        (["--vocab-size", "100"], "--vocab-size does not apply with --srcdict/--tgtdict"),
        (["--task", "parsing"], "--srcdict/--tgtdict apply to --task translation"),
    ]:
        base = [] if "--task" in args else ["-s", "de", "-t", "en", "--trainpref", new_raw / "train"]
        r = run_cli("preprocess", *base, "--destdir", tmp_path / "b", "--srcdict", old, "--tgtdict", old, *args)
        assert r.code == 2 and msg in r.err, (args, r)
