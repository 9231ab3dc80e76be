"""Parsing as translation end to end: `nmtkit preprocess --task parsing` (treebank files -> words and
linearized-tree shards, gold trees, manifest), `nmtkit generate` on a parsing data directory (one
well-formed tree per input line with the input's words, whatever the model outputs), and
`generate | score --metric parseval`.

Hand-made treebank files (written to tmp_path) check the layouts, the shards and the cleaning
rules exactly; the NLTK sample in ../shared/data/ptb (skipped when absent) checks the `--treebank
--split sample` path on real trees. Models are random-initialised Transformers (no training), so
their outputs are arbitrary token sequences: exactly what the tree repair must survive.
"""

from __future__ import annotations

import json

import pytest
import torch

from nmtkit.data.preprocess import PreprocessConfig
from nmtkit.parsing.pipeline import tree_line
from nmtkit.parsing.treebank import normalize_tree
from nmtkit.parsing.trees import Tree
from tests.conftest import WSJ_MRG, WSJ_NORM, shared_file

torch.set_num_threads(1)  # tiny models on a shared machine: one thread is faster

MRG, NORM = WSJ_MRG, WSJ_NORM
LIN = [
    "(S (NP NNP NNP )NP (VP MD (VP VB (NP DT NN )NP (S (VP TO (VP VB )VP )VP )S )VP )VP . )S",
    "(S (NP NNP NNP )NP (VP VBZ (NP NN )NP )VP . )S",
]
# One tree per line (.trees), with the odd cases the pipeline must keep: a long flat sentence
# whose target (3 tokens per word) exceeds translation's --max-len 250, a deep unary chain whose
# target/source ratio (11) exceeds translation's --ratio 9, and a word with parentheses.
LONG = "(TOP (S " + " ".join(f"(NP (NN w{i}))" for i in range(100)) + " (. .)))"
DEEP = "(TOP (S (VP (NP (NP (NP (NN deep)))))))"
PARENS = "(TOP (S (NP (-LRB- -LRB-) (NN a) (-RRB- -RRB-)) (VP (VBD ran)) (. .)))"
EXTRA_TREES = [LONG, DEEP, PARENS]
TEST_TREES = [
    "(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .)))",
    "(TOP (S (NP (NNP Vinken)) (VP (VBZ is) (NP (DT a) (NN chairman))) (. .)))",
    "(TOP (FRAG (NP (NN board)) (, ,) (NP (NN chairman)) (. .)))",
]


def lines(text: str) -> list[str]:
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


def write_inputs(root):
    (root / "wsj_a.mrg").write_text(MRG, encoding="utf-8")
    (root / "more.trees").write_text("\n".join(EXTRA_TREES * 3) + "\n", encoding="utf-8")
    (root / "valid.trees").write_text("\n".join(NORM) + "\n", encoding="utf-8")
    (root / "test.mrg").write_text("\n".join(TEST_TREES) + "\n", encoding="utf-8")
    (root / "train").mkdir()
    (root / "train" / "part1.mrg").write_text(MRG * 5, encoding="utf-8")


@pytest.fixture(scope="module")
def parsing_dir(tmp_path_factory):
    """A parsing data dir from hand-made files: --trainpref a folder, --extra-train a .trees file,
    --validpref PREFIX (-> PREFIX.trees), --testpref a .mrg file; --bpe none (whole words)."""
    from nmtkit.cli import main

    root = tmp_path_factory.mktemp("parse")
    write_inputs(root)
    data = root / "data"
    args = ["preprocess", "--task", "parsing", "--trainpref", str(root / "train"), "--extra-train",
            str(root / "more.trees"), "--validpref", str(root / "valid"), "--testpref", str(root / "test.mrg"),
            "--destdir", str(data), "--bpe", "none"]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 0
    return root, data, args


