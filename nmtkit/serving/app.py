"""The HTTP API of `nmtkit serve` (docs/serve.md): a Starlette app over a `Batcher`.

    GET  /health     200 {"status": "ok"} once the model is loaded, 503 before
    GET  /info       the model, languages, architecture, checkpoint sha256, defaults and limits
    POST /translate  {"text": ["...", ...], "beam"?, "lenpen"?, "nbest"?, "scores"?,
                      "constraints"?, "ordered"?, "avoid"?, "prefix"?, "target_lang"?}
                     -> 200 {"translations": [...]} in the request's order
    POST /attention  {"text": "...", "target"?, "layer"?, "head"?} -> one layer's cross-attention
                     (nmtkit.serving.attention; 501 for an engine without attention weights)
    GET  /           the page to try the model in a browser (nmtkit.serving.page; not with --no-ui)

Errors are `{"error": "one sentence"}`: 400 for a body that is not the JSON object described
(or an impossible setting), 408 for a body that does not arrive within --body-timeout (the
connection is then closed), 413 beyond a limit, 503 (with Retry-After) while loading or when the
queue is full, 404/405 for other paths and methods, 500 for a bug (logged).

Why Starlette without FastAPI's request models: the error statuses and bodies above are the API,
and FastAPI's validation answers 422 with its own body; a hand-written check of one small JSON
object is shorter than overriding it. `parse_request` is a plain function, tested without a
server.

Each request is logged in one line on stderr: time, method, path, status, sentences, the
sentences searched in its batch, latency; the path is escaped (nmtkit.serving.logs.printable):
`%0a` in a URL must not start a forged line. A client that goes away while its request waits is
noticed (the ASGI `http.disconnect` message): its request leaves the queue untranslated, and
others are not affected; one that goes away while sending its body is one line too (499), not a
500 with a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nmtkit.errors import UserError
from nmtkit.serving.attention import FIELDS as ATTENTION_FIELDS
from nmtkit.serving.attention import AttentionRequest, attention_call
from nmtkit.serving.batcher import Batcher, Job, QueueFull
from nmtkit.serving.logs import printable

RETRY_AFTER = "1"  # seconds: a full queue drains within about a batch's time
FIELDS = ("text", "beam", "lenpen", "nbest", "scores", "constraints", "ordered", "avoid", "prefix", "target_lang")


@dataclass(frozen=True)
class Limits:
    """What one request may ask (the server's --max-* flags)."""

    max_request_sentences: int = 128
    max_sentence_chars: int = 1000
    max_beam: int = 16

    @property
    def max_body_bytes(self) -> int:
        """A body that cannot hold an acceptable request: every character JSON-escaped as
        \\uXXXX\\uXXXX (12 bytes, a surrogate pair), plus quotes, commas and the settings."""
        return self.max_request_sentences * (12 * self.max_sentence_chars + 4) + 4096


class ClientGone(Exception):
    """The client closed its connection before its request was read."""


class RequestError(Exception):
    """An answer other than 200: HTTP status and one sentence for `{"error": ...}`."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


@dataclass
class TranslateRequest:
    sentences: list[str]
    settings: dict  # search settings of this request only (SearchConfig names)
    scores: bool = False
    terms: dict | None = None  # constraints / avoid / prefix (per sentence) and ordered: Translator's arguments
    target_lang: list[str] | None = None  # a multilingual model's target, per sentence; None: not given


def _int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(400, f'"{name}" must be an integer, got {json.dumps(v)}')
    return v


def parse_request(body: bytes, limits: Limits, defaults=None) -> TranslateRequest:
    """The request of a /translate body, or RequestError(400 / 413) saying what is wrong.

    `defaults`: the server's SearchConfig, against which a request's beam and nbest are checked
    (nbest at most the beam)."""
    obj = _json_object(body)
    sentences = _sentences(obj, limits)
    settings = _search_settings(obj, limits, defaults)
    scores = obj.get("scores", False)
    if not isinstance(scores, bool):
        raise RequestError(400, f'"scores" must be true or false, got {json.dumps(scores)}')
    return TranslateRequest(sentences, settings, scores, _terms(obj, len(sentences)),
                            _target_lang(obj.get("target_lang"), len(sentences)))


def _target_lang(v: Any, n: int) -> list[str] | None:
    """The "target_lang" field: one language for every sentence, or a list with one per sentence
    (400 otherwise); which languages the model has the translator checks (`check_target_lang`)."""
    if v is None:
        return None
    if isinstance(v, str):
        v = [v] * n
    if not isinstance(v, list) or len(v) != n or not all(isinstance(x, str) for x in v):
        raise RequestError(400, f'"target_lang" must be a language (a string) or a list with one per sentence of '
                                f'"text" ({n}), got {json.dumps(v)[:40]}')
    for i, x in enumerate(v):
        _check_string(f'"target_lang"[{i}]', x)
    return v


def check_target_lang(translator, req: TranslateRequest) -> None:
    """The request's target languages against the model's, as RequestError(400) in the
    translator's one line (a multilingual model needs one; a bilingual one takes only its own)."""
    if req.target_lang is None and not getattr(translator, "langs", None):
        return  # a bilingual model needs none
    try:
        translator.tag_ids(req.target_lang, len(req.sentences), '"target_lang"')
    except UserError as e:
        raise RequestError(400, str(e)) from None


def _terms(obj: dict, n: int) -> dict | None:
    """The terminology fields, checked for shape (400 naming the field and entry): "constraints"
    and "avoid", per sentence null or a list of strings; "prefix", per sentence null or a string;
    "ordered", true or false. What the phrases are as subwords the translator checks."""
    terms: dict = {}
    for name in ("constraints", "avoid", "prefix"):
        if obj.get(name) is None:
            continue
        v = obj[name]
        if not isinstance(v, list) or len(v) != n:
            raise RequestError(400, f'"{name}" must be a list with one entry per sentence of "text" ({n}), '
                                    f"got {json.dumps(v)[:40]}")
        for i, x in enumerate(v):
            if name == "prefix":
                ok = x is None or isinstance(x, str)
            else:
                ok = x is None or (isinstance(x, list) and all(isinstance(p, str) for p in x))
            if not ok:
                want = "null or a string" if name == "prefix" else "null or a list of strings"
                raise RequestError(400, f'"{name}"[{i}] must be {want}, got {json.dumps(x)[:40]}')
            for j, phrase in enumerate([] if x is None else [x] if name == "prefix" else x):
                _check_string(f'"{name}"[{i}]' + ("" if name == "prefix" else f"[{j}]"), phrase)
        terms[name] = v
    ordered = obj.get("ordered", False)
    if not isinstance(ordered, bool):
        raise RequestError(400, f'"ordered" must be true or false, got {json.dumps(ordered)[:40]}')
    if not terms:
        return None
    return {**terms, "ordered": ordered}


def check_terms(translator, req: TranslateRequest) -> None:
    """The request's phrases through the translator's own checks (the engine's support, an empty
    phrase, unknown subwords, a phrase that contains an avoided one), as RequestError(400)
    naming "text"[i]."""
    if req.terms is None:
        return
    t = req.terms
    try:
        translator.engine.require_terms()  # an export's runtime: one line naming it
    except UserError as e:
        raise RequestError(400, str(e)) from None
    for i in range(len(req.sentences)):
        c, a, p = (None if t.get(name) is None else t[name][i] for name in ("constraints", "avoid", "prefix"))
        try:
            translator.terms(c, a, p, t["ordered"], f'"text"[{i}]')
        except UserError as e:
            raise RequestError(400, str(e)) from None


def _json_object(body: bytes, fields: tuple[str, ...] = FIELDS) -> dict:
    """The body as a JSON object with known `fields` and "text", refused with a 400 that says
    which of these it is not (encoding, syntax, type, field)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the request body is not UTF-8 (byte {e.start})") from None

    def no_constant(name: str):
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        obj = json.loads(text, parse_constant=no_constant)
    except ValueError as e:
        raise RequestError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise RequestError(400, "the request body nests JSON too deeply") from None
    if not isinstance(obj, dict):
        raise RequestError(400, 'the request body must be a JSON object such as {"text": ["a sentence"]}')
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise RequestError(400, f"unknown field {json.dumps(unknown[0])} (known: {', '.join(fields)})")
    if "text" not in obj:
        what = "a list of sentences (strings)" if fields == FIELDS else "one sentence (a string)"
        raise RequestError(400, f'missing field "text": {what}')
    return obj


def _sentences(obj: dict, limits: Limits) -> list[str]:
    """The "text" field: a list of strings of Unicode text (400 otherwise), within the server's
    sentence count and length limits (413 otherwise)."""
    sentences = obj["text"]
    if not isinstance(sentences, list):
        got = "one string (wrap it in a list)" if isinstance(sentences, str) else json.dumps(sentences)[:40]
        raise RequestError(400, f'"text" must be a list of strings, got {got}')
    for i, s in enumerate(sentences):
        _check_string(f'"text"[{i}]', s)
    if len(sentences) > limits.max_request_sentences:
        raise RequestError(413, f"{len(sentences)} sentences in one request; at most {limits.max_request_sentences}")
    for i, s in enumerate(sentences):
        _check_length(f'"text"[{i}]', s, limits)
    return sentences


def _check_string(label: str, s: Any) -> None:
    """400 unless `s` is a string of Unicode text."""
    if not isinstance(s, str):
        raise RequestError(400, f'{label} must be a string, got {json.dumps(s)[:40]}')
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON's "\ud800" escape alone: no character
        raise RequestError(400, f'{label} holds a lone surrogate ({json.dumps(s[e.start])}), '
                                "not a Unicode character") from None


def _check_length(label: str, s: str, limits: Limits) -> None:
    """413 beyond the server's sentence length."""
    if len(s) > limits.max_sentence_chars:
        raise RequestError(413, f'{label} has {len(s)} characters; at most {limits.max_sentence_chars}')


def parse_attention_request(body: bytes, limits: Limits) -> AttentionRequest:
    """The request of a /attention body (nmtkit.serving.attention), or RequestError (400 / 413)
    saying what is wrong: the text and target are checked as /translate's sentences are."""
    obj = _json_object(body, ATTENTION_FIELDS)
    texts = {}
    for name in ("text", "target"):
        v = obj.get(name)
        if name == "target" and v is None:
            continue
        _check_string(f'"{name}"', v)
        _check_length(f'"{name}"', v, limits)
        texts[name] = v
    layer, head = obj.get("layer", -1), obj.get("head")
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise RequestError(400, f'"layer" must be an integer, got {json.dumps(layer)[:40]}')
    if head is not None and (isinstance(head, bool) or not isinstance(head, int)):
        raise RequestError(400, f'"head" must be an integer or null (the mean of the heads), got {json.dumps(head)[:40]}')
    lang = obj.get("target_lang")
    if lang is not None:
        _check_string('"target_lang"', lang)
    return AttentionRequest(texts["text"], texts.get("target"), layer, head, lang)


def _search_settings(obj: dict, limits: Limits, defaults) -> dict:
    """The beam, nbest and lenpen this request asks for (SearchConfig names), refused when the
    server could not search with them: beam beyond --max-beam (413), nbest above the beam (400)."""
    settings: dict = {}
    if "beam" in obj:
        settings["beam"] = _int("beam", obj["beam"])
        if settings["beam"] > limits.max_beam:
            raise RequestError(413, f'"beam" {settings["beam"]} exceeds this server\'s limit of {limits.max_beam}')
    if "nbest" in obj:
        settings["nbest"] = _int("nbest", obj["nbest"])
    for name in ("beam", "nbest"):
        if settings.get(name, 1) < 1:
            raise RequestError(400, f'"{name}" must be at least 1, got {settings[name]}')
    if defaults is not None:
        beam, nbest = settings.get("beam", defaults.beam), settings.get("nbest", defaults.nbest)
        if nbest > beam:
            what = "beam" if "beam" in settings else "server's beam"
            raise RequestError(400, f'"nbest" {nbest} exceeds the {what} {beam}')
    if "lenpen" in obj:
        settings["lenpen"] = _lenpen(obj["lenpen"])
    return settings


def _lenpen(v: Any) -> float:
    """A finite number as a float; JSON allows integers too large for a float, refused like
    any other non-number."""
    try:
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        raise RequestError(400, f'"lenpen" must be a number, got {json.dumps(v)[:40]}')
    return float(v)


def response_body(rows: list, nbest: int, scores: bool) -> dict:
    """`{"translations": [...]}` (and `"scores"`): one entry per sentence, a string, or with
    nbest > 1 a list of up to nbest strings, best first."""
    if nbest == 1:
        out = {"translations": [row[0].text for row in rows]}
        if scores:
            out["scores"] = [row[0].score for row in rows]
    else:
        out = {"translations": [[t.text for t in row] for row in rows]}
        if scores:
            out["scores"] = [[t.score for t in row] for row in rows]
    return out


@dataclass
class ServerState:
    """What the handlers share: the batcher once the model is loaded, and `/info`'s answer."""

    limits: Limits
    body_timeout: float = 30.0  # seconds a request's body may take to arrive (--body-timeout)
    batcher: Batcher | None = None
    info: dict = field(default_factory=dict)
    ui: bool = True  # GET / serves the page (nmtkit.serving.page); --no-ui turns it off
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))

    @property
    def ready(self) -> bool:
        return self.batcher is not None


