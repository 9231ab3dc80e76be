"""The Hugging Face side of what a new user meets first: an export, made to be published, holds no
path of the machine that made it, and transformers' default MarianConfig (unscaled embeddings)
imports and translates as transformers translates it.

The references: the export of test_generate.py's tiny model is read back as text; the MarianMT
is test_huggingface.py's tiny random one, with `scale_embedding` false, run by transformers
itself. Skipped without the `hf` extra.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install -e '.[hf]' in the nmtkit checkout")

from tests.test_generate import setup  # noqa: E402,F401 - fixture
from tests.test_huggingface import LIMIT_B, QUIET, hf_generate, marian, sentences  # noqa: E402,F401 - fixture

# an absolute path: a slash that starts a word, then at least one folder (`docs/export.md`,
# `</s>` and URLs do not match)
ABSOLUTE = re.compile(r"(?<![\w.:/<])/(?:[\w.-]+/)+[\w.-]*")


def test_an_export_holds_no_path_of_the_exporting_machine(setup, tmp_path, run_cli):  # noqa: F811
    data, ckpt, _, _ = setup
    score = tmp_path / "score.txt"
    score.write_text("BLEU = 12.50 40.0/20.0/10.0/5.0 (BP = 1.000 ratio = 1.000 hyp_len = 10 ref_len = 10) | "
                     "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0 | lines: 7\n")
    out = tmp_path / "hf"
    r = run_cli("export", Path(data).resolve(), "--path", Path(ckpt).resolve(), "--format", "huggingface",
                "--output", out.resolve(), "--score-file", score.resolve())
    assert r.code == 0, r
    texts = {p.name: p.read_text(encoding="utf-8") for p in out.iterdir() if p.suffix in (".md", ".json", ".txt")}
    assert {"README.md", "config.json", "generation_config.json", "nmtkit.json", "tokenizer_config.json"} <= set(texts)
    machine = {str(tmp_path), str(Path(data).resolve().parent), str(Path.home()), tempfile.gettempdir(), os.getcwd()}
    for name, text in texts.items():
        for s in machine:
            assert len(s) < 2 or s not in text, (name, s)
        assert not ABSOLUTE.search(text), (name, ABSOLUTE.search(text).group())
    # what the card and nmtkit.json record instead: the names, and the checkpoint's sha256
    info = json.loads(texts["nmtkit.json"])
    assert info["checkpoint"]["file"] == Path(ckpt).name
    card = texts["README.md"]
    assert f"- checkpoint: {Path(ckpt).name} (sha256 {info['checkpoint']['sha256']})" in card
    assert (f"`nmtkit export {Path(data).name} --path {Path(ckpt).name} --format huggingface --output hf "
            "--score-file score.txt`") in card
    assert "- name: hf\n" in card
    assert ABSOLUTE.search(f"see {tmp_path}/x")  # guard: the pattern finds an absolute path


@pytest.fixture(scope="module")
def unscaled(marian, tmp_path_factory):
    """test_huggingface.py's MarianMT folder with transformers' default scale_embedding (false:
    the key left out, as a MarianConfig() writes it only when told), loaded by transformers."""
    from transformers import MarianMTModel

    d = tmp_path_factory.mktemp("unscaled") / "opus"
    shutil.copytree(marian["dir"], d)
    config = json.loads((d / "config.json").read_text())
    del config["scale_embedding"]
    (d / "config.json").write_text(json.dumps(config))
    model = MarianMTModel.from_pretrained(d).eval()
    assert model.config.scale_embedding is False and model.model.encoder.embed_scale == 1.0
    return {"dir": d, "model": model, "scaled": marian["model"]}


def test_unscaled_embeddings_import_and_search_as_transformers(unscaled, tmp_path, run_cli):
    """import-hf of a MarianMT with scale_embedding false: nmtkit's greedy search gives
    transformers' outputs (transformers told to ban <pad>, as nmtkit always does), which differ
    from those of the same weights scaled."""
    from transformers import MarianTokenizer

    from nmtkit import Translator

    r = run_cli("import-hf", unscaled["dir"], "-o", tmp_path / "m.pt", "--data-dir", tmp_path / "data")
    assert r.code == 0, r.err
    assert "unscaled embeddings" in r.out
    state = torch.load(tmp_path / "m.pt", weights_only=True)
    assert state["arch_config"]["scale_embedding"] is False
    texts = sentences(60, 5)
    tok = MarianTokenizer.from_pretrained(unscaled["dir"])
    model = unscaled["model"]
    got = hf_generate(model, tok, texts, 1, suppress_tokens=[model.config.pad_token_id])
    scaled = hf_generate(unscaled["scaled"], tok, texts, 1, suppress_tokens=[model.config.pad_token_id])
    native = Translator.load(tmp_path / "m.pt", tmp_path / "data", **QUIET, max_len_b=LIMIT_B)
    want = native.translate_nbest(texts, beam=1)
    inv = {i: t for t, i in tok.target_encoder.items()}
    assert [[inv[i] for i in g] for g in got] == [[native.tgt_dict[i] for i in w[0].hypothesis.tokens] for w in want]
    assert sum(a != b for a, b in zip(got, scaled)) > 10  # guard: the scale changes the outputs


def test_unscaled_embeddings_export_back_to_huggingface_only(unscaled, tmp_path, run_cli):
    """The export writes scale_embedding false, and the round trip keeps it; the runtimes that
    have only the paper's scale refuse the model in one line naming the setting."""
    r = run_cli("import-hf", unscaled["dir"], "-o", tmp_path / "m.pt", "--data-dir", tmp_path / "data")
    assert r.code == 0, r.err
    r = run_cli("export", tmp_path / "data", "--path", tmp_path / "m.pt", "--format", "huggingface",
                "--output", tmp_path / "hf")
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["scale_embedding"] is False
    r = run_cli("import-hf", tmp_path / "hf", "-o", tmp_path / "back.pt", "--data-dir", tmp_path / "back")
    assert r.code == 0, r.err
    a, b = (torch.load(p, weights_only=True) for p in (tmp_path / "m.pt", tmp_path / "back.pt"))
    assert a["arch_config"] == b["arch_config"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for fmt, runtime in (("ctranslate2", "CTranslate2"), ("onnx", "ONNX")):
        r = run_cli("export", tmp_path / "data", "--path", tmp_path / "m.pt", "--format", fmt,
                    "--output", tmp_path / fmt)
        lines = [line for line in r.err.splitlines() if line.strip()]
        assert r.code == 2 and len(lines) == 1, (fmt, r)
        if "is not installed" in lines[0] or "pip install" in lines[0]:
            continue  # the runtime is absent: its own refusal comes first
        assert lines[0] == (f"nmtkit: error: --scale-embedding False: the {runtime} export does not represent this "
                            "setting (only its default); translate with the checkpoint and its data directory")