def test_preprocess_parsing_writes_words_trees_gold_and_manifest(parsing_dir, capsys):
    from nmtkit.data.manifest import load_dictionaries, load_manifest, verify_files
    from nmtkit.data.shards import load_split

    root, data, _ = parsing_dir
    m = load_manifest(data)
    verify_files(data, m)  # the gold trees and words are checksummed like every other file
    assert m["task"] == "parsing" and m["parsing"]["pos_tags"] == "keep"
    assert (m["source_lang"], m["target_lang"]) == ("words", "lin")
    assert m["subword"]["kinds"] == {"words": "none", "lin": "none"}
    assert m["parsing"]["gold"] == {"valid": "valid.gold.trees", "test": "test.gold.trees"}
    # gold trees: normalized, (TOP ...) root, one per line; words of valid/test kept too
    assert lines((data / "valid.gold.trees").read_text(encoding="utf-8")) == NORM
    assert lines((data / "test.gold.trees").read_text(encoding="utf-8")) == TEST_TREES
    assert lines((data / "test.words").read_text(encoding="utf-8")) == [
        " ".join(Tree.parse(t).leaves()) for t in TEST_TREES]
    # shards: source = words, target = linearized tree, separate dictionaries
    src_dict, tgt_dict = load_dictionaries(data)
    assert src_dict is not tgt_dict and "(NP" not in src_dict and "Vinken" not in tgt_dict
    valid_src, valid_tgt = load_split(data, "valid", "words"), load_split(data, "valid", "lin")
    assert [" ".join(src_dict.string(valid_src[i])) for i in range(2)] == [
        "Pierre Vinken will join the board to win .", "Mr. Vinken is chairman ."]
    assert [" ".join(tgt_dict.string(valid_tgt[i])) for i in range(2)] == LIN
    # train = the folder's 10 trees, then the --extra-train file's 9, in order; nothing cleaned
    # away: the 100-word sentence (303 target tokens) and the 1-word, 11-token chain are kept
    train = m["splits"]["train"]
    assert train["sentences"] == train["lines"] == 19 and train["cleaning"]["dropped_total"] == 0
    tgt = load_split(data, "train", "lin")
    assert max(len(tgt[i]) for i in range(19)) == 303
    assert m["parsing"]["splits"]["train"]["max_target_tokens"] == 303
    assert "more.trees (--extra-train)" in m["parsing"]["sources"]["train"][1]


def test_rerun_is_up_to_date_and_explicit_cleaning_is_reported(parsing_dir, tmp_path, run_cli):
    root, data, args = parsing_dir
    before = (data / "manifest.json").read_bytes()
    r = run_cli(*args)
    assert r.code == 0 and f"{data}: up to date" in r.out, r
    assert (data / "manifest.json").read_bytes() == before
    # translation's cleaning, asked for explicitly: the long and the deep trees are dropped, and said so
    r = run_cli(*args[:-2], "--destdir", str(tmp_path / "clean"), "--bpe", "none", "--max-len", "250", "--ratio", "9")
    assert r.code == 0, r
    assert "train cleaning dropped 6 pairs: empty 0, too long 3, too short 0, ratio 3" in r.out
    assert "task parsing (--pos-tags keep" in r.out


def test_treebank_split_on_the_nltk_sample_with_sentencepiece_and_xx(tmp_path, run_cli):
    from nmtkit.data.manifest import load_dictionaries, load_manifest

    zip_path = shared_file("ptb", "treebank.zip")
    data = tmp_path / "data"
    r = run_cli("preprocess", "--task", "parsing", "--treebank", zip_path, "--split", "sample",
                "--pos-tags", "xx", "--vocab-size", "600", "--destdir", data)
    assert r.code == 0, r
    m = load_manifest(data)
    assert m["parsing"]["pos_tags"] == "xx" and m["parsing"]["split_scheme"] == "sample"
    assert m["subword"]["kinds"] == {"words": "sentencepiece", "lin": "none"}
    assert m["subword"]["files"] == {"words": "spm.words.model", "lin": None}
    assert [m["splits"][s]["sentences"] for s in ("train", "valid", "test")] == [3669, 127, 118]
    assert m["splits"]["train"]["tokens"]["lin"] == 225858  # docs/parsing.md: every tree, whole tokens
    _, tgt_dict = load_dictionaries(data)
    real = [t for t in tgt_dict.symbols[4:] if not t.startswith("madeupword")]
    assert len(real) == 55 and "XX" in real and "NN" not in real  # docs/parsing.md: 55 in xx mode
    assert all(t == "XX" or t[0] in "()" for t in real)
    gold = lines((data / "test.gold.trees").read_text(encoding="utf-8"))
    assert len(gold) == 118 and all(g.startswith("(TOP (") for g in gold)


@pytest.mark.parametrize("args,message", [
    (["--task", "parse"], "--task must be translation or parsing, got 'parse'"),
    (["--task", "parsing", "--treebank", "X", "--split", "wsj"], "--split must be one of ptb, sample, got 'wsj'"),
    (["--task", "parsing", "--treebank", "X", "--split", "ptb", "--pos-tags", "tags"],
     "--pos-tags must be one of keep, xx, got 'tags'"),
    (["--task", "parsing", "--treebank", "X"], "--treebank needs --split"),
    (["--task", "parsing", "--split", "ptb", "--trainpref", "X"], "--split applies to --treebank"),
    (["--task", "parsing", "--treebank", "X", "--split", "ptb", "--testpref", "Y"],
     "--treebank (split by --split) and --testpref exclude each other"),
    (["--task", "parsing"], "--task parsing needs --treebank PATH --split NAME, or --trainpref"),
    (["--task", "parsing", "-s", "en", "--trainpref", "X"], "--source-lang does not apply to --task parsing"),
    (["-s", "en", "-t", "de", "--trainpref", "X", "--pos-tags", "xx"], "--pos-tags applies to --task parsing"),
    (["-s", "en", "--trainpref", "X"], "missing option --target-lang"),
    (["--task", "parsing", "--treebank", "NOPE", "--split", "ptb"], "--treebank NOPE: not found"),
    (["--task", "parsing", "--trainpref", "NOPE"], "--trainpref NOPE: no treebank there"),
])
def test_bad_parsing_flags_are_named(tmp_path, run_cli, args, message):
    r = run_cli("preprocess", *args, "--destdir", tmp_path / "d")
    assert r.code == 2 and message in r.err, r
    assert not (tmp_path / "d").exists()


