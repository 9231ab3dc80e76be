"""Reading treebanks: `.mrg` files, folders of them, the NLTK zip, and the standard WSJ splits.

Why a module of its own: the parsing task needs trees grouped by *document* (the Penn Treebank
split is defined by WSJ section, i.e. by file), read from several layouts people actually have:

- the LDC Treebank-3 folder `parsed/mrg/wsj` (sections `00` ... `24`, files `wsj_SSNN.mrg`),
- NLTK's `treebank.zip` (`treebank/combined/wsj_0001.mrg` ... `wsj_0199.mrg`), read in place with
  `zipfile` (nothing is extracted),
- a single file holding trees either pretty-printed over several lines (`.mrg`) or one per line
  (`PREFIX.trees`), plain or `.gz`.

All of them go through `nmtkit.parsing.trees.split_trees` + `Tree.parse`, the same reader the
parseval scorer uses, so a tree read here is the tree the scorer would see.

`normalize_tree` is the standard setup for PTB parsing (as in Collins 1997 and every EVALB-scored
paper since): function tags and co-indices removed (`NP-SBJ-1` -> `NP`), `-NONE-` empty elements
removed with every constituent they leave empty, the empty root wrapper `( (S ...) )` replaced by
the `(TOP ...)` root that EVALB's COLLINS.prm deletes (see ../shared/data/ptb/PROVENANCE.md: gold
and system trees must share one root convention, and `(TOP ...)` is the one that is not counted).
"""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from nmtkit.errors import UserError
from nmtkit.io import read_lines
from nmtkit.parsing.trees import Tree, TreeError, remove_empty, split_trees, strip_function_tags

# Root labels that are wrappers rather than constituents: PTB's unlabeled `( ... )`, and the
# `(TOP ...)` / `(ROOT ...)` that other tools write.
ROOT_LABELS = ("", "TOP", "ROOT")
# The root label of every normalized tree (deleted by COLLINS.prm, so never scored).
TOP = "TOP"
# File names of WSJ documents: wsj_SSNN(.mrg), SS = section, NN = document within the section.
_WSJ_NAME = re.compile(r"(?:^|/)wsj_(\d{4})\.mrg(?:\.gz)?$")
# LDC banner lines (`*x*  ...  *x*`) that head some Treebank-3 .mrg files; never part of a tree.
_BANNER = "*x*"


# ------------------------------------------------------------------------------------ splits


@dataclass(frozen=True)
class SplitScheme:
    """Which WSJ documents go to train/valid/test, by document number (`wsj_0123` -> 123)."""

    name: str
    ranges: tuple[tuple[str, int, int], ...]  # (split, first document number, last), inclusive
    description: str

    def split_of(self, number: int) -> str | None:
        """The split a document belongs to, or None when the scheme leaves it out."""
        for split, lo, hi in self.ranges:
            if lo <= number <= hi:
                return split
        return None


SPLIT_SCHEMES: dict[str, SplitScheme] = {
    # The standard split (Collins 1997 onwards; the paper's WSJ-only setting): sections 02-21 train,
    # 22 dev, 23 test. Sections 00, 01 and 24 are not used. wsj_SSNN has number SS*100 + NN.
    "ptb": SplitScheme(
        "ptb",
        (("train", 200, 2199), ("valid", 2200, 2299), ("test", 2300, 2399)),
        "WSJ sections 02-21 train, 22 valid, 23 test (00, 01, 24 unused)",
    ),
    # The NLTK 10% sample holds only wsj_0001..wsj_0199 (sections 00 and 01); this is our documented
    # small-data split of it by document.
    "sample": SplitScheme(
        "sample",
        (("train", 1, 179), ("valid", 180, 189), ("test", 190, 199)),
        "NLTK sample: wsj_0001-0179 train, wsj_0180-0189 valid, wsj_0190-0199 test",
    ),
}
SPLITS = ("train", "valid", "test")


def get_split_scheme(name: str) -> SplitScheme:
    """Look a scheme up by name; UserError listing the known ones on a typo."""
    try:
        return SPLIT_SCHEMES[name]
    except KeyError:
        raise UserError(f"unknown treebank split {name!r}; known: {', '.join(SPLIT_SCHEMES)}") from None


# --------------------------------------------------------------------------------- documents


@dataclass
class Document:
    """The trees of one treebank file, in file order (raw: not normalized)."""

    name: str  # where it came from: a path, or `zipfile.zip:member`
    number: int | None  # WSJ document number (wsj_0123 -> 123), None if the name is not wsj_NNNN
    trees: list[Tree]

    @property
    def section(self) -> int | None:
        """WSJ section (wsj_2301 -> 23)."""
        return None if self.number is None else self.number // 100


def wsj_number(name: str) -> int | None:
    """`.../wsj_0123.mrg` -> 123; None for any other file name."""
    m = _WSJ_NAME.search(name.replace(os.sep, "/"))
    return int(m.group(1)) if m else None


def parse_treebank_text(lines: Iterable[str], name: str) -> list[Tree]:
    """Trees of one treebank text: multi-line `.mrg` or one tree per line (both are brackets).

    LDC banner lines starting with `*x*` are skipped. A malformed tree raises UserError naming
    `name` and the line (for the splitter) or the tree's ordinal (for the tree reader).
    """
    kept = (line for line in lines if not line.lstrip().startswith(_BANNER))
    trees: list[Tree] = []
    try:
        for i, text in enumerate(split_trees(kept), start=1):
            try:
                trees.append(Tree.parse(text))
            except TreeError as e:  # pragma: no cover - split_trees only yields balanced text
                raise UserError(f"{name}: tree {i}: {e}") from None
    except TreeError as e:
        raise UserError(f"{name}: not a treebank file: {e}") from None
    return trees


