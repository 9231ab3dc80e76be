"""Parseval (labeled bracketing precision/recall/F1) computed exactly as EVALB does.

Why a re-implementation: published parsing F1 (the paper's 91.3 / 92.7) is EVALB with
COLLINS.prm, and EVALB is a C program users would have to build. This module follows evalb.c
(Sekine & Collins 1997) step by step, so that its numbers and its per-sentence table are EVALB's:

1. Reading (evalb.c `read_line`): a preterminal whose tag is a DELETE_LABEL (COLLINS.prm: `,`
   `:` ``` `` ``` `''` `.` and `-NONE-`) is dropped with its word, *before* spans are computed, so
   punctuation never shifts a constituent's span. Every other bracket is a constituent spanning
   the kept words under it; preterminals are words, not constituents. The unlabeled outer
   bracket of `( (S ...) )` is a constituent with the empty label (EVALB counts it!).
   "Len" counts every word except DELETE_LABEL_FOR_LENGTH tags (`-NONE-`).
2. Errors (evalb.c `calc_result`): a test sentence with no words left is *skipped*; a different
   word count ("Length unmatch") or a different word ("Words unmatch") makes the sentence an
   *error*. Skipped and error sentences are reported and excluded from every total. Like evalb,
   more than MAX_ERROR + 1 error sentences abort the run.
3. Massaging (`massage_data`): constituents covering no words are removed (this removes what
   -NONE- left empty); labels are cut at the first `-` or `=` (`NP-SBJ-1` -> `NP`); constituents
   whose label is a DELETE_LABEL (`TOP`) are removed.
4. Matching: each gold constituent, in order, takes the first unmatched test constituent with
   the same span and an equal label (EQ_LABEL pairs such as ADVP = PRT count as equal).
   Crossing brackets, tagging accuracy (on the kept words, raw tags) and complete match as in
   evalb; recall, precision and F1 are micro-averaged over the valid sentences.

Differences from evalb.c, all outside its normal operation: line-count mismatches are refused
up front; evalb's fixed limits (5000 bytes per line, 200 words or brackets per sentence) do not
apply; `(X )` reads as an empty constituent (evalb: a terminal with an empty word); malformed
lines are error sentences (evalb loops on its error path until MAX_ERROR stops it); QUOTE_LABEL
is not supported.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Sequence

from nmtkit.errors import UserError, count
from nmtkit.io import read_lines, require_file
from nmtkit.parsing.trees import Tree, TreeError, parse_trees

_WS = " \t\n\r\f\v"  # C isspace() in the "C" locale
# Root wrappers seen in treebanks and parser outputs; whether one counts depends on DELETE_LABEL.
_WRAPPER_LABELS = ("", "TOP", "ROOT", "VROOT")


@dataclass(frozen=True)
class EvalbParams:
    """The settings of an EVALB parameter (.prm) file. The defaults are COLLINS.prm."""

    delete_labels: tuple[str, ...] = ("TOP", "-NONE-", ",", ":", "``", "''", ".")
    delete_labels_for_length: tuple[str, ...] = ("-NONE-",)
    eq_labels: tuple[tuple[str, str], ...] = (("ADVP", "PRT"),)
    eq_words: tuple[tuple[str, str], ...] = ()
    labeled: bool = True
    max_error: int = 10
    cutoff_len: int = 40
    source: str = "COLLINS.prm"

    @cached_property
    def _eq_label_pairs(self) -> frozenset[tuple[str, str]]:
        return frozenset(self.eq_labels) | frozenset((b, a) for a, b in self.eq_labels)

    @cached_property
    def _eq_word_pairs(self) -> frozenset[tuple[str, str]]:
        return frozenset(self.eq_words) | frozenset((b, a) for a, b in self.eq_words)

    @cached_property
    def _deleted_constituents(self) -> frozenset[str]:
        """Constituent labels removed by massage_data: label_comp(label, D) for a DELETE_LABEL D."""
        out = set(self.delete_labels)
        out.update(a for a, b in self._eq_label_pairs if b in self.delete_labels)
        return frozenset(out)

    def label_eq(self, a: str, b: str) -> bool:
        """evalb.c `label_comp`: equal strings or an EQ_LABEL pair (in either order)."""
        return a == b or (a, b) in self._eq_label_pairs

    def word_eq(self, a: str, b: str) -> bool:
        """evalb.c `word_comp`: equal strings or an EQ_WORD pair (in either order)."""
        return a == b or (a, b) in self._eq_word_pairs

    def deletes_constituent(self, label: str) -> bool:
        """True if a constituent with this (already modified) label is removed."""
        return label in self._deleted_constituents


COLLINS = EvalbParams()


def read_evalb_params(path: str | os.PathLike) -> EvalbParams:
    """Read an EVALB .prm file the way evalb.c's `read_parameter_file` does.

    Starts from evalb's built-in defaults (no deleted or equivalent labels, LABELED 1,
    MAX_ERROR 10, CUTOFF_LEN 40), not from COLLINS.prm. Lines starting with `#` or shorter than
    3 characters are ignored; the key is the first word and the value the rest of the line.
    Supported keys: DEBUG (ignored), MAX_ERROR, CUTOFF_LEN, LABELED, DELETE_LABEL,
    DELETE_LABEL_FOR_LENGTH, EQ_LABEL, EQ_WORD.
    """
    name = str(path)
    require_file(path, "--evalb-param")
    delete: list[str] = []
    delete_len: list[str] = []
    eq_labels: list[tuple[str, str]] = []
    eq_words: list[tuple[str, str]] = []
    ints = {"MAX_ERROR": 10, "CUTOFF_LEN": 40, "LABELED": 1, "DEBUG": 0}
    for lineno, line in enumerate(read_lines(path), start=1):
        line = line.rstrip(_WS)
        if line.startswith("#") or len(line) < 3:
            continue
        cut = 0
        while cut < len(line) and line[cut] not in _WS:
            cut += 1
        key, value = line[:cut], line[cut:].lstrip(_WS)
        where = f"--evalb-param {name}:{lineno}"
        if not value:
            raise UserError(f"{where}: {key} has no value")
        if key in ints:
            try:
                ints[key] = int(value.split()[0])
            except ValueError:
                raise UserError(f"{where}: {key} needs an integer, got {value!r}") from None
        elif key == "DELETE_LABEL":
            delete.append(value)
        elif key == "DELETE_LABEL_FOR_LENGTH":
            delete_len.append(value)
        elif key in ("EQ_LABEL", "EQ_WORD"):
            pair = value.split()
            if len(pair) != 2:
                raise UserError(f"{where}: {key} requires two values, got {value!r}")
            (eq_labels if key == "EQ_LABEL" else eq_words).append((pair[0], pair[1]))
        elif key == "QUOTE_LABEL":
            raise UserError(f"{where}: QUOTE_LABEL (evalb's quote re-insertion) is not supported")
        else:
            raise UserError(f"{where}: unknown EVALB parameter {key!r}")
    return EvalbParams(
        delete_labels=tuple(delete),
        delete_labels_for_length=tuple(delete_len),
        eq_labels=tuple(eq_labels),
        eq_words=tuple(eq_words),
        labeled=ints["LABELED"] != 0,
        max_error=ints["MAX_ERROR"],
        cutoff_len=ints["CUTOFF_LEN"],
        source=os.path.basename(name),
    )


# ------------------------------------------------------------------------------- one sentence


@dataclass
class _Side:
    """One tree as evalb sees it: kept words with their tags, and constituents over word spans."""

    words: list[str]
    tags: list[str]
    brackets: list[list[Any]]  # [start, end, label] in the order of their "(" (pre-order)
    length: int  # evalb's r_wn: words except DELETE_LABEL_FOR_LENGTH tags
    wrapper: str | None = None  # label of a counted root wrapper: `( (S ...) )` -> "", `(ROOT (S ...))`
    error: str | None = None


def _read_side(line: str, params: EvalbParams) -> _Side:
    side = _Side([], [], [], 0)
    try:
        trees = parse_trees(line)
    except TreeError as e:
        side.error = f"cannot read tree: {e}"
        return side
    delete = set(params.delete_labels)
    delete_len = set(params.delete_labels_for_length)
    if (
        len(trees) == 1
        and trees[0].label in _WRAPPER_LABELS
        and len(trees[0].children) == 1
        and isinstance(trees[0].children[0], Tree)
    ):
        label = modify_label(trees[0].label)
        if not params.deletes_constituent(label):
            side.wrapper = trees[0].label  # e.g. "" or ROOT: evalb counts it as a constituent
    for tree in trees:
        # Pre-order walk; an int on the stack means "close bracket number i here".
        stack: list[Tree | int] = [tree]
        while stack:
            item = stack.pop()
            if isinstance(item, int):
                side.brackets[item][1] = len(side.words)
                continue
            node = item
            if node.is_preterminal():
                tag, word = node.label, node.children[0]
                if tag not in delete_len:
                    side.length += 1
                if tag in delete:
                    continue
                side.words.append(word)  # type: ignore[arg-type]
                side.tags.append(tag)
                continue
            if any(isinstance(c, str) for c in node.children) and side.error is None:
                side.error = f"more than two elements in a bracket ({node.label or '<unlabeled>'} has a bare word)"
            side.brackets.append([len(side.words), None, node.label])
            stack.append(len(side.brackets) - 1)
            stack.extend(c for c in reversed(node.children) if isinstance(c, Tree))
    return side


def modify_label(label: str) -> str:
    """evalb.c `modify_label`: cut a constituent label at its first `-` or `=`."""
    for i, ch in enumerate(label):
        if ch in "-=":
            return label[:i]
    return label


def _massage(brackets: list[list[Any]], params: EvalbParams) -> list[tuple[int, int, str] | None]:
    """evalb.c `massage_data`: None for removed constituents (empty span or deleted label)."""
    out: list[tuple[int, int, str] | None] = []
    for start, end, label in brackets:
        if start == end:
            out.append(None)
            continue
        label = modify_label(label)
        if params.deletes_constituent(label):
            out.append(None)
        else:
            out.append((start, end, label))
    return out


def _percent(part: int, whole: int) -> float:
    """100 * part / whole, or 0.0 when `whole` is 0: evalb prints 0.00 for a sentence or corpus
    without brackets (or words, or valid sentences) rather than dividing by zero."""
    return 100.0 * part / whole if whole else 0.0


class _Scores:
    """Recall, precision and tagging accuracy from the bracket and tag counts.

    Why shared: evalb computes them the same way for one sentence (its per-sentence table) and
    for the corpus totals (its summary), so `SentenceResult` and `Totals` take them from here.
    """

    # the counters read here, declared as fields by both dataclasses
    matched: int
    gold_brackets: int
    test_brackets: int
    words: int
    correct_tags: int

    @property
    def recall(self) -> float:
        return _percent(self.matched, self.gold_brackets)

    @property
    def precision(self) -> float:
        return _percent(self.matched, self.test_brackets)

    @property
    def tagging_accuracy(self) -> float:
        return _percent(self.correct_tags, self.words)


@dataclass
class SentenceResult(_Scores):
    """One row of EVALB's per-sentence table."""

    line: int
    length: int  # evalb "Len": gold words except -NONE- (punctuation included)
    status: int  # 0 ok, 1 error (excluded), 2 skip (excluded)
    matched: int = 0
    gold_brackets: int = 0
    test_brackets: int = 0
    crossing: int = 0
    words: int = 0  # kept words (punctuation and -NONE- removed)
    correct_tags: int = 0
    message: str = ""

    def evalb_row(self) -> str:
        """The row exactly as evalb.c's `individual_result` prints it."""
        return (
            f"{self.line:4d}  {self.length:3d}    {self.status:d}  "
            f"{self.recall:6.2f} {self.precision:6.2f}   {self.matched:3d}    {self.gold_brackets:3d}  "
            f"{self.test_brackets:3d}    {self.crossing:3d}"
            f"   {self.words:4d}  {self.correct_tags:4d}   {self.tagging_accuracy:6.2f}"
        )


