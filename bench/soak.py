"""Soak: a real agent under steady load for a long time; does anything grow?

The agent (simulated GPUs at a fast pace, so that the correlator opens and closes windows
all the time; the real host collectors; a real SDK socket) is loaded with:
- /metrics scrapes at 5 Hz (a new connection each, latency recorded),
- /api/windows at 0.5 Hz,
- SDK jobs starting and ending: a child process every few seconds runs a job with the
  real SDK for a while (steps, phases, an epoch), then closes it or just exits,
- idle connections held open (reopened when the agent closes them).
Each scrape is followed by one of a reference: Python's http.server serving a static copy
of the agent's page, to show what latency the machine allows meanwhile (reported only).
Every 10 s it records the agent's RSS, open fds and threads. After the warm-up it reports
RSS growth (least-squares slope, MB/h), fds and threads (first vs last tenth), and the
/metrics p99, and exits 1 if a target is missed (or the agent died):
    RSS growth < 5 MB/h, fds and threads flat, /metrics p99 < 10 ms.

Usage: python -m bench.soak [--minutes 60] [--warmup-minutes 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.procports import owns_port, wait_listening

ROOT = Path(__file__).resolve().parent.parent

RSS_GROWTH_MB_PER_HOUR = 5.0
METRICS_P99_SECONDS = 0.010
FLAT_SLACK = 4  # fds or threads the last tenth may exceed the first tenth's maximum by
SAMPLE_EVERY_SECONDS = 10.0
JOB_EVERY_SECONDS = 5.0
JOB_SECONDS = 20.0
IDLE_CONNECTIONS = 20

# One SDK job in a child process: the real SDK (loaded by path, as `gpufeed run` does).
CHILD = """
import importlib.util, random, sys, time
spec = importlib.util.spec_from_file_location("gpufeed_sdk", sys.argv[1])
sdk = importlib.util.module_from_spec(spec); spec.loader.exec_module(sdk)
job = sdk.Job(sys.argv[2], socket=sys.argv[3])
end = time.monotonic() + float(sys.argv[4])
for _ in job.track(iter(lambda: time.sleep(0.01), 1)):
    time.sleep(0.02)
    if time.monotonic() > end:
        break
with job.phase("eval"):
    time.sleep(0.05)
job.epoch()
if random.random() < 0.5:
    job.close()  # the other half just exit: the agent notices the pid is gone
