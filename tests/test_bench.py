"""The benchmarks measure only their own subjects and fail when a subject failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT, agent_env


def test_agent_overhead_exits_nonzero_when_its_agent_fails(tmp_path: Path) -> None:
    # The agent refuses a config file that does not exist and exits at once: the benchmark
    # must say so and exit 1, not report figures of whatever else answers somewhere.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.agent_overhead",
            "--seconds",
            "1",
            "--scrapes",
            "5",
            "--",
            f"--config={tmp_path / 'missing.yaml'}",
        ],
        env=agent_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "agent_overhead: FAILED: gpufeed agent" in out.stderr
    assert "latency ratio" not in out.stdout


def test_agent_overhead_measures_its_own_agent(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.agent_overhead",
            "--seconds",
            "1",
            "--scrapes",
            "5",
        ],
        env=agent_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "latency ratio gpufeed/node_exporter:" in out.stdout