def score_sentence(line: int, gold_line: str, test_line: str, params: EvalbParams = COLLINS) -> SentenceResult:
    """Compare one gold and one test tree (each a line of bracketed text) as evalb does."""
    return _compare(line, _read_side(gold_line, params), _read_side(test_line, params), params)


def _compare(line: int, gold: _Side, test: _Side, params: EvalbParams) -> SentenceResult:
    res = SentenceResult(line=line, length=gold.length, status=0)
    if gold.error or test.error:
        res.status = 1
        res.message = f"gold tree: {gold.error}" if gold.error else f"test tree: {test.error}"
        return res
    if not test.words:
        res.status = 2
        res.message = "test tree has no words (skipped, as evalb skips it)"
        return res
    if len(gold.words) != len(test.words):
        res.status = 1
        res.message = f"Length unmatch ({len(gold.words)}|{len(test.words)}): gold and test have different word counts"
        return res
    for i, (g, t) in enumerate(zip(gold.words, test.words)):
        if not params.word_eq(g, t):
            res.status = 1
            res.message = f"Words unmatch ({g}|{t}) at word {i + 1}"
            return res

    gb = _massage(gold.brackets, params)
    tb = _massage(test.brackets, params)
    # Test constituents by span, in tree order; evalb scans all test brackets in order and takes
    # the first one that is still unmatched with the same span and an equal label.
    by_span: dict[tuple[int, int], list[int]] = {}
    for j, t in enumerate(tb):
        if t is not None:
            by_span.setdefault((t[0], t[1]), []).append(j)
    test_free = [b is not None for b in tb]
    matched = 0
    for g in gb:
        if g is None:
            continue
        for j in by_span.get((g[0], g[1]), ()):
            if test_free[j] and (not params.labeled or params.label_eq(g[2], tb[j][2])):  # type: ignore[index]
                test_free[j] = False
                matched += 1
                break
    # Crossing: test constituents that cross at least one gold constituent (evalb counts on test).
    crossing = 0
    gold_spans = [(g[0], g[1]) for g in gb if g is not None]
    for t in tb:
        if t is None:
            continue
        ts, te = t[0], t[1]
        for gs, ge in gold_spans:
            if (gs < ts < ge < te) or (ts < gs < te < ge):
                crossing += 1
                break
    res.matched = matched
    res.gold_brackets = sum(b is not None for b in gb)
    res.test_brackets = sum(b is not None for b in tb)
    res.crossing = crossing
    res.words = len(gold.words)
    res.correct_tags = sum(params.label_eq(a, b) for a, b in zip(gold.tags, test.tags))
    return res


