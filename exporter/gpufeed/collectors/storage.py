"""Storage collector: per-tier I/O counters and capacity for every exported mount.

Block-backed mounts are counted at the device that backs them (the partition, dm or md
device named by the mount's major:minor), from /proc/diskstats; NFS mounts from
mountstats; capacity and free space from statvfs, under a time bound so that a hung NFS
server marks its mount stuck instead of blocking the collector. See docs/storage.md.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from types import MappingProxyType

from gpufeed.catalogue import MetricSpec, spec
from gpufeed.collectors.base import CollectorContext, TickData, partial_result
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family
from gpufeed.procfs.diskstats import DiskStats, DiskStatsTable, read_diskstats
from gpufeed.procfs.escape import label_text
from gpufeed.procfs.mountinfo import MountInfo, mount_table_pid, read_mountinfo
from gpufeed.procfs.mountstats import NFS_FSTYPES, NfsMountStats, read_mountstats
from gpufeed.storage.bounded import BoundedCalls, Outcome
from gpufeed.storage.devices import DeviceResolver
from gpufeed.storage.pathresolve import resolve_in_root
from gpufeed.storage.selection import (
    PathResolution,
    Target,
    select_tiers,
    select_unassigned,
    visible_mounts,
)
from gpufeed.sysfs.block import BlockDevice, block_device_by_name

log = logging.getLogger(__name__)

StatvfsFn = Callable[[str], os.statvfs_result]

_NFS_OPS = frozenset({"READ", "WRITE"})
_MISSING_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})

P = "gpufeed_storage_"


def family(suffix: str) -> MetricSpec:
    """The catalogue entry of gpufeed_storage_SUFFIX (name, type and HELP live there)."""
    return spec(P + suffix)


def _default_timeout(ctx: CollectorContext) -> float:
    return min(1.0, max(0.05, 0.25 * ctx.config.effective_timeout_seconds))


class StorageCollector:
    """Exports gpufeed_storage_* for the configured tiers (or every real mount, unassigned)."""

    name = "storage"

    def __init__(
        self,
        ctx: CollectorContext,
        *,
        statvfs: StatvfsFn = os.statvfs,
        statfs_timeout_seconds: float | None = None,
    ) -> None:
        self._paths = ctx.paths
        # object-storage-only tiers have no mount (their I/O comes from the SDK collector)
        self._tiers = tuple(t for t in ctx.config.tiers if t.paths)
        self._targets = ctx.config.tier_targets
        self._statvfs = statvfs
        timeout = statfs_timeout_seconds or _default_timeout(ctx)
        # Budget for all filesystem calls of one collect, well inside the sampler's bound.
        self._budget_seconds = 2 * timeout
        self._calls = BoundedCalls(timeout, self._budget_seconds)
        self._devices = DeviceResolver(ctx.paths)
        self._log = LogOnce(log)  # each condition once while it lasts; its end at INFO
        self._device_tiers: dict[str, str] = {}
        self._tier_mounts: dict[str, str] = {}
        self._parents: dict[str, tuple[int, int] | None] = {}

    def produce(self, data: TickData) -> TickData:
        """The tick's device-to-tier and mount-to-tier maps, for the job layer's per-tier
        I/O and page-cache residency."""
        return replace(
            data,
            devices_to_tier=MappingProxyType(self.devices_to_tier()),
            tier_mounts=MappingProxyType(dict(self._tier_mounts)),
        )

    def devices_to_tier(self) -> dict[str, str]:
        """ "MAJ:MIN" -> tier for the block devices behind the last collect's tiers.

        For the job layer's cgroup I/O accounting, which the kernel keys by the device the
        request was queued on: a partition's I/O shows under its whole disk, so the disk is
        mapped too, unless partitions of it sit in different tiers (then it is ambiguous).
        """
        return dict(self._device_tiers)

    def _remember_device_tiers(self, targets: list[Target]) -> None:
        self._tier_mounts = {t.mount.mountpoint: t.tier for t in targets if t.device is not None}
        mapping: dict[str, str] = {}
        parents: dict[str, set[str]] = {}
        for t in targets:
            if t.device is None:
                continue
            mapping[f"{t.device.major}:{t.device.minor}"] = t.tier
            if t.device.parent:
                if t.device.parent not in self._parents:
                    parent = block_device_by_name(self._paths, t.device.parent)
                    self._parents[t.device.parent] = (
                        (parent.major, parent.minor) if parent is not None else None
                    )
                dev = self._parents[t.device.parent]
                if dev is not None:
                    parents.setdefault(f"{dev[0]}:{dev[1]}", set()).add(t.tier)
        for key, tiers in parents.items():
            if len(tiers) == 1 and key not in mapping:
                mapping[key] = next(iter(tiers))
        self._device_tiers = mapping

    def close(self) -> None:
        """Nothing to release; a statvfs still hung in the kernel keeps its daemon thread."""

    # -- collect -------------------------------------------------------------------------

    def collect(self) -> list[Family]:
        try:
            table = read_mountinfo(self._paths)
        except OSError as exc:
            where = self._paths.proc(mount_table_pid(self._paths), "mountinfo")
            raise RuntimeError(f"storage: cannot read the mount table {where}: {exc}") from exc
        if table.bad_lines:
            self._log.log(
                logging.WARNING,
                "mountinfo-bad",
                "storage: skipped %d unparsable mountinfo line(s), first at line %d",
                len(table.bad_lines),
                table.bad_lines[0],
            )
        # One deadline for every filesystem call of this collect, well inside the sampler's
        # bound, however many tier paths and mounts hang for the first time.
        deadline = time.monotonic() + self._budget_seconds
        mounts = visible_mounts(table.mounts)
        disk = self._diskstats()

        def devices(m: MountInfo) -> BlockDevice | None:
            return self._devices.for_mount(m, disk)

        fams = Families()
        if self._tiers:
            resolved = self._resolve_tier_paths(mounts, fams, deadline)
            selection = select_tiers(mounts, self._tiers, resolved, devices)
            targets = selection.targets
            for key, tiers in selection.shared.items():
                self._log.log(
                    logging.WARNING,
                    f"shared-{key}",
                    "storage: tiers %s are on the same device %d:%d; each reports its full "
                    "I/O, so a sum over these tiers counts it more than once",
                    ", ".join(tiers),
                    *key,
                )
        else:
            targets = select_unassigned(mounts, devices)

        failed: list[str] = []
        if disk is None and any(t.device is not None for t in targets):
            failed.append(f"cannot read {self._paths.proc('diskstats')}: block counters left out")
        nfs: dict[str, NfsMountStats] = {}
        if any(t.mount.fstype in NFS_FSTYPES for t in targets):
            nfs_or_none = self._mountstats()
            if nfs_or_none is None:
                where = self._paths.proc(mount_table_pid(self._paths), "mountstats")
                failed.append(f"cannot read {where}: NFS counters left out")
            nfs = nfs_or_none or {}
        self._remember_device_tiers(targets)
        self._put_targets(fams)
        statfs = self._statfs_all(targets, deadline)
        for target in targets:
            self._emit(fams, target, disk, nfs, statfs)
        return partial_result(fams, failed)

    def _put_targets(self, fams: Families) -> None:
        """The tiers' targets from the config: a dashboard and an alert compare against them."""
        for t in self._targets:
            labels = {"tier": t.tier}
            fams.put(family("tier_target_read_latency_seconds"), labels, t.read_latency_seconds)
            fams.put(family("tier_target_read_bytes_per_second"), labels, t.read_bytes_per_second)

    def _diskstats(self) -> DiskStatsTable | None:
        try:
            table = read_diskstats(self._paths)
        except OSError as exc:
            self._log.log(
                logging.ERROR,
                "diskstats",
                "storage: cannot read %s (%s); block-device counters are left out, "
                "capacity is still exported",
                self._paths.proc("diskstats"),
                exc.strerror or exc,
            )
            return None
        self._log.clear("diskstats", "storage: %s readable again", self._paths.proc("diskstats"))
        if table.bad_lines:
            self._log.log(
                logging.WARNING,
                "diskstats-bad",
                "storage: skipped %d unparsable diskstats line(s), first at line %d",
                len(table.bad_lines),
                table.bad_lines[0],
            )
        return table

    def _mountstats(self) -> dict[str, NfsMountStats] | None:
        where = self._paths.proc(mount_table_pid(self._paths), "mountstats")
        try:
            table = read_mountstats(self._paths, _NFS_OPS)
        except OSError as exc:
            self._log.log(
                logging.ERROR,
                "mountstats",
                "storage: cannot read %s (%s); NFS counters are left out",
                where,
                exc.strerror or exc,
            )
            return None
        self._log.clear("mountstats", "storage: %s readable again", where)
        if table.bad_lines:
            self._log.log(
                logging.WARNING,
                "mountstats-bad",
                "storage: skipped %d unparsable mountstats line(s), first at line %d",
                len(table.bad_lines),
                table.bad_lines[0],
            )
        return table.by_mountpoint()

    def _resolve_tier_paths(
        self, mounts: list[MountInfo], fams: Families, deadline: float
    ) -> dict[str, PathResolution]:
        """Checks every configured path; a mount point from the table needs no filesystem call."""
        mountpoints = {m.mountpoint for m in mounts}
        out: dict[str, PathResolution] = {}
        calls: list[tuple[str, Callable[[], str]]] = []
        for tier in self._tiers:
            for path in tier.paths:
                if path in mountpoints:
                    out[path] = PathResolution("ok", path)
                else:
                    calls.append((path, partial(resolve_in_root, self._paths.rootfs, path)))
        for path, outcome in self._calls.run(calls, deadline).items():
            out[path] = _path_resolution(outcome)
        for tier in self._tiers:
            for path in tier.paths:
                res = out[path]
                key = f"tier-path-{tier.name}-{path}"
                if res.status == "missing":
                    self._log.log(
                        logging.WARNING,
                        key,
                        "storage: tier %r path %s does not exist under %s (%s); it is not "
                        "exported until it appears (check the config)",
                        tier.name,
                        path,
                        self._paths.rootfs,
                        res.reason,
                    )
                elif res.status == "ok":
                    self._log.clear(key, "storage: tier %r path %s exists now", tier.name, path)
                value = {"ok": 0.0, "missing": 1.0}.get(res.status)
                fams.put(family("tier_path_missing"), {"tier": tier.name, "path": path}, value)
        return out

    def _statfs_all(
        self, targets: list[Target], deadline: float
    ) -> dict[str, Outcome[os.statvfs_result]]:
        calls: list[tuple[str, Callable[[], os.statvfs_result]]] = []
        for t in targets:
            if not t.stuck_hint:
                host = str(self._paths.root(t.mount.mountpoint))
                calls.append((t.mount.mountpoint, partial(self._statvfs, host)))
        results = self._calls.run(calls, deadline)
        for mountpoint, outcome in results.items():
            key = f"statfs-{mountpoint}"
            if outcome.status == "stuck":
                self._log.log(
                    logging.WARNING,
                    key,
                    "storage: statvfs on %s has not answered for %.1fs; the mount is marked "
                    "stuck and its capacity left out",
                    mountpoint,
                    outcome.stuck_seconds,
                )
            elif outcome.status == "error":
                self._log.log(
                    logging.WARNING,
                    key,
                    "storage: statvfs on %s failed: %s; capacity left out",
                    self._paths.root(mountpoint),
                    outcome.error,
                )
            elif outcome.status == "ok":
                self._log.clear(key, "storage: statvfs on %s answers again", mountpoint)
        return results

    def _emit(
        self,
        fams: Families,
        t: Target,
        disk: DiskStatsTable | None,
        nfs: Mapping[str, NfsMountStats],
        statfs: Mapping[str, Outcome[os.statvfs_result]],
    ) -> None:
        labels = {"tier": t.tier, "mountpoint": label_text(t.mount.mountpoint)}
        if t.device is not None:
            labels["device"] = t.device.name
        info = {**labels, "fstype": t.mount.fstype, "source": label_text(t.mount.source)}
        if t.device is not None:
            info["kind"] = t.device.kind
            info["disks"] = ",".join(t.device.disks)
        else:
            info["kind"] = "network" if t.network else "other"
        fams.put(family("mount_info"), info, 1.0)

        counters: dict[str, float | None] = {}
        if t.device is not None and disk is not None:
            counters = _block_counters(
                disk.by_dev.get((t.device.major, t.device.minor)), t.device.kind
            )
        elif t.mount.fstype in NFS_FSTYPES:
            stats = nfs.get(t.mount.mountpoint)
            counters = _nfs_counters(stats)
            fams.put(
                family("nfs_requested_read_bytes_total"),
                {"tier": t.tier, "mountpoint": labels["mountpoint"]},
                (stats.bytes.normal_read_bytes + stats.bytes.direct_read_bytes)
                if stats is not None and stats.bytes is not None
                else None,
            )
            for op in ("READ", "WRITE"):
                o = stats.ops.get(op) if stats is not None else None
                fams.put(
                    family("nfs_rtt_seconds_total"),
                    {**labels, "op": op.lower()},
                    o.rtt_seconds if o is not None else None,
                )
        for suffix in _COUNTERS:
            fams.put(family(suffix), labels, counters.get(suffix))

        outcome = statfs.get(t.mount.mountpoint)
        capacity = free = None
        if outcome is not None and outcome.value is not None:
            capacity, free = _capacity(outcome.value)
        stuck: float | None = None  # absent when not tried this time (over the time budget)
        if t.stuck_hint or (outcome is not None and outcome.status == "stuck"):
            stuck = 1.0
        elif outcome is not None and outcome.status in ("ok", "error"):
            stuck = 0.0
        fams.put(family("capacity_bytes"), labels, capacity)
        fams.put(family("free_bytes"), labels, free)
        fams.put(family("mount_stuck"), labels, stuck)


