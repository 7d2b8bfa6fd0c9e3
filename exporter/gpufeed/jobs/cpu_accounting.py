"""Per-job CPU time and CPU-quota throttling from the kernel's cgroup accounting: parsers
and which cgroup a job's CPU is accounted in.

In a cluster a job's input pipeline usually starves inside its own CPU allocation (a
Kubernetes CPU limit, a `cpu.max` a site sets on a Slurm or systemd cgroup), not on a busy
host: the CFS bandwidth controller lets the cgroup run `quota` microseconds per `period`
and throttles it for the rest. The kernel counts that per cgroup:

- cgroup v2 `cpu.stat`: `usage_usec`, and where the cgroup has a quota (`cpu.max` not
  "max"), `nr_periods`, `nr_throttled` (periods in which it was throttled) and
  `throttled_usec`;
- cgroup v1 `cpu` controller: `cpu.stat` with `nr_periods`, `nr_throttled`,
  `throttled_time` (nanoseconds) and the quota in `cpu.cfs_quota_us` (-1: none); the usage
  is the `cpuacct` controller's `cpuacct.usage` (nanoseconds), in the same directory where
  both are mounted together (`cpu,cpuacct`), else at the same path in `cpuacct`'s own.

Throttling is counted by the cgroup whose quota bites, which may be the job's own cgroup or
one above it (a Kubernetes pod's limit sits on the pod directory, the lab's on a cgroup it
made), so the quota cgroup is the nearest one at or above the job's that has a quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufeed.jobs.identity import read_text

V2_STAT = "cpu.stat"
V2_MAX = "cpu.max"
V1_STAT = "cpu.stat"
V1_QUOTA = "cpu.cfs_quota_us"
V1_USAGE = "cpuacct.usage"


@dataclass(frozen=True, slots=True)
class CpuThrottling:
    """CFS bandwidth periods of a cgroup with a quota."""

    periods: int
    throttled_periods: int
    throttled_seconds: float


@dataclass(frozen=True, slots=True)
class CpuStat:
    usage_seconds: float | None  # CPU time the cgroup's tasks used; None: not in the file
    throttling: CpuThrottling | None  # None: no bandwidth counters in the file


def _fields(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value.strip())
        except ValueError:
            continue
    return out


def parse_cpu_stat_v2(text: str) -> CpuStat:
    """cgroup v2 cpu.stat: `key value` lines; times in microseconds."""
    kv = _fields(text)
    usage = kv.get("usage_usec")
    throttling = None
    if {"nr_periods", "nr_throttled", "throttled_usec"} <= kv.keys():
        throttling = CpuThrottling(kv["nr_periods"], kv["nr_throttled"], kv["throttled_usec"] / 1e6)
    return CpuStat(None if usage is None else usage / 1e6, throttling)


def parse_cpu_stat_v1(text: str, usage_text: str | None) -> CpuStat:
    """cgroup v1 cpu.stat (`throttled_time` in nanoseconds) and cpuacct.usage (ns)."""
    kv = _fields(text)
    throttling = None
    if {"nr_periods", "nr_throttled", "throttled_time"} <= kv.keys():
        throttling = CpuThrottling(kv["nr_periods"], kv["nr_throttled"], kv["throttled_time"] / 1e9)
    usage = None
    if usage_text is not None:
        try:
            usage = int(usage_text.strip()) / 1e9
        except ValueError:
            usage = None
    return CpuStat(usage, throttling)


def parse_cpu_max(text: str) -> bool:
    """cgroup v2 cpu.max `QUOTA PERIOD`: True where a quota is set (QUOTA is not "max")."""
    fields = text.split()
    return bool(fields) and fields[0] != "max" and fields[0].isdigit()


def parse_cfs_quota(text: str) -> bool:
    """cgroup v1 cpu.cfs_quota_us: True where a quota is set (not -1)."""
    try:
        return int(text.strip()) > 0
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class CpuHierarchy:
    """One hierarchy that accounts CPU: cgroup v2's unified one, or v1's cpu controller
    (with cpuacct's hierarchy for the usage: `usage_root`, the same one when co-mounted)."""

    root: Path
    v2: bool
    usage_root: Path | None = None

    def has_quota(self, directory: Path) -> bool:
        name = V2_MAX if self.v2 else V1_QUOTA
        text = read_text(directory / name)
        if text is None:
            return False
        return parse_cpu_max(text) if self.v2 else parse_cfs_quota(text)

    def stat(self, directory: Path) -> CpuStat | None:
        """The cgroup's counters; None where its cpu.stat cannot be read."""
        text = read_text(directory / (V2_STAT if self.v2 else V1_STAT))
        if text is None:
            return None
        if self.v2:
            return parse_cpu_stat_v2(text)
        usage = None
        if self.usage_root is not None:
            rel = directory.relative_to(self.root)
            usage = read_text(self.usage_root / rel / V1_USAGE)
        return parse_cpu_stat_v1(text, usage)

    def quota_cgroup(self, directory: Path) -> Path | None:
        """The nearest cgroup at or above `directory` (below the root) that has a quota."""
        try:
            rel = directory.relative_to(self.root)
        except ValueError:
            return None
        parts = rel.parts
        for n in range(len(parts), 0, -1):
            d = self.root.joinpath(*parts[:n])
            if self.has_quota(d):
                return d
        return None


def cpu_hierarchy(cgroup_root: Path) -> CpuHierarchy | None:
    """The hierarchy CPU is accounted in: unified (v2, or hybrid with cpu enabled there),
    else v1's `cpu,cpuacct` (or `cpu`); None where neither is mounted."""
    controllers = read_text(cgroup_root / "cgroup.controllers")
    if controllers is not None:
        return CpuHierarchy(cgroup_root, True) if "cpu" in controllers.split() else None
    unified = read_text(cgroup_root / "unified" / "cgroup.controllers")
    if unified is not None and "cpu" in unified.split():
        return CpuHierarchy(cgroup_root / "unified", True)
    for name in ("cpu,cpuacct", "cpuacct,cpu", "cpu"):
        root = cgroup_root / name
        if (root / V1_STAT).exists():
            usage_root: Path | None = root
            if "cpuacct" not in name.split(","):
                usage_root = cgroup_root / "cpuacct"
                usage_root = usage_root if usage_root.is_dir() else None
            return CpuHierarchy(root, False, usage_root)
    return None


def process_cgroup(text: str, v2: bool) -> str | None:
    """The path of a process's cgroup in the CPU hierarchy, from /proc/PID/cgroup."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if v2 and parts[0] == "0" and controllers == "":
            return path
        if not v2 and "cpu" in controllers.split(","):
            return path
    return None
