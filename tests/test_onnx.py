"""`nmtkit export --format onnx` and the ONNX Runtime engine (docs/export.md).

The reference is nmtkit itself: the graphs must compute the model's own log-probabilities, and
ONNX Runtime stepping through them under the numpy search must give native search's hypotheses
(its default rules: the GNMT length penalty and the exact stopping rule) with scores within 1e-4.
The engine must never import torch. Skipped when onnxruntime is not installed.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nmtkit.errors import UserError
from nmtkit.models.registry import ARCHS, ArchConfig

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install -e '.[onnx]' in the nmtkit checkout")
pytest.importorskip("onnx", reason="onnx is not installed: pip install -e '.[onnx]' in the nmtkit checkout")

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-4
PRINTED_STEP = 1e-4  # generate prints scores with 4 decimals: one step apart after rounding


def tiny(cfg: ArchConfig, vocab: int, seed: int, peak: float = 3.0):
    """A random Transformer whose output layer is sharpened (search has clear, varied choices)."""
    from nmtkit.models import Transformer

    torch.manual_seed(seed)
    model = Transformer(cfg, vocab, vocab).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(peak)
    return model


def graphs_of(model, folder: Path, quantization: str = "float32"):
    from nmtkit.backends.onnx import convert
    from nmtkit.backends.onnx.engine import Graphs

    folder.mkdir()
    tokens = [str(i) for i in range(model.tgt_vocab_size)]
    record = convert.write(convert.prepare(model, tokens, tokens), folder, quantization)
    return Graphs.load(folder, threads=1), record


PRE = ArchConfig(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, d_k=4, d_v=12, dropout=0.0,
                 normalize_before=True, learned_pos=True, share_embeddings="none", max_source_positions=40,
                 max_target_positions=40)
POST = dataclasses.replace(PRE, d_k=None, d_v=None, normalize_before=False, learned_pos=False,
                           share_embeddings="all")
# the settings of imported models (fairseq: biases, its sinusoids, </s> first; Hugging Face: GELU/SiLU)
FAIRSEQ_GELU = dataclasses.replace(POST, attention_bias=True, sinusoid="fairseq", decoder_start="eos",
                                   activation="gelu")
SWISH = dataclasses.replace(PRE, attention_bias=True, activation="swish")
# the encoder layer without a residual around its self-attention (zero-shot multilingual models)
NO_RES_POST = dataclasses.replace(POST, encoder_no_residual_layer=2)
NO_RES_PRE = dataclasses.replace(PRE, encoder_no_residual_layer=1)


@pytest.mark.parametrize("cfg", [POST, PRE, FAIRSEQ_GELU, SWISH, NO_RES_POST, NO_RES_PRE],
                         ids=["post", "pre", "fairseq-gelu", "swish", "no-residual-post", "no-residual-pre"])
def test_onnx_runtime_search_equals_native_search(cfg, tmp_path):
    """Post-norm with tied embeddings and sinusoids; pre-norm, learned positions, d_k != d_v; and
    the settings of imported models: attention biases (random here: they start at zero),
    fairseq's sinusoids, decoding from </s>, GELU and SiLU."""
    from nmtkit.search import arrays
    from nmtkit.search.beam import search
    from nmtkit.search.config import SearchConfig

    torch.set_num_threads(1)
    model = tiny(cfg, 20, seed=3)
    if cfg.attention_bias:
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "attn" in name and name.endswith("bias"):
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    graphs, record = graphs_of(model, tmp_path / "m")
    assert record["check"]["float32_max_logprob_diff"] < 1e-4
    rng = np.random.default_rng(1)
    rows = [rng.integers(4, 20, n) for n in (7, 1, 12, 3, 5)]
    src = np.zeros((len(rows), 13), np.int64)
    for r, ids in enumerate(rows):
        src[r, : len(ids)], src[r, len(ids)] = ids, 2
    for extra in (dict(beam=4, nbest=3), dict(beam=1), dict(beam=3, lenpen=1.0, lenpen_form="fairseq",
                                                            early_stop="beam", min_len=2, no_repeat_ngram_size=2)):
        cfg_s = SearchConfig(max_len_a=1.0, max_len_b=4, **extra)
        with torch.inference_mode():
            native = search(model, torch.from_numpy(src), cfg_s)
        mine = arrays.search(graphs, src, cfg_s)
        for a, b in zip(mine, native):
            assert [h.tokens for h in a] == [h.tokens for h in b], extra
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=TOL)
        if extra.get("nbest"):
            assert len({tuple(h.tokens) for hyps in native for h in hyps}) >= 10  # varied: not one token repeated
    # sampling: rows retire one by one, so the graphs' encoder rows are copied per row; the same
    # seed over the same distributions (the torch model behind the array interface) draws the same
    from tests.test_search_arrays import AsArrays

    cfg_s = SearchConfig(max_len_a=1.0, max_len_b=12, sampling=True, beam=5, nbest=5, seed=11)
    mine, ref = arrays.search(graphs, src, cfg_s), arrays.search(AsArrays(model), src, cfg_s)
    assert [[h.tokens for h in hs] for hs in mine] == [[h.tokens for h in hs] for hs in ref]
    assert [h.score for hs in mine for h in hs] == pytest.approx([h.score for hs in ref for h in hs], abs=TOL)
    assert any(len({len(h.tokens) for h in hs}) > 1 for hs in mine)  # a sentence's samples end at different steps


