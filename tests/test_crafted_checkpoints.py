"""Crafted but loadable checkpoints: one clear line (exit 2), refused before any model is built.

A checkpoint passes torch's weights-only loader when it holds only tensors, numbers, strings and
containers; these tests write such files with the wrong layout (a list for `model`, a string
config), a config that does not fit the stored tensors (a huge d_ff next to small matrices), and
tensors that claim more elements than they store, and check what `generate`, `average-checkpoints`,
the loader and a resumed `train` say about them.
"""

from __future__ import annotations

import re

import pytest
import torch

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError
from nmtkit.models import loading

from conftest import word_mapping_data_dir

COMMON = ("--gen-subset", "valid", "--max-len-b", "4", "--quiet", "--threads", "1", "--beam", "1")
TORCH_ADVICE = re.compile(r"weights_only|Re-running|trust|add_safe_globals|\x1b\[", re.I)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(data dir, a real tiny checkpoint of its dictionaries, its state)."""
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer

    root = tmp_path_factory.mktemp("crafted")
    data = word_mapping_data_dir(root, 60, 6, 12, seed=1)
    src, tgt = load_dictionaries(data)
    torch.manual_seed(0)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    state = {"arch": "test", "arch_config": cfg.to_dict(),
             "model": Transformer(cfg, len(src), len(tgt)).state_dict(),
             "dictionaries": {"src_sha256": src.sha256, "tgt_sha256": tgt.sha256, "src_size": len(src),
                              "tgt_size": len(tgt), "src_lang": "de", "tgt_lang": "en"},
             "update": 1, "epoch": 1}
    good = root / "good.pt"
    ck.save_checkpoint(state, good)
    return data, good, ck.load_checkpoint(good)


def crafted(tmp_path, state, name="crafted.pt"):
    p = tmp_path / name
    torch.save({ck.MAGIC: 1, **state}, p)  # what anyone can write: no nmtkit code involved
    return p


def one_line(r) -> str:
    assert r.code == 2, r
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.err and "internal error" not in r.err, r
    return lines[0]


def test_the_real_checkpoint_translates(setup, run_cli):
    data, good, _ = setup
    assert run_cli("generate", data, "--path", good, *COMMON).code == 0


def test_wrong_layout_is_one_line_naming_the_key(setup, run_cli, tmp_path):
    data, _, state = setup
    cases = [
        ({"model": list(state["model"].values())}, "'model' is a list, expected a dict of tensors"),
        ({"arch_config": "hello"}, "'arch_config' is a str, expected a dict of architecture settings"),
        ({"arch": 3}, "'arch' is an int, expected a string"),
        ({"model": {**state["model"], "encoder_norm.weight": [1.0, 2.0]}},
         "'model' entry 'encoder_norm.weight' is a list, expected a tensor"),
        ({"ema": "weights"}, "'ema' is a str, expected a dict of tensors"),
        ({"dictionaries": ["a", "b"]}, "'dictionaries' is a list, expected a dict"),
        ({"update": "7"}, "'update' is a str, expected an integer"),
        ({"arch_config": {**state["arch_config"], 3: 4}}, "'arch_config' has a non-string key 3"),
        ({"model": {**state["model"], "encoder_norm.weight": torch.eye(16).to_sparse()}},
         "'model' entry encoder_norm.weight is a torch.sparse_coo tensor, expected a dense one"),
    ]
    for change, message in cases:
        p = crafted(tmp_path, {**state, **change})
        line = one_line(run_cli("generate", data, "--path", p, *COMMON))
        assert line == f"nmtkit: error: {p}: malformed nmtkit checkpoint: {message}", line


@pytest.fixture(autouse=True)
def _never_build_a_huge_model(monkeypatch):
    """A model of the crafted configs below would take gigabytes: fail the test instead of building it."""
    real_build = loading.build_model

    def build_model(cfg, *a, **k):
        assert cfg.d_ff < 65536, "the model was built before its weights were checked against the config"
        return real_build(cfg, *a, **k)

    monkeypatch.setattr(loading, "build_model", build_model)


def test_a_huge_d_ff_is_refused_before_the_model_is_built(setup, run_cli, tmp_path):
    data, _, state = setup
    # over the registry's limit: refused as a config; within it: refused against the stored tensors
    p = crafted(tmp_path, {**state, "arch_config": {**state["arch_config"], "d_ff": 10**9}})
    line = one_line(run_cli("generate", data, "--path", p, *COMMON))
    assert line == (f"nmtkit: error: --path {p}: invalid architecture config in the checkpoint: "
                    "--d-ff must be at most 65536, got 1000000000"), line
    p = crafted(tmp_path, {**state, "arch_config": {**state["arch_config"], "d_ff": 65536}})
    line = one_line(run_cli("generate", data, "--path", p, *COMMON))
    assert line == (f"nmtkit: error: --path {p}: weights do not fit its own architecture config: "
                    "encoder_layers.0.ffn.fc1.weight has shape (32, 16) where the config needs (65536, 16)"), line


def test_tensors_that_claim_more_than_they_store_are_refused(setup, run_cli, tmp_path):
    # a zero stride makes 4 stored bytes stand for 10^9 elements; loading them into a model of that
    # size would allocate gigabytes although the file is 2 KB
    data, _, state = setup
    huge = torch.zeros(1).expand(10**9, 16)
    weights = {**state["model"], "encoder_layers.0.ffn.fc1.weight": huge}
    p = crafted(tmp_path, {**state, "model": weights, "arch_config": {**state["arch_config"], "d_ff": 10**9}})
    assert p.stat().st_size < 1 << 20
    line = one_line(run_cli("generate", data, "--path", p, *COMMON))
    assert line == (f"nmtkit: error: {p}: malformed nmtkit checkpoint: 'model' entry "
                    "encoder_layers.0.ffn.fc1.weight has shape (1000000000, 16) but stores only 4 bytes"), line


def test_weights_that_do_not_fit_the_config(setup, run_cli, tmp_path):
    data, _, state = setup
    w = dict(state["model"])
    del w["decoder_layers.0.ffn.fc2.bias"]
    cases = [
        (w, {}, "missing decoder_layers.0.ffn.fc2.bias"),
        ({**state["model"], "extra.weight": torch.zeros(2)}, {}, "unexpected extra.weight"),
        ({**state["model"], "encoder_norm_x": torch.zeros(2)}, {"decoder_layers": 2},
         "missing decoder_layers.1.self_attn"),
        ({**state["model"], "encoder_layers.0.ffn.fc1.bias": torch.zeros(32, dtype=torch.int64)}, {},
         "encoder_layers.0.ffn.fc1.bias is torch.int64 where the model has torch.float32"),
        (state["model"], {"encoder_layers": 1000},
         f"it asks for {1000 + 1} layers but only {len(state['model'])} tensors are stored"),
    ]
    for weights, cfg_change, message in cases:
        p = crafted(tmp_path, {**state, "model": weights, "arch_config": {**state["arch_config"], **cfg_change}})
        line = one_line(run_cli("generate", data, "--path", p, *COMMON))
        assert line.startswith(f"nmtkit: error: --path {p}: weights do not fit its own architecture config: ")
        assert message in line, line


def test_invalid_config_values_name_the_checkpoint(setup, run_cli, tmp_path):
    data, _, state = setup
    for change, message in (({"d_ff": "big"}, "--d-ff must be int, got 'big'"),
                            ({"heads": 3}, "--d-model 16 is not divisible by --heads 3"),
                            ({"e": 1, "h": 2}, "architecture config has unknown field(s): e, h")):
        p = crafted(tmp_path, {**state, "arch_config": {**state["arch_config"], **change}})
        line = one_line(run_cli("generate", data, "--path", p, *COMMON))
        assert line.startswith(f"nmtkit: error: --path {p}: invalid architecture config in the checkpoint: ")
        assert message in line, line


def test_pickled_code_is_refused_without_torch_advice(tmp_path, run_cli, setup):
    import os

    data, _, _ = setup

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    for obj, name in ((Evil(), "print"), (os.system, "posix.system")):
        p = tmp_path / "evil.pt"
        torch.save({ck.MAGIC: 1, "x": obj}, p)
        line = one_line(run_cli("generate", data, "--path", p, *COMMON))
        assert line == (f"nmtkit: error: {p}: not a safe nmtkit checkpoint (refused by the weights-only loader: "
                        f"it holds a pickled Python object, {name})"), line
        assert not TORCH_ADVICE.search(line.replace("weights-only", ""))


def test_average_checkpoints_refuses_a_malformed_input(setup, run_cli, tmp_path):
    _, good, state = setup
    p = crafted(tmp_path, {**state, "model": list(state["model"].values())})
    line = one_line(run_cli("average-checkpoints", good, p, "--output", tmp_path / "avg.pt"))
    assert line == f"nmtkit: error: {p}: malformed nmtkit checkpoint: 'model' is a list, expected a dict of tensors"
    assert not (tmp_path / "avg.pt").exists()


def test_resuming_from_a_crafted_checkpoint_last(tmp_path):
    from nmtkit.training import trainer as T
    from nmtkit.training.config import TrainConfig

    data = word_mapping_data_dir(tmp_path, 60, 6, 12, seed=1)
    kw = dict(data_dir=str(data), save_dir=str(tmp_path / "run"), arch="transformer_tiny", max_tokens=256,
              progress_bar=False, threads=1, no_validate=True, no_epoch_checkpoints=True)
    T.train(TrainConfig(max_update=1, **kw))
    last = tmp_path / "run" / "checkpoint_last.pt"
    good = ck.load_checkpoint(last)
    bad_shape = {**good["model"], "encoder_layers.0.ffn.fc1.weight": torch.zeros(3, 64)}
    for change, message in (
        ({"model": bad_shape}, f"{last} (model): weights do not fit its own architecture config: "
                               "encoder_layers.0.ffn.fc1.weight has shape (3, 64) where the config needs (128, 64)"),
        ({"train": {**good["train"], "optimizer": [1, 2]}},
         f"{last}: malformed nmtkit checkpoint: 'train.optimizer' is a list, expected a dict"),
        ({"train": {**good["train"], "data_position": {"epoch": 0, "batch_offset": 0}}},
         f"{last}: malformed nmtkit checkpoint: 'train.data_position.epoch' is 0"),
    ):
        torch.save({**good, **change}, last)
        with pytest.raises(UserError) as e:
            T.train(TrainConfig(max_update=2, **kw))
        assert str(e.value) == message
