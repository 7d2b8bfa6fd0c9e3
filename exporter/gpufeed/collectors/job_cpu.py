"""The "job_cpu" collector: per-job CPU time, CPU-quota throttling (cgroup cpu.stat) and
how long the job's threads waited for a CPU (schedstat, cgroup v2 cpu.pressure).

Jobs are found as "job_io" finds them: Slurm and Kubernetes job directories in the cgroup
tree (gpufeed.jobs.io_accounting.find_job_cgroups), whose CPU time is the job directory's;
and SDK jobs under no scheduler (`gpufeed run`), through the cgroup of their processes.
The throttling series come from the nearest cgroup at or above the job's that has a CPU
quota (gpufeed.jobs.cpu_accounting), and are absent where none has one: without a quota
nothing throttles, and zeros would read as "not throttled" where the truth is "no limit".
An SDK job is exported only where such a quota cgroup exists, because the cgroup its
processes sit in otherwise holds unrelated work too (a login session's scope).

The run-queue wait (gpufeed.jobs.cpu_wait) is the job's own: its threads' schedstat, the
threads listed by the job's cgroup (v1 `tasks`, v2 `cgroup.threads`) or, for an SDK job,
by its processes; and on cgroup v2 the job's cgroup's cpu.pressure. It says that the job
starves for CPU where nothing throttles it: a host other work saturates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpufeed.catalogue import spec
from gpufeed.collectors.base import CollectorContext
from gpufeed.jobs.cpu_accounting import CpuHierarchy, CpuStat, cpu_hierarchy, process_cgroup
from gpufeed.jobs.cpu_wait import (
    RunQueueSum,
    cgroup_pressure,
    cgroup_threads,
    process_threads,
    read_threads,
)
from gpufeed.jobs.identity import read_text
from gpufeed.jobs.io_accounting import find_job_cgroups
from gpufeed.model import Families, Family

JobPids = Callable[[], Mapping[str, Sequence[int]]]

USAGE = spec("gpufeed_job_cpu_usage_seconds_total")
PERIODS = spec("gpufeed_job_cpu_periods_total")
THROTTLED_PERIODS = spec("gpufeed_job_cpu_throttled_periods_total")
THROTTLED_SECONDS = spec("gpufeed_job_cpu_throttled_seconds_total")
WAITING = spec("gpufeed_job_cpu_waiting_seconds_total")
RUNNING = spec("gpufeed_job_cpu_running_seconds_total")
PRESSURE = spec("gpufeed_job_cpu_pressure_waiting_seconds_total")
ALL = (USAGE, PERIODS, THROTTLED_PERIODS, THROTTLED_SECONDS, WAITING, RUNNING, PRESSURE)


class JobCpuCollector:
    name = "job_cpu"

    def __init__(self, context: CollectorContext, sdk_job_pids: JobPids | None = None) -> None:
        self._procfs = context.paths.procfs
        self._cgroup_root = context.paths.sys("fs", "cgroup")
        self._sdk_job_pids = sdk_job_pids
        self._waits: dict[str, RunQueueSum] = {}  # job id -> its threads' schedstat sums

    def collect(self) -> list[Family]:
        f = Families()
        for s in ALL:
            f.declare_spec(s)
        hier = cpu_hierarchy(self._cgroup_root)
        if hier is None:
            return f.build()
        # job id -> (the job's cgroup, for its CPU time; the quota cgroup, for throttling)
        jobs: dict[str, tuple[Path, Path | None]] = {}
        # job id -> its threads (the scheduler's cgroup lists them; an SDK job's processes)
        threads: dict[str, list[int]] = {}
        for job in find_job_cgroups(hier.root):
            if job.job_id not in jobs:
                jobs[job.job_id] = (job.directory, hier.quota_cgroup(job.directory))
                threads[job.job_id] = cgroup_threads(job.directory, hier.v2)
        if self._sdk_job_pids is not None:
            for job_id, pids in self._sdk_job_pids().items():
                if job_id not in jobs:
                    threads[job_id] = [t for p in pids for t in process_threads(self._procfs, p)]
                    quota = self._sdk_quota_cgroup(hier, pids)
                    if quota is not None:
                        jobs[job_id] = (quota, quota)
        self._put_waits(f, threads)
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
            pressure = cgroup_pressure(own) if hier.v2 else None
            if pressure is not None:
                f.put(PRESSURE, labels, pressure)
        return f.build()

    def _put_waits(self, f: Families, threads: dict[str, list[int]]) -> None:
        """The run-queue sums of each job's threads; a job none of whose threads was ever
        readable (gone, or another user's without permission) is absent."""
        sums: dict[str, RunQueueSum] = {}
        for job_id, tids in sorted(threads.items()):
            s = sums[job_id] = self._waits.get(job_id) or RunQueueSum()
            total = s.update(read_threads(self._procfs, tids))
            if s.seen:
                labels = {"job_id": job_id}
                f.put(RUNNING, labels, total.running_ns / 1e9)
                f.put(WAITING, labels, total.waiting_ns / 1e9)
        self._waits = sums

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
        self._waits = {}
