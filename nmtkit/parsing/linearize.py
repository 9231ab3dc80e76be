"""Trees as token sequences (parsing as translation) and back, including repair of model output.

Why: the Transformer translates the words of a sentence into a *linearized* tree (Vinyals et al.
2015; the paper's section 6.3): depth-first, each constituent as a labeled opening token `(NP`
and a labeled closing token `)NP`, each word replaced by its part-of-speech tag, words left out:

    (TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))
    -> words  : John has a dog .
    -> target : (S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S

The `(TOP ...)` root of a normalized tree (nmtkit.parsing.treebank.normalize_tree) is implicit:
the target holds its children, and every tree built from a sequence gets it back.

Part-of-speech modes (`pos`): `keep` writes the tag (tensor2tensor's WSJ data, used for the
paper); `xx` writes the one placeholder `XX` for every tag (Vinyals et al. 2015), so trees built
back from `xx` sequences have `XX` tags (see `fix_punctuation_tags` for scoring them).

Token kinds in a sequence:
- `(LABEL`  opens a constituent (LABEL non-empty, no parentheses);
- `)LABEL`  closes one (`)` alone is accepted by `repair` as "close the innermost");
- any other token without parentheses is a preterminal: its tag in `keep` mode; in `xx` mode only
  `XX` is;
- everything else is unknown: tokens with a parenthesis inside, a lone `(`, the special symbols
  `<unk>` `<s>` `</s>` `<pad>` (any `<...>`), and in `xx` mode any bare token other than `XX`.

`delinearize` is strict (a well-formed sequence with as many preterminals as words, or TreeError);
`repair` accepts anything and always returns a tree whose yield is exactly the input words (the
algorithm is documented on `repair` and in docs/parsing.md).
"""

from __future__ import annotations

import re
from typing import Sequence

from nmtkit.parsing.trees import Tree, TreeError, remove_empty

POS_MODES = ("keep", "xx")
PLACEHOLDER = "XX"  # the `xx` mode's tag
# Tag of preterminals whose tag `repair` / `fix_punctuation_tags` have to make up. Not a PTB tag,
# so an invented tag is never mistaken for a prediction (and it is not one EVALB deletes).
DEFAULT_TAG = PLACEHOLDER
TOP = "TOP"

# Penn Treebank punctuation that EVALB's COLLINS.prm deletes (DELETE_LABEL `,` `:` `` `` `''` `.`).
EVALB_PUNCTUATION_TAGS = frozenset({",", ":", "``", "''", "."})
# Every part-of-speech tag whose word COLLINS.prm deletes (its DELETE_LABEL list).
EVALB_DELETED_TAGS = EVALB_PUNCTUATION_TAGS | {"-NONE-", "TOP"}
# Words that carry one of those tags every time they occur in the treebank sample
# (../shared/data/ptb, 3914 trees, measured): word -> tag. `'` is ambiguous (POS 63 times, '' 10
# times) and handled by `_apostrophe_tag`.
PUNCTUATION_TAG_OF_WORD = {
    ",": ",",
    ".": ".",
    "?": ".",
    "!": ".",
    "``": "``",
    "`": "``",
    "''": "''",
    ":": ":",
    ";": ":",
    "--": ":",
    "-": ":",
    "...": ":",
}
_DROP = "(drop)"  # internal marker tag; contains a parenthesis, so no real token can produce it

_OPEN, _CLOSE, _PRE, _UNKNOWN = range(4)
_PAREN_OR_SPACE = re.compile(r"[\s()]")
_SPACE = re.compile(r"\s")


def check_pos_mode(pos: str) -> str:
    """Return `pos` or raise ValueError naming the allowed modes (CLI code turns it into a flag error)."""
    if pos not in POS_MODES:
        raise ValueError(f"part-of-speech mode must be one of {', '.join(POS_MODES)}, got {pos!r}")
    return pos


def _is_special(tok: str) -> bool:
    return len(tok) >= 3 and tok[0] == "<" and tok[-1] == ">"


def _classify(tok: str, pos: str) -> tuple[int, str]:
    """(kind, label-or-tag) of one sequence token."""
    if not tok:
        return _UNKNOWN, tok
    head, rest = tok[0], tok[1:]
    if head == "(":
        if rest and not _PAREN_OR_SPACE.search(rest) and not _is_special(rest):
            return _OPEN, rest
        return _UNKNOWN, tok
    if head == ")":
        if not _PAREN_OR_SPACE.search(rest):
            return _CLOSE, rest
        return _UNKNOWN, tok
    if pos == "xx":
        return (_PRE, tok) if tok == PLACEHOLDER else (_UNKNOWN, tok)
    if _PAREN_OR_SPACE.search(tok) or _is_special(tok):
        return _UNKNOWN, tok
    return _PRE, tok


