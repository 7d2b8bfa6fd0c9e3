from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from procports import stop, wait_listening

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def agent_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "exporter") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def gpufeed_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufeed", *args]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for_metrics(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"agent exited with {proc.returncode}")
        try:
            status, body = http_get(url, timeout=2)
            if status == 200:
                return body
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer in {timeout}s")


@dataclass(frozen=True, slots=True)
class RunningAgent:
    """An agent this test started, and the ephemeral port it bound itself."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def isolated_agent_args(args: tuple[str, ...], tmp: Path) -> list[str]:
    """`args` plus what keeps an agent off every shared resource of the host, unless the
    test chose otherwise: port 0, an SDK socket and a windows log of its own."""
    out = list(args)
    if "--web.listen-address" not in out:
        out += ["--web.listen-address", "127.0.0.1:0"]
    if "--sdk.socket" not in out:
        out += ["--sdk.socket", str(tmp / "sdk.sock")]
    if "--config" not in out:
        cfg = tmp / "agent.yaml"
        cfg.write_text(f"correlator:\n  windows_log: {tmp / 'windows.jsonl'}\n")
        out += ["--config", str(cfg)]
    return out


@pytest.fixture
def run_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """start(*args) -> RunningAgent, listening (port 0 unless args name one)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> RunningAgent:
        tmp = tmp_path_factory.mktemp("agent")
        p = subprocess.Popen(
            gpufeed_cmd("agent", *isolated_agent_args(args, tmp)),
            env=agent_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        procs.append(p)
        return RunningAgent(p, wait_listening(p))

    yield start
    for p in procs:
        stop(p)


# The modules whose tests take longest (a minute or more each on 2 cores: the lab's short
# forms, package builds, real multi-process jobs, the whole stack). Under pytest-xdist each
# process takes the next test from the front of the queue, so these go first: one of them
# handed out last would run on alone at the end.
LONGEST_FIRST = (
    "test_lab_short.py",
    "test_packaging.py",
    "test_rank_collectives.py",
    "test_e2e_stack.py",
    "test_lab_multinode.py",
    "test_tracegen.py",
    "test_sdk_attack.py",
    "test_sim_pace.py",
    "test_windowlog_chaos.py",
    "test_run_jobs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first (LONGEST_FIRST, then the other `slow` tests, then the rest), each group
    in its collection order."""

    def rank(item: pytest.Item) -> int:
        if item.path.name in LONGEST_FIRST:
            return LONGEST_FIRST.index(item.path.name)
        return len(LONGEST_FIRST) + (item.get_closest_marker("slow") is None)

    items.sort(key=rank)


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """What a test captured (its output, its log records) as text that UTF-8 can carry: a
    pytest-xdist worker sends each report to the controller as UTF-8, and a lone surrogate
    (a path read with surrogateescape, which some tests log on purpose) ended the worker
    with an INTERNALERROR instead of a report."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    report.sections = [(_utf8(title), _utf8(body)) for title, body in report.sections]
    if isinstance(report.longrepr, str):
        report.longrepr = _utf8(report.longrepr)
