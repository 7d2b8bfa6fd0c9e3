"""The SDK socket under attack, against a real agent process: job churn, floods of packed
datagrams, and a flooding sender beside a real job."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd, http_get, wait_for_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

# A process that sends SDK datagrams as fast as it can for `seconds`:
#   churn: a new job id per datagram (a step, then a close)
#   packed: datagrams packed full (8 KiB) of steps for one job
SENDER = textwrap.dedent(
    """
    import os, socket, sys, time
    from gpufeed.jobs import wire
    path, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(path)
    step = lambda j: wire.encode(wire.Message(wire.KIND_STEP, j, "flood", seconds=0.1,
                                              compute_seconds=0.1, steps=1))
    close = lambda j: wire.encode(wire.Message(wire.KIND_CLOSE, j, "flood"))
    one = step("flood")
    packed = one * (wire.MAX_DATAGRAM_BYTES // len(one))
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        d = step(j := f"churn-{os.getpid()}-{n}") + close(j) if mode == "churn" else packed
        try:
            s.send(d)
        except BlockingIOError:
            pass
        except OSError:
            time.sleep(0.001)
    """
)


@dataclass(frozen=True, slots=True)
class Agent:
    proc: subprocess.Popen[bytes]
    url: str
    socket_path: str

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def real_agent(tmp_path: Path, config: str = "") -> Iterator[Agent]:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'windows.jsonl'}\n{config}")
    sock = str(tmp_path / "sdk.sock")
    port = _free_port()
    cmd = gpufeed_cmd(
        "agent",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--config={cfg}",
        "--gpu.backend=simulated",
        f"--sdk.socket={sock}",
        "--log.level=warning",
    )
    proc = subprocess.Popen(cmd, env=agent_env())
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for_metrics(url, proc)
        yield Agent(proc, url, sock)
    finally:
        proc.terminate()
        proc.wait(15)


def _sender(agent: Agent, mode: str, seconds: float) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", SENDER, agent.socket_path, mode, str(seconds)]
    return subprocess.Popen(cmd, env=agent_env())


def test_job_churn_keeps_memory_bounded(tmp_path: Path) -> None:
    """A new job id per message, sampled 5 times a second: every snapshot brings the
    correlator a table full of new jobs. Before 0.2.0 each stayed for 15 minutes after
    its last sample (RSS +9 MB per 10 s here, 260 MB at steady state at 1 Hz)."""
    with real_agent(tmp_path, "interval_seconds: 0.2\n") as agent:
        churn = _sender(agent, "churn", 40)
        try:
            time.sleep(10)  # the tables fill up
            warm = agent.rss_bytes()
            churn.wait(60)
            end = agent.rss_bytes()
        finally:
            churn.kill()
        assert http_get(agent.url)[0] == 200
    grown_mb = (end - warm) / 2**20
    assert end < 100 * 2**20, f"RSS {end / 2**20:.1f} MB under churn"
    assert grown_mb < 8, f"RSS grew {grown_mb:.1f} MB in 30 s of churn"