def _error(status: int, message: str, headers: dict | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _read_body(request, limit: int, timeout: float) -> bytes:
    """The body, refused with 413 as soon as it exceeds `limit` bytes, and with 408 (closing the
    connection) when it is not complete within `timeout` seconds; ClientGone if the client
    disconnects first."""
    from starlette.requests import ClientDisconnect

    size = request.headers.get("content-length")
    if size is not None and size.isascii() and size.isdigit() and int(size) > limit:  # "²" is a digit too
        raise RequestError(413, f"the request body has {size} bytes; at most {limit}")

    async def read() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, f"the request body exceeds {limit} bytes")
        return bytes(body)

    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {timeout:g} s",
                           {"Connection": "close"}) from None
    except ClientDisconnect:
        raise ClientGone() from None


async def _disconnected(receive) -> None:
    """Returns when the client goes away (after the body was read, ASGI servers answer
    `receive()` with http.disconnect then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def build_app(state: ServerState, lifespan=None):
    """The Starlette app of `state`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(request):
        if not state.ready:
            return _error(503, "the model is still loading", {"Retry-After": RETRY_AFTER})
        return JSONResponse({"status": "ok"})

    async def info(request):
        if not state.ready:
            return _error(503, "the model is still loading", {"Retry-After": RETRY_AFTER})
        return JSONResponse(state.info)

    async def translate(request):
        scope_state = request.scope.setdefault("nmtkit", {})
        try:
            if not state.ready:
                raise RequestError(503, "the model is still loading", {"Retry-After": RETRY_AFTER})
            return await _translate(state, request, scope_state)
        except RequestError as e:
            return _error(e.status, e.message, e.headers)
        except ClientGone:
            scope_state["gone"] = "while sending its request"
            return JSONResponse({"error": "the client went away"}, status_code=499)

    async def http_error(request, exc):
        paths = ("/, " if state.ui else "") + "/health, /info, /translate and /attention"
        msg = {404: f"no such path {request.url.path} (the API has {paths})",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
        return _error(exc.status_code, msg, getattr(exc, "headers", None))

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/translate", translate, methods=["POST"]),
        Route("/attention", functools.partial(_attention, state), methods=["POST"]),
    ] + ([Route("/", _home, methods=["GET"])] if state.ui else [])
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: _server_error})
    # "/translate/" is another path (404 and its JSON sentence), not a redirect with an empty body
    app.router.redirect_slashes = False
    return RequestLog(app, state.log)


