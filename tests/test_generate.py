"""`nmtkit generate` end to end: inputs (binarized split, raw file, stdin), order, batching,
empty and over-long lines, output formats, atomic output, ensembles and flag errors.

The data directory is made by the real preprocessing pipeline (sentencepiece, joined dictionary)
on a tiny synthetic corpus, and the checkpoint holds a real (random-initialised) Transformer;
search correctness itself is tested in test_search.py.
"""

from __future__ import annotations

import math
import re
import random

import pytest
import torch

from nmtkit.search.beam import SearchConfig, length_penalty, search

DE = "der die das Hund Katze Haus Baum läuft springt schläft groß klein rot blau ein zwei Mann Frau Kind Straße".split()
EN = "the the the dog cat house tree runs jumps sleeps big small red blue a two man woman child street".split()
TEST_SRC = [
    "der Hund läuft",
    "ein Mann und eine Frau",  # unknown words: <unk> pieces are possible
    "",
    "zwei rot Katze springt groß klein Baum Haus",
    "   ",
    "Kind",
    "die Straße",
]
MAX_SRC_POS = 24  # small, so that over-long lines are easy to make
REFS = [f"the {EN[3 + i]} {EN[4 + i]}" for i in range(len(TEST_SRC))]

# One thread: on a shared, busy machine two spinning OpenMP threads make tiny models 10x slower.
torch.set_num_threads(1)


