"""`nmtkit train` on a tiny synthetic corpus: learning, exact resume, DDP equivalence, robustness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError
from nmtkit.training import step as S
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.report import read_log

from conftest import word_mapping_data_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """400 pairs of a word-mapping task (wK -> WK), joint dictionary, no subwords."""
    return word_mapping_data_dir(tmp_path_factory.mktemp("corpus"), 400, 24, 24, seed=0)


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


def test_loss_falls_and_log_and_checkpoints(data_dir, tmp_path):
    res = T.train(config(data_dir, tmp_path / "run", max_update=40, lr=5e-3, save_interval_updates=20,
                         keep_last_updates=1, arch_overrides={"dropout": 0.0}, eval_bleu=True, ema_decay=0.5))
    assert res.reason == "max_update" and res.update == 40
    first, last = res.losses[0], sum(res.losses[-5:]) / 5
    assert last < first - 1.0, res.losses  # bits per token
    files = sorted(p.name for p in (tmp_path / "run").iterdir())
    # save_interval 20 with keep_last_updates 1: only the newest update checkpoint remains
    assert "checkpoint_last.pt" in files and "checkpoint_best.pt" in files and "train_log.jsonl" in files
    assert [f for f in files if f.startswith("checkpoint_") and f[11].isdigit()] == [f"checkpoint_{res.epoch}_40.pt"]
    recs = read_log(tmp_path / "run" / "train_log.jsonl")
    train = [r for r in recs if r["type"] == "train"]
    assert [r["update"] for r in train] == list(range(1, 41))
    assert all(r["tgt_tok_per_s"] > 0 and r["ppl"] == pytest.approx(2 ** r["nll_loss"]) for r in train)
    valid = [r for r in recs if r["type"] == "valid"]
    assert valid and recs[-1]["type"] == "end"
    assert all(0 <= r["bleu"] <= 100 and r["weights"] == "ema" for r in valid)
    state = ck.load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    assert state["update"] == 40 and state["arch"] == "transformer_tiny"
    assert state["train"]["data_position"]["world_size"] == 1
    assert len(state["dictionaries"]["src_sha256"]) == 64 and state["data_manifest_id"]
    assert set(state["ema"]) == set(state["model"])
    assert not torch.equal(state["ema"]["tgt_embed.weight"], state["model"]["tgt_embed.weight"])
    # the curves of this run
    from nmtkit.figures.curves import plot_training

    png = plot_training(tmp_path / "run")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_is_bit_identical(data_dir, tmp_path):
    # 15 batches per epoch, update_freq 2: epoch 1 has 8 updates (the last of one batch); stopping
    # at 9 is mid-epoch 2, after a validation and an epoch checkpoint.
    kw = dict(update_freq=2, max_tokens=200, seed=3)
    full = T.train(config(data_dir, tmp_path / "a", max_update=11, **kw))
    part1 = T.train(config(data_dir, tmp_path / "b", max_update=9, **kw))
    pos = ck.load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")["train"]["data_position"]
    assert pos["epoch"] == 2 and pos["batch_offset"] > 0  # genuinely mid-epoch
    part2 = T.train(config(data_dir, tmp_path / "b", max_update=11, **kw))
    assert part1.losses + part2.losses == full.losses
    a = ck.load_checkpoint(tmp_path / "a" / "checkpoint_last.pt")
    b = ck.load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["train"]["optimizer"]["state"], b["train"]["optimizer"]["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    # the log of the resumed run continues: every update logged once
    updates = [r["update"] for r in read_log(tmp_path / "b" / "train_log.jsonl") if r["type"] == "train"]
    assert updates == list(range(1, 12))


def test_two_gloo_processes_match_one_with_update_freq_2(data_dir, tmp_path):
    """torchrun, 2 CPU processes (gloo) vs 1 process accumulating 2 batches: same updates.

    Dropout is off (the two ranks draw their own dropout masks, one process draws them in
    sequence). The only difference left is the order of floating-point sums (gradients are
    all-reduced instead of accumulated), so weights agree to 1e-5 and losses to 1e-6 relative.
    """
    common = ["--arch", "transformer_tiny", "--dropout", "0", "--max-tokens", "200", "--lr-scheduler",
              "inverse_sqrt", "--lr", "3e-3", "--warmup-updates", "3", "--max-update", "4", "--threads", "1",
              "--no-progress-bar", "--log-interval", "1", "--no-validate", "--no-epoch-checkpoints"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "nmtkit", "train", str(data_dir), "--save-dir", str(tmp_path / "ddp"), *common]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    one = T.train(config(data_dir, tmp_path / "one", update_freq=2, max_update=4, no_validate=True,
                         warmup_updates=3, max_tokens=200, arch_overrides={"dropout": 0.0}))
    ddp_log = [r for r in read_log(tmp_path / "ddp" / "train_log.jsonl") if r["type"] == "train"]
    assert [r["tgt_tokens"] for r in ddp_log] == [r["tgt_tokens"] for r in read_log(
        tmp_path / "one" / "train_log.jsonl") if r["type"] == "train"]
    assert [r["loss"] for r in ddp_log] == pytest.approx(one.losses, rel=1e-6)
    a = ck.load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pt")
    b = ck.load_checkpoint(tmp_path / "one" / "checkpoint_last.pt")
    assert a["train"]["data_position"]["world_size"] == 2 and len(a["train"]["rng"]) == 2
    for k in a["model"]:
        assert torch.allclose(a["model"][k], b["model"][k], atol=1e-5, rtol=0), k


def _poison(monkeypatch, bad_calls):
    """Make the loss NaN on the given (0-based) training loss calls."""
    real = S.fused_label_smoothed_cross_entropy
    calls = {"n": 0}

    def fake(hidden, *args, **kwargs):
        loss, nll, n = real(hidden, *args, **kwargs)
        i = calls["n"]
        calls["n"] += 1
        if hidden.requires_grad and i in bad_calls:
            loss = loss * float("nan")
        return loss, nll, n

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", fake)


def test_nan_update_is_skipped_and_repeated_nans_stop(data_dir, tmp_path, monkeypatch):
    _poison(monkeypatch, {2})
    res = T.train(config(data_dir, tmp_path / "n", max_update=5, no_validate=True))
    assert res.reason == "max_update" and res.update == 5 and res.nan_skips == 1
    skips = [r for r in read_log(tmp_path / "n" / "train_log.jsonl") if r["type"] == "skip"]
    assert [(s["reason"], s["update"]) for s in skips] == [("nan", 2)]

    # all NaN from the 4th call on: stops after --max-nan-skips in a row; checkpoint_last stays at update 3
    _poison(monkeypatch, set(range(3, 100)))
    T.train(config(data_dir, tmp_path / "m", max_update=3, no_validate=True))
    before = (tmp_path / "m" / "checkpoint_last.pt").read_bytes()
    with pytest.raises(UserError, match="3 updates in a row had a NaN"):
        T.train(config(data_dir, tmp_path / "m", max_update=10, no_validate=True, max_nan_skips=3))
    assert (tmp_path / "m" / "checkpoint_last.pt").read_bytes() == before
    assert ck.load_checkpoint(tmp_path / "m" / "checkpoint_last.pt")["update"] == 3


def test_out_of_memory_batch_is_skipped(data_dir, tmp_path, monkeypatch):
    from nmtkit.models.transformer import Transformer

    real = Transformer.forward
    calls = {"n": 0}

    def forward(self, *a, **k):
        calls["n"] += 1
        if self.training and calls["n"] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return real(self, *a, **k)

    monkeypatch.setattr(Transformer, "forward", forward)
    res = T.train(config(data_dir, tmp_path / "o", max_update=3, no_validate=True))
    assert res.update == 3 and res.oom_skips == 1
    skip = [r for r in read_log(tmp_path / "o" / "train_log.jsonl") if r["type"] == "skip"]
    assert skip[0]["reason"] == "oom" and "x" in skip[0]["batches"]


def test_out_of_memory_on_every_batch_stops_with_one_line(data_dir, tmp_path, monkeypatch):
    """One process skips a batch that runs out of memory; when no batch of an epoch fits, the run
    stops (it would otherwise begin epoch after epoch) with one line, checkpoint_last.pt untouched."""
    from nmtkit.models.transformer import Transformer

    def forward(self, *a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 90.00 GiB (simulated)")

    monkeypatch.setattr(Transformer, "forward", forward)
    with pytest.raises(UserError, match=r"^out of memory on every batch of epoch 1 \((\d+) skipped, no update made\); "
                                        r"lower --max-tokens \(checkpoint_last.pt was left as it was\)$"):
        T.train(config(data_dir, tmp_path / "o", max_update=3, no_validate=True))
    end = [r for r in read_log(tmp_path / "o" / "train_log.jsonl") if r["type"] == "end"]
    assert end[-1]["reason"] == "failed" and not (tmp_path / "o" / "checkpoint_last.pt").exists()


def test_sigterm_saves_and_resume_finishes(data_dir, tmp_path, monkeypatch):
    real_step = T.Trainer._train_step

    def step(self, batches):
        out = real_step(self, batches)
        if self.state.update == 2 and not getattr(self, "_sent", False):
            self._sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(T.Trainer, "_train_step", step)
    res = T.train(config(data_dir, tmp_path / "s", max_update=6, no_validate=True))
    assert res.reason == "signal" and res.update == 2 and res.interrupted_by == signal.SIGTERM
    assert ck.load_checkpoint(tmp_path / "s" / "checkpoint_last.pt")["update"] == 2
    assert signal.getsignal(signal.SIGTERM) is not None  # handler restored
    res = T.train(config(data_dir, tmp_path / "s", max_update=6, no_validate=True))
    assert res.reason == "max_update" and res.update == 6


def test_patience_and_best_checkpoint(data_dir, tmp_path, monkeypatch):
    from nmtkit.training.validation import ValidResult, Validator

    values = iter([5.0, 4.0, 4.5, 4.2, 3.0])

    def loss(self, *a, **k):
        v = next(values)
        return ValidResult(v, v, 2**v, 100)

    monkeypatch.setattr(Validator, "loss", loss)
    res = T.train(config(data_dir, tmp_path / "p", validate_interval_updates=1, patience=2, max_update=50))
    assert res.reason == "patience" and res.update == 4 and res.best == 4.0
    assert ck.load_checkpoint(tmp_path / "p" / "checkpoint_best.pt")["update"] == 2
    valid = [r for r in read_log(tmp_path / "p" / "train_log.jsonl") if r["type"] == "valid"]
    assert [r["bad_validations"] for r in valid] == [0, 0, 1, 2]


def test_target_bleu_stops_at_the_first_validation_that_reaches_it(data_dir, tmp_path, monkeypatch, run_cli):
    """--target-bleu: training stops right after the validation whose BLEU reaches the target
    (here the third: 10, 20, 30 against 25), saves that update's checkpoint and says why; a
    validation below it does not stop it. An epoch end's validation stops it too."""
    from nmtkit.training.validation import Validator

    scores = iter([10.0, 20.0, 30.0, 40.0])
    monkeypatch.setattr(Validator, "bleu", lambda self, *a, **k: next(scores))
    r = run_cli("train", data_dir, "--arch", "transformer_tiny", "--save-dir", tmp_path / "t", "--max-update", "50",
                "--max-tokens", "256", "--threads", "1", "--no-progress-bar", "--eval-bleu", "--target-bleu", "25",
                "--validate-interval-updates", "2")
    assert r.code == 0, r
    assert "validation BLEU reached --target-bleu 25: update 6" in r.out
    log = read_log(tmp_path / "t" / "train_log.jsonl")
    assert [(x["update"], x["bleu"]) for x in log if x["type"] == "valid"] == [(2, 10.0), (4, 20.0), (6, 30.0)]
    assert log[-1]["type"] == "end" and log[-1]["reason"] == "target_bleu" and log[-1]["update"] == 6
    assert ck.load_checkpoint(tmp_path / "t" / "checkpoint_last.pt")["update"] == 6

    # validated at epoch ends only: the first epoch's end reaches it
    scores = iter([30.0])
    res = T.train(config(data_dir, tmp_path / "e", eval_bleu=True, target_bleu=25.0, max_update=500))
    log = read_log(tmp_path / "e" / "train_log.jsonl")
    [valid] = [x for x in log if x["type"] == "valid"]
    assert res.reason == "target_bleu" and res.update == valid["update"] and valid["epoch"] == 1
    assert ck.load_checkpoint(tmp_path / "e" / "checkpoint_last.pt")["update"] == valid["update"]


