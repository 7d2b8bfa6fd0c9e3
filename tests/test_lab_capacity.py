"""lab/capacity_fs.py, the shared read capacity behind a contended tier: a real FUSE mount
of a directory served at 4 MB/s in all. Alone, a reader gets about the capacity; with four
other readers at depth it gets a fraction of it (the contention the `io_contention` fault
needs); unmounting ends the server and leaves nothing mounted."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from host_needs import missing
from lab.host import CAPACITY_FS, CAPACITY_PYTHON, capacity_problem

RATE = 4_000_000
CHUNK = 128 << 10


def _read(path: Path, offset: int, nbytes: int) -> float:
    """Seconds to read `nbytes` from `offset` in 128 KiB requests."""
    t = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:
            got = os.pread(fd, CHUNK, offset + done)
            assert got, "short read"
            done += len(got)
    finally:
        os.close(fd)
    return time.monotonic() - t


@pytest.mark.slow
@pytest.mark.root
def test_readers_share_one_capacity(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing("mounting FUSE needs root")
    problem = capacity_problem()
    if problem:
        missing(problem)
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "data").write_bytes(os.urandom(4 << 20))
    proc = subprocess.Popen([CAPACITY_PYTHON, str(CAPACITY_FS), str(src), str(mnt), str(RATE)])
    stop = threading.Event()
    readers: list[threading.Thread] = []
    try:
        deadline = time.monotonic() + 15
        while not os.path.ismount(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, "did not mount"
            time.sleep(0.05)
        alone = (1 << 20) / _read(mnt / "data", 0, 1 << 20)

        def tenant(i: int) -> None:
            while not stop.is_set():
                _read(mnt / "data", (1 + i % 3) << 20, 1 << 20)

        readers += [threading.Thread(target=tenant, args=(i,), daemon=True) for i in range(4)]
        for r in readers:
            r.start()
        time.sleep(0.3)  # the tenants' requests are queued
        shared = (512 << 10) / _read(mnt / "data", 0, 512 << 10)
        print(f"alone {alone / 1e6:.2f} MB/s, beside four readers {shared / 1e6:.2f} MB/s")
        assert 0.4 * RATE < alone < 1.2 * RATE
        assert shared < 0.5 * alone
    finally:
        stop.set()
        for r in readers:  # each ends after the read it is in (at most ~1 s at 4 MB/s)
            r.join(10)
        subprocess.run(["umount", str(mnt)], capture_output=True)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
            proc.kill()
            proc.wait()
    assert not os.path.ismount(mnt)
    assert proc.returncode is not None
