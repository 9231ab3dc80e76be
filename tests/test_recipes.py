"""The recipes end to end: the SMOKE modes of the WMT14 recipes and `quickstart.sh --smoke` run every
stage (preprocess, train, average, generate, score) on tiny data and print score lines; the WMT14
data stages turn statmt.org-style archives into the expected plain text; stage stamps make re-runs
skip finished work. These are the commands a user types, run as subprocesses in temporary work
directories (the repository's own runs/ is never touched)."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED, shared_file

pytestmark = pytest.mark.slow

SCORE_LINE = re.compile(r"^BLEU = \d+\.\d\d .*\| lines: \d+", re.M)
TOK_SCORE_LINE = re.compile(r"^tok-BLEU = \d+\.\d\d .*\| lines: (\d+) \| paper: ", re.M)


def _env(work: Path, **extra: str) -> dict:
    """The recipes' environment: this interpreter's virtual environment (recipes/lib/env.sh uses
    an active VIRTUAL_ENV as it is), one thread, the shared data, a private work directory."""
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NMTKIT_SHARED"] = str(SHARED)
    env["WORK"] = str(work)
    env["NMTKIT_WORK"] = str(work)
    env["OMP_NUM_THREADS"] = "1"
    for k in ("STAGE", "LAST_STAGE", "MODEL", "SMOKE", "NNODES", "NODE_RANK", "NGPUS"):
        env.pop(k, None)
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _need_wmt14() -> None:
    shared_file("wmt14", "newstest2014-ende.de.gz")


@pytest.mark.parametrize("pair,tgt_lang,compound", [("wmt14_en_de", "de", "yes"), ("wmt14_en_fr", "fr", "no")])
def test_wmt14_smoke_runs_every_stage(tmp_path, pair, tgt_lang, compound):
    _need_wmt14()
    work = tmp_path / pair
    env = _env(work, SMOKE="1")
    r = _run(["bash", f"recipes/{pair}/run.sh"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    for stage in ("download", "prepare", "preprocess", "train", "average", "generate", "score"):
        assert f"[{pair}] {stage}: done" in r.stderr, (stage, r.stderr[-3000:])
    m = TOK_SCORE_LINE.search(r.stdout)
    assert m and m.group(1) == "200", r.stdout
    assert f"moses-{tgt_lang}" in m.group(0) and f"compound-split: {compound}" in m.group(0)
    assert SCORE_LINE.search(r.stdout), r.stdout
    paper = {"wmt14_en_de": "27.3", "wmt14_en_fr": "38.1"}[pair]
    assert f"paper: {paper} (Table 2)" in r.stdout
    # the stages really produced what the score is about: 200 hypotheses, 2 averaged checkpoints
    hyp = work / "results" / "base" / f"newstest2014.hyp.{tgt_lang}"
    assert len(hyp.read_text(encoding="utf-8").split("\n")) - 1 == 200
    assert (work / "checkpoints" / "base" / "average_last2.pt").is_file()
    assert "--max-tokens 1024 x 1 x --update-freq 2 = 2048 tokens" in r.stderr
    if pair != "wmt14_en_de":
        return  # the stage logic is shared: check re-runs once

    # Second run: every stage is up to date and the saved score is printed again.
    r2 = _run(["bash", f"recipes/{pair}/run.sh"], env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("up to date") == 7 and "running" not in r2.stderr, r2.stderr
    assert TOK_SCORE_LINE.search(r2.stdout).group(0) == m.group(0)

    # A damaged output re-runs the stage that wrote it (test_stage_logic covers the rest).
    score_file = work / "results" / "base" / "newstest2014.score.txt"
    score_file.write_text("", encoding="utf-8")
    r3 = _run(["bash", f"recipes/{pair}/run.sh"], env)
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert f"[{pair}] generate: up to date" in r3.stderr and f"[{pair}] score: done" in r3.stderr
    assert TOK_SCORE_LINE.search(r3.stdout).group(0) == m.group(0)


# A three-stage pipeline on recipes/lib/stages.sh: each stage appends its name to a log and
# writes one file; SETTING_B is stage b's setting.
PIPELINE = r"""
set -euo pipefail
. recipes/lib/stages.sh
RECIPE_NAME=t STAMP_DIR=$W/stamps STAGES=(a b c)
stage_a() { echo a >> $W/log; echo A > $W/a.out; STAGE_OUTPUTS+=("$W/a.out"); }
stage_b() { echo b >> $W/log; echo "B$SETTING_B" > $W/b.out; STAGE_OUTPUTS+=("$W/b.out"); }
stage_c() { echo c >> $W/log; echo C > $W/c.out; STAGE_OUTPUTS+=("$W/c.out"); }
stages_init "${STAGE:-}" "${LAST_STAGE:-}"
KA=$(key a) KB=$(key b "$KA" "$SETTING_B") KC=$(key c "$KB")
run_stage a "$KA" stage_a
run_stage b "$KB" stage_b
run_stage c "$KC" stage_c
"""


def test_stage_logic(tmp_path):
    """Skipping, re-running after a changed setting or a damaged output, STAGE and LAST_STAGE."""
    log = tmp_path / "log"

    def run(**extra: str) -> str:
        log.write_text("")
        env = {"PATH": os.environ["PATH"], "W": str(tmp_path), "SETTING_B": "1", **extra}
        r = subprocess.run(["bash", "-c", PIPELINE], cwd=REPO, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return log.read_text().replace("\n", "")

    assert run() == "abc"
    assert run() == ""  # all up to date
    assert run(SETTING_B="2") == "bc"  # b's setting changed: b and everything after it
    assert (tmp_path / "b.out").read_text() == "B2\n"
    assert run(SETTING_B="2") == ""
    (tmp_path / "a.out").write_text("damaged\n")  # another size: a, and then b and c, run again
    assert run(SETTING_B="2") == "abc"
    (tmp_path / "c.out").unlink()
    assert run(SETTING_B="2") == "c"
    assert run(SETTING_B="2", STAGE="b") == "bc"  # forced from b, although up to date
    assert run(SETTING_B="2", LAST_STAGE="a") == ""
    assert run(SETTING_B="3", LAST_STAGE="b") == "b"  # stops after b; c is left stale...
    assert run(SETTING_B="3") == "c"  # ...and runs next time, since its key follows b's
    # a failing stage leaves no stamp: the next run repeats it
    (tmp_path / "stamps" / "c.stamp").unlink()
    r = subprocess.run(["bash", "-c", PIPELINE.replace('echo C >', 'false; echo C >')], cwd=REPO,
                       env={"PATH": os.environ["PATH"], "W": str(tmp_path), "SETTING_B": "3"},
                       capture_output=True, text=True)
    assert r.returncode != 0 and not (tmp_path / "stamps" / "c.stamp").exists()


VALID_LINE = re.compile(r"^validation loss \(nll, bits per target token\): (\d+\.\d{3}) at update (\d+) -> "
                        r"(\d+\.\d{3}) at update (\d+) \((\d+) validations\)$", re.M)
BLANK_WARNING = "are empty or blank"  # nmtkit score's warning about an all-empty output


def _valid_nll(save_dir: Path) -> list[tuple[int, float]]:
    """(update, nll_loss) of every `valid` record of SAVE_DIR/train_log.jsonl."""
    with open(save_dir / "train_log.jsonl", encoding="utf-8") as fh:
        return [(r["update"], r["nll_loss"]) for r in map(json.loads, fh) if r["type"] == "valid"]


def _assert_valid_loss_fell(save_dir: Path, stdout: str) -> None:
    """At least two validations, the last one's loss below the first's, and the recipe's summary
    line (the last one on stdout) saying so with the log's numbers."""
    valid = _valid_nll(save_dir)
    assert len(valid) >= 2 and valid[-1][1] < valid[0][1], valid
    lines = VALID_LINE.findall(stdout)
    assert lines, stdout
    assert lines[-1] == (f"{valid[0][1]:.3f}", str(valid[0][0]), f"{valid[-1][1]:.3f}", str(valid[-1][0]),
                         str(len(valid))), (lines, valid)