def _corpus(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    for _ in range(n):
        idx = [rng.randrange(len(DE)) for _ in range(rng.randint(1, 8))]
        src.append(" ".join(DE[i] for i in idx))
        tgt.append(" ".join(EN[i] for i in idx))
    return src, tgt


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(data_dir, checkpoint, second checkpoint, folder with the raw test files)."""
    from nmtkit.checkpoints import save_checkpoint
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.data.preprocess import PreprocessConfig, preprocess
    from nmtkit.models import ArchConfig, Transformer

    root = tmp_path_factory.mktemp("gen")
    rng = random.Random(0)
    for pref, n in (("train", 300), ("valid", 10)):
        s, t = _corpus(rng, n)
        (root / f"{pref}.de").write_text("\n".join(s) + "\n", encoding="utf-8")
        (root / f"{pref}.en").write_text("\n".join(t) + "\n", encoding="utf-8")
    (root / "test.de").write_text("\n".join(TEST_SRC) + "\n", encoding="utf-8")
    (root / "test.en").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    data = root / "data"
    preprocess(
        PreprocessConfig(
            source_lang="de", target_lang="en", trainpref=str(root / "train"), validpref=[str(root / "valid")],
            testpref=[str(root / "test")], destdir=str(data), vocab_size=60, joined_dictionary=True,
        )
    )
    src_dict, tgt_dict = load_dictionaries(data)
    ckpts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        cfg = ArchConfig(
            encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4,
            max_source_positions=MAX_SRC_POS, max_target_positions=64,
        )
        model = Transformer(cfg, len(src_dict), len(tgt_dict))
        with torch.no_grad():  # peaked, source-dependent outputs of a few tokens
            model.tgt_embed.weight.mul_(2.0)
        p = root / f"model{seed}.pt"
        save_checkpoint(
            {
                "arch": "test",
                "arch_config": cfg.to_dict(),
                "model": model.state_dict(),
                "dictionaries": {
                    "src_sha256": src_dict.sha256, "tgt_sha256": tgt_dict.sha256,
                    "src_size": len(src_dict), "tgt_size": len(tgt_dict),
                    "src_lang": "de", "tgt_lang": "en",
                },
            },
            p,
        )
        ckpts.append(p)
    return data, ckpts[0], ckpts[1], root


COMMON = ("--max-len-b", "6", "--quiet", "--threads", "1")


def lines(text: str) -> list[str]:
    assert text.endswith("\n") or text == ""
    return text.split("\n")[:-1]


def library_translation(data, ckpt, src_line: str, cfg: SearchConfig) -> list:
    """The library's answer for one sentence alone: subword-encode, search, detokenize."""
    from nmtkit.data.manifest import load_dictionaries
    from nmtkit.data.subwords import load_subword_model
    from nmtkit.models.loading import load_models

    src_dict, tgt_dict = load_dictionaries(data)
    ids = src_dict.encode(load_subword_model(data, "de").encode(src_line))[: MAX_SRC_POS - 1].tolist()
    if not ids:
        return []
    models = load_models([str(ckpt)], src_dict, tgt_dict, torch.device("cpu"), torch.float32).models
    hyps = search(models, torch.tensor([ids + [2]]), cfg)[0]
    detok = load_subword_model(data, "en").decode
    return [(detok(tgt_dict.string(h.tokens)), h) for h in hyps]


def test_split_in_input_order_equals_one_sentence_at_a_time(setup, run_cli):
    data, ckpt, _, _ = setup
    r = run_cli("generate", data, "--path", ckpt, *COMMON)
    assert r.code == 0, r
    out = lines(r.out)
    assert len(out) == len(TEST_SRC)
    cfg = SearchConfig(beam=4, lenpen=0.6, max_len_b=6, max_len_cap=63)
    for src, got in zip(TEST_SRC, out):
        want = library_translation(data, ckpt, src, cfg)
        assert got == (want[0][0] if want else "")
    assert out[2] == "" and out[4] == ""  # empty and blank inputs
    assert any(o for o in out)  # guard: the model does produce words


@pytest.mark.parametrize("batching", [("--batch-size", "1"), ("--batch-size", "2"), ("--max-tokens", "12"), ("--max-tokens", "1")])
def test_batching_never_changes_the_output(setup, run_cli, batching):
    data, ckpt, _, _ = setup
    ref = run_cli("generate", data, "--path", ckpt, *COMMON)
    r = run_cli("generate", data, "--path", ckpt, *COMMON, *batching, "--buffer-size", "3")
    assert r.code == 0, r
    assert r.out == ref.out


def test_raw_input_equals_binarized_split(setup, run_cli, tmp_path):
    data, ckpt, _, root = setup
    split = run_cli("generate", data, "--path", ckpt, *COMMON)
    raw = run_cli("generate", data, "--path", ckpt, "--input", root / "test.de", *COMMON)
    assert raw.code == 0, raw
    assert raw.out == split.out


def test_stdin_empty_lines_and_nbest(setup, run_cli, monkeypatch):
    import io
    import sys

    data, ckpt, _, _ = setup
    text = "der Hund\n\n \nKatze\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    r = run_cli("generate", data, "--path", ckpt, "--input", "-", "--nbest", "3", "--print-scores", *COMMON)
    assert r.code == 0, r
    out = lines(r.out)
    assert len(out) == 4 * 3  # nbest lines per input line, empty inputs included
    assert out[3:9] == ["0.000000\t"] * 6  # empty and blank lines: empty output, log-prob 0
    for block in (out[0:3], out[9:12]):
        scores = [float(line.split("\t")[0]) for line in block]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
        assert len({line.split("\t")[1] for line in block}) == 3


def test_overlong_line_is_truncated_with_a_warning_naming_it(setup, run_cli, tmp_path):
    data, ckpt, _, _ = setup
    f = tmp_path / "in.de"
    long = " ".join(["Straße"] * 40)
    f.write_text(f"Hund\n{long}\nKatze\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", f, *COMMON)
    assert r.code == 0, r
    assert len(lines(r.out)) == 3
    assert re.search(rf"{re.escape(str(f))}:2: \d+ tokens, truncated to {MAX_SRC_POS - 1} ", r.err)
    assert f"{f}:1:" not in r.err and f"{f}:3:" not in r.err
    # The truncated line is translated as its first MAX_SRC_POS - 1 tokens.
    g = tmp_path / "cut.de"
    from nmtkit.data.subwords import load_subword_model

    pieces = load_subword_model(data, "de").encode(long)[: MAX_SRC_POS - 1]
    g.write_text(load_subword_model(data, "de").decode(pieces) + "\n", encoding="utf-8")
    r2 = run_cli("generate", data, "--path", ckpt, "--input", g, *COMMON)
    assert lines(r2.out)[0] == lines(r.out)[1]


def test_fairseq_format(setup, run_cli):
    data, ckpt, _, _ = setup
    r = run_cli("generate", data, "--path", ckpt, "--format", "fairseq", "--nbest", "2", *COMMON)
    assert r.code == 0, r
    out = lines(r.out)
    ids = [int(line.split("\t")[0].split("-")[1]) for line in out]
    assert ids == sorted(ids) and set(ids) == set(range(len(TEST_SRC)))  # input order, 0-based
    for i in range(len(TEST_SRC)):
        block = [line for line, j in zip(out, ids) if j == i]
        kinds = [line.split("-")[0] for line in block]
        assert kinds[:2] == ["S", "T"]
        assert block[1] == f"T-{i}\t{REFS[i]}"  # the reference, detokenized
        if not TEST_SRC[i].strip():
            assert kinds == ["S", "T"]  # nothing to translate
            continue
        assert kinds[2:] == ["H", "D", "P"] * 2
        for h, d, p in (block[2:5], block[5:8]):
            _, hs, pieces = h.split("\t")
            _, ds, _ = d.split("\t")
            pos = [float(x) for x in p.split("\t")[1].split()]
            assert hs == ds
            ntok = len(pieces.split()) if pieces else 0
            assert len(pos) == ntok + 1  # </s> included
            assert float(hs) == pytest.approx(sum(pos) / length_penalty(ntok + 1, 0.6, "gnmt"), abs=1e-3)


def test_print_scores_match_fairseq_scores(setup, run_cli):
    data, ckpt, _, _ = setup
    plain = lines(run_cli("generate", data, "--path", ckpt, "--print-scores", *COMMON).out)
    fs = lines(run_cli("generate", data, "--path", ckpt, "--format", "fairseq", *COMMON).out)
    d_lines = {int(x.split("\t")[0][2:]): x.split("\t", 1)[1] for x in fs if x.startswith("D-")}
    for i, line in enumerate(plain):
        if i in d_lines:
            assert line == d_lines[i]
        else:
            assert line == "0.000000\t"


def test_output_file_is_atomic(setup, run_cli, tmp_path):
    data, ckpt, _, _ = setup
    out = tmp_path / "hyp.txt"
    r = run_cli("generate", data, "--path", ckpt, "--output", out, *COMMON)
    assert r.code == 0 and r.out == ""
    good = out.read_text(encoding="utf-8")
    assert len(lines(good)) == len(TEST_SRC)
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"Hund\nKatze\n\xff\xfe\n")
    r = run_cli("generate", data, "--path", ckpt, "--input", bad, "--output", out, "--buffer-size", "1", *COMMON)
    assert r.code == 2 and f"{bad}:3: invalid UTF-8" in r.err and "Traceback" not in r.err
    assert out.read_text(encoding="utf-8") == good  # the previous output is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.de", "hyp.txt"]  # no temp file left


