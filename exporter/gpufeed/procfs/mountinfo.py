"""/proc/PID/mountinfo: which filesystem is mounted where, and on which device.

Format (proc(5)): `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
- mount id, parent id, major:minor of st_dev, root of the mount inside its filesystem,
  mount point, per-mount options, zero or more optional fields ended by `-`, then the
  filesystem type, the mount source and the superblock options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufeed.hostpaths import HostPaths
from gpufeed.procfs.escape import unescape_octal


@dataclass(frozen=True, slots=True)
class MountInfo:
    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str  # the directory of the filesystem that is mounted here ("/" unless a bind mount)
    mountpoint: str
    fstype: str
    source: str
    mount_options: str
    super_options: str

    @property
    def dev(self) -> tuple[int, int]:
        return (self.major, self.minor)


@dataclass(frozen=True, slots=True)
class MountTable:
    mounts: tuple[MountInfo, ...]
    bad_lines: tuple[int, ...] = ()  # 1-based numbers of lines that did not parse


def parse_mountinfo(text: str) -> MountTable:
    """Parses mountinfo text; lines that do not parse are skipped and their numbers kept."""
    mounts: list[MountInfo] = []
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        mount = _parse_line(line)
        if mount is None:
            bad.append(number)
        else:
            mounts.append(mount)
    return MountTable(tuple(mounts), tuple(bad))


def _parse_line(line: str) -> MountInfo | None:
    fields = line.split()
    try:
        sep = fields.index("-", 6)
    except ValueError:
        return None
    if len(fields) < sep + 3:
        return None
    try:
        mount_id = int(fields[0])
        parent_id = int(fields[1])
        major_s, minor_s = fields[2].split(":")
        major, minor = int(major_s), int(minor_s)
    except ValueError:
        return None
    root, mountpoint = fields[3], fields[4]
    if not root.startswith("/") or not mountpoint.startswith("/"):
        return None
    return MountInfo(
        mount_id=mount_id,
        parent_id=parent_id,
        major=major,
        minor=minor,
        root=unescape_octal(root),
        mountpoint=unescape_octal(mountpoint),
        fstype=fields[sep + 1],
        source=unescape_octal(fields[sep + 2]),
        mount_options=fields[5],
        super_options=fields[sep + 3] if len(fields) > sep + 3 else "",
    )


def mount_table_pid(paths: HostPaths) -> str:
    """Whose mount table to read.

    With the default root the agent stats paths in its own mount namespace, so it reads
    its own table (`self`). With --path.rootfs pointing at the host's root (a container),
    paths are the host's, so the table must be the host's too: PID 1's, as node_exporter
    does; `self` is the fallback where PID 1 is not visible.
    """
    if paths.rootfs == Path("/"):
        return "self"
    if paths.proc("1", "mountinfo").exists():
        return "1"
    return "self"


def read_mountinfo(paths: HostPaths) -> MountTable:
    """Reads the mount table (raises OSError when it cannot be read)."""
    text = paths.proc(mount_table_pid(paths), "mountinfo").read_text(
        encoding="utf-8", errors="surrogateescape"
    )
    return parse_mountinfo(text)
