"""`nmtkit train` on a multilingual data directory: temperature sampling of the pairs, batches over
their concatenation, validation per direction and its averages, exact resume, --lang-pairs.

The data directories here are written directly in the layout of nmtkit.data.languages (a joint
dictionary holding the `>>xx<<` tags, one split per pair and kind, sources beginning with the
target language's tag): a word-mapping task per pair that a tiny model learns in a few updates.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from nmtkit import checkpoints as ck
from nmtkit.data import sampling as SP
from nmtkit.data.batching import filter_by_size, make_batches
from nmtkit.data.dictionary import Dictionary
from nmtkit.data.languages import split_name, tag_token
from nmtkit.data.manifest import sha256_file
from nmtkit.data.shards import ShardSetWriter, dtype_for_vocab
from nmtkit.errors import UserError
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.report import TensorBoardLog, read_log

from conftest import shared_file, word_mapping_data_dir

REPO = Path(__file__).resolve().parents[1]
PAIRS = {"de-en": 300, "fr-en": 60, "en-de": 120}  # training sentences per pair
LANGS = ("de", "en", "fr")
N_WORDS = 10


def _word(lang: str, k: int) -> str:
    return f"{lang[0]}{k}"  # d3 (de), e3 (en), f3 (fr): the task maps word k to word k


def _sentences(pair: str, n: int, rng: random.Random, lengths: tuple[int, int] = (2, 8)) -> tuple[list[list[str]], list[list[str]]]:
    src, tgt = pair.split("-")
    ks = [[rng.randrange(N_WORDS) for _ in range(rng.randint(*lengths))] for _ in range(n)]
    return [[_word(src, k) for k in s] for s in ks], [[_word(tgt, k) for k in s] for s in ks]


def _write_side(d: Path, split: str, lang: str, sents: list[list[int]], dtype) -> dict:
    w = ShardSetWriter(d, split, lang, dtype, shard_size=10_000)
    lengths = np.array([len(s) for s in sents], dtype=np.int64)
    w.add(np.array([i for s in sents for i in s], dtype=np.int64), lengths)
    (info,) = w.close()
    return {"bin": info.bin, "idx": info.idx, "dtype": info.dtype, "tokens": info.tokens}


def multilingual_dir(root: Path, pairs: dict[str, int] = PAIRS, n_valid: int = 16, seed: int = 0,
                     long_valid: tuple[str, ...] = ()) -> Path:
    """A complete multilingual data directory (docs/formats.md, nmtkit.data.languages) at root/bin;
    `long_valid`: these pairs' validation sentences are 30-40 words long (the others 2-8)."""
    rng = random.Random(seed)
    text = {(kind, p): _sentences(p, n, rng, (30, 40) if kind == "valid" and p in long_valid else (2, 8))
            for p, n in pairs.items() for kind, n in (("train", n), ("valid", n_valid))}
    counts: dict[str, int] = {}
    for (kind, p), (src, tgt) in text.items():
        if kind == "train":
            for tok in (t for s in src + tgt for t in s):
                counts[tok] = counts.get(tok, 0) + 1
    for lang in LANGS:  # a tag's count: the training sentences with that target
        counts[tag_token(lang)] = sum(n for p, n in pairs.items() if p.endswith("-" + lang))
    vocab = Dictionary.from_counts(counts)
    d = root / "bin"
    d.mkdir(parents=True)
    files = {"dict.txt": vocab.save(d / "dict.txt")}
    dtype = dtype_for_vocab(len(vocab))
    splits = {}
    for (kind, p), (src, tgt) in text.items():
        s, t = p.split("-")
        name = split_name(kind, s, t)
        tag = vocab.index(tag_token(t))
        shard = {"sentences": len(src),
                 s: _write_side(d, name, s, [[tag, *vocab.encode(x).tolist()] for x in src], dtype),
                 t: _write_side(d, name, t, [vocab.encode(x).tolist() for x in tgt], dtype)}
        splits[name] = {"lines": len(src), "sentences": len(src), "shards": [shard]}
        files.update({shard[lang][k]: sha256_file(d / shard[lang][k]) for lang in (s, t) for k in ("bin", "idx")})
    first = next(iter(pairs)).split("-")
    manifest = {
        "format": "nmtkit-data", "format_version": 1, "complete": True,
        "source_lang": first[0], "target_lang": first[1],
        "subword": {"kind": "none", "kinds": dict.fromkeys(LANGS, "none"), "joint": None,
                    "files": dict.fromkeys(LANGS)},
        "dictionaries": {"joined": True, **{lang: {"file": "dict.txt", "size": len(vocab)} for lang in LANGS}},
        "splits": splits, "files": files,
        "multilingual": {"pairs": list(pairs), "langs": list(LANGS), "tags": {x: tag_token(x) for x in LANGS},
                         "sentences": {p: {"train": n, "valid": n_valid} for p, n in pairs.items()}},
    }
    (d / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return d


@pytest.fixture(scope="module")
def ml_dir(tmp_path_factory):
    return multilingual_dir(tmp_path_factory.mktemp("ml"))


def config(data_dir, save_dir, **kw) -> TrainConfig:
    base = dict(data_dir=str(data_dir), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=256,
                lr_scheduler="inverse_sqrt", lr=3e-3, warmup_updates=5, log_interval=1, progress_bar=False,
                threads=1, no_epoch_checkpoints=True)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


# ---- the sampler ----------------------------------------------------------------------------------


def test_shares_follow_the_temperature_formula():
    counts = [10_000, 1_000, 10]
    assert SP.sampling_shares(counts, 1.0) == pytest.approx([10_000 / 11_010, 1_000 / 11_010, 10 / 11_010])
    w = [10_000 ** 0.2, 1_000 ** 0.2, 10 ** 0.2]  # T = 5: 6.3096, 3.9811, 1.5849
    assert SP.sampling_shares(counts, 5.0) == pytest.approx([x / sum(w) for x in w])
    assert SP.sampling_shares(counts, 1e6) == pytest.approx([1 / 3] * 3, abs=1e-5)
    assert SP.sampling_shares([5, 0, 5], 2.0).tolist() == [0.5, 0.0, 0.5]
    # k_p = round(N q_p), N = 11010: T = 1 gives every pair its own size back
    assert SP.epoch_counts(counts, 1.0).tolist() == counts
    # T = 5: 11010 * (6.3096, 3.9811, 1.5849) / 11.8755 = 5849.6, 3690.9, 1469.4
    assert SP.epoch_counts(counts, 5.0).tolist() == [5850, 3691, 1469]
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            SP.sampling_shares(counts, bad)


def test_an_epoch_selects_full_copies_and_a_subset():
    counts = [1_000, 100, 10]
    ks = SP.epoch_counts(counts, 5.0)  # 1110 * (3.9811, 2.5119, 1.5849) / 8.0779: the small pairs upsampled
    sel = SP.epoch_selection(counts, 5.0, seed=7, epoch=3)
    assert sel.dtype == np.int32 and len(sel) == ks.sum()
    starts = [0, 1_000, 1_100, 1_110]
    for p, (n, k) in enumerate(zip(counts, ks)):
        mine = sel[(sel >= starts[p]) & (sel < starts[p + 1])] - starts[p]
        assert len(mine) == k
        times = np.bincount(mine, minlength=n)  # each sentence floor(k/n) times, k mod n of them once more
        assert sorted(set(times.tolist())) == sorted({k // n, k // n + 1} if k % n else {k // n})
        assert int((times == k // n + 1).sum()) == (k % n if k % n else 0)
    assert ks.tolist() == [547, 345, 218]


def test_the_selection_depends_on_seed_and_epoch_only():
    counts = [1_000, 100, 10]
    a = SP.epoch_selection(counts, 5.0, seed=1, epoch=2)
    assert np.array_equal(a, SP.epoch_selection(counts, 5.0, seed=1, epoch=2))
    assert not np.array_equal(a, SP.epoch_selection(counts, 5.0, seed=1, epoch=3))
    assert not np.array_equal(a, SP.epoch_selection(counts, 5.0, seed=2, epoch=2))
    # T = 1: every sentence once, whatever the seed and epoch
    assert np.array_equal(SP.epoch_selection(counts, 1.0, seed=5, epoch=9), np.arange(1_110))


def _pair_data(d: Path):
    from nmtkit.data.manifest import load_manifest

    m = load_manifest(d)
    return [SP.load_pair_split(d, m, "train", *p.split("-")) for p in PAIRS]


def test_the_batches_are_the_length_bucketed_batches_of_the_selection(ml_dir):
    data = _pair_data(ml_dir)
    kw = dict(temperature=2.0, max_tokens=64, max_source_positions=8, max_target_positions=1024, seed=4)
    b = SP.SampledEpochBatches(data, **kw)
    assert b.counts == list(PAIRS.values()) and len(b.src_ds) == sum(PAIRS.values())
    assert b._src_sizes.dtype == np.uint8 and np.array_equal(b._src_sizes, np.concatenate([s.sizes for s, _ in data]))
    src_sizes = np.concatenate([s.sizes for s, _ in data])
    tgt_sizes = np.concatenate([t.sizes for _, t in data])
    assert b.filter.skipped == int((src_sizes + 1 > 8).sum()) > 0  # sources of 8 tokens: 7 words + tag
    for epoch in (1, 2):
        sel = SP.epoch_selection(b.counts, 2.0, 4, epoch)
        keep = filter_by_size(src_sizes[sel], tgt_sizes[sel], max_source_positions=8, max_target_positions=1024,
                              max_tokens=64).indices
        want = make_batches(keep, src_sizes[sel], tgt_sizes[sel], max_tokens=64, seed=4, epoch=epoch)
        got = b.batches(epoch)
        assert len(got) == len(want) and all(np.array_equal(g, sel[w]) for g, w in zip(got, want))
        # the batches mix directions
        pair_of = np.repeat(np.arange(3), b.counts)
        assert any(len(set(pair_of[g].tolist())) > 1 for g in got)
    # two processes: each every 2nd batch of the same plan, the remainder dropped
    ranks = [SP.SampledEpochBatches(data, rank=r, world_size=2, **kw).batches(2) for r in (0, 1)]
    one = b.batches(2)
    assert len(ranks[0]) == len(ranks[1]) == len(one) // 2
    for r in (0, 1):
        assert all(np.array_equal(x, one[r + 2 * i]) for i, x in enumerate(ranks[r]))
    batch = next(b.iterate(2, offset=1))
    assert np.array_equal(batch.indices, one[1]) and batch.src_tokens.shape[0] == len(one[1])


# ---- training ---------------------------------------------------------------------------------------


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=400, force_terminal=False), buf


def test_a_multilingual_run_validates_every_direction_and_averages(ml_dir, tmp_path):
    console, out = _console()
    res = T.train(config(ml_dir, tmp_path / "run", max_update=14, validate_interval_updates=7, eval_bleu=True,
                         best_checkpoint_metric="bleu", arch_overrides={"dropout": 0.0}, lr=5e-3), console)
    assert res.reason == "max_update"
    recs = read_log(tmp_path / "run" / "train_log.jsonl")
    start = recs[0]
    assert start["train_pairs"] == sum(PAIRS.values())
    shares = SP.sampling_shares(list(PAIRS.values()), 5.0)
    ml = start["multilingual"]
    assert ml["sampling_temperature"] == 5.0 and list(ml["pairs"]) == list(PAIRS)
    assert [p["share"] for p in ml["pairs"].values()] == pytest.approx(shares.tolist())
    assert [p["per_epoch"] for p in ml["pairs"].values()] == SP.epoch_counts(list(PAIRS.values()), 5.0).tolist()
    valid = [r for r in recs if r["type"] == "valid"]
    assert len(valid) >= 2
    for r in valid:
        dirs = r["directions"]
        assert list(dirs) == list(PAIRS)
        for key in ("loss", "nll_loss", "ppl", "bleu"):
            assert r[key] == pytest.approx(sum(d[key] for d in dirs.values()) / 3, rel=1e-12), key
        assert r["tgt_tokens"] == sum(d["tgt_tokens"] for d in dirs.values())
        assert all(d["ppl"] == pytest.approx(2 ** d["nll_loss"]) and 0 <= d["bleu"] <= 100 for d in dirs.values())
    # --best-checkpoint-metric bleu: the best is the highest mean BLEU, and checkpoint_best.pt its weights
    best = max(valid, key=lambda r: r["bleu"])
    assert valid[-1]["best"] == pytest.approx(best["bleu"])
    state = ck.load_checkpoint(tmp_path / "run" / "checkpoint_best.pt")
    assert state["best"] == {"metric": "bleu", "value": pytest.approx(best["bleu"])} and state["update"] == best["update"]
    text = out.getvalue()
    assert "3 language pairs, sampled at temperature 5 (1 = in proportion to the data): de-en 300 sentences, " \
           f"share {shares[0]:.3f}" in text
    assert f"| mean of 3 directions: de-en nll_loss {valid[-1]['directions']['de-en']['nll_loss']:.3f} bleu " in text
    # the batching key of a multilingual run names its pairs and temperature
    key = ck.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train"]["data_position"]["batching"]
    assert key["lang_pairs"] == "de-en,fr-en,en-de" and key["sampling_temperature"] == 5.0


def test_a_direction_without_a_validation_pair_that_fits_is_left_out_of_the_means(tmp_path):
    """fr-en's validation sentences are all longer than the model's 20 source positions: that
    direction is left out of validation (one yellow line, the start record's valid_left_out), and
    the means, BLEU included, are of the other two; with every direction so, the run is refused."""
    d = multilingual_dir(tmp_path / "ml", long_valid=("fr-en",))
    console, out = _console()
    short = {"dropout": 0.0, "max_source_positions": 20, "max_target_positions": 20}
    T.train(config(d, tmp_path / "run", max_update=4, validate_interval_updates=2, eval_bleu=True,
                   arch_overrides=short), console)
    recs = read_log(tmp_path / "run" / "train_log.jsonl")
    ml = recs[0]["multilingual"]
    assert ml["valid_directions"] == ["de-en", "en-de"] and ml["valid_left_out"] == ["fr-en"]
    valid = [r for r in recs if r["type"] == "valid"]
    assert len(valid) == 2
    for r in valid:
        assert list(r["directions"]) == ["de-en", "en-de"]
        for key in ("nll_loss", "bleu"):
            assert r[key] == pytest.approx(sum(x[key] for x in r["directions"].values()) / 2, rel=1e-12)
            assert r[key] == r[key]  # not NaN
    assert "fr-en: no validation pair fits the model, all 16 are skipped (16 with the source over the encoder " \
           "limit): the direction is left out of validation and of its means" in out.getvalue()
    # every direction too long: refused before training, naming each
    d2 = multilingual_dir(tmp_path / "ml2", long_valid=tuple(PAIRS))
    with pytest.raises(UserError, match=r"no direction has a validation pair that fits the model \(de-en: 16 with the "
                       r"source over the encoder limit; fr-en: .*--no-validate"):
        T.train(config(d2, tmp_path / "run2", max_update=2, arch_overrides=short))
    assert not (tmp_path / "run2" / "checkpoint_last.pt").exists()


def test_the_best_checkpoint_follows_the_mean_loss(ml_dir, tmp_path):
    T.train(config(ml_dir, tmp_path / "run", max_update=12, validate_interval_updates=3, lr=5e-3))
    valid = [r for r in read_log(tmp_path / "run" / "train_log.jsonl") if r["type"] == "valid"]
    best = min(valid, key=lambda r: r["nll_loss"])
    state = ck.load_checkpoint(tmp_path / "run" / "checkpoint_best.pt")
    assert state["best"]["metric"] == "loss" and state["best"]["value"] == pytest.approx(best["nll_loss"])
    assert state["update"] == best["update"]
    assert [r["improved"] for r in valid] == [r["nll_loss"] == min(v["nll_loss"] for v in valid[: i + 1])
                                              for i, r in enumerate(valid)]


def test_resume_mid_epoch_is_bit_identical(ml_dir, tmp_path):
    # 18 batches in epoch 1 at --max-tokens 200, two per update: stopping at update 12 is
    # mid-epoch 2, whose selection differs from epoch 1's
    kw = dict(max_tokens=200, update_freq=2, seed=3, sampling_temperature=2.0, validate_interval_updates=5)
    full = T.train(config(ml_dir, tmp_path / "a", max_update=16, **kw))
    part1 = T.train(config(ml_dir, tmp_path / "b", max_update=12, **kw))
    pos = ck.load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")["train"]["data_position"]
    assert pos["epoch"] >= 2 and pos["batch_offset"] > 0  # genuinely mid-epoch, past the first
    with pytest.raises(UserError, match=r"^--sampling-temperature 3.0 differs from the 2.0 that .*--reset-dataloader"):
        T.train(config(ml_dir, tmp_path / "b", max_update=16, **{**kw, "sampling_temperature": 3.0}))
    with pytest.raises(UserError, match=r"^--lang-pairs de-en,fr-en differs from the de-en,fr-en,en-de that"):
        T.train(config(ml_dir, tmp_path / "b", max_update=16, lang_pairs="de-en,fr-en", **kw))
    part2 = T.train(config(ml_dir, tmp_path / "b", max_update=16, **kw))
    assert part1.losses + part2.losses == full.losses
    a = ck.load_checkpoint(tmp_path / "a" / "checkpoint_last.pt")
    b = ck.load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    va = [r for r in read_log(tmp_path / "a" / "train_log.jsonl") if r["type"] == "valid"]
    vb = [r for r in read_log(tmp_path / "b" / "train_log.jsonl") if r["type"] == "valid"]
    assert [(r["update"], r["directions"]) for r in va] == [(r["update"], r["directions"]) for r in vb]


def test_two_gloo_processes_match_one_with_update_freq_2(ml_dir, tmp_path):
    """torchrun, 2 CPU processes: both plan the same sampled epoch and take every 2nd batch of it,
    so their updates are one process's with 2 batches accumulated (dropout off; the sums' order
    differs, hence the tolerances); validation per direction gathers both ranks' halves."""
    common = ["--arch", "transformer_tiny", "--dropout", "0", "--max-tokens", "200", "--lr-scheduler",
              "inverse_sqrt", "--lr", "3e-3", "--warmup-updates", "3", "--max-update", "4", "--threads", "1",
              "--no-progress-bar", "--log-interval", "1", "--validate-interval-updates", "4",
              "--no-epoch-checkpoints", "--sampling-temperature", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "nmtkit", "train", str(ml_dir), "--save-dir", str(tmp_path / "ddp"), *common]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    one = T.train(config(ml_dir, tmp_path / "one", update_freq=2, max_update=4, validate_interval_updates=4,
                         warmup_updates=3, max_tokens=200, sampling_temperature=2.0, arch_overrides={"dropout": 0.0}))
    logs = [read_log(tmp_path / d / "train_log.jsonl") for d in ("ddp", "one")]
    train = [[r for r in log if r["type"] == "train"] for log in logs]
    assert [r["tgt_tokens"] for r in train[0]] == [r["tgt_tokens"] for r in train[1]]
    assert [r["loss"] for r in train[0]] == pytest.approx(one.losses, rel=1e-6)
    valid = [[r for r in log if r["type"] == "valid"][0] for log in logs]
    for name in PAIRS:
        a, b = valid[0]["directions"][name], valid[1]["directions"][name]
        assert a["tgt_tokens"] == b["tgt_tokens"] and a["nll_loss"] == pytest.approx(b["nll_loss"], rel=1e-5)


def test_lang_pairs_trains_on_a_subset_and_refuses_an_absent_pair(ml_dir, tmp_path):
    T.train(config(ml_dir, tmp_path / "sub", max_update=2, validate_interval_updates=2,
                          lang_pairs="fr-en,de-en"))
    recs = read_log(tmp_path / "sub" / "train_log.jsonl")
    assert list(recs[0]["multilingual"]["pairs"]) == ["fr-en", "de-en"]
    assert recs[0]["train_pairs"] == PAIRS["fr-en"] + PAIRS["de-en"]
    valid = [r for r in recs if r["type"] == "valid"]
    assert list(valid[0]["directions"]) == ["fr-en", "de-en"]
    with pytest.raises(UserError, match=r"^--lang-pairs: de-fr not in .* \(its pairs: de-en, fr-en, en-de\)$"):
        T.train(config(ml_dir, tmp_path / "bad", lang_pairs="de-en,de-fr"))
    with pytest.raises(UserError, match=r"^--lang-pairs: 'deen' is not a pair SRC-TGT"):
        config(ml_dir, tmp_path / "bad", lang_pairs="deen").validate()
    with pytest.raises(UserError, match="no 'dev' split of pair"):
        T.train(config(ml_dir, tmp_path / "bad", train_subset="dev"))


def test_tensorboard_gets_each_direction_and_the_means():
    class Writer:
        def __init__(self):
            self.scalars = {}

        def add_scalar(self, tag, v, global_step):
            self.scalars[tag] = (v, global_step)

        def flush(self):
            pass

    tb = TensorBoardLog.__new__(TensorBoardLog)
    tb.writer = Writer()
    tb.write({"type": "valid", "update": 9, "loss": 2.0, "nll_loss": 1.5, "ppl": 3.0, "best": 1.5,
              "directions": {"de-en": {"loss": 1.0, "nll_loss": 1.0, "ppl": 2.0, "tgt_tokens": 5},
                             "en-de": {"loss": 3.0, "nll_loss": 2.0, "ppl": 4.0, "bleu": float("nan")}}})
    assert tb.writer.scalars == {"valid/loss": (2.0, 9), "valid/nll_loss": (1.5, 9), "valid/ppl": (3.0, 9),
                                 "valid/best": (1.5, 9), "valid/de-en/loss": (1.0, 9), "valid/de-en/nll_loss": (1.0, 9),
                                 "valid/de-en/ppl": (2.0, 9), "valid/en-de/loss": (3.0, 9),
                                 "valid/en-de/nll_loss": (2.0, 9), "valid/en-de/ppl": (4.0, 9)}


def test_a_bilingual_run_is_unchanged(tmp_path):
    d = word_mapping_data_dir(tmp_path, 120, 12, 12, seed=1)
    T.train(config(d, tmp_path / "bi", max_update=3, validate_interval_updates=3, eval_bleu=True))
    recs = read_log(tmp_path / "bi" / "train_log.jsonl")
    assert "multilingual" not in recs[0]
    valid = [r for r in recs if r["type"] == "valid"]
    assert list(valid[0]) == ["type", "time", "epoch", "update", "loss", "nll_loss", "ppl", "tgt_tokens", "weights",
                              "bleu", "best", "improved", "bad_validations"]
    key = ck.load_checkpoint(tmp_path / "bi" / "checkpoint_last.pt")["train"]["data_position"]["batching"]
    assert set(key) == {"max_tokens", "batch_size", "seed", "pad_multiple", "world_size"}
    with pytest.raises(UserError, match=r"^--lang-pairs: .* is a bilingual data directory \(de-en\)"):
        T.train(config(d, tmp_path / "bi2", lang_pairs="de-en"))


# ---- through `nmtkit preprocess --pairs` --------------------------------------------------------------


def _head(name: str, n: int) -> list[str]:
    with gzip.open(shared_file("multi30k", name), "rt", encoding="utf-8") as fh:
        return [next(fh).rstrip("\n") for _ in range(n)]


def test_multi30k_through_preprocess_pairs_and_train(tmp_path, run_cli):
    """300 training and 30 validation lines of Multi30k in de, en and fr: `nmtkit preprocess
    --pairs` (joint sentencepiece model), then `nmtkit train` on two of its three pairs."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("de", "en", "fr"):
        for kind, name, n in (("train", "train", 300), ("valid", "val", 30)):
            (raw / f"{kind}.{lang}").write_text("".join(f"{x}\n" for x in _head(f"{name}.{lang}.gz", n)), "utf-8")
    data = tmp_path / "data"
    r = run_cli("preprocess", "--pairs", "de-en,en-de,fr-en", "--trainpref", raw / "train", "--validpref",
                raw / "valid", "--destdir", data, "--vocab-size", "300")
    assert r.code == 0, r
    r = run_cli("train", data, "--save-dir", tmp_path / "run", "--arch", "transformer_tiny", "--max-tokens", "512",
                "--max-update", "4", "--validate-interval-updates", "4", "--eval-bleu", "--eval-bleu-max-len-b", "3",
                "--lang-pairs", "en-de,fr-en", "--sampling-temperature", "1", "--lr-scheduler", "inverse_sqrt",
                "--warmup-updates", "2", "--threads", "1", "--no-progress-bar", "--no-epoch-checkpoints")
    assert r.code == 0, r
    assert ("2 language pairs, sampled at temperature 1 (1 = in proportion to the data): en-de 300 sentences, "
            "share 0.500 (300 per epoch), fr-en 300 sentences, share 0.500 (300 per epoch)") in r.err
    (valid,) = [x for x in read_log(tmp_path / "run" / "train_log.jsonl") if x["type"] == "valid"]
    assert list(valid["directions"]) == ["en-de", "fr-en"]
    assert valid["bleu"] == pytest.approx((valid["directions"]["en-de"]["bleu"] + valid["directions"]["fr-en"]["bleu"]) / 2)
    # hypotheses are detokenized without the language tags
    t = T.Trainer(config(data, tmp_path / "other", lang_pairs="en-de"))
    de, en = t.tgt_dict.index(">>de<<"), t.tgt_dict.index(">>en<<")
    piece_ids = [t.tgt_dict.index(p) for p in t.tgt_dict.symbols if p.startswith("\u2581")][:2]
    words = t._to_text(piece_ids)
    assert words and t._to_text([de, *piece_ids[:1], en, *piece_ids[1:]]) == words and ">>" not in words
