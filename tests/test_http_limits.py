"""Connection cap, header and idle timeouts, and rate-limited error logs of the HTTP server.

The guard's rules table-driven on a fake clock; the timeouts and the cap on a real process
of every service (the agent, the fleet, the scheduler: one web layer)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from pathlib import Path

import pytest

from gpufeed.web.connections import ConnectionGuard, ConnectionLimits
from http_helpers import SERVICES, get, service_process, wait_until_serving


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _guard(cap: int, clock: FakeClock) -> ConnectionGuard:
    limits = ConnectionLimits(
        max_connections=cap, header_timeout_seconds=10.0, idle_timeout_seconds=60.0
    )
    return ConnectionGuard(limits, cap, clock=clock)


@pytest.fixture
def socks() -> list[socket.socket]:
    pairs = [socket.socketpair() for _ in range(6)]
    yield [a for a, _ in pairs]
    for a, b in pairs:
        a.close()
        b.close()


def _shut(sock: socket.socket) -> bool:
    """Whether the guard closed this socket (shut down: the peer reads end of file)."""
    try:
        sock.send(b"x")
    except OSError:
        return True
    return False


def test_beyond_the_cap_the_longest_waiting_for_its_header_is_closed(socks: list) -> None:
    clock = FakeClock()
    guard = _guard(3, clock)
    slow_old = guard.admit(socks[0])
    clock.now += 1
    scraper = guard.admit(socks[1])
    guard.received(scraper, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # now idle
    clock.now += 1
    slow_new = guard.admit(socks[2])
    guard.received(slow_new, b"GET / HTTP/1.1\r\n")
    clock.now += 1
    guard.admit(socks[3])  # over the cap: the oldest header-waiter goes, not the scraper
    assert len(guard) == 3
    assert _shut(slow_old.sock) and guard.evicted_total == 1
    assert not _shut(scraper.sock)
    guard.admit(socks[4])  # next: the next-oldest waiter
    assert _shut(slow_new.sock) and not _shut(scraper.sock)


def test_idle_connections_are_closed_only_when_no_one_waits_for_a_header(socks: list) -> None:
    clock = FakeClock()
    guard = _guard(2, clock)
    first = guard.admit(socks[0])
    guard.received(first, b"GET / HTTP/1.1\r\n\r\n")
    second = guard.admit(socks[1])
    guard.received(second, b"GET / HTTP/1.1\n\n")  # lenient line ends count too
    guard.admit(socks[2])
    assert _shut(first.sock) and not _shut(second.sock)


@pytest.mark.parametrize(
    ("chunks", "after_seconds", "closed"),
    [
        ([], 9.9, False),  # a new connection has header_timeout to send its header
        ([], 10.0, True),
        ([b"GET / HTTP/1.1\r\n", b"Host: x\r\n"], 10.0, True),  # trickling does not help
        ([b"GET / HTTP/1.1\r\nHost: x\r", b"\n\r\n"], 59.0, False),  # header split mid-end
        ([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"], 60.0, True),  # idle keep-alive
        ([b"GET / HTTP/1.1\r\n\r\n", b"GET / HT"], 9.0, False),  # next request: timed anew
    ],
)
def test_timeouts(socks: list, chunks: list[bytes], after_seconds: float, closed: bool) -> None:
    clock = FakeClock()
    guard = _guard(10, clock)
    slot = guard.admit(socks[0])
    for chunk in chunks:
        guard.received(slot, chunk)
    clock.now += after_seconds
    assert guard.expire() == int(closed)
    assert _shut(slot.sock) == closed


def test_the_cap_leaves_descriptors_for_the_rest_of_the_agent() -> None:
    limits = ConnectionLimits(max_connections=10_000)
    assert limits.effective_max_connections(1024) == 1024 - 128
    assert limits.effective_max_connections(200) == 100
    assert ConnectionLimits(max_connections=256).effective_max_connections(1024) == 256


def _closed_after(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes `sock` (reading end of file or a reset)."""
    start = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def _is_closed(sock: socket.socket, wait_seconds: float) -> bool:
    """Whether the server has closed `sock` (end of file or a reset within the wait)."""
    sock.settimeout(wait_seconds)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_service_closes_slow_and_idle_connections(tmp_path: Path, kind: str) -> None:
    args = ("--web.header-timeout", "0.5", "--web.idle-timeout", "1.5")
    with service_process(kind, tmp_path, *args) as agent:
        wait_until_serving(agent)
        with socket.create_connection(("127.0.0.1", agent.port)) as silent:
            assert 0.3 < _closed_after(silent, 5) < 2.0
        with socket.create_connection(("127.0.0.1", agent.port)) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            assert 0.3 < _closed_after(slow, 5) < 2.0
        with socket.create_connection(("127.0.0.1", agent.port)) as keep:
            keep.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            keep.settimeout(5)
            assert keep.recv(65536).startswith(b"HTTP/1.1 ")
            # kept past the header timeout (a finished request), closed at the idle one
            assert 1.0 < _closed_after(keep, 5) < 3.0
        assert get(agent.port, "/metrics")[0] == 200


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_beyond_the_cap_the_stalest_connection_makes_room(tmp_path: Path, kind: str) -> None:
    """With a cap of 4, 8 connections that send nothing: each new one closes the stalest,
    a scraper still gets its page, and the log says so once, not once per connection."""
    with service_process(kind, tmp_path, "--web.max-connections", "4") as agent:
        wait_until_serving(agent)
        silent = [socket.create_connection(("127.0.0.1", agent.port)) for _ in range(8)]
        try:
            time.sleep(0.5)  # accepted, in order
            assert get(agent.port, "/metrics")[0] == 200
            closed = [_is_closed(s, 0.5) for s in silent]
            # the oldest made room (for the newer ones, then for the scraper)
            assert all(closed[:5]) and not all(closed), closed
        finally:
            for s in silent:
                s.close()
        lines = [ln for ln in agent.log().splitlines() if "the cap: closed the stalest" in ln]
        assert len(lines) == 1, agent.log()


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_service_lowers_its_cap_to_fit_the_descriptor_limit(tmp_path: Path, kind: str) -> None:
    with service_process(kind, tmp_path, "--web.max-connections", "5000", nofile=400) as agent:
        wait_until_serving(agent)
        assert "serving at most 272 connections, not 5000: the descriptor limit is 400" in (
            agent.log()
        )


