"""`nmtkit import-fairseq` on checkpoints written by fairseq 0.12.2 (tests/golden/fairseq, made
by make_fixtures.sh there): the imported model's hypotheses and scores equal fairseq-generate's,
and what nmtkit cannot import is refused in one line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from nmtkit import Translator
from nmtkit.backends.fairseq import convert, unpickle
from nmtkit.backends.fairseq.importer import ImportOptions, import_fairseq
from nmtkit.errors import UserError

GOLDEN = Path(__file__).parent / "golden" / "fairseq"
# fairseq-generate's settings for the fixtures (--beam 5 --lenpen 1, max length 200) and its stopping rule
FAIRSEQ_SEARCH = dict(beam=5, lenpen=1.0, lenpen_form="fairseq", early_stop="beam", max_len_a=0.0, max_len_b=200)


def fairseq_hypotheses(path: Path) -> dict[int, tuple[float, str]]:
    """fairseq-generate's H- lines: sentence id -> (score in base 2, tokens)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("H-"):
            sid, score, tokens = line.split("\t")
            out[int(sid[2:])] = (float(score), tokens)
    return out


def run_import(tmp_path: Path, fixture: str, **flags) -> tuple[Path, Path]:
    out, data = tmp_path / f"{fixture}.pt", tmp_path / f"{fixture}-data"
    import_fairseq(ImportOptions(checkpoint=str(GOLDEN / fixture / "checkpoint.pt"), output=str(out),
                                 data_dir=str(data), source_lang="src", target_lang="tgt", **flags))
    return out, data


# import-fairseq's flags for each fixture (its subword model and, for b, Moses)
FIXTURE_FLAGS = {
    "a": dict(bpe="sentencepiece", sentencepiece_model=str(GOLDEN / "a" / "spm.model")),
    "b": dict(bpe="subword_nmt", bpe_codes=str(GOLDEN / "b" / "bpecodes"), tokenizer="moses",
              moses_source_lang="en", moses_target_lang="en"),
    "c": dict(bpe="sentencepiece", sentencepiece_model=str(GOLDEN / "c" / "spm.model")),
}


def assert_fairseq_output(tr: Translator, fixture: str) -> tuple[list[str], dict]:
    """`tr` (on the imported model or an export of it) gives fairseq-generate's hypotheses for the
    fixture's raw test sentences, token for token, with its scores; -> the texts and fairseq's."""
    sources = (GOLDEN / fixture / "test.src").read_text(encoding="utf-8").splitlines()
    best = [nbest[0] for nbest in tr.translate_nbest(sources)]
    want = fairseq_hypotheses(GOLDEN / fixture / "generate.out")
    assert len(want) == len(sources) == 40
    assert [" ".join(t.pieces) for t in best] == [want[i][1] for i in range(len(sources))]
    for i, t in enumerate(best):  # fairseq prints log2-probabilities / |Y|^lenpen
        assert t.score / math.log(2) == pytest.approx(want[i][0], abs=1e-4)
    return [t.text for t in best], want


def check_against_fairseq(tmp_path: Path, fixture: str) -> tuple[Translator, list[str], dict]:
    out, data = run_import(tmp_path, fixture, **FIXTURE_FLAGS[fixture])
    tr = Translator.load(out, data, device="cpu", **FAIRSEQ_SEARCH)
    return (tr, *assert_fairseq_output(tr, fixture))


def test_post_norm_shared_embeddings_sentencepiece(tmp_path):
    """`transformer`, --share-all-embeddings, a joined dictionary, sentencepiece: raw text in."""
    tr, texts, want = check_against_fairseq(tmp_path, "a")
    assert tr.model_source.manifest["dictionaries"]["joined"] is True
    assert texts[0] == want[0][1].replace(" ", "").replace("\u2581", " ").strip()


