"""`gpufeed run` against a real agent: each run is a job of its own, named after its program.

Two `gpufeed run -- python PROGRAM` started at once, with no scheduler, each run a real
PyTorch DataLoader loop (CPU) and stay alive until both have looped, so they overlap. The
agent (a real `gpufeed agent` process on a socket and port of its own) must report two
jobs with their own step counts, both named after the command, not one job "python" with
the steps summed (0.1.0). One run leads its process group, as a shell's command line does
(its id is the group's, `pg<pid>-<start>`, as gpufeed_job_info names its GPU processes);
the other shares the test's group, as background runs of one script share the script's
(its id is `run<pid>-<start>`).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import agent_env, gpufeed_cmd, wait_for_metrics
from gpufeed.jobs.identity import read_proc_stat

pytestmark = pytest.mark.slow

PROGRAM = r"""
import os, sys, time
from torch.utils.data import DataLoader

steps, ready, gate = int(sys.argv[1]), sys.argv[2], sys.argv[3]
for batch in DataLoader(list(range(steps)), batch_size=1):
    time.sleep(0.01)
open(ready, "w").close()
while not os.path.exists(gate):  # both runs alive at once
    time.sleep(0.02)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_agent(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    cfg = tmp / "agent.yaml"
    cfg.write_text(f"interval_seconds: 0.2\ncorrelator:\n  windows_log: {tmp / 'windows.jsonl'}\n")
    for _ in range(5):  # the port may be taken between free_port() and the agent's bind
        port = free_port()
        proc = subprocess.Popen(
            gpufeed_cmd(
                "agent",
                "--config",
                str(cfg),
                "--web.listen-address",
                f"127.0.0.1:{port}",
                "--sdk.socket",
                str(tmp / "sdk.sock"),
            ),
            env=agent_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            wait_for_metrics(url, proc)
            return proc, url
        except AssertionError:
            proc.kill()
            proc.wait()
    raise AssertionError("no agent could listen")


def sdk_jobs(url: str) -> dict[str, tuple[str, float]]:
    """job_id -> (name, steps) from the agent's /metrics."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, tuple[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "gpufeed_job_steps_total":
                out[s.labels["job_id"]] = (s.labels.get("name", ""), s.value)
    return out


def test_two_concurrent_runs_are_two_jobs_named_after_their_program(tmp_path: Path) -> None:
    agent, url = start_agent(tmp_path)
    prog = tmp_path / "loop.py"
    prog.write_text(PROGRAM)
    gate = tmp_path / "gate"
    runs: list[subprocess.Popen[bytes]] = []
    try:
        for i, (steps, leader) in enumerate(((5, True), (7, False))):
            cmd = gpufeed_cmd(
                "run",
                "--socket",
                str(tmp_path / "sdk.sock"),
                "--",
                sys.executable,
                str(prog),
                str(steps),
                str(tmp_path / f"ready{i}"),
                str(gate),
            )
            runs.append(
                subprocess.Popen(
                    cmd, env=agent_env(), stderr=subprocess.PIPE, start_new_session=leader
                )
            )
        stats = [read_proc_stat(Path("/proc"), p.pid) for p in runs]
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline, "the runs did not loop"
            assert all(p.poll() is None for p in runs), "a run ended early"
            time.sleep(0.05)
        gate.touch()
        errs = [p.communicate(timeout=60)[1].decode() for p in runs]
        assert [p.returncode for p in runs] == [0, 0], errs
        assert "gpufeed" not in "".join(errs)  # an agent listens: nothing to say
        jobs: dict[str, tuple[str, float]] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            jobs = sdk_jobs(url)
            if sum(v for _, v in jobs.values()) >= 12:
                break
            time.sleep(0.1)
    finally:
        gate.touch()
        for p in runs:
            if p.poll() is None:
                p.kill()
        agent.terminate()
        agent.wait(10)
    a, b = stats
    assert a is not None and b is not None
    program = Path(sys.executable).name
    assert jobs == {
        f"pg{a.pid}-{a.start_ticks}": (program, 5.0),
        f"run{b.pid}-{b.start_ticks}": (program, 7.0),
    }


def test_no_agent_is_said_once_and_the_program_runs(tmp_path: Path) -> None:
    """Two Python processes under one run (a launcher and its child), each with a DataLoader
    loop whose reports go nowhere: one line on stderr, and the program's own exit status."""
    loop = "from torch.utils.data import DataLoader\nfor b in DataLoader(list(range(3))): pass\n"
    launcher = (
        f"import subprocess, sys\n{loop}"
        "sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1]]) + 3)\n"
    )
    out = subprocess.run(
        gpufeed_cmd(
            "run",
            "--socket",
            str(tmp_path / "none.sock"),
            "--",
            sys.executable,
            "-c",
            launcher,
            loop,
        ),
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, out.stderr
    lines = [line for line in out.stderr.splitlines() if "gpufeed" in line]  # not torch's
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"gpufeed run: no gpufeed agent listens on {tmp_path}/none.sock")
