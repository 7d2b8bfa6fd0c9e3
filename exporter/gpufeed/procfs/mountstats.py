"""/proc/PID/mountstats: per-mount NFS client statistics.

Every mount has a `device SOURCE mounted on MOUNTPOINT with fstype TYPE` line; NFS mounts
(statvers=1.0/1.1) follow it with tab-indented sections. Used here:
- `bytes:` normalread normalwrite directread directwrite serverread serverwrite readpages
  writepages. normal/direct count what applications read and wrote through the page cache
  or O_DIRECT (cache hits included); server counts what went over the wire.
- `per-op statistics`: one line per RPC op: ops, transmissions, major timeouts, bytes
  sent, bytes received, then cumulative queue, RTT and execute time in milliseconds, and
  (statvers 1.1, kernel 4.17+) the number of ops that ended in an error.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

from gpufeed.hostpaths import HostPaths
from gpufeed.procfs.escape import unescape_octal
from gpufeed.procfs.mountinfo import mount_table_pid

NFS_FSTYPES = frozenset({"nfs", "nfs4"})
_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?\s*$")
_OP = re.compile(r"^([A-Z_0-9]+):$")


@dataclass(frozen=True, slots=True)
class NfsOpStats:
    ops: int
    transmissions: int
    major_timeouts: int
    bytes_sent: int
    bytes_received: int
    queue_seconds: float
    rtt_seconds: float
    execute_seconds: float
    errors: int | None  # absent before statvers 1.1


@dataclass(frozen=True, slots=True)
class NfsBytes:
    normal_read_bytes: int
    normal_written_bytes: int
    direct_read_bytes: int
    direct_written_bytes: int
    server_read_bytes: int
    server_written_bytes: int


@dataclass(frozen=True, slots=True)
class NfsMountStats:
    source: str
    mountpoint: str
    fstype: str
    statvers: str
    bytes: NfsBytes | None
    ops: dict[str, NfsOpStats] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MountStatsTable:
    nfs: tuple[NfsMountStats, ...]
    bad_lines: tuple[int, ...] = ()

    def by_mountpoint(self) -> dict[str, NfsMountStats]:
        # A later entry for the same mount point is mounted over the earlier one.
        return {m.mountpoint: m for m in self.nfs}


@dataclass(slots=True)
class _Building:
    source: str
    mountpoint: str
    fstype: str
    statvers: str
    bytes: NfsBytes | None = None
    ops: dict[str, NfsOpStats] = field(default_factory=dict)
    in_ops: bool = False

    def done(self) -> NfsMountStats:
        return NfsMountStats(
            self.source, self.mountpoint, self.fstype, self.statvers, self.bytes, dict(self.ops)
        )


def parse_mountstats(text: str, ops: Collection[str] | None = None) -> MountStatsTable:
    """Parses mountstats and keeps the NFS mounts; lines that do not parse are skipped.

    `ops` limits the per-op lines parsed (an NFSv4 mount lists some 60) to those needed.
    """
    out: list[NfsMountStats] = []
    bad: list[int] = []
    cur: _Building | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.startswith("device "):
            if cur is not None:
                out.append(cur.done())
                cur = None
            m = _DEVICE.match(line)
            if m is None:
                bad.append(number)
            elif m.group(3) in NFS_FSTYPES:
                cur = _Building(
                    unescape_octal(m.group(1)),
                    unescape_octal(m.group(2)),
                    m.group(3),
                    m.group(4) or "",
                )
            continue
        if cur is None:
            continue  # detail lines of a mount that is not NFS (none today) or after a bad line
        if not _parse_detail(cur, line.split(), ops):
            bad.append(number)
    if cur is not None:
        out.append(cur.done())
    return MountStatsTable(tuple(out), tuple(bad))


def _parse_detail(cur: _Building, words: list[str], wanted: Collection[str] | None) -> bool:
    """Folds one indented line into `cur`; False when a line we rely on does not parse."""
    if not words:
        return True
    head = words[0]
    if head == "per-op":
        cur.in_ops = True
        return True
    if cur.in_ops:
        m = _OP.match(head)
        if m is None:
            return False
        if wanted is not None and m.group(1) not in wanted:
            return True
        op = _parse_op(words[1:])
        if op is None:
            return False
        cur.ops[m.group(1)] = op
        return True
    if head == "bytes:":
        numbers = _ints(words[1:])
        if numbers is None or len(numbers) < 6:
            return False
        cur.bytes = NfsBytes(*numbers[:6])
    # Other sections (opts, age, caps, events, xprt, ...) are not used.
    return True


def _parse_op(words: list[str]) -> NfsOpStats | None:
    numbers = _ints(words)
    if numbers is None or len(numbers) < 8:
        return None
    return NfsOpStats(
        ops=numbers[0],
        transmissions=numbers[1],
        major_timeouts=numbers[2],
        bytes_sent=numbers[3],
        bytes_received=numbers[4],
        queue_seconds=numbers[5] / 1000.0,
        rtt_seconds=numbers[6] / 1000.0,
        execute_seconds=numbers[7] / 1000.0,
        errors=numbers[8] if len(numbers) > 8 else None,
    )


def _ints(words: list[str]) -> list[int] | None:
    try:
        values = [int(w) for w in words]
    except ValueError:
        return None
    return values if all(v >= 0 for v in values) else None


def read_mountstats(paths: HostPaths, ops: Collection[str] | None = None) -> MountStatsTable:
    """Reads mountstats from the same process as the mount table (raises OSError)."""
    text = paths.proc(mount_table_pid(paths), "mountstats").read_text(
        encoding="utf-8", errors="surrogateescape"
    )
    return parse_mountstats(text, ops)