_COUNTERS = (
    "read_bytes_total",
    "written_bytes_total",
    "reads_completed_total",
    "writes_completed_total",
    "read_time_seconds_total",
    "write_time_seconds_total",
    "io_time_seconds_total",
    "io_time_weighted_seconds_total",
)


_TIME_COUNTERS = (
    "read_time_seconds_total",
    "write_time_seconds_total",
    "io_time_seconds_total",
    "io_time_weighted_seconds_total",
)


def _block_counters(s: DiskStats | None, kind: str) -> dict[str, float | None]:
    if s is None:
        return {}
    counters: dict[str, float | None] = {
        "read_bytes_total": s.read_bytes,
        "written_bytes_total": s.written_bytes,
        "reads_completed_total": s.reads_completed,
        "writes_completed_total": s.writes_completed,
        "read_time_seconds_total": s.read_time_seconds,
        "write_time_seconds_total": s.write_time_seconds,
        "io_time_seconds_total": s.io_time_seconds,
        "io_time_weighted_seconds_total": s.io_time_weighted_seconds,
    }
    if kind == "md" and _times_unaccounted(s):
        # md without bio-based time accounting (older kernels, some RAID levels) counts
        # operations and sectors but prints 0 for every time field: not provided, so absent.
        for name in _TIME_COUNTERS:
            counters[name] = None
    return counters