@pytest.mark.parametrize("kind", SERVICES)
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--web.max-connections", "0"),
        ("--web.header-timeout", "0"),
        ("--web.idle-timeout", "nan"),
        ("--web.idle-timeout", "inf"),
    ],
)
def test_bad_limits_are_one_line_and_exit_2(
    tmp_path: Path, flag: str, value: str, kind: str
) -> None:
    with service_process(kind, tmp_path, flag, value) as agent:
        assert agent.proc.wait(30) == 2
        lines = agent.log().strip().splitlines()
        assert len(lines) == 1 and flag in lines[0], lines


class _OutOfFdsSocket(socket.socket):
    """A listening socket whose accept() fails as it does when the process has no
    descriptor left (asyncio logged this ~5,000 times a second in 0.1.0)."""

    def accept(self) -> tuple[socket.socket, object]:
        raise OSError(errno.EMFILE, "Too many open files")


def test_accept_out_of_descriptors_closes_the_stalest_then_pauses_and_logs_rarely(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[int, bool, bool]:
        from aiohttp import web

        from gpufeed.web.listener import HttpListener

        app = web.Application()
        runner = web.AppRunner(app)
        await runner.setup()
        assert runner.server is not None
        listening = _OutOfFdsSocket(socket.AF_INET, socket.SOCK_STREAM)
        listening.bind(("127.0.0.1", 0))
        listener = HttpListener(runner.server, [listening], limits=ConnectionLimits())
        a, b = socket.socketpair()
        stale = listener.guard.admit(a)
        listener._accept(listening)  # frees a descriptor: the stalest connection goes
        evicted = _shut(stale.sock)
        for _ in range(5000):  # nothing left to close: accepting pauses
            listener._accept(listening)
        paused = listening in listener._paused
        listener.close()
        await runner.cleanup()
        b.close()
        a.close()
        return listener.guard.evicted_total, evicted, paused

    with caplog.at_level(logging.DEBUG, "gpufeed.web"):
        evicted_total, evicted, paused = asyncio.run(scenario())
    assert evicted_total == 1 and evicted and paused
    lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
