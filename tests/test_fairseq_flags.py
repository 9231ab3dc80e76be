"""fairseq's flags (nmtkit.cli.fairseq_flags, docs/fairseq.md): an unknown option that is fairseq's
name for something is refused with one line naming the nmtkit way; any other unknown option keeps
click's message; and neither the hints nor the doc's table name an nmtkit flag that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nmtkit.cli.fairseq_flags import HINTS, hint

DOC = Path(__file__).resolve().parents[1] / "docs" / "fairseq.md"
COMMANDS = ("preprocess", "train", "average-checkpoints", "generate", "serve", "score", "archs")

# A flag (`--max-len-a`, `-s`), not part of a word (`tok-bleu`) or of torchrun's `--nproc_per_node`;
# `nmtkit CMD` switches the command the following flags belong to, `torchrun` to none.
_TOKEN = re.compile(r"\bnmtkit ([a-z][a-z-]*[a-z])|\b(torchrun)\b|(?<![\w-])(--?[a-z][a-z0-9-]*)(?!\w)")

# sacrebleu's spellings that nmtkit's parser reads as other flags (`-lc` = `-l c`): in the doc's
# table with the nmtkit way, but no "No such option" to hint at.
READ_AS_OTHER_FLAGS = {"score": {"-lc", "-tok"}}


def named_flags(text: str, command: str | None) -> list[tuple[str, str]]:
    """(command, flag) for every flag in `text`; a flag belongs to `command` unless an earlier
    `nmtkit OTHER` in the text names another command (`torchrun ...`: to none, not checked)."""
    out = []
    for m in _TOKEN.finditer(text):
        name, torchrun, flag = m.groups()
        if name is not None and name in COMMANDS:
            command = name
        elif torchrun is not None:
            command = None
        elif flag is not None and command is not None:
            out.append((command, flag))
    return out


_HELP: dict[str, set[str]] = {}


def help_flags(run_cli, command: str) -> set[str]:
    """Every flag `nmtkit COMMAND --help` lists in its options (aliases and off switches included)."""
    if command not in _HELP:
        r = run_cli(command, "--help")
        assert r.code == 0, r
        decls = re.findall(r"^  (-\S.*?)(?:\s{2,}|$)", r.out, flags=re.MULTILINE)
        _HELP[command] = {f for d in decls for _, f in named_flags(d, command)}
        assert "--help" in _HELP[command] and len(_HELP[command]) > 5, r.out
    return _HELP[command]


def doc_rows() -> list[tuple[str, str, str]]:
    """(command, fairseq cell, nmtkit cell) of every table row under a `## `nmtkit CMD`` heading."""
    rows, command = [], None
    lines = DOC.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        heading = re.match(r"## `nmtkit ([a-z-]+)`", line)
        if heading:
            command = heading.group(1)
            continue
        if command is None or not line.startswith("|") or re.match(r"\|\s*-", line):
            continue
        if i + 1 < len(lines) and re.match(r"\|\s*-", lines[i + 1]):  # a header row
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append((command, cells[0], cells[1]))
    return rows


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


# ---------------------------------------------------------------------------------------------
# the messages


@pytest.mark.parametrize("args, message", [
    (["generate", "data-bin", "--path", "avg.pt", "--remove-bpe"],
     "--remove-bpe: nmtkit removes subwords itself; drop it"),
    (["generate", "data-bin", "--path", "avg.pt", "--remove-bpe=sentencepiece"],
     "--remove-bpe: nmtkit removes subwords itself; drop it"),
    (["generate", "data-bin", "--max-sentences", "64"], "--max-sentences: use --batch-size"),
    (["serve", "data-bin", "-s", "de", "-t", "en"],
     "-s: nmtkit serve takes the language pair from DATA_DIR (or the export directory); drop it "
     '(a multilingual model\'s target is each request\'s "target_lang")'),
    (["generate", "data-bin", "--sacrebleu"],
     "--sacrebleu: nmtkit generate prints translations; score them with nmtkit score --ref REF (sacreBLEU)"),
    (["generate", "--cpu"], "--cpu: use --device cpu"),
    (["generate", "--sampling", "--sampling-topp", "0.9"], "--sampling-topp: use --topp"),
    (["generate", "--unkpen", "1"], "--unkpen: use --unk-penalty"),
    (["generate", "--results-path", "out"],
     "--results-path: use --output FILE (--format fairseq for fairseq's S-/H-/D-/P- lines)"),
    (["train", "data-bin", "--save-dir", "ckpt", "--fp16"], "--fp16: use --precision fp16"),
    (["train", "data-bin", "-a", "transformer_wmt_en_de"], "-a: use --arch (nmtkit archs lists the names)"),
    (["train", "--share-all-embeddings"], "--share-all-embeddings: use --share-embeddings all"),
    (["train", "--optimizer", "adam"],
     "--optimizer: nmtkit always trains with Adam (--adam-betas, --adam-eps; AdamW with --weight-decay); drop it"),
    (["train", "--criterion", "label_smoothed_cross_entropy"],
     "--criterion: nmtkit always trains with label-smoothed cross-entropy (--label-smoothing EPS, 0 = none); drop it"),
    (["train", "--encoder-embed-dim", "512"], "--encoder-embed-dim: use --d-model (one width for encoder and decoder)"),
    (["train", "--keep-interval-updates", "20"], "--keep-interval-updates: use --keep-last-updates"),
    (["preprocess", "-s", "de", "-t", "en", "--padding-factor", "8"], "--padding-factor: use --pad-to-multiple"),
    (["preprocess", "--dataset-impl", "mmap"], "--dataset-impl: nmtkit writes its own memory-mapped shards; drop it"),
    (["score", "--sys", "hyp", "--ref", "ref", "--sacrebleu"],
     "--sacrebleu: sacreBLEU is nmtkit score's default (--metric bleu); drop it"),
    (["score", "--ignore-case"], "--ignore-case: use --lowercase"),
    (["score", "-i", "hyp"], "-i: use --sys FILE (default: stdin)"),
    (["serve", "--max-tokens", "4096"], "--max-tokens: use --max-batch-tokens"),
    (["serve", "--remove-bpe"], "--remove-bpe: nmtkit removes subwords itself; drop it"),
    (["serve", "--input", "-"],
     "--input: nmtkit serve translates what POST /translate sends; for a file use nmtkit generate --input FILE"),
    (["average-checkpoints", "--checkpoint-upper-bound", "30"],
     "--checkpoint-upper-bound: not supported; give the checkpoint files to average as arguments"),
])
def test_a_fairseq_flag_gets_one_line_naming_the_nmtkit_way(run_cli, args, message):
    r = run_cli(*args)
    assert (r.code, r.out, r.err) == (2, "", f"nmtkit: error: {message}\n"), r


def test_other_unknown_flags_keep_click_s_message(run_cli):
    r = run_cli("generate", "--zzz")  # click would suggest a flag spelled close to it
    assert (r.code, r.err) == (2, "nmtkit: error: No such option: --zzz (see 'nmtkit generate --help')\n")
    # fairseq's flag for another command: this command's usual message
    r = run_cli("score", "--remove-bpe")
    assert (r.code, r.err) == (2, "nmtkit: error: No such option: --remove-bpe (see 'nmtkit score --help')\n")
    r = run_cli("--remove-bpe")  # before any command
    assert (r.code, r.err) == (2, "nmtkit: error: No such option: --remove-bpe\n")
    assert hint("generate", "--no-such-flag") is None and hint("generate", "-s") is None and hint("no-such-command", "--remove-bpe") is None


def test_a_fairseq_flag_nmtkit_spells_the_same_is_no_error(run_cli):
    """`--beam` is both fairseq's and nmtkit's: parsed as usual (here refused for the missing --path)."""
    r = run_cli("generate", "data-bin", "--beam", "5")
    assert r.code == 2 and "--path" in r.err and "fairseq" not in r.err


# ---------------------------------------------------------------------------------------------
# the hints and the doc against the real flags


@pytest.mark.parametrize("command", sorted(HINTS))
def test_hints_are_for_missing_flags_and_name_existing_ones(run_cli, command):
    own = help_flags(run_cli, command)
    for flag, text in HINTS[command].items():
        assert flag not in own, f"nmtkit {command} has {flag}: its hint would never show"
        for cmd, named in named_flags(text, command):
            assert named in help_flags(run_cli, cmd), \
                f"{command} {flag}: hint names {named}, not a flag of nmtkit {cmd}"


def test_every_nmtkit_flag_in_the_doc_exists(run_cli):
    rows = doc_rows()
    assert {c for c, _, _ in rows} == set(HINTS)  # a section per command with hints
    checked = 0
    for command, fairseq, nmtkit in rows:
        for span in spans(nmtkit):
            for cmd, flag in named_flags(span, command):
                assert flag in help_flags(run_cli, cmd), \
                    f"docs/fairseq.md, {command}: {fairseq} -> {flag}, not a flag of nmtkit {cmd}"
                checked += 1
    assert checked > 100


def test_the_doc_lists_every_hint_and_only_flags_nmtkit_has_or_hints(run_cli):
    listed: dict[str, set[str]] = {}
    for command, fairseq, _ in doc_rows():
        for span in spans(fairseq):
            listed.setdefault(command, set()).update(f for _, f in named_flags(span, command))
    for command, hints in HINTS.items():
        missing = set(hints) - listed[command]
        assert not missing, f"docs/fairseq.md's nmtkit {command} table lacks {sorted(missing)}"
        unknown = listed[command] - help_flags(run_cli, command) - set(hints)
        unknown -= READ_AS_OTHER_FLAGS.get(command, set())
        assert not unknown, f"docs/fairseq.md's nmtkit {command} table: {sorted(unknown)} neither exist nor have a hint"
