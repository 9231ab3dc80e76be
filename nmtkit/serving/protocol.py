"""The HTTP/1.1 connections of `nmtkit serve`: uvicorn's h11 protocol, with the limits that keep
slow or idle clients from holding the server (docs/serve.md, "Slow clients").

uvicorn closes a kept-alive connection that stays idle (`timeout_keep_alive`) but waits forever
for a request's headers, and its `limit_concurrency` answers 503 only once a request's headers
are complete: a client that opens connections and sends a few bytes, or nothing, kept every one
of them open until the process ran out of file descriptors, and then nobody was answered. Here:

- **headers**: a connection must send its request's headers within `header_timeout` seconds of
  opening (or of its previous answer, when kept alive); else it gets 408 (if it sent part of
  them) and is closed.
- **body**: the app reads the body within `body_timeout` (nmtkit.serving.app, 408); when the app
  answers without reading the whole body (413, 404, 503 while loading), the rest is read and
  discarded for at most `body_timeout` seconds (so that the client sees the answer), then the
  connection is closed.
- **closing while the client sends**: an answer that ends the connection (the client asked for
  `Connection: close`; a 408; a 400) is followed by a lingering close, as in nginx and Apache:
  the server stops writing (FIN after the answer) and reads and drops what still comes until the
  client closes too, for at most 5 s (`LINGER_S`; `body_timeout` if shorter). Closing a socket
  with unread bytes makes the kernel reset the connection and drop what it has not sent yet: a
  loaded server's 413 lost its JSON body that way while the client was still sending.
- **answer**: a client that stops reading its answer (the socket's buffers full) for
  `body_timeout` seconds is disconnected.
- **connections**: at most `max_connections` are open. When a new one comes and they are all
  taken, the connection that has waited longest for its request's headers (idle, kept alive or
  slow) or for the rest of a body it only drops is closed to make room; if every connection has
  a request under way, the new one gets 503 and is closed at once. `accept_connections` accepts
  them one at a time (asyncio's own accept loop takes up to its backlog, 2048, at once, before any
  of them is counted), so the server holds at most `max_connections` sockets and a few being
  closed: below the open-file limit, `accept()` does not fail for lack of descriptors, and a
  server full of slow clients still answers a new client. If it fails all the same (descriptors
  used elsewhere), it is one log line per 10 s and another try every second, where asyncio logged
  a traceback for every connection waiting, thousands of times a second.
- **what is not HTTP/1.1** (h11 refuses its request line, a header or a chunk): 400 with a JSON
  body like every other error (uvicorn's is plain text), then closed.
- **shutdown** (`shutdown()`, called by uvicorn on SIGTERM): a connection without a request,
  or one whose body is still arriving, is closed at once; a request already received is answered,
  then its connection closed. `drop()` ends one that the shutdown cannot wait for.

What each of these does is logged through `Notes` (one line at most every 10 s per kind).
The protocol class is made per server (`protocol_class`), since uvicorn builds each connection's
protocol from the class alone.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmtkit.serving.logs import Notes

MAX_HEADER_BYTES = 16 * 1024  # h11's own default, stated: larger request headers get 400
# A lingering close lasts at most this (or body_timeout if shorter): nginx's lingering_timeout, and
# uvicorn's keep-alive timeout (nmtkit.serving.server), which closes an answered connection as well
LINGER_S = 5.0


@dataclass
class Guard:
    """What the connections of one server share: the limits, and the connections waiting for
    their request's headers or for the rest of a body they only drop, longest waiting first."""

    max_connections: int
    header_timeout: float
    body_timeout: float
    notes: Notes
    waiting: dict = field(default_factory=dict)  # protocol -> None, in the order they began to wait

    def make_room(self) -> bool:
        """Close the connection that has waited longest (for its request's headers, or
        dropping the rest of a body); False if every connection has a request under way."""
        oldest = next(iter(self.waiting), None)
        if oldest is None:
            return False
        oldest.evict()
        return True


