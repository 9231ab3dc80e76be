"""`nmtkit export --format ctranslate2` and decoding an export directory (docs/export.md).

The reference is nmtkit itself: small models are trained here (a word-mapping task wK -> WK with a
sentencepiece model, and the parsing data directory of test_parsing_pipeline.py), exported, and
the CTranslate2 runtime must give the hypotheses of native search with fairseq's stopping rule and
length penalty (`--early-stop beam --lenpen-form fairseq`), with scores within 1e-4. The weight
mapping itself is checked for every registry architecture (shrunk) against the model's own
teacher-forced log-probabilities. Skipped when ctranslate2 is not installed.

What is compared is what is defined on every CPU (docs/testing.md): two runtimes compute the same
log-probabilities up to float noise (about 1e-6 here), whose last bits depend on the kernels the
CPU's instruction set selects. A beam search turns that noise into other tokens where two
candidates nearly tie, which the small models trained here do often (repeated words). So tokens
are compared on the sentences whose native result has a clear margin: it stays the same when every
step's logits are perturbed by noise a hundred times larger (`clear_sentences`); scores are
compared within TOL wherever the tokens are the same. A beam that reaches the output limit is
CTranslate2's own rule (docs/export.md: candidates stopped there without </s>, then closed and
rescored), held by `test_hypotheses_that_reach_the_output_limit` instead.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit.errors import UserError
from nmtkit.models.registry import ARCHS
from tests.test_parsing_pipeline import check_trees, write_inputs

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install -e '.[ctranslate2]' in the nmtkit checkout")

REPO = Path(__file__).resolve().parents[1]
# a word-for-word task (German -> English words) that a tiny model learns in 150 updates
WORDS = "der Hund Katze Haus Baum läuft springt schläft groß klein rot blau ein zwei Mann Frau Kind Straße".split()
ENGLISH = dict(zip(WORDS, "the dog cat house tree runs jumps sleeps big small red blue a two man woman child street".split()))
FAIRSEQ = dict(lenpen_form="fairseq")  # the only length penalty CTranslate2 has
NATIVE = dict(lenpen_form="fairseq", early_stop="beam")  # native search with CTranslate2's rules
TOL = 1e-4
PRINTED_STEP = 1e-4  # generate prints scores with 4 decimals


def sentences(n: int, seed: int) -> list[str]:
    """Inputs of the task, with an unknown word, an empty and a blank line among them."""
    rng = random.Random(seed)
    out = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]
    return out[:5] + ["", "Hund Zebra Katze", "   "] + out[5:]


def train(data: Path, save_dir: Path, updates: int, **kw):
    from nmtkit.training import trainer as T
    from nmtkit.training.config import TrainConfig

    overrides = {"dropout": 0.0, **kw.pop("arch_overrides", {})}
    cfg = TrainConfig(data_dir=str(data), save_dir=str(save_dir), arch="transformer_tiny", max_tokens=kw.pop("max_tokens", 300),
                      lr_scheduler="inverse_sqrt", lr=5e-3, warmup_updates=5, log_interval=1000, progress_bar=False,
                      threads=1, no_epoch_checkpoints=True, no_validate=True, max_update=updates,
                      arch_overrides=overrides, **kw)
    T.train(cfg)
    return save_dir / "checkpoint_last.pt"


def word_task_data(root: Path, train_pairs: int, words=None, english=None) -> Path:
    """Preprocessed data of the word-for-word task (sentencepiece, joined dictionary): `train_pairs`
    and 10 validation pairs of 1-10 random words each, seed 0, in root/data."""
    from nmtkit.data.preprocess import PreprocessConfig, preprocess

    words, english = words or WORDS, english or ENGLISH
    rng = random.Random(0)
    for split, n in (("train", train_pairs), ("valid", 10)):
        src = [[rng.choice(words) for _ in range(rng.randint(1, 10))] for _ in range(n)]
        (root / f"{split}.de").write_text("\n".join(" ".join(s) for s in src) + "\n", encoding="utf-8")
        (root / f"{split}.en").write_text("\n".join(" ".join(english[w] for w in s) for s in src) + "\n",
                                          encoding="utf-8")
    data = root / "data"
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(root / "train"),
                                validpref=[str(root / "valid")], destdir=str(data), vocab_size=60,
                                joined_dictionary=True))
    return data


@pytest.fixture(scope="module")
def wm(tmp_path_factory):
    """A data dir of the word-for-word task (sentencepiece, joined dictionary) and trained models:
    post: the paper's post-norm, all embeddings shared, sinusoids; update checkpoints 50/100/150
          and their average;
    pre:  pre-norm, separate embeddings, learned positions, EMA weights.
    """
    from nmtkit.checkpoints import average_checkpoints, last_checkpoints, save_checkpoint

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("export")
    data = word_task_data(root, 500)
    post = train(data, root / "post", 150, save_interval_updates=50, keep_last_updates=3)
    avg = root / "avg3.pt"
    last3 = last_checkpoints(root / "post", 3, "update")
    save_checkpoint(average_checkpoints(last3), avg)
    pre = train(data, root / "pre", 150, ema_decay=0.9,
                arch_overrides={"normalize_before": True, "share_embeddings": "none", "learned_pos": True})
    return {"root": root, "data": data, "post": post, "pre": pre, "avg": avg, "avg_from": [p.name for p in last3]}


def export_dir(wm, name: str, *args: str, tmp_name: str | None = None) -> Path:
    """Export checkpoint `name` of `wm` (once per arguments) with the CLI, from a copy of the data
    directory that is deleted afterwards: the directory must need nothing else."""
    from nmtkit.cli import main

    out = wm["root"] / (tmp_name or f"{name}{''.join(args).replace('-', '_')}-ct2")
    if not out.exists():
        copy = wm["root"] / "data-copy"
        shutil.copytree(wm["data"], copy)
        try:
            with pytest.raises(SystemExit) as e:
                main(["export", str(copy), "--path", str(wm[name]), "--output", str(out), *args])
            assert e.value.code == 0
        finally:
            shutil.rmtree(copy)
    return out


def load_both(wm, name: str, export: Path, ema: bool = False, **settings):
    from nmtkit import Translator

    quiet = dict(threads=1, warn=lambda msg: None)
    native = Translator.load(wm[name], wm["data"], ema=ema, **quiet, **NATIVE, **settings)
    ct2 = Translator.load(export, **quiet, **FAIRSEQ, **settings)
    return native, ct2


NOISE = 1e-4  # the logit perturbation that a clear margin survives (a hundred times the runtimes' difference)


def clear_sentences(native, texts: list[str], seeds: int = 3, **settings) -> list[bool]:
    """For each text, whether native search gives the same n-best tokens when every step's logits
    are perturbed by uniform noise of +-NOISE (`seeds` draws): its margins are clear, so any
    runtime that computes the model within float noise must find the same tokens. A near tie
    (changed by the perturbation) is a property of the model and input, not of a runtime."""
    def tokens() -> list[list]:
        return [[list(t.hypothesis.tokens) for t in row] for row in native.translate_nbest(texts, **settings)]

    want = tokens()
    clear = [True] * len(texts)
    models = native.engine.models
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        steps = [m.decode_step for m in models]

        def noisy(step):
            def decode_step(*args, **kw):
                logits = step(*args, **kw)
                return logits + (torch.rand(logits.shape, generator=gen) * 2 - 1).to(logits) * NOISE
            return decode_step

        for m, step in zip(models, steps):
            m.decode_step = noisy(step)
        try:
            got = tokens()
        finally:
            for m in models:
                del m.decode_step  # the class's own again
        clear = [c and g == w for c, g, w in zip(clear, got, want)]
    return clear


def within_limit(tr, texts: list[str], rows: list[list], **settings) -> list[bool]:
    """For each text, whether every hypothesis of `rows` (n-best lists) ends before the output limit."""
    from nmtkit.search.config import output_limit

    cfg = tr.search_config(**settings)
    return [all(len(t.hypothesis.tokens) < output_limit(len(it.ids), cfg) for t in row)
            for it, row in zip(tr.encode(texts), rows)]


def assert_same(native, ct2, texts: list[str], **settings) -> None:
    """Identical n-best lists (tokens, texts) on every sentence with clear margins
    (`clear_sentences`) whose beams stay within the output limit (greedy search: at the limit
    too, its rule is the same), scores / log-probabilities within TOL wherever the tokens are the
    same."""
    a, b = native.translate_nbest(texts, **settings), ct2.translate_nbest(texts, **settings)
    assert len(a) == len(b) == len(texts)
    clear = clear_sentences(native, texts, **settings)
    if settings.get("beam", native.search.beam) > 1:
        clear = [c and x and y for c, x, y in zip(clear, within_limit(native, texts, a, **settings),
                                                  within_limit(ct2, texts, b, **settings))]
    assert sum(clear) >= 0.75 * len(texts), (sum(clear), len(texts), settings)  # guard: most are compared
    for text, x, y, c in zip(texts, a, b, clear):
        if c:
            assert [t.hypothesis.tokens for t in x] == [t.hypothesis.tokens for t in y], (text, settings)
            assert [t.text for t in x] == [t.text for t in y]
        for t, u in zip(x, y):
            if list(t.hypothesis.tokens) == list(u.hypothesis.tokens):
                assert abs(t.score - u.score) < TOL and abs(t.logprob - u.logprob) < TOL, (text, t, u)
    assert any(t.text for row in b for t in row)  # guard: the model does translate


def lines(text: str) -> list[str]:
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


# ------------------------------------------------------------------------ the directory


def test_export_directory_is_self_contained_and_loads_in_plain_ctranslate2(wm, run_cli):
    import sentencepiece as spm

    from nmtkit.checkpoints import load_checkpoint
    from nmtkit.data.manifest import load_manifest, sha256_file

    out = export_dir(wm, "post")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["config.json", "dict.de.txt", "dict.en.txt", "model.bin", "nmtkit.json",
                     "shared_vocabulary.json", "spm.model"]
    info = json.loads((out / "nmtkit.json").read_text(encoding="utf-8"))
    manifest = load_manifest(wm["data"])
    state = load_checkpoint(wm["post"])
    assert info["format"] == "nmtkit-export" and info["format_version"] == 1
    assert info["runtime"]["name"] == "ctranslate2" and info["runtime"]["quantization"] == "float32"
    assert info["runtime"]["version"] == ctranslate2.__version__
    assert info["arch"] == "transformer_tiny" and info["arch_config"] == state["arch_config"]
    assert (info["source_lang"], info["target_lang"], info["task"]) == ("de", "en", "translation")
    assert info["checkpoint"]["sha256"] == sha256_file(wm["post"]) and info["checkpoint"]["update"] == 150
    assert info["checkpoint"]["ema"] is False and info["checkpoint"]["averaged_from"] is None
    assert info["data"]["subword"] == manifest["subword"] and info["data"]["dictionaries"] == manifest["dictionaries"]
    assert info["data"]["files"] == {n: manifest["files"][n] for n in ("dict.de.txt", "dict.en.txt", "spm.model")}
    assert all(sha256_file(out / n) == h for n, h in info["data"]["files"].items())
    config = json.loads((out / "config.json").read_text())
    assert config["add_source_eos"] is True and config["decoder_start_token"] == "<s>"
    assert config["layer_norm_epsilon"] == 1e-5
    vocab = json.loads((out / "shared_vocabulary.json").read_text())
    assert vocab[:4] == ["<pad>", "<s>", "</s>", "<unk>"] and len(vocab) == info["data"]["dictionaries"]["de"]["size"]

    # docs/export.md's plain-Python recipe gives what nmtkit's runtime gives
    from nmtkit import Translator

    tr = Translator.load(out, threads=1, **FAIRSEQ)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    plain = ctranslate2.Translator(str(out), intra_threads=1)
    texts = [s for s in sentences(20, 1) if s.strip()]
    results = plain.translate_batch([sp.encode(s, out_type=str) for s in texts], beam_size=4, length_penalty=0.6,
                                    max_decoding_length=51, min_decoding_length=0, max_input_length=0,
                                    return_end_token=True, return_scores=True)
    got = [sp.decode([t for t in r.hypotheses[0] if t != "</s>"]) for r in results]
    # one batch in the given order there, sorted batches here: other kernels' float noise, so the
    # same tokens where the margins are clear (`clear_sentences`)
    native = Translator.load(wm["post"], wm["data"], threads=1, warn=lambda msg: None, **NATIVE)
    clear = clear_sentences(native, texts, max_len_a=0.0, max_len_b=50)
    assert sum(clear) >= 0.75 * len(texts)  # guard: most are compared
    mine = tr.translate_nbest(texts, max_len_a=0.0, max_len_b=50)
    clear = [c and w for c, w in zip(clear, within_limit(tr, texts, mine, max_len_a=0.0, max_len_b=50))]
    assert sum(clear) >= 0.5 * len(texts)  # guard: most are compared
    assert [g for g, c in zip(got, clear) if c] == [m[0].text for m, c in zip(mine, clear) if c]


def test_the_export_translates_with_its_own_files_only(wm, tmp_path, run_cli):
    """export_dir exports from a copy of the data directory, deleted since; the directory moves."""
    out = export_dir(wm, "post")
    moved = tmp_path / "elsewhere" / "model"
    shutil.copytree(out, moved)
    f = tmp_path / "in.de"
    f.write_text("Hund Katze\n\nein Mann läuft\n", encoding="utf-8")
    r = run_cli("generate", "--path", moved, "--input", f, "--lenpen-form", "fairseq", "--quiet")
    native = run_cli("generate", wm["data"], "--path", wm["post"], "--input", f, "--lenpen-form", "fairseq",
                     "--early-stop", "beam", "--quiet")
    assert r.code == native.code == 0, r
    assert lines(r.out) == lines(native.out) and lines(r.out)[1] == "" and lines(r.out)[0]


# ------------------------------------------------------------------------ same as native search


@pytest.mark.parametrize("name", ["post", "pre"])
def test_ctranslate2_search_equals_native_search(wm, name):
    """post: post-norm, shared embeddings, sinusoids; pre: pre-norm, separate embeddings, learned
    positions. Beam, greedy, n-best, no length penalty, output limits that are reached, batching."""
    native, ct2 = load_both(wm, name, export_dir(wm, name), max_len_a=0.0, max_len_b=40)
    texts = sentences(60, 2)
    assert_same(native, ct2, texts)
    assert_same(native, ct2, texts, beam=1)
    assert_same(native, ct2, texts, beam=5, nbest=3)
    assert_same(native, ct2, texts, lenpen=0.0)
    assert_same(native, ct2, texts, lenpen=1.0, beam=3)
    assert_same(native, ct2, texts, max_len_a=1.0, max_len_b=0)  # a few outputs end at their limit
    assert_same(native, ct2, texts, max_len_a=0.5, max_len_b=1, beam=1)  # greedy: exact at the limit too
    # batching never changes the output
    for batching in (dict(batch_size=1), dict(max_tokens=20)):
        from nmtkit import Translator

        other = Translator.load(export_dir(wm, name), threads=1, warn=lambda m: None, max_len_a=0.0, max_len_b=40,
                                **FAIRSEQ, **batching)
        assert other.translate(texts) == ct2.translate(texts)


def test_hypotheses_that_reach_the_output_limit(wm):
    """A tight limit (half the source length): CTranslate2 stops its best candidates there without
    </s>; the runtime closes them with </s> and rescores them, so every output obeys the limit and
    every score is the model's own. The choice can differ from nmtkit's (docs/export.md), rarely."""
    native, ct2 = load_both(wm, "post", export_dir(wm, "post"), max_len_a=0.5, max_len_b=1)
    texts = [t for t in sentences(100, 9) if t.strip()]
    a, b = native.translate_nbest(texts), ct2.translate_nbest(texts)
    limits = [int(0.5 * len(ct2.encode([t])[0].ids) + 1) for t in texts]
    assert sum(len(x[0].hypothesis.tokens) == n for x, n in zip(a, limits)) > 20  # guard: the limit is reached
    model = native.engine.models[0]
    for text, x, y, n in zip(texts, a, b, limits):
        h = y[0].hypothesis
        assert len(h.tokens) <= n
        src = torch.tensor([[*ct2.encode([text])[0].ids, 2]])
        with torch.no_grad():
            lp = torch.log_softmax(model(src, torch.tensor([[1, *h.tokens]])).float(), dim=-1)[0]
        assert abs(float(lp.gather(1, torch.tensor([*h.tokens, 2])[:, None]).sum()) - h.logprob) < TOL
    assert sum(x[0].hypothesis.tokens == y[0].hypothesis.tokens for x, y in zip(a, b)) >= 0.9 * len(texts)


def test_generate_cli_on_an_export_equals_native_generate(wm, tmp_path, run_cli):
    out = export_dir(wm, "post")
    f = tmp_path / "in.de"
    f.write_text("\n".join(sentences(30, 3)) + "\n", encoding="utf-8")
    flags = ["--lenpen-form", "fairseq", "--max-len-a", "0", "--max-len-b", "256", "--quiet", "--threads", "1"]
    native = run_cli("generate", wm["data"], "--path", wm["post"], "--input", f, "--early-stop", "beam", *flags)
    ct2 = run_cli("generate", "--path", out, "--input", f, *flags)
    assert native.code == ct2.code == 0, (native, ct2)
    assert lines(ct2.out) == lines(native.out) and len(lines(ct2.out)) == 33
    assert lines(ct2.out)[5] == lines(ct2.out)[7] == ""  # empty and blank lines kept, in order
    # fairseq format: the same S-/H-/D- lines, P- lines (per-token scores) within 1e-4
    for fmt in (["--format", "fairseq", "--nbest", "2"], ["--print-scores", "--nbest", "2"]):
        a = run_cli("generate", wm["data"], "--path", wm["post"], "--input", f, "--early-stop", "beam", *flags, *fmt)
        b = run_cli("generate", "--path", out, "--input", f, *flags, *fmt)
        assert a.code == b.code == 0, (a, b)
        la, lb = lines(a.out), lines(b.out)
        assert len(la) == len(lb) and any(x.startswith("P-") for x in la) == ("fairseq" in fmt)
        for x, y in zip(la, lb):
            xs, ys = x.split("\t"), y.split("\t")
            assert len(xs) == len(ys)
            for u, v in zip(xs, ys):
                if _numbers(u) is not None:  # scores (one, or P- lines' per-token ones)
                    assert len(_numbers(u)) == len(_numbers(v)), (x, y)
                    # printed to 4 decimals: scores within TOL may round one printed step apart
                    # (-2.11975 +- 1e-6 prints as -2.1197 or -2.1198)
                    assert all(abs(p - q) < TOL + PRINTED_STEP or p == q for p, q in zip(_numbers(u), _numbers(v))), (x, y)
                else:
                    assert u == v


def _numbers(field: str) -> list[float] | None:
    try:
        return [float(p) for p in field.split()] or None
    except ValueError:
        return None


def test_generate_pipes_into_score(wm, tmp_path):
    """`nmtkit generate --path EXPORT --input - | nmtkit score --ref REF` (separate processes)."""
    out = export_dir(wm, "post")
    texts = [s for s in sentences(20, 4) if s.strip()]
    ref = tmp_path / "ref.en"
    ref.write_text("\n".join(" ".join(ENGLISH.get(w, w) for w in s.split()) for s in texts) + "\n", encoding="utf-8")
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    nmtkit = f"{sys.executable} -m nmtkit"
    cmd = (f"{nmtkit} generate --path {out} --input - --lenpen-form fairseq --quiet --threads 1 "
           f"| {nmtkit} score --ref {ref}")
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], input="\n".join(texts) + "\n", env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "BLEU" in p.stdout


def test_parsing_export_gives_native_trees(tmp_path_factory, run_cli):
    """The parsing model: separate vocabularies, target-only tied embeddings; trees repaired as today."""
    from nmtkit.cli import main

    root = tmp_path_factory.mktemp("parse")
    write_inputs(root)
    data = root / "data"
    with pytest.raises(SystemExit) as e:
        main(["preprocess", "--task", "parsing", "--trainpref", str(root / "train"), "--extra-train",
              str(root / "more.trees"), "--validpref", str(root / "valid"), "--testpref", str(root / "test.mrg"),
              "--destdir", str(data), "--bpe", "none"])
    assert e.value.code == 0
    ckpt = train(data, root / "ck", 150, max_tokens=1024, arch_overrides={"share_embeddings": "decoder"})
    out = root / "parse-ct2"
    r = run_cli("export", data, "--path", ckpt, "--output", out)
    assert r.code == 0, r
    info = json.loads((out / "nmtkit.json").read_text())
    assert info["task"] == "parsing" and info["data"]["parsing"] == {"pos_tags": "keep"}
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "dict.lin.txt", "dict.words.txt", "model.bin",
                                                     "nmtkit.json", "source_vocabulary.json", "target_vocabulary.json"]
    words = (data / "test.words").read_text(encoding="utf-8").splitlines() + [
        "Pierre Vinken will join the board as a director .", "", "a ( b ) c"]
    f = root / "in.words"
    f.write_text("\n".join(words) + "\n", encoding="utf-8")
    flags = ["--lenpen-form", "fairseq", "--quiet", "--threads", "1"]
    native = run_cli("generate", data, "--path", ckpt, "--input", f, "--early-stop", "beam", *flags)
    ct2 = run_cli("generate", "--path", out, "--input", f, *flags)
    assert native.code == ct2.code == 0, (native, ct2)
    assert lines(ct2.out) == lines(native.out)
    check_trees(lines(ct2.out), words)
    assert any(line.count("(") > 3 for line in lines(ct2.out))  # guard: the model builds trees
    from nmtkit import Translator

    nat = Translator.load(ckpt, data, threads=1, warn=lambda m: None, **NATIVE)
    ctr = Translator.load(out, threads=1, warn=lambda m: None, **FAIRSEQ)
    assert ctr.search.max_len_b == 300  # a parsing model's output limit: input + 300
    # the best tree of each sentence (n-best lists are compared on the translation models above:
    # on this model CTranslate2 finds a longer, better second tree for one sentence after native
    # search with fairseq's rule has stopped, docs/export.md "How close to native search")
    assert_same(nat, ctr, words, beam=4)


# ------------------------------------------------------------------------ quantization, averaging, EMA


def test_int8_export_loads_and_translates(wm):
    from nmtkit import Translator

    f32, i8 = export_dir(wm, "post"), export_dir(wm, "post", "--quantization", "int8")
    info = json.loads((i8 / "nmtkit.json").read_text())
    assert info["runtime"]["quantization"] == "int8"
    assert (i8 / "model.bin").stat().st_size < 0.6 * (f32 / "model.bin").stat().st_size
    tr = Translator.load(i8, threads=1, **FAIRSEQ)
    assert tr.engine.compute_type == "default"  # the export's int8
    texts = [s for s in sentences(40, 5) if s.strip()]
    full = Translator.load(f32, threads=1, **FAIRSEQ)
    got = tr.translate_nbest(texts)
    assert all(r[0].text for r in got)
    # the int8 weights give nearly the float32 model's token log-probabilities: how near depends on
    # the CPU's int8 kernels (mean 0.01 with AVX-512 VNNI; 0.21 on an AVX2-only CPU, whose int8
    # products go through 16-bit sums)
    import numpy as np

    src = [full.src_dict.string(it.ids) for it in full.encode(texts)]
    hyp = [full.tgt_dict.string(r[0].hypothesis.tokens) for r in full.translate_nbest(texts)]
    a, b = (t.engine.runtime.score_batch(src, hyp, max_input_length=0) for t in (full, tr))
    diff = np.concatenate([np.abs(np.array(x.log_probs) - np.array(y.log_probs)) for x, y in zip(a, b)])
    assert 0 < diff.mean() < 0.5
    # and its search finds translations that the float32 model rates nearly as well as its own:
    # which tokens win where this small model's candidates nearly tie depends on the int8 kernels
    # of the CPU (AVX2, AVX-512 VNNI), so the outputs are compared by their float32 log-probability
    # per token (0.14 nats apart on average on an AVX2-only CPU), not token by token
    mine = full.engine.runtime.score_batch(src, [full.tgt_dict.string(r[0].hypothesis.tokens) for r in got],
                                           max_input_length=0)
    per_token = [(sum(x.log_probs) / len(x.log_probs), sum(y.log_probs) / len(y.log_probs)) for x, y in zip(a, mine)]
    assert np.mean([f - q for f, q in per_token]) < 0.3, per_token


def test_averaged_checkpoint_export(wm):
    out = export_dir(wm, "avg")
    info = json.loads((out / "nmtkit.json").read_text())
    assert info["checkpoint"]["averaged_from"] == wm["avg_from"] and len(wm["avg_from"]) == 3
    assert [n.rsplit("_", 1)[1] for n in wm["avg_from"]] == ["50.pt", "100.pt", "150.pt"]
    native, ct2 = load_both(wm, "avg", out, max_len_a=0.0, max_len_b=40)
    assert_same(native, ct2, sentences(30, 6))


def test_ema_export(wm, run_cli):
    ema, raw = export_dir(wm, "pre", "--ema"), export_dir(wm, "pre")
    assert json.loads((ema / "nmtkit.json").read_text())["checkpoint"]["ema"] is True
    native, ct2 = load_both(wm, "pre", ema, ema=True, max_len_a=0.0, max_len_b=40)
    texts = sentences(30, 7)
    assert_same(native, ct2, texts)
    from nmtkit import Translator

    raw_scores = [t.score for row in Translator.load(raw, threads=1, **FAIRSEQ).translate_nbest(texts) for t in row]
    assert raw_scores != [t.score for row in ct2.translate_nbest(texts) for t in row]  # other weights
    # a checkpoint without EMA weights: refused by the loader, naming the file
    r = run_cli("export", wm["data"], "--path", wm["post"], "--output", wm["root"] / "no-ema", "--ema")
    assert r.code == 2 and f"--ema: {wm['post']} holds no EMA weights" in r.err
    assert not (wm["root"] / "no-ema").exists()


def test_sampling_greedy_and_the_api(wm):
    from nmtkit import Translator

    out = export_dir(wm, "post")
    native, ct2 = load_both(wm, "post", out, max_len_a=0.0, max_len_b=40)
    assert isinstance(ct2, Translator) and ct2.engine.name == "ctranslate2" and not ct2.engine.teacher_forcing
    texts = sentences(20, 8)
    # top-1 sampling is greedy search
    assert ct2.translate(texts, sampling=True, topk=1, beam=3) == native.translate(texts, beam=1)
    # samples: --beam of them per sentence, best first; a translator loaded with the same seed
    # draws the same samples (CTranslate2 seeds its worker thread once)
    sample = dict(sampling=True, beam=3, nbest=3, seed=1, temperature=1.5, threads=1, **FAIRSEQ)
    a = Translator.load(out, **sample).translate_nbest(texts)
    b = Translator.load(out, **sample).translate_nbest(texts)
    assert [[t.text for t in r] for r in a] == [[t.text for t in r] for r in b]
    assert len({t.text for r in a for t in r}) > 20  # they are samples
    assert all(len(r) == 3 and [t.score for t in r] == sorted((t.score for t in r), reverse=True)
               for r, s in zip(a, texts) if s.strip())
    # empty input: one empty translation of score 0, no model call; over-long input: truncated, named
    warnings = []
    tr = Translator.load(out, threads=1, warn=warnings.append, **FAIRSEQ)
    assert tr.max_source_tokens == 1023
    res = tr.translate_nbest(["", " ".join(["Hund"] * 1100)], max_len_a=0.0, max_len_b=5)
    assert res[0][0].text == "" and res[0][0].score == 0.0 and len(res[1][0].hypothesis.tokens) <= 5
    assert len(warnings) == 1 and warnings[0].startswith("sentence 2: ") and "truncated to 1023" in warnings[0]


# ------------------------------------------------------------------------ every architecture


def _shrunk(cfg):
    """The same architecture at 1/16 of the width (heads, layer counts, norms, tying, positions and
    the d_k / d_v ratios kept), with short position tables."""
    def small(v):
        return None if v is None else max(1, v // 16)

    return cfg.replace(d_model=cfg.d_model // 16, d_ff=cfg.d_ff // 16, d_k=small(cfg.d_k), d_v=small(cfg.d_v),
                       max_source_positions=40, max_target_positions=40)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_every_registry_architecture_converts_exactly(name, tmp_path):
    """The converted weights compute the model's own log-probabilities (teacher forcing, 1e-4),
    including Table 3 row B (d_k != d_v: zero-padded heads) and row E (learned positions)."""
    import numpy as np

    from nmtkit.backends.ctranslate2.convert import build_spec, convert
    from nmtkit.models import Transformer

    cfg = _shrunk(ARCHS[name])
    torch.manual_seed(0)
    V = 30
    model = Transformer(cfg, V, V).eval()
    tokens = ["<pad>", "<s>", "</s>", "<unk>"] + [f"t{i}" for i in range(V - 4)]
    convert(build_spec(model, tokens, tokens), str(tmp_path / "m"), "float32")
    tr = ctranslate2.Translator(str(tmp_path / "m"), intra_threads=1)
    rng = np.random.default_rng(0)
    pairs = [(list(rng.integers(4, V, size=rng.integers(1, 20))), list(rng.integers(4, V, size=rng.integers(1, 20))))
             for _ in range(6)]
    scored = tr.score_batch([[tokens[i] for i in s] for s, _ in pairs], [[tokens[i] for i in t] for _, t in pairs],
                            max_input_length=0)
    for (s, t), r in zip(pairs, scored):
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([s + [2]]), torch.tensor([[1] + t])).float(), dim=-1)[0]
        want = lp.gather(1, torch.tensor(t + [2]).unsqueeze(1)).view(-1)
        assert np.abs(np.array(r.log_probs) - want.numpy()).max() < TOL, name


@pytest.mark.parametrize("fmt,runtime", [("ctranslate2", "CTranslate2"), ("onnx", "ONNX"),
                                         ("huggingface", "Hugging Face")])
def test_a_setting_the_conversion_does_not_know_is_refused(fmt, runtime):
    """A field added to ArchConfig later is refused (with its flag) until the conversion handles it."""
    import importlib

    from nmtkit.models.registry import ArchConfig

    check_representable = importlib.import_module(f"nmtkit.backends.{fmt}.convert").check_representable
    fields = [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(ArchConfig)]
    Later = dataclasses.make_dataclass("Later", [*fields, ("position_kind", str, dataclasses.field(default="sinusoid"))],
                                       frozen=True)
    if fmt != "huggingface":  # (its own checks read ArchConfig's derived sizes, which Later lacks)
        check_representable(Later())  # its default: the model is what the conversion writes
    with pytest.raises(UserError, match=rf"^--position-kind rotary: the {runtime} export does not represent"):
        check_representable(Later(position_kind="rotary"))


def test_the_layer_without_a_residual_exports_to_onnx_only():
    """`--encoder-no-residual-layer`: ONNX builds the layer without its Add (tests/test_onnx.py checks
    the search); CTranslate2's and MarianMT's layers always add the residual, so both refuse."""
    import importlib

    from nmtkit.models.registry import ArchConfig

    cfg = ArchConfig(encoder_layers=3, encoder_no_residual_layer=2)
    importlib.import_module("nmtkit.backends.onnx.convert").check_representable(cfg)
    for fmt, runtime in (("ctranslate2", "CTranslate2"), ("huggingface", "Hugging Face")):
        with pytest.raises(UserError, match=rf"^--encoder-no-residual-layer 2: the {runtime} export does not "
                                            "represent this setting"):
            importlib.import_module(f"nmtkit.backends.{fmt}.convert").check_representable(cfg)


# ------------------------------------------------------------------------ refusals


def test_export_refusals(wm, tmp_path, run_cli, monkeypatch):
    data, ckpt = wm["data"], wm["post"]
    out = tmp_path / "out"
    for args, message in [
        (["--quantization", "int4"], "--quantization must be one of float32, int8"),
        (["--format", "tflite"], "--format must be one of ctranslate2, onnx, huggingface, got 'tflite'"),
    ]:
        r = run_cli("export", data, "--path", ckpt, "--output", out, *args)
        assert r.code == 2 and message in r.err and "Traceback" not in r.err, r
        assert not out.exists()
    # the runtime is missing: one line saying how to install it
    exported = export_dir(wm, "post")  # made while the runtime is there (this test may run alone)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    r = run_cli("export", data, "--path", ckpt, "--output", out)
    assert r.code == 2 and "pip install -e '.[ctranslate2]' in the nmtkit checkout" in r.err and len(r.err.strip().splitlines()) == 1
    (tmp_path / "x").write_text("Hund\n", encoding="utf-8")
    r = run_cli("generate", "--path", exported, "--input", tmp_path / "x", "--lenpen-form", "fairseq")
    assert r.code == 2 and "pip install -e '.[ctranslate2]' in the nmtkit checkout" in r.err
    monkeypatch.undo()
    # an existing --output: refused without --force; --force replaces only an earlier export
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run_cli("export", data, "--path", ckpt, "--output", out)
    assert r.code == 2 and f"--output {out} exists; pass --force to replace it" in r.err
    r = run_cli("export", data, "--path", ckpt, "--output", out, "--force")
    assert r.code == 2 and "is not an nmtkit export directory" in r.err
    assert (out / "keep.txt").read_text() == "mine"
    # an export that holds the checkpoint being exported would lose it
    old = tmp_path / "old"
    shutil.copytree(export_dir(wm, "post"), old)
    shutil.copy(ckpt, old / "model.pt")
    r = run_cli("export", data, "--path", old / "model.pt", "--output", old, "--force")
    assert r.code == 2 and f"--output {old} would contain --path {old / 'model.pt'}" in r.err
    assert (old / "model.pt").exists()


@pytest.mark.parametrize("args,message", [
    (["--lenpen-form", "gnmt"], "--lenpen-form gnmt: CTranslate2 has only fairseq's length penalty |Y|^alpha; pass --lenpen-form fairseq"),
    (["--lenpen-form", "fairseq", "--early-stop", "bound"], "--early-stop bound: CTranslate2's beam search stops as fairseq's does; use --early-stop beam"),
    (["--lenpen-form", "fairseq", "--early-stop", "none"], "--early-stop none: CTranslate2's beam search"),
    (["--lenpen-form", "fairseq", "--unk-penalty", "1"], "--unk-penalty: CTranslate2 cannot penalize <unk>"),
    (["--lenpen-form", "fairseq", "--ema"], "holds the weights chosen when it was exported (nmtkit export --ema)"),
    (["--lenpen-form", "fairseq", "--device", "mps"], "--device mps: the CTranslate2 runtime runs on auto, cpu, cuda or cuda:N"),
    (["--lenpen-form", "fairseq", "--precision", "fp8"], "--precision must be one of fp32, bf16, fp16"),
])
def test_generate_refuses_what_ctranslate2_cannot_honour(wm, tmp_path, run_cli, args, message):
    f = tmp_path / "in.de"
    f.write_text("Hund\n", encoding="utf-8")
    r = run_cli("generate", "--path", export_dir(wm, "post"), "--input", f, *args)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r


def test_an_export_defaults_to_its_runtimes_rules(wm, tmp_path, run_cli, capsys):
    """No decoding flag needed: an export decodes with fairseq's length penalty and stopping rule,
    said once in a note; the same output as with those flags given, and the API's defaults too."""
    from nmtkit import Translator

    out = export_dir(wm, "post")
    capsys.readouterr()  # the export's own line, when this test made it
    f = tmp_path / "in.de"
    f.write_text("\n".join(sentences(30, 5)) + "\n", encoding="utf-8")
    r = run_cli("generate", "--path", out, "--input", f, "-q")
    note = (f"nmtkit: note: {out} is run by CTranslate2, which decodes with fairseq's rules: --lenpen-form fairseq "
            "--early-stop beam (the paper's gnmt length penalty and exact stopping need the checkpoint)")
    assert r.code == 0 and r.err.strip().splitlines() == [note], r
    given = run_cli("generate", "--path", out, "--input", f, "-q", "--lenpen-form", "fairseq", "--early-stop", "beam")
    assert given.code == 0 and given.err == "" and given.out == r.out and len(r.out.splitlines()) == len(sentences(30, 5))
    r = run_cli("generate", "--path", out, "--input", f, "-q", "--early-stop", "beam")
    assert r.err.strip() == note.replace(" --early-stop beam", ""), r  # only what was chosen is named
    tr = Translator.load(out, threads=1)
    assert (tr.search.lenpen_form, tr.search.early_stop) == ("fairseq", "beam")
    assert tr.translate(sentences(30, 5)) == given.out.splitlines()
    native = Translator.load(wm["post"], wm["data"], threads=1)  # a checkpoint keeps the paper's rules
    assert (native.search.lenpen_form, native.search.early_stop) == ("gnmt", "bound")


