"""The job_cache collector against a controlled read pattern on a real loop-mounted ext4 tier.

A reader process keeps a 32 MiB file open and reads it whole on command; the test sets the
page cache's state before each read and checks the collector's figures over that read:
- cold (the file's pages dropped with POSIX_FADV_DONTNEED): hit ratio 0, residency 0 -> 1;
- warm (re-read): hit ratio 1, residency 1;
- partly evicted (DONTNEED on the second half): residency 0.5 before, hit ratio 0.5;
- outgrown: the reader in a v1 memory cgroup limited to 12 MiB reads the file twice; the
  second read finds little of it cached (hit ratio < 0.5) and cachestat counts the pages
  reclaim evicted (at least the file less the limit, 2 MiB slack).
Tolerance 0.03 on ratios: the reads are page-aligned and readahead never passes the end of
the file, so the expected figures are exact up to the few pages of ext4 metadata and the
reader's own command pipe (rchar counts its few bytes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.job_cache import JobCacheCollector
from gpufeed.hostpaths import HostPaths
from gpufeed.model import Family, iter_samples
from host_needs import missing

pytestmark = [pytest.mark.slow, pytest.mark.root]

FILE_BYTES = 32 << 20
MEMCG = Path("/sys/fs/cgroup/memory")
JOB = f"cache-test-{os.getpid()}"
READER = """
import sys
f = open(sys.argv[1], "rb", buffering=0)
print("ready", flush=True)
for line in sys.stdin:
    f.seek(0)
    while f.read(1 << 20):
        pass
    print("done", flush=True)
"""


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.geteuid() != 0:
        missing("needs root (loop mount, memory cgroup)")
    base = tmp_path_factory.mktemp("cache-tier")
    image, mnt = base / "hot.img", base / "hot"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    sh("mkfs.ext4", "-q", "-F", str(image))
    loop = sh("losetup", "--find", "--show", str(image))
    try:
        sh("mount", "-o", "noatime", loop, str(mnt))
        try:
            data = mnt / "data.bin"
            data.write_bytes(os.urandom(FILE_BYTES))
            os.sync()
            yield data
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)


class Reader:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def read_all(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("read\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def drop(path: Path, offset: int = 0, length: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def value(fams: list[Family], name: str) -> float:
    found = [s.value for s in iter_samples(fams) if s.name == name and ("job_id", JOB) in s.labels]
    assert len(found) == 1, (name, found)
    return found[0]


class Probe:
    """The collector as the agent runs it, reading the reader's process as job JOB."""

    def __init__(self, data: Path, reader: Reader) -> None:
        self.collector = JobCacheCollector(
            CollectorContext(paths=HostPaths()), lambda: {JOB: [reader.proc.pid]}
        )
        self.tick = TickData(tier_mounts={str(data.parent): "hot"})

    def sample(self) -> tuple[float, float, float, float, float, float]:
        fams = self.collector.collect_with(self.tick)
        return (
            value(fams, "gpufeed_job_cache_requested_read_bytes_total"),
            value(fams, "gpufeed_job_cache_fetched_read_bytes_total"),
            value(fams, "gpufeed_job_cache_open_file_bytes"),
            value(fams, "gpufeed_job_cache_resident_bytes"),
            value(fams, "gpufeed_job_cache_evicted_bytes"),
            value(fams, "gpufeed_job_cache_recently_evicted_bytes"),
        )

    def read(self, reader: Reader) -> tuple[float, float, float]:
        """(hit ratio over one whole read, residency before it, residency after it)."""
        req0, fet0, size, res0, *_ = self.sample()
        reader.read_all()
        req1, fet1, _, res1, *_ = self.sample()
        assert size == FILE_BYTES
        assert req1 - req0 >= FILE_BYTES
        return 1 - (fet1 - fet0) / (req1 - req0), res0 / size, res1 / size


def test_cold_warm_and_partly_evicted_reads(tier: Path) -> None:
    drop(tier)
    reader = Reader(tier)
    try:
        probe = Probe(tier, reader)
        hit, before, after = probe.read(reader)  # cold
        assert hit == pytest.approx(0.0, abs=0.03)
        assert (before, after) == (pytest.approx(0.0, abs=0.01), pytest.approx(1.0, abs=0.01))
        hit, before, after = probe.read(reader)  # warm
        assert hit == pytest.approx(1.0, abs=0.03)
        assert before == after == pytest.approx(1.0, abs=0.01)
        drop(tier, FILE_BYTES // 2)  # the second half
        hit, before, after = probe.read(reader)
        assert hit == pytest.approx(0.5, abs=0.03)
        assert before == pytest.approx(0.5, abs=0.01)
        assert after == pytest.approx(1.0, abs=0.01)
    finally:
        reader.stop()


def test_a_file_that_outgrew_its_memory_is_reread_from_the_device(tier: Path) -> None:
    if not (MEMCG / "cgroup.procs").exists():
        missing("needs the cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
    cg = MEMCG / f"gpufeed-test-cache-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    reader = Reader(tier)
    try:
        drop(tier)  # no page of it charged elsewhere: every page it reads is charged here
        (cg / "memory.limit_in_bytes").write_text(str(12 << 20))
        (cg / "cgroup.procs").write_text(str(reader.proc.pid))
        probe = Probe(tier, reader)
        probe.read(reader)  # first pass fills the 12 MiB and evicts as it goes
        hit, _before, after = probe.read(reader)
        *_, evicted, recent = probe.sample()
        assert hit < 0.5
        assert after < 0.5
        # what did not fit was evicted by reclaim (not dropped): the file less the limit
        assert evicted >= FILE_BYTES - (12 << 20) - (2 << 20)
        # a sequential stream is not a working set the kernel would keep: none is "recent"
        assert 0 <= recent <= evicted
    finally:
        reader.stop()
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)
