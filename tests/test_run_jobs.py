"""`gpufeed run` against a real agent: each run is a job of its own, named after its program,
and the I/O a short job does just before it exits is counted.

Two `gpufeed run -- python PROGRAM` started at once, with no scheduler, each run a real
PyTorch DataLoader loop (CPU) and stay alive until both have looped, so they overlap. The
agent (a real `gpufeed agent` process on a socket and port of its own) must report two
jobs with their own step counts, both named after the command, not one job "python" with
the steps summed (0.1.0). One run leads its process group, as a shell's command line does
(its id is the group's, `pg<pid>-<start>`, as gpufeed_job_info names its GPU processes);
the other shares the test's group, as background runs of one script share the script's
(its id is `run<pid>-<start>`).

A short job that writes a checkpoint right after one of the agent's samples and exits
before the next: the agent's per-job written bytes must hold the checkpoint (0.1.0 kept the
last sample's reading, taken before the writes: 12 KB of 27 MB).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def start_agent(run_agent: Any, tmp: Path, interval: float = 0.2) -> str:
    """A real agent on port 0 whose SDK socket is tmp/sdk.sock; its /metrics URL."""
    cfg = tmp / "agent.yaml"
    log = tmp / "windows.jsonl"
    cfg.write_text(f"interval_seconds: {interval}\ncorrelator:\n  windows_log: {log}\n")
    agent = run_agent("--config", str(cfg), "--sdk.socket", str(tmp / "sdk.sock"))
    url = f"{agent.url}/metrics"
    wait_for_metrics(url, agent.proc)
    return url


def samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def sdk_jobs(url: str) -> dict[str, tuple[str, float]]:
    """job_id -> (name, steps) from the agent's /metrics."""
    return {
        labels["job_id"]: (labels.get("name", ""), v)
        for labels, v in samples(url, "gpufeed_job_steps_total")
    }


def written_bytes(url: str, job_id: str) -> float | None:
    for labels, v in samples(url, "gpufeed_job_storage_written_bytes_total"):
        if labels["job_id"] == job_id:
            return v
    return None


def wait_for_next_sample(url: str) -> None:
    """Returns right after the agent's snapshot changes (the collectors' durations do at
    every sample)."""
    first = samples(url, "gpufeed_collector_duration_seconds")
    deadline = time.monotonic() + 30
    while samples(url, "gpufeed_collector_duration_seconds") == first:
        assert time.monotonic() < deadline, "the agent stopped sampling"
        time.sleep(0.02)


def gpufeed_run(tmp: Path, program: Path, *args: str) -> list[str]:
    """`gpufeed run` of a Python program, reporting to the agent of start_agent(tmp)."""
    sock = str(tmp / "sdk.sock")
    return gpufeed_cmd("run", "--socket", sock, "--", sys.executable, str(program), *args)


def test_two_concurrent_runs_are_two_jobs_named_after_their_program(
    run_agent: Any, tmp_path: Path
) -> None:
    url = start_agent(run_agent, tmp_path)
    prog = tmp_path / "loop.py"
    prog.write_text(PROGRAM)
    gate = tmp_path / "gate"
    runs: list[subprocess.Popen[bytes]] = []
    try:
        for i, (steps, leader) in enumerate(((5, True), (7, False))):
            cmd = gpufeed_run(tmp_path, prog, str(steps), str(tmp_path / f"ready{i}"), str(gate))
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


SHORT_JOB = r"""
import os, sys, time
import torch
from torch.utils.data import DataLoader

ready, gate, path, nbytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
for batch in DataLoader(list(range(30)), batch_size=1):
    time.sleep(0.01)
open(ready, "w").close()
while not os.path.exists(gate):
    time.sleep(0.005)
torch.save({"w": torch.zeros(nbytes // 4, dtype=torch.float32)}, path)
"""  # and exits right away


# Filesystems whose writes never reach /proc/PID/io's write_bytes: the kernel counts bytes
# as they dirty page cache of a block-backed filesystem, and tmpfs/ramfs pages have no
# backing device (a CI box with /tmp on tmpfs would read 0 for any job).
UNCOUNTED_FILESYSTEMS = {"tmpfs", "ramfs"}


def filesystem_type(path: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def counted_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on a filesystem whose writes /proc/PID/io counts: `tmp_path`, or
    /var/tmp when `tmp_path` is on tmpfs; removed afterwards."""
    if filesystem_type(tmp_path) not in UNCOUNTED_FILESYSTEMS:
        yield tmp_path
        return
    var_tmp = Path("/var/tmp")
    kind = filesystem_type(var_tmp)
    assert kind not in UNCOUNTED_FILESYSTEMS, (
        f"{tmp_path} and /var/tmp are both on {kind}, whose writes /proc/PID/io does not "
        "count (write_bytes stays 0): this test needs a disk-backed directory"
    )
    out = Path(tempfile.mkdtemp(prefix="gpufeed-short-job-", dir=var_tmp))
    try:
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
def test_a_short_jobs_last_writes_are_counted(
    run_agent: Any, tmp_path: Path, counted_dir: Path
) -> None:
    interval = 4.0  # the job writes and exits well within one interval
    url = start_agent(run_agent, tmp_path, interval)
    prog = tmp_path / "short.py"
    prog.write_text(SHORT_JOB)
    ready, gate, ckpt = tmp_path / "ready", tmp_path / "gate", counted_dir / "ckpt.pt"
    try:
        run = subprocess.Popen(
            gpufeed_run(tmp_path, prog, str(ready), str(gate), str(ckpt), str(27_000_000)),
            env=agent_env(),
            stderr=subprocess.PIPE,
        )
        st = read_proc_stat(Path("/proc"), run.pid)
        assert st is not None
        job_id = f"run{st.pid}-{st.start_ticks}"
        deadline = time.monotonic() + 120
        # The agent has sampled the live process's /proc/PID/io before the checkpoint
        while not ready.exists() or written_bytes(url, job_id) is None:
            assert run.poll() is None, run.communicate()[1]
            assert time.monotonic() < deadline, "the job never showed up in the agent"
            time.sleep(0.05)
        before = written_bytes(url, job_id)
        wait_for_next_sample(url)
        gate.touch()
        started = time.monotonic()
        assert run.wait(timeout=60) == 0, run.communicate()[1]
        took = time.monotonic() - started
        got = None
        deadline = time.monotonic() + 3 * interval
        while time.monotonic() < deadline:
            got = written_bytes(url, job_id)
            if got is not None and got >= ckpt.stat().st_size:
                break
            time.sleep(0.1)
    finally:
        gate.touch()
        if run.poll() is None:
            run.kill()
    size = ckpt.stat().st_size
    print(f"per-job written bytes {got} for a {size}-byte checkpoint (before it: {before})")
    assert took < interval, f"the job took {took:.1f} s: the test needs it within one sample"
    # Before the checkpoint the job has written little (pycache, torch's first-import files:
    # up to ~0.4 MB seen on a loaded host): the sample was taken before the checkpoint.
    assert before is not None and before < size / 10, (before, size)
    # write_bytes counts whole pages, plus the little else the process wrote
    assert got is not None and size <= got <= size + (1 << 20), (
        f"per-job written bytes {got} for a {size}-byte checkpoint on "
        f"{filesystem_type(counted_dir)} ({counted_dir}); before the checkpoint: {before}"
    )