def test_attention_on_an_export_says_it_needs_the_checkpoint(wm, tmp_path, run_cli):
    out = export_dir(wm, "post")
    r = run_cli("attention", wm["data"], "--path", out, "--source", "Hund", "--format", "json", "-o", tmp_path / "a.json")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r
    assert f"--path {out}: attention needs nmtkit's own model: load the checkpoint and its data directory" in r.err
    assert "run by CTranslate2, which exposes no attention" in r.err and not (tmp_path / "a.json").exists()


def test_generate_refuses_misuse_of_an_export(wm, tmp_path, run_cli):
    from nmtkit import Translator

    out = export_dir(wm, "post")
    f = tmp_path / "in.de"
    f.write_text("Hund\n", encoding="utf-8")
    fs = ["--lenpen-form", "fairseq"]
    for args, message in [
        ([wm["data"], "--path", out, "--input", f], f"--path {out} is an export directory: it carries its own dictionaries"),
        (["--path", out, *fs], "which translates raw text: give --input FILE"),
        (["--path", out, "--gen-subset", "valid", *fs], "--gen-subset valid needs the checkpoint and its data directory"),
        (["--path", out, "--path", out, "--input", f, *fs], "ensembles need checkpoints"),
        (["--path", wm["post"], "--input", f], "missing DATA_DIR: the data directory the checkpoint was trained with"),
    ]:
        r = run_cli("generate", *args)
        assert r.code == 2 and message in r.err, (args, r)
    # the API says the same
    with pytest.raises(UserError, match="lenpen_form='fairseq'"):
        Translator.load(out, lenpen_form="gnmt")
    with pytest.raises(UserError, match="load it alone, without data_dir"):
        Translator.load(out, wm["data"], **FAIRSEQ)
    with pytest.raises(UserError, match="--early-stop bound"):
        Translator.load(out, **FAIRSEQ).translate(["Hund"], early_stop="bound")


