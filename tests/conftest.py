from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@pytest.fixture
def run_agent() -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            gpufeed_cmd("agent", *args),
            env=agent_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
