"""Every refusal that the docs of the importers, the exports and their engines promise has a test
that triggers it: the refused input is built and its one-line error asserted (exit status 2 on
the command line, UserError in the library).

`REFUSALS` pins the list: each row names a doc, a phrase of the refusal as the doc words it, and
the test that triggers it (here or in another module). `test_every_documented_refusal_is_in_its_doc_and_tested`
holds each phrase in its doc and each test in its module, and `test_the_docs_refuse_nothing_more`
counts the paragraphs of the docs that speak of refusing, so a refusal added to a doc fails until
it is added to the table, with a test. The models are tiny and random: a refusal needs no trained
model.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from nmtkit.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def _has(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_ct2 = pytest.mark.skipif(not _has("ctranslate2"), reason="ctranslate2 is not installed: pip install -e '.[ctranslate2]'")
needs_onnx = pytest.mark.skipif(not _has("onnx", "onnxruntime"), reason="onnx is not installed: pip install -e '.[onnx]'")
needs_hf = pytest.mark.skipif(not _has("transformers", "safetensors"), reason="transformers is not installed: pip install -e '.[hf]'")
needs_serve = pytest.mark.skipif(not _has("httpx", "uvicorn", "starlette"), reason="the serve extra is not installed")

if _has("transformers", "safetensors"):
    from tests.test_huggingface import marian  # noqa: F401 - fixture: a tiny random MarianMT folder

# (doc, a phrase of the refusal as the doc words it, the test that triggers it: "module::function")
REFUSALS = [
    # docs/export.md: the CTranslate2 export and its engine
    ("docs/export.md", "`--lenpen-form gnmt` on an export is refused in one line",
     "tests/test_export.py::test_generate_refuses_what_ctranslate2_cannot_honour"),
    ("docs/export.md", "| `--lenpen-form gnmt` (the default on a checkpoint) | refused, unless `--lenpen 0` |",
     "tests/test_export.py::test_generate_refuses_what_ctranslate2_cannot_honour"),
    ("docs/export.md", "| `--early-stop bound` / `none` | refused |",
     "tests/test_export.py::test_generate_refuses_what_ctranslate2_cannot_honour"),
    ("docs/export.md", "| `--unk-penalty P` | refused |",
     "tests/test_export.py::test_generate_refuses_what_ctranslate2_cannot_honour"),
    ("docs/export.md", "`mps` refused",
     "tests/test_export.py::test_generate_refuses_what_ctranslate2_cannot_honour"),
    ("docs/export.md", "| `--ema`, `DATA_DIR`, `--gen-subset`, several `--path` | refused |",
     "tests/test_export.py::test_generate_refuses_misuse_of_an_export"),
    ("docs/export.md", "| `--constraints`, `--avoid`, `--prefix` (serve's and the API's terminology fields) | refused, "
                       "in one line naming CTranslate2 |",
     "tests/test_documented_refusals.py::test_terms_on_a_ctranslate2_export_are_refused_naming_it"),
    ("docs/export.md", "An existing `--output` is refused without `--force`",
     "tests/test_export.py::test_export_refusals"),
    ("docs/export.md", "`--force` refuses a folder that is not an earlier export",
     "tests/test_export.py::test_export_refusals"),
    ("docs/export.md", "or that holds the checkpoint or the data directory",
     "tests/test_documented_refusals.py::test_force_refuses_an_export_that_holds_the_checkpoint_or_the_data"),
    ("docs/export.md", "Without the runtime installed, the command says in one line how to install it",
     "tests/test_export.py::test_export_refusals"),
    ("docs/export.md", "A setting the conversion does not know (an `ArchConfig` field added later, set to a "
                       "non-default value) is refused in one line naming its flag",
     "tests/test_export.py::test_a_setting_the_conversion_does_not_know_is_refused"),
    # docs/export.md: ONNX
    ("docs/export.md", "A setting the graphs do not know is refused in one line naming its flag",
     "tests/test_export.py::test_a_setting_the_conversion_does_not_know_is_refused"),
    ("docs/export.md", "A failing check is one line (`the ONNX graphs in ... do not reproduce the model",
     "tests/test_onnx.py::test_the_check_refuses_graphs_that_differ"),
    ("docs/export.md", "Refused in one line naming the engine: `--device` other than `cpu` / `auto`, `--precision` "
                       "other than `fp32`",
     "tests/test_onnx.py::test_generate_refuses_what_the_engine_cannot_honour"),
    ("docs/export.md", "`--quantize` and `--ema` (chosen at export time)",
     "tests/test_onnx.py::test_generate_refuses_what_the_engine_cannot_honour"),
    ("docs/export.md", "ensembles, `DATA_DIR`, and what needs teacher forcing (`--score-reference`, "
                       "`--print-alignment`, `nmtkit attention`)",
     "tests/test_documented_refusals.py::test_the_onnx_engine_refuses_data_dir_ensembles_and_teacher_forcing"),
    ("docs/export.md", "the command says in one line how to install it",
     "tests/test_onnx.py::test_without_the_extra_one_line_says_what_to_install"),
    # docs/export.md: Hugging Face
    ("docs/export.md", "`nmtkit generate --path DIR` refuses the folder in one line",
     "tests/test_huggingface.py::test_export_refusals"),
    ("docs/export.md", "Refused in one line, before any work: pre-norm (`--normalize-before`)",
     "tests/test_huggingface.py::test_export_refusals"),
    ("docs/export.md", "learned positions, `--d-k`/`--d-v` other than d_model / heads",
     "tests/test_documented_refusals.py::test_the_huggingface_export_refuses_learned_positions_and_other_head_sizes"),
    ("docs/export.md", "a data directory whose segmentation `MarianTokenizer` cannot do (subword-nmt, or `--bpe none`",
     "tests/test_huggingface.py::test_export_refusals"),
    ("docs/export.md", "Without the `hf` extra the command names it",
     "tests/test_huggingface.py::test_export_refusals"),
    # docs/export.md: import-hf
    ("docs/export.md", "never an input or a file of a data or export directory",
     "tests/test_documented_refusals.py::test_import_hf_output_is_never_in_an_export"),
    ("docs/export.md", "never an input or a file of a data or export directory",
     "tests/test_documented_refusals.py::test_import_hf_output_is_never_an_input"),
    ("docs/export.md", "Refused in one line naming the file: a folder that is not MarianMT (`model_type`)",
     "tests/test_huggingface.py::test_import_refusals"),
    ("docs/export.md", "missing files (`target.spm`, `config.json`, the weights)",
     "tests/test_documented_refusals.py::test_import_hf_refuses_a_folder_without_weights"),
    ("docs/export.md", "pre-norm or extra layer norms (`normalize_before`, `normalize_embedding`, `add_final_layer_norm`",
     "tests/test_documented_refusals.py::test_import_hf_refuses_what_nmtkit_does_not_compute"),
    ("docs/export.md", "or any weight nmtkit's model has no place for, e.g. `layernorm_embedding`",
     "tests/test_huggingface.py::test_import_refusals"),
    ("docs/export.md", "position tables that are not MarianMT's sinusoids",
     "tests/test_documented_refusals.py::test_import_hf_refuses_a_position_table_that_is_not_the_sinusoids"),
    ("docs/export.md", "a non-zero `final_logits_bias`",
     "tests/test_documented_refusals.py::test_import_hf_refuses_a_final_logits_bias"),
    ("docs/export.md", "an activation nmtkit does not have (`gelu_new`, ...)",
     "tests/test_huggingface.py::test_import_refusals"),
    ("docs/export.md", "encoder and decoder of different head counts or feed-forward sizes",
     "tests/test_documented_refusals.py::test_import_hf_refuses_what_nmtkit_does_not_compute"),
    ("docs/export.md", "the CTranslate2 and ONNX exports refuse in one line",
     "tests/test_first_hour_hf.py::test_unscaled_embeddings_export_back_to_huggingface_only"),
    # docs/export.md: the table of what each format keeps and loses
    ("docs/export.md", "settings the graphs do not know (refused in one line at export)",
     "tests/test_export.py::test_a_setting_the_conversion_does_not_know_is_refused"),
    ("docs/export.md", "pre-norm, learned positions, d_k != d_v, subword-nmt and `--bpe none` (refused)",
     "tests/test_documented_refusals.py::test_the_huggingface_export_refuses_learned_positions_and_other_head_sizes"),
    # docs/fairseq.md: flags and import-fairseq
    ("docs/fairseq.md", "A fairseq flag that nmtkit spells otherwise, or does without, is refused with one line saying "
                        "so (exit status 2)",
     "tests/test_fairseq_flags.py::test_a_fairseq_flag_gets_one_line_naming_the_nmtkit_way"),
    ("docs/fairseq.md", "nmtkit: error: --remove-bpe: nmtkit removes subwords itself; drop it",
     "tests/test_fairseq_flags.py::test_a_fairseq_flag_gets_one_line_naming_the_nmtkit_way"),
    ("docs/fairseq.md", "nmtkit: error: --fp16: use --precision fp16",
     "tests/test_fairseq_flags.py::test_a_fairseq_flag_gets_one_line_naming_the_nmtkit_way"),
    ("docs/fairseq.md", "a name that is not a fairseq checkpoint's data is refused in one line, naming it",
     "tests/test_fairseq_import.py::test_cli_refuses_a_payload_in_one_line"),
    ("docs/fairseq.md", "the checkpoint names posix.system, which is not data of a fairseq checkpoint",
     "tests/test_fairseq_import.py::test_cli_refuses_a_payload_in_one_line"),
    ("docs/fairseq.md", "an earlier import there is replaced, any other checkpoint refused",
     "tests/test_documented_refusals.py::test_import_fairseq_output_replaces_an_import_and_refuses_other_checkpoints"),
    ("docs/fairseq.md", "an earlier import there is replaced, any other checkpoint refused",
     "tests/test_documented_refusals.py::test_import_fairseq_output_refuses_a_trained_nmtkit_checkpoint"),
    ("docs/fairseq.md", "`--force` replaces an nmtkit data directory there (and nothing else)",
     "tests/test_fairseq_import.py::test_refusals_write_nothing"),
    ("docs/fairseq.md", "Anything else is refused in one line naming the arch: another architecture (`lstm`,",
     "tests/test_fairseq_import.py::test_unsupported_models_are_refused_naming_the_arch"),
    ("docs/fairseq.md", "layer drop (`--encoder-layerdrop`)",
     "tests/test_documented_refusals.py::test_the_docs_example_of_an_arch_refusal_is_the_line_given"),
    ("docs/fairseq.md", "pruned layers, adaptive input or softmax",
     "tests/test_documented_refusals.py::test_import_fairseq_refuses_what_nmtkit_does_not_compute"),
    ("docs/fairseq.md", "`gelu_fast`/`gelu_accurate`, tanh approximations, are not",
     "tests/test_documented_refusals.py::test_import_fairseq_refuses_what_nmtkit_does_not_compute"),
    ("docs/fairseq.md", "`--no-scale-embedding`, `--layernorm-embedding`",
     "tests/test_documented_refusals.py::test_import_fairseq_refuses_what_nmtkit_does_not_compute"),
    ("docs/fairseq.md", "no positions, cross+self attention",
     "tests/test_documented_refusals.py::test_import_fairseq_refuses_what_nmtkit_does_not_compute"),
    ("docs/fairseq.md", "encoder and decoder of different widths, FFN sizes, heads or norm placement",
     "tests/test_documented_refusals.py::test_import_fairseq_refuses_what_nmtkit_does_not_compute"),
    # docs/generate.md: an engine without constrained search, an output inside an export
    ("docs/generate.md", "an engine without a constrained search: `constraints, avoided phrases and target prefixes:",
     "tests/test_documented_refusals.py::test_terms_on_a_ctranslate2_export_are_refused_naming_it"),
    ("docs/generate.md", "or an export directory (one holding `nmtkit.json`)",
     "tests/test_output_policy.py::test_every_command_refuses_every_kind_of_target"),
    # docs/serve.md: serve --path EXPORT
    ("docs/serve.md", "the flags and refusals are `nmtkit generate --path EXPORT_DIR`'s",
     "tests/test_serve_export.py::test_serve_refuses_a_data_dir_or_ema_beside_an_export"),
    ("docs/serve.md", "a damaged export directory",
     "tests/test_documented_refusals.py::test_serve_refuses_a_damaged_export_before_it_listens"),
    ("docs/serve.md", "a search setting the model's runtime cannot honour such as `--lenpen-form gnmt` on an export",
     "tests/test_serve_export.py::test_serve_refuses_a_data_dir_or_ema_beside_an_export"),
    ("docs/serve.md", "a server whose model is run by an engine without a constrained search (a CTranslate2 export) "
                      "answers 400 naming the engine",
     "tests/test_serve_export.py::test_terms_on_an_export_are_refused_in_one_line_naming_ctranslate2"),
    ("docs/serve.md", "On an export (CTranslate2) the answer is 501",
     "tests/test_documented_refusals.py::test_attention_on_a_served_export_is_501"),
]

# Paragraphs (or table rows) of each doc that speak of refusing; a new one must be added to
# REFUSALS (with its test) and counted here. `where`: only those that also match it.
REFUSAL_PARAGRAPHS = {
    "docs/export.md": (None, 16),
    "docs/fairseq.md": (None, 6),
    "docs/generate.md": (r"export|CTranslate2|engine", 1),
    "docs/serve.md": (r"export|CTranslate2|engine", 2),
}


def _flat(text: str) -> str:
    """The doc with its line breaks as spaces: a phrase may wrap."""
    return re.sub(r"\s+", " ", text)


def _refusal_paragraphs(doc: str, where: str | None) -> list[str]:
    text = (REPO / doc).read_text(encoding="utf-8")
    parts = [p for block in re.split(r"\n\s*\n", text)
             for p in (block.splitlines() if block.lstrip().startswith("|") else [block])]
    return [_flat(p) for p in parts if re.search(r"[Rr]efus", p) and (where is None or re.search(where, p))]


def test_every_documented_refusal_is_in_its_doc_and_tested():
    docs = {doc: _flat((REPO / doc).read_text(encoding="utf-8")) for doc, _, _ in REFUSALS}
    for doc, phrase, test in REFUSALS:
        assert _flat(phrase) in docs[doc], f"{doc} no longer says {phrase!r}: update REFUSALS"
        module, _, name = test.partition("::")
        tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"{test} (the test of {phrase!r}) does not exist"


def test_the_docs_refuse_nothing_more():
    """Pin the number of paragraphs that speak of refusing: a new one fails here until its
    refusal is in REFUSALS with a test (and the count is raised)."""
    for doc, (where, count) in REFUSAL_PARAGRAPHS.items():
        found = _refusal_paragraphs(doc, where)
        assert len(found) == count, (doc, len(found), found)
        phrases = [_flat(p) for d, p, _ in REFUSALS if d == doc]
        for paragraph in found:  # every such paragraph holds at least one row's phrase
            if not any(p in paragraph for p in phrases):
                assert doc == "docs/fairseq.md" and _NOT_OURS in paragraph, (doc, paragraph)


_NOT_OURS = "newer pip refuses the metadata of omegaconf"  # fairseq's own set-up, not nmtkit's refusal


# --------------------------------------------------------------------------------- helpers


def _one_line(r, code: int = 2) -> str:
    """The one error line of a CLI result (notes on stderr aside)."""
    lines = [x for x in r.err.splitlines() if x.strip() and not x.startswith("nmtkit: note:")]
    assert r.code == code and len(lines) == 1 and "Traceback" not in r.err, r
    assert lines[0].startswith("nmtkit: error: "), r
    return lines[0]


def _tiny_checkpoint(root: Path) -> tuple[Path, Path]:
    """A data directory (whitespace tokens) and a random 1+1-layer checkpoint of it (as
    test_export.py's, without needing its runtime): exports in a second."""
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer
    from tests.conftest import word_mapping_data_dir

    data = word_mapping_data_dir(root, 40, 4, 8, seed=2)
    src, tgt = load_dictionaries(data)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    torch.manual_seed(0)
    ckpt = root / "tiny.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": Transformer(cfg, len(src), len(tgt)).state_dict(),
                     "dictionaries": {"src_sha256": src.sha256, "tgt_sha256": tgt.sha256, "src_lang": "de",
                                      "tgt_lang": "en"}, "update": 1, "epoch": 1}, ckpt)
    return data, ckpt