def test_pre_norm_separate_dictionaries_moses_subword_nmt(tmp_path):
    """`transformer_wmt_en_de_big_t2t` (pre-norm, final layer norms) with learned positions and
    separate dictionaries, behind Moses and subword-nmt as the published WMT models: raw text in,
    detokenized text out."""
    from sacremoses import MosesDetokenizer

    tr, texts, want = check_against_fairseq(tmp_path, "b")
    cfg = torch.load(tmp_path / "b.pt", weights_only=True)["arch_config"]
    assert cfg["normalize_before"] and cfg["learned_pos"] and cfg["share_embeddings"] == "none"
    assert tr.model_source.manifest["dictionaries"]["joined"] is False
    detok = MosesDetokenizer(lang="en")
    assert texts == [detok.detokenize((want[i][1] + " ").replace("@@ ", "").split()) for i in range(40)]
    assert "," in texts[0] and " ," not in texts[0]  # detokenized


def test_gelu_and_decoder_only_tied_embeddings(tmp_path):
    """`transformer_iwslt_de_en` with --activation-fn gelu (torch's exact GELU in fairseq, as in
    nmtkit), separate dictionaries and --share-decoder-input-output-embed."""
    tr, texts, want = check_against_fairseq(tmp_path, "c")
    cfg = torch.load(tmp_path / "c.pt", weights_only=True)["arch_config"]
    assert cfg["activation"] == "gelu" and cfg["share_embeddings"] == "decoder" and not cfg["normalize_before"]
    assert tr.model_source.manifest["dictionaries"]["joined"] is False


@pytest.mark.parametrize("fmt,fixture", [("ctranslate2", "a"), ("ctranslate2", "b"), ("ctranslate2", "c"),
                                         ("onnx", "a"), ("onnx", "b"), ("onnx", "c")])
def test_an_imported_model_exported_gives_fairseq_generates_hypotheses(fmt, fixture, tmp_path):
    """Imported, then `nmtkit export`ed: CTranslate2 (its decoder started from </s>, as its own
    fairseq converter does) and ONNX Runtime under the numpy search (attention biases, fairseq's
    sinusoids, </s> first, GELU in the graphs) give fairseq-generate's hypotheses and scores."""
    pytest.importorskip({"ctranslate2": "ctranslate2", "onnx": "onnxruntime"}[fmt],
                        reason=f"the {fmt} extra is not installed: pip install -e '.[{fmt}]' in the nmtkit checkout")
    from nmtkit.backends.export import ExportOptions, export

    ckpt, data = run_import(tmp_path, fixture, **FIXTURE_FLAGS[fixture])
    export(ExportOptions(data_dir=str(data), path=str(ckpt), output=str(tmp_path / "export"), format=fmt))
    tr = Translator.load(tmp_path / "export", **FAIRSEQ_SEARCH)
    assert tr.engine.name == fmt
    assert_fairseq_output(tr, fixture)


def test_legacy_fused_projections_give_the_same_weights():
    """Checkpoints before 2019 fuse Q, K, V (`in_proj_weight`) and call the encoder's norms
    `layer_norms.0/1`: they map to the same nmtkit tensors."""
    state = unpickle.load(GOLDEN / "a" / "checkpoint.pt")
    sd = dict(state["model"])
    cfg = convert.arch_config(convert.model_args({"cfg": unpickle.plain(state["cfg"])}), "a")
    new = convert.weights(sd, cfg, "a")
    legacy = {}
    for name, t in sd.items():
        if ".self_attn." in name or ".encoder_attn." in name:
            prefix, _, rest = name.rpartition("_proj.")
            kind = rest
            module, x = prefix.rsplit(".", 1)
            if x in "qkv":
                legacy.setdefault(f"{module}.in_proj_{kind}", {})[x] = t
                continue
        name = name.replace("encoder.layers.0.self_attn_layer_norm", "encoder.layers.0.layer_norms.0")
        name = name.replace("encoder.layers.0.final_layer_norm", "encoder.layers.0.layer_norms.1")
        legacy[name] = t
    legacy = {k: torch.cat([v["q"], v["k"], v["v"]]) if isinstance(v, dict) else v for k, v in legacy.items()}
    assert "encoder.layers.0.self_attn.in_proj_weight" in legacy
    old = convert.weights(legacy, cfg, "a")
    assert old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in new)