# ------------------------------------------------------------------------------------- corpus


@dataclass
class Totals(_Scores):
    """evalb's TOTAL_* (all sentences) or TOT40_* (sentences with Len <= CUTOFF_LEN) counters."""

    sentences: int = 0
    error_sentences: int = 0
    skip_sentences: int = 0
    matched: int = 0
    gold_brackets: int = 0
    test_brackets: int = 0
    complete: int = 0
    words: int = 0
    correct_tags: int = 0
    crossing: int = 0
    no_crossing: int = 0
    two_or_less_crossing: int = 0

    def add(self, s: SentenceResult) -> None:
        self.sentences += 1
        if s.status == 1:
            self.error_sentences += 1
            return
        if s.status == 2:
            self.skip_sentences += 1
            return
        self.gold_brackets += s.gold_brackets
        self.test_brackets += s.test_brackets
        self.matched += s.matched
        if s.gold_brackets == s.test_brackets == s.matched:
            self.complete += 1
        self.words += s.words
        self.crossing += s.crossing
        self.no_crossing += s.crossing == 0
        self.two_or_less_crossing += s.crossing <= 2
        self.correct_tags += s.correct_tags

    @property
    def valid(self) -> int:
        return self.sentences - self.error_sentences - self.skip_sentences

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    @property
    def complete_match(self) -> float:
        return _percent(self.complete, self.valid)

    @property
    def average_crossing(self) -> float:
        return self.crossing / self.valid if self.valid else 0.0

    @property
    def no_crossing_pct(self) -> float:
        return _percent(self.no_crossing, self.valid)

    @property
    def two_or_less_crossing_pct(self) -> float:
        return _percent(self.two_or_less_crossing, self.valid)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            valid_sentences=self.valid,
            recall=self.recall,
            precision=self.precision,
            f1=self.f1,
            complete_match=self.complete_match,
            average_crossing=self.average_crossing,
            no_crossing=self.no_crossing_pct,
            two_or_less_crossing=self.two_or_less_crossing_pct,
            tagging_accuracy=self.tagging_accuracy,
        )
        return d