"""


@dataclass(frozen=True, slots=True)
class Probe:
    elapsed_seconds: float
    rss_bytes: int
    fds: int
    threads: int


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - t0
    finally:
        conn.close()


def probe(pid: int, start: float) -> Probe:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return Probe(
        elapsed_seconds=time.monotonic() - start,
        rss_bytes=int(fields["VmRSS"].split()[0]) * 1024,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(fields["Threads"]),
    )


def slope_per_hour(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (seconds), per hour."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600.0


class Load:
    """The load generators, each a thread, stopped together."""

    def __init__(self, port: int, sock: str, tmp: Path, reference_port: int) -> None:
        self.port = port
        self.reference_port = reference_port
        self.reference_latencies: list[tuple[float, float]] = []
        self.sock = sock
        self.tmp = tmp
        self.stop = threading.Event()
        self.metrics_latencies: list[tuple[float, float]] = []  # (monotonic, seconds)
        self.errors: list[str] = []
        self.windows_ok = 0
        self.jobs_started = 0
        self._threads = [
            threading.Thread(target=f, daemon=True)
            for f in (self._scrape, self._windows, self._jobs, self._idle)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=JOB_SECONDS + 30)

    def _every(self, period: float, fn: object) -> None:
        nxt = time.monotonic()
        while not self.stop.is_set():
            try:
                fn()  # type: ignore[operator]
            except OSError as exc:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {exc}")
            nxt += period
            self.stop.wait(max(0.0, nxt - time.monotonic()))

    def _scrape(self) -> None:
        def one() -> None:
            status, seconds = get(self.port, "/metrics")
            if status != 200:
                raise OSError(f"/metrics answered {status}")
            self.metrics_latencies.append((time.monotonic(), seconds))
            # the reference, right after and the same way: what this machine allows now
            status, seconds = get(self.reference_port, "/metrics")
            if status != 200:
                raise OSError(f"the reference server answered {status}")
            self.reference_latencies.append((time.monotonic(), seconds))

        self._every(0.2, one)

    def _windows(self) -> None:
        def one() -> None:
            status, _ = get(self.port, "/api/windows")
            if status != 200:
                raise OSError(f"/api/windows answered {status}")
            self.windows_ok += 1

        self._every(2.0, one)

    def _jobs(self) -> None:
        sdk = str(ROOT / "exporter" / "gpufeed" / "sdk.py")
        children: list[subprocess.Popen[bytes]] = []

        def one() -> None:
            for c in [c for c in children if c.poll() is not None]:
                children.remove(c)
            self.jobs_started += 1
            name = f"soak-{os.getpid()}-{self.jobs_started}"
            cmd = [sys.executable, "-c", CHILD, sdk, name, self.sock, str(JOB_SECONDS)]
            children.append(subprocess.Popen(cmd))

        self._every(JOB_EVERY_SECONDS, one)
        for c in children:
            c.wait(JOB_SECONDS + 30)

    def _idle(self) -> None:
        conns: list[socket.socket] = []

        def one() -> None:
            for c in list(conns):  # the agent may close idle connections: reopen them
                try:
                    c.setblocking(False)
                    if c.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                c.close()
                conns.remove(c)
            while len(conns) < IDLE_CONNECTIONS:
                conns.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))

        self._every(5.0, one)
        for c in conns:
            c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--warmup-minutes", type=float, default=20.0)
    ap.add_argument("--pace", type=float, default=10.0, help="--simulate.pace of the agent")
    ap.add_argument("--json", help="also write every probe and the verdict here")
    args = ap.parse_args()
    if args.warmup_minutes >= args.minutes:
        raise SystemExit("--warmup-minutes must be shorter than --minutes")
    with tempfile.TemporaryDirectory(prefix="gpufeed-soak-") as d:
        tmp = Path(d)
        sock = str(tmp / "sdk.sock")
        cfg = tmp / "agent.yaml"
        cfg.write_text(f"correlator:\n  windows_log: {tmp / 'windows.jsonl'}\n")
        cmd = [
            sys.executable,
            "-m",
            "gpufeed",
            "agent",
            "--web.listen-address=127.0.0.1:0",
            f"--config={cfg}",
            "--gpu.backend=simulated",
            f"--simulate.pace={args.pace:g}",
            f"--sdk.socket={sock}",
            "--log.level=warning",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
        agent = subprocess.Popen(cmd, env=env)
        reference: subprocess.Popen[bytes] | None = None
        try:
            port = wait_listening(agent)
            reference = start_reference(port, tmp)
            return soak(agent, port, sock, tmp, wait_listening(reference), args)
        finally:
            for p in (agent, reference):
                if p is None:
                    continue
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()


def start_reference(agent_port: int, tmp: Path) -> subprocess.Popen[bytes]:
    """Python's http.server serving a copy of the agent's page as a static file: scraped
    the same way, it shows what latency this machine allows while the soak runs."""
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", agent_port, timeout=10)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            conn.close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    page = tmp / "reference"
    page.mkdir()
    (page / "metrics").write_bytes(body)
    cmd = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"]
    return subprocess.Popen(cmd, cwd=page, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def soak(
    agent: subprocess.Popen[bytes],
    port: int,
    sock: str,
    tmp: Path,
    reference_port: int,
    args: argparse.Namespace,
) -> int:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError):
            if get(port, "/metrics")[0] == 200 and os.path.exists(sock):
                break
        if agent.poll() is not None or time.monotonic() > deadline:
            print(f"soak: the agent did not come up (rc {agent.poll()})", file=sys.stderr)
            return 1
        time.sleep(0.2)
    start = time.monotonic()
    load = Load(port, sock, tmp, reference_port)
    load.start()
    probes: list[Probe] = []
    end = start + args.minutes * 60
    try:
        while time.monotonic() < end and agent.poll() is None:
            probes.append(probe(agent.pid, start))
            p = probes[-1]
            print(
                f"soak t={p.elapsed_seconds / 60:6.1f} min rss={p.rss_bytes / 2**20:7.1f} MB "
                f"fds={p.fds} threads={p.threads}",
                flush=True,
            )
            time.sleep(min(SAMPLE_EVERY_SECONDS, max(0.0, end - time.monotonic())))
        if agent.poll() is None:
            probes.append(probe(agent.pid, start))
    finally:
        load.join()
    return verdict(agent, probes, load, start, args)


def verdict(
    agent: subprocess.Popen[bytes],
    probes: list[Probe],
    load: Load,
    start: float,
    args: argparse.Namespace,
) -> int:
    warm_s = args.warmup_minutes * 60
    after = [p for p in probes if p.elapsed_seconds >= warm_s]
    lat = sorted(s for t, s in load.metrics_latencies if t - start >= warm_s)
    ref = sorted(s for t, s in load.reference_latencies if t - start >= warm_s) or [0.0]
    ref_p99 = ref[min(len(ref) - 1, int(0.99 * len(ref)))]
    failures: list[str] = []
    if agent.poll() is not None:
        failures.append(f"the agent exited (rc {agent.returncode})")
    elif not owns_port(agent.pid, load.port):
        failures.append(f"port {load.port} is no longer the agent's: measured something else")
    if len(after) < 6 or len(lat) < 100:
        failures.append("too little data after the warm-up")
        growth = p99 = 0.0
        fds = threads = (0, 0)
    else:
        growth = slope_per_hour(
            [p.elapsed_seconds for p in after], [p.rss_bytes / 1e6 for p in after]
        )
        tenth = max(1, len(after) // 10)
        fds = (max(p.fds for p in after[:tenth]), max(p.fds for p in after[-tenth:]))
        threads = (max(p.threads for p in after[:tenth]), max(p.threads for p in after[-tenth:]))
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        if growth >= RSS_GROWTH_MB_PER_HOUR:
            failures.append(f"RSS grew {growth:.2f} MB/h (target < {RSS_GROWTH_MB_PER_HOUR})")
        if fds[1] > fds[0] + FLAT_SLACK:
            failures.append(f"fds rose from {fds[0]} to {fds[1]}")
        if threads[1] > threads[0] + FLAT_SLACK:
            failures.append(f"threads rose from {threads[0]} to {threads[1]}")
        if p99 >= METRICS_P99_SECONDS:
            failures.append(f"/metrics p99 {p99 * 1e3:.1f} ms (target < 10 ms)")
    if load.errors:
        failures.append(f"{len(load.errors)} load errors, first: {load.errors[0]}")
    rss = [p.rss_bytes / 1e6 for p in after] or [0.0]
    print(
        f"soak: {args.minutes:g} min ({args.warmup_minutes:g} warm-up), "
        f"{len(load.metrics_latencies)} scrapes, {load.windows_ok} /api/windows, "
        f"{load.jobs_started} SDK jobs"
    )
    print(
        f"soak: RSS after warm-up {rss[0]:.1f} -> {rss[-1]:.1f} MB (max {max(rss):.1f}), "
        f"growth {growth:.2f} MB/h; fds {fds[0]} -> {fds[1]}; threads {threads[0]} -> "
        f"{threads[1]}; /metrics p50 {statistics.median(lat or [0]) * 1e3:.2f} ms "
        f"p99 {p99 * 1e3:.2f} ms"
    )
    print(
        f"soak: reference (a static copy of the page from http.server, same client, same "
        f"time): p50 {statistics.median(ref) * 1e3:.2f} ms p99 {ref_p99 * 1e3:.2f} ms"
    )
    for f in failures:
        print(f"soak: FAILED: {f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "minutes": args.minutes,
                    "warmup_minutes": args.warmup_minutes,
                    "rss_growth_mb_per_hour": growth,
                    "metrics_p99_seconds": p99,
                    "reference_p99_seconds": ref_p99,
                    "fds_first_last": fds,
                    "threads_first_last": threads,
                    "failures": failures,
                    "probes": [asdict(p) for p in probes],
                },
                indent=1,
            )
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