def test_output_never_overwrites_the_input_or_a_checkpoint(setup, run_cli, tmp_path):
    data, ckpt, _, _ = setup
    f = tmp_path / "in.de"
    f.write_text("Hund\n", encoding="utf-8")
    r = run_cli("generate", data, "--path", ckpt, "--input", f, "--output", f, *COMMON)
    assert r.code == 2 and "--input" in r.err
    assert f.read_text(encoding="utf-8") == "Hund\n"
    before = ckpt.read_bytes()
    r = run_cli("generate", data, "--path", ckpt, "--output", ckpt, *COMMON)
    assert r.code == 2 and "--path" in r.err
    assert ckpt.read_bytes() == before
    r = run_cli("generate", data, "--path", ckpt, "--output", tmp_path, *COMMON)
    assert r.code == 2 and "directory" in r.err


def test_ensemble_of_one_checkpoint_twice_equals_it(setup, run_cli):
    data, ckpt, ckpt2, _ = setup
    one = lines(run_cli("generate", data, "--path", ckpt, "--print-scores", *COMMON).out)
    two = lines(run_cli("generate", data, "--path", ckpt, "--path", ckpt, "--print-scores", *COMMON).out)
    assert [x.split("\t")[1] for x in two] == [x.split("\t")[1] for x in one]
    assert [float(x.split("\t")[0]) for x in two] == pytest.approx([float(x.split("\t")[0]) for x in one], abs=1e-5)
    mixed = run_cli("generate", data, "--path", ckpt, "--path", ckpt2, "--print-scores", *COMMON)
    assert mixed.code == 0 and len(lines(mixed.out)) == len(TEST_SRC)
    assert lines(mixed.out) != one


