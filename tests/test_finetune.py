"""Fine-tuning (--finetune-from-model), continued training with --reset-*, and TensorBoard curves.

The references: a fine-tuning run's first loss against the loaded model's loss computed here by
hand, sentence by sentence (log_softmax and the label-smoothing formula of nmtkit/training/loss.py);
counters, positions and Adam's step counts read from the checkpoints; TensorBoard event files read
back with tensorboard's own EventAccumulator and compared with the JSON log.
"""

from __future__ import annotations

import math
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch

from nmtkit import checkpoints as ck
from nmtkit.data.preprocess import PreprocessConfig, load_dictionaries, load_manifest, preprocess
from nmtkit.data.shards import load_split
from nmtkit.errors import UserError
from nmtkit.training import trainer as T
from nmtkit.training.config import TrainConfig
from nmtkit.training.report import read_log

from conftest import word_mapping_data_dir

N_WORDS = 24


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def config(data_dir, save_dir, **kw) -> TrainConfig:
    base = dict(data_dir=str(data_dir), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=256,
                lr_scheduler="inverse_sqrt", lr=3e-3, warmup_updates=5, log_interval=1, progress_bar=False,
                threads=1, no_epoch_checkpoints=True)
    base.update(kw)
    return TrainConfig(**base)


def word_text(root: Path, prefix: str, n: int, seed: int, src="de", tgt="en", words=N_WORDS) -> Path:
    """n pairs of the word-mapping task (wK -> WK) as raw text ROOT/PREFIX.{src,tgt}."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    s = [" ".join(f"w{rng.randrange(words)}" for _ in range(rng.randint(2, 10))) for _ in range(n)]
    sides = {src: s, tgt: [x.upper() for x in s]} if src == "de" else {tgt: s, src: [x.upper() for x in s]}
    for lang, lines in sides.items():
        (root / f"{prefix}.{lang}").write_text("".join(x + "\n" for x in lines))
    return root / prefix


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny model trained 30 updates (with an EMA) on the word-mapping task, and its data dir."""
    root = tmp_path_factory.mktemp("base")
    data = word_mapping_data_dir(root, 400, 24, N_WORDS, seed=0)
    T.train(config(data, root / "ckpt", max_update=30, lr=5e-3, no_validate=True, ema_decay=0.5))
    return data, root / "ckpt" / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def news(tmp_path_factory, base):
    """New text of the same task (other sentences), binarized with the base data dir's dictionary."""
    data, _ = base
    root = tmp_path_factory.mktemp("news")
    train, valid = word_text(root, "train", 40, seed=11), word_text(root, "valid", 12, seed=12)
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(train), validpref=[str(valid)],
                                destdir=str(root / "bin"), bpe="none", joined_dictionary=True, srcdict=str(data)))
    return root / "bin"


def loss_by_hand(model, data_dir: Path, eps: float) -> float:
    """Label-smoothed loss of `model` on the whole train split, bits per target token, one
    unpadded sentence at a time (independent of batching and of the training loss's kernel)."""
    src_ds, tgt_ds = load_split(data_dir, "train", "de"), load_split(data_dir, "train", "en")
    total, ntok = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(len(src_ds)):
            s, t = src_ds[i].tolist(), tgt_ds[i].tolist()
            logits = model(torch.tensor([s + [2]]), torch.tensor([[1] + t]))[0].double()  # (T, V)
            lp = torch.log_softmax(logits, dim=-1)
            gold = torch.tensor(t + [2])
            nll = -lp.gather(1, gold.unsqueeze(1)).squeeze(1)  # (T,)
            v = lp.size(1)
            smooth = -lp.sum(1)
            loss = (1 - eps - eps / (v - 1)) * nll + eps / (v - 1) * smooth
            total += float(loss.sum())
            ntok += len(gold)
    return total / ntok / math.log(2)


