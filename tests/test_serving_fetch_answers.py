"""`gpufeed.serving.fetch` on answers no HTTP server library would send, from a raw TCP
server on a loopback port the kernel picks: each is read or refused with its reason."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpufeed.serving.fetch import FetchError, fetch_lines


@contextlib.contextmanager
def raw_server(reply: bytes) -> Iterator[str]:
    """A TCP server that reads a request, writes `reply` as it is and closes: answers no
    HTTP server library would send."""
    lsock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = lsock.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}/metrics"
    finally:
        lsock.close()


def fetch(url: str, limit: int = 1 << 20, keep: tuple[bytes, ...] = ()) -> list[str]:
    lines = fetch_lines(
        url, deadline_monotonic=time.monotonic() + 2, max_body_bytes=limit, keep=keep
    )
    return list(lines)


@pytest.mark.parametrize(
    ("reply", "want"),
    [
        # HTTP/1.0, no Content-Length: the body ends with the connection
        (
            b"HTTP/1.0 200 OK\r\n\r\nvllm:num_requests_waiting 2\nup 1",
            ["vllm:num_requests_waiting 2", "up 1"],
        ),
        # a line over 64 KiB is dropped up to its newline; the next line is read
        (
            b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 200_000 + b"\nvllm:num_requests_waiting 3\n",
            ["vllm:num_requests_waiting 3"],
        ),
        # a body shorter than its Content-Length is not taken for the whole
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nvllm:num_requests_waiting 2\n",
            "unreachable",
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "status"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n", "status"),  # 100 headers at most
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", "too_large"),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "status"),
    ],
)
def test_odd_answers(reply: bytes, want: list[str] | str) -> None:
    with raw_server(reply) as url:
        if isinstance(want, str):
            with pytest.raises(FetchError) as err:
                fetch(url)
            assert err.value.reason == want, err.value
        else:
            assert fetch(url) == want


def test_only_the_wanted_lines_are_handed_on() -> None:
    body = b'# HELP x\nup 1\nvllm:num_requests_waiting{a="b"} 4\n  tgi_queue_size 2\n'
    with raw_server(b"HTTP/1.0 200 OK\r\n\r\n" + body) as url:
        got = fetch(url, keep=(b"vllm:num_requests_waiting", b"tgi_queue_size"))
    assert got == ['vllm:num_requests_waiting{a="b"} 4', "  tgi_queue_size 2"]


def test_a_fetch_refuses_what_no_endpoint_may_be() -> None:
    with pytest.raises(FetchError, match="credentials"):
        fetch("http://u:p@127.0.0.1:9/metrics")
