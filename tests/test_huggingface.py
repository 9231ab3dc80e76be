"""Hugging Face interop (docs/export.md, "Hugging Face"): `nmtkit export --format huggingface`
gives a folder that `transformers` loads as a MarianMTModel and that searches as nmtkit does, and
`nmtkit import-hf` turns a MarianMT folder into a checkpoint and a data directory.

The references are the two libraries themselves: a tiny nmtkit model trained here on a
word-for-word task (sentencepiece, joined dictionary) is exported and `transformers`' generate
must give nmtkit's hypotheses (greedy: all inputs; beam with fairseq's rules); a tiny MarianMT
built with `transformers` (random weights, swish, separate vocabularies) is imported and nmtkit's
greedy search must give `transformers`' outputs. Skipped without the `hf` extra.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed: pip install -e '.[hf]' in the nmtkit checkout")

WORDS = "der Hund Katze Haus Baum läuft springt schläft groß klein rot blau ein zwei Mann Frau Kind Straße".split()
ENGLISH = dict(zip(WORDS, "the dog cat house tree runs jumps sleeps big small red blue a two man woman child street".split()))


def make_task(root: Path, updates: int = 120, **arch) -> dict:
    """A data directory of the word-for-word task and a model trained on it for `updates`."""
    from tests.test_export import word_task_data
    from nmtkit.training import trainer as T
    from nmtkit.training.config import TrainConfig

    root.mkdir(parents=True, exist_ok=True)
    data = word_task_data(root, 400, WORDS, ENGLISH)
    cfg = TrainConfig(data_dir=str(data), save_dir=str(root / "ckpt"), arch="transformer_tiny", max_tokens=300,
                      lr_scheduler="inverse_sqrt", lr=5e-3, warmup_updates=5, log_interval=1000,
                      progress_bar=False, threads=1, no_epoch_checkpoints=True, no_validate=True,
                      max_update=updates, arch_overrides={"dropout": 0.0, **arch})
    T.train(cfg)
    return {"root": root, "data": data, "ckpt": root / "ckpt" / "checkpoint_last.pt"}


NATIVE = dict(lenpen_form="fairseq", early_stop="beam")  # the rules transformers' beam search has
QUIET = dict(threads=1, warn=lambda msg: None)
LIMIT_B = 10  # --max-len-b of the comparisons: short outputs keep them cheap, and some reach it


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]
    return out + ["Hund Zebra Katze", "Straße"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The word-for-word task, a model trained on it, and its Hugging Face export (by the CLI)."""
    from nmtkit.cli import main

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hf")
    t = make_task(root, updates=150)
    score = root / "score.txt"
    score.write_text("BLEU = 35.26 73.2/49.0/32.9/22.8 (BP = 0.871 ratio = 0.879 hyp_len = 11386 ref_len = 12955) | "
                     "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0 | compound-split: no | lines: 1000\n")
    with pytest.raises(SystemExit) as e:
        main(["export", str(t["data"]), "--path", str(t["ckpt"]), "--format", "huggingface",
              "--output", str(root / "hf"), "--score-file", str(score)])
    assert e.value.code == 0
    return {**t, "hf": root / "hf"}


class EndAtTheLimit:
    """nmtkit's rule at the output limit as a transformers logits processor: only </s> may follow,
    with the model's own log-probability (transformers' forced_eos_token_id gives it 0)."""

    def __init__(self, eos: int, last: int):
        self.eos, self.last = eos, last  # last: the sequence length (with the start) at the limit

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] == self.last:
            keep = scores[:, self.eos].clone()
            scores[:] = -float("inf")
            scores[:, self.eos] = keep
        return scores


def hf_generate(model, tok, texts: list[str], beam: int, max_len_b: int = None, nmtkit_limit: bool = False,
                **kw) -> list[list[int]]:
    """transformers' hypotheses (ids without the start and </s>), with nmtkit's per-sentence output
    limit (source tokens + max_len_b, then </s>): inputs of one length are searched together.
    `nmtkit_limit`: end hypotheses at the limit as nmtkit does (`EndAtTheLimit`)."""
    from transformers import LogitsProcessorList

    max_len_b = LIMIT_B if max_len_b is None else max_len_b
    enc = [tok(t).input_ids for t in texts]
    out: list[list[int] | None] = [None] * len(texts)
    for n in sorted({len(e) for e in enc}):
        rows = [i for i, e in enumerate(enc) if len(e) == n]
        ids = torch.tensor([enc[i] for i in rows])
        if nmtkit_limit:
            eos = model.generation_config.eos_token_id
            kw.update(forced_eos_token_id=None,
                      logits_processor=LogitsProcessorList([EndAtTheLimit(eos, 1 + (n - 1) + max_len_b)]))
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=beam,
                                 max_new_tokens=(n - 1) + max_len_b + 1, do_sample=False, **kw)
        for i, row in zip(rows, gen.tolist()):
            row = row[1:]
            eos = model.generation_config.eos_token_id
            out[i] = row[: row.index(eos)] if eos in row else [t for t in row if t != model.config.pad_token_id]
    return out