def loaded(ckpt: Path, data_dir: Path, ema: bool = False):
    from nmtkit.models.loading import load_models

    src_dict, tgt_dict = load_dictionaries(data_dir)
    return load_models(ckpt, src_dict, tgt_dict, ema=ema).models[0]


# ---------------------------------------------------------------------------------------------
# fine-tuning


def whole_set() -> dict:
    """One batch holding the whole (40-pair) training split: the first update sees every pair."""
    return dict(max_tokens=100000, batch_size=1000, arch_overrides={"dropout": 0.0}, no_validate=True, lr=1e-3)


@pytest.mark.parametrize("ema", [False, True])
def test_first_update_loss_is_the_loaded_models_loss(base, news, tmp_path, ema):
    data, ckpt = base
    res = T.train(config(news, tmp_path / "ft", finetune_from_model=str(ckpt), ema=ema, max_update=2, arch=None,
                         **whole_set()))
    want = loss_by_hand(loaded(ckpt, news, ema=ema), news, eps=0.1)
    assert res.losses[0] == pytest.approx(want, rel=1e-5)
    other = loss_by_hand(loaded(ckpt, news, ema=not ema), news, eps=0.1)
    assert abs(other - want) > 1e-3  # raw and EMA weights really differ: the test tells them apart
    fresh = T.train(config(news, tmp_path / "fresh", max_update=1, **whole_set()))
    assert fresh.losses[0] > res.losses[0] + 1.0  # a fresh model is far worse: the weights came from CKPT


def test_finetuning_is_a_new_run_and_records_where_it_came_from(base, news, tmp_path):
    data, ckpt = base
    src_state = ck.load_checkpoint(ckpt)
    res = T.train(config(news, tmp_path / "ft", finetune_from_model=str(ckpt), max_update=3, arch=None,
                         arch_overrides={"dropout": 0.3, "label_smoothing": 0.2}, validate_interval_updates=2,
                         save_interval_updates=2, max_tokens=64))
    assert res.update == 3 and res.epoch == 1
    state = ck.load_checkpoint(tmp_path / "ft" / "checkpoint_last.pt")
    assert state["update"] == 3 and state["epoch"] == 1
    assert state["arch"] == "transformer_tiny"  # the checkpoint's architecture, --arch not given
    cfg = {**src_state["arch_config"], "dropout": 0.3, "label_smoothing": 0.2}
    assert state["arch_config"] == cfg  # the overrides are recorded
    assert state["train_args"]["finetune_from_model"] == str(ckpt)
    assert state["data_manifest_id"] != src_state["data_manifest_id"]
    assert state["dictionaries"] == src_state["dictionaries"]
    # a fresh Adam (3 steps, not 33), a schedule from update 1, a fresh data position and best
    assert {int(s["step"]) for s in state["train"]["optimizer"]["state"].values()} == {3}
    assert state["train"]["scheduler"]["start"] == 0
    assert state["train"]["state"]["best"] == res.best
    log = read_log(tmp_path / "ft" / "train_log.jsonl")
    start = log[0]
    assert (start["type"], start["update"], start["epoch"], start["resumed"], start["start"]) == ("start", 0, 1, False, "finetune")
    assert start["from"] == str(ckpt) and start["from_update"] == 30 and start["weights"] == "raw"
    assert start["arch_changes"] == {"dropout": [0.1, 0.3], "label_smoothing": [0.1, 0.2]}
    train = [r for r in log if r["type"] == "train"]
    assert [r["update"] for r in train] == [1, 2, 3]
    assert train[0]["lr"] == pytest.approx(3e-3 / 5)  # inverse_sqrt warmup: update 1 of 5
    assert sorted(p.name for p in (tmp_path / "ft").glob("checkpoint_*_*.pt")) == ["checkpoint_1_2.pt"]


