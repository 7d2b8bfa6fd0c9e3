"""Ephemeral ports for the servers tests and benchmarks start, and proof of whose they are.

Every server is started on port 0 and the port is read back from the kernel's socket table
for the child's own pid: two test runs on one host never collide, and what answers on the
port is the process we started, not whatever happened to listen there (in 0.1.0 the
benchmark measured a stray Prometheus on its fixed port).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil


def listening_ports(pid: int) -> set[int]:
    """TCP ports process `pid` listens on (empty when it has exited)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except psutil.NoSuchProcess:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}


def wait_listening(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30.0
) -> int:
    """The one TCP port `proc` (started with a port 0 listen address) listens on."""

    def exited() -> str | None:
        code = proc.poll()
        return None if code is None else f"{proc.args!r} exited with {code}"

    return _wait_port(proc.pid, exited, timeout)


def wait_pid_listening(pid: int, timeout: float = 30.0) -> int:
    """The one TCP port process `pid` listens on, for a process that is not our child (a
    shell script's background job: bench/gpu-smoke.sh runs `python tests/procports.py PID`)."""

    def exited() -> str | None:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.NoSuchProcess:
            pass
        return f"pid {pid} exited"

    return _wait_port(pid, exited, timeout)


def _wait_port(pid: int, exited: Callable[[], str | None], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gone = exited()
        if gone is not None:
            raise AssertionError(f"{gone} before listening")
        ports = listening_ports(pid)
        if len(ports) == 1:
            return ports.pop()
        if len(ports) > 1:
            raise AssertionError(f"pid {pid} listens on several ports: {sorted(ports)}")
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not listen within {timeout}s")


def owns_port(pid: int, port: int) -> bool:
    """Whether `port` is bound by `pid` itself (what a measurement must check first)."""
    return port in listening_ports(pid)


@contextmanager
def refused_port() -> Iterator[int]:
    """A port that refuses connections for as long as the block runs: bound by us and not
    listening, so no other process can take it meanwhile (a closed port could be reused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Waits until `url` answers 200 while `proc` (the server behind it) still runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} was not ready within {timeout}s")


@contextmanager
def owned_server(
    args: list[str], ready_path: str, log: Path | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Starts a server whose argv binds port 0, and yields (process, base URL) once the
    port it bound answers `ready_path`; stops it on exit."""
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    try:
        url = f"http://127.0.0.1:{wait_listening(proc)}"
        wait_ready(url + ready_path, proc)
        yield proc, url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[Any]) -> None:
    """Ends a child the test started: SIGTERM, 10 s to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main(argv: list[str]) -> int:
    """`python tests/procports.py PID [TIMEOUT_SECONDS]` prints the port PID listens on; exit
    1 with one line on stderr when it exits first or does not listen in time."""
    if len(argv) not in (2, 3) or not argv[1].isdigit():
        print("usage: procports.py PID [TIMEOUT_SECONDS]", file=sys.stderr)
        return 2
    try:
        print(wait_pid_listening(int(argv[1]), float(argv[2]) if len(argv) == 3 else 30.0))
    except AssertionError as exc:
        print(f"procports: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
