"""Treebank -> parallel text for parsing as translation: `PREFIX.words`, `PREFIX.lin`, `PREFIX.gold.trees`.

Why a separate step that writes plain text: after it, parsing is an ordinary translation task.
`nmtkit preprocess` reads `PREFIX.words` as the source language `words` and `PREFIX.lin` as the
target language `lin` like any other parallel corpus, and `nmtkit score --metric parseval --ref
PREFIX.gold.trees` scores what `nmtkit generate` writes. Three line-parallel files per split:

- `PREFIX.words`      the sentence: the tree's words, space-separated (PTB tokens, `-LRB-` etc.);
- `PREFIX.lin`        the linearized tree (nmtkit.parsing.linearize), in the chosen POS mode;
- `PREFIX.gold.trees` the normalized tree, one per line, `(TOP ...)` root: the root convention
                      that COLLINS.prm deletes, the same one generate's output uses.

Every tree is normalized (nmtkit.parsing.treebank.normalize_tree) and checked to round-trip
(`delinearize(linearize(t)) == t`, tags masked in `xx` mode), so a perfect model output scores
100. Trees with no words left after normalization (only `-NONE-` elements) are dropped from all
three files and counted.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from nmtkit.errors import UserError
from nmtkit.io import atomic_write
from nmtkit.parsing.linearize import check_pos_mode, delinearize, linearize, mask_tags
from nmtkit.parsing.treebank import read_documents, split_documents, normalize_tree
from nmtkit.parsing.trees import Tree, TreeError

SOURCE_SUFFIX = "words"  # the source "language" for nmtkit preprocess
TARGET_SUFFIX = "lin"  # the target "language"
GOLD_SUFFIX = "gold.trees"


@dataclass
class SplitStats:
    """What `write_split` wrote (and dropped) for one split."""

    split: str
    prefix: str
    trees: int = 0  # trees read
    sentences: int = 0  # lines written to each of the three files
    dropped_empty: int = 0  # trees with no word left after normalization
    words: int = 0
    target_tokens: int = 0
    max_words: int = 0
    max_target_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_paths(prefix: str | os.PathLike) -> dict[str, Path]:
    """The three files of a split: {'words': ..., 'lin': ..., 'gold': ...}."""
    p = str(prefix)
    return {
        SOURCE_SUFFIX: Path(f"{p}.{SOURCE_SUFFIX}"),
        TARGET_SUFFIX: Path(f"{p}.{TARGET_SUFFIX}"),
        "gold": Path(f"{p}.{GOLD_SUFFIX}"),
    }


def write_split(trees: Iterable[Tree], prefix: str | os.PathLike, pos: str = "keep", split: str = "") -> SplitStats:
    """Normalize, linearize and write one split's three files (atomically; all three or none).

    `trees` are raw treebank trees. Raises UserError naming the split and the tree's ordinal if
    a tree cannot be linearized exactly (e.g. a word directly under a phrase label).
    """
    check_pos_mode(pos)
    stats = SplitStats(split=split, prefix=str(prefix))
    paths = split_paths(prefix)
    with contextlib.ExitStack() as stack:
        # All three temporary files are renamed into place only after every line was written.
        fw = stack.enter_context(atomic_write(paths[SOURCE_SUFFIX]))
        fl = stack.enter_context(atomic_write(paths[TARGET_SUFFIX]))
        fg = stack.enter_context(atomic_write(paths["gold"]))
        for i, raw in enumerate(trees, start=1):
            stats.trees += 1
            tree = normalize_tree(raw)
            if tree is None:
                stats.dropped_empty += 1
                continue
            try:
                words, seq = linearize(tree, pos)
                back = delinearize(seq, words, pos)
            except TreeError as e:
                raise UserError(f"{split or prefix}: tree {i}: cannot linearize it: {e}") from None
            expect = tree if pos == "keep" else mask_tags(tree)
            if back.to_string() != expect.to_string():  # pragma: no cover - guarded by tests
                raise UserError(f"{split or prefix}: tree {i}: linearization does not round-trip: {tree}")
            fw.write(" ".join(words) + "\n")
            fl.write(" ".join(seq) + "\n")
            fg.write(tree.to_string() + "\n")
            stats.sentences += 1
            stats.words += len(words)
            stats.target_tokens += len(seq)
            stats.max_words = max(stats.max_words, len(words))
            stats.max_target_tokens = max(stats.max_target_tokens, len(seq))
    return stats


def prepare_splits(
    splits: Mapping[str, Iterable[Tree]], out_dir: str | os.PathLike, pos: str = "keep"
) -> dict[str, SplitStats]:
    """`write_split` for each split into `out_dir/SPLIT.{words,lin,gold.trees}`."""
    check_pos_mode(pos)
    out = Path(out_dir)
    return {name: write_split(trees, out / name, pos, split=name) for name, trees in splits.items()}


def prepare_treebank(
    treebank: str | os.PathLike, out_dir: str | os.PathLike, scheme: str, pos: str = "keep"
) -> dict[str, SplitStats]:
    """A whole treebank (LDC wsj folder, NLTK zip, ...) split by `scheme` (`ptb` or `sample`)
    into `out_dir/{train,valid,test}.{words,lin,gold.trees}`."""
    check_pos_mode(pos)
    return prepare_splits(split_documents(read_documents(treebank), scheme), out_dir, pos)