def test_rerunning_the_command_resumes_the_finetuning_and_says_so(base, news, tmp_path, run_cli):
    data, ckpt = base
    args = ["train", news, "--save-dir", tmp_path / "ft", "--finetune-from-model", ckpt, "--max-tokens", "256",
            "--threads", "1", "--no-progress-bar", "--log-interval", "1", "--no-validate", "--lr-scheduler",
            "inverse_sqrt", "--lr", "1e-3", "--warmup-updates", "3", "--dropout", "0"]
    r = run_cli(*args, "--max-update", "2")
    assert r.code == 0, r
    assert f"fine-tuning from {ckpt} (raw weights of its update 30) as a new run" in r.err
    assert "changed from the checkpoint: dropout 0.1 -> 0.0" in r.err
    r = run_cli(*args, "--max-update", "4")
    assert r.code == 0, r
    assert (f"--finetune-from-model {ckpt} is not used: {tmp_path / 'ft'} already holds checkpoint_last.pt, "
            "whose run resumes") in r.err
    assert f"resuming from {tmp_path / 'ft' / 'checkpoint_last.pt'} at update 2" in r.err
    assert "reached --max-update: update 4" in r.out
    updates = [x["update"] for x in read_log(tmp_path / "ft" / "train_log.jsonl") if x["type"] == "train"]
    assert updates == [1, 2, 3, 4]


def test_an_inference_checkpoint_can_be_fine_tuned(base, news, tmp_path):
    data, ckpt = base
    inference = tmp_path / "model.pt"
    ck.save_checkpoint(ck.inference_state(ck.load_checkpoint(ckpt)), inference)
    res = T.train(config(news, tmp_path / "ft", finetune_from_model=str(inference), max_update=1, arch=None,
                         **whole_set()))
    assert res.losses[0] == pytest.approx(loss_by_hand(loaded(ckpt, news), news, eps=0.1), rel=1e-5)


def test_finetuning_refusals(base, news, tmp_path):
    data, ckpt = base

    def refused(message, data_dir=news, ckpt=ckpt, **kw):
        kw = {"arch": None, **kw}
        with pytest.raises(UserError) as e:
            T.train(config(data_dir, tmp_path / "x", finetune_from_model=str(ckpt), max_update=1, **kw))
        assert message in str(e.value)
        assert not (tmp_path / "x" / "checkpoint_last.pt").exists()

    refused("--finetune-from-model: checkpoint not found: nowhere.pt", ckpt="nowhere.pt")
    refused("--finetune-from-model " + str(ckpt) + ": fine-tuning keeps the model's shape, but this run changes "
            "--d-model 64 -> 32; only --dropout, --attention-dropout, --activation-dropout, --label-smoothing, "
            "--warmup-updates may differ", arch_overrides={"d_model": 32})
    refused("this run changes --d-ff 128 -> 2048", arch="transformer_base", arch_overrides={
        "d_model": 64, "heads": 4, "encoder_layers": 2, "decoder_layers": 2})
    # an EMA that the checkpoint does not have
    no_ema = tmp_path / "no_ema.pt"
    ck.save_checkpoint({k: v for k, v in ck.load_checkpoint(ckpt).items() if k != "ema"}, no_ema)
    refused(f"--ema: {no_ema} holds no EMA weights (trained without --ema-decay); leave out --ema", ckpt=no_ema, ema=True)
    with pytest.raises(UserError, match="--ema applies with --finetune-from-model"):
        T.train(config(news, tmp_path / "y", ema=True))
    # a data dir with its own dictionary: which one differs, and what to do
    (tmp_path / "own").mkdir()
    own = word_mapping_data_dir(tmp_path / "own", 40, 5, 30, seed=5)
    refused(f"--finetune-from-model {ckpt}: {own / 'dict.de.txt'} is not the model's source dictionary (sha256 ",
            data_dir=own)
    refused(f"binarize the new text with the model's dictionaries and subword model: nmtkit preprocess ... "
            f"--srcdict {data} --tgtdict {data}", data_dir=own)
    # the reverse direction with the same (joined) dictionary: the language pair tells them apart
    rev = tmp_path / "rev"
    train = word_text(rev, "train", 20, seed=13, src="en", tgt="de")
    preprocess(PreprocessConfig(source_lang="en", target_lang="de", trainpref=str(train), destdir=str(rev / "bin"),
                                bpe="none", joined_dictionary=True, srcdict=str(data)))
    refused(f"--finetune-from-model {ckpt} translates de->en, but {rev / 'bin'} is en->de", data_dir=rev / "bin",
            no_validate=True)


