"""/sys block-device topology: what a major:minor is, and which disks lie beneath it.

- `/sys/dev/block/MAJ:MIN` links to the device's directory; its last component is the
  kernel name (nvme0n1p1, dm-0, md0).
- A partition's directory has a `partition` file and sits inside its disk's directory.
- Stacked devices (dm/LVM, md) list what they are built on in `slaves/`; the devices
  below list them in `holders/`. `dm/name` is the device-mapper name (LVM: vg-lv),
  `md/level` the RAID level.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpufeed.hostpaths import HostPaths

_MAX_DEPTH = 16  # stacks are a few levels deep; this only stops a looping fixture tree


@dataclass(frozen=True, slots=True)
class BlockDevice:
    name: str  # kernel name, as in /proc/diskstats
    major: int
    minor: int
    kind: str  # partition, dm, md, nvme, loop, disk
    parent: str  # the whole disk of a partition, else ""
    dm_name: str  # device-mapper name (LVM: vg-lv), else ""
    slaves: tuple[str, ...]  # devices this one is built on (dm, md)
    disks: tuple[str, ...]  # the whole disks at the bottom of the stack, sorted


def parse_dev(text: str) -> tuple[int, int] | None:
    """A sysfs `dev` file: `MAJ:MIN`."""
    parts = text.strip().split(":")
    if len(parts) != 2:
        return None
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return None


def block_device_by_dev(paths: HostPaths, major: int, minor: int) -> BlockDevice | None:
    """The block device with this major:minor, or None when sysfs does not know it."""
    link = paths.sys("dev", "block", f"{major}:{minor}")
    try:
        target = os.readlink(link)
    except OSError:
        return None
    return _describe(paths, Path(target).name, link, major, minor, 0)


def block_device_by_name(paths: HostPaths, name: str) -> BlockDevice | None:
    """The block device with this kernel name (nvme0n1p1, dm-0), or None."""
    if not name or "/" in name or name in (".", ".."):
        return None
    devdir = paths.sys("class", "block", name)
    dev = _read_dev(devdir)
    if dev is None:
        return None
    return _describe(paths, name, devdir, dev[0], dev[1], 0)


def block_device_by_dm_name(paths: HostPaths, dm_name: str) -> BlockDevice | None:
    """The device-mapper device named `dm_name` (what /dev/mapper/NAME points to), or None."""
    try:
        names = sorted(os.listdir(paths.sys("class", "block")))
    except OSError:
        return None
    for name in names:
        if (
            name.startswith("dm-")
            and _read_text(paths.sys("class", "block", name, "dm", "name")) == dm_name
        ):
            return block_device_by_name(paths, name)
    return None


def _describe(
    paths: HostPaths, name: str, devdir: Path, major: int, minor: int, depth: int
) -> BlockDevice:
    parent = ""
    dm_name = ""
    if (devdir / "partition").exists():
        kind = "partition"
        # A partition's directory lies inside its disk's: .../nvme0n1/nvme0n1p1
        parent = Path(os.path.realpath(devdir)).parent.name
    elif (devdir / "dm").is_dir():
        kind = "dm"
        dm_name = _read_text(devdir / "dm" / "name")
    elif (devdir / "md").is_dir():
        kind = "md"
    elif name.startswith("nvme"):
        kind = "nvme"
    elif name.startswith("loop"):
        kind = "loop"
    else:
        kind = "disk"
    slaves = _list(devdir / "slaves")
    return BlockDevice(
        name=name,
        major=major,
        minor=minor,
        kind=kind,
        parent=parent,
        dm_name=dm_name,
        slaves=slaves,
        disks=tuple(sorted(_disks(paths, name, parent, slaves, depth))),
    )


def _disks(
    paths: HostPaths, name: str, parent: str, slaves: tuple[str, ...], depth: int
) -> set[str]:
    if parent:
        return {parent}
    if not slaves or depth >= _MAX_DEPTH:
        return {name}
    out: set[str] = set()
    for slave in slaves:
        devdir = paths.sys("class", "block", slave)
        slave_parent = ""
        if (devdir / "partition").exists():
            slave_parent = Path(os.path.realpath(devdir)).parent.name
        out |= _disks(paths, slave, slave_parent, _list(devdir / "slaves"), depth + 1)
    return out


def _read_dev(devdir: Path) -> tuple[int, int] | None:
    return parse_dev(_read_text(devdir / "dev"))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _list(path: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return ()