def test_greedy_sampling_and_precision(setup, run_cli):
    data, ckpt, _, _ = setup
    g = run_cli("generate", data, "--path", ckpt, "--beam", "1", *COMMON)
    assert g.code == 0 and len(lines(g.out)) == len(TEST_SRC)
    s1 = run_cli("generate", data, "--path", ckpt, "--sampling", "--beam", "3", "--nbest", "3", "--seed", "7", *COMMON)
    s2 = run_cli("generate", data, "--path", ckpt, "--sampling", "--beam", "3", "--nbest", "3", "--seed", "7", *COMMON)
    assert s1.code == 0 and s1.out == s2.out and len(lines(s1.out)) == 3 * len(TEST_SRC)
    b = run_cli("generate", data, "--path", ckpt, "--precision", "bf16", "--threads", "1", *COMMON)
    assert b.code == 0 and len(lines(b.out)) == len(TEST_SRC)


def test_pipe_into_score(setup, run_cli, tmp_path):
    data, ckpt, _, root = setup
    hyp = tmp_path / "hyp.txt"
    assert run_cli("generate", data, "--path", ckpt, "-o", hyp, *COMMON).code == 0
    r = run_cli("score", "--ref", root / "test.en", "--sys", hyp)
    assert r.code == 0, r
    assert "BLEU" in r.out


def test_refuses_a_checkpoint_of_other_dictionaries(setup, run_cli, tmp_path):
    from nmtkit.checkpoints import load_checkpoint, save_checkpoint

    data, ckpt, _, _ = setup
    state = load_checkpoint(ckpt)
    state["dictionaries"]["tgt_sha256"] = "0" * 64
    other = tmp_path / "other.pt"
    save_checkpoint(state, other)
    r = run_cli("generate", data, "--path", other, *COMMON)
    assert r.code == 2 and "--path" in r.err and "tgt dictionary" in r.err
    assert len([x for x in r.err.splitlines() if x.strip()]) == 1