# ---------------------------------------------------------------------------------------------
# continued training: --reset-*


@pytest.fixture
def run6(base, tmp_path):
    """A run stopped mid-epoch at update 6 (400 pairs, max_tokens 256: more than 10 batches per epoch)."""
    data, _ = base
    T.train(config(data, tmp_path / "run", max_update=6, no_validate=True))
    return data, tmp_path / "run"


def last(save_dir: Path) -> dict:
    return ck.load_checkpoint(save_dir / "checkpoint_last.pt")


def adam_steps(state: dict) -> set[int]:
    return {int(s["step"]) for s in state["train"]["optimizer"]["state"].values()}


def test_resume_without_resets_keeps_everything(run6):
    data, run = run6
    T.train(config(data, run, max_update=8, no_validate=True, adam_eps=1e-6))
    s = last(run)
    assert adam_steps(s) == {8} and s["train"]["scheduler"]["start"] == 0
    assert s["train"]["data_position"]["epoch"] == 1 and s["train"]["data_position"]["batch_offset"] == 8
    # this run's Adam settings replace the saved ones (fairseq's optimizer overrides)
    assert {g["eps"] for g in s["train"]["optimizer"]["param_groups"]} == {1e-6}
    lrs = [r["lr"] for r in read_log(run / "train_log.jsonl") if r["type"] == "train"]
    assert lrs[6] == pytest.approx(3e-3 * math.sqrt(5 / 7))  # update 7 on the schedule's own curve


def test_resume_takes_the_checkpoints_architecture_and_allows_non_shape_changes(run6):
    data, run = run6
    T.train(config(data, run, max_update=7, no_validate=True, arch=None, arch_overrides={"dropout": 0.2}))
    s = last(run)
    assert s["arch"] == "transformer_tiny" and s["arch_config"]["dropout"] == 0.2 and s["update"] == 7
    start = [r for r in read_log(run / "train_log.jsonl") if r["type"] == "start"][-1]
    assert start["start"] == "resume" and start["arch_changes"] == {"dropout": [0.1, 0.2]}
    with pytest.raises(UserError, match=r"holds a model of arch 'transformer_tiny' that differs from this run's "
                                         r"'transformer_tiny' \(heads: 4 != 2\)"):
        T.train(config(data, run, max_update=8, arch=None, arch_overrides={"heads": 2}))


@pytest.mark.parametrize("reset,steps", [("reset_optimizer", {2}), ("reset_lr_scheduler", {8})])
def test_reset_optimizer_and_lr_scheduler(run6, reset, steps):
    data, run = run6
    T.train(config(data, run, max_update=8, no_validate=True, **{reset: True}))
    s = last(run)
    assert adam_steps(s) == steps  # a fresh Adam took 2 steps; a kept one has 6 + 2
    assert s["train"]["scheduler"]["start"] == 6 and s["update"] == 8  # the counter itself goes on
    log = read_log(run / "train_log.jsonl")
    lrs = [r["lr"] for r in log if r["type"] == "train"]
    assert lrs[6:] == pytest.approx([3e-3 / 5, 3e-3 * 2 / 5])  # warmup again: updates 1 and 2 of 5
    assert [r for r in log if r["type"] == "start"][-1]["resets"] == [reset]
    # the same command again continues that run: the reset is not applied a second time
    T.train(config(data, run, max_update=9, no_validate=True, **{reset: True}))
    s = last(run)
    assert s["train"]["scheduler"]["start"] == 6
    assert adam_steps(s) == {x + 1 for x in steps}
    assert [r for r in read_log(run / "train_log.jsonl") if r["type"] == "start"][-1]["resets"] == []