def test_clear_errors(data_dir, tmp_path):
    with pytest.raises(UserError, match="data directory not found"):
        T.train(config(tmp_path / "nowhere", tmp_path / "x"))
    # a checkpoint of another architecture in --save-dir
    T.train(config(data_dir, tmp_path / "arch", max_update=1, no_validate=True))
    with pytest.raises(UserError, match="differs from this run.*d_model: 64 != 32"):
        T.train(config(data_dir, tmp_path / "arch", max_update=2, arch_overrides={"d_model": 32}))
    # a corrupt shard (same size, flipped bytes): the checksum names it
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    shard = bad / "train.en.000.bin"
    data = bytearray(shard.read_bytes())
    data[:4] = bytes(255 - b for b in data[:4])
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match="train.en.000.bin: checksum mismatch"):
        T.train(config(bad, tmp_path / "y"))
    # the same checkpoint, but another dictionary
    shutil.rmtree(bad)
    shutil.copytree(data_dir, bad)
    d = bad / "dict.en.txt"
    d.write_text(d.read_text().replace("W1 ", "W1x ", 1))
    man = json.loads((bad / "manifest.json").read_text())
    man["files"]["dict.en.txt"] = ck_sha(d)
    (bad / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(UserError, match="another tgt dictionary"):
        T.train(config(bad, tmp_path / "arch", max_update=2))
    with pytest.raises(UserError, match="--update-freq must be > 0"):
        T.train(config(data_dir, tmp_path / "z", update_freq=0))
    # a save dir another training holds
    lock = T._SaveDirLock(tmp_path / "busy")
    try:
        with pytest.raises(UserError, match="is in use by another nmtkit train \\(pid"):
            T.train(config(data_dir, tmp_path / "busy", max_update=1))
    finally:
        lock.release()
    assert T.train(config(data_dir, tmp_path / "busy", max_update=1, no_validate=True)).update == 1


def test_a_validation_split_where_no_pair_fits_is_refused(tmp_path):
    """Every validation pair longer than the model's positions: its loss would read 0 bits (no
    tokens), the best there can be; the run is refused in one line before any update instead."""
    from nmtkit.data.preprocess import PreprocessConfig, preprocess

    for split, n, words in (("train", 40, 3), ("valid", 5, 30)):
        src = [" ".join(f"w{(i + k) % 7}" for k in range(words)) for i in range(n)]
        (tmp_path / f"{split}.de").write_text("\n".join(src) + "\n")
        (tmp_path / f"{split}.en").write_text("\n".join(x.upper() for x in src) + "\n")
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(tmp_path / "train"),
                                validpref=[str(tmp_path / "valid")], destdir=str(tmp_path / "bin"), bpe="none",
                                joined_dictionary=True))
    short = {"max_source_positions": 12, "max_target_positions": 12}
    with pytest.raises(UserError, match=r"^no validation pair fits the model \(valid: all 5 skipped: 5 with the source "
                       r"over the encoder limit\); check --max-tokens.*or train with --no-validate$"):
        T.train(config(tmp_path / "bin", tmp_path / "run", max_update=2, arch_overrides=short))
    assert not (tmp_path / "run" / "checkpoint_last.pt").exists()
    assert T.train(config(tmp_path / "bin", tmp_path / "run", max_update=2, arch_overrides=short,
                          no_validate=True)).update == 2