async def _home(request):
    """GET /: the page (nmtkit.serving.page)."""
    from starlette.responses import Response

    from nmtkit.serving.page import page

    p = page()
    return Response(p.body, media_type="text/html; charset=utf-8", headers=p.headers)


async def _server_error(request, exc):
    return _error(500, f"internal error: {type(exc).__name__}: {exc}")


async def _attention(state: ServerState, request):
    """POST /attention (nmtkit.serving.attention)."""
    from starlette.responses import JSONResponse

    scope_state = request.scope.setdefault("nmtkit", {})
    try:
        if not state.ready:
            raise RequestError(503, "the model is still loading", {"Retry-After": RETRY_AFTER})
        body = await _read_body(request, state.limits.max_body_bytes, state.body_timeout)
        req = parse_attention_request(body, state.limits)
        scope_state["sentences"] = 1
        if not state.info.get("attention"):
            raise RequestError(501, f"this model runs on {state.info['model']['runtime']}, "
                                    "which gives no attention weights; serve the nmtkit checkpoint")
        try:
            job = state.batcher.submit_call(attention_call(req))
        except QueueFull as e:
            raise RequestError(503, str(e), {"Retry-After": RETRY_AFTER}) from None
        try:
            answer = await _wait(request, state.batcher, job, scope_state)
        except UserError as e:  # an empty sentence, a layer or head out of range, ...
            raise RequestError(400, str(e)) from None
        if answer is None:
            return JSONResponse({"error": "the client went away"}, status_code=499)
        return JSONResponse(answer)
    except RequestError as e:
        return _error(e.status, e.message, e.headers)
    except ClientGone:
        scope_state["gone"] = "while sending its request"
        return JSONResponse({"error": "the client went away"}, status_code=499)