@pytest.mark.parametrize("change,message", [
    ({"arch": "lstm"}, r"fairseq arch 'lstm' cannot be imported \(nmtkit imports transformer, "),
    ({"arch": "transformer_lm"}, r"fairseq arch 'transformer_lm' cannot be imported"),
    ({"encoder_layerdrop": 0.2}, r"arch 'transformer' with layer drop \(encoder_layerdrop=0.2\)"),
    ({"adaptive_input": True}, r"with adaptive input"),
    ({"activation_fn": "gelu_fast"}, r"with its activation \(activation_fn='gelu_fast'\) cannot be imported: nmtkit's "
                                     r"Transformer computes relu and gelu"),
    ({"decoder_embed_dim": 64}, r"encoder_embed_dim=32, decoder_embed_dim=64"),
    ({"decoder_normalize_before": True}, r"decoder_normalize_before=True"),
])
def test_unsupported_models_are_refused_naming_the_arch(change, message):
    state = unpickle.load(GOLDEN / "a" / "checkpoint.pt")
    args = convert.model_args({"cfg": unpickle.plain(state["cfg"])})
    with pytest.raises(UserError, match=message):
        convert.arch_config({**args, **change}, "ckpt.pt")


def test_label_smoothing_of_zero_is_kept():
    """A recorded 0.0 is the model's label smoothing (it was read as 'not given' and became 0.1)."""
    state = unpickle.load(GOLDEN / "a" / "checkpoint.pt")
    args = convert.model_args({"cfg": unpickle.plain(state["cfg"])})
    assert convert.arch_config({**args, "label_smoothing": 0.0}, "ckpt.pt").label_smoothing == 0.0
    assert convert.arch_config({**args, "label_smoothing": None}, "ckpt.pt").label_smoothing == 0.1


def test_refusals_write_nothing(tmp_path):
    a = GOLDEN / "a"
    common = dict(checkpoint=str(a / "checkpoint.pt"), output=str(tmp_path / "x.pt"), data_dir=str(tmp_path / "d"))
    with pytest.raises(UserError, match="does not record its languages; give --source-lang"):
        import_fairseq(ImportOptions(**common))
    with pytest.raises(UserError, match=r"source dictionary .*dict\.de\.txt: dictionary not found"):
        import_fairseq(ImportOptions(**common, source_lang="de", target_lang="en"))
    with pytest.raises(UserError, match=r"the target dictionary has 64 symbols .* but decoder.embed_tokens.weight has 104"):
        import_fairseq(ImportOptions(**common, source_lang="src", target_lang="tgt",
                                     tgtdict=str(GOLDEN / "b" / "dict.tgt.txt")))
    with pytest.raises(UserError, match="--bpe sentencepiece needs --sentencepiece-model"):
        import_fairseq(ImportOptions(**common, source_lang="src", target_lang="tgt", bpe="sentencepiece"))
    assert not (tmp_path / "x.pt").exists() and not (tmp_path / "d").exists()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "mine.txt").write_text("keep")
    with pytest.raises(UserError, match="is not empty; pass --force"):
        import_fairseq(ImportOptions(**common, source_lang="src", target_lang="tgt"))
    with pytest.raises(UserError):  # --force replaces an nmtkit data directory only
        import_fairseq(ImportOptions(**common, source_lang="src", target_lang="tgt", force=True))
    assert (tmp_path / "d" / "mine.txt").read_text() == "keep" and not (tmp_path / "x.pt").exists()


def test_cli_refuses_a_payload_in_one_line(tmp_path, run_cli):
    from tests.test_fairseq_unpickle import dumps, payloads, torch_file

    marker = tmp_path / "ran"
    path = torch_file(tmp_path / "evil.pt", dumps(payloads(marker)["os.system in the config"]))
    r = run_cli("import-fairseq", path, "--output", tmp_path / "out.pt", "--data-dir", tmp_path / "data")
    assert r.code == 2, r
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmtkit: error:") and "posix.system" in lines[0], r
    assert not marker.exists() and not (tmp_path / "out.pt").exists() and not (tmp_path / "data").exists()


