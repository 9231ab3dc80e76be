"""What `nmtkit serve` runs: bind, load the model in the background, serve, stop gracefully.

Order of events (docs/serve.md):
1. the flags are checked and the device resolved (a mistake is one line and exit 2, before
   anything listens); the socket is bound (a port in use is one line naming --host/--port);
2. uvicorn serves at once: /health answers 503 while a thread loads the model
   (`Translator.load`, once), then 200; a loading error stops the server with exit 2;
3. requests go through the `Batcher` (one worker thread runs every search);
4. SIGTERM or SIGINT: uvicorn stops accepting connections and waits for the requests in
   flight, which the batcher finishes; then the worker stops and the process exits 0 (uvicorn
   alone would re-raise the signal after its graceful shutdown, ending with status -15/-2);
   a second SIGINT forces the exit.

`Server` is also the in-process handle that tests use (`bind()`, `run()` in a thread, `stop()`),
with a `load` function of their own when they need to hold the loading back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmtkit.checkpoints import require_exists
from nmtkit.data.manifest import load_manifest
from nmtkit.errors import UserError
from nmtkit.serving.app import Limits, ServerState, build_app
from nmtkit.serving.batcher import Batcher
from nmtkit.serving.options import ServeOptions


def require_extra() -> None:
    """The `serve` extra's packages, or a one-line UserError saying how to install them."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UserError(f"nmtkit serve needs the serve extra ({e.name} is missing): pip install 'nmtkit[serve]'") from None


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


def load_translator(opts: ServeOptions, warn: Callable[[str], None]) -> Any:
    """The translator `nmtkit serve` uses: `Translator.load` with generate's model flags, the
    search flags as defaults, and the batch limits."""
    from nmtkit.generation.model_flags import model_source, runtime_options
    from nmtkit.generation.translator import Translator

    return Translator.open(model_source(opts), runtime_options(opts), batch_size=opts.max_batch_sentences,
                           max_tokens=opts.max_batch_tokens, warn=warn, search=opts.search)


def model_info(tr: Any, opts: ServeOptions, limits: Limits, sha256s: list[str]) -> dict:
    """GET /info's answer."""
    from nmtkit import __version__
    from nmtkit.search.config import SEARCH_SETTINGS

    return {
        "nmtkit": __version__,
        "model": {"paths": list(opts.paths), "sha256": sha256s, "ema": opts.ema,
                  "architecture": tr.engine.architectures(), "runtime": tr.engine.name},
        "source_lang": tr.src_lang, "target_lang": tr.tgt_lang, "task": tr.task,
        "device": str(tr.device), "precision": opts.precision,
        "defaults": {name: getattr(tr.search, name) for name in SEARCH_SETTINGS},
        "limits": {"max_request_sentences": limits.max_request_sentences,
                   "max_sentence_chars": limits.max_sentence_chars, "max_beam": limits.max_beam,
                   "max_body_bytes": limits.max_body_bytes},
        "batching": {"max_batch_sentences": opts.max_batch_sentences, "max_batch_tokens": opts.max_batch_tokens,
                     "max_wait_ms": opts.max_wait_ms, "max_queue": opts.max_queue},
    }


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Server:
    """One `nmtkit serve` process's server (see the module docstring)."""

    def __init__(self, opts: ServeOptions, *, load: Callable[[ServeOptions, Callable[[str], None]], Any] | None = None,
                 log: Callable[[str], None] = _log_stderr):
        require_extra()
        self.opts = opts
        self.load = load or load_translator
        self.log = log
        self.limits = Limits(opts.max_request_sentences, opts.max_sentence_chars, opts.max_beam)
        self.state = ServerState(self.limits, log=log)
        self.error: BaseException | None = None
        self.sock: socket.socket | None = None
        self._uvicorn = None
        self._loader: threading.Thread | None = None

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
        # Every request in flight has been answered (uvicorn waited for them): stop the worker.
        batcher = self.state.batcher
        if batcher is not None:
            import asyncio

            await asyncio.to_thread(batcher.close, True)

    # -- running

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (or `stop()`); raise the loading error, if any."""
        import uvicorn

        if self.sock is None:
            self.bind()
        app = build_app(self.state, lifespan=self._lifespan)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_keep_alive=5)
        self._uvicorn = _Uvicorn(config, self.log)
        host, port = self.sock.getsockname()[:2]
        self.log(f"nmtkit serve: listening on http://{host}:{port} (pid {os.getpid()}); loading the model")
        self._uvicorn.run(sockets=[self.sock])
        self.log("nmtkit serve: stopped")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Ask the server to stop gracefully (as SIGTERM does); returns at once."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True


class _Uvicorn:
    """uvicorn.Server that logs the shutdown and exits 0 after a graceful stop (see the module
    docstring). Built lazily so that importing this module needs no uvicorn."""

    def __new__(cls, config, log):
        import uvicorn

        class Graceful(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
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

            def handle_exit(self, sig, frame):
                if not self.should_exit:
                    log(f"nmtkit serve: {signal.Signals(sig).name}: not accepting connections; finishing "
                        f"the requests in flight (again to force)")
                super().handle_exit(sig, frame)

        return Graceful(config)


def serve(opts: ServeOptions) -> None:
    """`nmtkit serve`: the flags' server, until SIGTERM/SIGINT."""
    from nmtkit.generation.model_flags import model_source, print_note, runtime_options

    require_extra()
    opts.validate()
    # Every flag and setting is checked against the model before anything listens (one line, as
    # generate gives); a model that is there but does not load stops the server after it started.
    for p in opts.paths:
        require_exists(p)
    if opts.data_dir is not None:
        load_manifest(opts.data_dir)  # "data directory not found: ...", or not one nmtkit made
    # device errors first, an export directory's damage (its description and checksums), and the
    # search settings its engine cannot honour
    source = model_source(opts)
    source.engine.prepare(runtime_options(opts), lambda msg: None)
    source.engine.check_search(opts.search)
    print_note(opts.engine_note)
    server = Server(opts)
    server.bind()
    server.run()