@pytest.fixture(scope="module")
def ct2(tmp_path_factory):
    """A tiny random checkpoint, its data directory (whitespace tokens) and its CTranslate2 export."""
    pytest.importorskip("ctranslate2")
    from nmtkit.cli import main

    root = tmp_path_factory.mktemp("ct2")
    data, ckpt = _tiny_checkpoint(root)
    out = root / "m-ct2"
    with pytest.raises(SystemExit) as e:
        main(["export", str(data), "--path", str(ckpt), "--output", str(out)])
    assert e.value.code == 0
    (root / "in.de").write_text("w1 w2\n", encoding="utf-8")
    return {"root": root, "data": data, "ckpt": ckpt, "out": out, "input": root / "in.de"}


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    """A tiny random checkpoint, its data directory and its ONNX export."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from nmtkit.cli import main

    root = tmp_path_factory.mktemp("onnx")
    data, ckpt = _tiny_checkpoint(root)
    out = root / "m-onnx"
    with pytest.raises(SystemExit) as e:
        main(["export", str(data), "--path", str(ckpt), "--format", "onnx", "--output", str(out)])
    assert e.value.code == 0
    (root / "in.de").write_text("w1 w2\n", encoding="utf-8")
    (root / "ref.en").write_text("W1 W2\n", encoding="utf-8")
    return {"root": root, "data": data, "ckpt": ckpt, "out": out, "input": root / "in.de", "ref": root / "ref.en"}


# --------------------------------------------------------------------------------- export.md: CTranslate2


@needs_ct2
def test_terms_on_a_ctranslate2_export_are_refused_naming_it(ct2, tmp_path, run_cli):
    """--constraints, --avoid and --prefix each: one line naming CTranslate2 (docs/export.md's
    table; generate.md's Refusals), and the API says the same."""
    from nmtkit import Translator

    (tmp_path / "terms.de").write_text("w1 w2\tW1\n", encoding="utf-8")
    (tmp_path / "avoid.txt").write_text("W1\n", encoding="utf-8")
    (tmp_path / "prefix.txt").write_text("W2\n", encoding="utf-8")
    want = ("constraints, avoided phrases and target prefixes: CTranslate2 has no constrained search; translate "
            "with the checkpoint and its data directory")
    for args in (["--input", tmp_path / "terms.de", "--constraints"],
                 ["--input", ct2["input"], "--avoid", tmp_path / "avoid.txt"],
                 ["--input", ct2["input"], "--prefix", tmp_path / "prefix.txt"]):
        r = run_cli("generate", "--path", ct2["out"], "--lenpen-form", "fairseq", "-q", *args, "-o", tmp_path / "o.txt")
        assert want in _one_line(r), (args, r)
        assert not (tmp_path / "o.txt").exists()
    tr = Translator.load(ct2["out"], threads=1, warn=lambda m: None)
    for terms in (dict(constraints=[["W1"]]), dict(avoid=[["W1"]]), dict(prefix=["W2"])):
        with pytest.raises(UserError, match="^" + re.escape(want)):
            tr.translate(["w1 w2"], **terms)


@needs_ct2
def test_force_refuses_an_export_that_holds_the_checkpoint_or_the_data(ct2, tmp_path, run_cli):
    """`--force` would replace the whole folder: one holding the checkpoint or the data directory
    being exported is refused, and both stay."""
    old = tmp_path / "old"
    shutil.copytree(ct2["out"], old)
    data = old / "data"
    shutil.copytree(ct2["data"], data)
    shutil.copy(ct2["ckpt"], old / "model.pt")
    r = run_cli("export", data, "--path", ct2["ckpt"], "--output", old, "--force")
    assert f"--output {old} would contain DATA_DIR {data}; choose another --output" in _one_line(r)
    r = run_cli("export", ct2["data"], "--path", old / "model.pt", "--output", old, "--force")
    assert f"--output {old} would contain --path {old / 'model.pt'}; choose another --output" in _one_line(r)
    assert (data / "manifest.json").is_file() and (old / "model.pt").is_file() and (old / "nmtkit.json").is_file()


# --------------------------------------------------------------------------------- export.md: ONNX


@needs_onnx
def test_the_onnx_engine_refuses_data_dir_ensembles_and_teacher_forcing(onnx_export, tmp_path, run_cli):
    e = onnx_export
    out, f = e["out"], e["input"]
    for args, message in [
        ([e["data"], "--path", out, "--input", f], f"--path {out} is an export directory: it carries its own "
                                                   f"dictionaries and subword models; drop DATA_DIR ({e['data']})"),
        (["--path", out, "--path", out, "--input", f], f"--path {out} is an export directory; ensembles need "
                                                       "checkpoints and their data directory"),
        (["--path", out, "--input", f, "--score-reference", "--reference", e["ref"]],
         f"--score-reference: {out} is run by ONNX Runtime, which nmtkit does not read attention or forced scores from"),
    ]:
        r = run_cli("generate", *args)
        assert message in _one_line(r), (args, r)
    r = run_cli("attention", e["data"], "--path", out, "--source", "w1 w2", "--format", "json", "-o", tmp_path / "a.json")
    assert (f"--path {out}: attention needs nmtkit's own model: load the checkpoint and its data directory (an "
            "export directory is run by ONNX Runtime") in _one_line(r)
    assert not (tmp_path / "a.json").exists()


# --------------------------------------------------------------------------------- export.md: Hugging Face


@pytest.mark.parametrize("setting, message", [
    (dict(learned_pos=True), "--learned-pos: MarianMT has sinusoidal positions only"),
    (dict(d_k=16), "--d-k/--d-v 16/64: MarianMT's heads are d_model / heads wide"),
    (dict(d_v=32), "--d-k/--d-v 64/32: MarianMT's heads are d_model / heads wide"),
])
def test_the_huggingface_export_refuses_learned_positions_and_other_head_sizes(setting, message):
    from nmtkit.backends.huggingface.convert import check_representable
    from nmtkit.models import ArchConfig

    with pytest.raises(UserError, match="^" + re.escape(message) + "; export to ctranslate2 instead"):
        check_representable(ArchConfig(**setting))


@needs_ct2
@needs_hf
def test_the_huggingface_export_command_refuses_before_any_work(ct2, tmp_path, run_cli):
    """End to end, on a data directory without sentencepiece: one line, no folder left."""
    r = run_cli("export", ct2["data"], "--path", ct2["ckpt"], "--format", "huggingface", "--output", tmp_path / "hf")
    assert "MarianTokenizer (the Hugging Face export) reads sentencepiece models only" in _one_line(r)
    assert not (tmp_path / "hf").exists() and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------- export.md: import-hf


def _marian_copy(marian, tmp_path: Path, name: str) -> Path:  # noqa: F811
    d = tmp_path / name
    shutil.copytree(marian["dir"], d)
    return d


def _edit_config(d: Path, **changes) -> None:
    c = json.loads((d / "config.json").read_text())
    c.update(changes)
    (d / "config.json").write_text(json.dumps(c))


def _edit_weights(d: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d / "model.safetensors"))
    edit(sd)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})