@dataclass
class ParsevalResult:
    params: EvalbParams
    sentences: list[SentenceResult]
    all: Totals
    cutoff: Totals
    warnings: list[str] = field(default_factory=list)

    @property
    def lines(self) -> int:
        return len(self.sentences)

    def signature(self) -> str:
        p = self.params
        return (
            f"evalb:{p.source}|labeled:{'yes' if p.labeled else 'no'}"
            f"|delete:{' '.join(p.delete_labels) or '-'}"
            f"|eq:{' '.join('='.join(x) for x in p.eq_labels) or '-'}"
        )

    def format_line(self) -> str:
        """One summary line in the style of the translation metrics."""
        a = self.all
        return (
            f"Parseval F1 = {a.f1:.2f} (recall = {a.recall:.2f} precision = {a.precision:.2f} "
            f"complete match = {a.complete_match:.2f} tagging = {a.tagging_accuracy:.2f} "
            f"brackets = {a.matched}/{a.gold_brackets} gold {a.test_brackets} test) | {self.signature()} "
            f"| sentences: {a.valid} valid, {a.error_sentences} error, {a.skip_sentences} skipped "
            f"| lines: {self.lines}"
        )

    def to_dict(self) -> dict[str, Any]:
        p = self.params
        return {
            "metric": "parseval",
            "name": "Parseval",
            "score": self.all.f1,
            "signature": self.signature(),
            "lines": self.lines,
            "params": {
                "source": p.source,
                "labeled": p.labeled,
                "delete_labels": list(p.delete_labels),
                "delete_labels_for_length": list(p.delete_labels_for_length),
                "eq_labels": [list(x) for x in p.eq_labels],
                "eq_words": [list(x) for x in p.eq_words],
                "max_error": p.max_error,
                "cutoff_len": p.cutoff_len,
            },
            "all": self.all.to_dict(),
            f"len<={p.cutoff_len}": self.cutoff.to_dict(),
            "excluded": [
                {"line": s.line, "status": "error" if s.status == 1 else "skip", "reason": s.message}
                for s in self.sentences
                if s.status
            ],
            "warnings": list(self.warnings),
        }

    def evalb_report(self) -> str:
        """EVALB's complete output: per-sentence table, totals row and summary (evalb.c layout)."""
        out = [
            "  Sent.                        Matched  Bracket   Cross        Correct Tag",
            " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy",
            "=" * 76,
        ]
        out.extend(s.evalb_row() for s in self.sentences)
        out.append("=" * 76)
        a = self.all
        row = ""
        if a.gold_brackets > 0 and a.test_brackets > 0:
            row = (
                f"                {a.recall:6.2f} {a.precision:6.2f} {a.matched:6d} {a.gold_brackets:5d} "
                f"{a.test_brackets:5d}  {a.crossing:5d}"
            )
        row += f"  {a.words:5d} {a.correct_tags:5d}   {a.tagging_accuracy:6.2f}"
        out.append(row)
        out.append("=== Summary ===")
        for title, t in (("All", self.all), (f"len<={self.params.cutoff_len}", self.cutoff)):
            out += [
                "",
                f"-- {title} --",
                f"Number of sentence        = {t.sentences:6d}",
                f"Number of Error sentence  = {t.error_sentences:6d}",
                f"Number of Skip  sentence  = {t.skip_sentences:6d}",
                f"Number of Valid sentence  = {t.valid:6d}",
                f"Bracketing Recall         = {t.recall:6.2f}",
                f"Bracketing Precision      = {t.precision:6.2f}",
                f"Bracketing FMeasure       = {_f1_evalb(t):>6s}",
                f"Complete match            = {t.complete_match:6.2f}",
                f"Average crossing          = {t.average_crossing:6.2f}",
                f"No crossing               = {t.no_crossing_pct:6.2f}",
                f"2 or less crossing        = {t.two_or_less_crossing_pct:6.2f}",
                f"Tagging accuracy          = {t.tagging_accuracy:6.2f}",
            ]
        return "\n".join(out) + "\n"


