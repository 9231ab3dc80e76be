"""One output policy for every command that writes a file (`nmtkit.outputs.check_output_file`).

`generate -o`, `attention -o` (every PNG it would write), `plot -o` and `average-checkpoints
--output` refuse, in one line naming the file and what it is, to write over an input of the same
command (however linked), a checkpoint, a file of a data directory or an export directory, or a
directory; nothing is written or changed (every byte under the test's folder compared before and
after). An ordinary existing output file is still replaced. Also here: text that is not valid
UTF-8 (a lone surrogate: undecodable bytes of a command-line argument) named in one line, and
`--score-reference`'s empty reference lines (the empty translation, as in `Translator.score`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmtkit import checkpoints as ck
from nmtkit.errors import UserError
from nmtkit.outputs import check_output_file, checkpoint_kind
from tests.test_average_checkpoints_cli import put
from tests.test_generate import COMMON, setup  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[1]


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root`: its path and the sha256 of its bytes (a folder: 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        out[key] = "dir" if p.is_dir() and not p.is_symlink() else (
            "link:" + os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="module")
def world(setup, tmp_path_factory):  # noqa: F811
    """A folder holding a copy of the data directory, the checkpoint, another checkpoint (nmtkit's,
    plus a PyTorch one and an old-format one), an export directory, raw text, a train log, links."""
    data0, ckpt0, _, _ = setup
    root = tmp_path_factory.mktemp("outputs")
    shutil.copytree(data0, root / "data")
    shutil.copy(ckpt0, root / "model.pt")
    shutil.copy(ckpt0, root / "other.pt")  # a checkpoint the command does not read
    torch.save({"weights": torch.zeros(2)}, root / "torch.pt")  # not nmtkit's
    torch.save({ck.MAGIC: 1, "model": {"w": torch.zeros(2)}}, root / "legacy.pt", _use_new_zipfile_serialization=False)
    exp = root / "exported"
    exp.mkdir()
    (exp / "nmtkit.json").write_text('{"format": "nmtkit-export", "format_version": 1}\n', encoding="utf-8")
    (exp / "model.bin").write_bytes(b"\0" * 16)
    (root / "src.de").write_text("der Hund läuft\nKind\n", encoding="utf-8")
    (root / "ref.en").write_text("the dog runs\nchild\n", encoding="utf-8")
    (root / "src-link.de").symlink_to(root / "src.de")
    (root / "model-link.pt").symlink_to(root / "model.pt")
    run = root / "run"
    run.mkdir()
    (run / "train_log.jsonl").write_text("".join(json.dumps(
        {"type": "train", "update": u, "loss": 5.0 - u / 10, "nll_loss": 4.0, "ppl": 16.0, "lr": 1e-4,
         "tgt_tok_per_s": 10.0}) + "\n" for u in range(1, 4)), encoding="utf-8")
    (run / "log-link.jsonl").symlink_to(run / "train_log.jsonl")
    (root / "folder").mkdir()
    return root


IN_DATA = "is inside the data directory {root}/data (it holds the manifest.json of nmtkit preprocess); " \
    "write outputs outside it"
IN_EXPORT = "is inside the export directory {root}/exported (it holds the nmtkit.json of nmtkit export); " \
    "write outputs outside it"
# every kind of target (name -> the --output path under the world, and the expected message's tail)
TARGETS = {
    "directory": ("folder", "is a directory; give a file name"),
    "data-dir file": ("data/dict.en.txt", IN_DATA),
    "data manifest": ("data/manifest.json", IN_DATA),
    "new file in data dir": ("data/hyp.txt", IN_DATA),
    "export-dir file": ("exported/model.bin", IN_EXPORT),
    "new file in export dir": ("exported/out.txt", IN_EXPORT),
    "nmtkit checkpoint": ("other.pt", "is an nmtkit checkpoint; choose another output"),
    "PyTorch checkpoint": ("torch.pt", "is a PyTorch checkpoint; choose another output"),
    "old-format checkpoint": ("legacy.pt", "is an nmtkit checkpoint; choose another output"),
}


RECORD = "data/.nmtkit-verified.json"  # the data directory's record of checked files (a cache)


def refused_cleanly(world: Path, run_cli, args, message: str) -> None:
    """Refused in one line, and nothing under `world` changed, except that the record of checked
    files may have gained entries: a command checks the files it reads before it meets the input
    it refuses, and which files were checked already depends on the commands run before (the
    tests run in any order). Every file the record held keeps its size and sha256 there (its
    inode and time may be refreshed: the world's data directory is a copy)."""
    before = snapshot(world)
    record = json.loads((world / RECORD).read_text()) if (world / RECORD).exists() else {}
    r = run_cli(*args)
    assert r.code == 2 and r.err.strip() == f"nmtkit: error: {message}", (args, r)
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    after = snapshot(world)
    if RECORD in after:
        grown = json.loads((world / RECORD).read_text())
        def kept(rec):  # file -> (size, sha256)
            return {k: (v[0], v[-1]) for k, v in rec.items() if k in record}

        assert kept(grown) == kept(record), args
        after[RECORD] = before.get(RECORD)
    assert after == before, args


def _generate(world: Path, out: str, *extra: str) -> list:
    return ["generate", world / "data", "--path", world / "model.pt", "--input", world / "src.de",
            *COMMON, *extra, "-o", out]


def _attention(world: Path, out: str, *extra: str) -> list:
    return ["attention", world / "data", "--path", world / "model.pt", "--source", "der Hund läuft",
            "--threads", "1", "--max-len-b", "4", *extra, "-o", out]


def _plot(world: Path, out: str) -> list:
    return ["plot", world / "run", "-o", out]


def _average(world: Path, out: str) -> list:
    return ["average-checkpoints", world / "model.pt", "--output", out]


COMMANDS = {"generate": _generate, "attention": _attention, "plot": _plot, "average-checkpoints": _average}


# average-checkpoints writes nmtkit checkpoints: it replaces an earlier (inference) one, below
CASES = [(c, t) for c in COMMANDS for t in TARGETS
         if not (c == "average-checkpoints" and t in ("nmtkit checkpoint", "old-format checkpoint"))]


@pytest.mark.parametrize("command, target", CASES)
def test_every_command_refuses_every_kind_of_target(world, run_cli, command, target):
    name, tail = TARGETS[target]
    out = str(world / name)
    refused_cleanly(world, run_cli, COMMANDS[command](world, out), f"--output {out} {tail.format(root=world)}")


@pytest.mark.parametrize("command, out, flag, given", [
    ("generate", "src.de", "--input", "src.de"),
    ("generate", "src-link.de", "--input", "src.de"),  # a symlink to the input
    ("generate", "model-link.pt", "--path", "model.pt"),
    ("attention", "model-link.pt", "--path", "model.pt"),
    ("plot", "run/log-link.jsonl", "the training log", "run/train_log.jsonl"),
    ("plot", "run/train_log.jsonl", "the training log", "run/train_log.jsonl"),
])
def test_an_input_is_never_an_output(world, run_cli, command, out, flag, given):
    out = str(world / out)
    refused_cleanly(world, run_cli, COMMANDS[command](world, out),
                    f"--output {out} is the same file as {flag} {world / given}; choose another output")


def test_generate_keeps_its_reference_message(world, run_cli):
    ref = str(world / "ref.en")
    refused_cleanly(world, run_cli, _generate(world, ref, "--score-reference", "--reference", ref),
                    f"--output {ref} is the same file as --reference {ref}; choose another output")


def test_average_checkpoints_keeps_its_input_and_training_refusals(world, run_cli, tmp_path):
    link = str(world / "model-link.pt")
    refused_cleanly(world, run_cli, _average(world, link),
                    f"--output {link} is one of the input checkpoints; choose another path")
    put(tmp_path / "train.pt", 1.0)  # holds training state
    before = snapshot(tmp_path)
    r = run_cli("average-checkpoints", world / "model.pt", "--output", tmp_path / "train.pt")
    assert r.code == 2 and "is a training checkpoint" in r.err and snapshot(tmp_path) == before


def test_attention_checks_every_png_it_would_write(world, run_cli):
    """Two sentences write pic-1.png and pic-2.png: a checkpoint named pic-2.png stops the run
    before the model is loaded, and pic-1.png is not written either."""
    pics = world / "pics"
    pics.mkdir()
    try:
        shutil.copy(world / "other.pt", pics / "pic-2.png")
        out = str(pics / "pic.png")
        refused_cleanly(world, run_cli, _attention(world, out, "--source", "Kind"),
                        f"--output {pics / 'pic-2.png'} is an nmtkit checkpoint; choose another output")
        # the case that turned a checkpoint into an npz
        refused_cleanly(world, run_cli, _attention(world, str(world / "other.pt"), "--format", "npz"),
                        f"--output {world / 'other.pt'} is an nmtkit checkpoint; choose another output")
    finally:
        shutil.rmtree(pics)


def test_ordinary_existing_outputs_are_replaced(world, run_cli, tmp_path):
    """An earlier output (or any file that is none of the above) is replaced, as before."""
    outs = {name: tmp_path / name for name in ("hyp.txt", "att.json", "att.npz", "pic.png", "curves.png", "avg.pt")}
    for p in outs.values():
        p.write_text("an earlier output\n", encoding="utf-8")
    for args in (_generate(world, outs["hyp.txt"]), _attention(world, outs["att.json"], "--format", "json"),
                 _attention(world, outs["att.npz"], "--format", "npz"), _attention(world, outs["pic.png"]),
                 _plot(world, outs["curves.png"]), _average(world, outs["avg.pt"])):
        r = run_cli(*args)
        assert r.code == 0, (args, r)
    assert len((tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()) == 2
    assert json.loads(outs["att.json"].read_text(encoding="utf-8"))["kind"] == "cross"
    assert outs["att.npz"].read_bytes()[:2] == b"PK" and checkpoint_kind(outs["att.npz"]) is None
    assert outs["pic.png"].read_bytes()[:4] == outs["curves.png"].read_bytes()[:4] == b"\x89PNG"
    assert checkpoint_kind(outs["avg.pt"]) == "an nmtkit checkpoint"
    # average-checkpoints replaces its own earlier inference checkpoint
    assert run_cli(*_average(world, outs["avg.pt"])).code == 0
    assert ck.load_checkpoint(outs["avg.pt"])["model"].keys() == ck.load_checkpoint(world / "model.pt")["model"].keys()


def test_checkpoint_kind_reads_only_the_first_bytes(tmp_path):
    torch.save({"x": 1}, tmp_path / "zip4.pt", pickle_protocol=4)
    torch.save({"x": 1}, tmp_path / "old4.pt", pickle_protocol=4, _use_new_zipfile_serialization=False)
    buf = io.BytesIO()
    import numpy as np

    np.savez(buf, a=np.zeros(3))
    (tmp_path / "a.npz").write_bytes(buf.getvalue())
    (tmp_path / "text.txt").write_text("PK not a zip\n", encoding="utf-8")
    (tmp_path / "torn.pt").write_bytes((tmp_path / "zip4.pt").read_bytes()[:30])
    assert checkpoint_kind(tmp_path / "zip4.pt") == checkpoint_kind(tmp_path / "old4.pt") == "a PyTorch checkpoint"
    for name in ("a.npz", "text.txt", "torn.pt", "missing.pt"):
        assert checkpoint_kind(tmp_path / name) is None, name
    # the library call: None and "-" (stdout) pass, a new plain file passes
    check_output_file(None, "--output")
    check_output_file("-", "--output", [("--input", "-")])
    check_output_file(tmp_path / "new.txt", "--output", [("--input", tmp_path / "text.txt")])
    with pytest.raises(UserError, match="is a PyTorch checkpoint"):
        check_output_file(tmp_path / "old4.pt", "-o")


def test_relative_and_linked_outputs(world, monkeypatch):
    """A name relative to a data directory as the working directory, and a symlink to one of its
    files, are refused as inside it; the message names the folder."""
    monkeypatch.chdir(world / "data")
    tail = f"is inside the data directory {Path.cwd()} (it holds the manifest.json of nmtkit preprocess)"
    with pytest.raises(UserError) as e:
        check_output_file("hyp.txt", "-o")
    assert str(e.value) == f"-o hyp.txt {tail}; write outputs outside it"
    link = world / "dict-link.txt"
    link.symlink_to(world / "data" / "dict.en.txt")
    try:
        with pytest.raises(UserError, match="is inside the data directory"):
            check_output_file(link, "--output")
    finally:
        link.unlink()


# ---------------------------------------------------------------------------------------------
# text that is not valid UTF-8


def test_undecodable_source_and_target_are_named(world, run_cli):
    out = str(world / "never.json")
    for extra, message in (
        (("--source", "Kind", "--source", "\udcff"), "--source 3: not valid UTF-8 text (byte 0xff at column 1)"),
        (("--target", "a \udce9"), "--target 1: not valid UTF-8 text (byte 0xe9 at column 3)"),
    ):
        refused_cleanly(world, run_cli, _attention(world, out, "--format", "json", *extra), message)


def test_undecodable_command_line_bytes(world):
    """A real command line: the byte 0xff arrives as a lone surrogate and is named in one line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "LC_ALL": "C.UTF-8"}
    r = subprocess.run([sys.executable, "-m", "nmtkit", "attention", str(world / "data"), "--path",
                        str(world / "model.pt"), "--source", b"der \xff".decode("utf-8", "surrogateescape"),
                        "--format", "json", "-o", str(world / "never.json")],
                       check=False, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == \
        "nmtkit: error: --source 1: not valid UTF-8 text (byte 0xff at column 5)", r.stderr
    assert not (world / "never.json").exists()


def test_translator_names_the_sentence(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    tr = Translator.load(ckpt, data, threads=1)
    for call, message in (
        (lambda: tr.translate(["Kind", "\ud800"]), "sentence 2: not valid UTF-8 text (lone surrogate U+D800 at column 1)"),
        (lambda: tr.translate_nbest(["a\udc80"]), "sentence 1: not valid UTF-8 text (byte 0x80 at column 2)"),
        (lambda: tr.score(["Kind"], ["x\ud800"]), "target 1: not valid UTF-8 text (lone surrogate U+D800 at column 2)"),
        (lambda: tr.attention("\udfff"), "sentence 1: not valid UTF-8 text (lone surrogate U+DFFF at column 1)"),
    ):
        with pytest.raises(UserError) as e:
            call()
        assert str(e.value) == message


# ---------------------------------------------------------------------------------------------
# --score-reference: an empty reference line is the empty translation, as in Translator.score


def test_empty_and_blank_reference_lines_score_as_the_empty_translation(setup, run_cli, tmp_path):  # noqa: F811
    """Deliberate (docs/inspect.md): the search can output the empty translation, so a list of
    outputs fed back must score every line; the CLI and `Translator.score` agree on it, and an
    empty source line stays refused, naming FILE:LINE."""
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("der Hund läuft\nKind\nKind\n", encoding="utf-8")
    ref.write_text("the dog runs\n\n   \n", encoding="utf-8")
    args = ("generate", data, "--path", ckpt, "--input", src, "--reference", ref, "--score-reference", *COMMON)
    r = run_cli(*args)
    assert r.code == 0, r
    got = [line.split("\t") for line in r.out.splitlines()]
    tr = Translator.load(ckpt, data, threads=1)
    want = tr.score(["der Hund läuft", "Kind", "Kind"], ["the dog runs", "", "   "])
    assert [int(g[2]) for g in got] == [w.tokens for w in want] and want[1].tokens == want[2].tokens == 1
    for g, w in zip(got, want):
        assert float(g[1]) == pytest.approx(w.logprob, abs=1e-5)
    src.write_text("der Hund läuft\n  \nKind\n", encoding="utf-8")
    r = run_cli(*args)
    assert r.code == 2 and r.err.strip() == (f"nmtkit: error: {src}:2: empty source line (every pair needs a "
                                             "source and a target)"), r
