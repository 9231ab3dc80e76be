"""`nmtkit plot`: a PNG from a train log (redone updates of a resumed run dropped); clear errors."""

from __future__ import annotations

import json
import sys

from nmtkit.training.report import read_log


def write_log(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"type": "tr')  # + a torn last line


def test_read_log_drops_updates_redone_after_resume(tmp_path):
    write_log(tmp_path / "train_log.jsonl", [
        {"type": "start", "update": 0, "resumed": False},
        {"type": "train", "update": 1, "loss": 5.0},
        {"type": "train", "update": 2, "loss": 4.0},
        {"type": "train", "update": 3, "loss": 3.9},  # lost: the run died before saving update 3
        {"type": "start", "update": 2, "resumed": True},
        {"type": "train", "update": 3, "loss": 3.5},
    ])
    recs = read_log(tmp_path / "train_log.jsonl")
    assert [(r["type"], r["update"], r.get("loss")) for r in recs if r["type"] == "train"] == [
        ("train", 1, 5.0), ("train", 2, 4.0), ("train", 3, 3.5)]


def test_plot_cli(tmp_path, run_cli, monkeypatch):
    write_log(tmp_path / "train_log.jsonl", [
        {"type": "train", "update": u, "loss": 6 - u / 10, "nll_loss": 5 - u / 10, "ppl": 2 ** (5 - u / 10),
         "lr": 1e-4 * u, "tgt_tok_per_s": 1000.0} for u in range(1, 11)
    ] + [{"type": "valid", "update": 10, "nll_loss": 4.2, "ppl": 2 ** 4.2, "bleu": 12.5}])
    r = run_cli("plot", tmp_path, "--output", tmp_path / "c.png")
    assert r.code == 0, r
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    r = run_cli("plot", tmp_path / "missing")
    assert r.code == 2 and "no training log" in r.err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    r = run_cli("plot", tmp_path)
    assert r.code == 2 and "pip install -e '.[plot]' in the nmtkit checkout" in r.err