def _tokens(seq: Sequence[str] | str) -> list[str]:
    return seq.split() if isinstance(seq, str) else list(seq)


def _words(words: Sequence[str] | str) -> list[str]:
    """The input words: a line (split on whitespace) or a list of non-empty tokens without spaces."""
    wl = _tokens(words)
    for i, w in enumerate(wl, start=1):
        if not w or _SPACE.search(w):
            raise ValueError(f"word {i} {w!r} is empty or contains whitespace; words are whitespace-split tokens")
    return wl


# ------------------------------------------------------------------------------ tree -> sequence


def top_items(tree: Tree) -> list[Tree]:
    """The constituents a sequence describes: the children of a `TOP` root, else the tree itself."""
    if tree.label == TOP:
        items = tree.children
    else:
        items = [tree]
    for c in items:
        if isinstance(c, str):
            raise TreeError(f"word {c!r} directly under the root (every word needs a part-of-speech tag)")
    return items  # type: ignore[return-value]


def linearize(tree: Tree, pos: str = "keep") -> tuple[list[str], list[str]]:
    """(words, target tokens) of a normalized tree, depth-first; the TOP root is left implicit.

    Raises TreeError for trees the format cannot hold exactly: a word not under its own
    preterminal, a constituent without words, an empty label, a tag that would read back as
    another kind of token (`<...>`), or a word, tag or label that a line split at whitespace
    cannot hold as one token (empty, or with a space in it: the tree reader splits at ASCII
    whitespace only, so a no-break space is part of a word there).
    """
    check_pos_mode(pos)
    words: list[str] = []
    out: list[str] = []
    # Stack items: a node to emit, or a string = a closing token to emit.
    stack: list[Tree | str] = list(reversed(top_items(tree)))
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        node = item
        if node.is_preterminal():
            tag = node.label
            if not tag or _is_special(tag) or any(c.isspace() for c in tag):
                raise TreeError(f"part-of-speech tag {tag!r} of word {node.children[0]!r} cannot be linearized")
            word = node.children[0]
            if not word or any(c.isspace() for c in word):  # type: ignore[union-attr]
                raise TreeError(f"word {word!r} is empty or holds whitespace; a line of words cannot hold it "
                                "as one word")
            words.append(word)  # type: ignore[arg-type]
            out.append(tag if pos == "keep" else PLACEHOLDER)
            continue
        if not node.label or _is_special(node.label) or any(c.isspace() for c in node.label):
            raise TreeError(f"constituent label {node.label!r} cannot be linearized")
        if not node.children:
            raise TreeError(f"constituent ({node.label} ) has no words; normalize the tree first")
        for c in node.children:
            if isinstance(c, str):
                raise TreeError(f"word {c!r} is not under its own part-of-speech tag in ({node.label} ...)")
        out.append("(" + node.label)
        stack.append(")" + node.label)
        stack.extend(reversed(node.children))  # type: ignore[arg-type]
    return words, out


def linearize_line(tree: Tree, pos: str = "keep") -> tuple[str, str]:
    """(source line, target line): `linearize` joined with single spaces, ready to be written."""
    words, seq = linearize(tree, pos)
    return " ".join(words), " ".join(seq)


def mask_tags(tree: Tree, tag: str = PLACEHOLDER) -> Tree:
    """A copy with every part-of-speech tag replaced by `tag` (what an `xx` round trip gives)."""
    out = tree.copy()
    for node in out.subtrees():
        if node.is_preterminal():
            node.label = tag
    return out


# ------------------------------------------------------------------------------ sequence -> tree


def delinearize(seq: Sequence[str] | str, words: Sequence[str] | str, pos: str = "keep") -> Tree:
    """The exact inverse of `linearize`: a well-formed sequence and its words -> `(TOP ...)`.

    Raises TreeError (naming the token position) on unknown tokens, a closing label that does
    not match, a stray or missing closing bracket, a constituent without preterminals, or a
    preterminal count different from the number of words. Use `repair` for model output.
    """
    check_pos_mode(pos)
    toks, wl = _tokens(seq), _words(words)
    root = Tree(TOP)
    stack = [root]
    pres: list[Tree] = []
    for i, tok in enumerate(toks, start=1):
        kind, label = _classify(tok, pos)
        if kind == _UNKNOWN:
            raise TreeError(f"token {i} {tok!r} is not a bracket or a {'placeholder' if pos == 'xx' else 'tag'}")
        if kind == _OPEN:
            node = Tree(label)
            stack[-1].children.append(node)
            stack.append(node)
        elif kind == _CLOSE:
            if len(stack) == 1:
                raise TreeError(f"token {i} {tok!r} closes nothing")
            if label != stack[-1].label:
                raise TreeError(f"token {i} {tok!r} closes ({stack[-1].label}")
            if not stack[-1].children:
                raise TreeError(f"token {i} {tok!r} closes an empty constituent")
            stack.pop()
        else:
            node = Tree(label)
            stack[-1].children.append(node)
            pres.append(node)
    if len(stack) > 1:
        raise TreeError(f"{len(stack) - 1} constituent(s) not closed at the end: " + " ".join("(" + n.label for n in stack[1:]))
    if len(pres) != len(wl):
        raise TreeError(f"{len(pres)} preterminals for {len(wl)} words")
    for node, word in zip(pres, wl):
        node.children.append(word)
    return root