def _answer(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A complete HTTP/1.1 answer `{"error": message}` that closes the connection (written
    directly: h11 has no request to answer when the headers never came)."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n").encode() + body


async def accept_connections(sock: socket.socket, make_protocol: Callable[[], asyncio.Protocol], guard: Guard,
                             limit: str) -> None:
    """Accept the connections of the listening `sock` one at a time, each served by a protocol
    of `make_protocol`, until cancelled (see the module docstring). `limit`: the open-file limit,
    for the message when accept() fails."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    while True:
        try:
            conn, _ = await loop.sock_accept(sock)
        except ConnectionAbortedError:  # the client gave up before it was accepted
            continue
        except OSError as e:  # EMFILE, ENFILE, ENOBUFS, ENOMEM: the system's resources, for a while
            guard.notes.note("accept", f"nmtkit serve: warning: cannot accept connections: {e.strerror} "
                                       f"(open-file limit {limit}); trying again every second")
            await asyncio.sleep(1.0)
            continue
        try:
            await loop.connect_accepted_socket(make_protocol, conn)
        except OSError:  # the client went away meanwhile
            conn.close()


class _CycleTransport:
    """The connection's transport as uvicorn's request cycle holds it: the same, except that
    close() is the protocol's lingering close (the cycle closes the connection as soon as it has
    written an answer that ends it, its body possibly unread)."""

    def __init__(self, protocol: Protocol):
        self._protocol = protocol

    def __getattr__(self, name: str):
        return getattr(self._protocol.transport, name)

    def is_closing(self) -> bool:  # lingering, it writes nothing more (not even a 100 Continue)
        return self._protocol._lingering or self._protocol.transport.is_closing()

    def close(self) -> None:
        self._protocol.close_lingering()


def protocol_class(guard: Guard) -> type[asyncio.Protocol]:
    """The protocol class of a server whose connections share `guard`."""
    return type("NmtkitHTTP", (Protocol,), {"guard": guard})


class Protocol(H11Protocol):
    """uvicorn's H11Protocol with the limits of the module docstring (use `protocol_class`)."""

    guard: Guard

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "headers", "the rest of the body" (discarded) or "lingering"
        self._write_timer: asyncio.TimerHandle | None = None
        self._partial = False  # bytes of the next request's headers arrived
        self._refused = False
        self._lingering = False  # no more answers: what arrives is dropped until the client closes
        self._stopping = False  # the server is shutting down: no lingering

    # -- the connection's life

    def connection_made(self, transport) -> None:  # type: ignore[override]
        g = self.guard
        if len(self.connections) >= g.max_connections and not g.make_room():
            self._refused = True
            self.transport = transport
            transport.write(_answer(503, "Service Unavailable", f"the server holds {g.max_connections} connections, "
                                    "each with a request under way (--max-connections); try again later",
                                    "retry-after: 1\r\n"))
            transport.close()
            g.notes.note("refused", f"nmtkit serve: warning: --max-connections {g.max_connections} reached, "
                                    "every connection with a request under way: new connections get 503")
            return
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        if self._refused or self._lingering:
            return  # dropped unread: h11 would keep it for the finished request
        if self._waiting_for == "headers":
            self._partial = True
        super().data_received(data)
        self._follow()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.cycle is not None:  # a request came: its cycle closes through us
            self.cycle.transport = _CycleTransport(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def close_lingering(self) -> None:
        """Close the connection without a reset (the module docstring): when the client may
        still be sending, stop writing and drop what it sends until it closes too, for at most
        LINGER_S seconds (`body_timeout` if shorter); else close now."""
        t = self.transport
        if t.is_closing() or self._lingering:
            return
        sending = self.conn.their_state in (h11.SEND_BODY, h11.ERROR) or self.conn.trailing_data[0]
        if not sending or self._stopping:
            t.close()
            return
        self._lingering = True
        if self.cycle is not None and not self.cycle.response_complete:  # a 400 amid a request: its app
            self.cycle.disconnected = True  # sees the client gone, as when the connection is lost
            self.cycle.message_event.set()
        self._set_timer("lingering", min(self.guard.body_timeout, LINGER_S))  # whatever it waited for before
        try:
            t.write_eof()  # the answer, then FIN: the client reads it to the end
        except OSError:  # the client has reset the connection already
            t.abort()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that h11 refuses (a malformed request line, header or
        chunk; headers too large): a JSON error like every other answer, where uvicorn's is plain
        text without a length; nothing when an answer is already under way. Then closed."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.write(_answer(400, "Bad Request", "the request is not valid HTTP/1.1 (its request line, "
                                         "headers or chunked body)"))
        self.close_lingering()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._set_timer(None)
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)
        self._unset_keepalive_if_required()  # uvicorn cancels it only after an end without an error

    # -- timers

    def _follow(self) -> None:
        """Arm the timer that the connection's state calls for (the module docstring)."""
        if self.transport is None or self.transport.is_closing():
            self._set_timer(None)
            return
        if self._lingering:
            return  # its timer runs
        answered = self.cycle is None or self.cycle.response_complete
        their = self.conn.their_state
        if answered and their is h11.IDLE:
            self._set_timer("headers", self.guard.header_timeout)
        elif answered and their is h11.SEND_BODY:
            self._set_timer("the rest of the body", self.guard.body_timeout)
        else:  # a request under way: its body is the app's to time (--body-timeout), its search is not timed
            self._set_timer(None)

    def _set_timer(self, what: str | None, seconds: float = 0.0) -> None:
        if what is not None and what == self._waiting_for:
            return  # already waiting for that: the deadline stays
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard.waiting.pop(self, None)
        self._waiting_for = what
        if what is None:
            return
        self._timer = self.loop.call_later(seconds, self._expired)
        if what == "headers":
            # bytes already there (sent after the previous request, pipelined) are part of these headers
            self._partial = bool(self.conn.trailing_data[0])
        self.guard.waiting[self] = None  # waiting for headers, or for bytes it only drops: may make room

    def _expired(self) -> None:
        what, self._timer = self._waiting_for, None
        self._set_timer(None)
        if self.transport.is_closing():
            return
        g = self.guard
        if what == "headers" and self._partial:
            self.transport.write(_answer(408, "Request Timeout", f"the request's headers did not arrive within "
                                         f"{g.header_timeout:g} s (--header-timeout)"))
            g.notes.note("headers", f"nmtkit serve: closed a connection whose request headers did not arrive "
                                    f"within {g.header_timeout:g} s (--header-timeout)")
        self.transport.close()  # an idle connection that never sent a byte is closed without a word

    def evict(self) -> None:
        """Close this connection (waiting for its request) to make room for a new one."""
        self._set_timer(None)
        self.guard.notes.note("evicted", f"nmtkit serve: --max-connections {self.guard.max_connections} reached: "
                                         "closing the connections that waited longest for a request")
        self.transport.close()

    # -- a client that does not read its answer

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.guard.body_timeout, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stalled(self) -> None:
        self._write_timer = None
        self.guard.notes.note("reader", f"nmtkit serve: closed a connection whose client read nothing of its "
                                        f"answer for {self.guard.body_timeout:g} s (--body-timeout)")
        self.transport.abort()

    # -- shutdown

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown of this connection: close it unless a complete request
        is being answered (an upload still arriving is dropped); from now on, no lingering close."""
        if self._refused:
            return
        self._stopping = True
        if self._lingering:
            self.transport.close()
        elif self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.SEND_BODY:
            self.drop("the server is stopping")
        else:
            super().shutdown()

    def drop(self, reason: str) -> None:
        """Close the connection now; its request, if any, is logged as dropped for `reason`."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.scope.setdefault("nmtkit", {})["dropped"] = reason
        self._set_timer(None)
        self.transport.abort()

    @property
    def request_under_way(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