def test_cli_imports_and_keeps_the_output_policy(tmp_path, run_cli):
    a = GOLDEN / "a"
    flags = ["-s", "src", "-t", "tgt", "--data-dir", tmp_path / "d", "--bpe", "sentencepiece",
             "--sentencepiece-model", a / "spm.model"]
    r = run_cli("import-fairseq", a / "checkpoint.pt", "--output", a / "checkpoint.pt", *flags)
    assert r.code == 2 and "is the same file as CHECKPOINT" in r.err, r
    r = run_cli("import-fairseq", a / "checkpoint.pt", "-o", tmp_path / "m.pt", *flags)
    assert r.code == 0, r
    assert "fairseq transformer (src->tgt, 46,080 parameters, dictionaries 104 / 104)" in r.out
    r = run_cli("generate", tmp_path / "d", "--path", tmp_path / "m.pt", "--input", a / "test.src",
                "--decoding", "fairseq", "--beam", "5", "--lenpen", "1", "--max-len-a", "0", "--max-len-b", "200",
                "--format", "fairseq", "-q")
    want = fairseq_hypotheses(a / "generate.out")
    got = {int(line.split("\t")[0][2:]): line.split("\t")[2] for line in r.out.splitlines() if line.startswith("H-")}
    assert r.code == 0 and got == {i: t for i, (_, t) in want.items()}, r


def test_preprocess_with_an_imported_moses_directory_moses_tokenizes_the_new_text(tmp_path):
    """`preprocess --srcdict/--tgtdict` of an imported directory whose text goes through Moses
    before subword-nmt passes that step on: the new shards hold the ids the imported model's own
    encoding gives (not those of the untokenized text), the new manifest keeps the step under its
    language names, and a directory without the step cannot be mixed in."""
    from nmtkit.data.dictionary import Dictionary
    from nmtkit.data.preprocess import PreprocessConfig, load_manifest, preprocess
    from nmtkit.data.shards import load_split
    from nmtkit.data.subwords import SubwordNmtModel, load_subword_model

    _, data = run_import(tmp_path, "b", **FIXTURE_FLAGS["b"])
    text = (GOLDEN / "b" / "test.src").read_text(encoding="utf-8").splitlines()
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("src", "tgt"):
        (raw / f"train.{lang}").write_text("".join(t + "\n" for t in text), encoding="utf-8")

    def cfg(dest, tgtdict):
        return PreprocessConfig(source_lang="src", target_lang="tgt", trainpref=str(raw / "train"), destdir=str(dest),
                                max_len=0, ratio=0, workers=2, srcdict=str(data), tgtdict=str(tgtdict))

    new = tmp_path / "new"
    preprocess(cfg(new, data))
    assert load_manifest(new)["subword"]["pretokenizer"] == load_manifest(data)["subword"]["pretokenizer"] == {
        "kind": "moses", "langs": {"src": "en", "tgt": "en"}, "aggressive_dash_splits": True, "escape": True}
    imported = load_subword_model(data, "src")
    d = Dictionary.load(data / "dict.src.txt")
    ds = load_split(new, "train", "src")
    assert [ds[i].tolist() for i in range(len(ds))] == [[d.index(t) for t in imported.encode(x)] for x in text]
    untokenized = SubwordNmtModel(GOLDEN / "b" / "bpecodes")
    assert sum(imported.encode(x) != untokenized.encode(x) for x in text) > 10  # Moses matters for this text
    assert load_subword_model(new, "src").encode(text[0]) == imported.encode(text[0])

    _, plain = run_import(tmp_path / "a", "a", **FIXTURE_FLAGS["a"])
    with pytest.raises(UserError, match=r"--srcdict .* Moses-tokenizes text before its subword model and --tgtdict "):
        preprocess(cfg(tmp_path / "mixed", plain))
    assert not (tmp_path / "mixed").exists()
