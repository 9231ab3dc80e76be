"""What a new user meets first, held to the command line: `Translator(decoding=...)` gives
`nmtkit generate --decoding`'s lines, a terms file given without --constraints is warned about,
fairseq's habits (`--path a.pt:b.pt`, `average-checkpoints --inputs a.pt b.pt`) work, a text
file given as a checkpoint is named as one, the unscaled embeddings of imported models compute
what the paper's scale computes on scaled weights, and every usage line names its arguments.

The model is test_generate.py's tiny data directory (sentencepiece, joined dictionary) with two
random-initialised checkpoints; the references are nmtkit's own CLI runs on the same inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from nmtkit.errors import UserError
from tests.test_generate import COMMON, TEST_SRC, lines, setup  # noqa: F401 - fixture

QUIET = dict(threads=1, max_len_b=6, warn=lambda msg: None)
TEXTS = [t for t in TEST_SRC if t.strip()] + ["Hund Katze Baum Haus", "zwei Mann springt"]


@pytest.fixture(scope="module")
def src_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("first") / "in.de"
    f.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return f


# ------------------------------------------------------------------------ Translator(decoding=...)


def test_translator_decoding_gives_generate_decoding_lines(setup, src_file, run_cli):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    out = {}
    for decoding in ("fairseq", "paper"):
        r = run_cli("generate", data, "--path", ckpt, "--input", src_file, "--decoding", decoding, *COMMON)
        assert r.code == 0, r
        out[decoding] = lines(r.out)
        at_load = Translator.load(ckpt, data, decoding=decoding, **QUIET)
        assert at_load.translate(TEXTS) == out[decoding]
        per_call = Translator.load(ckpt, data, **QUIET)
        assert per_call.translate(TEXTS, decoding=decoding) == out[decoding]
    assert out["fairseq"] != out["paper"]  # guard: the two rules give other lines on these inputs


def test_translator_decoding_sets_the_length_penalty_and_the_stopping_rule(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    tr = Translator.load(ckpt, data, decoding="fairseq", **QUIET)
    assert (tr.search.lenpen_form, tr.search.early_stop) == ("fairseq", "beam")
    cfg = tr.search_config(decoding="paper")
    assert (cfg.lenpen_form, cfg.early_stop) == ("gnmt", "bound")
    # a setting given beside it wins, as a flag given beside --decoding
    cfg = tr.search_config(decoding="paper", early_stop="none")
    assert (cfg.lenpen_form, cfg.early_stop) == ("gnmt", "none")
    assert Translator.load(ckpt, data, decoding="fairseq", lenpen_form="gnmt", **QUIET).search.lenpen_form == "gnmt"
    # the scores follow: |Y|^0.6 (fairseq) or ((5 + |Y|) / 6)^0.6 (gnmt) divides the same log-probability
    for decoding, lp in (("fairseq", lambda n: n ** 0.6), ("paper", lambda n: ((5 + n) / 6) ** 0.6)):
        for (best,) in tr.translate_nbest(TEXTS, decoding=decoding, beam=1):
            h = best.hypothesis
            assert math.isclose(h.score, h.logprob / lp(len(h.tokens) + 1), rel_tol=1e-5, abs_tol=1e-6)


def test_an_unknown_decoding_is_one_error_naming_the_choices(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    with pytest.raises(UserError, match=r"^decoding must be one of paper, fairseq, got 'marian'$"):
        Translator.load(ckpt, data, decoding="marian", **QUIET)
    tr = Translator.load(ckpt, data, **QUIET)
    for bad in ("Fairseq", 1):
        with pytest.raises(UserError, match=r"^decoding must be one of paper, fairseq, got "):
            tr.translate(["Hund"], decoding=bad)


# ------------------------------------------------------------------------ tabs without --constraints


def test_a_tab_in_the_input_without_constraints_is_warned_once(setup, tmp_path, run_cli):  # noqa: F811
    data, ckpt, _, _ = setup
    terms = tmp_path / "terms.de"
    terms.write_text("der Hund\nein Mann\tman\nKind\tchild\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", terms, *COMMON)
    assert r.code == 0, r
    assert len(lines(r.out)) == 3
    warned = [line for line in r.err.splitlines() if "tab" in line]
    assert warned == [f"nmtkit: warning: {terms}:2: the line holds a tab and is translated whole, as source text; "
                      "if the input is SOURCE<TAB>PHRASE... lines of terms, add --constraints"], r.err
    # with the flag the tab separates the phrases, and nothing is said
    r = run_cli("generate", data, "--path", ckpt, "--input", terms, "--constraints", *COMMON)
    assert r.code == 0, r
    assert "tab" not in r.err
    # no tab: no warning
    plain = tmp_path / "plain.de"
    plain.write_text("der Hund\nein Mann\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", plain, *COMMON)
    assert r.code == 0 and "tab" not in r.err, r


# ------------------------------------------------------------------------ fairseq's habits


def test_a_colon_separated_path_is_an_ensemble(setup, src_file, run_cli):  # noqa: F811
    data, ckpt, ckpt2, _ = setup
    r = run_cli("generate", data, "--path", ckpt, "--path", ckpt2, "--input", src_file, *COMMON)
    assert r.code == 0, r
    one = run_cli("generate", data, "--path", ckpt, "--input", src_file, *COMMON)
    assert one.code == 0 and one.out != r.out  # guard: the second model changes the output
    joined = run_cli("generate", data, "--path", f"{ckpt}:{ckpt2}", "--input", src_file, *COMMON)
    assert joined.code == 0, joined
    assert joined.out == r.out


def test_a_colon_separated_path_with_a_missing_part_is_one_error(setup, src_file, tmp_path, run_cli):  # noqa: F811
    data, ckpt, _, _ = setup
    missing = tmp_path / "nope.pt"
    r = run_cli("generate", data, "--path", f"{ckpt}:{missing}", "--input", src_file, *COMMON)
    assert r.code == 2, r
    assert r.err.strip() == (f"nmtkit: error: --path {ckpt}:{missing}: not found; read as fairseq's colon-separated "
                             f"ensemble, '{missing}' not found either (repeat --path for an ensemble)")


def test_a_path_with_a_colon_that_exists_is_one_checkpoint(setup, src_file, tmp_path, run_cli):  # noqa: F811
    data, ckpt, _, _ = setup
    odd = tmp_path / "run:1.pt"
    odd.write_bytes(ckpt.read_bytes())
    r = run_cli("generate", data, "--path", odd, "--input", src_file, *COMMON)
    want = run_cli("generate", data, "--path", ckpt, "--input", src_file, *COMMON)
    assert r.code == 0 and r.out == want.out, r


def test_average_checkpoints_takes_files_after_inputs(setup, tmp_path, run_cli):  # noqa: F811
    from nmtkit import checkpoints as ck

    _, ckpt, ckpt2, _ = setup
    runs = {"positional": (ckpt, ckpt2), "fairseq": ("--inputs", ckpt, ckpt2),
            "repeated": ("--inputs", ckpt, "--inputs", ckpt2)}
    out = {}
    for name, args in runs.items():
        r = run_cli("average-checkpoints", *args, "--output", tmp_path / f"{name}.pt")
        assert r.code == 0, (name, r)
        out[name] = ck.load_checkpoint(tmp_path / f"{name}.pt")
    a, b = ck.load_checkpoint(ckpt)["model"], ck.load_checkpoint(ckpt2)["model"]
    for name, state in out.items():
        assert state["averaged_from"] == [ckpt.name, ckpt2.name], name
        assert set(state["model"]) == set(a)
        for k, v in state["model"].items():
            assert torch.equal(v, out["positional"]["model"][k]), (name, k)
            assert torch.allclose(v, (a[k] + b[k]) / 2, atol=1e-6), (name, k)


def test_average_checkpoints_refuses_a_directory_beside_files(setup, tmp_path, run_cli):  # noqa: F811
    _, ckpt, _, root = setup
    for args in (("--inputs", root, ckpt, "--num-update-checkpoints", "2"),
                 ("--inputs", root, "--inputs", ckpt, "--num-epoch-checkpoints", "2"),
                 ("--inputs", root, ckpt)):
        r = run_cli("average-checkpoints", *args, "--output", tmp_path / "x.pt")
        assert r.code == 2, (args, r)
        assert r.err.strip() == ("nmtkit: error: --inputs DIR picks the last checkpoints of one directory: give it "
                                 "alone, or give checkpoint files only (positionally or after --inputs)"), (args, r.err)
    r = run_cli("average-checkpoints", "--num-update-checkpoints", "2", "--output", tmp_path / "x.pt")
    assert r.code == 2 and "need --inputs DIR" in r.err, r
    assert not (tmp_path / "x.pt").exists()


# ------------------------------------------------------------------------ a text file as a checkpoint


def test_a_text_file_given_as_a_checkpoint_is_named_as_one(setup, src_file, tmp_path, run_cli):  # noqa: F811
    from nmtkit import checkpoints as ck

    data, _, _, _ = setup
    r = run_cli("generate", data, "--path", src_file, "--input", src_file, *COMMON)
    assert r.code == 2, r
    err = [line for line in r.err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].endswith(f"{src_file}: a text file, not a checkpoint (it begins with 'der Hund läuft')"), r.err
    long = tmp_path / "long.txt"
    long.write_text("€" * 2000 + "\n", encoding="utf-8")  # 3 bytes each: one is cut at byte 4096, the block's end
    with pytest.raises(UserError, match=r": a text file, not a checkpoint \(it begins with '€{40}\.\.\.'\)$"):
        ck.load_checkpoint(long)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.pt: an empty file, not a checkpoint$"):
        ck.load_checkpoint(empty)
    blank = tmp_path / "blank.pt"
    blank.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(UserError, match=r"blank\.pt: a text file, not a checkpoint$"):
        ck.load_checkpoint(blank)
    binary = tmp_path / "junk.pt"  # not text, not torch: the loader's own refusal
    binary.write_bytes(b"\x00\x01junk")
    with pytest.raises(UserError, match="not a safe nmtkit checkpoint"):
        ck.load_checkpoint(binary)


# ------------------------------------------------------------------------ the embedding scale


def test_unscaled_embeddings_compute_the_scaled_model_of_scaled_weights():
    """x * sqrt(d) on embeddings E (the paper) is x * 1 on embeddings sqrt(d) E: the two models
    give the same log-probabilities (untied output projection, which the scale must not touch)."""
    from nmtkit.models import ArchConfig, Transformer

    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, share_embeddings="none",
                     dropout=0.0)
    torch.manual_seed(0)
    scaled = Transformer(cfg, 20, 20).eval()
    unscaled = Transformer(cfg.replace(scale_embedding=False), 20, 20).eval()
    sd = dict(scaled.state_dict())
    for k in ("src_embed.weight", "tgt_embed.weight"):
        sd[k] = sd[k] * math.sqrt(16)
    unscaled.load_state_dict(sd)
    src = torch.tensor([[5, 6, 7, 2]])
    prev = torch.tensor([[1, 8, 9]])
    with torch.no_grad():
        want = scaled(src, prev).log_softmax(-1)
        got = unscaled(src, prev).log_softmax(-1)
        plain = Transformer(cfg.replace(scale_embedding=False), 20, 20).eval()
        plain.load_state_dict(scaled.state_dict())  # the same weights without the scale differ
        other = plain(src, prev).log_softmax(-1)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(other, want, atol=1e-3)


def test_checkpoints_without_the_field_have_the_paper_s_scale():
    from nmtkit import checkpoints as ck
    from nmtkit.models import ArchConfig

    old = ArchConfig().to_dict()
    del old["scale_embedding"]  # a checkpoint written before the field existed
    assert ArchConfig.from_dict(old).scale_embedding is True
    assert ck.config_differences(old, ArchConfig().to_dict()) == []  # it resumes and averages with newer ones
    assert ck.config_differences(old, ArchConfig(scale_embedding=False).to_dict()) == [
        "scale_embedding: True != False"]
    for name, value in ck.ABSENT_ARCH_FIELDS.items():  # what an absent field means is its default
        assert getattr(ArchConfig(), name) == value, name


# ------------------------------------------------------------------------ usage lines


def test_every_usage_line_names_its_arguments_in_capitals(run_cli):
    from nmtkit.cli.app import COMMANDS

    want = {"train": "DATA_DIR", "generate": "[DATA_DIR]", "export": "DATA_DIR", "import-hf": "HF_DIR",
            "import-fairseq": "CHECKPOINT", "average-checkpoints": "[CHECKPOINT]...", "plot": "SAVE_DIR",
            "shortlist": "DATA_DIR",
            "archs": "[NAME]", "attention": "DATA_DIR", "serve": "[DATA_DIR]"}
    for name in COMMANDS:
        r = run_cli(name, "--help")
        assert r.code == 0, (name, r)
        usage = next(line for line in r.out.splitlines() if line.startswith("Usage:"))
        assert "{" not in usage and "}" not in usage, usage
        assert usage.split()[2:4] == [name, "[OPTIONS]"], usage
        assert usage.split()[4:] == ([want[name]] if name in want else []), usage