def test_export_searches_as_nmtkit_in_plain_transformers(task):
    """transformers' generate on the export gives nmtkit's hypotheses: greedy on every input, beam
    search (fairseq's rules) on every input whose hypotheses end before the output limit; at the
    limit both end the hypothesis with </s>, but nmtkit scores it with the model's </s>
    log-probability and transformers' forced </s> with 0, so their ranking may differ there. Its
    tokenizer gives nmtkit's source ids."""
    from transformers import MarianMTModel, MarianTokenizer

    from nmtkit import Translator

    texts = sentences(50, 1)
    tok = MarianTokenizer.from_pretrained(task["hf"])
    model = MarianMTModel.from_pretrained(task["hf"]).eval()
    native = Translator.load(task["ckpt"], task["data"], **QUIET, **NATIVE, max_len_b=LIMIT_B)
    items = native.encode(texts)
    for t, item in zip(texts, items):
        assert tok(t).input_ids == item.ids.tolist() + [2]
    for beam in (1, 4):
        want = [r[0].hypothesis.tokens for r in native.translate_nbest(texts, beam=beam)]
        got = hf_generate(model, tok, texts, beam)
        differ = [(t, g, w) for t, g, w, item in zip(texts, got, want, items) if g != w]
        if beam == 1:
            assert not differ, differ[:3]
        limit = {t: len(item.ids) + LIMIT_B for t, item in zip(texts, items)}
        assert all(limit[t] in (len(g), len(w)) for t, g, w in differ), differ[:3]
        # ... and only that rule: with nmtkit's, transformers finds nmtkit's hypotheses there too
        assert hf_generate(model, tok, [t for t, _, _ in differ], beam, nmtkit_limit=True) == [w for _, _, w in differ]
    assert sum(len(w) < len(i.ids) + LIMIT_B for w, i in zip(want, items)) > 30  # guard: most end with </s>


def test_the_snippet_of_the_docs_reproduces_generate(task, tmp_path, run_cli):
    """docs/export.md's transformers code gives `nmtkit generate --decoding fairseq`'s lines (the
    translation pipeline is gone from transformers 5: the tokenizer and generate are its parts)."""
    from transformers import MarianMTModel, MarianTokenizer

    texts = sentences(10, 2)
    (tmp_path / "in.de").write_text("\n".join(texts) + "\n", encoding="utf-8")
    r = run_cli("generate", str(task["data"]), "--path", str(task["ckpt"]), "--input", str(tmp_path / "in.de"),
                "--decoding", "fairseq", "--threads", "1")
    assert r.code == 0, r.err
    tok = MarianTokenizer.from_pretrained(task["hf"])
    model = MarianMTModel.from_pretrained(task["hf"])

    def translate(line: str) -> str:
        ids = tok(line, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=ids.shape[1] - 1 + 50 + 1)  # source tokens + 50, then </s>
        return tok.decode(out[0], skip_special_tokens=True)

    assert [translate(t) for t in texts] == r.out.splitlines()


def test_config_generation_config_and_model_card(task):
    import json

    gen = json.loads((task["hf"] / "generation_config.json").read_text())
    assert (gen["num_beams"], gen["length_penalty"], gen["early_stopping"]) == (4, 0.6, True)
    assert (gen["decoder_start_token_id"], gen["eos_token_id"], gen["forced_eos_token_id"]) == (1, 2, 2)
    assert gen["suppress_tokens"] == [0, 1]
    cfg = json.loads((task["hf"] / "config.json").read_text())
    assert (cfg["model_type"], cfg["d_model"], cfg["encoder_layers"], cfg["activation_function"]) == ("marian", 64, 2, "relu")
    assert cfg["share_encoder_decoder_embeddings"] and cfg["scale_embedding"]
    card = (task["hf"] / "README.md").read_text()
    front = card.split("---\n")[1]
    assert "language:\n- de\n- en\n" in front and "pipeline_tag: translation" in front
    assert "value: 35.26" in front and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0" in front
    assert "- updates: 150" in card and "400 sentence pairs" in card and "nmtkit export" in card
    assert not (task["hf"] / "target_vocab.json").exists()  # one vocabulary and one subword model


def test_round_trip_gives_the_same_weights(task, tmp_path, run_cli):
    """nmtkit -> Hugging Face -> nmtkit: the same config and bit-identical tensors, which translate
    as the original does."""
    from nmtkit import Translator

    r = run_cli("import-hf", str(task["hf"]), "--output", str(tmp_path / "back.pt"), "--data-dir", str(tmp_path / "data"))
    assert r.code == 0, r.err
    a = torch.load(task["ckpt"], weights_only=True)
    b = torch.load(tmp_path / "back.pt", weights_only=True)
    assert a["arch_config"] == b["arch_config"]
    assert set(a["model"]) == set(b["model"])
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    texts = sentences(20, 3)
    one = Translator.load(task["ckpt"], task["data"], **QUIET).translate(texts)
    two = Translator.load(tmp_path / "back.pt", tmp_path / "data", **QUIET).translate(texts)
    assert one == two


