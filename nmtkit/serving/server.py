"""What `nmtkit serve` runs: bind, load the model in the background, serve, stop gracefully.

Order of events (docs/serve.md):
1. the flags are checked and the device resolved (a mistake is one line and exit 2, before
   anything listens); the connection limit is set below the open-file limit
   (`connection_limit`); the socket is bound (a port in use is one line naming --host/--port),
   with a warning when the address is reachable from beyond this machine's loopback;
2. uvicorn serves at once: /health answers 503 while a thread loads the model
   (`Translator.load`, once), then 200; a loading error stops the server with exit 2;
   connections are uvicorn's h11 protocol with nmtkit's limits on slow clients and on the
   number of connections (nmtkit.serving.protocol), on asyncio's event loop;
3. requests go through the `Batcher` (one worker thread runs every search);
4. SIGTERM or SIGINT: uvicorn stops accepting connections; connections without a complete
   request are closed (an upload still arriving is dropped); the requests received are
   searched and answered, for at most --graceful-timeout seconds, after which those still
   unanswered are dropped; then the worker stops and the process exits: 0 if every request was
   answered, 3 if some were dropped (uvicorn alone would wait for ever and re-raise the signal,
   ending with status -15/-2). A second SIGTERM or SIGINT drops them at once (exit 3).

Logging: every line goes through `nmtkit.serving.logs.printable` (no raw control characters);
uvicorn's own warnings go to the same log; what a flood can repeat (refused connections, slow
clients, `accept()` failing with "Too many open files") is one line at most every 10 s per kind.

`Server` is also the in-process handle that tests use (`bind()`, `run()` in a thread, `stop()`),
with a `load` function of their own when they need to hold the loading back.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmtkit.errors import UserError, count
from nmtkit.serving.app import Limits, ServerState, build_app
from nmtkit.serving.batcher import Batcher
from nmtkit.serving.logs import LogHandler, Notes, printable
from nmtkit.serving.options import ServeOptions

EXIT_DROPPED = 3  # the exit status after a shutdown that dropped requests (docs/serve.md)
AUTO_MAX_CONNECTIONS = 1000  # --max-connections' default at most
FILES_KEPT = 64  # open files kept for the rest of the process (model files, the loop, stdio, ...) at least


def require_extra() -> None:
    """The `serve` extra's packages, or a one-line UserError saying how to install them."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UserError(f"nmtkit serve needs the serve extra ({e.name} is missing): pip install -e '.[serve]' in the nmtkit checkout") from None


