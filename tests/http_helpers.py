"""Helpers for the HTTP server tests: a process of each gpufeed HTTP service (the agent,
the fleet, the scheduler: they share one web layer, and its tests run on all three) on an
ephemeral port, with its log in a file, and timed scrapes over fresh connections (the hard
case: each must be accepted)."""

from __future__ import annotations

import http.client
import math
import re
import resource
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from conftest import agent_env, gpufeed_cmd, isolated_agent_args
from procports import stop

# Every service that serves HTTP through gpufeed.web.
SERVICES = ("agent", "fleet", "scheduler")
# How each names itself on its error lines.
ERROR_PREFIX = {
    "agent": "gpufeed agent: error: ",
    "fleet": "gpufeed fleet: ",
    "scheduler": "gpufeed scheduler: ",
}
# The paths each serves (the fleet's and the scheduler's /healthz is 503 here: their TSDB
# and scheduler do not answer).
PATHS = {
    "agent": ("/metrics", "/healthz", "/api/windows", "/"),
    "fleet": ("/metrics", "/healthz", "/api/windows"),
    "scheduler": ("/metrics", "/healthz"),
}
# A TSDB that is not there (the discard port): the fleet's cycles fail, its page is served.
NO_TSDB = "http://127.0.0.1:9"


@dataclass(frozen=True, slots=True)
class Agent:
    """A running service (the agent, or another one of SERVICES)."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _limit_fds(nofile: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return apply


def _listening_port(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> int:
    """The port the service names in its log (it binds port 0), or 0 if it exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"listening on https?://[^ ]*:(\d+)/", log_path.read_text())
        if found:
            return int(found.group(1))
        if proc.poll() is not None:
            return 0
        time.sleep(0.05)
    raise AssertionError(f"the service did not listen in {timeout}s:\n{log_path.read_text()}")


def service_cmd(kind: str, tmp: Path, args: tuple[str, ...]) -> list[str]:
    """The command line of a `kind` service on 127.0.0.1, port 0, with `args`, that touches
    nothing shared: a simulated agent with its own SDK socket and windows log; a fleet with
    its own windows log, reading a TSDB that is not there; a scheduler whose Slurm clients
    are not there (each still serves its page)."""
    if kind == "agent":
        return gpufeed_cmd("agent", "--simulate", *isolated_agent_args(args, tmp))
    listen = [] if "--web.listen-address" in args else ["--web.listen-address", "127.0.0.1:0"]
    if kind == "fleet":
        return gpufeed_cmd(
            "fleet", "--prometheus.url", NO_TSDB, "--fleet.settle", "0",
            "--fleet.windows-log", str(tmp / "windows.jsonl"), *listen, *args,
        )  # fmt: skip
    assert kind == "scheduler", kind
    (tmp / "bin").mkdir(exist_ok=True)
    return gpufeed_cmd(
        "scheduler", "--scheduler", "slurm", "--slurm.bin-dir", str(tmp / "bin"), *listen, *args
    )


@contextmanager
def agent_process(tmp_path: Path, *args: str, nofile: int | None = None) -> Iterator[Agent]:
    """A simulated agent on 127.0.0.1, port 0, with its own SDK socket and windows log
    (stopped on exit); `nofile` sets its descriptor limit."""
    with service_process("agent", tmp_path, *args, nofile=nofile) as agent:
        yield agent


@contextmanager
def service_process(
    kind: str, tmp_path: Path, *args: str, nofile: int | None = None
) -> Iterator[Agent]:
    """A `kind` service (one of SERVICES: `service_cmd`), stopped on exit; `nofile` sets
    its descriptor limit."""
    tmp = Path(tempfile.mkdtemp(dir=tmp_path, prefix=f"{kind}-"))
    log_path = tmp / f"{kind}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            service_cmd(kind, tmp, args),
            env=agent_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_limit_fds(nofile) if nofile else None,
        )
    try:
        yield Agent(proc, _listening_port(proc, log_path, 30.0), log_path)
    finally:
        stop(proc)


def get(
    port: int,
    path: str = "/metrics",
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request over a new connection: (status, headers, body)."""
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def wait_until_serving(agent: Agent, timeout: float = 20.0, **kwargs: object) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.proc.poll() is not None:
            raise AssertionError(f"service exited with {agent.proc.returncode}:\n{agent.log()}")
        try:
            if get(agent.port, timeout=2, **kwargs)[0] == 200:  # type: ignore[arg-type]
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"service on {agent.port} did not serve /metrics in {timeout}s")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def timed_scrapes(
    port: int,
    count: int,
    *,
    pause_seconds: float = 0.0,
    path: str = "/metrics",
    budget_seconds: float = 15.0,
) -> tuple[list[float], list[str]]:
    """`count` scrapes, each on a fresh connection: (latencies in s of the good ones, errors).

    Scrapes not started within `budget_seconds` count as errors, so that a server that
    does not answer fails the test quickly instead of timing out scrape after scrape."""
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + budget_seconds
    for i in range(count):
        if time.monotonic() > deadline:
            errors.extend(["not started: out of time"] * (count - i))
            break
        start = time.perf_counter()
        try:
            status, _, _ = get(port, path, timeout=2.0)
        except OSError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors.append(f"HTTP {status}")
        time.sleep(pause_seconds)
    return latencies, errors
