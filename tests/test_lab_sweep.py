"""A lab runner killed with SIGKILL (no trap sees it) leaves its tiers mounted on their loop
devices, its job cgroup and its run directory, all named `gpufeed-lab-<pid>-*`; the next
runner removes them when it starts and says what it removed. A live runner's parts are
never touched (another engineer's lab may be running on the same host)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_lab_short import REPO, _leftovers, _needs_lab

pytestmark = [pytest.mark.slow, pytest.mark.root]

# a hot tier served through capacity_fs (FUSE under its loop device) and a plain one: both
# kinds of mount a run makes
SCENARIO = (
    "name: killed\nduration_s: 120\n"
    "workload: {kind: train, device_seconds_per_step: 0.1, samples: 16, checkpoint: {tier: warm}}\n"
    "tiers: {hot: {size_mib: 32, read_capacity_bytes_per_s: 4000000}, warm: {size_mib: 32}}\n"
)


def _processes_naming(tag: str) -> list[str]:
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if tag in cmd and state != "Z":
            out.append(f"{entry}: {cmd[:100]}")
    return out


def test_the_next_runner_sweeps_what_a_sigkilled_one_left(tmp_path: Path) -> None:
    _needs_lab()
    scen = tmp_path / "killed.yaml"
    scen.write_text(SCENARIO)
    out = str(tmp_path / "out")
    runner = subprocess.Popen(
        [sys.executable, "-m", "lab.run", str(scen), "--launcher", "run", "--out", out],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # a live runner's parts (this test's own pid: alive) that the sweep must leave alone
    mine = Path("/sys/fs/cgroup/cpu" if Path("/sys/fs/cgroup/cpu").exists() else "/sys/fs/cgroup")
    live_cg = mine / f"gpufeed-lab-{os.getpid()}-sweeptest"
    live_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpufeed-lab-{os.getpid()}-sweeptest"
    try:
        live_cg.mkdir()
        live_dir.mkdir()
        # killed once its tiers are mounted and its job cgroup and agent are there
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and runner.poll() is None:
            left = _leftovers(runner.pid)
            agent = [x for x in _processes_naming(f"gpufeed-lab-{runner.pid}-") if " agent " in x]
            if any(x.startswith("/sys/fs/cgroup") for x in left) and agent:
                break
            time.sleep(0.2)
        runner.kill()
        runner.wait(10)
        left = _leftovers(runner.pid)
        kinds = {
            "ext4 mount": any(" ext4 " in x for x in left),
            "fuse mount": any(" fuse" in x for x in left),
            "loop device": any(x.startswith("/dev/loop") for x in left),
            "cgroup": any(x.startswith("/sys/fs/cgroup") for x in left),
        }
        assert all(kinds.values()), f"the killed runner left less than expected: {kinds} {left}"

        nxt = subprocess.run(
            [sys.executable, "-m", "lab.run", "no-such-scenario", "--out", str(tmp_path / "o2")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        print(nxt.stderr)
        assert nxt.returncode == 2, nxt.stderr  # swept, then refused the unknown scenario
        assert _leftovers(runner.pid) == []
        assert _processes_naming(f"gpufeed-lab-{runner.pid}-") == []
        said = [x for x in nxt.stderr.splitlines() if x.startswith("lab: swept ")]
        for what in ("mount", "loop device", "cgroup", "dir"):
            assert any(f"swept {what} " in x and f"(runner {runner.pid})" in x for x in said), (
                what,
                said,
            )
        assert all(": FAILED" not in x for x in said), said
        # what a live runner owns stays
        assert live_cg.exists() and live_dir.exists()
        assert all(str(os.getpid()) not in x.split("(runner ")[-1] for x in said), said
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        for d in (live_cg, live_dir):
            if d.exists():
                d.rmdir()
