"""The real host parts a lab run sets up: loop-mounted ext4 tiers and a job cgroup shaped
the way Slurm shapes one, in every hierarchy the faults need (cgroup v1 blkio + cpu, or
the v2 unified tree with io and cpu enabled).

Everything is made under names unique to this run (the runner's pid and a random suffix)
and undone by `close()`, which is safe to call twice and after a half-finished setup.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# A v1 read/write throttle that never throttles: v1 blkio counts a cgroup's per-device
# bytes in blkio.throttle.io_service_bytes only for devices that have a throttle rule.
NEVER_THROTTLES_BPS = 1 << 40


def sh(*cmd: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip() or out.returncode}")
    return out.stdout.strip()


def dies_with_runner(argv: list[str]) -> list[str]:
    """argv that the kernel kills (SIGKILL) when the runner thread that started it ends
    (util-linux setpriv --pdeathsig; kept across the exec of a cgroup-entering shell). The
    runner's traps stop every fault, but no trap sees SIGKILL: seen here, two CPU hogs and a
    competing reader ran on for 1.5 hours after their runner was killed that way. The
    agent and a capacity tier's FUSE server are started the same way; what a SIGKILL still
    leaves (mounts, loop devices, cgroups) the next runner's start removes (lab.sweep)."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]


# The Python that runs lab/capacity_fs.py: the system's, with Debian's python3-fusepy.
CAPACITY_PYTHON = "/usr/bin/python3"
CAPACITY_FS = Path(__file__).resolve().parent / "capacity_fs.py"