def ck_sha(path):
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_cli_train_and_flag_errors(data_dir, tmp_path, run_cli):
    r = run_cli("train", data_dir, "--arch", "transformer_tiny", "--save-dir", tmp_path / "c", "--max-update", "2",
                "--max-tokens", "256", "--threads", "1", "--no-progress-bar", "--no-validate", "--d-ff", "64",
                "--warmup-updates", "7")
    assert r.code == 0, r
    assert "reached --max-update: update 2" in r.out
    state = ck.load_checkpoint(tmp_path / "c" / "checkpoint_last.pt")
    assert state["arch_config"]["d_ff"] == 64 and state["arch_config"]["warmup_steps"] == 7
    assert state["train"]["scheduler"]["warmup"] == 7
    for args, msg in [
        (["--heads", "3"], "--d-model 64 is not divisible by --heads 3"),
        (["--precision", "fp8"], "--precision must be one of"),
        (["--max-time", "soon"], "--max-time expects a duration"),
        (["--adam-betas", "0.9"], "--adam-betas expects two numbers"),
        (["--best-checkpoint-metric", "bleu"], "needs --eval-bleu"),
        (["--target-bleu", "30"], "--target-bleu needs --eval-bleu (the BLEU it is compared with)"),
        (["--eval-bleu-decoding", "marian"], "--eval-bleu-decoding must be one of paper, fairseq, got 'marian'"),
        (["--target-bleu", "101", "--eval-bleu"], "--target-bleu must be a BLEU score from 0 to 100"),
        (["--target-bleu", "nan", "--eval-bleu"], "--target-bleu must be a finite number, got nan"),
    ]:
        r = run_cli("train", data_dir, "--arch", "transformer_tiny", "--save-dir", tmp_path / "e", *args)
        assert r.code == 2 and msg in r.err, (args, r)
    assert not (tmp_path / "e").exists()  # refused before any work


