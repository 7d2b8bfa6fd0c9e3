"""Each rank's own cgroup, laid out the way a scheduler lays out a job's, where the lab's CPU
quota and tier read limit apply to that rank alone (its input workers inherit it).

cgroup v2 (a unified hierarchy with the cpu and io controllers at /sys/fs/cgroup):
  /sys/fs/cgroup/<prefix>/n<i>_slurmstepd.scope/job_<id>   cpu.max, io.max
cgroup v1 (cpu and blkio hierarchies):
  /sys/fs/cgroup/{cpu,blkio}/<prefix>/slurm_n<i>/uid_0/job_<id>
      cpu.cfs_quota_us, blkio.throttle.read_bps_device

Both are the layouts of Slurm with several slurmd on one host (the node's name in the
directory), so the agent's job collectors find the same job id on every "node" the way
they would on a cluster. On v1, per-cgroup block I/O is only accounted for devices with a
throttle rule, so every tier device gets a rule that never throttles (1 TiB/s) at start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
NEVER_THROTTLES_BPS = 1 << 40
CPU_PERIOD_US = 100_000


def unified_with(controllers: set[str], root: Path = CGROUP_ROOT) -> bool:
    """Whether `root` is a cgroup v2 hierarchy offering every one of `controllers`."""
    try:
        offered = set((root / "cgroup.controllers").read_text().split())
    except OSError:
        return False
    return controllers <= offered


def v1_ready(root: Path = CGROUP_ROOT) -> str | None:
    """Why the v1 cpu and blkio hierarchies cannot be used, or None."""
    for h in ("cpu", "blkio"):
        if not (root / h / "cgroup.procs").exists():
            return f"no cgroup v1 {h} hierarchy at {root / h}"
    return None


def cgroup_problem(root: Path = CGROUP_ROOT) -> str | None:
    """Why no rank cgroup can be made on this host, or None."""
    if unified_with({"cpu", "io"}, root):
        return None
    return v1_ready(root)


class RankCgroup:
    """The cgroup directories of one node's rank; `remove` ends what is left in them."""

    def __init__(
        self, prefix: str, node: int, job_id: str, devices: list[str], root: Path = CGROUP_ROOT
    ) -> None:
        self.v2 = unified_with({"cpu", "io"}, root)
        self.top: list[Path] = []  # the run's own top directories, removed last
        self.dirs: list[Path] = []  # the job directories processes are written to
        if self.v2:
            top = root / prefix
            job = top / f"n{node}_slurmstepd.scope" / f"job_{job_id}"
            self._make(root, job, top)
            self.cpu_dir = self.io_dir = job
        else:
            for h in ("cpu", "blkio"):
                top = root / h / prefix
                self._make(root / h, top / f"slurm_n{node}" / "uid_0" / f"job_{job_id}", top)
            self.cpu_dir, self.io_dir = self.dirs
            for dev in devices:
                self._write(
                    self.io_dir / "blkio.throttle.read_bps_device", f"{dev} {NEVER_THROTTLES_BPS}"
                )
                self._write(
                    self.io_dir / "blkio.throttle.write_bps_device", f"{dev} {NEVER_THROTTLES_BPS}"
                )

    def _make(self, hierarchy: Path, job: Path, top: Path) -> None:
        if top not in self.top:
            self.top.append(top)
        here = hierarchy
        for part in job.relative_to(hierarchy).parts:
            if self.v2:  # a parent passes its controllers down before a child can use them
                self._write(here / "cgroup.subtree_control", "+cpu +io")
            here = here / part
            here.mkdir(exist_ok=True)
        self.dirs.append(job)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        try:
            path.write_text(text + "\n")
        except OSError as exc:
            raise RuntimeError(f"cannot write {text!r} to {path}: {exc.strerror}") from exc

    def enter_command(self) -> str:
        """A shell line that moves the shell into every one of the rank's directories (then
        the caller execs the rank: the rank and its workers start inside)."""
        return " && ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in self.dirs)

    def limit_cpu(self, cpus: float) -> Callable[[], None]:
        """Caps the rank at `cpus` CPUs (a CFS quota); returns the step that lifts it."""
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        if self.v2:
            self._write(self.cpu_dir / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            return lambda: self._write(self.cpu_dir / "cpu.max", f"max {CPU_PERIOD_US}")
        self._write(self.cpu_dir / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        self._write(self.cpu_dir / "cpu.cfs_quota_us", str(quota))
        return lambda: self._write(self.cpu_dir / "cpu.cfs_quota_us", "-1")

    def limit_read(self, device: str, bytes_per_s: int) -> Callable[[], None]:
        """Limits the rank's reads from block device `device` (MAJ:MIN); returns the lift."""
        if self.v2:
            self._write(self.io_dir / "io.max", f"{device} rbps={bytes_per_s}")
            return lambda: self._write(self.io_dir / "io.max", f"{device} rbps=max")
        rule = self.io_dir / "blkio.throttle.read_bps_device"
        self._write(rule, f"{device} {bytes_per_s}")
        return lambda: self._write(rule, f"{device} {NEVER_THROTTLES_BPS}")

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return sorted(out)

    def remove(self) -> None:
        """Kills what is still inside (only the rank this run started, and its workers: a
        stopped or orphaned one), then removes the directories, deepest first."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)  # a stopped process dies only once it runs
        for top in self.top:
            if not top.exists():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                _rmdir(d)
            _rmdir(top)


def _rmdir(d: Path) -> None:
    for _ in range(100):  # killed processes take a moment to leave
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
