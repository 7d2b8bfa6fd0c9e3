"""`python -m bench.serving_bodies`: what large serving bodies cost the agent's serving
collector (issue 26: six 8 MB bodies drove the agent's RSS from 49 to 307 MB).

Starts `--endpoints` real HTTP servers in a child process, each answering `--mb` MB of
vLLM-style exposition text (the queue gauge first, then histogram buckets), and runs the
real `ServingCollector` over them, `--ticks` times back to back, in this process: as
endpoints the administrator configured, or (`--declared`) as URLs jobs declared. Prints
this process's RSS before, at its peak and after, and the wall and CPU time of one tick.

`--agent SECONDS` runs the real agent process instead (`--gpu.backend=off`, the endpoints
in its config) for that long, scraping its `/metrics` once a second: its RSS at start and
end, its CPU use, and the scrape's p50.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil

import gpufeed
from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.serving import ServingCollector
from gpufeed.config import AgentConfig, ServingConfig
from gpufeed.model import iter_samples
from gpufeed.serving.endpoints import DeclaredServing, ServingEndpoint

SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
n, size = int(sys.argv[1]), int(sys.argv[2])
line = b'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="m"} 12.0\n'
body = b"vllm:num_requests_waiting 3\n" + line * (size // len(line))
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
servers = [ThreadingHTTPServer(("127.0.0.1", 0), H) for _ in range(n)]
print(" ".join(str(s.server_address[1]) for s in servers), flush=True)
import threading
for s in servers:
    s.daemon_threads = True
    threading.Thread(target=s.serve_forever, daemon=True).start()
sys.stdin.read()
"""


def rss_mb() -> float:
    fields = Path("/proc/self/statm").read_text().split()
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def run_agent(urls: list[str], seconds: float, timeout: float) -> str:
    from tests.procports import wait_listening

    # the agent runs the gpufeed this process imports (main's or a branch's, to compare)
    env = dict(os.environ, PYTHONPATH=str(Path(gpufeed.__file__).parents[1]))

    with tempfile.TemporaryDirectory(prefix="gpufeed-bodies-") as tmp:
        eps = "".join(f"    - {{url: '{u}', job_id: job-{i}}}\n" for i, u in enumerate(urls))
        cfg = Path(tmp) / "agent.yaml"
        cfg.write_text(
            f"correlator:\n  windows_log: {tmp}/windows.jsonl\n"
            f"serving:\n  timeout_seconds: {timeout}\n  endpoints:\n{eps}"
        )
        args = ["--gpu.backend=off", "--config", str(cfg), "--sdk.socket", f"{tmp}/s"]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufeed",
                "agent",
                *args,
                "--web.listen-address",
                "127.0.0.1:0",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{wait_listening(proc)}/metrics"
            while True:  # 503 until the first sample
                try:
                    with urllib.request.urlopen(url, timeout=10):
                        break
                except urllib.error.HTTPError:
                    time.sleep(0.2)
            ps = psutil.Process(proc.pid)
            start_mb, cpu0, t0 = ps.memory_info().rss / 1e6, ps.cpu_times(), time.monotonic()
            scrapes: list[float] = []
            while time.monotonic() - t0 < seconds:
                s0 = time.perf_counter()
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
                scrapes.append(time.perf_counter() - s0)
                time.sleep(max(0.0, 1.0 - (time.perf_counter() - s0)))
            cpu1, wall = ps.cpu_times(), time.monotonic() - t0
            cores = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall
            end_mb = ps.memory_info().rss / 1e6
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return (
        f"agent over {wall:.0f} s: RSS {start_mb:.0f} -> {end_mb:.0f} MB, {cores:.2f} cores, "
        f"/metrics p50 {statistics.median(scrapes) * 1e3:.1f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=6)
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=5.0, help="serving.timeout_seconds")
    ap.add_argument("--declared", action="store_true", help="as URLs jobs declared")
    ap.add_argument("--agent", type=float, metavar="SECONDS", help="the real agent instead")
    args = ap.parse_args(argv)
    size = int(args.mb * 1e6)
    srv = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.endpoints), str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the connections the collector cuts short
        text=True,
    )
    try:
        assert srv.stdout is not None
        urls = [f"http://127.0.0.1:{p}/metrics" for p in srv.stdout.readline().split()]
        if args.agent:
            print(
                f"{args.endpoints} endpoints x {args.mb:g} MB, {run_agent(urls, args.agent, args.timeout)}"
            )
            return 0
        if args.declared:
            declared = {f"job-{i}": DeclaredServing(f"job-{i}", u) for i, u in enumerate(urls)}
            cfg = AgentConfig(serving=ServingConfig((), args.timeout))
            c = ServingCollector(CollectorContext(config=cfg), lambda: declared)
        else:
            eps = tuple(ServingEndpoint(u, f"job-{i}") for i, u in enumerate(urls))
            cfg = AgentConfig(serving=ServingConfig(eps, args.timeout))
            c = ServingCollector(CollectorContext(config=cfg))
        before = rss_mb()
        walls: list[float] = []
        cpus: list[float] = []
        up = 0.0
        for _ in range(args.ticks):
            w0, c0 = time.perf_counter(), time.process_time()
            fams = c.collect()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            up = sum(s.value for s in iter_samples(fams) if s.name == "gpufeed_serving_up")
        after = rss_mb()
        c.close()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        kind = "declared by jobs" if args.declared else "configured"
        print(
            f"{args.endpoints} endpoints ({kind}) x {args.mb:g} MB, {args.ticks} ticks: "
            f"RSS {before:.0f} -> {after:.0f} MB (peak {peak:.0f} MB); "
            f"tick wall p50 {statistics.median(walls) * 1e3:.0f} ms, "
            f"CPU {statistics.median(cpus) * 1e3:.0f} ms; up {up:g} of {args.endpoints}"
        )
    finally:
        srv.kill()
        srv.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