def _import_refused(run_cli, d: Path, tmp_path: Path) -> str:
    out, data = tmp_path / f"{d.name}.pt", tmp_path / f"{d.name}-data"
    line = _one_line(run_cli("import-hf", d, "--output", out, "--data-dir", data))
    assert not out.exists() and not data.exists()
    return line


@needs_hf
@pytest.mark.parametrize("changes, message", [
    (dict(normalize_embedding=True), "a layer norm on the embeddings (normalize_embedding) is not supported by "
                                     "nmtkit's post-norm Transformer"),
    (dict(add_final_layer_norm=True), "a final layer norm (add_final_layer_norm) is not supported by nmtkit's "
                                      "post-norm Transformer"),
    (dict(decoder_attention_heads=2), "encoder_attention_heads 4 != decoder_attention_heads 2; nmtkit's encoder "
                                      "and decoder share these sizes"),
    (dict(decoder_ffn_dim=128), "encoder_ffn_dim 64 != decoder_ffn_dim 128; nmtkit's encoder and decoder share "
                                "these sizes"),
])
def test_import_hf_refuses_what_nmtkit_does_not_compute(marian, tmp_path, run_cli, changes, message):  # noqa: F811
    d = _marian_copy(marian, tmp_path, "opus")
    _edit_config(d, **changes)
    assert f"{d / 'config.json'}: {message}" in _import_refused(run_cli, d, tmp_path)


