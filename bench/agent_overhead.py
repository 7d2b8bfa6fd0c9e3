"""Agent vs node_exporter on this host, measured in the same run.

1. Median /metrics latency of the agent and of Debian's prometheus-node-exporter, scraped
   alternately over loopback with a keep-alive-free client (as Prometheus does per scrape),
   reported as a ratio (agent / node_exporter; goal <= 1).
2. The agent's own CPU (utime + stime from /proc/PID/stat) while it samples every second
   and is scraped every second, as a fraction of one core (goal <= 1%).

Usage: python bench/agent_overhead.py [--seconds 60] [--scrapes 300] [-- AGENT FLAGS...]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

AGENT_PORT = 19090
NODE_PORT = 19091
ROOT = Path(__file__).resolve().parent.parent


def wait_ready(port: int, path: str = "/metrics", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, _ = scrape(port, path)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"nothing answered on port {port}{path} within {timeout}s")


def scrape(port: int, path: str = "/metrics") -> tuple[int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, len(body)


def timed_scrape(port: int) -> float:
    t0 = time.perf_counter()
    status, _ = scrape(port)
    if status != 200:
        raise SystemExit(f"scrape of port {port} answered {status}")
    return time.perf_counter() - t0


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
    gpufeed = [
        sys.executable,
        "-m",
        "gpufeed",
        "agent",
        f"--web.listen-address=127.0.0.1:{AGENT_PORT}",
        "--log.level=warning",
        *args.agent_args,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
    agent = subprocess.Popen(gpufeed, env=env)
    node = subprocess.Popen(
        [node_exporter, f"--web.listen-address=127.0.0.1:{NODE_PORT}", "--log.level=warn"],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(AGENT_PORT)
        wait_ready(NODE_PORT)
        for _ in range(20):  # warm both up
            timed_scrape(AGENT_PORT)
            timed_scrape(NODE_PORT)
        agent_lat, node_lat = [], []
        for _ in range(args.scrapes):
            agent_lat.append(timed_scrape(AGENT_PORT))
            node_lat.append(timed_scrape(NODE_PORT))
        a_med, n_med = statistics.median(agent_lat), statistics.median(node_lat)
        _, agent_bytes = scrape(AGENT_PORT)
        _, node_bytes = scrape(NODE_PORT)
        print(
            f"median /metrics latency: gpufeed {a_med * 1e3:.2f} ms ({agent_bytes} bytes), "
            f"node_exporter {n_med * 1e3:.2f} ms ({node_bytes} bytes)"
        )
        print(f"latency ratio gpufeed/node_exporter: {a_med / n_med:.2f} (goal <= 1.00)")
        # CPU: sampling every second (the agent's default) while scraped every second.
        c0, t0 = cpu_seconds(agent.pid), time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            timed_scrape(AGENT_PORT)
            time.sleep(1.0)
        c1, t1 = cpu_seconds(agent.pid), time.monotonic()
        share = (c1 - c0) / (t1 - t0)
        print(
            f"agent CPU over {t1 - t0:.0f}s, sampling and scraped every 1s: "
            f"{share * 100:.2f}% of one core (goal <= 1%)"
        )
    finally:
        for p in (agent, node):
            p.terminate()
            p.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