def repair(
    seq: Sequence[str] | str,
    words: Sequence[str] | str,
    pos: str = "keep",
    default_tag: str = DEFAULT_TAG,
) -> Tree:
    """Turn ANY token sequence into a `(TOP ...)` tree whose yield is exactly `words`.

    The algorithm, left to right over the tokens, with a stack of open constituents under TOP:

    1. `(X` opens a constituent X inside the innermost open one.
    2. `)X` closes the innermost open constituent labeled X together with everything opened
       inside it; when no open constituent is labeled X (or the token is a bare `)`), it closes
       the innermost one (a mislabeled closing bracket). With nothing open it is dropped.
    3. A tag (in `xx` mode: `XX`) adds a preterminal to the innermost open constituent, or
       directly under TOP when none is open.
    4. Unknown tokens (see the module docstring) are dropped.
    5. At the end, constituents still open are closed. Where the sequence stopped is the
       innermost constituent still open then; if none was, the last constituent directly under
       TOP; if there is none, TOP itself.
    6. Preterminal count vs the n words: extra preterminals, counted from the right, are
       dropped; missing ones are appended at the point where the sequence stopped (step 5), with
       tag `default_tag` (`XX`): a sequence cut off by the length limit usually misses its last
       words, and they most likely belong where it stopped.
    7. The i-th preterminal (left to right) gets the i-th word; then every constituent without
       words is removed (repeatedly, up to TOP).

    A sequence that `delinearize` accepts comes out unchanged (identical to `delinearize`).
    With no words the result is `(TOP)`: parseval skips a test tree without words (EVALB's
    "skip"), so the line still scores. The input is never changed.
    """
    check_pos_mode(pos)
    toks, wl = _tokens(seq), _words(words)
    root = Tree(TOP)
    stack, pres, opened = _read_leniently(root, toks, pos)
    n = len(pres)
    _give_words(pres, wl, _stopping_point(root, stack, pres), default_tag)
    if n <= len(wl) and all(node.children for node in opened):
        return root  # nothing to drop, and every constituent has a child, hence a word below it
    # Constituents that never received a preterminal are childless here; remove_empty drops them
    # (and the _DROP preterminals) bottom-up, iteratively, so deep garbage cannot recurse.
    cleaned = remove_empty(root, empty_tags=(_DROP,))
    return cleaned if cleaned is not None else Tree(TOP)


def _read_leniently(root: Tree, toks: list[str], pos: str) -> tuple[list[Tree], list[Tree], list[Tree]]:
    """Steps 1-4 of `repair`: the tokens read into `root` left to right, where no token is an
    error. Returns the constituents still open (TOP first, innermost last), the preterminals in
    order (no words yet) and every constituent opened."""
    stack = [root]
    pres: list[Tree] = []
    opened: list[Tree] = []
    for tok in toks:
        kind, label = _classify(tok, pos)
        if kind == _OPEN:
            node = Tree(label)
            stack[-1].children.append(node)
            stack.append(node)
            opened.append(node)
        elif kind == _CLOSE:
            _close(stack, label)
        elif kind == _PRE:
            node = Tree(label)
            stack[-1].children.append(node)
            pres.append(node)
        # _UNKNOWN: dropped
    return stack, pres, opened


def _close(stack: list[Tree], label: str) -> None:
    """Step 2 of `repair`: close the innermost open constituent labeled `label` with all opened
    inside it, else (a mislabeled or bare `)`) the innermost one; with only TOP open, nothing."""
    if len(stack) == 1:
        return
    target = len(stack) - 1
    if label and stack[target].label != label:
        for i in range(len(stack) - 2, 0, -1):
            if stack[i].label == label:
                target = i
                break
    del stack[target:]


def _stopping_point(root: Tree, stack: list[Tree], pres: list[Tree]) -> Tree:
    """Step 5 of `repair`: where the sequence stopped, the place for missing preterminals (a
    sequence cut off by the length limit usually misses its last words)."""
    # Preterminals have no word yet, so tell them from constituents by identity.
    pre_ids = {id(p) for p in pres}
    if len(stack) > 1:
        return stack[-1]
    if root.children and id(root.children[-1]) not in pre_ids:
        return root.children[-1]  # type: ignore[return-value]
    return root


