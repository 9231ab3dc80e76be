"""Dynamic batching: sentences of concurrent requests searched together on one worker thread.

Why: beam search over a batch of sentences costs little more than over one (at batch 128 nmtkit
decodes about 6x more sentences per second than at batch 1), but an HTTP server receives
requests one by one. The `Batcher` queues requests; its worker thread takes the oldest one,
waits up to `max_wait` seconds for others to keep it company, and translates the sentences of
every request it took in one `translate_nbest` call, which sorts them by length and cuts them
into search batches (the translator's `batch_size` / `max_tokens`). Results go back to each
request's `concurrent.futures.Future`, which an asyncio server awaits with
`asyncio.wrap_future`: the event loop never waits on the model.

Why results do not depend on the company: nmtkit's search treats every sentence of a batch on
its own (its own output limit from its own length, its own finished list and stopping rule;
padding is masked), so a sentence gives what it gives alone (docs/serve.md, "Batching").
Requests with different search settings (a per-request beam, ...) are never mixed: a batch
holds the requests whose `translator.search_config(**settings)` are equal.

The translator is any object with `nmtkit.Translator`'s interface: `translate_nbest(sentences,
**settings) -> list[list[Translation]]` and `search_config(**settings)` (hashable). It is only
ever called from the worker thread (the Translator is not thread-safe), except `search_config`,
which reads nothing that a translation changes.

No sockets here: the batcher is tested on its own (tests/test_serve.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """The queue holds `max_queue` sentences already (or the batcher is closing): try again later."""


@dataclass
class Job:
    """One request: its sentences, its search settings, and the future of its results."""

    sentences: list[str]
    settings: dict
    key: Hashable  # requests with equal keys may share a batch
    arrived: float  # time.monotonic() when submitted
    future: Future = field(default_factory=Future)  # -> list[list[Translation]], one list per sentence
    batch_sentences: int = 0  # set when it runs: the sentences searched in its batch (its own included)
    call: Callable[[Any], Any] | None = None  # a job of its own: call(translator) instead of a translation
    # terminology: "constraints", "avoid", "prefix" (per-sentence lists or None) and "ordered",
    # the Translator's keyword arguments; None: none (docs/serve.md)
    terms: dict | None = None
    target_lang: list[str] | None = None  # a multilingual model's target per sentence; None: the translator's

    @property
    def group(self) -> Hashable:
        """Jobs with equal groups may share a batch: the same search, the same phrase order rule."""
        return self.key, bool(self.terms and self.terms.get("ordered"))


@dataclass
class BatchRecord:
    """What one worker cycle did (for logs and tests)."""

    jobs: int
    sentences: int
    seconds: float


class Batcher:
    """Queue + worker thread; see the module docstring. Use `start()`, `submit()`, `close()`."""

    def __init__(self, translator: Any, *, max_batch_sentences: int = 64, max_wait: float = 0.005,
                 max_queue: int = 1024, on_batch: Callable[[BatchRecord], None] | None = None):
        if max_batch_sentences < 1 or max_queue < 1 or max_wait < 0:
            raise ValueError("max_batch_sentences and max_queue must be >= 1, max_wait >= 0")
        self.translator = translator
        self.max_batch_sentences = max_batch_sentences
        self.max_wait = max_wait
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._queue: deque[Job] = deque()
        self._queued = 0  # sentences in the queue
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- the caller's side

    def start(self) -> Batcher:
        self._thread = threading.Thread(target=self._loop, name="nmtkit-batcher", daemon=True)
        self._thread.start()
        return self

    def key(self, settings: dict) -> Hashable:
        """The batching key of `settings`: the complete search configuration they give. Raises
        the translator's UserError for an impossible setting (nbest above beam, ...)."""
        return self.translator.search_config(**settings)

    def submit(self, sentences: Sequence[str], settings: dict | None = None, terms: dict | None = None,
               target_lang: Sequence[str] | None = None) -> Job:
        """Queue one request; its `future` gets one list of `Translation`s per sentence, in order.
        `terms`: the request's terminology (`Job.terms`), or None; `target_lang`: a multilingual
        model's target language per sentence, or None. Requests into different languages share
        batches (the language is a tag in each source).

        Raises QueueFull when its sentences do not fit in the queue, or after `close()`.
        """
        settings = dict(settings or {})
        langs = None if target_lang is None else list(target_lang)
        return self._enqueue(Job(list(sentences), settings, self.key(settings), time.monotonic(), terms=terms or None,
                                 target_lang=langs))

    def _enqueue(self, job: Job) -> Job:
        with self._cond:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if self._queued + len(job.sentences) > self.max_queue:
                raise QueueFull(f"the queue is full ({self._queued} sentences waiting, at most {self.max_queue})")
            self._queue.append(job)
            self._queued += len(job.sentences)
            self._cond.notify()
        return job

    def submit_call(self, call: Callable[[Any], Any], sentences: int = 1) -> Job:
        """Queue `call(translator)` (an attention pass, say), run on the worker thread between
        batches and never batched with others; its `future` gets what it returns. `sentences`
        is what it counts for in the queue's limit. Raises QueueFull as `submit` does."""
        job = Job([""] * sentences, {}, object(), time.monotonic(), call=call)
        return self._enqueue(job)

    def cancel(self, job: Job) -> bool:
        """Drop a request whose client went away. True if it had not started (it is removed from
        the queue and never translated); a running one finishes, and its result is discarded."""
        if not job.future.cancel():
            return False
        with self._cond:
            try:
                self._queue.remove(job)
                self._queued -= len(job.sentences)
            except ValueError:
                pass  # the worker took it already and will skip it
            self._cond.notify()
        return True

    @property
    def queued_sentences(self) -> int:
        return self._queued

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting requests; with `drain`, translate the queued ones first, else fail them
        with QueueFull. Returns when the worker has stopped (or after `timeout` seconds)."""
        with self._cond:
            self._closing = True
            if not drain:
                while self._queue:
                    job = self._queue.popleft()
                    if job.future.set_running_or_notify_cancel():
                        job.future.set_exception(QueueFull("the server is shutting down"))
                self._queued = 0
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the worker's side

    def _take(self) -> list[Job] | None:
        """The next batch's requests (waiting for company up to max_wait), or None when closed
        and drained."""
        with self._cond:
            while True:
                if not self._queue:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                first = self._queue[0]
                company = sum(len(j.sentences) for j in self._queue if j.group == first.group)
                left = first.arrived + self.max_wait - time.monotonic()
                if self._closing or company >= self.max_batch_sentences or left <= 0:
                    break
                self._cond.wait(left)
            # The oldest request and, in arrival order, every other one with its settings that fits.
            take, keep, n = [], deque(), 0
            for j in self._queue:
                if j.group == first.group and (not take or n + len(j.sentences) <= self.max_batch_sentences):
                    take.append(j)
                    n += len(j.sentences)
                else:
                    keep.append(j)
            self._queue = keep
            self._queued -= n
        # A request cancelled since (its client went away) is dropped here, before any work.
        return [j for j in take if j.future.set_running_or_notify_cancel()]

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            if jobs:
                self._run(jobs)

    def _run(self, jobs: list[Job]) -> None:
        if jobs[0].call is not None:  # alone: its key is its own
            self._call(jobs[0])
            return
        sentences = [s for j in jobs for s in j.sentences]
        t0 = time.perf_counter()
        try:
            rows = self.translator.translate_nbest(sentences, **jobs[0].settings, **_terms(jobs), **_langs(jobs))
        except Exception as e:  # noqa: BLE001 - reaches the request(s) at fault only
            if len(jobs) > 1:  # one request's input must not fail the others: each alone
                for j in jobs:
                    self._run([j])
            else:
                jobs[0].future.set_exception(e)
            return
        except BaseException as e:
            for j in jobs:
                j.future.set_exception(e)
            raise
        seconds = time.perf_counter() - t0
        i = 0
        for j in jobs:
            j.batch_sentences = len(sentences)
            j.future.set_result(rows[i: i + len(j.sentences)])
            i += len(j.sentences)
        if self.on_batch is not None:
            self.on_batch(BatchRecord(len(jobs), len(sentences), seconds))

    def _call(self, job: Job) -> None:
        try:
            result = job.call(self.translator)
        except Exception as e:  # noqa: BLE001 - reaches its request only
            job.future.set_exception(e)
            return
        except BaseException as e:
            job.future.set_exception(e)
            raise
        job.future.set_result(result)


def _terms(jobs: list[Job]) -> dict:
    """The terminology keyword arguments of the jobs' sentences together ({}: none has any):
    each per-sentence list is the jobs' lists end to end, None for a job without it."""
    if not any(j.terms for j in jobs):
        return {}
    out: dict = {"ordered": bool(jobs[0].terms and jobs[0].terms.get("ordered"))}  # one group: the same rule
    for name in ("constraints", "avoid", "prefix"):
        if any(j.terms and j.terms.get(name) is not None for j in jobs):
            out[name] = [x for j in jobs
                         for x in ((j.terms or {}).get(name) or [None] * len(j.sentences))]
    return out


def _langs(jobs: list[Job]) -> dict:
    """`target_lang` for the jobs' sentences together ({}: none names one): each job's list end to
    end, None (the translator's own) for a job without it."""
    if not any(j.target_lang for j in jobs):
        return {}
    return {"target_lang": [x for j in jobs for x in (j.target_lang or [None] * len(j.sentences))]}
