"""Agent vs node_exporter on this host, measured in the same run.

1. Median /metrics latency of the agent and of Debian's prometheus-node-exporter, scraped
   alternately over loopback with a keep-alive-free client (as Prometheus does per scrape),
   reported as a ratio (agent / node_exporter; goal <= 1).
2. The agent's own CPU (utime + stime from /proc/PID/stat) while it samples every second
   and is scraped every second, as a fraction of one core (goal <= 1%).

Both servers bind port 0; the port each got is read from the kernel's socket table for the
pid this script started, and checked again before every phase, so the figures are always
those of our own children (0.1.0 used fixed ports and once measured a Prometheus that
happened to listen there). When a subject dies, answers with an error, or is not what it
should be, the script exits 1 and prints no figure.

Usage: python -m bench.agent_overhead [--seconds 60] [--scrapes 300] [-- AGENT FLAGS...]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.procports import owns_port, wait_listening

ROOT = Path(__file__).resolve().parent.parent


class SubjectFailed(Exception):
    """A measured process died, erred or is not ours: no figure may be reported."""


def port_of(proc: subprocess.Popen[bytes], name: str) -> int:
    try:
        return wait_listening(proc, timeout=30)
    except AssertionError as exc:
        raise SubjectFailed(f"{name}: {exc}") from exc


def check_ours(proc: subprocess.Popen[bytes], port: int, name: str) -> None:
    if proc.poll() is not None:
        raise SubjectFailed(f"{name} (pid {proc.pid}) exited with {proc.returncode}")
    if not owns_port(proc.pid, port):
        raise SubjectFailed(f"port {port} is no longer bound by {name} (pid {proc.pid})")


def scrape(port: int, path: str = "/metrics") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError as exc:
        raise SubjectFailed(f"scrape of port {port}: {exc}") from exc
    finally:
        conn.close()


def timed_scrape(port: int) -> float:
    t0 = time.perf_counter()
    status, _ = scrape(port)
    if status != 200:
        raise SubjectFailed(f"scrape of port {port} answered {status}")
    return time.perf_counter() - t0


def expect_metric(port: int, name: str, who: str) -> int:
    """The page's size; fails unless the page is `who`'s (it carries `name`)."""
    status, body = scrape(port)
    if status != 200 or name.encode() not in body:
        raise SubjectFailed(f"port {port} does not serve {who}'s /metrics ({name} missing)")
    return len(body)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="CPU measurement duration")
    ap.add_argument("--scrapes", type=int, default=300, help="latency scrapes per target")
    ap.add_argument("agent_args", nargs="*", help="extra flags for gpufeed agent")
    args = ap.parse_args()
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        raise SystemExit(
            "prometheus-node-exporter is not installed (apt-get install prometheus-node-exporter)"
        )
    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-") as tmp:
        # The agent's SDK socket and windows log in our own directory: nothing shared.
        cfg = Path(tmp) / "agent.yaml"
        cfg.write_text(f"correlator:\n  windows_log: {Path(tmp) / 'windows.jsonl'}\n")
        gpufeed = [
            sys.executable,
            "-m",
            "gpufeed",
            "agent",
            "--web.listen-address=127.0.0.1:0",
            f"--sdk.socket={Path(tmp) / 'sdk.sock'}",
            f"--config={cfg}",
            "--log.level=warning",
            *args.agent_args,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
        agent = subprocess.Popen(gpufeed, env=env)
        node = subprocess.Popen(
            [node_exporter, "--web.listen-address=127.0.0.1:0", "--log.level=warn"],
            stderr=subprocess.DEVNULL,
        )
        try:
            measure(args, agent, node)
        except SubjectFailed as exc:
            print(f"agent_overhead: FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            for p in (agent, node):
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return 0


def measure(
    args: argparse.Namespace, agent: subprocess.Popen[bytes], node: subprocess.Popen[bytes]
) -> None:
    agent_port = port_of(agent, "gpufeed agent")
    node_port = port_of(node, "node_exporter")
    deadline = time.monotonic() + 20
    while True:  # the agent answers once its first snapshot is taken
        try:
            agent_bytes = expect_metric(agent_port, "gpufeed_build_info", "gpufeed")
            break
        except SubjectFailed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    node_bytes = expect_metric(node_port, "node_exporter_build_info", "node_exporter")
    for _ in range(20):  # warm both up
        timed_scrape(agent_port)
        timed_scrape(node_port)
    check_ours(agent, agent_port, "gpufeed agent")
    check_ours(node, node_port, "node_exporter")
    agent_lat, node_lat = [], []
    for _ in range(args.scrapes):
        agent_lat.append(timed_scrape(agent_port))
        node_lat.append(timed_scrape(node_port))
    check_ours(agent, agent_port, "gpufeed agent")
    check_ours(node, node_port, "node_exporter")
    a_med, n_med = statistics.median(agent_lat), statistics.median(node_lat)
    # CPU: sampling every second (the agent's default) while scraped every second.
    c0, t0 = cpu_seconds(agent.pid), time.monotonic()
    while time.monotonic() - t0 < args.seconds:
        timed_scrape(agent_port)
        time.sleep(1.0)
    c1, t1 = cpu_seconds(agent.pid), time.monotonic()
    check_ours(agent, agent_port, "gpufeed agent")
    share = (c1 - c0) / (t1 - t0)
    print(
        f"median /metrics latency: gpufeed {a_med * 1e3:.2f} ms ({agent_bytes} bytes), "
        f"node_exporter {n_med * 1e3:.2f} ms ({node_bytes} bytes)"
    )
    print(f"latency ratio gpufeed/node_exporter: {a_med / n_med:.2f} (goal <= 1.00)")
    print(
        f"agent CPU over {t1 - t0:.0f}s, sampling and scraped every 1s: "
        f"{share * 100:.2f}% of one core (goal <= 1%)"
    )


if __name__ == "__main__":
    sys.exit(main())