@pytest.mark.parametrize("share,activation", [("decoder", "gelu"), ("none", "swish")])
def test_every_tying_and_activation_maps_exactly(task, tmp_path, run_cli, share, activation):
    """Untrained models with the other embedding ties, activations and attention biases: the
    export's teacher-forced log-probabilities are nmtkit's (1e-4), and the round trip gives the
    same tensors."""
    from transformers import MarianMTModel

    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models.loading import build_model
    from nmtkit.models.registry import get_arch

    src_dict, tgt_dict = load_dictionaries(task["data"])
    cfg = get_arch("transformer_tiny").replace(share_embeddings=share, activation=activation, attention_bias=True,
                                               dropout=0.0)
    torch.manual_seed(1)
    model = build_model(cfg, src_dict, tgt_dict).eval()
    with torch.no_grad():  # non-zero biases and layer norms, so that a misplaced one shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1)
    ckpt = tmp_path / "m.pt"
    save_checkpoint({"arch": "transformer_tiny", "arch_config": cfg.to_dict(), "model": model.state_dict(),
                     "dictionaries": {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256,
                                      "src_lang": "de", "tgt_lang": "en"}, "update": 0}, ckpt)
    r = run_cli("export", str(task["data"]), "--path", str(ckpt), "--format", "huggingface", "--output", str(tmp_path / "hf"))
    assert r.code == 0, r.err
    hf = MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    src = torch.tensor([[5, 9, 17, 30, 2], [7, 8, 2, 0, 0]])
    prev = torch.tensor([[1, 12, 40, 22], [1, 6, 6, 9]])
    with torch.inference_mode():
        want = torch.log_softmax(model(src, prev).double(), -1)
        got = torch.log_softmax(hf(input_ids=src, attention_mask=src.ne(0), decoder_input_ids=prev).logits.double(), -1)
    assert (want - got).abs().max() < 1e-4
    r = run_cli("import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / "back.pt"), "--data-dir", str(tmp_path / "data"))
    assert r.code == 0, r.err
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert back["arch_config"] == cfg.to_dict()
    sd = model.state_dict()
    assert set(back["model"]) == set(sd) and all(torch.equal(back["model"][k], sd[k]) for k in sd)


# ---------------------------------------------------------------- MarianMT made by transformers


def spm_model(path: Path, lines: list[str], size: int) -> None:
    import sentencepiece as spm

    text = path.with_suffix(".txt")
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(path.with_suffix("")), vocab_size=size,
                                   model_type="bpe", minloglevel=2, num_threads=1)
    path.with_suffix(".model").rename(path)


def opus_vocab(spm_path: Path) -> dict[str, int]:
    """An OPUS-MT style vocabulary: </s> 0, <unk> 1, the pieces, <pad> last."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A tiny MarianMT made with transformers (random weights and attention biases, swish,
    separate vocabularies and subword models, OPUS-MT's ids), saved as a folder."""
    import json

    from transformers import MarianConfig, MarianMTModel

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("marian")
    d = root / "opus"
    d.mkdir()
    rng = random.Random(3)
    spm_model(d / "source.spm", [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)], 50)
    spm_model(d / "target.spm", [" ".join(rng.choice(list(ENGLISH.values())) for _ in range(8)) for _ in range(200)], 45)
    sv, tv = opus_vocab(d / "source.spm"), opus_vocab(d / "target.spm")
    (d / "vocab.json").write_text(json.dumps(sv))
    (d / "target_vocab.json").write_text(json.dumps(tv))
    (d / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True, "source_lang": "de", "target_lang": "en"}))
    cfg = MarianConfig(vocab_size=len(sv), decoder_vocab_size=len(tv), share_encoder_decoder_embeddings=False,
                       d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                       encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish", max_position_embeddings=128,
                       scale_embedding=True, pad_token_id=len(tv) - 1, decoder_start_token_id=len(tv) - 1,
                       eos_token_id=0, forced_eos_token_id=0, bad_words_ids=None)
    torch.manual_seed(0)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                # layer norm gains near 1: with small ones the constant biases decide every output
                p.normal_(1.0 if "layer_norm.weight" in name else 0.0, 0.3 if p.dim() > 1 else 0.1)
    model.save_pretrained(d)
    return {"root": root, "dir": d, "model": model}