def test_refuses_a_checkpoint_of_the_reverse_direction(setup, run_cli, tmp_path):
    # a joined dictionary has the same checksum on both sides: only the language codes tell
    # an en->de model from a de->en one
    from nmtkit.checkpoints import load_checkpoint, save_checkpoint

    data, ckpt, _, _ = setup
    state = load_checkpoint(ckpt)
    assert state["dictionaries"]["src_sha256"] == state["dictionaries"]["tgt_sha256"]
    state["dictionaries"]["src_lang"], state["dictionaries"]["tgt_lang"] = "en", "de"
    reverse = tmp_path / "reverse.pt"
    save_checkpoint(state, reverse)
    r = run_cli("generate", data, "--path", reverse, *COMMON)
    assert r.code == 2 and "trained for en->de" in r.err and "de->en" in r.err, r
    # checkpoints written before the codes were kept still load
    del state["dictionaries"]["src_lang"], state["dictionaries"]["tgt_lang"]
    save_checkpoint(state, reverse)
    assert run_cli("generate", data, "--path", reverse, *COMMON).code == 0


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--beam", "0"), "--beam"),
        (("--nbest", "5"), "--nbest"),
        (("--format", "xml"), "--format"),
        (("--precision", "fp8"), "--precision"),
        (("--lenpen-form", "t2t"), "--lenpen-form"),
        (("--early-stop", "never"), "--early-stop"),
        (("--topk", "5"), "--sampling"),
        (("--max-tokens", "0"), "--max-tokens"),
        (("--gen-subset", "nosuch"), "nosuch"),
        (("--gen-subset", "test", "--input", "x"), "--input"),
        (("--input", "/no/such/file"), "/no/such/file"),
        (("--device", "cuda:7"), "--device"),
        (("--device", "tpu"), "--device"),
        (("--ema",), "--ema"),
    ],
)
def test_flag_errors_are_one_line(setup, run_cli, args, needle):
    data, ckpt, _, _ = setup
    if args[:2] == ("--device", "cuda:7") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")
    r = run_cli("generate", data, "--path", ckpt, *args, *COMMON)
    assert r.code == 2, r
    err = [x for x in r.err.splitlines() if x.strip()]
    assert len(err) == 1 and needle in err[0] and "Traceback" not in r.err


def test_missing_checkpoint_and_data_dir(setup, run_cli, tmp_path):
    data, ckpt, _, _ = setup
    r = run_cli("generate", data, "--path", tmp_path / "none.pt", *COMMON)
    assert r.code == 2 and "none.pt" in r.err
    r = run_cli("generate", tmp_path, "--path", ckpt, *COMMON)
    assert r.code == 2 and "manifest" in r.err


def test_score_is_nan_free_and_lengths_bounded(setup, run_cli):
    """Every hypothesis respects the output limit a*src_len+b and has a finite score."""
    data, ckpt, _, _ = setup
    r = run_cli("generate", data, "--path", ckpt, "--format", "fairseq", "--max-len-a", "0", "--max-len-b", "2", "--quiet")
    for line in lines(r.out):
        if line.startswith("H-"):
            _, score, pieces = line.split("\t")
            assert math.isfinite(float(score)) and len(pieces.split()) <= 2