def _times_unaccounted(s: DiskStats) -> bool:
    """I/O was done, yet no time at all was counted: the kernel does not track time here."""
    no_time = (
        s.read_time_seconds == 0
        and s.write_time_seconds == 0
        and s.io_time_seconds == 0
        and s.io_time_weighted_seconds == 0
    )
    return no_time and s.reads_completed + s.writes_completed > 0


def _nfs_counters(s: NfsMountStats | None) -> dict[str, float | None]:
    """Server bytes (what crossed the wire, like a disk's sectors), READ/WRITE RPC counts
    and execute times (queue + RTT: what the caller waited). No busy time: NFS has none."""
    if s is None:
        return {}
    read, write = s.ops.get("READ"), s.ops.get("WRITE")
    return {
        "read_bytes_total": s.bytes.server_read_bytes if s.bytes else None,
        "written_bytes_total": s.bytes.server_written_bytes if s.bytes else None,
        "reads_completed_total": read.ops if read else None,
        "writes_completed_total": write.ops if write else None,
        "read_time_seconds_total": read.execute_seconds if read else None,
        "write_time_seconds_total": write.execute_seconds if write else None,
    }


def _capacity(st: os.statvfs_result) -> tuple[float | None, float | None]:
    frsize = st.f_frsize or st.f_bsize
    if st.f_blocks <= 0 or frsize <= 0:
        return None, None  # pseudo or FUSE filesystems that report no size: absent, not 0
    return float(st.f_blocks * frsize), float(st.f_bavail * frsize)


def _path_resolution(outcome: Outcome[str]) -> PathResolution:
    if outcome.status == "ok" and outcome.value is not None:
        return PathResolution("ok", outcome.value)
    if outcome.status == "error":
        err = outcome.error
        if isinstance(err, OSError) and err.errno in _MISSING_ERRNOS:
            return PathResolution("missing", reason=err.strerror or str(err))
        return PathResolution("missing", reason=str(err))
    if outcome.status == "skipped":
        return PathResolution("unchecked")
    return PathResolution("stuck")