def _f1_evalb(t: Totals) -> str:
    """evalb prints 2pr/(p+r) unguarded, so 0/0 shows as glibc's `-nan`."""
    p, r = t.precision, t.recall
    return "-nan" if p + r == 0 else f"{2 * p * r / (p + r):6.2f}"


class TooManyErrors(UserError):
    """More error sentences than MAX_ERROR allows (evalb exits at that point)."""


def evaluate(
    gold_lines: Sequence[str],
    test_lines: Sequence[str],
    params: EvalbParams = COLLINS,
    gold_name: str = "gold",
    test_name: str = "test",
) -> ParsevalResult:
    """Score parallel lists of bracketed trees (one per line) like `evalb -p PARAMS gold test`."""
    if len(gold_lines) != len(test_lines):
        raise UserError(
            f"line counts differ: test trees {test_name} have {count(len(test_lines), 'line')} but gold trees "
            f"{gold_name} have {count(len(gold_lines), 'line')}; they must be parallel, one tree per line"
        )
    if not gold_lines:
        raise UserError(f"{gold_name} is empty: no trees to score")
    sentences: list[SentenceResult] = []
    all_t, cut_t = Totals(), Totals()
    errors: list[SentenceResult] = []
    wrappers: dict[str, Counter] = {"gold": Counter(), "test": Counter()}
    for i, (g, t) in enumerate(zip(gold_lines, test_lines), start=1):
        gold, test = _read_side(g, params), _read_side(t, params)
        wrappers["gold"][gold.wrapper] += 1
        wrappers["test"][test.wrapper] += 1
        s = _compare(i, gold, test, params)
        sentences.append(s)
        all_t.add(s)
        if s.length <= params.cutoff_len:
            cut_t.add(s)
        if s.status == 1:
            errors.append(s)
            # evalb.c: `if (Error_count++ > Max_error) exit(1);`, i.e. it dies on error MAX_ERROR+2.
            if len(errors) > params.max_error + 1:
                first = "; ".join(f"line {e.line}: {e.message}" for e in errors[:3])
                raise TooManyErrors(
                    f"{test_name}: {len(errors)} sentences with errors exceed MAX_ERROR {params.max_error} "
                    f"of {params.source} (evalb stops here too); first: {first}; fix the trees or raise "
                    f"MAX_ERROR in a parameter file given with --evalb-param"
                )
    result = ParsevalResult(params, sentences, all_t, cut_t)
    gw = wrappers["gold"].most_common(1)[0][0]
    tw = wrappers["test"].most_common(1)[0][0]
    if gw != tw:
        def show(w: str | None) -> str:
            return "no counted root wrapper" if w is None else ("the unlabeled outer bracket `( (S ...) )`" if w == "" else f"a root bracket `({w} ...)`")

        result.warnings.append(
            f"root conventions differ: most gold trees have {show(gw)}, most test trees have {show(tw)}; "
            f"EVALB ({params.source}) counts such a bracket as a constituent, so recall/precision are not "
            f"comparable (give both files the same root, e.g. `(TOP ...)`, which {params.source} deletes)"
        )
    for s in sentences:
        if s.status:
            kind = "error" if s.status == 1 else "skipped"
            result.warnings.append(f"{test_name}:{s.line}: {kind}, excluded from the totals: {s.message}")
    return result


def evaluate_files(
    gold_path: str | os.PathLike,
    test_path: str | os.PathLike,
    params: EvalbParams = COLLINS,
    gold_flag: str = "--ref",
    test_flag: str = "--sys",
) -> ParsevalResult:
    """`evaluate` on two files (plain, .gz, or '-' for stdin as the test side)."""
    gold_name = str(gold_path)
    test_name = "<stdin>" if str(test_path) == "-" else str(test_path)
    for flag, path in ((gold_flag, gold_path), (test_flag, test_path)):
        require_file(path, flag)
    gold = list(read_lines(gold_path))
    test = list(read_lines(test_path))
    if not test:
        raise UserError(f"{test_flag}: {test_name} is empty: nothing to score")
    return evaluate(gold, test, params, gold_name=gold_name, test_name=test_name)