def test_a_damaged_export_is_named(wm, tmp_path, run_cli):
    f = tmp_path / "in.de"
    f.write_text("Hund\n", encoding="utf-8")
    fs = ["--lenpen-form", "fairseq"]
    for damage, message in [
        (lambda d: (d / "dict.en.txt").write_text("x 1\n"), "dict.en.txt: checksum mismatch"),
        (lambda d: (d / "model.bin").unlink(), "model.bin: missing (listed in nmtkit.json)"),
        (lambda d: (d / "nmtkit.json").write_text(json.dumps({**json.loads((d / "nmtkit.json").read_text()),
                                                              "format_version": 99})),
         "export format version 99 is newer than this nmtkit understands"),
    ]:
        d = tmp_path / f"copy{len(message)}"
        shutil.copytree(export_dir(wm, "post"), d)
        damage(d)
        r = run_cli("generate", "--path", d, "--input", f, *fs)
        assert r.code == 2 and message in r.err, r


# ------------------------------------------------------------------------ atomic output


def test_export_is_atomic_and_force_replaces(wm, tmp_path, run_cli, monkeypatch):
    import nmtkit.backends.export as E

    data, ckpt = wm["data"], wm["post"]
    out = tmp_path / "m"

    def boom(*a, **k):
        raise OSError("disk full")

    # a failure half-way: nothing at --output, no temporary folder left
    monkeypatch.setattr(E.shutil, "copy2", boom)
    r = run_cli("export", data, "--path", ckpt, "--output", out)
    assert r.code == 1 and "disk full" in r.err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    r = run_cli("export", data, "--path", ckpt, "--output", out)
    assert r.code == 0, r
    assert f"-> {out}" in r.out
    before = (out / "nmtkit.json").read_bytes()
    (out / "marker").write_text("old")
    # a failure while replacing with --force: the earlier export stays as it was
    monkeypatch.setattr(E.shutil, "copy2", boom)
    r = run_cli("export", data, "--path", wm["pre"], "--output", out, "--force")
    assert r.code == 1
    assert (out / "nmtkit.json").read_bytes() == before and (out / "marker").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    monkeypatch.undo()
    # --force: replaced whole (nothing of the old directory left), no leftovers beside it
    r = run_cli("export", data, "--path", wm["pre"], "--output", out, "--force")
    assert r.code == 0, r
    assert not (out / "marker").exists()
    assert json.loads((out / "nmtkit.json").read_text())["checkpoint"]["file"] == wm["pre"].name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# ------------------------------------------------------------------------ what a killed export leaves


