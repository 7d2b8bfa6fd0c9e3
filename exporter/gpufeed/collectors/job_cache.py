"""The "job_cache" collector: how much of a job's reading the page cache serves.

Per job, from its processes' /proc/PID/io: the bytes its read calls returned and the bytes
storage had to fetch for them (two counters; the hit ratio is 1 - fetched / returned). Per
job and tier, from cachestat(2) on the regular files the job has open on a block-backed
tier: their size, how much of them is in the page cache, and how much memory reclaim
evicted (in all, and recently: within the working set). Jobs are found like "job_io" finds
them (Slurm and Kubernetes cgroups, SDK processes); it is a `Consumer` of "storage" for the
tiers' mount points. See gpufeed.jobs.page_cache for what each source misses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpufeed.catalogue import spec
from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.jobs.identity import read_proc_stat
from gpufeed.jobs.io_accounting import accounting_sources, cgroup_pids, find_job_cgroups
from gpufeed.jobs.page_cache import (
    OpenFile,
    ProcReads,
    Residency,
    file_residency,
    open_files_on_tiers,
    read_proc_reads,
)
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family

log = logging.getLogger(__name__)

JobPids = Callable[[], Mapping[str, Sequence[int]]]
ResidencyFn = Callable[[OpenFile, int], Residency | None]

REQUESTED = spec("gpufeed_job_cache_requested_read_bytes_total")
FETCHED = spec("gpufeed_job_cache_fetched_read_bytes_total")
OPEN = spec("gpufeed_job_cache_open_file_bytes")
RESIDENT = spec("gpufeed_job_cache_resident_bytes")
EVICTED = spec("gpufeed_job_cache_evicted_bytes")
RECENT = spec("gpufeed_job_cache_recently_evicted_bytes")


class _ReadSum:
    """(rchar, read_bytes) summed over a job's changing processes, never going down.

    A process that exits leaves its last reading in the sum, unless its parent is summed
    too: the kernel adds a reaped child's counters to its parent's (DataLoader workers and
    their main process), so counting the child as well would count it twice."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, ProcReads]] = {}  # pid -> (parent pid, reading)
        self.retired = (0, 0)
        self.returned = (0, 0)

    def update(self, procfs: Path, pids: Iterable[int]) -> tuple[int, int]:
        now: dict[int, tuple[int, ProcReads]] = {}
        for pid in pids:
            got = read_proc_reads(procfs, pid)
            if got is not None:
                st = read_proc_stat(procfs, pid)
                now[pid] = (st.ppid if st is not None else 0, got)
        requested, fetched = self.retired
        for pid, (ppid, last) in self.last.items():
            if pid not in now and ppid not in now:
                requested += last.syscall_read_bytes
                fetched += last.storage_read_bytes
        self.retired = (requested, fetched)
        self.last = now
        requested += sum(r.syscall_read_bytes for _, r in now.values())
        fetched += sum(r.storage_read_bytes for _, r in now.values())
        self.returned = (max(self.returned[0], requested), max(self.returned[1], fetched))
        return self.returned


class JobCacheCollector:
    name = "job_cache"
    needs = ("storage",)

    def __init__(
        self,
        context: CollectorContext,
        sdk_job_pids: JobPids | None = None,
        *,
        residency: ResidencyFn = file_residency,
    ) -> None:
        self._procfs = context.paths.procfs
        self._cgroup_root = context.paths.sys("fs", "cgroup")
        self._sdk_job_pids = sdk_job_pids
        self._residency = residency
        self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._sums: dict[str, _ReadSum] = {}
        self._log = LogOnce(log)

    def collect(self) -> list[Family]:
        """Without the storage collector's mounts: the per-job counters only."""
        return self.collect_with(TickData())

    def collect_with(self, data: TickData) -> list[Family]:
        jobs = self._job_pids()
        f = Families()
        for m in (REQUESTED, FETCHED, OPEN, RESIDENT, EVICTED, RECENT):
            f.declare_spec(m)
        sums: dict[str, _ReadSum] = {}
        tier_mounts = dict(data.tier_mounts)
        for job_id, pids in sorted(jobs.items()):
            s = sums[job_id] = self._sums.get(job_id) or _ReadSum()
            requested, fetched = s.update(self._procfs, pids)
            if s.last or requested:
                f.put(REQUESTED, {"job_id": job_id}, requested)
                f.put(FETCHED, {"job_id": job_id}, fetched)
            if tier_mounts:
                self._residency_of(f, job_id, pids, tier_mounts)
        self._sums = sums
        return f.build()

    def _residency_of(
        self, f: Families, job_id: str, pids: Sequence[int], tier_mounts: dict[str, str]
    ) -> None:
        per_tier: dict[str, list[int]] = {}
        for of in open_files_on_tiers(self._procfs, pids, tier_mounts):
            try:
                r = self._residency(of, self._page_bytes)
            except OSError as exc:
                self._log.log(
                    logging.WARNING,
                    "cachestat",
                    "job_cache: cachestat(2) failed (%s); page-cache residency is left out",
                    exc.strerror or exc,
                )
                return
            if r is None:
                continue
            acc = per_tier.setdefault(of.tier, [0, 0, 0, 0])
            for i, v in enumerate(
                (r.size_bytes, r.cached_bytes, r.evicted_bytes, r.recently_evicted_bytes)
            ):
                acc[i] += v
        for tier, totals in sorted(per_tier.items()):
            labels = {"job_id": job_id, "tier": tier}
            for family, v in zip((OPEN, RESIDENT, EVICTED, RECENT), totals, strict=True):
                f.put(family, labels, v)

    def _job_pids(self) -> dict[str, list[int]]:
        jobs: dict[str, list[int]] = {}
        for root, _file, _parse in accounting_sources(self._cgroup_root):
            for job in find_job_cgroups(root):
                if job.job_id not in jobs:
                    jobs[job.job_id] = cgroup_pids(job.directory)
        if self._sdk_job_pids is not None:
            for job_id, pids in self._sdk_job_pids().items():
                have = jobs.setdefault(job_id, [])
                have.extend(sorted(set(pids) - set(have)))
        return jobs

    def close(self) -> None:
        self._sums = {}