async def _translate(state: ServerState, request, scope_state: dict):
    """One /translate request on a ready server: read and check it, queue it, await its rows."""
    from starlette.responses import JSONResponse

    body = await _read_body(request, state.limits.max_body_bytes, state.body_timeout)
    req = parse_request(body, state.limits, state.batcher.translator.search)
    scope_state["sentences"] = len(req.sentences)
    batcher = state.batcher
    check_terms(batcher.translator, req)
    check_target_lang(batcher.translator, req)
    try:
        job = batcher.submit(req.sentences, req.settings, req.terms, req.target_lang)
    except UserError as e:  # an impossible combination: nbest above beam, ...
        raise RequestError(400, str(e)) from None
    except QueueFull as e:
        raise RequestError(503, str(e), {"Retry-After": RETRY_AFTER}) from None
    try:
        rows = await _wait(request, batcher, job, scope_state)
    except UserError as e:  # terms the search cannot honour (the beam, the output limit)
        raise RequestError(400, str(e)) from None
    if rows is None:
        return JSONResponse({"error": "the client went away"}, status_code=499)
    scope_state["batch"] = job.batch_sentences
    return JSONResponse(response_body(rows, job.key.nbest, req.scores))


async def _wait(request, batcher: Batcher, job: Job, scope_state: dict):
    """The job's rows, or None when the client went away first (the job is then dropped)."""
    result = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if result in done:
        return result.result()
    scope_state["gone"] = "dropped unstarted" if batcher.cancel(job) else "result discarded"
    result.cancel()
    return None


class RequestLog:
    """ASGI middleware: one stderr line per HTTP request (time, request, status, sentences,
    batch, latency)."""

    def __init__(self, app, log: Callable[[str], None]):
        self.app, self.log = app, log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = [0]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            ms = (time.perf_counter() - t0) * 1000
            s = scope.get("nmtkit", {})
            parts = [datetime.now().isoformat(sep=" ", timespec="milliseconds"), scope["method"],
                     printable(scope["path"]), str(status[0] or 500)]
            if "sentences" in s:
                parts.append(f"sentences={s['sentences']}")
            if "batch" in s:
                parts.append(f"batch={s['batch']}")
            parts.append(f"latency_ms={ms:.1f}")
            if "gone" in s and "dropped" in s:  # the server closed the connection (nmtkit.serving.protocol)
                parts.append(f"dropped: {s['dropped']} ({s['gone']})")
            elif "gone" in s:
                parts.append(f"client went away ({s['gone']})")
            self.log(printable(" ".join(parts)))