def _shrunk(cfg):
    small = lambda v: None if v is None else max(1, v // 16)  # noqa: E731
    return cfg.replace(d_model=cfg.d_model // 16, d_ff=cfg.d_ff // 16, d_k=small(cfg.d_k), d_v=small(cfg.d_v),
                       max_source_positions=40, max_target_positions=40)


@pytest.mark.parametrize("name", ["transformer_base_dk16", "transformer_base_h1_dk512", "transformer_parse",
                                  "transformer_base_learned_pos", "transformer_big"])
def test_registry_architectures_convert_exactly(name, tmp_path):
    """The export's own check (ONNX Runtime stepping with its caches against torch's teacher-forced
    log-probabilities) passes within 1e-4 for the registry's shapes (one head, d_k != d_v,
    untied embeddings, learned positions, 6 layers)."""
    _, record = graphs_of(tiny(_shrunk(ARCHS[name]), 30, seed=0, peak=1.0), tmp_path / "m")
    assert record["check"]["float32_max_logprob_diff"] < 1e-4


def test_the_check_refuses_graphs_that_differ(tmp_path):
    """The self-check is real: a reference the graphs do not meet is refused in one line."""
    from nmtkit.backends.onnx import convert

    model = tiny(POST, 20, seed=0)
    prepared = convert.prepare(model, [str(i) for i in range(20)], [str(i) for i in range(20)])
    prepared.reference["log_probs"][1, 2, 7] += 0.01
    (tmp_path / "m").mkdir()
    with pytest.raises(UserError, match=r"^the ONNX graphs in .* do not reproduce the model: log-probabilities "
                                        r"differ from torch's by 0\.01 \(tolerance 0\.001\)"):
        convert.write(prepared, tmp_path / "m", "float32")


def test_int8_quantizes_the_weight_products_only(tmp_path):
    import onnx

    model = tiny(POST, 20, seed=0, peak=1.0)
    _, record = graphs_of(model, tmp_path / "m", "int8")
    assert record["check"]["int8_max_logprob_diff"] <= record["check"]["int8_tolerance"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "m" / "decoder.onnx")).graph.node]
    # per decoder layer: q|k|v, self out, cross q, cross out, fc1, fc2; and the output layer
    assert ops.count("MatMulInteger") == 6 * POST.decoder_layers + 1
    assert ops.count("MatMul") == 4 * POST.decoder_layers  # the attention products stay float32