def path_sha256(path: str) -> str:
    """sha256 of a checkpoint file; of a directory (an export), over its files' names and sha256s."""
    from nmtkit.data.textfiles import file_sha256

    p = Path(path)
    if p.is_file():
        return file_sha256(p)
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        h.update(f"{f.relative_to(p).as_posix()}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def load_translator(opts: ServeOptions, warn: Callable[[str], None], prepared=None) -> Any:
    """The translator `nmtkit serve` uses: `Translator.open` with generate's model flags, the
    search flags as defaults, and the batch limits. The model as `serve` already described it
    (`opts.source`) and `prepared`, its engine's set-up: nothing is read or checked twice."""
    from nmtkit.generation.model_flags import model_source, runtime_options
    from nmtkit.generation.translator import Translator

    return Translator.open(model_source(opts), runtime_options(opts), prepared=prepared,
                           batch_size=opts.max_batch_sentences, max_tokens=opts.max_batch_tokens, warn=warn,
                           search=opts.search, shortlist=opts.shortlist)


def model_name(path: str) -> str:
    """What /info shows of a --path: its file or directory name, not where it is on disk."""
    return os.path.basename(os.path.normpath(path))


def connection_limit(requested: int | None) -> int:
    """--max-connections: the one asked for (raising the open-file soft limit to make room for
    it, when the hard limit allows), or by default the open-file limit less an eighth (at least
    FILES_KEPT), at most AUTO_MAX_CONNECTIONS. So accepting a connection never fails for lack
    of file descriptors."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return requested or AUTO_MAX_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if requested is None:
        if soft == unlimited:
            return AUTO_MAX_CONNECTIONS
        return max(1, min(AUTO_MAX_CONNECTIONS, soft - max(FILES_KEPT, soft // 8)))
    need = requested + max(FILES_KEPT, requested // 8)
    if soft != unlimited and need > soft:
        if hard != unlimited and need > hard:
            raise UserError(f"--max-connections {requested} needs about {need} open files; this process may open "
                            f"at most {hard} (ulimit -Hn): ask for at most {max(1, hard - max(FILES_KEPT, hard // 9))}")
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        except (ValueError, OSError) as e:
            raise UserError(f"--max-connections {requested}: cannot raise the open-file limit to {need}: {e}") from None
    return requested


def open_file_limit() -> str:
    """The open-file soft limit, for messages."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    except ImportError:
        return "unknown"


def beyond_loopback(address: str) -> bool:
    """Whether a socket bound to `address` can be reached from other machines."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return True
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_loopback


def _shortlist_info(shortlist) -> dict | None:
    return None if shortlist is None else {"file": os.path.basename(shortlist.path), "sha256": shortlist.sha256}


def model_info(tr: Any, opts: ServeOptions, limits: Limits, sha256s: list[str]) -> dict:
    """GET /info's answer (the checkpoints by name: where they are on disk is the operator's)."""
    from nmtkit import __version__
    from nmtkit.search.config import SEARCH_SETTINGS

    return {
        "nmtkit": __version__,
        "model": {"paths": [model_name(p) for p in opts.paths], "sha256": sha256s, "ema": opts.ema,
                  "architecture": tr.engine.architectures(), "runtime": tr.engine.name},
        "source_lang": tr.src_lang, "target_lang": tr.tgt_lang, "task": tr.task,
        "languages": list(getattr(tr, "langs", [])),  # a multilingual model's (each request's "target_lang"); [] when bilingual
        "device": str(tr.device), "precision": opts.precision,
        "data": data_description(getattr(tr, "model_source", None)),
        "attention": bool(getattr(tr.engine, "teacher_forcing", False)),
        "terminology": bool(getattr(tr.engine, "constraints", False)),
        # the lexical shortlist in use (its file name and sha256), or None
        "shortlist": _shortlist_info(getattr(tr.engine, "shortlist", None)),
        "defaults": {name: getattr(tr.search, name) for name in SEARCH_SETTINGS},
        "limits": {"max_request_sentences": limits.max_request_sentences,
                   "max_sentence_chars": limits.max_sentence_chars, "max_beam": limits.max_beam,
                   "max_body_bytes": limits.max_body_bytes},
        "batching": {"max_batch_sentences": opts.max_batch_sentences, "max_batch_tokens": opts.max_batch_tokens,
                     "max_wait_ms": opts.max_wait_ms, "max_queue": opts.max_queue},
    }


def data_description(source: Any) -> str:
    """What /info says of the training data: the data directory's name (or the export's) and its
    training pairs when the manifest counts them, e.g. "data-bin (29,000 training pairs)"."""
    manifest = getattr(source, "manifest", None) or {}
    pairs = (manifest.get("splits") or {}).get("train", {}).get("sentences")
    name = model_name(source.folder) if getattr(source, "folder", None) else "not known"
    return f"{name} ({pairs:,} training pairs)" if isinstance(pairs, int) else name


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Server:
    """One `nmtkit serve` process's server (see the module docstring)."""

    def __init__(self, opts: ServeOptions, *, load: Callable[[ServeOptions, Callable[[str], None]], Any] | None = None,
                 log: Callable[[str], None] = _log_stderr):
        require_extra()
        self.opts = opts
        self.load = load or load_translator
        self.log = lambda line: log(printable(line))
        self.limits = Limits(opts.max_request_sentences, opts.max_sentence_chars, opts.max_beam)
        self.state = ServerState(self.limits, body_timeout=opts.body_timeout, ui=not opts.no_ui, log=self.log)
        self.max_connections = connection_limit(opts.max_connections)
        self.notes = Notes(self.log)
        self.error: BaseException | None = None
        self.sock: socket.socket | None = None
        self._uvicorn = None
        self._loader: threading.Thread | None = None
        self.dropped = 0  # requests the shutdown dropped unanswered
        self._stop_batcher = (True, None)  # (drain, timeout) for the batcher when the server stops

    # -- set-up

    def bind(self) -> int:
        """Bind and listen on --host/--port; the port (the chosen one for --port 0)."""
        host, port = self.opts.host, self.opts.port
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise UserError(f"--host {host}: {e.strerror}") from None
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            sock.close()
            raise UserError(f"--host {host} --port {port}: cannot listen there: {e.strerror}") from None
        sock.listen(2048)
        self.sock = sock
        return sock.getsockname()[1]

    def _load(self) -> None:
        """The loading thread: translator, batcher, /info; or the error that stops the server."""
        try:
            t0 = time.perf_counter()
            tr = self.load(self.opts, lambda msg: self.log(f"nmtkit serve: warning: {msg}"))
            sha = [path_sha256(p) for p in self.opts.paths]
            self.state.info = model_info(tr, self.opts, self.limits, sha)
            self.state.batcher = Batcher(tr, max_batch_sentences=self.opts.max_batch_sentences,
                                         max_wait=self.opts.max_wait_ms / 1000,
                                         max_queue=self.opts.max_queue).start()
            self.log(f"nmtkit serve: ready: {tr.src_lang}->{tr.tgt_lang} ({tr.task}), {len(self.opts.paths)} "
                     f"model(s) on {tr.device}, beam {tr.search.beam}; loaded in {time.perf_counter() - t0:.1f}s")
        except BaseException as e:  # noqa: BLE001 - reported by run() after the server stops
            self.error = e
            self.log(f"nmtkit serve: loading failed: {e}")
            if self._uvicorn is not None:
                self._uvicorn.should_exit = True

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        self._loader = threading.Thread(target=self._load, name="nmtkit-load", daemon=True)
        self._loader.start()
        yield
        # Every request in flight has been answered or dropped (_Uvicorn.shutdown): stop the worker,
        # within what is left of --graceful-timeout.
        batcher = self.state.batcher
        if batcher is not None:
            import asyncio

            await asyncio.to_thread(batcher.close, *self._stop_batcher)

    # -- running

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or `stop()`); raise the loading error, if any. Returns the
        exit status: 0, or EXIT_DROPPED when the shutdown dropped requests unanswered."""
        import uvicorn

        from nmtkit.serving.protocol import MAX_HEADER_BYTES, Guard, protocol_class

        if self.sock is None:
            self.bind()
        app = build_app(self.state, lifespan=self._lifespan)
        self.guard = guard = Guard(self.max_connections, self.opts.header_timeout, self.opts.body_timeout, self.notes)
        # uvicorn's settings where it has them; its limit_concurrency is not used: it refuses
        # requests, not connections (nmtkit.serving.protocol bounds the connections); the listen
        # backlog is bind()'s
        config = uvicorn.Config(app, http=protocol_class(guard), loop="asyncio", log_config=None,
                                log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=5,
                                timeout_graceful_shutdown=self.opts.graceful_timeout,
                                h11_max_incomplete_event_size=MAX_HEADER_BYTES)
        self._uvicorn = _Uvicorn(config, self)
        host, port = self.sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        self.log(f"nmtkit serve: listening on http://{shown}:{port} (pid {os.getpid()}); loading the model")
        if beyond_loopback(host):
            self.log(f"nmtkit serve: warning: --host {self.opts.host} listens beyond loopback: anyone who can reach "
                     f"port {port} can use this server, which has no authentication or TLS (put a reverse proxy in "
                     f"front of it)")
        with _uvicorn_logs(LogHandler(self.log, self.notes)):
            self._uvicorn.run(sockets=[self.sock])
        self.notes.flush(everything=True)
        self.log("nmtkit serve: stopped" + (f" ({count(self.dropped, 'request')} dropped unanswered)"
                                            if self.dropped else ""))
        if self.error is not None:
            raise self.error
        return EXIT_DROPPED if self.dropped else 0

    def stop(self) -> None:
        """Ask the server to stop gracefully (as SIGTERM does); returns at once."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True


