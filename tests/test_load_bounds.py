"""What a checkpoint may ask of the loader: architecture values within stated limits, and finite
weights (docs/formats.md "## Checkpoints").

A checkpoint's config is read from a file anyone can write. The stored tensors are checked against
it, but the sinusoid position tables are computed from `max_*_positions x d_model`: without a
limit, a 0.3 MB file asking for 2**22 positions makes `generate` take 4.4 GB and 22 s
(and an export write the 1 GiB table). And a checkpoint holding NaN weights translates into
nothing useful without an error. Both are refused in one line naming the file (and the field or
the tensor), wherever checkpoints are loaded: generate, export, average-checkpoints, the
`Translator` and `load_models`.
"""

from __future__ import annotations

import pytest
import torch

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError
from nmtkit.models import registry
from nmtkit.models.registry import ARCHS, ArchConfig

from test_crafted_checkpoints import crafted, one_line  # a checkpoint anyone can write; one error line
from test_crafted_checkpoints import setup as crafted_setup  # noqa: F401 - fixture

COMMON = ("--gen-subset", "valid", "--max-len-b", "4", "--quiet", "--threads", "1", "--beam", "1")


@pytest.fixture(scope="module")
def setup(crafted_setup):
    """(data dir, its dictionaries, a tiny checkpoint's state with EMA weights): the crafted-checkpoint
    tests' model, with a copy of its weights as the EMA ones."""
    from nmtkit.data.manifest import load_dictionaries

    data, _, state = crafted_setup
    state = {**state, "ema": {k: v.clone() for k, v in state["model"].items()}}
    return data, load_dictionaries(data), state


@pytest.fixture
def no_sinusoid_table(monkeypatch):
    """Fail the test if a sinusoid table is computed: refusals must come before anything is built."""
    from nmtkit.models import transformer

    def refuse(*a, **k):
        raise AssertionError("a sinusoid table was computed before the config was checked")

    monkeypatch.setattr(transformer, "sinusoid_table", refuse)
    transformer._cached_sinusoid_table.cache_clear()
    yield
    transformer._cached_sinusoid_table.cache_clear()


# ------------------------------------------------------------------------ the limits


# the limits as docs/formats.md states them
LIMITS = {"encoder_layers": 1024, "decoder_layers": 1024, "d_model": 16384, "d_ff": 65536, "heads": 256,
          "d_k": 16384, "d_v": 16384, "max_source_positions": 65536, "max_target_positions": 65536}


def test_every_named_architecture_is_far_within_the_limits():
    for name, cfg in ARCHS.items():
        assert cfg.validate() is cfg, name
        for field, most in LIMITS.items():
            v = getattr(cfg, field)
            assert v is None or v * 8 <= most, (name, field)
    big = ARCHS["transformer_big"]
    assert big.replace(max_source_positions=16384, max_target_positions=16384).max_source_positions == 16384
    assert ARCHS["transformer_tiny"].replace(max_source_positions=65536).max_source_positions == 65536


def test_the_stated_limits_are_the_registrys():
    assert registry.LIMITS == LIMITS and registry.MAX_SINUSOID_VALUES == 2**24


@pytest.mark.parametrize("field,most", list(LIMITS.items()))
def test_each_limit_is_refused_one_above_it_naming_the_flag(field, most):
    base = ArchConfig(learned_pos=True, d_k=64, d_v=64)  # learned: no sinusoid table to bound
    assert getattr(base.replace(**{field: most}), field) == most
    flag = "--" + field.replace("_", "-")
    with pytest.raises(UserError) as e:
        base.replace(**{field: most + 1})
    assert str(e.value) == f"{flag} must be at most {most}, got {most + 1}"


