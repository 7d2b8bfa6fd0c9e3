"""/proc/diskstats: cumulative I/O counters per block device and partition.

Each line is `major minor name` followed by 11 fields (kernels before 4.18), 15 (4.18+
adds discards) or 17 (5.5+ adds flushes); see Documentation/admin-guide/iostats.rst.
Only the first 11 are used, so every variant (14, 18 or 20 columns) reads the same and a
future kernel that appends columns still parses. Sectors are always 512 bytes here,
whatever the device's logical block size; times are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufeed.hostpaths import HostPaths

SECTOR_BYTES = 512
_MIN_FIELDS = 14


@dataclass(frozen=True, slots=True)
class DiskStats:
    major: int
    minor: int
    name: str
    reads_completed: int
    read_bytes: int
    read_time_seconds: float
    writes_completed: int
    written_bytes: int
    write_time_seconds: float
    io_time_seconds: float
    io_time_weighted_seconds: float


@dataclass(frozen=True, slots=True)
class DiskStatsTable:
    by_dev: dict[tuple[int, int], DiskStats]
    bad_lines: tuple[int, ...] = ()


def parse_diskstats(text: str) -> DiskStatsTable:
    """Parses diskstats; malformed lines are skipped and their numbers kept."""
    out: dict[tuple[int, int], DiskStats] = {}
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        stats = _parse_fields(fields)
        if stats is None:
            bad.append(number)
        else:
            out[(stats.major, stats.minor)] = stats
    return DiskStatsTable(out, tuple(bad))


def _parse_fields(fields: list[str]) -> DiskStats | None:
    if len(fields) < _MIN_FIELDS:
        return None
    try:
        major, minor = int(fields[0]), int(fields[1])
        v = [int(x) for x in fields[3:_MIN_FIELDS]]
    except ValueError:
        return None
    if any(x < 0 for x in v):
        return None
    # v: reads, reads merged, sectors read, ms reading, writes, writes merged,
    # sectors written, ms writing, ios in progress, ms doing I/O, weighted ms doing I/O
    return DiskStats(
        major=major,
        minor=minor,
        name=fields[2],
        reads_completed=v[0],
        read_bytes=v[2] * SECTOR_BYTES,
        read_time_seconds=v[3] / 1000.0,
        writes_completed=v[4],
        written_bytes=v[6] * SECTOR_BYTES,
        write_time_seconds=v[7] / 1000.0,
        io_time_seconds=v[9] / 1000.0,
        io_time_weighted_seconds=v[10] / 1000.0,
    )


def read_diskstats(paths: HostPaths) -> DiskStatsTable:
    """Reads <procfs>/diskstats (raises OSError when it cannot be read)."""
    return parse_diskstats(paths.proc("diskstats").read_text(encoding="ascii", errors="replace"))