@needs_hf
def test_import_hf_refuses_a_folder_without_weights(marian, tmp_path, run_cli):  # noqa: F811
    d = _marian_copy(marian, tmp_path, "opus")
    (d / "model.safetensors").unlink()
    assert f"{d}: no model.safetensors or pytorch_model.bin; not a MarianMT folder" in _import_refused(run_cli, d, tmp_path)


@needs_hf
def test_import_hf_refuses_a_final_logits_bias(marian, tmp_path, run_cli):  # noqa: F811
    d = _marian_copy(marian, tmp_path, "opus")
    _edit_weights(d, lambda sd: sd["final_logits_bias"].add_(0.5))
    assert "final_logits_bias is not zero; nmtkit's output projection has no bias" in _import_refused(run_cli, d, tmp_path)


@needs_hf
def test_import_hf_refuses_a_position_table_that_is_not_the_sinusoids(marian, tmp_path, run_cli):  # noqa: F811
    """A stored table (older conversions save one) must be MarianMT's sinusoids; a learned one is refused."""
    from nmtkit.backends.huggingface.importer import sinusoids

    d = _marian_copy(marian, tmp_path, "opus")
    c = json.loads((d / "config.json").read_text())
    table = sinusoids(c["max_position_embeddings"], c["d_model"])
    _edit_weights(d, lambda sd: sd.update({"model.encoder.embed_positions.weight": table.clone(),
                                           "model.decoder.embed_positions.weight": table + 0.01}))
    assert (f"{d}: model.decoder.embed_positions.weight is not MarianMT's sinusoid table "
            "(learned positions, or another layout)") in _import_refused(run_cli, d, tmp_path)
    _edit_weights(d, lambda sd: sd.update({"model.decoder.embed_positions.weight": table.clone()}))
    r = run_cli("import-hf", d, "--output", tmp_path / "ok.pt", "--data-dir", tmp_path / "ok-data")
    assert r.code == 0, r  # the sinusoids themselves import