def test_prefetch_thread_gives_the_same_updates(data_dir, tmp_path):
    a = T.train(config(data_dir, tmp_path / "p0", max_update=4, no_validate=True, prefetch=False))
    b = T.train(config(data_dir, tmp_path / "p1", max_update=4, no_validate=True, prefetch=True))
    assert a.losses == b.losses


def test_time_limits_and_timed_checkpoints(data_dir, tmp_path):
    res = T.train(config(data_dir, tmp_path / "t", max_update=5, no_validate=True, max_time=1e-9))
    assert res.reason == "max_time" and res.update == 1
    assert ck.load_checkpoint(tmp_path / "t" / "checkpoint_last.pt")["update"] == 1
    T.train(config(data_dir, tmp_path / "m", max_update=3, no_validate=True, save_interval_minutes=1e-9,
                   keep_last_updates=2))
    assert sorted(p.name for p in (tmp_path / "m").glob("checkpoint_*_*.pt")) == [
        "checkpoint_1_2.pt", "checkpoint_1_3.pt"]


def test_fp16_overflow_is_skipped_by_the_loss_scaler(data_dir, tmp_path, monkeypatch):
    real = S.fused_label_smoothed_cross_entropy
    calls = {"n": 0}

    def fake(*args, **kwargs):
        loss, nll, n = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:
            loss = loss * float("inf")  # as an fp16 overflow would make it
        return loss, nll, n

    monkeypatch.setattr(S, "fused_label_smoothed_cross_entropy", fake)
    res = T.train(config(data_dir, tmp_path / "h", max_update=2, no_validate=True, precision="fp16", max_tokens=64))
    assert res.update == 2 and res.nan_skips == 0
    skips = [r for r in read_log(tmp_path / "h" / "train_log.jsonl") if r["type"] == "skip"]
    assert [s["reason"] for s in skips] == ["fp16_overflow"]
    scaler = ck.load_checkpoint(tmp_path / "h" / "checkpoint_last.pt")["train"]["scaler"]
    assert scaler["scale"] == 2.0**15  # 2^16 halved once