def iter_treebank_file(path: str | os.PathLike) -> Iterator[Tree]:
    """The trees of one file (plain or .gz; multi-line `.mrg` or one tree per line), one at a
    time: memory stays flat for a silver corpus of millions of trees. Errors as
    `parse_treebank_text` (the file and line named)."""
    name = str(path)
    kept = (line for line in read_lines(path) if not line.lstrip().startswith(_BANNER))
    try:
        for text in split_trees(kept):
            yield Tree.parse(text)
    except TreeError as e:
        raise UserError(f"{name}: not a treebank file: {e}") from None


def read_treebank_file(path: str | os.PathLike) -> list[Tree]:
    """All trees of one file (plain or .gz; `.mrg` multi-line or one tree per line)."""
    return parse_treebank_text(read_lines(path), str(path))


def _zip_documents(path: Path) -> list[Document]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise UserError(f"{path}: cannot read zip file: {e}") from None
    docs: list[Document] = []
    with zf:
        members = sorted(n for n in zf.namelist() if n.endswith(".mrg") and not n.endswith("/"))
        if not members:
            raise UserError(f"{path}: the zip file holds no .mrg files")
        for member in members:
            name = f"{path}:{member}"
            try:
                text = zf.read(member).decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{name}: invalid UTF-8 at byte {e.start}") from None
            except (zipfile.BadZipFile, OSError) as e:
                raise UserError(f"{name}: cannot read: {e}") from None
            # lines end at \n only, as in read_lines: str.splitlines also breaks at NEL, U+2028 and
            # other characters a word may hold
            docs.append(Document(name, wsj_number(member), parse_treebank_text(text.split("\n"), name)))
    return docs


def read_documents(path: str | os.PathLike) -> list[Document]:
    """Read a treebank as documents, sorted by name so that the order never depends on the disk.

    `path` may be a folder (every `*.mrg` / `*.mrg.gz` below it, recursively: the LDC
    `parsed/mrg/wsj` folder with its section subfolders works as is), a `.zip` (its `.mrg`
    members, e.g. NLTK's treebank.zip), or a single file (one document).
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(
            (f for f in p.rglob("*") if f.is_file() and (f.name.endswith(".mrg") or f.name.endswith(".mrg.gz"))),
            key=lambda f: f.relative_to(p).as_posix(),
        )
        if not files:
            raise UserError(f"{p}: no .mrg files in this folder (expected e.g. the LDC parsed/mrg/wsj folder)")
        return [Document(str(f), wsj_number(f.name), read_treebank_file(f)) for f in files]
    if not p.exists():
        raise UserError(f"file not found: {p}")
    if p.suffix == ".zip":
        return _zip_documents(p)
    return [Document(str(p), wsj_number(p.name), read_treebank_file(p))]


def load_treebank(path: str | os.PathLike) -> list[Tree]:
    """Every raw tree of a folder, zip or file, in document order."""
    return [t for d in read_documents(path) for t in d.trees]


def split_documents(docs: Iterable[Document], scheme: str | SplitScheme) -> dict[str, list[Tree]]:
    """Raw trees per split (`train`, `valid`, `test`) chosen by WSJ document number.

    Documents the scheme leaves out (PTB sections 00, 01, 24) are dropped. A document whose name
    is not `wsj_NNNN.mrg` cannot be placed and raises UserError, as does a split left empty (a
    folder that is not the whole treebank, or the wrong scheme for it).
    """
    sch = get_split_scheme(scheme) if isinstance(scheme, str) else scheme
    out: dict[str, list[Tree]] = {s: [] for s in SPLITS}
    for doc in docs:
        if doc.number is None:
            raise UserError(
                f"{doc.name}: cannot assign it to a split: the '{sch.name}' split needs WSJ file names wsj_SSNN.mrg"
            )
        split = sch.split_of(doc.number)
        if split is not None:
            out[split].extend(doc.trees)
    empty = [s for s in SPLITS if not out[s]]
    if empty:
        raise UserError(
            f"treebank split '{sch.name}' ({sch.description}): no documents for {', '.join(empty)}; "
            f"is this the right folder and split?"
        )
    return out


# ------------------------------------------------------------------------------ normalization


def normalize_tree(tree: Tree) -> Tree | None:
    """The standard PTB normalization; returns `(TOP ...)` or None when no word is left.

    1. function tags and co-indices are cut from constituent labels (`NP-SBJ-1` -> `NP`,
       `PP-LOC=2` -> `PP`); part-of-speech tags are kept as they are (`-LRB-`, `PRP$`, `-NONE-`);
    2. `-NONE-` empty elements are removed, then every constituent left without words;
    3. the root wrapper (unlabeled `( ... )`, `TOP` or `ROOT`) becomes `TOP`; a tree without a
       wrapper gets one: `(S ...)` -> `(TOP (S ...))`.

    The input tree is not changed.
    """
    cleaned = remove_empty(strip_function_tags(tree))
    if cleaned is None:
        return None
    if cleaned.label in ROOT_LABELS:
        return Tree(TOP, cleaned.children)
    return Tree(TOP, [cleaned])