def _tiny_checkpoint(root: Path) -> tuple[Path, Path]:
    """A data dir (whitespace tokens) and an untrained tiny checkpoint of it: exports in a second."""
    from conftest import word_mapping_data_dir

    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer

    data = word_mapping_data_dir(root, 40, 4, 8, seed=2)
    src, tgt = load_dictionaries(data)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2)
    ckpt = root / "tiny.pt"
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": Transformer(cfg, len(src), len(tgt)).state_dict(),
                     "dictionaries": {"src_sha256": src.sha256, "tgt_sha256": tgt.sha256, "src_lang": "de",
                                      "tgt_lang": "en"}, "update": 1, "epoch": 1}, ckpt)
    return data, ckpt


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# an export that stays in the middle of writing its directory until its stdin closes
LIVE = """
import sys
from nmtkit.backends.directory import atomic_directory
with atomic_directory(sys.argv[1]) as tmp:
    (tmp / "model.bin").write_bytes(b"partial")
    print(tmp.name, flush=True)
    sys.stdin.read()
"""


def test_the_next_export_removes_what_a_killed_one_left(tmp_path, run_cli):
    """A killed export leaves its hidden working folder (and, killed between the two renames of
    --force, the earlier export moved aside); the next export into the same folder removes the
    first and puts the second back, and keeps the folders of an export still running."""
    import signal

    data, ckpt = _tiny_checkpoint(tmp_path)
    exports = tmp_path / "exports"
    exports.mkdir()
    # 1. an export killed (SIGKILL: no clean-up can run) while it copies the data files
    killed = _python("import os, signal, sys\nimport nmtkit.backends.export as E\n"
                     "E.shutil.copy2 = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
                     "from nmtkit.cli import main\nmain(sys.argv[1:])",
                     "export", str(data), "--path", str(ckpt), "--output", str(exports / "m"))
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    (left,) = exports.iterdir()
    assert left.name.startswith(".m.nmtkit-export-") and left.name.endswith(".tmp") and (left / "model.bin").is_file()
    # 2. a --force replacement of `old` killed between its two renames: only the moved-aside copy is left
    moved = exports / ".old.nmtkit-export-abcd1234.old"
    shutil.copytree(export_dir_of(run_cli, data, ckpt, tmp_path / "first"), moved / "old")
    (exports / ".old.nmtkit-export-efgh5678.tmp").mkdir()  # its new directory, unfinished
    # 3. an export still running into the same folder, and folders that are not an export's
    live = _python(LIVE, str(exports / "live"))
    live_tmp = exports / live.stdout.readline().strip()
    assert live_tmp.is_dir() and live_tmp.name.startswith(".live.nmtkit-export-")
    foreign = [exports / ".m.abcdefgh.tmp", exports / ".notes", exports / ".x.nmtkit-export-short.tmp"]
    for p in foreign:
        p.mkdir()
    try:
        r = run_cli("export", data, "--path", ckpt, "--output", exports / "m")
        assert r.code == 0, r
        assert f"removed {left}, left by an interrupted 'nmtkit export'" in r.out.splitlines()
        assert (f"restored {exports / 'old'} from {moved.name}, where an interrupted 'nmtkit export --force' "
                "had moved it") in r.out
        assert json.loads((exports / "old" / "nmtkit.json").read_text())["checkpoint"]["file"] == Path(ckpt).name
        assert sorted(p.name for p in exports.iterdir()) == sorted(
            ["m", "old", live_tmp.name] + [p.name for p in foreign])
        assert (live_tmp / "model.bin").read_bytes() == b"partial"  # a live export's folder is kept
    finally:
        live.communicate("", timeout=60)
    assert live.returncode == 0 and (exports / "live" / "model.bin").is_file() and not live_tmp.exists()
    # nothing left to clean: the next export says nothing about leftovers
    r = run_cli("export", data, "--path", ckpt, "--output", exports / "m", "--force")
    assert r.code == 0 and r.out.startswith("exported "), r
    assert sorted(p.name for p in exports.iterdir()) == sorted(["m", "old", "live"] + [p.name for p in foreign])