def test_bad_treebank_content_and_joined_dictionary(tmp_path, run_cli):
    write_inputs(tmp_path)
    (tmp_path / "bad.trees").write_text("(S (NP x)\n", encoding="utf-8")
    r = run_cli("preprocess", "--task", "parsing", "--trainpref", tmp_path / "bad", "--destdir", tmp_path / "d",
                "--bpe", "none")
    assert r.code == 2 and "bad.trees: not a treebank file" in r.err, r
    (tmp_path / "empty.trees").write_text("( (-NONE- *) )\n", encoding="utf-8")
    r = run_cli("preprocess", "--task", "parsing", "--trainpref", tmp_path / "train", "--testpref",
                tmp_path / "empty", "--destdir", tmp_path / "d", "--bpe", "none")
    assert r.code == 2 and "no tree with words for split 'test' (1 trees read, 1 without words)" in r.err, r
    r = run_cli("preprocess", "--task", "parsing", "--trainpref", tmp_path / "train", "--destdir", tmp_path / "d",
                "--joined-dictionary")
    assert r.code == 2 and "--joined-dictionary does not apply to --task parsing" in r.err, r
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob(".d.*"))  # no temporary text left


def test_library_settings_leave_translation_fingerprints_alone():
    cfg = PreprocessConfig(source_lang="de", target_lang="en", trainpref="x", destdir="y")
    assert not {"target_bpe", "extra_files", "extra_manifest"} & set(cfg.output_options())
    assert cfg.lang_bpe("en") == "sentencepiece"
    assert PreprocessConfig(source_lang="de", target_lang="en", trainpref="x", destdir="y",
                            target_bpe="none").lang_bpe("en") == "none"


# ------------------------------------------------------------------------------------- generate


def make_checkpoint(data, path, seed=0, favour=()):
    """A random-initialised small Transformer for `data`'s dictionaries (no training). `favour`:
    target tokens made the most likely, in that order, at every step (the last decoder LayerNorm
    is pushed towards one direction, which those tokens' output rows share), so that the output
    holds brackets that must be repaired, whatever the CPU's float rounding."""
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.models import ArchConfig, Transformer

    src_dict, tgt_dict = load_dictionaries(data)
    torch.manual_seed(seed)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, heads=4, share_embeddings="none",
                     max_source_positions=64, max_target_positions=400)
    model = Transformer(cfg, len(src_dict), len(tgt_dict))
    if favour:
        with torch.no_grad():
            u = torch.nn.functional.normalize(torch.randn(32), dim=0)
            norm = model.decoder_layers[-1].ffn_norm
            norm.weight.mul_(0.1)
            norm.bias.copy_(u)
            for rank, tok in enumerate(favour):
                model.out_proj.weight[tgt_dict.index(tok)] = (6.0 - rank) * u
    save_checkpoint({"arch": "test", "arch_config": cfg.to_dict(), "model": model.state_dict(),
                     "dictionaries": {"src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256,
                                      "src_size": len(src_dict), "tgt_size": len(tgt_dict)}}, path)
    return path


def check_trees(out_lines: list[str], word_lines: list[str]) -> None:
    """Each line one well-formed (TOP ...) tree whose words are the input line's words."""
    assert len(out_lines) == len(word_lines)
    for line, words in zip(out_lines, word_lines):
        tree = Tree.parse(line)
        assert tree.label == "TOP"
        assert tree.leaves() == [w.replace("(", "-LRB-").replace(")", "-RRB-") for w in words.split()]
        if not words.split():
            assert line == "(TOP)"  # no words: the empty tree (parseval skips such a sentence)
            continue
        for node in tree.subtrees():
            assert node.label and node.children
            if node.is_preterminal():
                assert len(node.children) == 1


