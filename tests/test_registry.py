"""ArchConfig validation, the named architectures, override flags and `nmtkit archs`."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from nmtkit.cli.arch_options import with_arch_options
from nmtkit.errors import UserError
from nmtkit.models.registry import (
    ARCH_NOTES,
    ARCHS,
    FIELD_HELP,
    ArchConfig,
    apply_overrides,
    arch_field_specs,
    get_arch,
)

BASE = ARCHS["transformer_base"]


def test_base_and_big_are_the_papers_table3_rows():
    assert (BASE.encoder_layers, BASE.decoder_layers, BASE.d_model, BASE.d_ff, BASE.heads) == (6, 6, 512, 2048, 8)
    assert (BASE.head_dim_k, BASE.head_dim_v, BASE.dropout, BASE.label_smoothing) == (64, 64, 0.1, 0.1)
    assert not BASE.normalize_before and not BASE.learned_pos and BASE.share_embeddings == "all"
    assert BASE.warmup_steps == 4000 and BASE.attention_dropout == 0.0
    big = ARCHS["transformer_big"]
    assert (big.d_model, big.d_ff, big.heads, big.head_dim_k, big.dropout) == (1024, 4096, 16, 64, 0.3)
    assert ARCHS["transformer_big_en_fr"] == dataclasses.replace(big, dropout=0.1)
    parse = ARCHS["transformer_parse"]
    assert (parse.encoder_layers, parse.decoder_layers, parse.d_model, parse.d_ff, parse.heads) == (4, 4, 1024, 2048, 8)
    assert (parse.dropout, parse.attention_dropout, parse.warmup_steps, parse.share_embeddings) == (0.2, 0.2, 16000, "none")


# Every Table 3 row as (name, the fields that differ from base with their values).
TABLE3 = {
    "transformer_base_h1_dk512": dict(heads=1, head_dim_k=512, head_dim_v=512),
    "transformer_base_h4_dk128": dict(heads=4, head_dim_k=128, head_dim_v=128),
    "transformer_base_h16_dk32": dict(heads=16, head_dim_k=32, head_dim_v=32),
    "transformer_base_h32_dk16": dict(heads=32, head_dim_k=16, head_dim_v=16),
    "transformer_base_dk16": dict(head_dim_k=16),
    "transformer_base_dk32": dict(head_dim_k=32),
    "transformer_base_n2": dict(encoder_layers=2, decoder_layers=2),
    "transformer_base_n4": dict(encoder_layers=4, decoder_layers=4),
    "transformer_base_n8": dict(encoder_layers=8, decoder_layers=8),
    "transformer_base_d256_dk32": dict(d_model=256, head_dim_k=32, head_dim_v=32),
    "transformer_base_d1024_dk128": dict(d_model=1024, head_dim_k=128, head_dim_v=128),
    "transformer_base_ff1024": dict(d_ff=1024),
    "transformer_base_ff4096": dict(d_ff=4096),
    "transformer_base_drop0": dict(dropout=0.0),
    "transformer_base_drop0_2": dict(dropout=0.2),
    "transformer_base_ls0": dict(label_smoothing=0.0),
    "transformer_base_ls0_2": dict(label_smoothing=0.2),
    "transformer_base_learned_pos": dict(learned_pos=True),
}
COMPARED = ["encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "head_dim_k", "head_dim_v",
            "dropout", "attention_dropout", "label_smoothing", "learned_pos", "normalize_before",
            "share_embeddings", "warmup_steps"]


@pytest.mark.parametrize("name", list(TABLE3))
def test_table3_variant_differs_from_base_exactly_as_the_paper_says(name):
    cfg = get_arch(name)
    for field in COMPARED:
        want = TABLE3[name].get(field, getattr(BASE, field))
        assert getattr(cfg, field) == want, (name, field)
    assert "Table 3" in ARCH_NOTES[name] and "BLEU" in ARCH_NOTES[name]


def test_every_entry_is_valid_and_documented():
    assert set(ARCHS) == set(ARCH_NOTES)
    assert len(ARCHS) == 5 + len(TABLE3) + len(STUDENTS)
    for name, cfg in ARCHS.items():
        assert cfg.validate() is cfg
        assert ARCH_NOTES[name]
        assert ArchConfig.from_dict(cfg.to_dict()) == cfg  # checkpoint round trip
    assert set(FIELD_HELP) == {f.name for f in dataclasses.fields(ArchConfig)}


# ---- students ---------------------------------------------------------------------------------------

# name -> the fields in which the student differs from transformer_base
STUDENTS = {
    "transformer_student_6_1": {"decoder_layers": 1},
    "transformer_student_12_1": {"encoder_layers": 12, "decoder_layers": 1},
    "transformer_student_tiny": {"decoder_layers": 2, "d_model": 256, "d_ff": 1536, "dropout": 0.0,
                                 "label_smoothing": 0.0, "warmup_steps": 16000},
    "transformer_student_6_1_small": {"decoder_layers": 1, "d_model": 128, "d_ff": 512, "heads": 4,
                                      "normalize_before": True},
}
# name -> per-head query/key and value size: d_model / heads
HEAD_DIMS = {"transformer_student_6_1": 64, "transformer_student_12_1": 64, "transformer_student_tiny": 32,
             "transformer_student_6_1_small": 32}


@pytest.mark.parametrize("name", list(STUDENTS))
def test_student_shapes(name):
    """Each student is base with its own fields changed and every other one as base: sinusoids,
    ReLU, no attention biases, all embeddings tied, heads of d_model / heads."""
    cfg = get_arch(name)
    for f in dataclasses.fields(ArchConfig):
        assert getattr(cfg, f.name) == STUDENTS[name].get(f.name, getattr(BASE, f.name)), (name, f.name)
    assert cfg.head_dim_k == cfg.head_dim_v == HEAD_DIMS[name]


def test_distill_recipe_default_student_is_a_registry_student():
    """recipes/distill.sh's full-size default student is an entry here (its --smoke one is
    transformer_tiny): a renamed entry would otherwise fail only in a full run."""
    recipe = (Path(__file__).resolve().parents[1] / "recipes" / "distill.sh").read_text(encoding="utf-8")
    m = re.search(r"^STUDENT_ARCH=\$\{STUDENT_ARCH:-\$\(s (\w+) (\w+)\)\}$", recipe, re.M)
    assert m, "STUDENT_ARCH's default not found in recipes/distill.sh"
    assert m.group(1) in ARCHS and m.group(2) in STUDENTS


def _hand_count(vocab: int, enc: int, dec: int, d: int, ff: int, pre_norm: bool = False) -> int:
    """Parameters of a model with bias-free attention and one tied embedding matrix; pre-norm adds
    one final LayerNorm after each stack."""
    attention = 4 * d * d  # W^Q, W^K, W^V, W^O, each d x d (h heads of d/h)
    feed_forward = d * ff + ff + ff * d + d  # W1, b1, W2, b2
    layer_norm = 2 * d  # gain and bias
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm  # self- and cross-attention
    return vocab * d + enc * encoder_layer + dec * decoder_layer + (2 * layer_norm if pre_norm else 0)


@pytest.mark.parametrize("vocab", [32000, 8000])
def test_student_parameter_counts_match_the_hand_count(vocab):
    from nmtkit.models import count_parameters

    assert count_parameters(get_arch("transformer_student_6_1"), vocab) == _hand_count(vocab, 6, 1, 512, 2048)
    assert count_parameters(get_arch("transformer_student_12_1"), vocab) == _hand_count(vocab, 12, 1, 512, 2048)
    assert count_parameters(get_arch("transformer_student_tiny"), vocab) == _hand_count(vocab, 6, 2, 256, 1536)
    assert count_parameters(get_arch("transformer_student_6_1_small"), vocab) == _hand_count(
        vocab, 6, 1, 128, 512, pre_norm=True)
    # the per-layer figures written out for one student: d 256, d_ff 1536
    assert _hand_count(0, 1, 0, 256, 1536) == 262_144 + 788_224 + 1_024
    assert _hand_count(0, 0, 1, 256, 1536) == 524_288 + 788_224 + 1_536
    # and the two final LayerNorms of a pre-norm model at d 128
    assert _hand_count(0, 0, 0, 128, 512, pre_norm=True) == 512


@pytest.mark.parametrize("name", list(STUDENTS))
def test_student_runs_a_forward_pass(name):
    import torch

    from nmtkit.models import Transformer

    torch.manual_seed(0)
    model = Transformer(get_arch(name), 11, 11).eval()
    src = torch.tensor([[4, 5, 6, 7, 2], [8, 9, 2, 0, 0]])  # (B=2, S=5): </s> = 2, <pad> = 0
    tgt = torch.tensor([[1, 4, 5], [1, 8, 10]])  # (B=2, T=3), from <s> = 1
    with torch.no_grad():
        logits = model(src, tgt)  # (B, T, V)
    assert logits.shape == (2, 3, 11) and torch.isfinite(logits).all()
    layers = {k: STUDENTS[name].get(k, getattr(BASE, k)) for k in ("encoder_layers", "decoder_layers")}
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (layers["encoder_layers"], layers["decoder_layers"])


# ---- docs/archs.md ----------------------------------------------------------------------------------

ARCHS_DOC = Path(__file__).resolve().parents[1] / "docs" / "archs.md"


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_archs_doc_lists_exactly_the_registry():
    """The entries table names every architecture once; `_x` after a full name is short for
    transformer_base_x, as the table writes the Table 3 rows."""
    named = []
    for line in _section(ARCHS_DOC.read_text(encoding="utf-8"), "The entries").splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([a-z0-9_]+)`", line.split("|")[1]):
                named.append("transformer_base" + name if name.startswith("_") else name)
    assert sorted(named) == sorted(ARCHS)


def test_archs_doc_student_parameter_counts_are_the_models():
    from nmtkit.models import count_parameters

    rows = {}
    for line in _section(ARCHS_DOC.read_text(encoding="utf-8"), "Students").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 7:
            rows[cells[0].strip("`")] = (int(cells[5].replace(",", "")), int(cells[6].replace(",", "")))
    assert set(rows) == set(STUDENTS)
    for name, counts in rows.items():
        assert counts == (count_parameters(get_arch(name), 32000), count_parameters(get_arch(name), 8000))


def test_get_arch_typo_lists_close_names():
    with pytest.raises(UserError, match="did you mean transformer_base"):
        get_arch("transformer_bas")
    with pytest.raises(UserError, match="unknown architecture 'zzz'"):
        get_arch("zzz")


@pytest.mark.parametrize("changes,message", [
    (dict(d_model=500), "--d-model 500 is not divisible by --heads 8"),
    (dict(heads=0), "--heads must be a positive integer, got 0"),
    (dict(encoder_layers=-1), "--encoder-layers must be a positive integer"),
    (dict(d_ff=0), "--d-ff must be a positive integer"),
    (dict(d_k=0), "--d-k must be a positive integer"),
    (dict(dropout=1.0), r"--dropout must be in \[0, 1\), got 1.0"),
    (dict(attention_dropout=-0.1), "--attention-dropout must be in"),
    (dict(label_smoothing=1.5), "--label-smoothing must be in"),
    (dict(share_embeddings="both"), "--share-embeddings must be one of all, decoder, none"),
    (dict(d_model=512.0), "--d-model must be int"),
    (dict(normalize_before="yes"), "--normalize-before must be bool"),
    (dict(max_target_positions=0), "--max-target-positions must be a positive integer"),
    (dict(warmup_steps=-5), "--warmup-steps must be >= 0"),
    (dict(colour="red"), "unknown architecture field"),
])
def test_invalid_configs_are_refused_naming_the_flag(changes, message):
    with pytest.raises(UserError, match=message):
        BASE.replace(**changes)


def test_explicit_head_sizes_lift_the_divisibility_rule():
    cfg = BASE.replace(d_model=500, d_k=50, d_v=60)
    assert (cfg.head_dim_k, cfg.head_dim_v) == (50, 60)
    with pytest.raises(UserError, match="not divisible"):
        BASE.replace(d_model=500, d_k=50)  # d_v would still be d_model / heads


def test_from_dict_refuses_unknown_keys_and_fills_missing_ones():
    with pytest.raises(UserError, match="unknown field.*nonsense"):
        ArchConfig.from_dict({**BASE.to_dict(), "nonsense": 1})
    d = BASE.to_dict()
    del d["warmup_steps"]  # e.g. a checkpoint from before the field existed
    assert ArchConfig.from_dict(d) == BASE


def test_apply_overrides_converts_and_validates():
    cfg = apply_overrides(BASE, {"--d-model": "256", "heads": 4, "dropout": 0, "d_ff": None,
                                 "normalize_before": "true", "share_embeddings": "decoder"})
    assert (cfg.d_model, cfg.heads, cfg.dropout, cfg.d_ff) == (256, 4, 0.0, 2048)
    assert cfg.normalize_before is True and cfg.share_embeddings == "decoder"
    assert isinstance(cfg.dropout, float)
    with pytest.raises(UserError, match="--d-model expects int, got 'big'"):
        apply_overrides(BASE, {"d_model": "big"})
    with pytest.raises(UserError, match="unknown architecture flag --d-modle.*--d-model"):
        apply_overrides(BASE, {"d_modle": 3})
    with pytest.raises(UserError, match="not divisible by --heads 7"):
        apply_overrides(BASE, {"heads": 7})


def test_field_specs_cover_every_field_with_types():
    specs = {s.name: s for s in arch_field_specs()}
    assert list(specs) == [f.name for f in dataclasses.fields(ArchConfig)]
    assert specs["d_model"].flag == "--d-model" and specs["d_model"].type is int
    assert specs["dropout"].type is float and specs["normalize_before"].type is bool
    assert specs["d_k"].optional and not specs["d_model"].optional
    assert specs["share_embeddings"].choices == ("all", "decoder", "none")


def _override_app():
    app = typer.Typer()
    seen = {}

    @app.command()
    @with_arch_options
    def train(arch: str = typer.Option("transformer_tiny", "--arch"),
              arch_overrides: Optional[dict] = None):
        seen["cfg"] = apply_overrides(get_arch(arch), arch_overrides)

    @app.command()
    def other() -> None:  # a second command keeps `train` a subcommand
        pass

    return app, seen


def test_with_arch_options_exposes_every_field_as_a_flag():
    app, seen = _override_app()
    runner = CliRunner()
    r = runner.invoke(app, ["train", "--arch", "transformer_base", "--encoder-layers", "4",
                            "--d-model", "256", "--normalize-before", "--d-k", "16",
                            "--share-embeddings", "none", "--dropout", "0.2"])
    assert r.exit_code == 0, r.output
    assert seen["cfg"] == BASE.replace(encoder_layers=4, d_model=256, normalize_before=True, d_k=16,
                                       share_embeddings="none", dropout=0.2)
    r = runner.invoke(app, ["train"])  # nothing given: the named architecture unchanged
    assert r.exit_code == 0 and seen["cfg"] == ARCHS["transformer_tiny"]
    r = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "300", "TERMINAL_WIDTH": "300"})
    for spec in arch_field_specs():
        assert spec.flag in r.output
    r = runner.invoke(app, ["train", "--heads", "7"])
    assert isinstance(r.exception, UserError) and "--heads 7" in str(r.exception)


def test_with_arch_options_can_leave_fields_to_the_command():
    app = typer.Typer()
    seen = {}

    @app.command()
    @with_arch_options(exclude=("warmup_steps",))
    def train(warmup_updates: Optional[int] = typer.Option(None, "--warmup-updates"),
              arch_overrides: Optional[dict] = None):
        seen["overrides"] = arch_overrides
        seen["cfg"] = apply_overrides(BASE, {**arch_overrides, "warmup_steps": warmup_updates})

    @app.command()
    def other() -> None:
        pass

    runner = CliRunner()
    r = runner.invoke(app, ["train", "--warmup-updates", "100", "--heads", "4"])
    assert r.exit_code == 0, r.output
    assert "warmup_steps" not in seen["overrides"]
    assert seen["cfg"] == BASE.replace(warmup_steps=100, heads=4)
    r = runner.invoke(app, ["train", "--warmup-steps", "100"])
    assert r.exit_code == 2  # no such flag any more
    with pytest.raises(TypeError, match="unknown field"):
        with_arch_options(exclude=("warmup",))(lambda arch_overrides=None: None)


def test_with_arch_options_needs_the_overrides_parameter():
    with pytest.raises(TypeError, match="arch_overrides"):
        with_arch_options(lambda arch="x": None)


# ---- the CLI ---------------------------------------------------------------------------------------


def test_archs_lists_every_entry_with_params(run_cli):
    r = run_cli("archs")
    assert r.code == 0, r
    for name in ARCHS:
        assert name in r.out
    assert "63.0M" in r.out and "214.2M" in r.out  # base and big with 37000 symbols


def test_archs_name_prints_every_field(run_cli):
    r = run_cli("archs", "transformer_base_dk16")
    assert r.code == 0, r
    for f in dataclasses.fields(ArchConfig):
        assert f.name in r.out
    assert "55,967,744" in r.out and "None (= 64)" in r.out


def test_archs_json_round_trips(run_cli):
    r = run_cli("archs", "transformer_big", "--json", "--vocab", "32000")
    assert r.code == 0, r
    d = json.loads(r.out)
    assert ArchConfig.from_dict(d["config"]) == ARCHS["transformer_big"]
    assert d["params"] == 214_171_648 - 5000 * 1024


def test_archs_unknown_name_is_one_line_exit_2(run_cli):
    r = run_cli("archs", "transformer_bigg")
    assert r.code == 2 and "transformer_big" in r.err and "Traceback" not in r.err
    assert len([line for line in r.err.splitlines() if line.strip()]) == 1
    r = run_cli("archs", "--vocab", "2")
    assert r.code == 2 and "--vocab" in r.err
