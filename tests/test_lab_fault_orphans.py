"""A fault's processes die with the runner that started them, also when the runner is
killed with SIGKILL, which no trap sees (lab.faults.dies_with_runner)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

RUNNER = """
import subprocess, sys, time
from lab.faults import dies_with_runner
argv = [sys.executable, "-c", "import time; time.sleep(120)"]
wrap = dies_with_runner if sys.argv[1] == "wrapped" else (lambda a: a)
p = subprocess.Popen(wrap(argv), start_new_session=True)
print(p.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _orphan_after_sigkill(mode: str) -> tuple[int, bool]:
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert runner.stdout is not None
    child = int(runner.stdout.readline())
    time.sleep(0.3)  # the child has exec'd its command
    runner.send_signal(signal.SIGKILL)
    runner.wait(10)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    return child, _alive(child)


def test_a_fault_process_dies_with_a_sigkilled_runner() -> None:
    child, alive = _orphan_after_sigkill("wrapped")
    assert not alive, f"fault process {child} outlived its runner"


def test_without_the_wrapper_it_would_outlive_it() -> None:
    # the control: what the lab did before (and what this test would catch)
    child, alive = _orphan_after_sigkill("plain")
    try:
        assert alive
    finally:
        if alive:
            os.kill(child, signal.SIGKILL)
