"""Serving an aiohttp app on our own accept loop, so that connections are counted and
closed before the process runs out of descriptors (see `connections`).

aiohttp's TCPSite hands accepting to asyncio, which on EMFILE logs one error per accept
attempt (thousands a second) and keeps every slow connection. Here each accepted socket
becomes a slot of the `ConnectionGuard` first, and only then an aiohttp request handler.

What this relies on from aiohttp beyond its documented API, each pinned by
tests/test_web_aiohttp.py (which fails, naming the part, on an aiohttp that changes it):

- `web.RequestHandler` (in `aiohttp.web.__all__`) is the asyncio protocol of one
  connection, made as `web.Server.__call__` makes it: `RequestHandler(server, loop=...,
  keepalive_timeout=..., access_log=..., logger=...)`, the keywords its docstring lists.
- It answers a request it cannot parse (and a handler's exception) through its method
  `handle_error(request, status, exc, message)`, which `_QuietRequestHandler` overrides:
  aiohttp has no public hook for that page, which it writes before the application (and
  its middlewares and signals) sees anything.
- It logs its errors with `logger.exception(...)` and its noise with `logger.debug(...)`:
  the logger given is `_ServerLog`, an adapter that rate-limits them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import ssl
import sys
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http import HttpProcessingError

from gpufeed.logonce import FLOOD_REPEAT_SECONDS, LogOnce
from gpufeed.web.connections import ConnectionGuard, ConnectionLimits, Slot
from gpufeed.web.headers import SERVER_NAME

log = logging.getLogger("gpufeed.web")

LISTEN_BACKLOG = 1024
# Accepts per wake-up of the listening socket: enough to drain a burst, small enough that
# the requests of accepted connections are not starved by new ones.
ACCEPT_BURST = 64
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# How long accepting pauses when no descriptor can be freed by closing a connection.
ACCEPT_PAUSE_SECONDS = 0.1


class _QuietRequestHandler(web.RequestHandler):
    """aiohttp's request handler without its error page's leak: the page for a malformed
    request can quote the request's bytes back to the client (the message of the parser's
    exception, which depends on the aiohttp version and parser)."""

    __slots__ = ()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        response = super().handle_error(request, status, exc, f"{status} {phrase}\n")
        response.headers[hdrs.SERVER] = SERVER_NAME  # this response skips the app's hooks
        return response


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """The `logger` of aiohttp's request handlers: their errors through `errors` (one line
    per kind per FLOOD_REPEAT_SECONDS), a client's malformed request without a traceback
    (a flood of garbage must not fill the disk), debug lines as they are."""

    def __init__(self, errors: LogOnce) -> None:
        super().__init__(log, {})
        self._errors = errors

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        if level < logging.WARNING:
            self.logger.log(level, msg, *args, exc_info=exc_info)
            return
        exc = sys.exc_info()[1] if exc_info is True else exc_info
        kind = type(exc).__name__ if isinstance(exc, BaseException) else "error"
        text = str(msg)
        if isinstance(exc, HttpProcessingError):  # the client's fault: no traceback
            self._errors.log(logging.WARNING, f"bad request {kind}", f"{text}: %s", *args, kind)
        else:
            self._errors.log(level, f"{text} {kind}", text, *args, exc_info=exc)


# Whether a set-up connection may be served (the web config's client_allowed_sans).
PeerCheck = Callable[[asyncio.BaseTransport], bool]


class _GuardedProtocol(asyncio.Protocol):
    """Tells the guard what the connection does, and passes everything on to aiohttp
    (nothing, for a peer the check refuses)."""

    __slots__ = ("_guard", "_inner", "_peer_check", "_refused", "_slot")

    def __init__(
        self,
        inner: web.RequestHandler,
        guard: ConnectionGuard,
        slot: Slot,
        peer_check: PeerCheck | None,
    ) -> None:
        self._inner = inner
        self._guard = guard
        self._slot = slot
        self._peer_check = peer_check
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._slot.transport = transport
        if self._peer_check is not None and not self._peer_check(transport):
            self._refused = True
            transport.abort()  # type: ignore[attr-defined]
            return
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            self._guard.received(self._slot, data)
            self._inner.data_received(data)

    def eof_received(self) -> None:
        if not self._refused:
            self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.release(self._slot)
        if not self._refused:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self._refused:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self._refused:
            self._inner.resume_writing()


class HttpListener:
    """Accepts on `sockets` and serves each connection with aiohttp's `server`."""

    def __init__(
        self,
        server: web.Server,
        sockets: list[socket.socket],
        *,
        limits: ConnectionLimits,
        tls: Callable[[], ssl.SSLContext] | None = None,
        peer_check: PeerCheck | None = None,
        errors: LogOnce | None = None,
    ) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.guard = ConnectionGuard(limits, limits.effective_max_connections(soft))
        if self.guard.max_connections < limits.max_connections:
            log.warning(
                "serving at most %d connections, not %d: the descriptor limit is %d",
                self.guard.max_connections,
                limits.max_connections,
                soft,
            )
        self._server = server
        self._sockets = sockets
        for sock in sockets:
            sock.listen(LISTEN_BACKLOG)  # a deeper queue than asyncio's: bursts of connects
            sock.setblocking(False)
        self._tls = tls
        self._peer_check = peer_check
        self._errors = errors or LogOnce(log, repeat_after_seconds=FLOOD_REPEAT_SECONDS)
        self._server_log = _ServerLog(self._errors)
        self._loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._paused: set[socket.socket] = set()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    @property
    def ports(self) -> list[int]:
        return [int(s.getsockname()[1]) for s in self._sockets]

    def start(self) -> None:
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)
        self._sweep()

    def close(self) -> None:
        """Stops accepting; the connections are closed by the runner's cleanup."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for sock in self._sockets:
            if sock not in self._paused:
                self._loop.remove_reader(sock.fileno())
            sock.close()
        for task in self._pending:
            task.cancel()

    def _sweep(self) -> None:
        self.guard.expire()
        interval = min(1.0, self.guard.limits.header_timeout_seconds / 4)
        self._sweeper = self._loop.call_later(interval, self._sweep)

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._accept_failed(listening, exc)
                return
            conn.setblocking(False)
            evicted = self.guard.evicted_total
            slot = self.guard.admit(conn)
            if self.guard.evicted_total != evicted:  # slow clients, or more than expected
                self._errors.log(
                    logging.WARNING,
                    "connection cap",
                    "%d connections open, the cap: closed the stalest (%d closed so far)",
                    self.guard.max_connections,
                    self.guard.evicted_total,
                )
            task = self._loop.create_task(self._connect(conn, slot))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _accept_failed(self, listening: socket.socket, exc: OSError) -> None:
        short = exc.errno in OUT_OF_RESOURCES
        self._errors.log(
            logging.ERROR,
            f"accept {exc.errno}",
            "cannot accept a connection: %s (%d connections open)%s",
            exc.strerror or exc,
            len(self.guard),
            "; closing the stalest" if short else "",
        )
        if short and self.guard.evict_one():
            return  # a descriptor comes free once the loop closes it; accept again then
        # Nothing to free (or another error): a short pause instead of a busy loop.
        self._loop.remove_reader(listening.fileno())
        self._paused.add(listening)
        self._loop.call_later(ACCEPT_PAUSE_SECONDS, self._resume, listening)

    def _resume(self, listening: socket.socket) -> None:
        if listening in self._paused and listening.fileno() != -1:
            self._paused.discard(listening)
            self._loop.add_reader(listening.fileno(), self._accept, listening)

    async def _connect(self, conn: socket.socket, slot: Slot) -> None:
        def protocol() -> _GuardedProtocol:
            handler = _QuietRequestHandler(
                self._server,
                loop=self._loop,
                keepalive_timeout=self.guard.limits.idle_timeout_seconds,
                access_log=None,  # type: ignore[arg-type]  # documented: None turns it off
                logger=self._server_log,  # type: ignore[arg-type]  # a Logger's interface
            )
            return _GuardedProtocol(handler, self.guard, slot, self._peer_check)

        context = self._tls() if self._tls is not None else None
        try:
            await self._loop.connect_accepted_socket(
                protocol,
                conn,
                ssl=context,
                ssl_handshake_timeout=(
                    self.guard.limits.header_timeout_seconds if context is not None else None
                ),
            )
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            # A failed TLS handshake: the client's problem, at debug level only.
            log.debug("connection not set up: %s", exc)
            self.guard.release(slot)
            conn.close()


def loop_error_logger(
    errors: LogOnce,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An event-loop exception handler that logs through `errors` (rate-limited)."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "unhandled error in the event loop")
        exc = context.get("exception")
        kind = type(exc).__name__ if exc is not None else ""
        errors.log(
            logging.ERROR,
            f"loop {message} {kind}",
            "%s%s",
            message,
            f": {exc}" if exc is not None else "",
            exc_info=None if isinstance(exc, OSError) else exc,
        )

    return handle