def test_output_into_a_pipe_closed_early_exits_0_quietly(setup, tmp_path):
    """`nmtkit generate ... | head -3` is a normal use of a Unix filter: when the reader goes
    away, generate stops with status 0 and no message (click used to turn EPIPE into exit 1).
    The output (about 4000 sentences, several hundred KB) is far larger than a pipe's buffer, so
    generate is still writing when head exits."""
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    data, ckpt, _, root = setup
    src = ["der Hund läuft", "Kind", "die Straße", "zwei Katze springt"]
    big = tmp_path / "big.de"
    big.write_text("".join(src[i % len(src)] + "\n" for i in range(4000)), encoding="utf-8")
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "nmtkit", "generate", str(data), "--path", str(ckpt), "-i", str(big),
           "--format", "fairseq", "--beam", "1", "--max-len-b", "6", "--threads", "1"]
    r = subprocess.run(["bash", "-c", "set -o pipefail; " + shlex.join(cmd) + " | head -3"], cwd=repo,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and len(r.stdout.splitlines()) == 3, r


@pytest.mark.parametrize("name,raw", [("test.de.000.bin", False), ("spm.model", False), ("spm.model", True),
                                      ("dict.en.txt", True)])
def test_a_flipped_byte_in_any_file_generate_reads_is_one_line_naming_it(setup, run_cli, tmp_path, name, raw):
    """Binarized split or raw input: every data-dir file generate reads is checked against the
    manifest's sha256 (a flipped byte in a test shard or in spm.model once changed translations
    silently)."""
    import shutil

    data, ckpt, _, root = setup
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    p = copy / name
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01  # same size: only the checksum can tell
    p.write_bytes(bytes(b))
    inp = ("-i", root / "test.de") if raw else ()
    r = run_cli("generate", copy, "--path", ckpt, *inp, *COMMON)
    assert r.code == 2, r
    err = [x for x in r.err.splitlines() if x.strip()]
    assert err == [f"nmtkit: error: {p}: checksum mismatch with manifest.json (corrupt or modified file)"], r.err


def test_generate_hashes_each_file_once(setup, run_cli, monkeypatch):
    """Verification is cheap: one sha256 per file per run, however many readers open it."""
    import collections

    from nmtkit.data import manifest as M

    data, ckpt, _, _ = setup
    hashed = collections.Counter()
    real = M.sha256_file
    monkeypatch.setattr(M, "sha256_file", lambda p: hashed.update([p.name]) or real(p))
    monkeypatch.setattr(M, "_VERIFIED", set())  # a fresh run
    (data / M.VERIFIED_NAME).unlink(missing_ok=True)  # that has no record of earlier checks
    assert run_cli("generate", data, "--path", ckpt, *COMMON).code == 0
    assert set(hashed) >= {"test.de.000.bin", "test.de.000.idx", "test.en.000.bin", "spm.model"}, hashed
    assert max(hashed.values()) == 1, hashed


def test_the_buffer_is_one_line_for_a_terminal_on_stdin(monkeypatch):
    import sys

    from nmtkit.generation.generator import GenerateOptions

    def size(tty: bool, **flags) -> int:
        monkeypatch.setattr(sys.stdin, "isatty", lambda: tty, raising=False)
        values = {"paths": ["m.pt"], "data_dir": "d", "search": {"max_len_b": 5}, "buffer_size": None, **flags}
        return GenerateOptions.from_flags(values).buffer_size

    assert size(True, input="-") == 1  # typed lines are answered one by one
    assert size(False, input="-") == 10000  # a pipe keeps the large buffer
    assert size(True, input="in.de") == 10000  # a file is not typed
    assert size(True, input="-", buffer_size=7) == 7 and size(False, input="-", buffer_size=10000) == 10000


def test_a_terminal_on_stdin_gets_each_translation_before_the_next_line(setup):
    """fairseq-interactive's behaviour: with --input - on a terminal, each typed line is translated
    and printed before the input ends (a real pseudo-terminal; the answer must come while the
    terminal is still open)."""
    import os
    import pty
    import select
    import subprocess
    import sys
    from pathlib import Path

    data, ckpt, _, _ = setup
    repo = Path(__file__).resolve().parents[1]
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "nmtkit", "generate", str(data), "--path", str(ckpt),
                          "--input", "-", *COMMON], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=repo, env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"})
    os.close(slave)
    try:
        answers = []
        for line in ("der Hund läuft", "die Straße"):
            os.write(master, f"{line}\n".encode())
            ready, _, _ = select.select([p.stdout], [], [], 120)
            assert ready, "no translation while the terminal stays open"
            answers.append(p.stdout.readline().decode().rstrip("\n"))
        os.write(master, b"\x04")  # end of input (Ctrl-D)
        assert p.wait(timeout=60) == 0, p.stderr.read().decode()
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
    from nmtkit import Translator

    tr = Translator.load(ckpt, data, threads=1, max_len_b=6)
    assert answers == tr.translate(["der Hund läuft", "die Straße"])


