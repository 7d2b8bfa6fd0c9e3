"""The "job_io" collector: per-job bytes read and written per storage tier.

Jobs are found by walking the cgroup trees for Slurm and Kubernetes job directories
(gpufeed.jobs.io_accounting); their bytes per device come from cgroup v2 io.stat or v1
blkio.throttle.io_service_bytes, and devices map to tiers through `devices_to_tier`
("MAJ:MIN" -> tier name, from the storage collector's mount resolution). Devices in no tier
are left out (it is a `Consumer` of "storage": the map is the one of the same tick). Where a job's cgroup has no usable accounting, and for SDK jobs that run under
no scheduler, the job's processes' /proc/PID/io is summed instead, with tier="unattributed"
because that file does not say which device the bytes went to.

Object-storage tiers (s3://) have no device: the bytes an SDK job's processes reported
moving to and from them (`sdk_object_bytes`, from the SDK collector) are added under their
tier, so a job's reads from a bucket count in the same families as its reads from a mount.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpufeed.catalogue import spec
from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.jobs.identity import read_proc_stat, read_text
from gpufeed.jobs.io_accounting import (
    DeviceBytes,
    accounting_sources,
    cgroup_pids,
    find_job_cgroups,
    parse_proc_io,
)
from gpufeed.model import Families, Family
from gpufeed.vocabulary import UNATTRIBUTED_TIER

JobPids = Callable[[], Mapping[str, Sequence[int]]]

READ = spec("gpufeed_job_storage_read_bytes_total")
WRITTEN = spec("gpufeed_job_storage_written_bytes_total")
IO_PROCESSES = spec("gpufeed_job_io_processes")


FinalIo = Mapping[int, tuple[int, DeviceBytes]]  # pid -> (parent pid or 0, bytes)
JobFinalIo = Callable[[], Mapping[str, FinalIo]]
JobObjectBytes = Callable[[], Mapping[str, Mapping[str, DeviceBytes]]]  # job -> tier -> bytes

# Retired processes whose counted bytes are remembered, so that an IO report that arrives
# after the process was already retired adds only what the sample had missed.
_MAX_COUNTED_PIDS = 4096


class _ProcIoSum:
    """Monotonic sum of /proc/PID/io over a changing set of processes.

    A process that exits leaves its last reading behind, so the job's counter never goes
    down; except a child whose parent is still summed: when the parent reaps it, the kernel
    adds the child's I/O to the parent's own /proc/PID/io (DataLoader workers and their
    main process), and counting it again would add it twice. Until the parent has reaped
    it the sum may dip, so what is returned never falls below what was returned before.

    The last reading of a process that exits between two samples misses what it did after
    that reading (the checkpoint a short job writes just before it ends). An SDK process
    reports its own /proc/self/io when it closes (`finals`); that report, read by the
    process itself after its last write, replaces the sampled reading, whether it arrives
    before the process is retired here or after.
    """

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, DeviceBytes]] = {}  # pid -> (parent pid, bytes)
        # retired pid -> bytes counted for it; None: its parent's reading holds it
        self.counted: dict[int, DeviceBytes | None] = {}
        self.retired_read = 0
        self.retired_written = 0
        self.returned = DeviceBytes(0, 0)

    def update(self, procfs: Path, pids: Iterable[int], finals: FinalIo) -> DeviceBytes:
        current: dict[int, tuple[int, DeviceBytes]] = {}
        for pid in pids:
            text = read_text(procfs / str(pid) / "io")
            got = parse_proc_io(text) if text is not None else None
            if got is not None:
                stat = read_proc_stat(procfs, pid)
                current[pid] = (stat.ppid if stat is not None else 0, got)
                self.counted.pop(pid, None)  # alive: a reused pid starts afresh
        for pid, (ppid, old) in self.last.items():
            if pid not in current:
                final = finals.get(pid)
                self._retire(pid, ppid, old if final is None else _larger(old, final[1]), current)
        for pid, (parent, reported) in finals.items():
            if pid not in current and pid not in self.last:  # exited before any sample
                self._retire(pid, parent, reported, current)
        self.last = current
        self.returned = DeviceBytes(
            max(
                self.returned.read_bytes,
                self.retired_read + sum(v.read_bytes for _, v in current.values()),
            ),
            max(
                self.returned.written_bytes,
                self.retired_written + sum(v.written_bytes for _, v in current.values()),
            ),
        )
        return self.returned

    def _retire(
        self, pid: int, ppid: int, reading: DeviceBytes, current: Mapping[int, object]
    ) -> None:
        """Adds what `reading` holds beyond what was already counted for the exited `pid`."""
        if pid in self.counted and self.counted[pid] is None:
            return
        if ppid in current:
            self._count(pid, None)
            return
        before = self.counted.get(pid) or DeviceBytes(0, 0)
        self.retired_read += max(reading.read_bytes - before.read_bytes, 0)
        self.retired_written += max(reading.written_bytes - before.written_bytes, 0)
        self._count(pid, _larger(before, reading))

    def _count(self, pid: int, value: DeviceBytes | None) -> None:
        self.counted.pop(pid, None)
        self.counted[pid] = value
        while len(self.counted) > _MAX_COUNTED_PIDS:
            del self.counted[next(iter(self.counted))]


def _larger(a: DeviceBytes, b: DeviceBytes) -> DeviceBytes:
    return DeviceBytes(max(a.read_bytes, b.read_bytes), max(a.written_bytes, b.written_bytes))


class JobIoCollector:
    name = "job_io"
    needs = ("storage",)

    def __init__(
        self,
        context: CollectorContext,
        sdk_job_pids: JobPids | None = None,
        sdk_final_io: JobFinalIo | None = None,
        sdk_object_bytes: JobObjectBytes | None = None,
    ) -> None:
        self._procfs = context.paths.procfs
        self._cgroup_root = context.paths.sys("fs", "cgroup")
        self._sdk_job_pids = sdk_job_pids
        self._sdk_final_io = sdk_final_io
        self._sdk_object_bytes = sdk_object_bytes
        self._proc_sums: dict[str, _ProcIoSum] = {}

    def collect(self) -> list[Family]:
        """Without the storage collector's map: only the bytes no device names (/proc)."""
        return self.collect_with(TickData())

    def collect_with(self, data: TickData) -> list[Family]:
        tiers = data.devices_to_tier
        accounted: dict[str, dict[str, DeviceBytes]] = {}
        fallback: dict[str, list[int]] = {}
        for root, filename, parse in accounting_sources(self._cgroup_root):
            for job in find_job_cgroups(root):
                if job.job_id in accounted:
                    continue
                text = read_text(job.directory / filename)
                stats = parse(text) if text is not None else {}
                if stats:
                    accounted[job.job_id] = stats
                    fallback.pop(job.job_id, None)
                else:
                    fallback.setdefault(job.job_id, []).extend(cgroup_pids(job.directory))
        if self._sdk_job_pids is not None:
            for job_id, pids in self._sdk_job_pids().items():
                if job_id not in accounted:
                    fallback.setdefault(job_id, []).extend(pids)

        f = Families()
        f.declare_spec(READ)
        f.declare_spec(WRITTEN)
        f.declare_spec(IO_PROCESSES)
        objects = self._sdk_object_bytes() if self._sdk_object_bytes is not None else {}
        for job_id in sorted(accounted.keys() | objects.keys()):
            per_tier: dict[str, list[int]] = {}
            for dev, b in accounted.get(job_id, {}).items():
                tier = tiers.get(dev)
                if tier is None:
                    continue
                acc = per_tier.setdefault(tier, [0, 0])
                acc[0] += b.read_bytes
                acc[1] += b.written_bytes
            for tier, b in objects.get(job_id, {}).items():
                acc = per_tier.setdefault(tier, [0, 0])
                acc[0] += b.read_bytes
                acc[1] += b.written_bytes
            for tier, (r, w) in sorted(per_tier.items()):
                labels = {"job_id": job_id, "tier": tier}
                f.put(READ, labels, r)
                f.put(WRITTEN, labels, w)
        finals = self._sdk_final_io() if self._sdk_final_io is not None else {}
        sums: dict[str, _ProcIoSum] = {}
        for job_id, pids in sorted(fallback.items()):
            s = sums[job_id] = self._proc_sums.get(job_id) or _ProcIoSum()
            total = s.update(self._procfs, pids, finals.get(job_id, {}))
            if not s.last and not (total.read_bytes or total.written_bytes):
                continue  # no process readable (gone, or /proc/PID/io not permitted)
            labels = {"job_id": job_id, "tier": UNATTRIBUTED_TIER}
            f.put(READ, labels, total.read_bytes)
            f.put(WRITTEN, labels, total.written_bytes)
            f.put(IO_PROCESSES, {"job_id": job_id}, len(s.last))
        self._proc_sums = sums
        return f.build()

    def close(self) -> None:
        self._proc_sums = {}
