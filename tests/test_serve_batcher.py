"""The dynamic batcher (nmtkit/serving/batcher.py) and the request parser of `nmtkit serve`,
without sockets.

The translator is the real `nmtkit.Translator` on test_generate.py's tiny model, wrapped to
record the calls the batcher makes (and, where a test needs the worker busy, to hold a call
until the test lets it go). The reference for every result is the same translator on the
sentence alone.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from nmtkit.errors import UserError
from nmtkit.serving.app import Limits, RequestError, parse_request, response_body
from nmtkit.serving.batcher import Batcher, QueueFull
from tests.test_generate import DE, TEST_SRC, setup  # noqa: F401 - fixture


def sentence_pool(n: int, seed: int = 3) -> list[str]:
    """test_generate's sentences (with an empty and a blank one) and random ones of its words."""
    rng = random.Random(seed)
    out = list(TEST_SRC)
    while len(out) < n:
        out.append(" ".join(rng.choice(DE) for _ in range(rng.randint(1, 8))))
    return out


class Recording:
    """A Translator that records each translate_nbest call; `hold` makes calls wait for it."""

    def __init__(self, tr, fail_on: str | None = None):
        self.tr, self.search, self.fail_on = tr, tr.search, fail_on
        self.calls: list[tuple[list[str], dict]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def search_config(self, **settings):
        return self.tr.search_config(**settings)

    def translate_nbest(self, sentences, **settings):
        self.calls.append((list(sentences), dict(settings)))
        self.entered.set()
        self.hold.wait(30)
        if self.fail_on is not None and self.fail_on in sentences:
            raise RuntimeError(f"cannot translate {self.fail_on!r}")
        return self.tr.translate_nbest(sentences, **settings)


@pytest.fixture(scope="module")
def translator(setup):  # noqa: F811
    from nmtkit import Translator

    data, ckpt, _, _ = setup
    return Translator.load(ckpt, data, threads=1, max_len_b=6, warn=lambda msg: None)


def alone(tr, sentence: str, **settings) -> list[tuple[str, float]]:
    return [(t.text, t.score) for t in tr.translate_nbest([sentence], **settings)[0]]


def same(rows, want) -> bool:
    got = [[(t.text, t.score) for t in row] for row in rows]
    return len(got) == len(want) and all(
        len(g) == len(w) and all(a[0] == b[0] and a[1] == pytest.approx(b[1], abs=1e-5) for a, b in zip(g, w))
        for g, w in zip(got, want))


def busy(rec: Recording, batcher: Batcher):
    """Occupy the worker with a one-sentence job held in translate_nbest; returns that job."""
    rec.hold.clear()
    job = batcher.submit(["Kind"])
    assert rec.entered.wait(10)
    return job


# --------------------------------------------------------------------------------- batching


def test_concurrent_requests_are_searched_together_and_each_equals_its_sentence_alone(translator):
    rec = Recording(translator)
    pool = sentence_pool(30)
    rng = random.Random(1)
    groups = [pool[i:i + n] for i, n in zip(range(0, 30, 5), (5, 1, 4, 5, 2, 3))]
    total = sum(map(len, groups))
    b = Batcher(rec, max_batch_sentences=total, max_wait=30.0).start()
    jobs = [None] * len(groups)
    start = threading.Barrier(len(groups))

    def client(i):
        start.wait()
        time.sleep(rng.random() * 0.01)
        jobs[i] = b.submit(groups[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(groups))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [j.future.result(30) for j in jobs]
    # company reached max_batch_sentences: no waiting for max_wait (30 s)
    assert time.monotonic() - t0 < 20
    assert len(rec.calls) == 1 and sorted(rec.calls[0][0]) == sorted(s for g in groups for s in g)
    for g, r, j in zip(groups, rows, jobs):
        assert same(r, [alone(translator, s) for s in g])
        assert j.batch_sentences == total
    assert any(t.text for r in rows for row in r for t in row)  # guard: the model does produce words
    b.close()


def test_batches_keep_settings_apart_and_respect_max_batch_sentences(translator):
    rec = Recording(translator)
    b = Batcher(rec, max_batch_sentences=5, max_wait=0.0).start()
    first = busy(rec, b)
    pool = sentence_pool(20)
    A = b.submit(pool[7:10])
    B = b.submit(pool[10:13], {"beam": 2})
    C = b.submit(pool[13:15])
    D = b.submit(pool[0:7])  # more than max_batch_sentences: a batch of its own
    E = b.submit(pool[15:16], {"beam": 4})  # the default spelled out: same settings as A, C
    assert b.queued_sentences == 3 + 3 + 2 + 7 + 1
    rec.hold.set()
    for j in (first, A, B, C, D, E):
        j.future.result(30)
    assert [c[0] for c in rec.calls] == [["Kind"], pool[7:10] + pool[13:15], pool[10:13], pool[0:7], pool[15:16]]
    assert rec.calls[2][1] == {"beam": 2}
    assert same(B.future.result(), [alone(translator, s, beam=2) for s in pool[10:13]])
    assert same(D.future.result(), [alone(translator, s) for s in pool[0:7]])
    assert b.queued_sentences == 0
    b.close()


def test_impossible_settings_are_refused_at_submit(translator):
    b = Batcher(translator)
    with pytest.raises(UserError, match="--nbest 5 exceeds the --beam 4"):
        b.submit(["Kind"], {"nbest": 5})
    with pytest.raises(UserError, match="unknown search setting 'bean'"):
        b.submit(["Kind"], {"bean": 2})


def test_queue_full_then_cancel_frees_the_queue_and_the_cancelled_request_is_never_translated(translator):
    rec = Recording(translator)
    b = Batcher(rec, max_batch_sentences=64, max_wait=0.0, max_queue=4).start()
    first = busy(rec, b)
    A = b.submit(["der Hund läuft", "die Straße", "Kind"])
    with pytest.raises(QueueFull, match=r"the queue is full \(3 sentences waiting, at most 4\)"):
        b.submit(["Haus", "Baum"])
    assert b.cancel(A) and A.future.cancelled() and b.queued_sentences == 0
    B = b.submit(["Haus", "Baum"])
    assert not b.cancel(first)  # running: it finishes, its result is there (the server discards it)
    rec.hold.set()
    assert same(B.future.result(30), [alone(translator, s) for s in ["Haus", "Baum"]])
    assert first.future.result(30)
    assert [c[0] for c in rec.calls] == [["Kind"], ["Haus", "Baum"]]
    b.close()


def test_a_request_that_fails_its_batch_fails_alone(translator):
    rec = Recording(translator, fail_on="Baum")
    b = Batcher(rec, max_batch_sentences=64, max_wait=0.0).start()
    first = busy(rec, b)
    A, B, C = b.submit(["Haus"]), b.submit(["Baum", "Kind"]), b.submit(["die Straße"])
    D = b.submit(["Baum"], {"beam": 2})
    rec.hold.set()
    for j in (B, D):
        with pytest.raises(RuntimeError, match="cannot translate 'Baum'"):
            j.future.result(30)
    assert same(A.future.result(30), [alone(translator, "Haus")])
    assert same(C.future.result(30), [alone(translator, "die Straße")])
    assert first.future.result(30)
    # the batch of A, B, C failed, then each was translated alone; D (other settings) alone
    assert [c[0] for c in rec.calls] == [["Kind"], ["Haus", "Baum", "Kind", "die Straße"], ["Haus"],
                                         ["Baum", "Kind"], ["die Straße"], ["Baum"]]
    b.close()


@pytest.mark.parametrize("drain", [True, False])
def test_close_drains_or_fails_the_queue_and_refuses_new_requests(translator, drain):
    rec = Recording(translator)
    b = Batcher(rec, max_batch_sentences=64, max_wait=0.0).start()
    first = busy(rec, b)
    A = b.submit(["Haus", ""])
    closer = threading.Thread(target=b.close, args=(drain,))
    closer.start()
    time.sleep(0.05)
    with pytest.raises(QueueFull, match="shutting down"):
        b.submit(["Kind"])
    rec.hold.set()
    closer.join(30)
    assert not closer.is_alive() and first.future.result(0)
    if drain:
        assert same(A.future.result(0), [alone(translator, "Haus"), [("", 0.0)]])
    else:
        with pytest.raises(QueueFull, match="shutting down"):
            A.future.result(0)


# ----------------------------------------------------------------------------- parse_request


LIMITS = Limits(max_request_sentences=3, max_sentence_chars=10, max_beam=8)


@pytest.mark.parametrize("body,status,message", [
    (b'{"text": ["a", ', 400, "the request body is not valid JSON: Expecting value: line 1 column 16"),
    (b'\xff{"text": []}', 400, "the request body is not UTF-8 (byte 0)"),
    (b'["a"]', 400, 'the request body must be a JSON object such as {"text": ["a sentence"]}'),
    (b'{"txt": ["a"]}', 400, 'unknown field "txt" (known: text, beam, lenpen, nbest, scores, constraints, ordered, avoid, prefix, target_lang)'),
    (b'{"beam": 2}', 400, 'missing field "text": a list of sentences (strings)'),
    (b'{"text": "a"}', 400, '"text" must be a list of strings, got one string (wrap it in a list)'),
    (b'{"text": {"a": 1}}', 400, '"text" must be a list of strings, got {"a": 1}'),
    (b'{"text": ["a", 3]}', 400, '"text"[1] must be a string, got 3'),
    (b'{"text": ["a"], "beam": "4"}', 400, '"beam" must be an integer, got "4"'),
    (b'{"text": ["a"], "beam": 2.0}', 400, '"beam" must be an integer, got 2.0'),
    (b'{"text": ["a"], "beam": true}', 400, '"beam" must be an integer, got true'),
    (b'{"text": ["a"], "beam": 0}', 400, '"beam" must be at least 1, got 0'),
    (b'{"text": ["a"], "nbest": 0}', 400, '"nbest" must be at least 1, got 0'),
    (b'{"text": ["a"], "nbest": 5}', 400, '"nbest" 5 exceeds the server\'s beam 4'),
    (b'{"text": ["a"], "nbest": 3, "beam": 2}', 400, '"nbest" 3 exceeds the beam 2'),
    (b'{"text": ["a"], "lenpen": NaN}', 400, "NaN is not a number JSON allows"),
    (b'{"text": ["a"], "lenpen": "0.6"}', 400, '"lenpen" must be a number, got "0.6"'),
    (b'{"text": ["a"], "lenpen": 1e999}', 400, '"lenpen" must be a number, got Infinity'),
    (b'{"text": ["a"], "lenpen": 1' + b"0" * 400 + b'}', 400, '"lenpen" must be a number, got 1000000000'),
    (b'{"text": ["ok", "a\\ud800b"]}', 400, '"text"[1] holds a lone surrogate ("\\ud800"), not a Unicode character'),
    (b'{"text": ' + b"[" * 100000 + b"]" * 100000 + b'}', 400, "the request body nests JSON too deeply"),
    (b'{"text": ["a"], "scores": 1}', 400, '"scores" must be true or false, got 1'),
    (b'{"text": ["a", "b", "c", "d"]}', 413, "4 sentences in one request; at most 3"),
    (b'{"text": ["a", "12345678901"]}', 413, '"text"[1] has 11 characters; at most 10'),
    (b'{"text": ["a"], "beam": 9}', 413, "\"beam\" 9 exceeds this server's limit of 8"),
])
def test_parse_request_refuses_with_the_status_and_one_clear_sentence(body, status, message):
    from nmtkit.search.beam import SearchConfig

    with pytest.raises(RequestError) as e:
        parse_request(body, LIMITS, SearchConfig())
    assert (e.value.status, e.value.message) == (status, message) or (
        e.value.status == status and message in e.value.message), e.value.message


def test_parse_request_accepts_the_documented_fields():
    from nmtkit.search.beam import SearchConfig

    r = parse_request('{"text": ["Ein Hund.", "", "ü😀"], "beam": 8, "nbest": 2, "lenpen": 1, "scores": true}'
                      .encode(), LIMITS, SearchConfig())
    assert r.sentences == ["Ein Hund.", "", "ü😀"] and r.scores is True
    assert r.settings == {"beam": 8, "nbest": 2, "lenpen": 1.0} and isinstance(r.settings["lenpen"], float)
    r = parse_request(b'{"text": []}', LIMITS, SearchConfig())
    assert (r.sentences, r.settings, r.scores) == ([], {}, False)
    # the character limit counts characters, not bytes (and a surrogate pair is one character)
    r = parse_request(('{"text": ["' + "😀" * 10 + '", "\\ud83d\\ude00"]}').encode(), LIMITS, SearchConfig())
    assert r.sentences == ["😀" * 10, "😀"]


def test_max_body_bytes_admits_every_acceptable_request():
    from nmtkit.search.beam import SearchConfig

    import json

    # the longest acceptable body: every character escaped as a surrogate pair
    body = json.dumps({"text": ["😀" * 10] * 3, "beam": 8, "nbest": 8, "lenpen": -1.2345678901234567e-300,
                       "scores": False}, ensure_ascii=True).encode()
    assert len(body) <= LIMITS.max_body_bytes
    parse_request(body, LIMITS, SearchConfig(beam=8))


def test_response_body_shapes(translator):
    rows = translator.translate_nbest(["der Hund läuft", ""], nbest=2)
    assert response_body(rows, 1, False) == {"translations": [rows[0][0].text, ""]}
    assert response_body(rows, 1, True)["scores"] == [rows[0][0].score, 0.0]
    two = response_body(rows, 2, True)
    assert two["translations"] == [[t.text for t in rows[0]], [""]] and len(rows[0]) == 2
    assert two["scores"] == [[t.score for t in rows[0]], [0.0]]