@pytest.mark.parametrize("fmt,extra", [("plain", ()), ("fairseq", ("--print-alignment",))])
def test_outputs_are_written_in_input_order_as_soon_as_every_earlier_input_is_done(setup, run_cli, monkeypatch,
                                                                                  fmt, extra):
    """`generate ... | head` must not wait for the whole split: each write holds only inputs
    whose every predecessor is already searched (or empty), the first write comes before the
    last batch is searched, and watching the writes changes nothing (the same batches on both
    runs: scores may differ in the last digit between batch compositions)."""
    from nmtkit.generation.translator import Translator
    from nmtkit.generation.writing import Writer

    data, ckpt, _, _ = setup
    whole = run_cli("generate", data, "--path", ckpt, "--format", fmt, *extra, "--batch-size", "1", *COMMON)
    assert whole.code == 0, whole
    searched: list[int] = []  # input indices, in the order the batches were searched
    writes: list[tuple[int, list[int]]] = []  # (batches searched so far, inputs written)
    batches_done = [0]
    translate_batches, write = Translator.translate_batches, Writer.write

    def counting(self, items, **kw):
        for batch, found in translate_batches(self, items, **kw):
            searched.extend(it.index for it in batch)
            batches_done[0] += 1
            yield batch, found

    def recording(writer, fh, done, stats):
        if done:
            writes.append((batches_done[0], [it.index for it, _, _ in done]))
        write(writer, fh, done, stats)

    monkeypatch.setattr(Translator, "translate_batches", counting)
    monkeypatch.setattr(Writer, "write", recording)
    r = run_cli("generate", data, "--path", ckpt, "--format", fmt, *extra, "--batch-size", "1", *COMMON)
    assert r.code == 0, r
    assert r.out == whole.out
    empty = {i for i, s in enumerate(TEST_SRC) if not s.strip()}
    assert [i for _, idx in writes for i in idx] == list(range(len(TEST_SRC)))
    total = batches_done[0]
    assert total == len(TEST_SRC) - len(empty)  # --batch-size 1: one batch per non-empty input
    for n, idx in writes:
        done = set(searched[:n]) | empty
        assert set(range(max(idx) + 1)) <= done, (n, idx, searched)
    assert writes[0][0] < total, writes  # something was written before the last batch was searched


def test_an_empty_input_file_is_said_before_the_model_is_loaded(setup, run_cli, tmp_path, monkeypatch):
    from nmtkit.generation import generator
    from nmtkit.generation.translator import Translator

    data, ckpt, _, _ = setup
    empty = tmp_path / "empty.de"
    empty.write_bytes(b"")
    order: list[str] = []
    real_open = Translator.open
    monkeypatch.setattr(generator, "print_note", lambda note: note and order.append(note))
    monkeypatch.setattr(Translator, "open", lambda *a, **k: order.append("open") or real_open(*a, **k))
    r = run_cli("generate", data, "--path", ckpt, "--input", empty, *COMMON)
    assert r.code == 0 and r.out == "", r
    assert order[0] == f"--input {empty} is empty: 0 sentences to translate (the model is still loaded and checked)"
    assert order[1] == "open"
    # a file with one (empty) line is one sentence, not an empty input
    one = tmp_path / "one.de"
    one.write_text("\n")
    order.clear()
    r = run_cli("generate", data, "--path", ckpt, "--input", one, *COMMON)
    assert r.code == 0 and r.out == "\n" and order == ["open"], (r, order)


def test_no_progress_bar_while_the_user_types_at_a_terminal(setup, run_cli, monkeypatch):
    """Input typed at a terminal (--input - on a tty) gets no bar drawn over the typed line; a
    pipe or a file keeps it."""
    import io
    import sys

    from nmtkit.generation import generator

    data, ckpt, _, _ = setup
    asked: list[bool] = []
    real = generator.Progress
    monkeypatch.setattr(generator, "Progress", lambda enabled, total: asked.append(enabled) or real(False, total))
    for tty in (True, False):
        stdin = io.TextIOWrapper(io.BytesIO("der Hund\n".encode()), encoding="utf-8")
        monkeypatch.setattr(stdin, "isatty", lambda: tty)
        monkeypatch.setattr(sys, "stdin", stdin)
        r = run_cli("generate", data, "--path", ckpt, "--input", "-", "--max-len-b", "6", "--threads", "1")
        assert r.code == 0 and len(lines(r.out)) == 1, r
    assert asked == [False, True]