def export_dir_of(run_cli, data: Path, ckpt: Path, out: Path) -> Path:
    r = run_cli("export", data, "--path", ckpt, "--output", out)
    assert r.code == 0, r
    return out


def test_leftovers_of_a_live_export_are_kept_in_its_own_process_too(tmp_path):
    from nmtkit.backends.directory import atomic_directory, remove_leftovers

    out = tmp_path / "m"
    dead = tmp_path / ".m.nmtkit-export-00000000.old"
    dead.mkdir()
    with atomic_directory(out) as tmp:
        (tmp / "model.bin").write_bytes(b"x")
        assert remove_leftovers(out) == [f"removed {dead}, left by an interrupted 'nmtkit export'"]
        assert sorted(p.name for p in tmp_path.iterdir()) == [tmp.name]
        (out).mkdir()  # an earlier export, replaced at the end of the block
        (out / "old.bin").write_bytes(b"y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and sorted(p.name for p in out.iterdir()) == ["model.bin"]
    assert remove_leftovers(out) == []


def test_a_failed_rename_puts_the_earlier_export_back(tmp_path, monkeypatch):
    from nmtkit import workdir
    from nmtkit.backends import directory as D

    monkeypatch.setattr(workdir, "exchange", lambda a, b: False)  # the two renames, where the system cannot swap
    out = tmp_path / "m"
    out.mkdir()
    (out / "nmtkit.json").write_text("{}")
    real = D.os.replace

    def replace(a, b):
        if Path(b) == out and ".tmp" in Path(a).name:
            raise OSError("rename failed")
        return real(a, b)

    monkeypatch.setattr(D.os, "replace", replace)
    with pytest.raises(OSError, match="rename failed"), D.atomic_directory(out) as tmp:
        (tmp / "model.bin").write_bytes(b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and (out / "nmtkit.json").read_text() == "{}"



# --- property tests (Hypothesis) ---
# An export's nmtkit.json written by hand and mutated (keys missing, values of the wrong type,
# extra keys, file names that leave the directory, huge numbers, text that is not JSON): read_info,
# describe, check_files and the readers of the copied data files either work or refuse with one
# line naming the directory's description or the file at fault; never a traceback, never a file
# outside the directory read.

import hashlib  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nmtkit.backends.directory import INFO_NAME, check_files, read_info  # noqa: E402
from nmtkit.data.dictionary import Dictionary  # noqa: E402
from nmtkit.data.manifest import _VERIFIED, is_file_name  # noqa: E402
from tests.json_mutations import mutate, replaced  # noqa: E402

_CODES = "#version: 0.2\ns t</w>\ne st</w>\nl o\n"
_EXPORT_FILES = {
    "model.bin": b"\x00" * 16, "config.json": b"{}", "bpe.codes": _CODES.encode(),
    "dict.de.txt": Dictionary.from_counts({"hund": 3, "katze": 2}).to_text().encode(),
    "dict.en.txt": Dictionary.from_counts({"dog": 3, "low": 1}).to_text().encode(),
}
_INFO = {
    "format": "nmtkit-export", "format_version": 1, "nmtkit_version": "0.1.0",
    "runtime": {"name": "ctranslate2", "quantization": "none", "files": ["config.json", "model.bin"]},
    "arch": "transformer", "arch_config": {}, "source_lang": "de", "target_lang": "en", "task": "translation",
    "checkpoint": {"file": "m.pt", "sha256": "0" * 64, "ema": False, "update": 1},
    "data": {"source_lang": "de", "target_lang": "en",
             "subword": {"kind": "subword-nmt", "kinds": {"de": "subword-nmt", "en": "subword-nmt"}, "joint": True,
                         "files": {"de": "bpe.codes", "en": "bpe.codes"}},
             "dictionaries": {"joined": False, "de": {"file": "dict.de.txt", "size": 6},
                              "en": {"file": "dict.en.txt", "size": 6}},
             "files": {n: hashlib.sha256(_EXPORT_FILES[n]).hexdigest() for n in ("bpe.codes", "dict.de.txt", "dict.en.txt")},
             "fingerprint": None},
}
# refusals of what the description holds rather than of how it is written, in words of their own
_SEMANTIC = ("language ", "unknown subword model kind ")


def _write_export(root: Path, text: str) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    d = root / "exported"
    d.mkdir(parents=True)
    for name, b in _EXPORT_FILES.items():
        (d / name).write_bytes(b)
    (root / "outside.txt").write_bytes(b"not the export's\n")
    (d / INFO_NAME).write_text(text, encoding="utf-8")
    return d


def _use_export(d: Path) -> None:
    """read_info, describe, and what generate reads through the ModelSource: each works or
    refuses with one line."""
    from nmtkit.backends.registry import describe

    def one_line(e: UserError) -> None:
        msg = str(e)
        assert "\n" not in msg and msg and (str(d) in msg or msg.startswith(_SEMANTIC)), msg

    try:
        read_info(d)
        source = describe([str(d)], None)
        source.check()
    except UserError as e:
        one_line(e)
        return
    data = source.info["data"]
    assert all(is_file_name(n) for n in [*data["files"], *source.info["runtime"].get("files", [])])
    for read in (source.dictionaries, lambda: source.subword_model("de").encode("lowest"),
                 lambda: source.subword_model("en")):
        try:
            read()
        except UserError as e:
            one_line(e)


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_export")


def test_the_hand_made_export_directory_reads(fuzz_root):
    """The property tests' starting point is a good export directory: every reader works on it."""
    from nmtkit.backends.registry import describe

    d = _write_export(fuzz_root, json.dumps(_INFO))
    source = describe([str(d)], None)
    source.check()
    src, tgt = source.dictionaries()
    assert "hund" in src and "dog" in tgt and source.subword_model("en").encode("lowest") == ["lo@@", "w@@", "est"]


@pytest.mark.fuzz
@given(data=st.data())
def test_any_mutation_of_nmtkit_json_is_read_or_refused_in_one_line(fuzz_root, data):
    d = _write_export(fuzz_root, json.dumps(mutate(data, _INFO)))
    _VERIFIED.clear()  # each example as a new process
    _use_export(d)


@pytest.mark.fuzz
@given(text=st.one_of(
    st.sampled_from(["", "{", "[]", "null", "1", "9" * 5000, "[" * 5000, json.dumps(_INFO)[:-1],
                     json.dumps(_INFO).replace('"format_version": 1', '"format_version": ' + "9" * 5000),
                     json.dumps(_INFO).replace('"format_version": 1', '"format_version": 1e999')]),
    st.text(max_size=30)))
def test_nmtkit_json_that_is_not_json_is_refused_in_one_line(fuzz_root, text):
    d = _write_export(fuzz_root, text)
    _VERIFIED.clear()
    _use_export(d)


@pytest.mark.parametrize("where, value, message", [
    (("runtime", "name"), ["ctranslate2"], "runtime.name must be the name of a runtime, got ['ctranslate2']"),
    (("runtime", "files"), ["../outside.txt"], "runtime.files must be a list of file names in the directory, "
                                               "got ['../outside.txt']"),
    (("runtime", "files"), 3, "runtime.files must be a list of file names in the directory, got 3"),
    (("data", "files"), {"../outside.txt": "0" * 64}, "data.files must be keyed by file names in the directory, "
                                                      "got '../outside.txt'"),
    (("data", "dictionaries", "de", "file"), "/etc/hostname", "data.dictionaries.de.file must be a file name in "
                                                              "the directory, got '/etc/hostname'"),
    (("data", "subword"), None, "incomplete export description (no 'data.subword')"),
    # longer than any file name: OSError (ENAMETOOLONG) from the dictionary's is_file()
    (("data", "dictionaries", "de", "file"), "x" * 300, "data.dictionaries.de.file must be a file name in the "
                                                        "directory, got '" + "x" * 56 + "..."),
    (("data", "files", "bpe.codes"), {"sha": 1}, "data.files['bpe.codes'] must be a sha256 (hex), got {'sha': 1}"),
])
def test_nmtkit_json_entries_of_the_wrong_type_or_outside_the_directory_are_named(fuzz_root, where, value, message):
    """Before: TypeError tracebacks (an unhashable runtime name in the registry, a sha256 as a key
    of the checked files, a number as the runtime's files) and files outside the directory read."""
    from nmtkit.backends.registry import describe

    d = _write_export(fuzz_root, json.dumps(replaced(_INFO, where, value)))
    with pytest.raises(UserError) as e:
        check_files(d, read_info(d)) if where[1] != "name" else describe([str(d)], None)
    assert str(e.value) == f"{d / INFO_NAME}: {message}"


# ------------------------------------------------------------------------ lexical shortlists


@pytest.fixture(scope="module")
def wm_shortlist(wm):
    """A shortlist of the word task built by `nmtkit shortlist` (few candidates per piece, so that
    a batch's union is a real restriction) and a CTranslate2 export that carries it as vmap.txt."""
    from nmtkit.cli import main

    sl = wm["root"] / "shortlist.txt"
    for args in (["shortlist", str(wm["data"]), "--output", str(sl), "--best", "6", "--frequent", "4"],
                 ["export", str(wm["data"]), "--path", str(wm["post"]), "--output", str(wm["root"] / "post-sl-ct2"),
                  "--shortlist", str(sl)]):
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 0
    return sl, wm["root"] / "post-sl-ct2"


def test_ctranslate2_vmap_equals_native_shortlist(wm, wm_shortlist):
    """CTranslate2 applying the export's vmap.txt and nmtkit's own search over the same shortlist
    find the same hypotheses with the same scores: the same candidates per batch, the same
    distribution over them."""
    from nmtkit import Translator

    sl, export = wm_shortlist
    assert (export / "vmap.txt").read_bytes() == sl.read_bytes()
    quiet = dict(threads=1, warn=lambda msg: None, max_len_a=0.0, max_len_b=40)
    native = Translator.load(wm["post"], wm["data"], shortlist=sl, **quiet, **NATIVE)
    ct2 = Translator.load(export, shortlist=export / "vmap.txt", **quiet, **FAIRSEQ)
    # sentences whose outputs end before the output limit: CTranslate2 closes one that reaches it
    # with </s> by rescoring it (score_batch), which knows no vocabulary map (docs/export.md)
    texts = sentences(80, 3)
    for settings in (dict(), dict(beam=1), dict(beam=5, nbest=2)):
        texts = [t for t, ok in zip(texts, within_limit(native, texts, native.translate_nbest(texts, **settings),
                                                        **settings)) if ok]
    assert len(texts) >= 40
    assert_same(native, ct2, texts)
    assert_same(native, ct2, texts, beam=1)
    assert_same(native, ct2, texts, beam=5, nbest=2)
    # the shortlist restricts: the candidates of one batch are a part of the vocabulary, and the
    # scores are normalised over them (higher than the full vocabulary's on the same tokens)
    full = Translator.load(wm["post"], wm["data"], **quiet, **NATIVE)
    one = [t for t in texts if 0 < len(t.split()) <= 3][:6]
    sizes = [len(native.engine.shortlist.candidates([it.ids])) for it in native.encode(one)]
    assert max(sizes) < len(native.tgt_dict) * 0.8, sizes
    native.batch_size = full.batch_size = 1
    same = [(a, b) for a, b in zip(native.translate_nbest(one), full.translate_nbest(one))
            if a[0].hypothesis.tokens == b[0].hypothesis.tokens and a[0].hypothesis.tokens]
    assert same and all(a[0].logprob > b[0].logprob for a, b in same)


def test_shortlist_refusals(wm, wm_shortlist, tmp_path, run_cli):
    sl, export = wm_shortlist
    other = tmp_path / "other.txt"
    other.write_text(sl.read_text(encoding="utf-8").rstrip("\n") + "\n\n", encoding="utf-8")  # the rules, other bytes
    r = run_cli("generate", "--path", export, "--input", "-", "--shortlist", other, "--lenpen-form", "fairseq")
    assert r.code == 2 and f"--shortlist {other}: not the export's own vocabulary map vmap.txt" in r.err, r
    r = run_cli("generate", "--path", export_dir(wm, "post"), "--input", "-", "--shortlist", sl,
                "--lenpen-form", "fairseq")
    assert r.code == 2 and "this CTranslate2 export has no vocabulary map" in r.err, r
    r = run_cli("export", wm["data"], "--path", wm["post"], "--output", tmp_path / "hf", "--format", "huggingface",
                "--shortlist", sl)
    assert r.code == 2 and "--shortlist: the huggingface export's runtime has no vocabulary selection" in r.err, r
    bad = tmp_path / "bad.txt"
    first, second = sl.read_text(encoding="utf-8").splitlines()[:2]
    bad.write_text(f"{first}\n{second.replace(chr(9), ' ')}\n", encoding="utf-8")  # no tab on line 2
    for args in (["generate", wm["data"], "--path", wm["post"], "--input", "-"],
                 ["export", wm["data"], "--path", wm["post"], "--output", tmp_path / "x"]):
        r = run_cli(*args, "--shortlist", bad)
        assert r.code == 2 and f"{bad}:2:" in r.err and len(r.err.strip().splitlines()) == 1, r
    assert not (tmp_path / "x").exists()


def test_generate_with_a_shortlist(wm, wm_shortlist, tmp_path, run_cli):
    """`generate --shortlist` gives what `Translator.load(..., shortlist=)` gives; its outputs are
    made of the candidates of their batch."""
    from nmtkit import Translator

    sl, _ = wm_shortlist
    texts = sentences(20, 4)
    src = tmp_path / "in.de"
    src.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    r = run_cli("generate", wm["data"], "--path", wm["post"], "--input", src, "--shortlist", sl, "--beam", "3",
                "--batch-size", "4")
    assert r.code == 0, r
    tr = Translator.load(wm["post"], wm["data"], shortlist=sl, threads=1, beam=3, batch_size=4)
    assert lines(r.out) == tr.translate(texts)
    for batch in range(0, len(texts), 4):  # batches are formed after sorting by length: check per sentence
        for item, hyp in zip(tr.encode(texts[batch:batch + 1]), tr.translate_nbest(texts[batch:batch + 1])):
            allowed = set(tr.engine.shortlist.candidates([item.ids]).tolist())
            assert set(hyp[0].hypothesis.tokens) <= allowed