def test_a_sinusoid_table_is_bounded_by_positions_times_d_model():
    most = 2**24
    cfg = ArchConfig(d_model=2048, heads=16)
    assert cfg.replace(max_target_positions=most // 2048).max_target_positions == most // 2048
    with pytest.raises(UserError) as e:
        cfg.replace(max_target_positions=most // 2048 + 1)
    assert str(e.value) == (f"--max-target-positions {most // 2048 + 1} x --d-model 2048: its sinusoid table "
                            f"would hold more than {most} values (64 MiB); use fewer positions")
    # a learned table is stored, so its size is checked against the tensor instead
    assert cfg.replace(learned_pos=True, max_target_positions=most // 2048 + 1).learned_pos


def test_train_flags_have_the_same_limits():
    from nmtkit.models import apply_overrides, get_arch

    with pytest.raises(UserError, match="^--max-source-positions must be at most 65536, got 100000$"):
        apply_overrides(get_arch("transformer_tiny"), {"--max-source-positions": "100000"})


# ------------------------------------------------------------------------ checkpoints over the limits


@pytest.mark.parametrize("change,message", [
    ({"max_source_positions": 2**22}, "--max-source-positions must be at most 65536, got 4194304"),
    ({"max_target_positions": 2**22}, "--max-target-positions must be at most 65536, got 4194304"),
    ({"max_source_positions": 65536, "d_model": 1024, "heads": 16},
     "--max-source-positions 65536 x --d-model 1024: its sinusoid table would hold more than"),
    ({"d_model": 10**6}, "--d-model must be at most 16384, got 1000000"),
    ({"d_ff": 10**9}, "--d-ff must be at most 65536, got 1000000000"),
    ({"heads": 4096}, "--heads must be at most 256, got 4096"),
    ({"d_k": 10**6}, "--d-k must be at most 16384, got 1000000"),
    ({"d_v": 10**6}, "--d-v must be at most 16384, got 1000000"),
    ({"encoder_layers": 10**6}, "--encoder-layers must be at most 1024, got 1000000"),
    ({"decoder_layers": 2000}, "--decoder-layers must be at most 1024, got 2000"),
])
def test_generate_refuses_a_config_over_the_limits_before_building(setup, run_cli, tmp_path, no_sinusoid_table,
                                                                   change, message):
    data, _, state = setup
    p = crafted(tmp_path, {**state, "arch_config": {**state["arch_config"], **change}})
    assert p.stat().st_size < 1 << 20
    line = one_line(run_cli("generate", data, "--path", p, *COMMON))
    assert line.startswith(f"nmtkit: error: --path {p}: invalid architecture config in the checkpoint: {message}"), line


def test_the_loader_refuses_2_22_positions_at_once(setup, tmp_path, no_sinusoid_table):
    import time

    from nmtkit import Translator
    from nmtkit.models.loading import load_models

    data, (src, tgt), state = setup
    p = crafted(tmp_path, {**state, "arch_config": {**state["arch_config"], "max_source_positions": 2**22}})
    t0 = time.perf_counter()
    with pytest.raises(UserError, match="max-source-positions must be at most 65536"):
        load_models([p], src, tgt)
    with pytest.raises(UserError, match="max-source-positions must be at most 65536"):
        Translator.load(p, data, threads=1)
    assert time.perf_counter() - t0 < 10  # 22 s and 4.4 GB without the limit


def test_a_learned_table_must_match_its_stored_tensor(setup, run_cli, tmp_path):
    data, _, state = setup
    cfg = {**state["arch_config"], "learned_pos": True, "max_source_positions": 64, "max_target_positions": 64}
    from nmtkit.models import Transformer

    weights = Transformer(ArchConfig.from_dict(cfg), 20, 20).state_dict()  # shapes only matter here
    good = {**state["model"], "src_pos.weight": weights["src_pos.weight"], "tgt_pos.weight": weights["tgt_pos.weight"]}
    p = crafted(tmp_path, {**state, "model": good, "ema": None,
                           "arch_config": {**cfg, "max_source_positions": 60000}})
    line = one_line(run_cli("generate", data, "--path", p, *COMMON))
    assert line == (f"nmtkit: error: --path {p}: weights do not fit its own architecture config: "
                    "src_pos.weight has shape (64, 16) where the config needs (60000, 16)"), line


def test_export_refuses_2_22_positions_in_one_line(setup, run_cli, tmp_path, no_sinusoid_table):
    pytest.importorskip("ctranslate2")
    data, _, state = setup
    p = crafted(tmp_path, {**state, "arch_config": {**state["arch_config"], "max_source_positions": 2**22}})
    line = one_line(run_cli("export", data, "--path", p, "--output", tmp_path / "out"))
    assert line == (f"nmtkit: error: --path {p}: invalid architecture config in the checkpoint: "
                    "--max-source-positions must be at most 65536, got 4194304"), line
    assert sorted(x.name for x in tmp_path.iterdir()) == ["crafted.pt"]


# ------------------------------------------------------------------------ non-finite weights


def _poisoned(state, key, name, value, at=(0, 0)):
    weights = dict(state[key])
    t = weights[name].clone()
    t[at] = value
    weights[name] = t
    return {**state, key: weights}


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_generate_refuses_non_finite_weights_naming_the_tensor(setup, run_cli, tmp_path, value):
    data, _, state = setup
    p = crafted(tmp_path, _poisoned(state, "model", "encoder_layers.0.ffn.fc1.weight", value))
    line = one_line(run_cli("generate", data, "--path", p, *COMMON))
    assert line == (f"nmtkit: error: --path {p}: 'model' entry encoder_layers.0.ffn.fc1.weight holds NaN or "
                    "infinite values (1 of 512): the training diverged or the file is damaged; "
                    "use an earlier checkpoint"), line
    # the EMA weights are finite: --ema loads them
    assert run_cli("generate", data, "--path", p, "--ema", *COMMON).code == 0


def test_non_finite_ema_weights_are_refused_only_with_ema(setup, run_cli, tmp_path):
    data, _, state = setup
    p = crafted(tmp_path, _poisoned(state, "ema", "tgt_embed.weight", float("nan"), at=(5, 2)))
    assert run_cli("generate", data, "--path", p, *COMMON).code == 0
    line = one_line(run_cli("generate", data, "--path", p, "--ema", *COMMON))
    assert line.startswith(f"nmtkit: error: --path {p}: 'ema' entry tgt_embed.weight holds NaN or infinite values "
                           "(1 of "), line


def test_half_precision_and_tied_weights_are_checked(setup, tmp_path):
    from nmtkit.models.loading import load_models

    _, (src, tgt), state = setup
    half = {k: v.half() for k, v in state["model"].items()}
    p = crafted(tmp_path, {**state, "model": half, "ema": None}, "half.pt")
    assert load_models([p], src, tgt).models  # finite fp16 weights load
    # tied embeddings are one tensor under three names: a NaN in it is found (under its first name)
    tied = dict(state["model"])
    shared = tied["tgt_embed.weight"].clone()
    shared[7, 1] = float("nan")
    for name in ("src_embed.weight", "tgt_embed.weight", "out_proj.weight"):
        tied[name] = shared
    p = crafted(tmp_path, {**state, "model": tied, "ema": None}, "tied.pt")
    with pytest.raises(UserError) as e:
        load_models([p], src, tgt)
    assert f"--path {p}: 'model' entry " in str(e.value) and "embed.weight holds NaN" in str(e.value)


def test_nonfinite_entry_reads_each_tensor_once_and_counts():
    t = torch.zeros(4, 4)
    assert ck.nonfinite_entry({"a": t, "b": t, "i": torch.tensor([1, 2])}) is None
    bad = torch.ones(10, dtype=torch.bfloat16)
    bad[[2, 9]] = float("nan")
    assert ck.nonfinite_entry({"a": t, "b": bad, "c": torch.empty(0)}) == ("b", 2, 10)


def test_export_refuses_non_finite_weights(setup, run_cli, tmp_path):
    pytest.importorskip("ctranslate2")
    data, _, state = setup
    p = crafted(tmp_path, _poisoned(state, "model", "decoder_layers.0.ffn.fc2.weight", float("nan")))
    line = one_line(run_cli("export", data, "--path", p, "--output", tmp_path / "out"))
    assert line.startswith(f"nmtkit: error: --path {p}: 'model' entry decoder_layers.0.ffn.fc2.weight holds NaN"), line
    assert sorted(x.name for x in tmp_path.iterdir()) == ["crafted.pt"]


def test_average_checkpoints_refuses_a_non_finite_input(setup, run_cli, tmp_path):
    _, _, state = setup
    good = crafted(tmp_path, state, "good.pt")
    for key in ("model", "ema"):
        bad = crafted(tmp_path, _poisoned(state, key, "encoder_layers.0.ffn.fc1.bias", float("inf"), at=(0,)), "bad.pt")
        line = one_line(run_cli("average-checkpoints", good, bad, "--output", tmp_path / "avg.pt"))
        assert line == (f"nmtkit: error: {bad}: '{key}' entry encoder_layers.0.ffn.fc1.bias holds NaN or infinite "
                        "values (1 of 32): the training diverged or the file is damaged; leave it out of the "
                        "average"), line
        assert not (tmp_path / "avg.pt").exists()
    assert run_cli("average-checkpoints", good, crafted(tmp_path, state, "good2.pt"),
                   "--output", tmp_path / "avg.pt").code == 0


def test_arch_limits_are_stated_in_the_docs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text(encoding="utf-8")
    for field, most in LIMITS.items():
        assert f"`{field}`" in text and f"{most:,}".replace(",", "") in text.replace(",", ""), field
    assert "2^24" in text
