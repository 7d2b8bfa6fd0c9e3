"""Per-job block I/O from the kernel's accounting: parsers and the cgroup tree walk.

Three sources, best first:
- cgroup v2 `io.stat` of the job's cgroup: bytes per device (MAJ:MIN), including page-cache
  writeback, which v2 charges to the cgroup that dirtied the pages;
- cgroup v1 `blkio.throttle.io_service_bytes`: bytes per device the job's tasks submitted.
  Writeback of buffered writes is charged to the flusher, not the job, so written bytes are
  low for programs that write through the page cache without fsync. Recent kernels (seen on
  6.18) count only on devices where some cgroup has a blkio.throttle rule (any rule, e.g. a
  read_bps_device limit far above the device's speed);
- `/proc/PID/io` of the job's processes: read_bytes / write_bytes, with no device, so they
  cannot be split by tier.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpufeed.jobs.identity import job_in_cgroup_path

MAX_WALK_DEPTH = 7
MAX_WALK_DIRS = 20000


@dataclass(frozen=True, slots=True)
class DeviceBytes:
    read_bytes: int
    written_bytes: int


def parse_io_stat(text: str) -> dict[str, DeviceBytes]:
    """cgroup v2 io.stat: `MAJ:MIN rbytes=N wbytes=N rios=N ...` per line."""
    out: dict[str, DeviceBytes] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or ":" not in fields[0]:
            continue
        kv = dict(f.split("=", 1) for f in fields[1:] if "=" in f)
        try:
            out[fields[0]] = DeviceBytes(int(kv["rbytes"]), int(kv["wbytes"]))
        except (KeyError, ValueError):
            continue
    return out


def parse_blkio_service_bytes(text: str) -> dict[str, DeviceBytes]:
    """cgroup v1 blkio.throttle.io_service_bytes: `MAJ:MIN Read N`, `MAJ:MIN Write N`, ..."""
    reads: dict[str, int] = {}
    writes: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3 or ":" not in fields[0]:
            continue  # the final "Total N" line, or junk
        dev, op, value = fields
        try:
            n = int(value)
        except ValueError:
            continue
        if op == "Read":
            reads[dev] = n
        elif op == "Write":
            writes[dev] = n
    return {
        dev: DeviceBytes(reads.get(dev, 0), writes.get(dev, 0)) for dev in reads.keys() | writes
    }


def proc_io_fields(text: str) -> dict[str, str]:
    """/proc/PID/io as `key: value` pairs."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        kv[key.strip()] = value.strip()
    return kv


def parse_proc_io(text: str) -> DeviceBytes | None:
    """/proc/PID/io: the bytes this process caused to be read from / written to storage."""
    kv = proc_io_fields(text)
    try:
        return DeviceBytes(int(kv["read_bytes"]), int(kv["write_bytes"]))
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class JobCgroup:
    scheduler: str
    job_id: str
    directory: Path  # the job-level cgroup directory, on the host's cgroup filesystem


def find_job_cgroups(root: Path) -> Iterator[JobCgroup]:
    """Job-level cgroup directories (Slurm, Kubernetes) under one hierarchy's root.

    Walks breadth-first, not below a job's directory, at most MAX_WALK_DEPTH deep, and
    skips symlinks, so that a huge or looping tree cannot stall the collector.
    """
    level: list[tuple[Path, str]] = [(root, "")]
    visited = 0
    for _ in range(MAX_WALK_DEPTH):
        nxt: list[tuple[Path, str]] = []
        for directory, rel in level:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for e in entries:
                visited += 1
                if visited > MAX_WALK_DIRS:
                    return
                if not e.is_dir(follow_symlinks=False):
                    continue
                child_rel = f"{rel}/{e.name}"
                hit = job_in_cgroup_path(child_rel)
                if hit is not None and hit[2] == child_rel:
                    yield JobCgroup(hit[0], hit[1], Path(e.path))
                elif hit is None:
                    nxt.append((Path(e.path), child_rel))
        level = nxt
        if not level:
            return


def cgroup_pids(directory: Path) -> list[int]:
    """Every process in a cgroup directory and below it."""
    pids: list[int] = []
    for dirpath, _dirs, files in os.walk(directory):
        if "cgroup.procs" not in files:
            continue
        try:
            text = Path(dirpath, "cgroup.procs").read_text()
        except OSError:
            continue
        pids.extend(int(x) for x in text.split() if x.isdigit())
    return pids


AccountingSource = tuple[Path, str, Callable[[str], dict[str, DeviceBytes]]]


def accounting_sources(cgroup_root: Path) -> list[AccountingSource]:
    """(hierarchy root, accounting file, parser) for cgroup v2 io.stat and v1 blkio, the
    hierarchies in which jobs' cgroups are looked for."""
    root = cgroup_root
    if (root / "cgroup.controllers").exists():  # pure v2
        return [(root, "io.stat", parse_io_stat)]
    out: list[AccountingSource] = []
    if (root / "unified" / "cgroup.controllers").exists():  # hybrid
        out.append((root / "unified", "io.stat", parse_io_stat))
    if (root / "blkio").is_dir():
        out.append((root / "blkio", "blkio.throttle.io_service_bytes", parse_blkio_service_bytes))
    return out
