"""sd_notify against a real unix datagram socket: READY, STOPPING and the watchdog, which
pings while the sampler makes progress and falls silent when it stalls."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd, isolated_agent_args
from gpufeed.agent.sampler import Sampler
from gpufeed.agent.sdnotify import (
    Notifier,
    ServiceNotifier,
    notify_address,
    watchdog_interval_seconds,
)
from gpufeed.model import Family
from gpufeed.snapshot import Snapshot


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket in the role of systemd's $NOTIFY_SOCKET."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    try:
        yield sock, path
    finally:
        sock.close()


def receive(sock: socket.socket, until_seconds: float) -> list[tuple[float, str]]:
    """Every message that arrives within the time, with its arrival time."""
    got: list[tuple[float, str]] = []
    deadline = time.monotonic() + until_seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            got.append((time.monotonic(), sock.recv(4096).decode()))
        except TimeoutError:
            break
    return got


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@sd-notify-x", "\0sd-notify-x"),
        ("vsock:2:1234", None),
    ],
)
def test_notify_address_forms(value: str, expected: str | None) -> None:
    assert notify_address({"NOTIFY_SOCKET": value} if value else {}) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "43"}, None),  # another process's
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
    ],
)
def test_watchdog_interval_from_environment(env: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval_seconds(env, pid=42) == expected


def test_notifier_sends_datagrams_to_a_path_and_an_abstract_socket(
    notify_socket: tuple[socket.socket, str],
) -> None:
    sock, path = notify_socket
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": path})
    assert notifier is not None
    assert notifier.send("READY=1")
    assert sock.recv(100) == b"READY=1"
    notifier.close()

    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"gpufeed-test-{os.getpid()}-{time.monotonic_ns()}"
    abstract.bind("\0" + name)
    try:
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "@" + name})
        assert notifier is not None and notifier.send("WATCHDOG=1")
        assert abstract.recv(100) == b"WATCHDOG=1"
        notifier.close()
    finally:
        abstract.close()


def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    service = ServiceNotifier.ready(lambda: True, env={})
    service.stopping()


def test_a_vanished_notify_socket_is_a_logged_failure_not_an_exception(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "gone.sock"))
    assert notifier.send("READY=1") is False
    notifier.close()


class _StallingProcessor:
    """A processor that blocks the sampler's tick once `stall` is set, as a sink stuck on a
    dead disk or a deadlock would."""

    name = "staller"

    def __init__(self) -> None:
        self.stall = threading.Event()
        self.release = threading.Event()

    def process(self, snapshot: Snapshot) -> list[Family]:
        if self.stall.is_set():
            self.release.wait(60)
        return []


@pytest.mark.slow
def test_watchdog_pings_while_sampling_progresses_and_stops_when_it_stalls(
    notify_socket: tuple[socket.socket, str],
) -> None:
    sock, path = notify_socket
    staller = _StallingProcessor()
    sampler = Sampler([], interval_seconds=0.05, timeout_seconds=0.05, processors=[staller])
    sampler.start()
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}
    service = ServiceNotifier.ready(lambda: not sampler.stall_reason(time.time()), env=env)
    try:
        first = receive(sock, 3.0)
        assert first[0][1] == "READY=1"
        pings = [t for t, m in first if m == "WATCHDOG=1"]
        # Every half interval (0.5 s) while sampling progresses; slack for a loaded host.
        assert len(pings) >= 4, first
        assert max(b - a for a, b in itertools.pairwise(pings)) < 1.0

        staller.stall.set()
        stalled_at = time.monotonic()
        during = receive(sock, sampler.stale_after_seconds + 4.0)
        last_ping = max((t for t, m in during if m == "WATCHDOG=1"), default=stalled_at)
        # The pings stop once the last sample is older than the /healthz limit, and stay
        # stopped: systemd would kill the agent WatchdogSec later.
        assert last_ping - stalled_at <= sampler.stale_after_seconds + 1.5
        assert time.monotonic() - last_ping >= 2.5  # five periods without a ping
        assert sampler.stall_reason(time.time()).startswith("last sample is")

        staller.release.set()  # the stuck call returns: sampling and pings resume
        staller.stall.clear()
        resumed = receive(sock, 2.0)
        assert [m for _, m in resumed].count("WATCHDOG=1") >= 2
    finally:
        staller.release.set()
        service.stopping()
        sampler.stop()
    assert sock.recv(100) == b"STOPPING=1"


@pytest.mark.slow
def test_real_agent_says_ready_pings_the_watchdog_and_says_stopping(
    notify_socket: tuple[socket.socket, str], tmp_path: Path
) -> None:
    sock, path = notify_socket
    env = agent_env() | {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"}
    proc = subprocess.Popen(
        gpufeed_cmd("agent", *isolated_agent_args(("--simulate",), tmp_path)),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        got = [m for _, m in receive(sock, 6.0)]
        assert got and got[0] == "READY=1", got
        assert got.count("WATCHDOG=1") >= 5, got
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert [m for _, m in receive(sock, 1.0)][-1:] == ["STOPPING=1"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