def test_generate_writes_one_tree_per_input_and_parseval_scores_it(parsing_dir, tmp_path, run_cli):
    root, data, _ = parsing_dir
    ckpt = make_checkpoint(data, tmp_path / "m.pt", favour=("(NP", "NN", ")NP"))
    common = ("--path", ckpt, "--quiet", "--threads", "1", "--beam", "2", "--min-len", "6", "--max-len-b", "30")
    words = lines((data / "test.words").read_text(encoding="utf-8"))
    out = tmp_path / "test.hyp"
    r = run_cli("generate", data, *common, "--output", out)
    assert r.code == 0, r
    hyp = lines(out.read_text(encoding="utf-8"))
    check_trees(hyp, words)
    assert all(h.startswith("(TOP (NP (NP ") for h in hyp)  # 30 x "(NP", never closed: repaired
    r = run_cli("score", "--metric", "parseval", "--sys", out, "--ref", data / "test.gold.trees")
    assert r.code == 0 and r.out.startswith("Parseval F1 = ") and "sentences: 3 valid, 0 error" in r.out, r

    # raw word lines (stdin): whitespace words, an empty line, a word with parentheses; the
    # tree output is the same for the same sentence, whichever way it came in
    raw = tmp_path / "raw.txt"
    raw_lines = [words[0], "", "( a ) ran .", "  ", words[2]]
    raw.write_text("\n".join(raw_lines) + "\n", encoding="utf-8")
    r = run_cli("generate", data, *common, "--input", raw)
    assert r.code == 0, r
    got = lines(r.out)
    check_trees(got, raw_lines)
    assert got[1] == got[3] == "(TOP)" and got[0] == hyp[0] and got[4] == hyp[2]

    # fairseq format: the reference (T-) is the gold tree, the hypotheses (D-) repaired trees
    r = run_cli("generate", data, *common, "--format", "fairseq", "--nbest", "2")
    assert r.code == 0, r
    t_lines = [ln.split("\t", 1)[1] for ln in lines(r.out) if ln.startswith("T-")]
    # the reference as the target dictionary holds it: FRAG is not in the training trees (<unk>)
    assert t_lines[:2] == TEST_TREES[:2] and "FRAG" not in t_lines[2] and "FRAG" in TEST_TREES[2]
    d_lines = [ln.split("\t")[2] for ln in lines(r.out) if ln.startswith("D-")]
    check_trees(d_lines, [w for w in words for _ in range(2)])


def test_generate_on_the_training_split_uses_the_decoded_source(parsing_dir, tmp_path, run_cli):
    root, data, _ = parsing_dir
    ckpt = make_checkpoint(data, tmp_path / "m.pt", seed=3)
    r = run_cli("generate", data, "--path", ckpt, "--gen-subset", "valid", "--quiet", "--threads", "1",
                "--beam", "1", "--max-len-b", "10")
    assert r.code == 0, r
    check_trees(lines(r.out), [" ".join(Tree.parse(t).leaves()) for t in NORM])


def default_max_len_b(data_dir: str) -> int:
    """generate's --max-len-b when not given, for a checkpoint trained on `data_dir`."""
    from nmtkit.backends.registry import describe
    from nmtkit.generation.model_flags import search_flag_defaults

    return search_flag_defaults({"max_len_b": None}, None, describe(["m.pt"], data_dir))[0]["max_len_b"]


def test_perfect_outputs_score_100_and_defaults(parsing_dir):
    """The writer's tree for the gold sequence is the gold tree (F1 100); madeupword fillers are
    dropped; --max-len-b defaults to 300 on a parsing data dir only."""
    from nmtkit.scoring.parseval import evaluate

    root, data, _ = parsing_dir
    for lin, gold in zip(LIN, NORM):
        words = " ".join(Tree.parse(gold).leaves())
        assert tree_line(lin.split(), words, "keep") == gold
        assert tree_line(["madeupword0001"] + lin.split() + ["madeupword0003"], words, "keep") == gold
    gold = lines((data / "test.gold.trees").read_text(encoding="utf-8"))
    words = lines((data / "test.words").read_text(encoding="utf-8"))
    from nmtkit.parsing.linearize import linearize

    hyp = [tree_line(linearize(normalize_tree(Tree.parse(g)))[1], w, "keep") for g, w in zip(gold, words)]
    r = evaluate(gold, hyp)
    assert r.all.f1 == pytest.approx(100.0) and r.all.valid == 3
    assert default_max_len_b(str(data)) == 300


def test_max_len_b_default_stays_50_for_translation(tmp_path):
    from nmtkit.data.preprocess import preprocess

    for lang in ("de", "en"):
        (tmp_path / f"t.{lang}").write_text("a b c\nd e\n", encoding="utf-8")
    preprocess(PreprocessConfig(source_lang="de", target_lang="en", trainpref=str(tmp_path / "t"),
                                destdir=str(tmp_path / "d"), bpe="none"))
    assert default_max_len_b(str(tmp_path / "d")) == 50
    assert "task" not in json.loads((tmp_path / "d" / "manifest.json").read_text())