@needs_hf
def test_import_hf_output_is_never_in_an_export(marian, tmp_path, run_cli):  # noqa: F811
    export = tmp_path / "exported"
    export.mkdir()
    (export / "nmtkit.json").write_text('{"format": "nmtkit-export", "format_version": 1}\n', encoding="utf-8")
    r = run_cli("import-hf", marian["dir"], "--output", export / "m.pt", "--data-dir", tmp_path / "data")
    assert f"--output {export / 'm.pt'} is inside the export directory {export}" in _one_line(r)
    assert not (export / "m.pt").exists() and not (tmp_path / "data").exists()


@needs_hf
def test_import_hf_output_is_never_an_input(marian, tmp_path, run_cli):  # noqa: F811
    d = _marian_copy(marian, tmp_path, "opus")
    weights = (d / "model.safetensors").read_bytes()
    r = run_cli("import-hf", d, "--output", d / "model.safetensors", "--data-dir", tmp_path / "data")
    assert (d / "model.safetensors").read_bytes() == weights
    assert "--output" in _one_line(r) and not (tmp_path / "data").exists()


# --------------------------------------------------------------------------------- fairseq.md: import-fairseq


def _fairseq_args() -> dict:
    from nmtkit.backends.fairseq import convert, unpickle
    from tests.test_fairseq_import import GOLDEN

    state = unpickle.load(GOLDEN / "a" / "checkpoint.pt")
    return convert.model_args({"cfg": unpickle.plain(state["cfg"])})