def test_a_marian_made_by_transformers_imports_and_searches_as_transformers(marian, run_cli, tmp_path):
    """import-hf of a swish, separate-vocabulary MarianMT with attention biases: nmtkit's greedy
    search gives transformers' outputs on 200 inputs (transformers told to ban <pad>, as
    OPUS-MT's configs do with bad_words_ids and nmtkit always does). Imported into a folder of its
    own: the tests beside it may already have imported into the shared one, in any order."""
    from transformers import MarianTokenizer

    from nmtkit import Translator

    root = tmp_path
    r = run_cli("import-hf", str(marian["dir"]), "-o", str(root / "m.pt"), "--data-dir", str(root / "data"))
    assert r.code == 0, r.err
    assert "swish" in r.out and "share_embeddings decoder" in r.out  # lm_head tied to the target embeddings
    state = torch.load(root / "m.pt", weights_only=True)
    assert state["arch_config"]["attention_bias"] and state["arch_config"]["activation"] == "swish"
    texts = sentences(198, 4)
    tok = MarianTokenizer.from_pretrained(marian["dir"])
    model = marian["model"]
    got = hf_generate(model, tok, texts, 1, suppress_tokens=[model.config.pad_token_id])
    native = Translator.load(root / "m.pt", root / "data", **QUIET, max_len_b=LIMIT_B)
    want = native.translate_nbest(texts, beam=1)
    inv = {i: t for t, i in tok.target_encoder.items()}
    assert [[inv[i] for i in g] for g in got] == [[native.tgt_dict[i] for i in w[0].hypothesis.tokens] for w in want]
    assert len({tuple(g) for g in got}) > 80  # guard: outputs depend on the input
    # teacher forcing: nmtkit's log-probabilities and attention weights are transformers'
    model.config._attn_implementation = "eager"  # the path that returns attention weights
    for text, w, g in list(zip(texts, want, got))[:4]:
        src = torch.tensor([tok(text).input_ids])
        dec = torch.tensor([[model.config.decoder_start_token_id, *g]])
        with torch.inference_mode():
            out = model(input_ids=src, decoder_input_ids=dec, output_attentions=True)
        # OPUS-MT decodes from <pad>: nmtkit's <s> row is a copy of that row, which its softmax
        # therefore counts twice (docs/export.md)
        logits = out.logits[0].double()
        pad = logits[:, model.config.pad_token_id : model.config.pad_token_id + 1]
        lp = logits - torch.logsumexp(torch.cat([logits, pad], -1), -1, keepdim=True)
        gold = [*g, model.config.eos_token_id]
        assert abs(float(lp[range(len(gold)), gold].sum()) - w[0].hypothesis.logprob) < 1e-4
        att = native.attention(text, beam=1, max_len_b=LIMIT_B)
        hf_cross = torch.stack(out.cross_attentions)[:, 0].numpy()  # (layers, heads, T, S)
        assert att.cross.shape == hf_cross.shape and abs(att.cross - hf_cross).max() < 1e-4


def test_an_imported_marian_exports_back_to_the_same_translations(marian, run_cli):
    """OPUS-MT style folder -> nmtkit -> Hugging Face again (nmtkit's ids, <s> as the start):
    transformers' greedy outputs are the original model's."""
    from transformers import MarianMTModel, MarianTokenizer

    root = marian["root"]
    if not (root / "m.pt").exists():
        assert run_cli("import-hf", str(marian["dir"]), "-o", str(root / "m.pt"), "--data-dir", str(root / "data")).code == 0
    r = run_cli("export", str(root / "data"), "--path", str(root / "m.pt"), "--format", "huggingface", "--output", str(root / "again"))
    assert r.code == 0, r.err
    assert (root / "again" / "target_vocab.json").exists()  # separate vocabularies stay separate
    texts = sentences(22, 6)
    tok, tok2 = MarianTokenizer.from_pretrained(marian["dir"]), MarianTokenizer.from_pretrained(root / "again")
    again = MarianMTModel.from_pretrained(root / "again").eval()
    one = [tok.decode(g, skip_special_tokens=True) for g in
           hf_generate(marian["model"], tok, texts, 1, suppress_tokens=[marian["model"].config.pad_token_id])]
    two = [tok2.decode(g, skip_special_tokens=True) for g in hf_generate(again, tok2, texts, 1)]
    assert one == two


