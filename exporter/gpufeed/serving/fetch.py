"""One HTTP GET of a serving endpoint's metrics, bounded in every way a job could abuse.

The agent runs as root and a job names the URL (docs/serving.md, docs/security.md), so a
fetch:

- follows no redirect: a 3xx answer is a failure, "redirect to '...' refused". A loopback
  server a job runs must not send the agent on to another host or a metadata service, and
  the URL to declare is the one the server serves on (vLLM, Triton and TGI answer
  `/metrics` itself; a vLLM whose metrics app was a Starlette `Mount` answered 307 to
  `/metrics/`, which is then the URL to declare);
- has one deadline for all of it (connect, request, status line, headers, every byte of
  the body): each read waits only for the time left, so a server that trickles a byte at a
  time fails at the deadline instead of holding a thread for good;
- reads at most `max_body_bytes` of body (a larger Content-Length is refused before the
  body is read), and at most that plus `HEAD_BYTES` from the socket in all;
- hands the body on line by line as it arrives, lines that start with none of the wanted
  metric names dropped before they are decoded: a large body costs time, never memory;
- can be ended from another thread (`Abort`), which shuts its socket down: shutdown and a
  tick that stopped waiting never wait on it.

The system resolver, which no deadline bounds, is asked only for a host name; a job may
name only `localhost` or a loopback address (endpoints.url_problem).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import ssl
import threading
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, cast
from urllib.parse import SplitResult, urlsplit

from gpufeed import __version__
from gpufeed.serving.endpoints import url_problem

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# the failure reasons a fetch gives (gpufeed_serving_scrape_failures_total{reason})
UNREACHABLE = "unreachable"  # no connection, or the connection broke
TIMEOUT = "timeout"  # no complete answer before the deadline
STATUS = "status"  # an HTTP error status, or not an HTTP answer
REDIRECT = "redirect"  # a 3xx: never followed
TOO_LARGE = "too_large"  # a body over the limit

CHUNK_BYTES = 64 << 10
HEAD_BYTES = 64 << 10  # status line, headers and chunk framing, beyond the body's limit
MAX_LINE_BYTES = 64 << 10  # a longer line is no sample the stacks write: dropped unread
SHOWN_CHARS = 120  # of a redirect's Location in the failure's message


class FetchError(Exception):
    """Why a fetch failed: `reason` (one of the constants above, the failure counter's
    label) and a sentence for the log."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Abort:
    """Ends a fetch from another thread. Its socket is shut down, not just closed: on Linux
    only a shutdown wakes a `recv` blocked on the socket in the fetching thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._aborted = False

    @property
    def aborted(self) -> bool:
        return self._aborted

    def attach(self, sock: socket.socket) -> None:
        """The fetch's socket from now on; shut down at once if the fetch was aborted."""
        with self._lock:
            self._sock = sock
            if self._aborted:
                _shut(sock)

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._sock is not None:
                _shut(self._sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # not connected yet, or closed: nothing to wake
        sock.shutdown(socket.SHUT_RDWR)


def fetch_lines(
    url: str,
    *,
    deadline_monotonic: float,
    max_body_bytes: int,
    keep: tuple[bytes, ...] = (),
    abort: Abort | None = None,
) -> Generator[str, None, None]:
    """The lines of the body at `url` (only those starting with one of `keep`, if given),
    read before `deadline_monotonic` (a `time.monotonic()` value); raises FetchError."""
    abort = abort if abort is not None else Abort()
    problem = url_problem(url, loopback_only=False)
    if problem is not None:
        raise FetchError(UNREACHABLE, problem)
    parts = urlsplit(url)
    try:
        sock = _connect(parts, deadline_monotonic, abort)
        try:
            resp = _request(sock, parts, deadline_monotonic, max_body_bytes, abort)
            yield from _body_lines(resp, max_body_bytes, keep)
            if resp.length:  # read(amt) takes an early end of file for the body's end
                raise FetchError(UNREACHABLE, f"closed {resp.length} bytes short of its body")
        finally:
            sock.close()
    except FetchError:
        raise
    except TimeoutError:
        raise FetchError(TIMEOUT, "no complete answer before the deadline") from None
    except http.client.HTTPException as exc:
        raise FetchError(STATUS, f"not a valid HTTP answer ({type(exc).__name__})") from None
    except OSError as exc:
        raise FetchError(UNREACHABLE, exc.strerror or type(exc).__name__) from None


def _left(deadline_monotonic: float) -> float:
    left = deadline_monotonic - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _connect(parts: SplitResult, deadline_monotonic: float, abort: Abort) -> socket.socket:
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    sock = socket.create_connection((host, port), timeout=_left(deadline_monotonic))
    abort.attach(sock)
    if parts.scheme != "https":
        return sock
    tls = ssl.create_default_context().wrap_socket(
        sock, server_hostname=host, do_handshake_on_connect=False
    )
    abort.attach(tls)  # the plain socket's descriptor now belongs to `tls`
    tls.settimeout(_left(deadline_monotonic))
    tls.do_handshake()
    return tls


def _request(
    sock: socket.socket,
    parts: SplitResult,
    deadline_monotonic: float,
    max_body_bytes: int,
    abort: Abort,
) -> http.client.HTTPResponse:
    """Sends the GET and reads the status line and headers: a 200-299 answer whose body
    may be read."""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = (
        f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/plain\r\n"
        f"User-Agent: gpufeed/{__version__}\r\nConnection: close\r\n\r\n"
    )
    sock.settimeout(_left(deadline_monotonic))
    sock.sendall(request.encode("ascii"))
    reader = _DeadlineReader(sock, deadline_monotonic, max_body_bytes + HEAD_BYTES, abort)
    # HTTPResponse reads through `sock.makefile("rb")`, so every read it makes (the status
    # line and headers too) goes through the reader's deadline
    resp = http.client.HTTPResponse(cast(socket.socket, _MakeFile(reader)), method="GET")
    resp.begin()
    if 300 <= resp.status < 400:
        where = resp.getheader("Location") or ""
        shown = where[:SHOWN_CHARS] + ("..." if len(where) > SHOWN_CHARS else "")
        raise FetchError(
            REDIRECT,
            f"redirect to {shown!r} refused (HTTP {resp.status}; declare the URL that "
            "serves the metrics itself)",
        )
    if not 200 <= resp.status < 300:
        raise FetchError(STATUS, f"HTTP {resp.status}")
    if resp.length is not None and resp.length > max_body_bytes:
        raise FetchError(TOO_LARGE, f"body of {resp.length} bytes, over {max_body_bytes}")
    return resp


def _body_lines(
    resp: http.client.HTTPResponse, max_body_bytes: int, keep: tuple[bytes, ...]
) -> Iterator[str]:
    total = 0
    tail = b""  # the line the last chunk ended inside
    skipping = False  # inside a line over MAX_LINE_BYTES: dropped up to its newline
    while chunk := resp.read(CHUNK_BYTES):
        total += len(chunk)
        if total > max_body_bytes:
            raise FetchError(TOO_LARGE, f"body over {max_body_bytes} bytes")
        lines = chunk.split(b"\n")
        if skipping:  # the first piece is the rest of the overlong line
            if len(lines) == 1:
                continue
            del lines[0]
            skipping = False
        else:
            lines[0] = tail + lines[0]
        tail = lines.pop()
        if len(tail) > MAX_LINE_BYTES:
            tail, skipping = b"", True
        for line in lines:
            if not keep or line.lstrip().startswith(keep):
                yield line.decode("utf-8", errors="replace")
    if tail and (not keep or tail.lstrip().startswith(keep)):
        yield tail.decode("utf-8", errors="replace")


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each read waiting only for the time left before the deadline,
    at most `limit_bytes` in all, and none once the fetch is aborted."""

    def __init__(
        self, sock: socket.socket, deadline_monotonic: float, limit_bytes: int, abort: Abort
    ) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline_monotonic
        self._limit = limit_bytes
        self._abort = abort
        self._read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        if self._abort.aborted:
            raise FetchError(TIMEOUT, "given up on before its answer ended")
        self._sock.settimeout(_left(self._deadline))
        n = self._sock.recv_into(buffer)
        if self._abort.aborted:  # the shutdown's end of file is not the answer's end
            raise FetchError(TIMEOUT, "given up on before its answer ended")
        self._read += n
        if self._read > self._limit:
            raise FetchError(TOO_LARGE, f"answer over {self._limit} bytes")
        return n


class _MakeFile:
    """What HTTPResponse needs of a socket: `makefile`, here reading through the reader."""

    def __init__(self, reader: _DeadlineReader) -> None:
        self._reader = reader

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self._reader, CHUNK_BYTES)
