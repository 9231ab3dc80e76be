"""The units of translation: input sentences as `Item`s, their truncation, and batching.

Why apart from the `Translator`: `nmtkit generate` (binarized splits, streamed raw text,
references) and the `Translator` (lists of sentences) build the same `Item`s, truncate them with
the same warnings and cut them into the same batches, whatever engine then runs them; none of
this needs a model or torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nmtkit.search.config import Terms

MAX_WARNINGS = 20  # over-long inputs named one by one; beyond that only counted
DEFAULT_BATCH_SIZE = 128  # sentences per batch when neither batch_size nor max_tokens is given


def warn_stderr(msg: str) -> None:
    """The default warning sink: one line on stderr, as `nmtkit generate` prints it."""
    print(f"nmtkit: warning: {msg}", file=sys.stderr)


@dataclass
class Item:
    """One input sentence."""

    index: int  # 0-based position in the input (line number - 1)
    ids: np.ndarray  # source dictionary ids without </s>, already truncated to the model limit
    target_ids: np.ndarray | None = None  # reference (binarized splits only), for T- lines
    text: str | None = None  # the raw input line (raw text only): a parsing model's tree gets its words
    terms: Terms | None = None  # phrases to include or avoid, a target prefix (docs/generate.md, "Terminology")
    lead: int = 0  # ids before the sentence's own: 1 for a multilingual model's language tag (`>>fr<<`)


@dataclass
class Truncations:
    """Collects the over-long inputs; names the first MAX_WARNINGS of them as they happen."""

    warn: Callable[[str], None]
    where: Callable[[int], str]  # names input `index` (0-based) for the user, e.g. `news.en:12`
    what: str  # the whole input, in the summary: `news.en`, `split 'test'`
    limit: int  # source tokens kept (without </s>)
    count: int = 0  # inputs truncated so far

    def __call__(self, index: int, ids: np.ndarray) -> np.ndarray:
        if len(ids) <= self.limit:
            return ids
        self.count += 1
        if self.count <= MAX_WARNINGS:
            self.warn(
                f"{self.where(index)}: {len(ids)} tokens, truncated to {self.limit} "
                f"(the model accepts {self.limit + 1} source positions including </s>)"
            )
        return ids[: self.limit]

    def summary(self) -> None:
        if self.count > MAX_WARNINGS:
            self.warn(f"{self.what}: {self.count} inputs in all were truncated ({MAX_WARNINGS} named above)")


def make_batches(items: list[Item], max_tokens: int | None, batch_size: int | None) -> list[list[Item]]:
    """Sort by source length (longest first) and cut into batches.

    A batch holds at most `batch_size` sentences and at most `max_tokens` padded source tokens
    (rows x longest row, </s> included); a single sentence over `max_tokens` still forms a batch
    of its own. Empty sentences are left out: they need no model call.
    """
    todo = sorted((it for it in items if len(it.ids) > 0), key=lambda it: (-len(it.ids), it.index))
    batches: list[list[Item]] = []
    cur: list[Item] = []
    width = 0
    for it in todo:
        w = max(width, len(it.ids) + 1)
        if cur and (
            (batch_size is not None and len(cur) + 1 > batch_size)
            or (max_tokens is not None and w * (len(cur) + 1) > max_tokens)
        ):
            batches.append(cur)
            cur, w = [], len(it.ids) + 1
        cur.append(it)
        width = w
    if cur:
        batches.append(cur)
    return batches