def test_an_imported_marian_exports_to_ctranslate2(marian, run_cli):
    """The imported model (swish, attention biases, separate vocabularies) exports to CTranslate2,
    whose greedy search gives the checkpoint's hypotheses."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install -e '.[ctranslate2]' in the nmtkit checkout")
    from nmtkit import Translator

    root = marian["root"]
    if not (root / "m.pt").exists():
        assert run_cli("import-hf", str(marian["dir"]), "-o", str(root / "m.pt"), "--data-dir", str(root / "data")).code == 0
    r = run_cli("export", str(root / "data"), "--path", str(root / "m.pt"), "--output", str(root / "ct2"))
    assert r.code == 0, r.err
    texts = sentences(60, 5)
    native = Translator.load(root / "m.pt", root / "data", **QUIET, beam=1, max_len_b=LIMIT_B)
    ct2 = Translator.load(root / "ct2", **QUIET, beam=1, max_len_b=LIMIT_B)
    assert native.translate(texts) == ct2.translate(texts)


def _one_line_error(r) -> str:
    assert r.code == 2, (r.code, r.out, r.err)
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nmtkit: error: ") and "Traceback" not in r.err, r.err
    return lines[0]


def test_import_refusals(marian, tmp_path, run_cli):
    import json
    import shutil

    def folder(name: str, edit) -> Path:
        d = tmp_path / name
        shutil.copytree(marian["dir"], d)
        edit(d)
        return d

    def config(**changes):
        def edit(d):
            c = json.loads((d / "config.json").read_text())
            c.update(changes)
            (d / "config.json").write_text(json.dumps(c))
        return edit

    cases = [
        (folder("bart", config(model_type="bart")), "model_type 'bart', not 'marian'"),
        (folder("prenorm", config(normalize_before=True)), "pre-norm (normalize_before)"),
        (folder("gelu_new", config(activation_function="gelu_new")), "activation_function 'gelu_new'"),
        (folder("nospm", lambda d: (d / "target.spm").unlink()), "target.spm: missing"),
        (folder("noconfig", lambda d: (d / "config.json").unlink()), "config.json: missing"),
        (folder("lnemb", lambda d: _add_tensor(d, "model.encoder.layernorm_embedding.weight")),
         "model.encoder.layernorm_embedding.weight has no place"),
    ]
    for d, message in cases:
        r = run_cli("import-hf", str(d), "--output", str(tmp_path / f"{d.name}.pt"), "--data-dir", str(tmp_path / f"{d.name}-data"))
        assert message in _one_line_error(r), (d.name, r.err)
        assert not (tmp_path / f"{d.name}.pt").exists() and not (tmp_path / f"{d.name}-data").exists()
    r = run_cli("import-hf", str(marian["dir"]), "-o", str(tmp_path / "m.pt"), "--data-dir", str(tmp_path / "data"))
    assert r.code == 0
    r = run_cli("import-hf", str(marian["dir"]), "-o", str(tmp_path / "m.pt"), "--data-dir", str(tmp_path / "data"))
    assert "--output" in _one_line_error(r) and "checkpoint" in r.err  # an earlier import needs --force
    r = run_cli("import-hf", str(marian["dir"]), "-o", str(tmp_path / "m2.pt"), "--data-dir", str(tmp_path / "data"))
    assert "--data-dir" in _one_line_error(r) and "--force" in r.err
    r = run_cli("import-hf", str(marian["dir"]), "-o", str(tmp_path / "m.pt"), "--data-dir", str(tmp_path / "data"), "--force")
    assert r.code == 0, r.err
    with pytest.MonkeyPatch.context() as mp:
        for name in ("safetensors", "safetensors.torch"):
            mp.setitem(__import__("sys").modules, name, None)
        r = run_cli("import-hf", str(marian["dir"]), "-o", str(tmp_path / "m3.pt"), "--data-dir", str(tmp_path / "d3"))
    assert "pip install -e '.[hf]' in the nmtkit checkout" in _one_line_error(r)


def _add_tensor(d: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(d / "model.safetensors"))
    sd[name] = torch.ones(32)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})


def test_export_refusals(task, tmp_path, run_cli, monkeypatch):
    """What MarianMT or MarianTokenizer cannot hold, a score file without BLEU, and translating
    with the export: one line each."""
    from nmtkit.checkpoints import load_checkpoint, save_checkpoint

    state = load_checkpoint(task["ckpt"])
    state["arch_config"] = {**state["arch_config"], "normalize_before": True}
    for name in ("encoder_norm", "decoder_norm"):  # the final layer norms of a pre-norm model
        state["model"][f"{name}.weight"], state["model"][f"{name}.bias"] = torch.ones(64), torch.zeros(64)
    save_checkpoint(state, tmp_path / "pre.pt")
    base = ["export", str(task["data"]), "--format", "huggingface"]
    r = run_cli(*base, "--path", str(tmp_path / "pre.pt"), "--output", str(tmp_path / "a"))
    assert "--normalize-before: MarianMT is post-norm only" in _one_line_error(r)
    (tmp_path / "s.txt").write_text("chrF2 = 50.0\n")
    r = run_cli(*base, "--path", str(task["ckpt"]), "--output", str(tmp_path / "b"), "--score-file", str(tmp_path / "s.txt"))
    assert "no BLEU line" in _one_line_error(r)
    r = run_cli("generate", "--path", str(task["hf"]), "--input", "-")
    assert "huggingface export" in _one_line_error(r) and "import-hf" in r.err
    r = run_cli(*base, "--path", str(task["ckpt"]), "--output", str(tmp_path / "b"), "--score-file", str(tmp_path / "no.txt"))
    assert "--score-file" in _one_line_error(r) and "not found" in r.err
    r = run_cli("export", str(task["data"]), "--path", str(task["ckpt"]), "--output", str(tmp_path / "b"),
                "--score-file", str(tmp_path / "s.txt"))
    assert "the ctranslate2 export has no model card" in _one_line_error(r)
    from nmtkit.backends.huggingface.convert import check_data
    from nmtkit.errors import UserError

    for kind, files in (("subword-nmt", {"de": "bpe.codes", "en": "bpe.codes"}), ("none", {"de": None, "en": None})):
        with pytest.raises(UserError, match=r"^the de side uses .*MarianTokenizer .* reads sentencepiece models only"):
            check_data({"source_lang": "de", "target_lang": "en", "subword": {"kind": kind, "files": files}})
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    r = run_cli(*base, "--path", str(task["ckpt"]), "--output", str(tmp_path / "c"))
    assert "pip install -e '.[hf]' in the nmtkit checkout" in _one_line_error(r)
    assert not any((tmp_path / n).exists() for n in "abc")


@pytest.mark.parametrize("field, value, message", [
    ("sinusoid", "fairseq", "--sinusoid fairseq: MarianMT's position table has the paper's frequencies"),
    ("decoder_start", "eos", "--decoder-start eos: the export starts decoding from <s>"),
])
def test_fairseq_model_settings_are_refused_by_the_export(field, value, message):
    """An imported fairseq model (its sinusoid table, its </s> start) has no MarianMT form."""
    from nmtkit.backends.huggingface.convert import check_representable
    from nmtkit.errors import UserError
    from nmtkit.models import ArchConfig

    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        check_representable(ArchConfig(**{field: value}))
    check_representable(ArchConfig())  # the paper's model exports


def test_a_config_without_a_decoder_start_id_starts_from_pad(tmp_path):
    """transformers starts from pad_token_id when decoder_start_token_id is missing or null; the
    import reads both cases alike (a missing key was refused as 'got None')."""
    from nmtkit.backends.huggingface.importer import vocabulary_order

    vocab = ["</s>", "<unk>", "a", "b", "<pad>"]
    base = {"pad_token_id": 4, "eos_token_id": 0}
    where = tmp_path / "config.json"
    want = vocabulary_order(vocab, {**base, "decoder_start_token_id": 4}, where, source=False)
    assert vocabulary_order(vocab, base, where, source=False) == want
    assert vocabulary_order(vocab, {**base, "decoder_start_token_id": None}, where, source=False) == want


# --- property tests (Hypothesis) ---
# `nmtkit import-hf` reads files anyone can write. A MarianMT folder whose config.json (or
# tokenizer_config.json) has fields of the wrong type, missing, huge or negative, or is no JSON
# at all, and one whose model.safetensors has a mutated header (a length beyond the file,
# overlapping or outside data_offsets, unknown dtypes, shapes whose product overflows, non-JSON,
# duplicate keys): reading and converting it (all the import does before it writes) succeeds, or
# refuses in one line naming the file, before any large allocation.

import json  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402

from hypothesis import event, example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nmtkit.errors import UserError  # noqa: E402


@pytest.fixture(scope="module")
def fuzz_folder(marian, tmp_path_factory):
    """A copy of the tiny MarianMT folder for the properties to damage (each example restores it)."""
    root = tmp_path_factory.mktemp("hf_fuzz")
    shutil.copytree(marian["dir"], root / "opus")
    return root


def _one_line(msg: str, root: Path) -> str:
    assert len(msg.splitlines()) == 1, msg
    assert str(root / "opus") in msg or "--" in msg, msg
    return msg


def _read_or_refuse(root: Path) -> str:
    """Read and convert root/opus as import-hf does before it writes anything: 'read', or the
    refusal's message (one line naming a file of the folder or a flag)."""
    from nmtkit.backends.huggingface.importer import ImportOptions, convert, read_folder

    try:
        convert(read_folder(ImportOptions(hf_dir=str(root / "opus"), output=str(root / "m.pt"),
                                          data_dir=str(root / "data"))))
    except UserError as e:
        return _one_line(str(e), root)
    return "read"


