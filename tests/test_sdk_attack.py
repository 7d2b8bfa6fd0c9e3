"""The SDK socket under attack, against a real agent process: job churn, floods of packed
datagrams, and a flooding sender beside a real job."""

from __future__ import annotations

import os
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
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import iter_samples
from procports import wait_listening

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

# A process that sends SDK datagrams as fast as it can for `seconds`:
#   churn: a new job id per datagram (a step, then a close)
#   packed: datagrams packed full (8 KiB) of steps for one job
#   small: one step per datagram, for one job
#   real: one epoch every 5 ms for job "real", blocking (so never lost on the way)
SENDER = textwrap.dedent(
    """
    import os, socket, sys, time
    from gpufeed.jobs import wire
    path, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    os.nice(int(sys.argv[4]))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(path)
    step = lambda j: wire.encode(wire.Message(wire.KIND_STEP, j, "flood", seconds=0.1,
                                              compute_seconds=0.1, steps=1))
    close = lambda j: wire.encode(wire.Message(wire.KIND_CLOSE, j, "flood"))
    one = step("flood")
    packed = one * (wire.MAX_DATAGRAM_BYTES // len(one))
    end = time.monotonic() + seconds
    n = 0
    if mode == "real":  # a real job: one epoch every 5 ms, blocking sends (none lost here)
        s.setblocking(True)
        epoch = wire.encode(wire.Message(wire.KIND_EPOCH, "real", "real", seconds=1.0))
        for _ in range(int(seconds * 200)):
            s.send(epoch)
            time.sleep(0.005)
        sys.exit(0)
    s.setblocking(False)
    while time.monotonic() < end:
        n += 1
        if mode == "churn":
            d = step(j := f"churn-{os.getpid()}-{n}") + close(j)
        else:
            d = packed if mode == "packed" else one
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


@contextmanager
def real_agent(tmp_path: Path, config: str = "") -> Iterator[Agent]:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'windows.jsonl'}\n{config}")
    sock = str(tmp_path / "sdk.sock")
    cmd = gpufeed_cmd(
        "agent",
        "--web.listen-address=127.0.0.1:0",
        f"--config={cfg}",
        "--gpu.backend=simulated",
        f"--sdk.socket={sock}",
        "--log.level=warning",
    )
    proc = subprocess.Popen(cmd, env=agent_env())
    try:
        url = f"http://127.0.0.1:{wait_listening(proc)}/metrics"
        wait_for_metrics(url, proc)
        yield Agent(proc, url, sock)
    finally:
        proc.terminate()
        proc.wait(15)


def _sender(socket_path: str, mode: str, seconds: float, nice: int = 0) -> subprocess.Popen[bytes]:
    """A sender in its own session, so in its own process group: another SDK sender."""
    cmd = [sys.executable, "-c", SENDER, socket_path, mode, str(seconds), str(nice)]
    return subprocess.Popen(cmd, env=agent_env(), start_new_session=True)


def test_job_churn_keeps_memory_bounded(tmp_path: Path) -> None:
    """A new job id per message, sampled 5 times a second: every snapshot brings the
    correlator a table full of new jobs. Before 0.2.0 each stayed for 15 minutes after
    its last sample (RSS +9 MB per 10 s here, 260 MB at steady state at 1 Hz)."""
    with real_agent(tmp_path, "interval_seconds: 0.2\n") as agent:
        churn = _sender(agent.socket_path, "churn", 40)
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


def test_a_flooding_process_does_not_starve_a_real_job(tmp_path: Path) -> None:
    """A process flooding packed datagrams beside a real job sending 200 messages a second:
    the job keeps all of them (one bucket for all before 0.2.0: it lost most)."""
    srv = SdkServer(
        str(tmp_path / "sdk.sock"), max_jobs=8, max_messages_per_second=2000, grace_seconds=60
    )
    srv.start()
    try:
        flood = _sender(srv.socket_path, "small", 6)
        time.sleep(1)  # the flood is on before the job starts
        real = _sender(srv.socket_path, "real", 3)
        assert real.wait(30) == 0
        flood.wait(30)
        time.sleep(0.5)  # the server's thread has the last datagrams
        fams = srv.families()
    finally:
        srv.stop()
    got = {(s.name, s.label("job_id") or s.label("reason")): s.value for s in iter_samples(fams)}
    real_epochs = got[("gpufeed_job_epoch_seconds_count", "real")]
    rate_drops = got[("gpufeed_sdk_messages_dropped_total", "rate")]
    assert rate_drops > 1000, "the flood was not over the rate: this test proves nothing"
    assert real_epochs == 600, f"the real job lost {600 - real_epochs:.0f} of 600 messages"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scrape_latencies(url: str, seconds: float) -> list[float]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        status, _ = http_get(url)
        out.append(time.perf_counter() - t0)
        assert status == 200
        time.sleep(0.1)
    return sorted(out)


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
def test_a_flood_of_packed_datagrams_does_not_starve_scrapes(tmp_path: Path) -> None:
    """A process sending datagrams packed full of messages as fast as it can: the SDK
    thread keeps to its budget (a quarter of a core), so /metrics answers in time (before
    0.2.0: 97% of a core and p99 203 ms on an idle machine; 52% and 257 ms on this shared
    2-core one, against 24% and 27 ms now)."""
    with real_agent(tmp_path) as agent:
        quiet = _scrape_latencies(agent.url, 5)
        # one flood process: two would measure the CPU scheduler of a 2-core machine
        floods = [_sender(agent.socket_path, "packed", 14)]
        try:
            time.sleep(2)  # the queue is full from here on
            cpu0, t0 = _cpu_seconds(agent.proc.pid), time.monotonic()
            flooded = _scrape_latencies(agent.url, 10)
            cpu = (_cpu_seconds(agent.proc.pid) - cpu0) / (time.monotonic() - t0)
        finally:
            for f in floods:
                f.kill()
                f.wait()
        fams = http_get(agent.url)[1].decode()
    p99 = flooded[int(0.99 * len(flooded))]
    quiet_p99 = quiet[int(0.99 * len(quiet))]
    p90 = flooded[int(0.9 * len(flooded))]
    quiet_p90 = quiet[int(0.9 * len(quiet))]
    print(
        f"/metrics p90/p99 {quiet_p90 * 1e3:.1f}/{quiet_p99 * 1e3:.1f} ms quiet, "
        f"{p90 * 1e3:.1f}/{p99 * 1e3:.1f} ms flooded; CPU {cpu:.0%}"
    )
    assert 'gpufeed_sdk_messages_dropped_total{reason="rate"}' in fams
    # the budget itself: 0.1.0 took 52-97% of a core here
    assert cpu < 0.4, f"the agent took {cpu:.0%} of a core under the flood"
    # p90, not p99: with ~80 scrapes p99 is the single slowest one, which a loaded host's
    # scheduler decides (42-144 ms seen on a busy 2-core machine with the fix in place);
    # a starved scrape path (0.1.0: p99 203-257 ms) moves the whole tail
    assert p90 < max(0.1, 4 * quiet_p90), f"/metrics p90 {p90 * 1e3:.0f} ms under the flood"