_log_lock = threading.Lock()
_log_handlers: list[logging.Handler] = []  # those of the servers running in this process (tests run several)
_log_propagate = [True]  # the "uvicorn" logger's own setting, put back when the last one stops


@contextlib.contextmanager
def _uvicorn_logs(handler: logging.Handler):
    """uvicorn's log records go to `handler`, and not on to the root logger's (which would print
    them again), while a server runs."""
    logger = logging.getLogger("uvicorn")
    with _log_lock:
        if not _log_handlers:
            _log_propagate[0] = logger.propagate
        _log_handlers.append(handler)
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        with _log_lock:
            _log_handlers.remove(handler)
            logger.removeHandler(handler)
            if not _log_handlers:
                logger.propagate = _log_propagate[0]


@contextlib.contextmanager
def _capture_signals(self):
    """uvicorn.Server.capture_signals, without re-raising the signal at the end (exit 0 after a
    graceful stop); only the main thread can set handlers (tests run servers in threads)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = (signal.SIGINT, signal.SIGTERM)
    original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in original.items():
            signal.signal(sig, handler)


def _handle_exit(self, sig, frame) -> None:
    """The first SIGTERM/SIGINT stops accepting and finishes what is in flight; the second drops it."""
    name = signal.Signals(sig).name
    grace = self.owner.opts.graceful_timeout
    if not self.should_exit:
        self.owner.log(f"nmtkit serve: {name}: not accepting connections; finishing the requests in flight "
                       f"(at most {grace:g} s, --graceful-timeout; {name} again to drop them)")
        self.should_exit = True
    elif not self.force_exit:
        self.owner.log(f"nmtkit serve: {name} again: dropping the requests in flight")
        self.force_exit = True


async def _startup(self, sockets=None) -> None:
    """uvicorn's, with nmtkit's accept loop (nmtkit.serving.protocol) instead of loop.create_server's."""
    import asyncio

    from uvicorn.config import STARTUP_FAILURE

    from nmtkit.serving.protocol import accept_connections

    await self.lifespan.startup()
    if self.lifespan.should_exit:
        sys.exit(STARTUP_FAILURE)
    config, loop = self.config, asyncio.get_running_loop()

    def make_protocol():
        return config.http_protocol_class(config=config, server_state=self.server_state,
                                          app_state=self.lifespan.state, _loop=loop)

    self.servers = []
    self.acceptors = [loop.create_task(accept_connections(sock, make_protocol, self.owner.guard,
                                                          open_file_limit())) for sock in sockets]
    self.started = True


