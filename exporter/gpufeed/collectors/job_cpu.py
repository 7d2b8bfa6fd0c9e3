"""The "job_cpu" collector: per-job CPU time and CPU-quota throttling (cgroup cpu.stat).

Jobs are found as "job_io" finds them: Slurm and Kubernetes job directories in the cgroup
tree (gpufeed.jobs.io_accounting.find_job_cgroups), whose CPU time is the job directory's;
and SDK jobs under no scheduler (`gpufeed run`), through the cgroup of their processes.
The throttling series come from the nearest cgroup at or above the job's that has a CPU
quota (gpufeed.jobs.cpu_accounting), and are absent where none has one: without a quota
nothing throttles, and zeros would read as "not throttled" where the truth is "no limit".
An SDK job is exported only where such a quota cgroup exists, because the cgroup its
processes sit in otherwise holds unrelated work too (a login session's scope).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpufeed.catalogue import spec
from gpufeed.collectors.base import CollectorContext
from gpufeed.jobs.cpu_accounting import CpuHierarchy, CpuStat, cpu_hierarchy, process_cgroup
from gpufeed.jobs.identity import read_text
from gpufeed.jobs.io_accounting import find_job_cgroups
from gpufeed.model import Families, Family

JobPids = Callable[[], Mapping[str, Sequence[int]]]

USAGE = spec("gpufeed_job_cpu_usage_seconds_total")
PERIODS = spec("gpufeed_job_cpu_periods_total")
THROTTLED_PERIODS = spec("gpufeed_job_cpu_throttled_periods_total")
THROTTLED_SECONDS = spec("gpufeed_job_cpu_throttled_seconds_total")


class JobCpuCollector:
    name = "job_cpu"

    def __init__(self, context: CollectorContext, sdk_job_pids: JobPids | None = None) -> None:
        self._procfs = context.paths.procfs
        self._cgroup_root = context.paths.sys("fs", "cgroup")
        self._sdk_job_pids = sdk_job_pids

    def collect(self) -> list[Family]:
        f = Families()
        for s in (USAGE, PERIODS, THROTTLED_PERIODS, THROTTLED_SECONDS):
            f.declare_spec(s)
        hier = cpu_hierarchy(self._cgroup_root)
        if hier is None:
            return f.build()
        # job id -> (the job's cgroup, for its CPU time; the quota cgroup, for throttling)
        jobs: dict[str, tuple[Path, Path | None]] = {}
        for job in find_job_cgroups(hier.root):
            jobs.setdefault(job.job_id, (job.directory, hier.quota_cgroup(job.directory)))
        if self._sdk_job_pids is not None:
            for job_id, pids in self._sdk_job_pids().items():
                if job_id not in jobs:
                    quota = self._sdk_quota_cgroup(hier, pids)
                    if quota is not None:
                        jobs[job_id] = (quota, quota)
        for job_id, (own, quota) in sorted(jobs.items()):
            labels = {"job_id": job_id}
            stat = hier.stat(own)
            if stat is not None and stat.usage_seconds is not None:
                f.put(USAGE, labels, stat.usage_seconds)
            qstat: CpuStat | None = None
            if quota is not None:
                qstat = stat if quota == own else hier.stat(quota)
            if qstat is not None and qstat.throttling is not None:
                t = qstat.throttling
                f.put(PERIODS, labels, t.periods)
                f.put(THROTTLED_PERIODS, labels, t.throttled_periods)
                f.put(THROTTLED_SECONDS, labels, t.throttled_seconds)
        return f.build()

    def _sdk_quota_cgroup(self, hier: CpuHierarchy, pids: Sequence[int]) -> Path | None:
        """The quota cgroup most of the job's processes are under (ties: the first pid's)."""
        found: Counter[Path] = Counter()
        for pid in pids:
            text = read_text(self._procfs / str(pid) / "cgroup")
            path = process_cgroup(text, hier.v2) if text is not None else None
            if path is None:
                continue
            quota = hier.quota_cgroup(hier.root.joinpath(path.lstrip("/")))
            if quota is not None:
                found[quota] += 1
        return found.most_common(1)[0][0] if found else None

    def close(self) -> None:
        pass
