"""`nmtkit.Translator` (docs/api.md) and the one checkpoint loader (`nmtkit.models.loading.load_models`).

The reference is `nmtkit generate` itself, run in-process on the same lines: the API must give
the same texts, the same n-best lists and scores, with the same defaults, for one model and for an
ensemble. The tiny data directory and random-initialised checkpoints are test_generate.py's.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit.errors import UserError
from tests.test_generate import COMMON, MAX_SRC_POS, TEST_SRC, lines, setup  # noqa: F401 - fixture
from tests.test_parsing_pipeline import check_trees, make_checkpoint, parsing_dir  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[1]
LONG = " ".join(["Straße"] * 40)  # over the model's MAX_SRC_POS - 1 source tokens
SENTENCES = [*TEST_SRC, LONG, "Hund"]


def generate_lines(run_cli, data, paths, src_file, *args) -> list[str]:
    path_args = [a for p in paths for a in ("--path", p)]
    r = run_cli("generate", data, *path_args, "--input", src_file, *COMMON, *args)
    assert r.code == 0, r
    return lines(r.out)


@pytest.fixture(scope="module")
def src_file(setup, tmp_path_factory):  # noqa: F811
    f = tmp_path_factory.mktemp("tr") / "in.de"
    f.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return f


@pytest.fixture(scope="module")
def translator(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    return Translator.load(ckpt, data, threads=1, max_len_b=6, warn=lambda msg: None)


# ------------------------------------------------------------------------ same as generate


def test_translate_equals_generate_input(setup, src_file, run_cli):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    r = run_cli("generate", data, "--path", ckpt, "--input", src_file, *COMMON)
    assert r.code == 0, r
    want = lines(r.out)
    warnings = []
    tr = Translator.load(ckpt, data, threads=1, max_len_b=6, warn=warnings.append)
    got = tr.translate(SENTENCES)
    assert got == want
    assert got[2] == got[4] == "" and any(got)  # empty and blank lines; the model does produce words
    # over-long sentences: truncated with the warnings of generate, naming `sentence N` for `FILE:N`
    cli_warnings = [x.removeprefix("nmtkit: warning: ") for x in r.err.splitlines() if x.strip()]
    assert len(warnings) == 2 and warnings == [x.replace(f"{src_file}:", "sentence ") for x in cli_warnings]
    n = len(SENTENCES) - 1
    assert re.fullmatch(rf"sentence {n}: \d+ tokens, truncated to {MAX_SRC_POS - 1} \(the model accepts "
                        rf"{MAX_SRC_POS} source positions including </s>\)", warnings[1])
    # batching never changes the output
    tr2 = Translator.load(ckpt, data, threads=1, max_len_b=6, max_tokens=7, warn=lambda m: None)
    assert tr2.translate(SENTENCES) == want
    assert Translator.load(ckpt, data, max_len_b=6, batch_size=1, warn=lambda m: None).translate(SENTENCES) == want


def test_ensemble_equals_generate_ensemble(setup, src_file, run_cli):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, ckpt2, _ = setup
    want = generate_lines(run_cli, data, [ckpt, ckpt2], src_file, "--print-scores")
    tr = Translator.load([ckpt, ckpt2], data, threads=1, max_len_b=6, warn=lambda m: None)
    assert len(tr.engine.models) == 2 and tr.engine.loaded.paths == [str(ckpt), str(ckpt2)]
    got = [f"{row[0].score:.6f}\t{row[0].text}" for row in tr.translate_nbest(SENTENCES)]
    assert got == want
    assert [x.split("\t")[1] for x in want] == tr.translate(SENTENCES)
    single = generate_lines(run_cli, data, [ckpt], src_file, "--print-scores")
    assert want != single  # guard: the second model does change the result


def test_nbest_scores_equal_generate_print_scores_and_fairseq_lines(setup, src_file, run_cli, translator):  # noqa: F811
    data, ckpt, _, _ = setup
    plain = generate_lines(run_cli, data, [ckpt], src_file, "--nbest", "3", "--print-scores")
    fs = generate_lines(run_cli, data, [ckpt], src_file, "--nbest", "3", "--format", "fairseq")
    rows = translator.translate_nbest(SENTENCES, nbest=3)
    assert len(rows) == len(SENTENCES)
    for i, (src, row) in enumerate(zip(SENTENCES, rows)):
        block = plain[3 * i: 3 * i + 3]
        if not src.strip():  # one certain empty output (the CLI prints --nbest such lines)
            assert len(row) == 1 and row[0].text == "" and row[0].score == 0.0 and row[0].hypothesis.tokens == []
            assert block == ["0.000000\t"] * 3
            continue
        assert [f"{t.score:.6f}\t{t.text}" for t in row] == block
        h = [x.split("\t", 2) for x in fs if x.startswith(f"H-{i}\t")]
        p = [x.split("\t")[1] for x in fs if x.startswith(f"P-{i}\t")]
        assert [(s, pieces) for _, s, pieces in h] == [(f"{t.score:.6f}", " ".join(t.pieces)) for t in row]
        assert p == [" ".join(f"{x:.4f}" for x in t.hypothesis.positional_scores) for t in row]
        for t in row:  # the parts agree with each other
            assert t.pieces == translator.tgt_dict.string(t.hypothesis.tokens)
            assert t.logprob == pytest.approx(sum(t.hypothesis.positional_scores))
            assert len(t.hypothesis.positional_scores) == len(t.hypothesis.tokens) + 1


def test_per_call_settings_override_load_time_ones_for_that_call_only(setup, src_file, run_cli):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    beam4 = generate_lines(run_cli, data, [ckpt], src_file)
    greedy = generate_lines(run_cli, data, [ckpt], src_file, "--beam", "1")
    lp0 = generate_lines(run_cli, data, [ckpt], src_file, "--beam", "1", "--lenpen", "0", "--print-scores")
    assert beam4 != greedy or beam4 != [x.split("\t")[1] for x in lp0]  # guard: settings matter
    tr = Translator.load(ckpt, data, threads=1, max_len_b=6, beam=1, warn=lambda m: None)
    assert tr.translate(SENTENCES) == greedy
    assert tr.translate(SENTENCES, beam=4) == beam4
    got = [f"{r[0].score:.6f}\t{r[0].text}" for r in tr.translate_nbest(SENTENCES, lenpen=0)]
    assert got == lp0
    assert tr.search.beam == 1 and tr.search.lenpen == 0.6  # the load-time settings are untouched
    assert tr.translate(SENTENCES) == greedy


def test_translate_items_on_a_binarized_split(setup, translator):  # noqa: F811
    """The lower-level call: ids in, Hypothesis lists out; a split's items give the same
    hypotheses as the raw lines they were made from."""
    from nmtkit.data.shards import load_split
    from nmtkit.generation.items import Item

    data = setup[0]
    split = load_split(data, "test", "de")
    items = [Item(i, split[i][: translator.max_source_tokens]) for i in range(len(split))]
    hyps = translator.translate_items(items, nbest=2)
    assert set(hyps) == {i for i, s in enumerate(TEST_SRC) if s.strip()}  # empty items: no entry
    raw = translator.translate_nbest(TEST_SRC, nbest=2)
    for i, row in hyps.items():
        assert len(row) == 2 and row[0].score >= row[1].score
        assert [h.tokens for h in row] == [t.hypothesis.tokens for t in raw[i]]
        assert [h.score for h in row] == [t.score for t in raw[i]]
        assert translator.text(items[i], translator.tgt_dict.string(row[0].tokens)) == raw[i][0].text


def test_empty_input_never_runs_the_model(translator, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the model ran on an empty input")

    monkeypatch.setattr(translator.engine, "search", boom)
    assert translator.translate(["", "  ", "\t"]) == ["", "", ""]
    assert translator.translate([]) == []
    rows = translator.translate_nbest(["", " "], nbest=2)
    assert [[(t.text, t.score, t.logprob, t.pieces) for t in r] for r in rows] == [[("", 0.0, 0.0, [])]] * 2


# --------------------------------------------------------------------------------- refusals


def _bad_dictionary_checkpoint(ckpt, path):
    from nmtkit.checkpoints import load_checkpoint, save_checkpoint

    state = load_checkpoint(ckpt)
    state["dictionaries"]["tgt_sha256"] = "0" * 64
    save_checkpoint(state, path)
    return path


def test_loader_refuses_other_dictionaries_with_one_clear_line(setup, tmp_path):  # noqa: F811
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models.loading import load_models

    data, ckpt, _, _ = setup
    other = _bad_dictionary_checkpoint(ckpt, tmp_path / "other.pt")
    src_dict, tgt_dict = load_dictionaries(data)
    with pytest.raises(UserError) as e:
        load_models([ckpt, other], src_dict, tgt_dict, "cpu", "fp32", langs=("de", "en"))
    assert str(e.value) == (
        f"--path {other} was trained with another tgt dictionary (sha256 000000000000... vs "
        f"{tgt_dict.sha256[:12]}...); it cannot translate with this data directory's dictionaries"
    )


def test_loader_checks_ema_weights_and_precision(setup, tmp_path):  # noqa: F811
    from nmtkit.checkpoints import load_checkpoint, save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models.loading import load_models

    data, ckpt, _, _ = setup
    src_dict, tgt_dict = load_dictionaries(data)
    with pytest.raises(UserError, match=rf"^--ema: {re.escape(str(ckpt))} holds no EMA weights \(train with EMA, or drop --ema\)$"):
        load_models(ckpt, src_dict, tgt_dict, ema=True)
    with pytest.raises(UserError, match=r"^--precision must be one of fp32, bf16, fp16, got 'fp8'$"):
        load_models(ckpt, src_dict, tgt_dict, dtype="fp8")
    # one path (not a list) and a precision name; the models are cast, scores stay fp32 (search)
    loaded = load_models(str(ckpt), src_dict, tgt_dict, dtype="bf16")
    assert {p.dtype for p in loaded.models[0].parameters()} == {torch.bfloat16}
    assert loaded.max_source_tokens == MAX_SRC_POS - 1 and not loaded.models[0].training
    # EMA weights, when present, are the ones loaded
    state = load_checkpoint(ckpt)
    state["ema"] = {k: torch.zeros_like(v) for k, v in state["model"].items()}
    save_checkpoint(state, tmp_path / "ema.pt")
    m = load_models(tmp_path / "ema.pt", src_dict, tgt_dict, ema=True).models[0]
    assert all(not p.detach().any() for p in m.parameters())
    # weights that do not fit their config
    del state["ema"]
    state["arch_config"]["d_ff"] = 48
    save_checkpoint(state, tmp_path / "misfit.pt")
    with pytest.raises(UserError, match=r"misfit.pt: weights do not fit its own architecture config: "):
        load_models(tmp_path / "misfit.pt", src_dict, tgt_dict)


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def test_refusals_are_one_line_user_errors(setup, translator, tmp_path):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    with pytest.raises(UserError) as e:
        Translator.load(tmp_path / "none.pt", data)
    assert _one_line(e) == f"checkpoint not found: {tmp_path / 'none.pt'}"
    with pytest.raises(UserError) as e:
        Translator.load(ckpt)
    assert _one_line(e).startswith("Translator.load: data_dir is required: the data directory")
    with pytest.raises(UserError) as e:
        Translator.load(ckpt, tmp_path)
    assert "manifest.json" in _one_line(e)
    other = _bad_dictionary_checkpoint(ckpt, tmp_path / "other.pt")
    with pytest.raises(UserError) as e:
        Translator.load(other, data)
    assert "was trained with another tgt dictionary" in _one_line(e)
    with pytest.raises(UserError) as e:
        Translator.load([], data)
    assert "no checkpoint given" in _one_line(e)
    with pytest.raises(UserError) as e:
        Translator.load(ckpt, data, device="tpu")
    assert "--device: unknown device 'tpu'" in _one_line(e)
    bad = {
        (("beam", 0),): "search settings: --beam must be >= 1, got 0",
        (("nbest", 5),): "search settings: --nbest 5 exceeds the --beam 4; raise --beam",
        (("beem", 5),): "unknown search setting 'beem' (known: beam, lenpen, ",
        (("beam", "4"),): "search setting beam must be an int, got '4'",
        (("sampling", 1),): "search setting sampling must be True or False, got 1",
        (("topk", 5),): "search settings: topk, topp and temperature apply only with sampling=True",
        (("max_len_b", -1),): "search settings: --max-len-a and --max-len-b must be >= 0, got 1.0 and -1",
        (("pad", 5),): "unknown search setting 'pad'",
    }
    for settings, msg in bad.items():
        kw = dict(settings)
        with pytest.raises(UserError) as e:
            translator.translate(["Hund"], **kw)
        assert _one_line(e).startswith(msg)
        with pytest.raises(UserError) as e:
            Translator.load(ckpt, data, **kw)
        assert _one_line(e).startswith(msg)
    with pytest.raises(UserError) as e:
        Translator.load(ckpt, data, batch_size=0)
    assert _one_line(e) == "batch_size must be >= 1, got 0"
    with pytest.raises(UserError) as e:
        translator.translate("der Hund")
    assert "list of sentences, got one str" in _one_line(e)
    with pytest.raises(UserError) as e:
        translator.translate(["der Hund", 3])
    assert _one_line(e) == "sentence 2 is a int, not a str"


# ----------------------------------------------------------------- defaults, parsing, docs


def test_defaults_are_the_clis(setup, translator):  # noqa: F811
    from nmtkit.generation.generator import GenerateOptions
    from nmtkit.search.beam import SearchConfig
    from nmtkit.generation.translator import Translator

    params = inspect.signature(Translator.load).parameters
    cli = {f.name: f.default for f in dataclasses.fields(GenerateOptions)}
    for name in ("device", "precision", "ema", "threads", "max_tokens", "batch_size"):
        assert params[name].default == cli[name], name
    assert translator.search == SearchConfig(max_len_b=6)  # everything else SearchConfig's defaults
    assert translator.batch_size == 128 and translator.max_tokens is None


def test_parsing_data_dir_gives_trees_like_generate(parsing_dir, tmp_path, run_cli):  # noqa: F811
    from nmtkit import Translator

    _, data, _ = parsing_dir
    ckpt = make_checkpoint(data, tmp_path / "m.pt", favour=("(NP", "NN", ")NP"))
    words = lines((data / "test.words").read_text(encoding="utf-8"))
    raw_lines = [words[0], "", "( a ) ran .", "  ", words[2]]
    raw = tmp_path / "raw.txt"
    raw.write_text("\n".join(raw_lines) + "\n", encoding="utf-8")
    common = ("--beam", "2", "--min-len", "6", "--max-len-b", "30")
    r = run_cli("generate", data, "--path", ckpt, "--input", raw, "--quiet", "--threads", "1", *common)
    assert r.code == 0, r
    tr = Translator.load(ckpt, data, threads=1)
    assert tr.task == "parsing" and tr.search.max_len_b == 300  # generate's default there
    got = tr.translate(raw_lines, beam=2, min_len=6, max_len_b=30)
    assert got == lines(r.out)
    check_trees(got, raw_lines)
    assert got[1] == "(TOP)"


def _api_example() -> str:
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)


def test_docs_example_runs(setup, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, ckpt, _, _ = setup
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").symlink_to(ckpt)
    (tmp_path / "data-bin").symlink_to(data, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    code = _api_example()
    assert 'Translator.load("ckpt/model.pt", "data-bin"' in code
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)  # noqa: S102 - the documented example itself
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(re.fullmatch(r"-\d+\.\d{6}\t.*", x) for x in out)
    assert len(scope["out"]) == 3 and len(scope["greedy"]) == 1


def test_docs_search_settings_table_is_searchconfig():
    from nmtkit.search.beam import SearchConfig
    from nmtkit.search.config import SEARCH_SETTINGS

    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("## Search settings", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, re.MULTILINE)
    assert tuple(name for name, _ in rows) == SEARCH_SETTINGS
    for name, default in rows:
        assert ast.literal_eval(default.strip().strip("`")) == getattr(SearchConfig, name), name


def test_import_nmtkit_stays_cheap():
    code = ("import sys, nmtkit; assert 'torch' not in sys.modules, 'torch imported'; "
            "from nmtkit import Translator; assert Translator.__name__ == 'Translator'; "
            "import nmtkit.generation.translator as t; assert nmtkit.Translator is t.Translator")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert r.returncode == 0, r.stderr