def _import_or_refuse(root: Path) -> str:
    """The whole import-hf of root/opus: 'imported', or the refusal's message (one line), with no
    output left behind."""
    from nmtkit.backends.huggingface.importer import ImportOptions, import_hf

    out, data = root / "m.pt", root / "data"
    try:
        import_hf(ImportOptions(hf_dir=str(root / "opus"), output=str(out), data_dir=str(data)))
    except UserError as e:
        assert not out.exists() and not data.exists(), str(e)
        return _one_line(str(e), root)
    finally:
        shutil.rmtree(data, ignore_errors=True)
        out.unlink(missing_ok=True)
    return "imported"


def _outcome(msg: str, root: Path) -> str:
    """The kind of outcome, for --hypothesis-show-statistics."""
    return msg if msg in ("read", "imported") else "refused: " + msg.replace(str(root / "opus"), "").split(" (")[0][:70]


# ---- config.json and tokenizer_config.json ----

_ODD = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.text(max_size=6),
    st.sampled_from([0, -1, -(2**31), 2**31, 2**40, 2**63, 10**30, 1.5, -0.0, 1e308, float("inf"), float("nan"),
                     "32", "gelu", "relu", "swish", "marian", "de", "en", "", [], {}, [1], {"a": 1}]),
    st.lists(st.integers(-2, 2), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_CONFIG_KEYS = [
    "model_type", "vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers",
    "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function",
    "max_position_embeddings", "pad_token_id", "eos_token_id", "decoder_start_token_id", "dropout",
    "attention_dropout", "activation_dropout", "scale_embedding", "share_encoder_decoder_embeddings",
    "tie_word_embeddings", "normalize_before", "normalize_embedding", "add_final_layer_norm",
    "static_position_embeddings", "encoder_normalize_before", "an_unknown_key",
]
_TOKENIZER_KEYS = ["separate_vocabs", "source_lang", "target_lang", "an_unknown_key"]
_DELETE = object()


def _edited(doc: dict, edits: dict) -> dict:
    out = dict(doc)
    for k, v in edits.items():
        if v is _DELETE:
            out.pop(k, None)
        else:
            out[k] = v
    return out


@st.composite
def json_documents(draw, original: bytes, keys: list[str]) -> bytes:
    """`original` (a JSON object) with fields changed or removed, or broken as a document: cut
    short, not UTF-8, another JSON type, a key given twice, deeply nested, a number of 5000 digits."""
    doc = json.loads(original)
    kind = draw(st.sampled_from(["fields"] * 6 + ["cut", "bytes", "type", "twice", "deep", "digits"]))
    if kind == "fields":
        edits = draw(st.dictionaries(st.sampled_from(keys), st.one_of(st.just(_DELETE), _ODD), min_size=1, max_size=3))
        return json.dumps(_edited(doc, edits)).encode()
    if kind == "cut":
        return original[: draw(st.integers(0, len(original) - 1))]
    if kind == "bytes":
        at = draw(st.integers(0, len(original)))
        odd = draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xef\xbb\xbf", b"\xed\xa0\x80"]))
        return original[:at] + odd + original[at:]
    if kind == "type":
        return json.dumps(draw(st.one_of(_ODD, st.lists(st.just(doc), max_size=2)))).encode()
    if kind == "twice":  # json keeps the last of a key given twice
        key, value = draw(st.sampled_from(keys)), draw(_ODD)
        return original.rstrip()[:-1] + f', "{key}": {json.dumps(value)}}}'.encode()
    if kind == "deep":
        key, depth = draw(st.sampled_from(keys)), draw(st.sampled_from([10, 1000, 100_000]))
        nested = "[" * depth + "]" * depth
        return json.dumps(_edited(doc, {key: 0})).replace(f'"{key}": 0', f'"{key}": {nested}').encode()
    key = draw(st.sampled_from(keys))
    return json.dumps(_edited(doc, {key: 0})).replace(f'"{key}": 0', f'"{key}": ' + "7" * 5000).encode()


def _restoring(path: Path, data: bytes):
    """Write `data` to `path` for one example; the original comes back when the block ends."""
    import contextlib

    @contextlib.contextmanager
    def block():
        original = path.read_bytes()
        path.write_bytes(data)
        try:
            yield
        finally:
            path.write_bytes(original)
    return block()


@pytest.mark.fuzz
@given(data=st.data(), name=st.sampled_from(["config.json", "config.json", "tokenizer_config.json"]))
def test_any_config_is_imported_or_refused_in_one_line(fuzz_folder, data, name):
    path = fuzz_folder / "opus" / name
    doc = data.draw(json_documents(path.read_bytes(), _CONFIG_KEYS if name == "config.json" else _TOKENIZER_KEYS))
    with _restoring(path, doc):
        event(_outcome(_read_or_refuse(fuzz_folder), fuzz_folder))


# ---- model.safetensors: its header mutated ----

_DTYPES = ["F16", "BF16", "F64", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL", "F8_E4M3",
           "F8_E5M2", "F4", "C64", "XX", "", "f32", 1, None]
_SIZES = st.one_of(st.integers(-2, 70),
                   st.sampled_from([2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**64, 2**80, 1.5, "3", None]))


@st.composite
def safetensors_files(draw, original: bytes) -> bytes:
    """`original` with its header changed: one tensor's dtype, shape or data_offsets, a tensor
    removed or given twice, odd metadata, the header cut, not UTF-8 or not JSON, the length
    field anything, the data cut or padded."""
    n = int.from_bytes(original[:8], "little")
    header, data = json.loads(original[8 : 8 + n]), original[8 + n :]
    names = sorted(k for k in header if k != "__metadata__")
    name, entry = draw(st.sampled_from(names)), {}
    entry = dict(header[name])
    kind = draw(st.sampled_from(["dtype", "retype", "shape", "offsets", "offsets", "drop", "twice", "rename",
                                 "metadata", "text", "length", "data"]))
    text = None
    if kind == "dtype":
        entry["dtype"] = draw(st.sampled_from(_DTYPES))
    elif kind == "retype":  # another dtype, the last dimension scaled so the bytes still fit
        dtype, scale = draw(st.sampled_from([("F8_E4M3", 4), ("F8_E5M2", 4), ("U8", 4), ("BOOL", 4), ("F16", 2),
                                             ("BF16", 2), ("I16", 2), ("I32", 1), ("U32", 1)]))
        entry["dtype"], entry["shape"] = dtype, [*entry["shape"][:-1], entry["shape"][-1] * scale]
    elif kind == "shape":
        entry["shape"] = draw(st.one_of(st.lists(_SIZES, max_size=4), st.just([2**32, 2**32, 2**32]), _SIZES))
    elif kind == "offsets":
        other = header[draw(st.sampled_from(names))]["data_offsets"]
        entry["data_offsets"] = draw(st.one_of(
            st.lists(_SIZES, max_size=3), st.just(list(reversed(entry["data_offsets"]))), st.just(other),
            st.just([other[0], entry["data_offsets"][1]]), st.just([0, len(data) + 4]), st.just([len(data), 2**64 - 1]),
        ))
    elif kind == "drop":
        entry = None
    elif kind == "rename":  # a name the model does not have, or one that breaks a line
        header.pop(name)
        name = draw(st.one_of(st.sampled_from(["a\nb", "model.encoder.layer_norm.weight\r", "\u2028", ""]),
                              st.text(max_size=8)))
    elif kind == "metadata":
        header["__metadata__"] = draw(st.one_of(_ODD, st.dictionaries(st.text(max_size=3), _ODD, max_size=2)))
    if entry is None:
        del header[name]
    else:
        header[name] = entry
    text = json.dumps(header).encode()
    if kind == "twice":  # the tensor named again at the end, with another entry
        twin = {**header[name], "data_offsets": header[draw(st.sampled_from(names))]["data_offsets"]}
        text = text[:-1] + b", " + json.dumps({name: twin})[1:].encode()
    elif kind == "text":
        at = draw(st.integers(0, len(text)))
        text = draw(st.sampled_from([text[:at], text[:at] + b"\xff" + text[at:], b" " * 8 + text, text + b"\x00",
                                     b"[" * 200_000, b'{"__metadata__": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
                                     b"\xef\xbb\xbf" + text]))
    length = len(text)
    if kind == "length":
        length = draw(st.sampled_from([0, 1, 7, length - 1, length + 1, length + len(data), length + len(data) + 1,
                                       100_000_000, 100_000_001, 2**40, 2**63, 2**64 - 1]))
    if kind == "data":
        data = draw(st.sampled_from([data[:-1], data[: len(data) // 2], b"", data + b"\x00" * 7]))
    return struct.pack("<Q", length) + text + data


@pytest.mark.fuzz
@given(data=st.data())
def test_any_safetensors_header_is_imported_or_refused_in_one_line(fuzz_folder, data):
    path = fuzz_folder / "opus" / "model.safetensors"
    with _restoring(path, data.draw(safetensors_files(path.read_bytes()))):
        event(_outcome(_read_or_refuse(fuzz_folder), fuzz_folder))


def _config_with(folder: Path, **changes) -> bytes:
    doc = json.loads((folder / "opus" / "config.json").read_text())
    return json.dumps({**doc, **changes}).encode()


def _weights_with(folder: Path, edit) -> bytes:
    from safetensors.torch import load_file, save

    sd = load_file(str(folder / "opus" / "model.safetensors"))
    edit(sd)
    return save(sd, metadata={"format": "pt"})


def _float8(sd: dict) -> None:
    name = "model.decoder.layers.1.self_attn.q_proj.weight"
    sd[name] = sd[name].to(torch.float8_e4m3fn)  # the right shape, a dtype the conversion cannot compute with


# what the properties found: each was a traceback (or a list of 2**31 entries, 16 GiB), or a
# message over two lines
@pytest.mark.parametrize("name, content, message", [
    ("config.json", lambda f: _config_with(f).replace(b'"d_model": 32', b'"d_model": ' + b"7" * 5000),
     "config.json: not readable JSON (Exceeds the limit (4300 digits) for integer string conversion"),
    ("config.json",
     lambda f: _config_with(f).replace(b'"d_model": 32', b'"d_model": ' + b"[" * 100_000 + b"]" * 100_000),
     "config.json: not readable JSON (maximum recursion depth exceeded"),
    ("config.json", lambda f: _config_with(f, activation_function=[]), "activation_function [] is not supported"),
    ("config.json", lambda f: _config_with(f, decoder_vocab_size="abc"),
     "config.json: decoder_vocab_size must be a positive integer, got 'abc'"),
    ("config.json", lambda f: _config_with(f, decoder_vocab_size=[45]),
     "config.json: decoder_vocab_size must be a positive integer, got [45]"),
    ("config.json", lambda f: _config_with(f, vocab_size=2**40),
     "config.json: vocab_size 1099511627776 is larger than every weight matrix of the model (64 rows at most)"),
    ("config.json", lambda f: _config_with(f, decoder_vocab_size=2**31),
     "config.json: decoder_vocab_size 2147483648 is larger than every weight matrix of the model (64 rows at most)"),
    ("config.json", lambda f: _config_with(f, encoder_attention_heads="4\n4"),
     "config.json: encoder_attention_heads '4\\n4' != decoder_attention_heads 4;"),
    ("tokenizer_config.json", lambda f: b"[]",
     "tokenizer_config.json: expected a JSON object of MarianTokenizer's settings"),
    ("model.safetensors", lambda f: _weights_with(f, _float8), "model.safetensors: weight "
     "model.decoder.layers.1.self_attn.q_proj.weight is torch.float8_e4m3fn; nmtkit imports float32, float16, "
     "bfloat16 and float64 weights"),
    ("model.safetensors", lambda f: _weights_with(f, lambda sd: sd.update({"a\nb": torch.zeros(1)})),
     "opus: weight 'a\\nb' has no place in nmtkit's post-norm Transformer"),
    ("config.json", lambda f: _config_with(f, dropout=[]), "config.json: dropout must be a number, got []"),
    # a d_model other than the weights' (an IndexError in the mapping's permutation)
    ("config.json", lambda f: _config_with(f, d_model=64, encoder_ffn_dim=64, decoder_ffn_dim=64),
     "the source embeddings have 32 columns, but config.json's d_model is 64"),
])
def test_what_the_properties_found_is_refused_in_one_line(fuzz_folder, name, content, message):
    path = fuzz_folder / "opus" / name
    with _restoring(path, content(fuzz_folder)):
        assert message in _import_or_refuse(fuzz_folder)


def test_a_pytorch_model_bin_that_holds_no_state_dict_is_refused(marian, tmp_path):
    """torch's weights-only loader gives back any list or dict it finds: a list failed later
    (AttributeError, a traceback)."""
    d = tmp_path / "opus"
    shutil.copytree(marian["dir"], d)
    (d / "model.safetensors").unlink()
    for content in ([torch.zeros(1)], {1: torch.zeros(1)}, {"a": 1}):
        torch.save(content, d / "pytorch_model.bin")
        assert _import_or_refuse(tmp_path) == f"{d / 'pytorch_model.bin'}: not a state dict (names -> tensors)"