async def _on_tick(self, counter: int) -> bool:
    """uvicorn's tick (every 0.1 s), after flushing the pending log notes. uvicorn.Server's own
    is reached through the class, not by importing uvicorn again on every tick."""
    self.owner.notes.flush()
    return await super(type(self), self).on_tick(counter)


async def _shutdown(self, sockets=None) -> None:
    """Close idle connections and stalled uploads at once, answer the requests received, drop
    what is left after --graceful-timeout (or a second signal), then stop the batcher."""
    import asyncio

    owner, grace = self.owner, self.owner.opts.graceful_timeout
    deadline = time.monotonic() + grace
    for acceptor in self.acceptors:
        acceptor.cancel()
    for sock in sockets or []:
        sock.close()
    state = self.server_state
    for connection in list(state.connections):
        connection.shutdown()  # nmtkit.serving.protocol.Protocol.shutdown
    while (state.connections or state.tasks) and not self.force_exit and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if state.tasks:
        owner.dropped = len(state.tasks)
        why = "a second signal" if self.force_exit else f"--graceful-timeout {grace:g} s passed"
        owner.log(f"nmtkit serve: {why}: dropping {count(owner.dropped, 'request')} not answered yet")
    else:
        why = "the server is stopping"
    for connection in list(state.connections):
        connection.drop(why)
    end = time.monotonic() + 1.0  # the handlers see their clients gone and log their lines
    while state.tasks and time.monotonic() < end:
        await asyncio.sleep(0.01)
    for task in list(state.tasks):
        task.cancel()
    owner._stop_batcher = (not owner.dropped, max(0.0, deadline - time.monotonic()) if not owner.dropped else 0.5)
    await self.lifespan.shutdown()


class _Uvicorn:
    """uvicorn.Server with nmtkit's shutdown (the module docstring): bounded by
    --graceful-timeout, forced by a second signal, no re-raised signal; and one log line at most
    every 10 s for `accept()` failing for lack of file descriptors (nmtkit.serving.protocol's
    accept loop: asyncio's logged a traceback for each connection it could not accept,
    thousands of times a second). Built lazily so that importing this module needs no uvicorn."""

    def __new__(cls, config, owner: Server):
        import uvicorn

        graceful = type("Graceful", (uvicorn.Server,), {
            "capture_signals": _capture_signals, "handle_exit": _handle_exit, "startup": _startup,
            "on_tick": _on_tick, "shutdown": _shutdown})
        server = graceful(config)
        server.owner = owner
        return server


def serve(opts: ServeOptions) -> int:
    """`nmtkit serve`: the flags' server, until SIGTERM/SIGINT; the exit status (`Server.run`)."""
    from nmtkit.generation.model_flags import model_source, print_note, runtime_options

    require_extra()
    opts.validate()
    # Every flag and setting is checked against the model before anything listens (one line, as
    # generate gives); a model that is there but does not load stops the server after it started.
    # the checkpoints and the data directory's manifest ("data directory not found: ...") or an
    # export directory's files and checksums, the device, and the search settings the engine
    # cannot honour; the loader then takes the model as described here (opts.source)
    source = model_source(opts)
    source.check()
    prepared = source.engine.prepare(runtime_options(opts), lambda msg: _log_stderr(f"nmtkit serve: warning: {msg}"))
    source.engine.check_search(opts.search)
    print_note(opts.engine_note)
    server = Server(opts, load=lambda o, warn: load_translator(o, warn, prepared))
    server.bind()
    return server.run()