@pytest.mark.parametrize("change, message", [
    ({"arch": "bart_base"}, "fairseq arch 'bart_base' cannot be imported (nmtkit imports transformer, "),
    ({"encoder_layers_to_keep": "0"}, "with pruned layers (encoder_layers_to_keep='0') cannot be imported"),
    ({"decoder_layers_to_keep": "0"}, "with pruned layers (decoder_layers_to_keep='0') cannot be imported"),
    ({"adaptive_softmax_cutoff": "10,20"}, "with adaptive softmax (adaptive_softmax_cutoff='10,20') cannot be imported"),
    ({"activation_fn": "gelu_accurate"}, "with its activation (activation_fn='gelu_accurate') cannot be imported: "
                                         "nmtkit's Transformer computes relu and gelu"),
    ({"activation_fn": "tanh"}, "with its activation (activation_fn='tanh') cannot be imported"),
    ({"no_scale_embedding": True}, "with unscaled embeddings (no_scale_embedding=True) cannot be imported"),
    ({"layernorm_embedding": True}, "with a layer norm on the embeddings (layernorm_embedding=True) cannot be imported"),
    ({"no_token_positional_embeddings": True}, "with no positions (no_token_positional_embeddings=True) cannot be "
                                               "imported"),
    ({"cross_self_attention": True}, "with cross+self attention (cross_self_attention=True) cannot be imported"),
    ({"decoder_ffn_embed_dim": 16}, "with encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=16 cannot be imported: "
                                    "nmtkit's encoder and decoder share these sizes"),
    ({"decoder_attention_heads": 1}, "with encoder_attention_heads=4, decoder_attention_heads=1 cannot be imported"),
    ({"decoder_normalize_before": True}, "with encoder_normalize_before=False, decoder_normalize_before=True cannot "
                                         "be imported"),
])
def test_import_fairseq_refuses_what_nmtkit_does_not_compute(change, message):
    from nmtkit.backends.fairseq import convert

    with pytest.raises(UserError, match="^" + re.escape("model.pt: ") + r".*" + re.escape(message)):
        convert.arch_config({**_fairseq_args(), **change}, "model.pt")


