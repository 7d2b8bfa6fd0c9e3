"""The block device behind a mount, remembered for a while.

Resolving a device walks sysfs (links, `partition`, `slaves/`, `dm/name`): a dozen system
calls per device. Block topology changes only when devices come and go, so answers are
kept for `ttl_seconds` (a minute by default) instead of being rebuilt every interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpufeed.hostpaths import HostPaths
from gpufeed.procfs.diskstats import DiskStatsTable
from gpufeed.procfs.mountinfo import MountInfo
from gpufeed.sysfs.block import (
    BlockDevice,
    block_device_by_dev,
    block_device_by_dm_name,
    block_device_by_name,
)

_MAX_ENTRIES = 4096  # mounts come and go (containers); the cache must not grow forever


class DeviceResolver:
    def __init__(
        self,
        paths: HostPaths,
        ttl_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._paths = paths
        self._ttl = ttl_seconds
        self._clock = clock
        self._cache: dict[tuple[int, int] | str, tuple[float, BlockDevice | None]] = {}

    def for_mount(self, m: MountInfo, disk: DiskStatsTable | None) -> BlockDevice | None:
        """The device that backs `m`, or None (network and pseudo filesystems)."""
        if m.major != 0:
            key: tuple[int, int] | str = m.dev
        elif m.source.startswith("/dev/"):
            key = m.source  # btrfs and friends show an anonymous 0:N; the source names the disk
        else:
            return None
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        device = self._resolve(m, disk)
        if len(self._cache) >= _MAX_ENTRIES:
            self._cache.clear()
        self._cache[key] = (now, device)
        return device

    def _resolve(self, m: MountInfo, disk: DiskStatsTable | None) -> BlockDevice | None:
        if m.major != 0:
            device = block_device_by_dev(self._paths, m.major, m.minor)
            if device is None and disk is not None:
                # sysfs not mounted or not readable: diskstats still names the device
                s = disk.by_dev.get(m.dev)
                if s is not None:
                    device = BlockDevice(s.name, s.major, s.minor, "unknown", "", "", (), (s.name,))
            return device
        rest = m.source[len("/dev/") :]
        if rest.startswith("mapper/"):
            return block_device_by_dm_name(self._paths, rest[len("mapper/") :])
        return block_device_by_name(self._paths, rest)