def test_validation_bleu_plumbing(monkeypatch):
    """Hypotheses come back in corpus order and are scored against the references with sacreBLEU."""
    import numpy as np

    from nmtkit.search import beam as S
    from nmtkit.training import distributed as D
    from nmtkit.training.validation import Validator

    words = {4: "a", 5: "cat", 6: "sat", 7: "on", 8: "the", 9: "mat", 10: "dog"}
    tgt = [[4, 5, 6, 7, 8, 9], [8, 10, 6], [4, 10, 7, 8, 9, 6]]

    class DS:
        def __init__(self, seqs):
            self.seqs = [np.array(s) for s in seqs]
            self.sizes = np.array([len(s) for s in seqs])

        def __len__(self):
            return len(self.seqs)

        def __getitem__(self, i):
            return self.seqs[i]

    src_ds, tgt_ds = DS([[5, 5], [6], [7, 7, 7]]), DS(tgt)
    v = Validator(src_ds, tgt_ds, max_tokens=100, max_sentences=None, max_source_positions=64,
                  max_target_positions=64, pad_multiple=1, info=D.DistInfo())

    configs = []

    def perfect(model, src_tokens, cfg, sentence_ids=None):
        configs.append(cfg)
        # the source length identifies the pair in this toy set: 2 -> 0, 1 -> 1, 3 -> 2
        lengths = (src_tokens != 0).sum(1).tolist()
        return [[S.Hypothesis(tokens=tgt[{3: 0, 2: 1, 4: 2}[n]], score=0.0, logprob=0.0)] for n in lengths]

    monkeypatch.setattr(S, "search", perfect)
    to_text = lambda ids: " ".join(words[i] for i in ids)
    model = torch.nn.Linear(1, 1)
    import contextlib

    kw = dict(beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=5, max_target_positions=64)
    assert v.bleu(model, torch.device("cpu"), contextlib.nullcontext, to_text, **kw) == pytest.approx(100.0)
    tgt_copy = [list(t) for t in tgt]
    tgt[1] = [8, 5, 7]  # one hypothesis now differs from its reference
    score = v.bleu(model, torch.device("cpu"), contextlib.nullcontext, to_text, **kw)
    import sacrebleu

    hyps = [to_text(tgt[0]), to_text(tgt[1]), to_text(tgt[2])]
    refs = [to_text(t) for t in tgt_copy]
    assert score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    # the decoding rules: the paper's by default, fairseq's on request (--eval-bleu-decoding)
    assert {(c.lenpen_form, c.early_stop) for c in configs} == {("gnmt", "bound")}
    v.bleu(model, torch.device("cpu"), contextlib.nullcontext, to_text, decoding="fairseq", **kw)
    assert (configs[-1].lenpen_form, configs[-1].early_stop, configs[-1].beam) == ("fairseq", "beam", 1)