def test_the_docs_example_of_an_arch_refusal_is_the_line_given():
    """docs/fairseq.md's example line, word for word: a fairseq checkpoint whose recorded settings
    have layer drop."""
    from nmtkit.backends.fairseq import convert

    with pytest.raises(UserError) as e:
        convert.arch_config({**_fairseq_args(), "arch": "transformer", "encoder_layerdrop": 0.2}, "model.pt")
    line = f"nmtkit: error: {e.value}"
    doc = _flat((REPO / "docs/fairseq.md").read_text(encoding="utf-8"))
    assert line in doc, line


def test_import_fairseq_output_replaces_an_import_and_refuses_other_checkpoints(tmp_path, run_cli):
    """An earlier import at --output is replaced; a checkpoint of another kind is refused and kept."""
    from tests.test_fairseq_import import GOLDEN

    a = GOLDEN / "a"
    flags = ["-s", "src", "-t", "tgt", "--bpe", "sentencepiece", "--sentencepiece-model", a / "spm.model"]
    out = tmp_path / "m.pt"
    r = run_cli("import-fairseq", a / "checkpoint.pt", "-o", out, "--data-dir", tmp_path / "d1", *flags)
    assert r.code == 0, r
    r = run_cli("import-fairseq", a / "checkpoint.pt", "-o", out, "--data-dir", tmp_path / "d2", *flags)
    assert r.code == 0, r  # an earlier import is replaced
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)  # a PyTorch checkpoint that is not nmtkit's
    before = foreign.read_bytes()
    r = run_cli("import-fairseq", a / "checkpoint.pt", "-o", foreign, "--data-dir", tmp_path / "d3", *flags)
    assert f"--output {foreign} is " in _one_line(r) and "choose another output" in r.err
    assert foreign.read_bytes() == before and not (tmp_path / "d3").exists()