def capacity_problem() -> str | None:
    """Why a tier with a read capacity cannot be made here, or None."""
    if not Path("/dev/fuse").exists():
        return "a tier with a read capacity needs FUSE (/dev/fuse)"
    probe = [CAPACITY_PYTHON, "-c", "import fusepy"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return f"a tier with a read capacity needs python3-fusepy (Debian) for {CAPACITY_PYTHON}"
    return None


@dataclass
class LoopTier:
    """An ext4 filesystem on a loop device over a sparse image in the run directory, the
    loop device reading its image with direct I/O (the workload reads with O_DIRECT too).

    With `read_capacity_bytes_per_s`, the image is served through lab/capacity_fs.py: one
    read capacity that every reader of the tier shares, like one disk (the host disk
    behind a plain image has so much that a competing reader does not slow the job)."""

    name: str
    base: Path
    size_mib: int
    read_capacity_bytes_per_s: int = 0  # 0: the host disk's own
    image: Path = field(init=False)
    mnt: Path = field(init=False)
    loop: str = ""
    mounted: bool = False
    capacity_mnt: Path | None = None
    capacity_proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.image = self.base / f"{self.name}.img"
        self.mnt = self.base / self.name

    def open(self) -> LoopTier:
        self.mnt.mkdir()
        if self.read_capacity_bytes_per_s:
            src = self.base / f"{self.name}.src"
            src.mkdir()
            self.image = src / self.image.name
        with open(self.image, "wb") as f:
            f.truncate(self.size_mib << 20)
        sh("mkfs.ext4", "-q", "-F", "-E", "nodiscard", str(self.image))
        backing = self._serve_with_capacity() if self.read_capacity_bytes_per_s else self.image
        # direct I/O to the image too: the host's page cache must not hide a fault either
        self.loop = sh("losetup", "--find", "--show", "--direct-io=on", str(backing))
        sh("mount", "-o", "noatime", self.loop, str(self.mnt))
        self.mounted = True
        return self

    def _serve_with_capacity(self) -> Path:
        """Mounts the image's directory through capacity_fs; the image's path there."""
        problem = capacity_problem()
        if problem:
            raise RuntimeError(problem)
        d = self.capacity_mnt = self.base / f"{self.name}.dev"
        d.mkdir()
        argv = [CAPACITY_PYTHON, str(CAPACITY_FS), str(self.image.parent), str(d)]
        self.capacity_proc = subprocess.Popen(
            dies_with_runner([*argv, str(self.read_capacity_bytes_per_s)])
        )
        deadline = time.monotonic() + 15.0
        while not os.path.ismount(d):
            if self.capacity_proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"capacity_fs did not mount {d}")
            time.sleep(0.05)
        return d / self.image.name

    @property
    def dev(self) -> str:
        """MAJ:MIN of the loop device (what cgroup throttles name)."""
        st = os.stat(self.loop)
        return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"

    def close(self) -> None:
        if self.mounted:
            for _ in range(20):  # a reader that is just being killed may hold it a moment
                if subprocess.run(["umount", str(self.mnt)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.25)
            else:
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            self.mounted = False
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            self.loop = ""
        if self.capacity_mnt is not None:
            for _ in range(20):  # the loop device lets go of the image just after -d
                if not os.path.ismount(self.capacity_mnt):
                    break
                if (
                    subprocess.run(
                        ["umount", str(self.capacity_mnt)], capture_output=True
                    ).returncode
                    == 0
                ):
                    break
                time.sleep(0.25)
            else:
                subprocess.run(["umount", "-l", str(self.capacity_mnt)], capture_output=True)
            self.capacity_mnt = None
        if self.capacity_proc is not None:
            self.capacity_proc.terminate()
            try:
                self.capacity_proc.wait(10)
            except subprocess.TimeoutExpired:
                self.capacity_proc.kill()
                self.capacity_proc.wait()
            self.capacity_proc = None


def cgroup_mode() -> str:
    """ "v1" where the blkio and cpu controllers are mounted as v1 hierarchies, "v2" where the
    unified tree at /sys/fs/cgroup has io and cpu, else "" (the lab cannot throttle)."""
    if (CGROUP_ROOT / "blkio" / "cgroup.procs").exists() and (
        CGROUP_ROOT / "cpu" / "cgroup.procs"
    ).exists():
        return "v1"
    ctl = CGROUP_ROOT / "cgroup.controllers"
    if ctl.exists() and {"io", "cpu"} <= set(ctl.read_text().split()):
        return "v2"
    return ""


class JobCgroup:
    """A job's cgroup, where Slurm would put it: v1 <ctrl>/<top>/slurm/uid_0/job_<id>,
    v2 <top>/slurmstepd.scope/job_<id>; the agent's job collectors find it there and read the
    job's per-device I/O and CPU throttling from it."""

    def __init__(self, job_id: str, mode: str | None = None) -> None:
        self.job_id = job_id
        self.mode = mode if mode is not None else cgroup_mode()
        if not self.mode:
            raise RuntimeError(
                "no cgroup v1 blkio+cpu hierarchies and no v2 io+cpu: cannot throttle"
            )
        top = f"gpufeed-lab-{os.getpid()}-{secrets.token_hex(3)}"
        if self.mode == "v1":
            self.tops = [CGROUP_ROOT / c / top for c in ("blkio", "cpu")]
            self.dirs = [t / "slurm" / "uid_0" / f"job_{job_id}" for t in self.tops]
        else:
            self.tops = [CGROUP_ROOT / top]
            self.dirs = [self.tops[0] / "slurmstepd.scope" / f"job_{job_id}"]
        self.made: list[Path] = []

    def open(self, devices: list[str]) -> JobCgroup:
        for top, leaf in zip(self.tops, self.dirs, strict=True):
            chain = [top]
            for part in leaf.relative_to(top).parts:
                chain.append(chain[-1] / part)
            for path in chain:
                if not path.exists():
                    path.mkdir()
                    self.made.append(path)
                if self.mode == "v2" and path != leaf:
                    (path / "cgroup.subtree_control").write_text("+io +cpu")
        if self.mode == "v1":  # switch per-device accounting on
            for dev in devices:
                for rule in ("read_bps_device", "write_bps_device"):
                    (self.blkio / f"blkio.throttle.{rule}").write_text(
                        f"{dev} {NEVER_THROTTLES_BPS}\n"
                    )
        return self

    def views(self) -> list[tuple[Path, Path]]:
        """(this job's top cgroup, the mount point of its hierarchy) per hierarchy: what a
        multi-node lab node's agent bind-mounts over the hierarchy's root, so that it sees
        its own node's cgroups only (lab.multinode.harness.node_argv says why)."""
        return [(top, top.parent.resolve()) for top in self.tops]

    @property
    def blkio(self) -> Path:
        return self.dirs[0]

    @property
    def cpu(self) -> Path:
        return self.dirs[-1]

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def enter_argv(self, argv: list[str]) -> list[str]:
        """argv run through a shell that first moves itself into the job's cgroups, then
        execs: what a scheduler's launcher does before it starts the job."""
        writes = " && ".join(f"echo $$ > {p}" for p in self.procs_files())
        return ["sh", "-c", f'{writes} && exec "$@"', "sh", *argv]

    def neighbour_argv(self, argv: list[str], cpu_shares: int = 1024) -> list[str]:
        """argv run in a cgroup beside the job's, under this run's top cgroup in the CPU
        hierarchy: another tenant of the node, competing with the job for the host's CPUs
        as another job does (a process in another session of the root cgroup would not
        slow it: autogroup). `cpu_shares` (v1 units, 1024 the default; v2 cpu.weight
        scaled from it): a low value is batch work that keeps the CPUs busy but yields."""
        d = self.tops[-1] / "neighbour"
        if not d.exists():
            d.mkdir()
            self.made.append(d)
        if self.mode == "v1":
            (d / "cpu.shares").write_text(str(cpu_shares))
        else:
            (d / "cpu.weight").write_text(str(max(1, min(10000, cpu_shares * 100 // 1024))))
        return ["sh", "-c", f'echo $$ > {d / "cgroup.procs"} && exec "$@"', "sh", *argv]

    def add(self, pid: int) -> None:
        for p in self.procs_files():
            p.write_text(str(pid))

    def set_read_limit(self, dev: str, bytes_per_s: int | None) -> None:
        """Reads from `dev` limited to bytes_per_s for the job (None: unlimited)."""
        if self.mode == "v1":
            bps = NEVER_THROTTLES_BPS if bytes_per_s is None else bytes_per_s
            (self.blkio / "blkio.throttle.read_bps_device").write_text(f"{dev} {bps}\n")
        else:
            rate = "max" if bytes_per_s is None else str(bytes_per_s)
            (self.blkio / "io.max").write_text(f"{dev} rbps={rate}\n")

    def set_cpu_quota(self, cpus: float | None) -> None:
        """The job's CPU time limited to `cpus` CPUs (None: unlimited)."""
        period = 100_000
        if self.mode == "v1":
            quota = -1 if cpus is None else max(1000, int(cpus * period))
            (self.cpu / "cpu.cfs_period_us").write_text(str(period))
            (self.cpu / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            value = "max" if cpus is None else str(max(1000, int(cpus * period)))
            (self.cpu / "cpu.max").write_text(f"{value} {period}\n")

    def pids(self) -> set[int]:
        out: set[int] = set()
        for p in self.procs_files():
            with contextlib.suppress(OSError):
                out.update(int(x) for x in p.read_text().split())
        return out

    def close(self) -> None:
        """Ends whatever is still inside (only processes this run put there), then removes
        the directories, deepest first."""
        for d in self.made:
            with contextlib.suppress(OSError):
                for x in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(x), signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for d in reversed(self.made):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # processes still leaving
        self.made.clear()
