"""How much of a job's reading the page cache serves: parsers and readers.

Two kernel sources, each exact for what it counts (docs/storage.md, "Page cache"):
- `/proc/PID/io` of the job's processes: `rchar` (bytes returned by read-family system
  calls, wherever they came from) and `read_bytes` (bytes the process caused to be fetched
  from storage, readahead included). Hit ratio = 1 - read_bytes / rchar. Misses: reads of
  pipes and sockets count in rchar (a DataLoader's pickled batches), page faults on mmap'd
  files count only in read_bytes, and readahead fetched but never read counts as a miss.
- `cachestat(2)` (Linux 6.5+) on the regular files the job has open on a block-backed tier:
  how many of their pages sit in the page cache now, and how many memory reclaim evicted
  (the kernel's shadow entries; dropped or truncated pages leave none), of which how many
  "recently" (their refault distance is within the working set: a re-read would activate
  them; a dataset streamed sequentially through too little memory has evictions but no
  recent ones). Misses: files opened and closed between two samples, mmap'd files that have
  no open descriptor, and shadow entries the kernel has already reclaimed.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufeed.jobs.identity import read_text
from gpufeed.jobs.io_accounting import proc_io_fields

# cachestat(2) has the same number on every architecture of the unified syscall table.
SYS_CACHESTAT = 451
# Files looked at per job and collect, so a job holding thousands of descriptors cannot
# stall the collector.
MAX_FILES_PER_JOB = 512


@dataclass(frozen=True, slots=True)
class ProcReads:
    """One process's reading: what its read calls returned, what storage had to fetch."""

    syscall_read_bytes: int  # rchar
    storage_read_bytes: int  # read_bytes


def parse_proc_reads(text: str) -> ProcReads | None:
    """/proc/PID/io: `rchar:` and `read_bytes:` (None when either is missing)."""
    kv = proc_io_fields(text)
    try:
        return ProcReads(int(kv["rchar"]), int(kv["read_bytes"]))
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class CacheStat:
    """struct cachestat, in pages, of one file range."""

    cached_pages: int
    dirty_pages: int
    writeback_pages: int
    evicted_pages: int
    recently_evicted_pages: int


class _CachestatRange(ctypes.Structure):
    _fields_ = (("off", ctypes.c_uint64), ("len", ctypes.c_uint64))


class _Cachestat(ctypes.Structure):
    _fields_ = (
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    )


def parse_cachestat(raw: bytes) -> CacheStat:
    """The kernel's struct cachestat (five native u64) as a CacheStat."""
    if len(raw) != ctypes.sizeof(_Cachestat):
        raise ValueError(f"struct cachestat is {ctypes.sizeof(_Cachestat)} bytes, got {len(raw)}")
    c = _Cachestat.from_buffer_copy(raw)
    return CacheStat(c.nr_cache, c.nr_dirty, c.nr_writeback, c.nr_evicted, c.nr_recently_evicted)


def cachestat(fd: int) -> CacheStat:
    """cachestat(2) over the whole file open as `fd`; OSError (ENOSYS before 6.5)."""
    libc = ctypes.CDLL(None, use_errno=True)
    rng = _CachestatRange(0, 0)  # len 0: to the end of the file
    out = _Cachestat()
    if libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(out), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return parse_cachestat(bytes(out))


@dataclass(frozen=True, slots=True)
class OpenFile:
    path: str  # as the job's process names it (its /proc/PID/fd link)
    fd_link: Path  # /proc/PID/fd/N: opening it reaches the same file, whatever its name
    tier: str


def tier_of_path(path: str, tier_mounts: dict[str, str]) -> str | None:
    """The tier of the longest mount point that holds `path` (text only: no filesystem call)."""
    best = ""
    for mountpoint in tier_mounts:
        inside = path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")
        if inside and len(mountpoint) > len(best):
            best = mountpoint
    return tier_mounts[best] if best else None


def open_files_on_tiers(
    procfs: Path, pids: Iterable[int], tier_mounts: dict[str, str]
) -> list[OpenFile]:
    """The job's open descriptors whose path lies on a tier's mount (by name, not by stat,
    so that no file of a mount outside `tier_mounts` is touched), at most MAX_FILES_PER_JOB."""
    out: list[OpenFile] = []
    seen: set[str] = set()
    for pid in pids:
        fd_dir = procfs / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to look at
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target in seen or not target.startswith("/"):
                continue  # pipes, sockets, anon inodes: "pipe:[...]"
            tier = tier_of_path(target, tier_mounts)
            if tier is None:
                continue
            seen.add(target)
            out.append(OpenFile(target, fd_dir / fd, tier))
            if len(out) >= MAX_FILES_PER_JOB:
                return out
    return out


@dataclass(frozen=True, slots=True)
class Residency:
    size_bytes: int
    cached_bytes: int
    evicted_bytes: int
    recently_evicted_bytes: int


def file_residency(f: OpenFile, page_bytes: int) -> Residency | None:
    """cachestat of one open file, through its /proc/PID/fd link; None when it is not a
    regular file or is gone. OSError when cachestat itself fails (ENOSYS)."""
    try:
        fd = os.open(f.fd_link, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOATIME)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        cs = cachestat(fd)
    finally:
        os.close(fd)
    return Residency(
        st.st_size,
        min(cs.cached_pages * page_bytes, st.st_size),
        cs.evicted_pages * page_bytes,
        cs.recently_evicted_pages * page_bytes,
    )


def read_proc_reads(procfs: Path, pid: int) -> ProcReads | None:
    text = read_text(procfs / str(pid) / "io")
    return None if text is None else parse_proc_reads(text)
