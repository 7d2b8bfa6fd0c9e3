"""Which mounts the storage collector exports, and under which tier.

Pure functions over the parsed mount table; the collector supplies how to find a mount's
block device and how configured paths resolved on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufeed.config import TierConfig
from gpufeed.procfs.mountinfo import MountInfo
from gpufeed.storage.fstypes import is_excluded_by_default, is_network
from gpufeed.sysfs.block import BlockDevice
from gpufeed.vocabulary import UNASSIGNED_TIER

UNASSIGNED = UNASSIGNED_TIER

DeviceOf = Callable[[MountInfo], BlockDevice | None]


@dataclass(frozen=True, slots=True)
class Target:
    """One exported (tier, mount point)."""

    tier: str
    mount: MountInfo
    device: BlockDevice | None  # the block device that backs the mount; None for NFS etc.
    network: bool
    paths: tuple[str, ...] = ()  # the configured paths that led here (empty when unassigned)
    stuck_hint: bool = False  # a configured path on this mount did not answer a stat


@dataclass(frozen=True, slots=True)
class PathResolution:
    """How a configured path fared: resolved to a host path, missing, or not answered."""

    # ok; missing; stuck (its stat hung); unchecked (not reached in this collect's time)
    status: str
    host_path: str = ""
    reason: str = ""


def visible_mounts(mounts: Iterable[MountInfo]) -> list[MountInfo]:
    """Drops mounts that a later mount on the same mount point hides (stat sees the top one)."""
    last: dict[str, MountInfo] = {}
    for m in mounts:
        last.pop(m.mountpoint, None)  # re-insert so order follows the top mount
        last[m.mountpoint] = m
    return list(last.values())


def containing_mount(mounts: Sequence[MountInfo], path: str) -> MountInfo | None:
    """The mount whose mount point is the longest prefix of `path` (component-wise)."""
    best: MountInfo | None = None
    for m in mounts:
        mp = m.mountpoint
        inside = mp == "/" or path == mp or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mountpoint)):
            best = m
    return best


def dedupe_key(mount: MountInfo, device: BlockDevice | None) -> tuple[int, int]:
    """Mounts with the same key see the same I/O counters (bind mounts, subvolumes)."""
    if device is not None:
        return (device.major, device.minor)
    return mount.dev


def select_unassigned(mounts: Sequence[MountInfo], device_of: DeviceOf) -> list[Target]:
    """Every mount backed by a block device or a network filesystem, once per device.

    Of several mounts of one device, the one that mounts the filesystem's root (not a bind
    of a subdirectory) with the shortest mount point is kept, so nothing is counted twice.
    """
    chosen: dict[tuple[int, int], Target] = {}
    for m in mounts:
        if is_excluded_by_default(m.fstype):
            continue
        network = is_network(m.fstype)
        device = None if network else device_of(m)
        if device is None and not network:
            continue
        key = dedupe_key(m, device)
        current = chosen.get(key)
        if current is None or _preference(m) < _preference(current.mount):
            chosen[key] = Target(UNASSIGNED, m, device, network)
    return sorted(chosen.values(), key=lambda t: t.mount.mountpoint)


def _preference(m: MountInfo) -> tuple[int, int, str]:
    return (0 if m.root == "/" else 1, len(m.mountpoint), m.mountpoint)


@dataclass(frozen=True, slots=True)
class TierSelection:
    targets: list[Target]
    # device key -> tiers that share it: their series carry the same counters
    shared: dict[tuple[int, int], tuple[str, ...]]


def select_tiers(
    mounts: Sequence[MountInfo],
    tiers: Sequence[TierConfig],
    resolved: Mapping[str, PathResolution],
    device_of: DeviceOf,
) -> TierSelection:
    """The mounts that hold each tier's configured paths, once per (tier, device).

    Paths that are missing are skipped (a typo must not silently map to "/"). A path whose
    stat hung is mapped by its literal text, so its mount is still exported, as stuck; one
    not checked in time is mapped by its literal text too.
    Within one tier, paths on the same device (bind mounts) give one series, so a sum over
    the tier counts each I/O once; across tiers a shared device cannot be split and is
    reported in `shared`.
    """
    targets: list[Target] = []
    tiers_by_key: dict[tuple[int, int], list[str]] = {}
    for tier in tiers:
        per_key: dict[tuple[int, int], Target] = {}
        for path in tier.paths:
            res = resolved.get(path)
            if res is None or res.status == "missing":
                continue
            host_path = res.host_path if res.status == "ok" else path
            mount = containing_mount(mounts, host_path)
            if mount is None:
                continue
            network = is_network(mount.fstype)
            device = None if network else device_of(mount)
            key = dedupe_key(mount, device)
            stuck = res.status == "stuck"
            if key in per_key:
                prev = per_key[key]
                per_key[key] = Target(
                    prev.tier,
                    prev.mount,
                    prev.device,
                    prev.network,
                    (*prev.paths, path),
                    prev.stuck_hint or stuck,
                )
            else:
                per_key[key] = Target(tier.name, mount, device, network, (path,), stuck)
        for key, target in per_key.items():
            targets.append(target)
            tiers_by_key.setdefault(key, []).append(tier.name)
    shared = {k: tuple(v) for k, v in tiers_by_key.items() if len(v) > 1}
    return TierSelection(targets, shared)
