"""The lab's busy-host background (lab/faults/busy.py): unrelated work that keeps the host's
CPUs and its disk busy at once. It must do what it says (spinners burn CPU, the driver
forks short-lived processes and writes, fsyncs and reads back on its own scratch tier),
and leave nothing when stopped, nor when its runner is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from lab import faults as faultkit
from lab import scenario as sc
from lab.faults.busy import BusyHost
from lab.host import JobCgroup
from test_lab_short import REPO, _needs_lab

pytestmark = [pytest.mark.slow, pytest.mark.root]

ENTRY = {"kind": "busy_host", "spinners": 1, "procs_per_s": 10, "disk_mib_per_s": 4}
SCENARIO = {"name": "b", "duration_s": 100, "tiers": {"hot": {"size_mib": 32}}}


def _entry(**change: object) -> sc.Fault:
    s = sc.parse({**SCENARIO, "background": [{**ENTRY, "scratch_mib": 32, **change}]})
    return s.background[0]


def _until(what: str, ok: Callable[[], bool], timeout_s: float = 60) -> None:
    """Waits for `ok`; the host may be loaded, so the bound is generous, not a timing."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _group(pgids: set[int]) -> list[int]:
    """Live processes in any of these process groups."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


def _block_stat(loop: str) -> tuple[int, int]:
    """(sectors read, sectors written) of a loop device."""
    f = Path(f"/sys/block/{Path(loop).name}/stat").read_text().split()
    return int(f[2]), int(f[6])


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def _children_cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.children_user + t.children_system)


def test_it_loads_cpu_and_disk_then_leaves_nothing(tmp_path: Path) -> None:
    _needs_lab()
    ctx = faultkit.FaultContext(JobCgroup("0"), {}, tmp_path / "c.json", tmp_path, [])
    inj = faultkit.make_background(_entry(), ctx)
    assert isinstance(inj, BusyHost)
    try:
        inj.prepare()
        loop = inj.scratch.loop
        assert os.path.ismount(inj.scratch.mnt) and loop
        before = _block_stat(loop)
        inj.start()
        spinner, driver = inj.pids()
        _until("the spinner burns CPU", lambda: _cpu_s(spinner) > 0.5)
        # the churn's interpreters, waited for: their CPU time is the driver's children's
        _until("the driver forks processes", lambda: _children_cpu_s(driver) > 0.05)
        _until(
            "the scratch tier is written and read back from its device",
            lambda: all(a > b for a, b in zip(_block_stat(loop), before, strict=True)),
        )
        groups = {os.getpgid(p) for p in inj.pids()}
    finally:
        inj.stop()
    assert _group(groups) == [], "busy-host processes outlived stop()"
    assert not os.path.ismount(tmp_path / "scratch")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert str(tmp_path / "scratch.img") not in loops
    inj.stop()  # idempotent: the runner calls it again on the way out


RUNNER = """
import sys, time
from pathlib import Path
from lab import faults as faultkit, scenario as sc
from lab.host import JobCgroup
d = Path(sys.argv[1])
s = sc.parse({"name": "b", "duration_s": 100, "tiers": {"hot": {"size_mib": 32}},
              "background": [{"kind": "busy_host", "spinners": 2, "scratch_mib": 32}]})
inj = faultkit.make_background(s.background[0], faultkit.FaultContext(
    JobCgroup("0"), {}, d / "c.json", d, []))
inj.prepare()
inj.start()
print(" ".join(map(str, inj.pids())), inj.scratch.loop, flush=True)
time.sleep(120)
"""


def test_its_processes_die_with_a_sigkilled_runner(tmp_path: Path) -> None:
    _needs_lab()
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    loop = ""
    try:
        assert runner.stdout is not None
        *pids, loop = runner.stdout.readline().split()
        assert len(pids) == 3  # two spinners, the driver
        _until("they run", lambda: all(_running(int(p)) for p in pids))
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
        _until("they die with it", lambda: not any(_running(int(p)) for p in pids))
    finally:
        if runner.poll() is None:
            runner.kill()
        # what a SIGKILL does leave (the mount, the loop device) is the next runner's sweep;
        # here the test undoes it itself
        subprocess.run(["umount", "-l", str(tmp_path / "scratch")], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
