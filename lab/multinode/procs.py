"""Processes inside a node's network namespace: the port an agent bound there, what it
serves there, and ending the processes the harness started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

TCP_LISTEN = "0A"
_FETCH = (
    "import sys, urllib.request\n"
    "with urllib.request.urlopen(sys.argv[1], timeout=10) as r:\n"
    "    sys.stdout.buffer.write(r.read())\n"
)


def listening_ports(pid: int, procfs: Path = Path("/proc")) -> set[int]:
    """TCP ports process `pid` listens on, read from its own namespace's socket table
    (/proc/PID/net/tcp*: the table of the namespace PID is in, which the harness's own
    /proc/net/tcp is not), matched to the socket inodes among its descriptors."""
    inodes: set[str] = set()
    try:
        for fd in os.listdir(procfs / str(pid) / "fd"):
            try:
                target = os.readlink(procfs / str(pid) / "fd" / fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (procfs / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == TCP_LISTEN and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def wait_port(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    """The one port `proc` (started on port 0) listens on, once it does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before listening")
        ports = listening_ports(proc.pid)
        if len(ports) == 1:
            return ports.pop()
        time.sleep(0.1)
    raise RuntimeError(f"pid {proc.pid} did not listen within {timeout_s:g} s")


def fetch(netns: str, url: str) -> bytes:
    """GET `url` from inside namespace `netns` (the agent's loopback is only there)."""
    done = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", _FETCH, url],
        capture_output=True,
        check=False,
        timeout=30,
    )
    if done.returncode != 0:
        raise RuntimeError(f"GET {url} in {netns}: {done.stderr.decode().strip()[-300:]}")
    return done.stdout


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """Ends a child the harness started: SIGTERM, `grace_s` to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