def test_reset_dataloader_starts_a_new_epoch(run6):
    data, run = run6
    pos = last(run)["train"]["data_position"]
    assert (pos["epoch"], pos["batch_offset"]) == (1, 6)
    T.train(config(data, run, max_update=7, no_validate=True, reset_dataloader=True))
    pos = last(run)["train"]["data_position"]
    assert (pos["epoch"], pos["batch_offset"]) == (2, 1)
    assert adam_steps(last(run)) == {7}  # nothing else was reset


def test_reset_meters_zeroes_counters_time_and_early_stopping(run6, monkeypatch):
    from nmtkit.training.validation import ValidResult, Validator

    data, run = run6
    values = iter([4.0, 5.0, 5.0])

    def loss(self, *a, **k):
        v = next(values)
        return ValidResult(v, v, 2**v, 100)

    monkeypatch.setattr(Validator, "loss", loss)
    T.train(config(data, run, max_update=7, validate_interval_updates=1))
    st = last(run)["train"]["state"]
    assert (st["best"], st["bad_validations"]) == (4.0, 0) and st["elapsed_s"] > 0
    res = T.train(config(data, run, max_update=8, validate_interval_updates=1))  # 5.0: not better than 4.0
    assert res.best == 4.0 and last(run)["train"]["state"]["bad_validations"] == 1
    res = T.train(config(data, run, max_update=9, validate_interval_updates=1, reset_meters=True))
    st = last(run)["train"]["state"]
    assert res.best == 5.0 and (st["best"], st["bad_validations"]) == (5.0, 0)  # a new best after the reset
    assert st["elapsed_s"] < 60 and adam_steps(last(run)) == {9}


def test_changed_batches_or_data_need_reset_dataloader(run6, news, tmp_path):
    data, run = run6
    before = (run / "checkpoint_last.pt").read_bytes()
    for kw, message in [
        (dict(max_tokens=300), "--max-tokens 300 differs from the 256 that"),
        (dict(batch_size=20), "--batch-size 20 differs from the unset that"),
        (dict(seed=2), "--seed 2 differs from the 1 that"),
    ]:
        with pytest.raises(UserError) as e:
            T.train(config(data, run, max_update=7, no_validate=True, **kw))
        assert message in str(e.value) and "stopped at epoch 1, batch 6 of the old batches: add --reset-dataloader" in str(e.value)
    with pytest.raises(UserError) as e:
        T.train(config(news, run, max_update=7, no_validate=True))
    assert str(e.value).startswith(f"{news} is not the data directory {run / 'checkpoint_last.pt'} was trained on ({data}")
    assert "add --reset-dataloader to continue on" in str(e.value)
    assert (run / "checkpoint_last.pt").read_bytes() == before  # refused before anything was written
    T.train(config(news, run, max_update=7, no_validate=True, max_tokens=300, reset_dataloader=True))
    s = last(run)
    assert s["update"] == 7 and s["data_manifest_id"] == T.manifest_id(load_manifest(news))
    assert (s["train"]["data_position"]["epoch"], s["train"]["data_position"]["batch_offset"]) == (2, 1)
    T.train(config(news, run, max_update=8, no_validate=True, max_tokens=300, reset_dataloader=True))  # a re-run
    assert [r for r in read_log(run / "train_log.jsonl") if r["type"] == "start"][-1]["resets"] == []  # not again