def test_import_fairseq_output_refuses_a_trained_nmtkit_checkpoint(tmp_path, run_cli):
    from tests.test_fairseq_import import GOLDEN

    _, trained = _tiny_checkpoint(tmp_path)  # nmtkit's own checkpoint, not an import
    before = trained.read_bytes()
    r = run_cli("import-fairseq", GOLDEN / "a" / "checkpoint.pt", "-o", trained, "--data-dir", tmp_path / "d",
                "-s", "src", "-t", "tgt")
    assert trained.read_bytes() == before
    assert "--output" in _one_line(r) and not (tmp_path / "d").exists()


# --------------------------------------------------------------------------------- serve.md: serving an export


@needs_ct2
def test_serve_refuses_a_damaged_export_before_it_listens(ct2, tmp_path, run_cli):
    d = tmp_path / "damaged"
    shutil.copytree(ct2["out"], d)
    (d / "model.bin").unlink()
    r = run_cli("serve", "--path", d, "--port", "0", "--lenpen-form", "fairseq")
    assert f"{d / 'model.bin'}: missing (listed in nmtkit.json); export the model again" in _one_line(r)
    assert "listening" not in r.err


@needs_ct2
@needs_serve
def test_attention_on_a_served_export_is_501(ct2):
    import httpx

    from nmtkit.search.config import SearchConfig
    from nmtkit.serving.options import ServeOptions
    from tests.test_serve import running

    out = str(ct2["out"])
    opts = ServeOptions.from_flags({
        **{k: getattr(ServeOptions(paths=[out]), k) for k in ServeOptions.__dataclass_fields__},
        "paths": [out], "data_dir": None, "port": 0, "threads": 1,
        "search": {**SearchConfig().__dict__, "lenpen_form": None, "max_len_b": None, "early_stop": None},
    })
    opts.validate()
    with running(opts) as (url, _, _):
        assert httpx.get(f"{url}/info", timeout=60).json()["attention"] is False
        r = httpx.post(f"{url}/attention", json={"text": "w1 w2"}, timeout=60)
    assert r.status_code == 501, r.text
    assert r.json() == {"error": "this model runs on ctranslate2, which gives no attention weights; serve the "
                                 "nmtkit checkpoint"}