def test_stop_reason_rules_and_their_order(tmp_path):
    """The one function holding the stopping rules: which reason wins when several hold."""
    from nmtkit.training.state import TrainState
    from nmtkit.training.stopping import LoopFlags, TrainingStopped, stop_reason

    cfg = config(tmp_path, tmp_path, max_update=10, max_epoch=2, patience=2, max_nan_skips=3)
    none, sig, late = LoopFlags(), LoopFlags(signal=True), LoopFlags(time_up=True)
    st = TrainState(update=10, epoch=2, bad_validations=2)
    assert stop_reason(cfg, st, none, "start") == "already_done"
    assert stop_reason(cfg, TrainState(update=3, epoch=3), none, "start") == "already_done"  # past --max-epoch
    assert stop_reason(cfg, TrainState(update=3, epoch=2), none, "start") is None
    # inside an epoch: patience only right after a validation, and before max_update
    assert stop_reason(cfg, st, none, "update", validated=True) == "patience"
    assert stop_reason(cfg, st, sig, "update") == "max_update"
    assert stop_reason(cfg, TrainState(update=3, bad_validations=2), sig, "update") == "signal"
    assert stop_reason(cfg, TrainState(update=3), late, "update") == "max_time"
    assert stop_reason(cfg, TrainState(update=3), none, "update") is None
    # --target-bleu: first, but only with a validation's BLEU at this moment, and only when set
    aim = config(tmp_path, tmp_path, max_update=10, max_epoch=2, patience=2, eval_bleu=True, target_bleu=30.0)
    assert stop_reason(aim, st, sig, "update", validated=True, bleu=30.0) == "target_bleu"
    assert stop_reason(aim, st, sig, "update", validated=True, bleu=29.99) == "patience"
    assert stop_reason(aim, TrainState(update=3), none, "update", validated=True, bleu=None) is None
    assert stop_reason(aim, st, sig, "epoch_end", finished_epoch=2, bleu=31.0) == "target_bleu"
    assert stop_reason(cfg, TrainState(update=3), none, "update", validated=True, bleu=99.0) is None
    # at an epoch end: max_update, max_epoch, patience, signal, max_time
    assert stop_reason(cfg, st, sig, "epoch_end", finished_epoch=2) == "max_update"
    assert stop_reason(cfg, TrainState(update=3, bad_validations=2), sig, "epoch_end", finished_epoch=2) == "max_epoch"
    assert stop_reason(cfg, TrainState(update=3, bad_validations=2), sig, "epoch_end", finished_epoch=1) == "patience"
    assert stop_reason(cfg, TrainState(update=3), late, "epoch_end", finished_epoch=1) == "max_time"
    assert stop_reason(cfg, TrainState(update=3), none, "epoch_end", finished_epoch=1) is None
    # after a NaN skip: --max-nan-skips in a row stop with an error
    assert stop_reason(cfg, TrainState(consecutive_nan=2), none, "step") is None
    with pytest.raises(TrainingStopped, match="3 updates in a row had a NaN/inf loss"):
        stop_reason(cfg, TrainState(update=7, consecutive_nan=3), none, "step")