def test_steps_over_reordered_rows_give_torch_log_probs(tmp_path):
    """The decoder step with the engine's caches, through beam-like reorders of the rows (each
    row continuing a row of its sentence) and a sentence leaving, gives torch's teacher-forced
    log-probabilities of each row's history."""
    model = tiny(PRE, 20, seed=2)
    graphs, _ = graphs_of(model, tmp_path / "m")
    rng = np.random.default_rng(4)
    src = np.array([[5, 6, 7, 2, 0], [8, 2, 0, 0, 0], [9, 10, 11, 12, 2]], np.int64)
    g = 2  # rows per sentence
    sentence = np.repeat(np.arange(3), g)  # (N,) each row's sentence
    enc = graphs.select_enc(graphs.encode(src), sentence)
    hist, cache = np.ones((len(sentence), 1), np.int64), graphs.new_cache()  # <s>
    for t in range(10):
        lp, cache = graphs.step(hist[:, -1], enc, cache)
        with torch.inference_mode():
            want = torch.log_softmax(model(torch.from_numpy(src[sentence]), torch.from_numpy(hist)), -1)[:, -1]
        np.testing.assert_allclose(lp, want.numpy(), atol=TOL)
        order = np.arange(len(sentence)) // g * g + rng.integers(0, g, len(sentence))
        if t == 6:
            order = order[sentence != 1]  # the second sentence leaves
        hist = np.concatenate([hist[order], rng.integers(4, 20, (len(order), 1))], axis=1)
        sentence = sentence[order]
        enc, cache = graphs.select_enc(enc, order), graphs.select_cache(cache, order)
    assert list(sentence) == [0, 0, 2, 2] and len(set(map(tuple, hist.tolist()))) == 4  # varied histories


# ------------------------------------------------------------------------ the command line, end to end


@pytest.fixture(scope="module")
def wm(tmp_path_factory):
    """A word-mapping data directory and a random pre-norm checkpoint for it; its ONNX export."""
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.cli import main
    from nmtkit.data.manifest import load_dictionaries
    from tests.conftest import word_mapping_data_dir

    root = tmp_path_factory.mktemp("onnx")
    data = word_mapping_data_dir(root, 40, 4, 10, seed=0)
    src_dict, tgt_dict = load_dictionaries(data)
    model = tiny(PRE, len(src_dict), seed=4)
    with torch.no_grad():  # </s> less likely: outputs of a few tokens rather than empty ones
        model.out_proj.weight[tgt_dict.eos].mul_(0.2)
    ckpt = root / "ckpt.pt"
    save_checkpoint({"arch": "test", "arch_config": PRE.to_dict(), "model": model.state_dict(),
                     "dictionaries": {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256,
                                      "src_size": len(src_dict), "tgt_size": len(tgt_dict)}}, ckpt)
    out = root / "m-onnx"
    with pytest.raises(SystemExit) as e:
        main(["export", str(data), "--path", str(ckpt), "--format", "onnx", "--output", str(out)])
    assert e.value.code == 0
    inputs = root / "in.de"
    rng = np.random.default_rng(0)
    lines = [" ".join(f"w{i}" for i in rng.integers(0, 10, rng.integers(1, 9))) for _ in range(12)]
    inputs.write_text("\n".join(lines[:4] + ["", "w3 zebra w1"] + lines[4:]) + "\n", encoding="utf-8")
    return {"root": root, "data": data, "ckpt": ckpt, "out": out, "inputs": inputs}


