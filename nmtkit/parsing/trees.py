"""Constituency trees: a small `Tree` type, a reader for bracketed trees, and normalizers.

Why a module of our own: scoring (parseval), parsing-as-translation (linearization, repair) and
the parsing preprocessing all need the same notion of a tree, read the same way as EVALB reads it,
so that a tree that one module writes is a tree that the scorer sees identically.

The bracket syntax follows EVALB's reader (evalb.c `read_line`):

- `(` is followed *immediately* by the label; `( (S ...) )` and `((S ...))` therefore have an
  empty root label `""` (the Penn Treebank's unlabeled outer bracket). `(TOP ...)` is an ordinary
  label.
- A word is any run of characters other than ASCII whitespace and parentheses; Penn Treebank
  escapes brackets inside text as `-LRB-` / `-RRB-`.
- A preterminal is a node with exactly one child that is a word: `(NN dog)`.

Deep trees are handled without recursion, so a degenerate model output (hundreds of nested
brackets) cannot hit Python's recursion limit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Union

from nmtkit.errors import UserError
from nmtkit.io import read_lines

# ASCII whitespace only: EVALB (C `isspace` on bytes) and Moses/PTB files never treat U+00A0 and
# friends as separators, so neither do we.
_WS = " \t\n\r\f\v"
# "(" with the label glued to it (possibly empty), ")", or a word. [^\s()] under re.ASCII = not
# ASCII whitespace and not a parenthesis.
_TOKENS = re.compile(r"(?P<open>\((?P<label>[^\s()]*))|(?P<close>\))|(?P<word>[^\s()]+)", re.ASCII)

Child = Union["Tree", str]


class TreeError(ValueError):
    """A bracketed string that is not a well-formed tree (unbalanced, stray words, ...)."""


@dataclass
class Tree:
    """A labeled ordered tree. `children` holds sub-trees and words (leaves, plain `str`)."""

    label: str
    children: list[Child] = field(default_factory=list)

    # ----------------------------------------------------------------------------- inspection
    def is_preterminal(self) -> bool:
        """True for `(TAG word)`: exactly one child, and it is a word."""
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def subtrees(self) -> Iterator["Tree"]:
        """All nodes (self included) in pre-order, i.e. in the order their `(` appears."""
        stack: list[Tree] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(c for c in reversed(node.children) if isinstance(c, Tree))

    def leaves(self) -> list[str]:
        """The words, left to right."""
        out: list[str] = []
        stack: list[Child] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                out.append(node)
            else:
                stack.extend(reversed(node.children))
        return out

    def preterminals(self) -> list[tuple[str, str]]:
        """`(tag, word)` pairs of the preterminals, left to right."""
        return [(t.label, t.children[0]) for t in self.subtrees() if t.is_preterminal()]  # type: ignore[misc]

    def height(self) -> int:
        """Number of nodes on the longest root-to-word path (a preterminal has height 2)."""
        best = 0
        stack: list[tuple[Child, int]] = [(self, 1)]
        while stack:
            node, depth = stack.pop()
            if isinstance(node, str):
                best = max(best, depth)
            else:
                best = max(best, depth)
                stack.extend((c, depth + 1) for c in node.children)
        return best

    # ----------------------------------------------------------------------------- output
    def to_string(self) -> str:
        """One-line bracketed form `(S (NP (DT the) (NN dog)) ...)`; `Tree.parse` reads it back."""
        tokens: list[str] = []
        # Each stack item is a node to open, a word, or None meaning "close one bracket".
        stack: list[Child | None] = [self]
        while stack:
            node = stack.pop()
            if node is None:
                tokens.append(")")
            elif isinstance(node, str):
                tokens.append(node)
            else:
                tokens.append("(" + node.label)
                stack.append(None)
                stack.extend(reversed(node.children))
        out: list[str] = []
        for i, tok in enumerate(tokens):
            if i and tok != ")":
                out.append(" ")
            out.append(tok)
        return "".join(out)

    __str__ = to_string

    def __repr__(self) -> str:
        """`Tree(label='S', children=[...])`, as the dataclass writes it, built without recursion."""
        parts: list[str] = []
        # Each stack item is a node, a word, or a 1-tuple holding text to write as it is.
        stack: list[Child | tuple[str]] = [self]
        while stack:
            item = stack.pop()
            if isinstance(item, tuple):
                parts.append(item[0])
            elif isinstance(item, str):
                parts.append(repr(item))
            else:
                parts.append(f"Tree(label={item.label!r}, children=[")
                stack.append(("])",))
                for i, c in enumerate(reversed(item.children)):
                    if i:
                        stack.append((", ",))
                    stack.append(c)
        return "".join(parts)

    def __eq__(self, other: object) -> bool:
        """Same labels, words and shape (as the dataclass compares), without recursion."""
        if other.__class__ is not self.__class__:
            return NotImplemented
        stack: list[tuple[Tree, Tree]] = [(self, other)]  # type: ignore[list-item]
        while stack:
            a, b = stack.pop()
            if a.label != b.label or len(a.children) != len(b.children):
                return False
            for x, y in zip(a.children, b.children):
                if isinstance(x, Tree) or isinstance(y, Tree):
                    if x.__class__ is not y.__class__:
                        return False
                    stack.append((x, y))  # type: ignore[arg-type]
                elif x != y:
                    return False
        return True

    def copy(self) -> "Tree":
        """A deep copy (iterative)."""
        root = Tree(self.label)
        stack: list[tuple[Tree, Tree]] = [(self, root)]
        while stack:
            src, dst = stack.pop()
            for c in src.children:
                if isinstance(c, str):
                    dst.children.append(c)
                else:
                    nc = Tree(c.label)
                    dst.children.append(nc)
                    stack.append((c, nc))
        return root

    # ----------------------------------------------------------------------------- reading
    @staticmethod
    def parse(text: str) -> "Tree":
        """Read exactly one tree from `text`; raise `TreeError` if it is not exactly one tree."""
        trees = parse_trees(text)
        if len(trees) != 1:
            raise TreeError(f"expected one tree, found {len(trees)}")
        return trees[0]


def parse_trees(text: str) -> list[Tree]:
    """Read every top-level tree in `text` (zero or more). Raise `TreeError` on malformed input.

    The label is the token right after `(` when no whitespace separates them; otherwise the node
    is unlabeled (`""`), exactly as EVALB reads `( (S ...) )`.
    """
    trees: list[Tree] = []
    stack: list[Tree] = []
    for m in _TOKENS.finditer(text):
        kind = m.lastgroup
        if kind == "open":
            node = Tree(m.group("label"))
            if stack:
                stack[-1].children.append(node)
            stack.append(node)
        elif kind == "close":
            if not stack:
                raise TreeError(f"unbalanced brackets: ')' at column {m.start() + 1} closes nothing")
            node = stack.pop()
            if not stack:
                trees.append(node)
        else:
            if not stack:
                raise TreeError(f"word {m.group()!r} at column {m.start() + 1} is outside any bracket")
            stack[-1].children.append(m.group())
    if stack:
        raise TreeError(f"unbalanced brackets: {len(stack)} '(' not closed at end of line")
    return trees


def split_trees(lines: Iterable[str]) -> Iterator[str]:
    """Cut multi-line treebank text (e.g. `.mrg` files) into one string per top-level tree.

    Every whitespace run inside a tree becomes one space and nothing else changes (so `( (S`
    stays unlabeled-root). Blank text between trees is skipped; any other text outside brackets
    raises `TreeError`.
    """
    buf: list[str] = []
    depth = 0
    pending_space = False
    for lineno, line in enumerate(lines, start=1):
        for col, ch in enumerate(line, start=1):
            if ch in _WS:
                pending_space = depth > 0
                continue
            if depth == 0 and ch != "(":
                raise TreeError(f"line {lineno}, column {col}: {ch!r} outside any tree")
            if pending_space and buf:
                buf.append(" ")
            pending_space = False
            buf.append(ch)
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    yield "".join(buf)
                    buf = []
        pending_space = depth > 0  # a line break inside a tree separates tokens
    if depth != 0:
        raise TreeError(f"unbalanced brackets at end of input ({depth} '(' not closed)")


def read_trees(path: str | os.PathLike) -> Iterator[Tree | None]:
    """Yield one tree per line of a one-tree-per-line file (plain, .gz or '-' for stdin).

    A blank line yields None. A malformed line raises `UserError` naming the file and line.
    """
    name = "<stdin>" if str(path) == "-" else str(path)
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip(_WS):
            yield None
            continue
        try:
            yield Tree.parse(line)
        except TreeError as e:
            raise UserError(f"{name}:{lineno}: not a bracketed tree: {e}") from None


# --------------------------------------------------------------------------------- normalizing


def strip_label(label: str) -> str:
    """Drop function tags and co-indices: `NP-SBJ-1` -> `NP`, `NP=2` -> `NP`, `PP-LOC=3` -> `PP`.

    Labels that *begin* with `-` (`-NONE-`, `-LRB-`, `-RRB-`) are left alone. (EVALB's
    `modify_label` cuts at the first `-` or `=` without that exception, but applies it to
    constituent labels only, never to part-of-speech tags; see nmtkit.scoring.parseval.)
    """
    if label.startswith("-"):
        return label
    for i, ch in enumerate(label):
        if ch in "-=":
            return label[:i] if i else label
    return label


def strip_function_tags(tree: Tree, *, preterminals: bool = False) -> Tree:
    """Apply `strip_label` to every constituent label (and to POS tags when `preterminals`).

    Returns a new tree; the input is not changed.
    """
    out = tree.copy()
    for node in out.subtrees():
        if preterminals or not node.is_preterminal():
            node.label = strip_label(node.label)
    return out


def remove_empty(tree: Tree, empty_tags: Iterable[str] = ("-NONE-",)) -> Tree | None:
    """Remove empty elements (preterminals tagged `-NONE-`) and every constituent left empty.

    Returns a new tree, or None when nothing is left (a tree made only of empty elements).
    """
    empty = set(empty_tags)
    rebuilt: dict[int, Tree | None] = {}
    # Iterative post-order: each node is visited again (done=True) after all its children.
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, done = stack.pop()
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children if isinstance(c, Tree))
            continue
        if node.is_preterminal() and node.label in empty:
            rebuilt[id(node)] = None
            continue
        kids: list[Child] = []
        for c in node.children:
            if isinstance(c, str):
                kids.append(c)
            else:
                new = rebuilt.pop(id(c))
                if new is not None:
                    kids.append(new)
        rebuilt[id(node)] = Tree(node.label, kids) if kids else None
    return rebuilt[id(tree)]


def strip_root(tree: Tree, root_labels: Iterable[str] = ("", "TOP", "ROOT")) -> Tree:
    """Remove the outer wrapper `( (S ...) )` / `(TOP (S ...))` when it has a single child tree."""
    labels = set(root_labels)
    if tree.label in labels and len(tree.children) == 1 and isinstance(tree.children[0], Tree):
        return tree.children[0]
    return tree


def add_root(tree: Tree, label: str = "TOP") -> Tree:
    """Wrap `tree` in a root node `(TOP tree)` unless it already has that root label."""
    if tree.label == label:
        return tree
    return Tree(label, [tree])