def test_cli_reset_flags_and_messages(run6, run_cli):
    data, run = run6
    args = ["train", data, "--save-dir", run, "--arch", "transformer_tiny", "--max-tokens", "256", "--threads", "1",
            "--no-progress-bar", "--no-validate", "--lr-scheduler", "inverse_sqrt", "--lr", "3e-3",
            "--warmup-updates", "5", "--no-epoch-checkpoints"]
    r = run_cli(*args, "--max-update", "7", "--max-tokens", "300")
    assert r.code == 2 and "add --reset-dataloader" in r.err and "Traceback" not in r.err
    r = run_cli(*args, "--max-update", "7", "--reset-optimizer", "--reset-dataloader", "--reset-meters")
    assert r.code == 0, r
    for line in ["--reset-optimizer: a fresh Adam (and loss scale); the learning-rate schedule starts again",
                 "--reset-dataloader: a new epoch from its first batch", "--reset-meters: skip counters"]:
        assert line in r.err
    r = run_cli(*args, "--max-update", "8", "--reset-optimizer")
    assert r.code == 0 and "--reset-optimizer: not applied again" in r.err


# ---------------------------------------------------------------------------------------------
# TensorBoard


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def test_tensorboard_scalars_match_the_json_log(base, tmp_path):
    data, _ = base
    T.train(config(data, tmp_path / "run", max_update=4, validate_interval_updates=2, eval_bleu=True,
                   tensorboard_logdir=str(tmp_path / "tb")))
    got = scalars(tmp_path / "tb")
    assert set(got) == {"train/loss", "train/nll_loss", "train/ppl", "train/lr", "train/gnorm", "train/tgt_tok_per_s",
                        "valid/loss", "valid/nll_loss", "valid/ppl", "valid/bleu", "valid/best"}
    log = read_log(tmp_path / "run" / "train_log.jsonl")
    train = [r for r in log if r["type"] == "train"]
    valid = [r for r in log if r["type"] == "valid"]
    for key in ("loss", "nll_loss", "ppl", "lr", "gnorm", "tgt_tok_per_s"):
        assert [s for s, _ in got[f"train/{key}"]] == [1, 2, 3, 4]
        assert [v for _, v in got[f"train/{key}"]] == pytest.approx([r[key] for r in train], rel=1e-6)
    assert [s for s, _ in got["valid/loss"]] == [r["update"] for r in valid] == [2, 4]
    assert [v for _, v in got["valid/bleu"]] == pytest.approx([r["bleu"] for r in valid], rel=1e-6, abs=1e-6)


def test_tensorboard_curves_continue_after_a_crash(base, tmp_path):
    """A run writes updates 1..6 but its last checkpoint is at 4 (it crashed after update 6); the
    resumed run redoes 5..6 and goes on to 8: each step appears once, with the resumed values."""
    data, _ = base
    run, tb = tmp_path / "run", tmp_path / "tb"
    T.train(config(data, run, max_update=6, no_validate=True, save_interval_updates=4, tensorboard_logdir=str(tb)))
    shutil.copyfile(run / "checkpoint_1_4.pt", run / "checkpoint_last.pt")
    T.train(config(data, run, max_update=8, no_validate=True, tensorboard_logdir=str(tb)))
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2
    got = scalars(tb)["train/loss"]
    assert [s for s, _ in got] == list(range(1, 9))
    redone = [r["loss"] for r in read_log(run / "train_log.jsonl") if r["type"] == "train"][4:]
    assert [v for _, v in got][4:] == pytest.approx(redone, rel=1e-6)


def test_missing_tensorboard_is_one_line(base, tmp_path, monkeypatch, run_cli):
    data, _ = base
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(UserError) as e:
        T.train(config(data, tmp_path / "run", max_update=1, tensorboard_logdir=str(tmp_path / "tb")))
    assert str(e.value) == "--tensorboard-logdir needs the tensorboard package: pip install -e '.[tensorboard]' in the nmtkit checkout"
    r = run_cli("train", data, "--save-dir", tmp_path / "run", "--tensorboard-logdir", tmp_path / "tb")
    assert r.code == 2 and "pip install -e '.[tensorboard]' in the nmtkit checkout" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()