def test_export_directory_holds_the_graphs_and_its_description(wm):
    info = json.loads((wm["out"] / "nmtkit.json").read_text())
    assert info["runtime"]["name"] == "onnx" and info["runtime"]["quantization"] == "float32"
    assert info["runtime"]["files"] == ["decoder.onnx", "encoder.onnx"]
    assert info["runtime"]["check"]["float32_max_logprob_diff"] < 1e-4
    sess = ort.InferenceSession(str(wm["out"] / "decoder.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    assert names[:4] == ["tokens", "src_bias", "self_k_0", "self_v_0"] and "cross_k_1" in names
    assert [o.name for o in sess.get_outputs()][:2] == ["log_probs", "self_k_out_0"]


def test_generate_on_the_export_equals_native_generate(wm, tmp_path, run_cli):
    native, onnx_out = tmp_path / "native.txt", tmp_path / "onnx.txt"
    common = ("--input", wm["inputs"], "--quiet", "--threads", "1", "--format", "fairseq", "--nbest", "2",
              "--min-len", "2", "--no-repeat-ngram-size", "2")
    r = run_cli("generate", wm["data"], "--path", wm["ckpt"], "--output", native, *common)
    assert r.code == 0, r
    r = run_cli("generate", "--path", wm["out"], "--output", onnx_out, *common)
    assert r.code == 0, r
    a, b = native.read_text().splitlines(), onnx_out.read_text().splitlines()
    assert len(a) == len(b) > 20
    for x, y in zip(a, b):  # S-, H-, D-, P- lines: the same text, every score within 1e-4
        xs, ys = x.split("\t"), y.split("\t")
        assert len(xs) == len(ys)
        for fx, fy in zip(xs, ys):
            try:
                nx, ny = [float(v) for v in fx.split()], [float(v) for v in fy.split()]
            except ValueError:
                assert fx == fy
            else:
                assert nx == pytest.approx(ny, abs=TOL + PRINTED_STEP)  # within TOL, then rounded to 4 decimals


SETTINGS = {"min_len": 2, "no_repeat_ngram_size": 1}  # varied outputs from a random model


def test_the_engine_never_imports_torch(wm):
    """Loading and translating in a fresh process leaves torch unimported, and gives native's output."""
    from nmtkit import Translator

    lines = wm["inputs"].read_text(encoding="utf-8").splitlines()
    code = ("import json, sys; from nmtkit import Translator; tr = Translator.load(sys.argv[1], threads=1); "
            "out = tr.translate(json.loads(sys.argv[2]), **json.loads(sys.argv[3])); print(json.dumps(['torch' in sys.modules, out]))")
    r = subprocess.run([sys.executable, "-c", code, str(wm["out"]), json.dumps(lines), json.dumps(SETTINGS)],
                       capture_output=True,
                       text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    imported, out = json.loads(r.stdout)
    assert imported is False
    assert out == Translator.load(wm["ckpt"], wm["data"], threads=1).translate(lines, **SETTINGS)
    assert len(set(out)) >= 5  # not one output for every input


@pytest.mark.parametrize("args,message", [
    (["--precision", "bf16"], "--precision bf16: the ONNX export runs in float32"),
    (["--device", "cuda"], "--device cuda: the ONNX Runtime engine runs on the CPU"),
    (["--quantize", "int8"], "runs with the weight type chosen when it was exported"),
    (["--ema"], "holds the weights chosen when it was exported (nmtkit export --ema)"),
    (["--print-alignment"], "is run by ONNX Runtime, which nmtkit does not read attention or forced scores from"),
    (["--constraints"], "ONNX Runtime has no constrained search"),
])
def test_generate_refuses_what_the_engine_cannot_honour(wm, run_cli, args, message):
    r = run_cli("generate", "--path", wm["out"], "--input", wm["inputs"], *args)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r


def test_serve_on_the_export(wm):
    """`nmtkit serve --path ONNX_DIR` (its flags' defaults: native's rules) answers as the Translator."""
    httpx = pytest.importorskip("httpx")
    from nmtkit import Translator
    from nmtkit.search.config import SearchConfig
    from nmtkit.serving.options import ServeOptions
    from tests.test_serve import post, running

    out = str(wm["out"])
    opts = ServeOptions.from_flags({
        **{k: getattr(ServeOptions(paths=[out]), k) for k in ServeOptions.__dataclass_fields__},
        "paths": [out], "data_dir": None, "port": 0, "threads": 1,
        "search": {**SearchConfig().__dict__, "lenpen_form": None, "max_len_b": None, "early_stop": None},
    })
    opts.validate()
    texts = wm["inputs"].read_text(encoding="utf-8").splitlines()
    with running(opts) as (url, _, _):
        assert httpx.get(f"{url}/info").json()["model"]["runtime"] == "onnx"
        r = post(url, {"text": texts})
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == Translator.load(wm["ckpt"], wm["data"], threads=1).translate(texts)


def test_without_the_extra_one_line_says_what_to_install(wm, tmp_path, run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    r = run_cli("generate", "--path", wm["out"], "--input", wm["inputs"])
    assert r.code == 2 and r.err == "nmtkit: error: the ONNX Runtime is not installed: pip install -e '.[onnx]' in the nmtkit checkout\n", r
    monkeypatch.setitem(sys.modules, "onnx", None)
    r = run_cli("export", wm["data"], "--path", wm["ckpt"], "--format", "onnx", "--output", tmp_path / "x")
    assert r.code == 2 and r.err == "nmtkit: error: the onnx package is not installed: pip install -e '.[onnx]' in the nmtkit checkout\n", r
    assert not (tmp_path / "x").exists()


def test_the_documented_loop_without_nmtkit_gives_greedy_search(wm, monkeypatch):
    """docs/export.md's greedy loop (onnxruntime and sentencepiece alone) gives nmtkit's greedy
    output; sentencepiece is stood in for by whitespace splitting (this data has no subwords)."""
    import re
    import types

    from nmtkit import Translator

    doc = (REPO / "docs" / "export.md").read_text(encoding="utf-8")
    code = next(b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "import onnxruntime as ort" in b)
    info = json.loads((wm["out"] / "nmtkit.json").read_text())
    dicts = {lang: e["file"] for lang, e in info["data"]["dictionaries"].items() if isinstance(e, dict)}
    code = code.replace('d = "m30k-onnx"', f'd = {str(wm["out"])!r}').replace(
        'f"{d}/dict.{lang}.txt"', 'f"{d}/" + DICTS[lang]').replace('print(translate("Ein Mann schläft."))', "")
    fake = types.ModuleType("sentencepiece")
    fake.SentencePieceProcessor = lambda model_file: types.SimpleNamespace(
        encode=lambda s, out_type: s.split(), decode=lambda pieces: " ".join(pieces))
    monkeypatch.setitem(sys.modules, "sentencepiece", fake)
    ns = {"DICTS": dicts}
    exec(compile(code, "docs/export.md", "exec"), ns)
    lines = [x for x in wm["inputs"].read_text(encoding="utf-8").splitlines() if x.strip()]
    limit = PRE.max_target_positions - 1
    want = Translator.load(wm["out"], threads=1, beam=1, max_len_a=0.0, max_len_b=limit).translate(lines)
    assert [ns["translate"](x, max_len=limit) for x in lines] == want
    assert any(want)


def test_sampling_on_the_export_is_seeded(wm):
    from nmtkit import Translator

    lines = [x for x in wm["inputs"].read_text(encoding="utf-8").splitlines() if x.strip()]
    tr = Translator.load(wm["out"], threads=1, sampling=True, beam=4, nbest=4, seed=7)
    texts = lambda res: [[t.text for t in r] for r in res]  # noqa: E731
    first = tr.translate_nbest(lines)
    assert texts(first) == texts(tr.translate_nbest(lines))  # --seed: the same samples on every call
    assert all(len(r) == 4 and [t.score for t in r] == sorted((t.score for t in r), reverse=True) for r in first)
    assert len({t.text for r in first for t in r}) > len(lines)  # they are samples
    greedy = Translator.load(wm["out"], threads=1, beam=1).translate(lines)
    assert [r[0].text for r in tr.translate_nbest(lines, topk=1)] == greedy


def test_a_parsing_export_gives_native_trees(tmp_path, run_cli):
    """The parsing model (separate vocabularies, untied embeddings): an ONNX export repairs the
    same trees as native generate, with the parsing output limit (input + 300)."""
    from nmtkit import Translator
    from nmtkit.cli import main
    from tests.test_parsing_pipeline import check_trees, make_checkpoint, write_inputs

    write_inputs(tmp_path)
    data = tmp_path / "data"
    with pytest.raises(SystemExit) as e:
        main(["preprocess", "--task", "parsing", "--trainpref", str(tmp_path / "train"), "--extra-train",
              str(tmp_path / "more.trees"), "--validpref", str(tmp_path / "valid"), "--destdir", str(data),
              "--bpe", "none"])
    assert e.value.code == 0
    ckpt = make_checkpoint(data, tmp_path / "m.pt", favour=("(NP", "NN", ")NP"))
    out = tmp_path / "parse-onnx"
    assert run_cli("export", data, "--path", ckpt, "--format", "onnx", "--output", out).code == 0
    words = ["Pierre Vinken will join the board .", "", "a ( b ) c"]
    f = tmp_path / "in.words"
    f.write_text("\n".join(words) + "\n", encoding="utf-8")
    flags = ("--input", f, "--quiet", "--threads", "1", "--beam", "2", "--min-len", "6", "--max-len-b", "30")
    native, mine = run_cli("generate", data, "--path", ckpt, *flags), run_cli("generate", "--path", out, *flags)
    assert native.code == mine.code == 0, (native, mine)
    assert mine.out == native.out
    check_trees(mine.out.splitlines(), words)
    assert mine.out.startswith("(TOP (NP (NP ")  # the favoured brackets, repaired
    assert Translator.load(out, threads=1).search.max_len_b == 300



@pytest.mark.parametrize("engine", ["onnx", "ctranslate2"])
def test_sources_below_at_and_above_the_position_limit_as_native(wm, tmp_path, run_cli, engine):
    """The model takes 39 source tokens (40 positions, </s> the last): a source of 38 or 39 is
    translated whole, one of 40 or 60 is cut to 39 with the same warning; every engine gives
    native's hypotheses (scores within TOL) and warnings for each."""
    from nmtkit import Translator

    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install -e '.[ctranslate2]' "
                                                  "in the nmtkit checkout")
        out = tmp_path / "ct2"
        r = run_cli("export", wm["data"], "--path", wm["ckpt"], "--output", out)
        assert r.code == 0, r
    else:
        out = wm["out"]
    rng = np.random.default_rng(3)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 10, n)) for n in (38, 39, 40, 60)]
    settings = dict(threads=1, lenpen_form="fairseq", early_stop="beam", max_len_b=5)
    got = {}
    for name, path, data in (("native", wm["ckpt"], wm["data"]), (engine, out, None)):
        warnings: list[str] = []
        tr = Translator.load(path, data, warn=warnings.append, **settings)
        assert tr.max_source_tokens == 39, name
        got[name] = (tr.translate_nbest(texts, beam=1), warnings)  # greedy: the same rule at the output limit
    (native, native_warnings), (other, other_warnings) = got["native"], got[engine]
    assert native_warnings == other_warnings and len(native_warnings) == 2, (native_warnings, other_warnings)
    assert native_warnings[0].startswith("sentence 3: ") and "truncated to 39" in native_warnings[0]
    for x, y in zip(native, other):
        assert [t.hypothesis.tokens for t in x] == [t.hypothesis.tokens for t in y]
        assert [t.score for t in x] == pytest.approx([t.score for t in y], abs=TOL)
    assert any(t.text for row in other for t in row)  # guard: the model does translate