def _give_words(pres: list[Tree], wl: list[str], stopped: Tree, default_tag: str) -> None:
    """Steps 6-7 of `repair`: missing preterminals appended at `stopped` with `default_tag`,
    extra ones (from the right) marked for removal, then the i-th preterminal gets the i-th word."""
    n, m = len(pres), len(wl)
    if n < m:
        for _ in range(m - n):
            node = Tree(default_tag)
            stopped.children.append(node)
            pres.append(node)
    for i, node in enumerate(pres):
        if i < m:
            node.children.append(wl[i])
        else:
            node.label = _DROP  # removed by `repair` together with what it leaves empty
            node.children.append("")


# ------------------------------------------------------------------------------ output for scoring


def _apostrophe_tag(words: list[str], i: int, open_quotes: int) -> str:
    """Tag for a lone `'`: closing quote `''` after an unmatched "`" or right before `''`, else `POS`.

    Measured on the treebank sample: 73 of 73 occurrences right (63 POS, 10 closing quotes).
    """
    if open_quotes > 0 or (i + 1 < len(words) and words[i + 1] == "''"):
        return "''"
    return "POS"


def fix_punctuation_tags(tree: Tree, default_tag: str = DEFAULT_TAG) -> Tree:
    """Make the tags EVALB deletes agree with the words, so that gold and output delete the same.

    EVALB (COLLINS.prm) drops words tagged `,` `:` `` `` `''` `.` from *each* tree by its own tags
    before comparing. A punctuation word tagged `NN` (or, in `xx` mode, `XX`), or a word given a
    punctuation tag, makes the word sequences differ: the sentence becomes an error, excluded from
    the totals, and more than 11 of them abort scoring. So, using only the words (no gold data):

    - a word in PUNCTUATION_TAG_OF_WORD gets that tag;
    - a lone `'` keeps a predicted `''` or `POS`; any other tag is replaced by `''` when an
      unmatched "`" precedes it in the sentence or `''` follows it, else by `POS`;
    - any other word that carries a tag EVALB deletes (punctuation, `-NONE-`, `TOP`) gets
      `default_tag`;
    - all other tags are kept.

    On the gold trees of the sample this changes nothing except one annotation error (the word
    `Wa` tagged `,`). Returns a new tree, or `tree` itself when no tag changes.
    """
    pres = [node for node in tree.subtrees() if node.is_preterminal()]
    words = [node.children[0] for node in pres]
    tags = [node.label for node in pres]
    open_quotes = 0
    for i, word in enumerate(words):
        tag = PUNCTUATION_TAG_OF_WORD.get(word)  # type: ignore[arg-type]
        if tag is not None:
            tags[i] = tag
            if word == "`":
                open_quotes += 1
        elif word == "'":
            if tags[i] not in ("''", "POS"):
                tags[i] = _apostrophe_tag(words, i, open_quotes)  # type: ignore[arg-type]
            if tags[i] == "''" and open_quotes > 0:
                open_quotes -= 1
        elif tags[i] in EVALB_DELETED_TAGS:
            tags[i] = default_tag
    if tags == [node.label for node in pres]:
        return tree
    out = tree.copy()
    for node, tag in zip((n for n in out.subtrees() if n.is_preterminal()), tags):
        node.label = tag
    return out


_ESCAPES = {"(": "-LRB-", ")": "-RRB-"}


def escape_word(word: str) -> str:
    """PTB escapes for parentheses inside a word (`(` -> `-LRB-`), so the tree line stays readable."""
    if "(" in word or ")" in word:
        return "".join(_ESCAPES.get(c, c) for c in word)
    return word


def tree_line(tree: Tree) -> str:
    """One-line bracketed tree with parentheses in words escaped (`(TOP)` for no words)."""
    if any("(" in w or ")" in w for w in tree.leaves()):
        tree = tree.copy()
        for node in tree.subtrees():
            node.children = [escape_word(c) if isinstance(c, str) else c for c in node.children]
    return tree.to_string()


def output_tree_line(
    seq: Sequence[str] | str, words: Sequence[str] | str, pos: str = "keep", fix_punctuation: bool = True
) -> str:
    """What `nmtkit generate` writes for a parsing model: always exactly one `(TOP ...)` line.

    `repair` the model output against the input words, then (by default) `fix_punctuation_tags`,
    then `tree_line`. The line has no line break; `nmtkit score --metric parseval` reads it.
    """
    tree = repair(seq, words, pos)
    if fix_punctuation:
        tree = fix_punctuation_tags(tree)
    return tree_line(tree)
