"""Page-cache parsers and the job_cache collector's sums, on fixtures (no root needed).
The real read pattern on a loop-mounted tier: tests/test_page_cache_real.py."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.job_cache import JobCacheCollector
from gpufeed.hostpaths import HostPaths
from gpufeed.jobs.page_cache import (
    CacheStat,
    OpenFile,
    ProcReads,
    Residency,
    open_files_on_tiers,
    parse_cachestat,
    parse_proc_reads,
    tier_of_path,
)
from gpufeed.model import iter_samples

PROC_IO = """rchar: 323934931
wchar: 323929600
syscr: 632687
syscw: 632675
read_bytes: 1048576
write_bytes: 323932160
cancelled_write_bytes: 0
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (PROC_IO, ProcReads(323934931, 1048576)),
        ("rchar: 5\n", None),  # read_bytes missing: not provided, not 0
        ("rchar: x\nread_bytes: 1\n", None),
        ("", None),
    ],
)
def test_parse_proc_reads(text: str, want: ProcReads | None) -> None:
    assert parse_proc_reads(text) == want


def test_parse_cachestat_is_five_native_u64() -> None:
    raw = struct.pack("=5Q", 10, 1, 2, 30, 4)
    assert parse_cachestat(raw) == CacheStat(10, 1, 2, 30, 4)
    with pytest.raises(ValueError, match="40 bytes"):
        parse_cachestat(raw[:-1])


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/mnt/hot/data/x.bin", "hot"),
        ("/mnt/hot", "hot"),
        ("/mnt/hotter/x", None),  # a prefix of the name is not a parent directory
        ("/mnt/hot/nested/deep/x", "nested"),  # the longest mount point wins
        ("/etc/passwd", None),
    ],
)
def test_tier_of_path(path: str, want: str | None) -> None:
    assert tier_of_path(path, {"/mnt/hot": "hot", "/mnt/hot/nested": "nested"}) == want


def _proc(root: Path, pid: int, ppid: int, rchar: int, read: int, fds: dict[str, str]) -> None:
    d = root / str(pid)
    (d / "fd").mkdir(parents=True, exist_ok=True)
    (d / "io").write_text(f"rchar: {rchar}\nread_bytes: {read}\n")
    (d / "stat").write_text(f"{pid} (python) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 20 0 1 0 5\n")
    for fd, target in fds.items():
        link = d / "fd" / fd
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)


def test_open_files_on_tiers_by_name_only(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fds = {"0": "pipe:[123]", "3": "/mnt/hot/a.bin", "4": "/mnt/hot/a.bin", "5": "/tmp/x"}
    _proc(proc, 10, 1, 0, 0, fds)
    _proc(proc, 11, 10, 0, 0, {"3": "/mnt/hot/b.bin"})
    got = open_files_on_tiers(proc, [10, 11, 99], {"/mnt/hot": "hot"})
    assert [(f.path, f.tier) for f in got] == [("/mnt/hot/a.bin", "hot"), ("/mnt/hot/b.bin", "hot")]


def test_collector_sums_never_go_down_and_count_reaped_children_once(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    pids: list[int] = [10, 11]
    _proc(proc, 10, 1, 1000, 100, {"3": "/mnt/hot/a.bin"})
    _proc(proc, 11, 10, 500, 500, {})  # a DataLoader worker of 10
    sizes = {"/mnt/hot/a.bin": Residency(4096 * 10, 4096 * 4, 4096 * 6, 4096)}

    def residency(f: OpenFile, page: int) -> Residency | None:
        return sizes.get(f.path)

    c = JobCacheCollector(
        CollectorContext(paths=HostPaths(procfs=proc, sysfs=tmp_path / "sys")),
        lambda: {"j1": pids},
        residency=residency,
    )
    tick = TickData(tier_mounts={"/mnt/hot": "hot"})

    def sample() -> dict[str, float]:
        return {s.name: s.value for s in iter_samples(c.collect_with(tick))}

    first = sample()
    assert first["gpufeed_job_cache_requested_read_bytes_total"] == 1500
    assert first["gpufeed_job_cache_fetched_read_bytes_total"] == 600
    assert first["gpufeed_job_cache_open_file_bytes"] == 40960
    assert first["gpufeed_job_cache_resident_bytes"] == 16384
    assert first["gpufeed_job_cache_evicted_bytes"] == 24576
    assert first["gpufeed_job_cache_recently_evicted_bytes"] == 4096
    # the worker exits and its parent reaps it: the parent's counters now hold the worker's
    pids.remove(11)
    _proc(proc, 10, 1, 1000 + 500 + 200, 100 + 500, {"3": "/mnt/hot/a.bin"})
    second = sample()
    assert second["gpufeed_job_cache_requested_read_bytes_total"] == 1700
    assert second["gpufeed_job_cache_fetched_read_bytes_total"] == 600
    # the main process exits (no parent summed): its last reading stays in the sum
    pids.remove(10)
    third = sample()
    assert third["gpufeed_job_cache_requested_read_bytes_total"] == 1700
    assert "gpufeed_job_cache_open_file_bytes" not in third