def _hyps(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def quickstart_smoke(tmp_path_factory):
    """One `recipes/quickstart.sh --smoke` run, (work directory, result): its own test checks it,
    and the recipes that start from the quickstart's model (finetune, distill) use it as it is."""
    data = shared_file("multi30k", "train.de.gz").parent
    work = tmp_path_factory.mktemp("qs") / "quickstart"
    return work, _run(["bash", "recipes/quickstart.sh", "--smoke"], _env(work, NMTKIT_DATA=str(data)))


def test_quickstart_smoke(quickstart_smoke):
    """recipes/quickstart.sh --smoke trains long enough to tell a working pipeline from a broken
    one: the validation loss falls and the translations are not empty (a model of 30 updates
    gave only empty ones)."""
    work, r = quickstart_smoke
    assert r.returncode == 0, r.stderr[-3000:]
    m = SCORE_LINE.search(r.stdout)
    assert m and "| lines: 1000" in m.group(0), r.stdout  # the whole test_2016_flickr
    assert BLANK_WARNING not in r.stderr, r.stderr[-3000:]
    assert "--smoke checks the pipeline, not the model" in r.stderr
    hyps = _hyps(work / "test_2016_flickr.hyp.en")
    assert len(hyps) == 1000 and sum(1 for h in hyps if h.strip()) >= 500, hyps[:20]
    _assert_valid_loss_fell(work / "checkpoints", r.stdout)


TABLE_ROW = re.compile(r"^  (news \(newstest2014, last 100 lines, held out\)|Multi30k test_2016_flickr \(200 lines\))"
                       r"\s+(\d+\.\d\d) -> +(\d+\.\d\d)$", re.M)


def test_finetune_smoke(tmp_path, quickstart_smoke):
    """recipes/finetune.sh --smoke: the quickstart's smoke model, fine-tuned on 300 news pairs
    binarized with its own vocabulary; both test sets scored before and after."""
    data = shared_file("multi30k", "train.de.gz").parent
    shared_file("wmt14", "newstest2013.de.gz")
    work, qs = tmp_path / "finetune", quickstart_smoke[0]
    assert quickstart_smoke[1].returncode == 0, quickstart_smoke[1].stderr[-3000:]
    env = _env(work, NMTKIT_DATA=str(data), QUICKSTART_WORK=str(qs))
    r = _run(["bash", "recipes/finetune.sh", "--smoke"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = TABLE_ROW.findall(r.stdout)
    assert [row[0].split(" ")[0] for row in rows] == ["news", "Multi30k"], r.stdout
    lines = [m.group(0) for m in SCORE_LINE.finditer(r.stdout)]
    assert len(lines) == 2 and "| lines: 100" in lines[0] and "| lines: 200" in lines[1], r.stdout
    for stage in ("base", "data", "preprocess", "before", "train", "after"):
        assert f"[finetune] {stage}: done" in r.stderr, stage
    # the news validation loss fell; each test set translated once per model, only the lines scored
    _assert_valid_loss_fell(work / "checkpoints", r.stdout)
    assert BLANK_WARNING not in r.stderr, r.stderr[-3000:]
    results = work / "results"
    assert sorted(p.name for p in results.glob("*.hyp")) == [
        "after.flickr.hyp", "after.news.hyp", "before.flickr.hyp", "before.news.hyp"]
    for name, n in (("news", 100), ("flickr", 200)):
        for model in ("before", "after"):
            assert len(_hyps(results / f"{model}.{name}.hyp")) == n, (model, name)
    assert sum(1 for h in _hyps(results / "before.flickr.hyp") if h.strip()) >= 100
    assert _hyps(work / "raw" / "flickr.de") == _lines(data / "test_2016_flickr.de.gz")[:200]
    assert "--smoke checks the pipeline, not the model" in r.stderr
    # the fine-tuned model started from the quickstart's, on data with the same dictionaries
    from nmtkit import checkpoints as ck

    base = ck.load_checkpoint(qs / "checkpoints" / "average_last2.pt")
    ft = ck.load_checkpoint(work / "checkpoints" / "checkpoint_last.pt")
    assert ft["train_args"]["finetune_from_model"] == str(qs / "checkpoints" / "average_last2.pt")
    assert ft["dictionaries"] == base["dictionaries"] and ft["arch_config"]["dropout"] == 0.3
    assert (work / "tensorboard").is_dir() and list((work / "tensorboard").glob("events.out.tfevents.*"))
    # a second run: everything up to date, the same table again
    r2 = _run(["bash", "recipes/finetune.sh", "--smoke"], env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("up to date") == 6 and TABLE_ROW.findall(r2.stdout) == rows


def test_finetune_news_from_statmt_archives(tmp_path):
    """The data stage without a local copy: newstest2013/2014 taken from archives laid out like
    statmt.org's dev.tgz and test-full.tgz (made here from the shared text; the real ones are
    downloaded), extracted as sacreBLEU does, then sliced into train / valid / held-out test."""
    _need_wmt14()
    wmt = SHARED / "data" / "wmt14"
    flickr = shared_file("multi30k", "test_2016_flickr.en.gz")
    dl = tmp_path / "download"
    dl.mkdir()
    with tarfile.open(dl / "dev.tgz", "w:gz") as t:
        for lang in ("de", "en"):
            _add(t, f"dev/newstest2013-ref.{lang}.sgm", _sgm(_lines(wmt / f"newstest2013.{lang}.gz"), lang))
    with tarfile.open(dl / "test-full.tgz", "w:gz") as t:
        for name in ("newstest2014-deen-src.de.sgm", "newstest2014-deen-ref.en.sgm"):
            _add(t, f"test-full/{name}", gzip.decompress((wmt / "sgm" / f"{name}.gz").read_bytes()))
    import hashlib

    md5 = {n: hashlib.md5((dl / n).read_bytes()).hexdigest() for n in ("dev.tgz", "test-full.tgz")}
    (tmp_path / "empty").mkdir()
    work = tmp_path / "ft"
    env = _env(work, STAGE="data", LAST_STAGE="data", WMT14_DIR=str(tmp_path / "empty"), DOWNLOAD_DIR=str(dl),
               DEV_MD5=md5["dev.tgz"], TEST_MD5=md5["test-full.tgz"], FLICKR_REF=str(flickr))
    r = _run(["bash", "recipes/finetune.sh"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "lacks the newstest files: downloading them" in r.stderr and "downloading https" not in r.stderr
    raw = work / "raw"
    for lang in ("de", "en"):
        assert (raw / f"train.{lang}").read_text(encoding="utf-8").split("\n")[:-1] == _lines(wmt / f"newstest2013.{lang}.gz")
        news14 = _lines(wmt / f"newstest2014-ende.{lang}.gz")
        assert (raw / f"valid.{lang}").read_text(encoding="utf-8").split("\n")[:-1] == news14[:1003]
        assert (raw / f"test.{lang}").read_text(encoding="utf-8").split("\n")[:-1] == news14[-2000:]
    assert len((raw / "flickr.en").read_text(encoding="utf-8").split("\n")) - 1 == 1000
    assert not (work / "extract").exists()


def test_recipes_refuse_bad_settings(tmp_path):
    env = _env(tmp_path / "w", SMOKE="1")
    for extra, msg in [
        ({"STAGE": "bogus"}, "STAGE=bogus is not a stage; stages: download prepare preprocess train average generate score"),
        ({"STAGE": "score", "LAST_STAGE": "train"}, "LAST_STAGE=train comes before STAGE=score"),
        ({"NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK=2 must be below NNODES=2"),
        ({"MAX_UPDATE": "ten"}, "MAX_UPDATE must be a non-negative integer, got 'ten'"),
        ({"MAX_TOKENS_PER_DEVICE": "0"}, "MAX_TOKENS_PER_DEVICE must be a positive integer, got '0'"),
        ({"NNODES": "2"}, "NNODES=2 needs MASTER_ADDR (node 0's address)"),
        ({"DEVICE": "tpu"}, "DEVICE must be auto, cpu or cuda, got 'tpu'"),
    ]:
        r = _run(["bash", "recipes/wmt14_en_de/run.sh"], {**env, **extra})
        assert r.returncode == 2 and msg in r.stderr, (extra, r.stderr)
    r = _run(["bash", "recipes/wmt14_en_fr/run.sh", "huge"], env)
    assert r.returncode == 2 and "model must be base or big, got 'huge'" in r.stderr
    r = _run(["bash", "recipes/quickstart.sh", "--fast"], env)
    assert r.returncode == 2 and "unknown option --fast" in r.stderr
    r = _run(["bash", "recipes/finetune.sh", "--fast"], env)
    assert r.returncode == 2 and "unknown option --fast" in r.stderr
    r = _run(["bash", "recipes/finetune.sh", "--smoke"], {**env, "MAX_UPDATE": "many"})
    assert r.returncode == 2 and "MAX_UPDATE must be a non-negative integer, got 'many'" in r.stderr
    assert not (tmp_path / "w").exists()  # refused before writing anything


# --- the full-size data path, on archives laid out like statmt.org's -----------------------------


def _lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as fh:
        return fh.read().split("\n")[:-1]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _sgm(lines: list[str], lang: str) -> bytes:
    body = "".join(f'<seg id="{i}">{t}</seg>\n' for i, t in enumerate(lines, start=1))
    return f'<srcset setid="x" srclang="any">\n<doc sysid="ref" docid="d" genre="news" origlang="{lang}">\n{body}</doc>\n</srcset>\n'.encode()


def test_wmt14_en_de_prepare_from_archives(tmp_path):
    """prepare + preprocess of the full recipe (STAGE=prepare LAST_STAGE=preprocess), on fake
    archives with the real member names: corpora concatenated in order, the pair with invalid
    UTF-8 dropped, control characters turned into spaces, SGM test sets extracted as sacreBLEU
    does (equal to ../shared's sacreBLEU-made text), cleaning with --ratio 1.5 on subwords."""
    _need_wmt14()
    wmt = SHARED / "data" / "wmt14"
    en, de = _lines(wmt / "newstest2014-ende.en.gz"), _lines(wmt / "newstest2014-ende.de.gz")
    dl = tmp_path / "download"
    dl.mkdir()
    # corpora: newstest2014 lines 1-300, 301-600 (+ 2 odd pairs), 601-900, as the three archives
    cc_en = en[300:600] + ["bad \xff pair", "tab\there\x07bell  "]
    cc_de = de[300:600] + ["ok", "Tab hier"]
    with tarfile.open(dl / "training-parallel-europarl-v7.tgz", "w:gz") as t:
        _add(t, "training/europarl-v7.de-en.en", ("\n".join(en[:300]) + "\n").encode())
        _add(t, "training/europarl-v7.de-en.de", ("\n".join(de[:300]) + "\n").encode())
        _add(t, "training/europarl-v7.fr-en.en", b"not used\n")
    with tarfile.open(dl / "training-parallel-commoncrawl.tgz", "w:gz") as t:
        # "\xff" stands for a byte that is not UTF-8
        # this archive spells its names "./NAME", as some tarballs do
        _add(t, "./commoncrawl.de-en.en", ("\n".join(cc_en) + "\n").encode().replace("\xff".encode(), b"\xff"))
        _add(t, "./commoncrawl.de-en.de", ("\n".join(cc_de) + "\n").encode())
    with tarfile.open(dl / "training-parallel-nc-v9.tgz", "w:gz") as t:
        _add(t, "training/news-commentary-v9.de-en.en", ("\n".join(en[600:900]) + "\n").encode())
        _add(t, "training/news-commentary-v9.de-en.de", ("\n".join(de[600:900]) + "\n").encode())
    with tarfile.open(dl / "dev.tgz", "w:gz") as t:
        _add(t, "dev/newstest2013-src.en.sgm", _sgm(_lines(wmt / "newstest2013.en.gz"), "en"))
        _add(t, "dev/newstest2013-ref.de.sgm", _sgm(_lines(wmt / "newstest2013.de.gz"), "de"))
    with tarfile.open(dl / "test-full.tgz", "w:gz") as t:
        for name in ("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"):
            _add(t, f"test-full/{name}", gzip.decompress((wmt / "sgm" / f"{name}.gz").read_bytes()))

    work = tmp_path / "ende"
    env = _env(work, STAGE="prepare", LAST_STAGE="preprocess", DOWNLOAD_DIR=str(dl),
               VOCAB_SIZE="2000", WORKERS="1", DEVICE="cpu")
    r = _run(["bash", "recipes/wmt14_en_de/run.sh"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    raw = work / "raw"
    train_en = (raw / "train.en").read_text(encoding="utf-8").split("\n")[:-1]
    train_de = (raw / "train.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(train_en) == len(train_de) == 901  # 902 pairs, 1 dropped for invalid UTF-8
    assert train_en[:300] == en[:300] and train_en[-300:] == en[600:900]
    assert train_en[600] == "tab here bell" and train_de[600] == "Tab hier"
    assert "1 dropped (invalid UTF-8)" in r.stderr
    # SGM extraction = the sacreBLEU-made plain text in ../shared (full newstest2014: 3003 lines)
    assert (raw / "test.de").read_text(encoding="utf-8").split("\n")[:-1] == de
    assert (raw / "valid.de").read_text(encoding="utf-8").split("\n")[:-1] == _lines(wmt / "newstest2013.de.gz")
    assert not (work / "extract").exists()  # extracted members are removed after prepare
    manifest = (work / "data" / "manifest.json").read_text()
    assert '"test"' in manifest and "preprocess: done" in r.stderr
    assert "download: not run (STAGE=prepare)" in r.stderr  # the archives are not checked
    assert "train: not run (LAST_STAGE=preprocess)" in r.stderr


def test_wmt14_data_errors(tmp_path):
    """The data helper's failures are one line naming the file, exit status 2."""
    tool = [sys.executable, str(REPO / "recipes" / "lib" / "wmt14_data.py")]
    arc = tmp_path / "a.tgz"
    with tarfile.open(arc, "w:gz") as t:
        _add(t, "training/x.en", b"a\n")
    r = subprocess.run(tool + ["extract", str(arc), str(tmp_path / "out"), "training/x.de"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == f"wmt14_data.py: error: {arc} has no member training/x.de; it holds e.g. training/x.en"
    (tmp_path / "s.en").write_text("a\nb\n")
    (tmp_path / "s.de").write_text("a\n")
    r = subprocess.run(tool + ["corpus", str(tmp_path / "c"), "en", "de", f"{tmp_path}/s.en:{tmp_path}/s.de"], capture_output=True, text=True)
    assert r.returncode == 2 and "differ in length" in r.stderr and not (tmp_path / "c.en").exists()
    r = subprocess.run(tool + ["sgm", str(tmp_path / "s.en"), str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and "no <seg> lines" in r.stderr and not (tmp_path / "o").exists()
    r = subprocess.run(tool + ["slice", str(tmp_path / "s.en"), str(tmp_path / "o"), "2", "5"], capture_output=True, text=True)
    assert r.returncode == 2 and "has only 2" in r.stderr and not (tmp_path / "o").exists()


ML_ROW = re.compile(r"^([a-z]{2}-[a-z]{2}) +(\d+\.\d\d)  (yes|no) *(?: +(\d+\.\d))?$", re.M)
ML_MEAN = re.compile(r"^mean over the (\d+) (supervised|zero-shot) directions: BLEU (\d+\.\d\d)"
                     r"(?:, off-target (\d+\.\d) %)?$", re.M)
ML_ALL = ["de-en", "en-de", "de-fr", "fr-de", "de-cs", "cs-de", "en-fr", "fr-en", "en-cs", "cs-en", "fr-cs", "cs-fr"]


def _has_langid() -> bool:
    """Whether this interpreter's environment has langid (the recipe installs it when it can)."""
    return subprocess.run([sys.executable, "-c", "import langid"], capture_output=True).returncode == 0


def test_multilingual_smoke(tmp_path):
    """recipes/multilingual.sh --smoke: one model for the 12 directions among de, en, fr, cs;
    validated per direction, every direction translated and scored in one table, no language tag
    in any output; a re-run is up to date. English-centric's table marks the 6 directions without
    English as zero-shot (its score stage, run on the same translations)."""
    data = shared_file("multi30k", "train.cs.gz").parent
    work = tmp_path / "multilingual"
    env = _env(work, NMTKIT_DATA=str(data))
    r = _run(["bash", "recipes/multilingual.sh", "--smoke"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = ML_ROW.findall(r.stdout)
    assert [row[0] for row in rows] == ML_ALL and all(row[2] == "no" for row in rows), r.stdout
    means = ML_MEAN.findall(r.stdout)
    assert [m[:2] for m in means] == [("12", "supervised")], r.stdout  # no zero-shot direction in MODE=all
    assert float(means[0][2]) == pytest.approx(sum(float(row[1]) for row in rows) / 12, abs=0.006)
    if _has_langid():  # the tags choose the output language: every direction mostly in its target's
        assert all(row[3] and float(row[3]) < 50 for row in rows), r.stdout
    else:
        assert all(not row[3] for row in rows) and "off-target column is left out" in r.stderr
    # the log: 300 updates, every direction validated; the printed totals are the log's
    log = [json.loads(line) for line in (work / "checkpoints" / "train_log.jsonl").read_text().splitlines()]
    valid = [rec for rec in log if rec["type"] == "valid"]
    assert valid and all(sorted(rec["directions"]) == sorted(ML_ALL) for rec in valid), valid
    tokens = sum(rec["tgt_tokens"] for rec in log if rec["type"] == "train")
    assert f"trained with 300 updates, {tokens} target tokens" in r.stdout
    _assert_valid_loss_fell(work / "checkpoints", r.stdout)
    # 200 translations per direction, none with a tag; nothing printed has one either
    for d in ML_ALL:
        hyps = _hyps(work / "results" / f"{d}.hyp")
        assert len(hyps) == 200 and sum(1 for h in hyps if h.strip()) >= 100, (d, hyps[:5])
        assert not [h for h in hyps if ">>" in h], d
    table = r.stdout[r.stdout.index("direction    BLEU"):]
    assert not [line for line in table.splitlines() if ">>" in line], table

    r2 = _run(["bash", "recipes/multilingual.sh", "--smoke"], env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stderr.count("up to date") == 6 and "running" not in r2.stderr, r2.stderr
    assert r2.stdout == table

    # MODE=english-centric marks de<->fr, de<->cs, fr<->cs zero-shot and averages them apart
    # (STAGE=score: the table of these translations; the earlier stages are not run)
    r3 = _run(["bash", "recipes/multilingual.sh", "--smoke"], {**env, "MODE": "english-centric", "STAGE": "score"})
    assert r3.returncode == 0, r3.stderr[-3000:]
    rows3 = ML_ROW.findall(r3.stdout)
    assert [(row[0], row[2]) for row in rows3] == [(d, "no") for d in ("de-en", "en-de", "fr-en", "en-fr", "cs-en", "en-cs")] + [
        (d, "yes") for d in ("de-fr", "fr-de", "de-cs", "cs-de", "fr-cs", "cs-fr")], r3.stdout
    assert [m[:2] for m in ML_MEAN.findall(r3.stdout)] == [("6", "supervised"), ("6", "zero-shot")], r3.stdout

    # LANG_VOCAB=1: each target language's vocabulary as the shortlist of the directions into it,
    # into results_langvocab/ and score_langvocab.txt; the plain translations stay as they were
    plain = {d: _hyps(work / "results" / f"{d}.hyp") for d in ML_ALL}
    r4 = _run(["bash", "recipes/multilingual.sh", "--smoke"], {**env, "LANG_VOCAB": "1", "STAGE": "generate"})
    assert r4.returncode == 0, r4.stderr[-3000:]
    assert [row[0] for row in ML_ROW.findall(r4.stdout)] == ML_ALL, r4.stdout
    assert (work / "score_langvocab.txt").read_text() == r4.stdout
    for lang in ("de", "en", "fr", "cs"):
        (line,) = (work / "results_langvocab" / f"shortlist.{lang}.txt").read_text("utf-8").splitlines()
        assert line.startswith("\t") and len(line.split(" ")) > 100, lang  # the always-list alone
    for d in ML_ALL:
        hyps = _hyps(work / "results_langvocab" / f"{d}.hyp")
        assert len(hyps) == 200 and not [h for h in hyps if ">>" in h], d
        assert _hyps(work / "results" / f"{d}.hyp") == plain[d]
    # the shortlists reached the search: some translations changed (the always-lists leave out pieces)
    assert any(_hyps(work / "results_langvocab" / f"{d}.hyp") != plain[d] for d in ML_ALL)

    # MODE=english-centric-bt: a model (this 12-direction one stands in for the English-centric
    # one: EC_WORK) translates the English training text into de, fr, cs; the 6 directions without
    # English train from those synthetic sources to the real targets of the same lines (here
    # with NO_RESIDUAL_LAYER=1 too: the flag reaches the training run)
    bt = tmp_path / "bt"
    env5 = {**_env(bt, NMTKIT_DATA=str(data)), "MODE": "english-centric-bt", "EC_WORK": str(work), "MAX_UPDATE": "20",
            "NO_RESIDUAL_LAYER": "1"}
    r5 = _run(["bash", "recipes/multilingual.sh", "--smoke"], env5)
    assert r5.returncode == 0, r5.stderr[-3000:]
    assert "--encoder-no-residual-layer 1" in (bt / "checkpoints" / "run_settings.txt").read_text()
    import torch

    assert torch.load(bt / "checkpoints" / "checkpoint_last.pt", weights_only=True)["arch_config"][
        "encoder_no_residual_layer"] == 1
    assert f"(trained on sources back-translated by {work}/checkpoints/average_last2.pt)" in r5.stderr
    assert [(row[0], row[2]) for row in ML_ROW.findall(r5.stdout)] == [
        (d, "no") for d in ("de-en", "en-de", "fr-en", "en-fr", "cs-en", "en-cs")] + [
        (d, "yes") for d in ("de-fr", "fr-de", "de-cs", "cs-de", "fr-cs", "cs-fr")], r5.stdout
    manifest = json.loads((bt / "data" / "manifest.json").read_text())
    assert sorted(manifest["multilingual"]["pairs"]) == sorted(ML_ALL)
    real = {lang: _gz_lines(bt / "raw" / f"train.{lang}.gz") for lang in ("de", "en", "fr", "cs")}
    for d in ("de-fr", "fr-de", "de-cs", "cs-de", "fr-cs", "cs-fr"):
        src, tgt = d.split("-")
        synthetic = _gz_lines(bt / "raw" / f"train.{d}.{src}.gz")
        assert _gz_lines(bt / "raw" / f"train.{d}.{tgt}.gz") == real[tgt] and len(synthetic) == 2000
        assert synthetic != real[src] and not [h for h in synthetic if ">>" in h], d
        # what preprocess read: the synthetic source, not the real one
        assert manifest["inputs"][f"train.{d}"][src]["path"] == str(bt / "raw" / f"train.{d}.{src}.gz"), d
    # a re-run is up to date; without the synthetic files, preprocess refuses rather than use the real pairs
    r6 = _run(["bash", "recipes/multilingual.sh", "--smoke"], env5)
    assert r6.returncode == 0 and "backtranslate: up to date" in r6.stderr and "running" not in r6.stderr, r6.stderr
    (bt / "raw" / "train.fr-cs.fr.gz").unlink()
    r7 = _run(["bash", "recipes/multilingual.sh", "--smoke"], {**env5, "STAGE": "preprocess"})
    assert r7.returncode == 2 and r7.stderr.strip().splitlines()[-1] == (
        f"[multilingual] error: {bt}/raw/train.fr-cs.fr.gz is missing: run the backtranslate stage "
        "(STAGE=backtranslate)"), r7.stderr


def _gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return fh.read().splitlines()


def test_multilingual_pair_smoke(tmp_path):
    """MODE=pair: one direction's bilingual baseline through the same pipeline (here fr-de, no
    English): its data directory holds that pair alone, the table one row."""
    data = shared_file("multi30k", "train.cs.gz").parent
    work = tmp_path / "pair"
    r = _run(["bash", "recipes/multilingual.sh", "--smoke"], _env(work, NMTKIT_DATA=str(data), MODE="pair", PAIR="fr-de"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = ML_ROW.findall(r.stdout)
    assert [(row[0], row[2]) for row in rows] == [("fr-de", "no")], r.stdout
    assert [m[:2] for m in ML_MEAN.findall(r.stdout)] == [("1", "supervised")], r.stdout
    manifest = json.loads((work / "data" / "manifest.json").read_text())
    assert manifest["multilingual"]["pairs"] == ["fr-de"] and sorted(manifest["multilingual"]["langs"]) == ["de", "fr"]
    assert sorted(f.name for f in (work / "raw").glob("test.*.gz")) == ["test.de.gz", "test.fr.gz"]
    hyps = _hyps(work / "results" / "fr-de.hyp")
    assert len(hyps) == 200 and not [h for h in hyps if ">>" in h]
    assert "trained with 300 updates" in r.stdout


def _score_txt(rows: dict[str, tuple[float, bool, float]], updates: int, tokens: int) -> str:
    """A score.txt as stage_score writes it (score_table's rows, then trained_with's line)."""
    out = [f"{'direction':<10} {'BLEU':>6}  zero-shot  off-target %"]
    out += [f"{d:<10} {b:6.2f}  {'yes' if z else 'no':<9}  {o:12.1f}" for d, (b, z, o) in rows.items()]
    return "\n".join(out + ["mean over the ...", f"trained with {updates} updates, {tokens} target tokens"]) + "\n"


def test_multilingual_table_puts_the_three_kinds_side_by_side(tmp_path):
    """MODE=table reads the fourteen runs' score.txt (here written by hand, MODEL_SIZE=small's
    folders) and prints BLEU per direction, the means, the budgets and each target's verdict."""
    root = tmp_path / "runs"
    multi = {d: (30.0 + i, False, 1.0) for i, d in enumerate(ML_ALL)}  # mean 35.5
    zs = {"de-fr", "fr-de", "de-cs", "cs-de", "fr-cs", "cs-fr"}
    ec = {d: (18.0 if d in zs else 31.0, d in zs, 4.0 if d != "cs-fr" else 12.5) for d in ML_ALL}
    for name, rows, upd in [("all", multi, 8000), ("english_centric", ec, 8000)]:
        (root / f"multi30k_4way_{name}_small").mkdir(parents=True)
        (root / f"multi30k_4way_{name}_small" / "score.txt").write_text(_score_txt(rows, upd, 10 ** 7))
    env = _env(tmp_path / "unused", MODE="table", MODEL_SIZE="small", RUNS_ROOT=str(root))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 2 and "MODE=table needs every run's score.txt (MODEL_SIZE=small); missing: de-en (" in r.stderr
    assert r.stderr.count(str(root)) == 12 and not r.stdout, r.stderr  # the twelve pairs, each named
    for i, d in enumerate(ML_ALL):  # bilingual: 35.0 each but de-en's 23.0: mean 34.0
        w = root / f"multi30k_4way_pair_{d.replace('-', '_')}_small"
        w.mkdir()
        (w / "score.txt").write_text(_score_txt({d: (23.0 if d == "de-en" else 35.0, False, 0.5)}, 1600, 10 ** 6))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[-4:] == ["off-target", "%", "ZS/12-dir", "ZS/bi"]
    assert lines[1].split() == ["de-en", "30.00", "23.00", "31.00", "no", "4.0"]  # off-target: the English-centric model's
    # a zero-shot row: its BLEU against the 12-direction model's (18 / 32) and the bilingual one's (18 / 35)
    assert lines[3].split() == ["de-fr", "32.00", "35.00", "18.00", "yes", "4.0", "56%", "51%"]
    assert lines[13].split() == ["mean", "35.50", "34.00", "24.50"]
    assert "updates: 12-direction 8000, bilingual 19200 (12 models, 12000000 target tokens), English-centric 8000" in r.stdout
    assert "target: 12-direction mean 35.50 >= bilingual mean 34.00 with at most their updates (8000 <= 19200): met" in r.stdout
    assert "target: zero-shot off-target at most 5%: mean 5.4%, worst 12.5%: not met" in r.stdout
    # the lowest ratio: cs-fr, 18 / 41
    assert "target: zero-shot BLEU at least 60% of the 12-direction model's on the same direction: lowest 44% (cs-fr): " \
           "not met" in r.stdout
    assert "LANG_VOCAB" not in r.stdout
    # with the English-centric model's LANG_VOCAB=1 translations: their zero-shot rows and verdicts too
    lv = {d: (25.0 if d in zs else 31.0, d in zs, 1.5) for d in ML_ALL}
    (root / "multi30k_4way_english_centric_small" / "score_langvocab.txt").write_text(_score_txt(lv, 8000, 10 ** 7))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 0, r.stderr
    assert "de-fr      BLEU  25.00  off-target   1.5 %  ZS/12-dir  78%  ZS/bi  71%" in r.stdout
    label = " (with each target language's vocabulary, LANG_VOCAB=1)"
    assert f"target: zero-shot off-target at most 5%{label}: mean 1.5%, worst 1.5%: met" in r.stdout
    # cs-fr: 25 / 41
    assert f"target: zero-shot BLEU at least 60% of the 12-direction model's on the same direction{label}: lowest " \
           "61% (cs-fr): met" in r.stdout
    # the model trained with the English-centric model's back-translations: its zero-shot rows and verdicts
    bt = {d: (27.0 if d in zs else 31.0, d in zs, 0.5) for d in ML_ALL}
    (root / "multi30k_4way_english_centric_bt_small").mkdir()
    (root / "multi30k_4way_english_centric_bt_small" / "score.txt").write_text(_score_txt(bt, 8000, 10 ** 7))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 0, r.stderr
    assert "English-centric data and back-translated sources (MODE=english-centric-bt), zero-shot directions:\n" \
           "de-fr      BLEU  27.00  off-target   0.5 %  ZS/12-dir  84%  ZS/bi  77%" in r.stdout
    label = " (back-translated sources, MODE=english-centric-bt)"
    assert f"target: zero-shot off-target at most 5%{label}: mean 0.5%, worst 0.5%: met" in r.stdout
    assert f"target: zero-shot BLEU at least 60% of the 12-direction model's on the same direction{label}: lowest " \
           "66% (cs-fr): met" in r.stdout
    (root / "multi30k_4way_english_centric_bt_small" / "score.txt").unlink()
    # a BLEU of 0 (a smoke run's) is no division by zero; a score file without a direction's row is one line
    multi["de-fr"] = (0.0, False, 1.0)
    (root / "multi30k_4way_all_small" / "score.txt").write_text(_score_txt(multi, 8000, 10 ** 7))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 0 and r.stdout.splitlines()[3].split()[-2:] == ["n/a", "51%"], (r.stdout, r.stderr)
    del multi["de-fr"]
    (root / "multi30k_4way_all_small" / "score.txt").write_text(_score_txt(multi, 8000, 10 ** 7))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 2 and "multi30k_4way_all_small/score.txt: no row for de-fr; run its score stage again" in r.stderr
    assert "Traceback" not in r.stderr
    # NO_RESIDUAL_LAYER=2: the English-centric run trained with it, in its own folder, against the same others
    multi["de-fr"] = (32.0, False, 1.0)
    (root / "multi30k_4way_all_small" / "score.txt").write_text(_score_txt(multi, 8000, 10 ** 7))
    env["NO_RESIDUAL_LAYER"] = "2"
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 2 and "multi30k_4way_english_centric_small_nores2/score.txt)" in r.stderr, r.stderr
    (root / "multi30k_4way_english_centric_small_nores2").mkdir()
    nores = {d: (28.0 if d in zs else 30.0, d in zs, 2.0) for d in ML_ALL}
    (root / "multi30k_4way_english_centric_small_nores2" / "score.txt").write_text(_score_txt(nores, 8000, 10 ** 7))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "English-centric: encoder layer 2's self-attention without its residual (NO_RESIDUAL_LAYER=2)"
    assert lines[4].split() == ["de-fr", "32.00", "35.00", "28.00", "yes", "2.0", "88%", "80%"]
    assert "LANG_VOCAB" not in r.stdout  # (the plain run's score_langvocab.txt is not this run's)
    assert "back-translated" not in r.stdout
    # so does the back-translated run: the one made with NO_RESIDUAL_LAYER=2 (in _nores2), not the plain one
    (root / "multi30k_4way_english_centric_bt_small").rmdir()
    (root / "multi30k_4way_english_centric_bt_small_nores2").mkdir()
    (root / "multi30k_4way_english_centric_bt_small_nores2" / "score.txt").write_text(_score_txt(bt, 8000, 10 ** 7))
    r = _run(["bash", "recipes/multilingual.sh"], env)
    assert r.returncode == 0 and "de-fr      BLEU  27.00  off-target   0.5 %" in r.stdout, (r.stdout, r.stderr)
    # the lowest ratio: cs-fr, 28 / 41
    assert "on the same direction: lowest 68% (cs-fr): met" in r.stdout


def test_multilingual_refuses_bad_settings(tmp_path):
    env = _env(tmp_path / "w", SMOKE="1")
    for extra, msg in [({"MODE": "pivot"}, "MODE must be all, english-centric, english-centric-bt, pair or table, "
                                           "got 'pivot'"),
                       ({"MODE": "pair"}, "MODE=pair needs PAIR=SRC-TGT, two different languages of de en fr cs, got ''"),
                       ({"MODE": "pair", "PAIR": "de-de"}, "two different languages of de en fr cs, got 'de-de'"),
                       ({"MODE": "pair", "PAIR": "de-en/../x"}, "two different languages of de en fr cs, got 'de-en/../x'"),
                       ({"PAIR": "de-en"}, "PAIR=de-en needs MODE=pair (MODE is all)"),
                       ({"MODEL_SIZE": "big"}, "MODEL_SIZE must be quickstart or small, got 'big'"),
                       ({"LANG_VOCAB": "yes"}, "LANG_VOCAB must be 0 or 1, got 'yes'"),
                       ({"LANG_VOCAB_MIN_RATIO": "-1"}, "LANG_VOCAB_MIN_RATIO must be a number >= 0, got '-1'"),
                       ({"DECODING": "faiseq"}, "DECODING must be paper or fairseq, got 'faiseq'"),
                       ({"MODE": "english-centric-bt", "EC_WORK": str(tmp_path / "none")},
                        f"MODE=english-centric-bt translates with the English-centric model, but {tmp_path}/none/"
                        "checkpoints/average_last2.pt is missing (run MODE=english-centric with the same MODEL_SIZE "
                        "first, or set EC_WORK; EC_AVG_N=2)"),
                       ({"NO_RESIDUAL_LAYER": "3"}, "NO_RESIDUAL_LAYER=3: the model has 2 encoder layers (--smoke: "
                                                    "transformer_tiny)"),
                       ({"BT_DECODING": "beam"}, "BT_DECODING must be paper or fairseq, got 'beam'"),
                       ({"BT_BEAM": "four"}, "BT_BEAM must be a non-negative integer, got 'four'"),
                       ({"NO_RESIDUAL_LAYER": "0"}, "NO_RESIDUAL_LAYER must be an encoder layer's number (1 = the "
                                                    "first), got '0'"),
                       ({"NO_RESIDUAL_LAYER": "2/../x", "MODE": "table"}, "NO_RESIDUAL_LAYER must be an encoder "
                                                                          "layer's number"),
                       ({"SAVE_INTERVAL_UPDATES": "0"}, "SAVE_INTERVAL_UPDATES must be > 0"),
                       ({"SAVE_INTERVAL_UPDATES": "200"}, "AVG_N=2 checkpoints to average need MAX_UPDATE / "
                                                          "SAVE_INTERVAL_UPDATES >= 2 (300 / 200 saves 1)"),
                       ({"VALIDATE_INTERVAL": "often"}, "VALIDATE_INTERVAL must be a non-negative integer, got 'often'"),
                       ({"STAGE": "translate"}, "STAGE=translate is not a stage; stages: data preprocess train average generate score")]:
        r = _run(["bash", "recipes/multilingual.sh"], {**env, **extra})
        assert r.returncode == 2 and msg in r.stderr, (extra, r.stderr)
    r = _run(["bash", "recipes/multilingual.sh", "--fast"], env)
    assert r.returncode == 2 and "unknown option --fast" in r.stderr
    assert not (tmp_path / "w").exists()  # refused before writing anything


DISTILL_ROW = re.compile(r"^  (teacher|student \(transformer_tiny\)) +(fp32|int8|int8\+sl) +(\d+\.\d\d) +([\d.]+) +([\d.]+)$", re.M)


def test_distill_smoke(tmp_path, quickstart_smoke):
    """recipes/distill.sh --smoke: the quickstart's smoke model as teacher translates its training
    source; a student trains on those translations with the teacher's vocabulary; teacher and
    student, fp32 and int8, are scored and timed at batch 1 and 128; a rerun is up to date."""
    data = shared_file("multi30k", "train.de.gz").parent
    qs, qr = quickstart_smoke
    assert qr.returncode == 0, qr.stderr[-3000:]
    work = tmp_path / "distill"
    env = _env(work, NMTKIT_DATA=str(data), QUICKSTART_WORK=str(qs))
    r = _run(["bash", "recipes/distill.sh", "--smoke"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = DISTILL_ROW.findall(r.stdout)
    assert [(w.split(" ")[0], q) for w, q, *_ in rows] == [
        ("teacher", "fp32"), ("teacher", "int8"), ("teacher", "int8+sl"),
        ("student", "fp32"), ("student", "int8"), ("student", "int8+sl")], r.stdout
    assert all(float(b1) > 0 and float(b128) > 0 for *_, b1, b128 in rows), rows
    # the student learned from the teacher's translations: its training targets are them, line for line
    distilled = _hyps(work / "raw" / "distilled.en")
    assert len(distilled) == len(_lines(qs / "raw" / "train.de.gz")) == 2000
    assert _hyps(work / "raw" / "train.en") == distilled
    teacher_hyp = _hyps(work / "results" / "teacher.fp32.b128.hyp")
    assert len(teacher_hyp) == 50 and sum(1 for h in teacher_hyp if h.strip()) >= 25
    # the student reads and writes the teacher's pieces: the same dictionaries
    from nmtkit import checkpoints as ck

    teacher = ck.load_checkpoint(qs / "checkpoints" / "average_last2.pt")
    student = ck.load_checkpoint(work / "checkpoints" / "average_last2.pt")
    assert student["dictionaries"] == teacher["dictionaries"] and student["arch"] == "transformer_tiny"
    r2 = _run(["bash", "recipes/distill.sh", "--smoke"], env)
    assert r2.returncode == 0 and r2.stderr.count("up to date") == 8, r2.stderr[-3000:]
    assert (work / "shortlist.txt").read_text(encoding="utf-8").startswith("\t")  # the always-list first
    assert DISTILL_ROW.findall(r2.stdout) == rows
    # the deploy bench's command, as printed for this teacher and student, runs: nmtkit int8 and the
    # shortlist routes of the three engines (each export made with the shortlist), one cell
    cmd = [line.split("size on disk: ", 1)[1] for line in r2.stderr.splitlines() if "recipes/bench/deploy.sh" in line]
    assert len(cmd) == 1 and f"--model student {work / 'checkpoints' / 'average_last2.pt'}" in cmd[0], r2.stderr[-2000:]
    pytest.importorskip("ctranslate2", reason="the deploy bench runs CTranslate2 (the ctranslate2 extra)")
    pytest.importorskip("onnxruntime", reason="the deploy bench runs ONNX Runtime (the onnx extra)")
    bench = tmp_path / "deploy"
    r3 = _run(["bash", "-c", cmd[0]], dict(env, SYSTEMS="nmtkit-int8,nmtkit-int8-sl,ct2-int8-vmap,onnx-int8-sl", CELLS="1x16",
                                         BENCH_DIR=str(bench)))
    assert r3.returncode == 0, r3.stderr[-3000:] + r3.stdout[-3000:]
    table = [line for line in r3.stdout.splitlines() if line.startswith(("| teacher |", "| student |"))]
    assert [line.split(" | ")[:2] for line in table] == [
        [f"| {who}", route] for who in ("teacher", "student")
        for route in ("nmtkit int8", "nmtkit int8 + shortlist", "CTranslate2 int8_float32 + vmap",
                      "ONNX int8 + shortlist")]
    assert "(50 sentences)" in r3.stdout  # the recipe's TEST_LINES
    targets = [line for line in r3.stdout.splitlines() if line.startswith("- ")]
    assert targets[0].startswith("- student / teacher, batch 16 (1 thread(s)), the fastest int8 route of each "
                                 "(nmtkit int8, nmtkit int8): "), r3.stdout
    assert sum(line.startswith(f"- {who}, batch 16 (1 thread(s)): nmtkit int8 + shortlist / nmtkit int8 = ")
               for line in targets for who in ("teacher", "student")) == 2, r3.stdout