def test_checkpoint_state_round_trip(data_dir, tmp_path):
    """checkpoint_state.build -> restore gives back the weights, optimizer, counters and position."""
    from nmtkit.training import checkpoint_state

    T.train(config(data_dir, tmp_path / "a", max_update=3, no_validate=True, ema_decay=0.5, update_freq=2))
    saved = ck.load_checkpoint(tmp_path / "a" / "checkpoint_last.pt")
    t = T.Trainer(config(data_dir, tmp_path / "a", max_update=3, no_validate=True, ema_decay=0.5, update_freq=2))
    t._build()  # restores from checkpoint_last.pt
    t._make_iterators()
    assert t.resumed and t.state.update == 3 and t.state.batch_offset == saved["train"]["data_position"]["batch_offset"]
    again = checkpoint_state.build(t.objs, t.state, t.identity, t.info)
    assert list(again) == list(saved) and list(again["train"]) == list(saved["train"])
    for k in saved["model"]:
        assert torch.equal(again["model"][k], saved["model"][k]) and torch.equal(again["ema"][k], saved["ema"][k])
    assert again["train"]["state"] == saved["train"]["state"]
    assert again["train"]["data_position"] == saved["train"]["data_position"]
    opt_a, opt_s = again["train"]["optimizer"]["state"], saved["train"]["optimizer"]["state"]
    assert all(torch.equal(opt_a[i][key], opt_s[i][key]) for i in opt_s for key in opt_s[i])


def test_reset_flags_with_nothing_to_resume_say_so_once(data_dir, tmp_path, run_cli):
    """--reset-* on a fresh run (or a fine-tuning start) has nothing to act on: one yellow line at
    start, and the run goes on; a resumed run does not get that line."""
    from nmtkit.training.start import find_start

    save = tmp_path / "fresh"
    r = run_cli("train", data_dir, "--arch", "transformer_tiny", "--save-dir", save, "--max-update", "1",
                "--max-tokens", "256", "--threads", "1", "--no-progress-bar", "--no-validate",
                "--reset-optimizer", "--reset-meters")
    assert r.code == 0, r
    line = (f"--reset-optimizer, --reset-meters: nothing to reset, {save} has no checkpoint (checkpoint_last.pt); "
            "this run starts from scratch")
    assert r.err.count("nothing to reset") == 1 and line in r.err.splitlines(), r.err
    resumed = find_start(config(data_dir, save, reset_optimizer=True), save)
    assert resumed.kind == "resume" and not any("nothing to reset" in n for n in resumed.notes)
    tuned = find_start(config(data_dir, tmp_path / "ft", finetune_from_model=str(save / "checkpoint_last.pt"),
                              reset_dataloader=True), tmp_path / "ft")
    note = (f"--reset-dataloader: nothing to reset, {tmp_path / 'ft'} has no checkpoint (checkpoint_last.pt); "
            f"fine-tuning from {save / 'checkpoint_last.pt'} starts with a fresh optimizer, schedule, data position "
            "and meters anyway")
    assert tuned.notes == [note]
    assert not find_start(config(data_dir, tmp_path / "plain"), tmp_path / "plain").notes
