"""A storage tier's device with a finite read capacity that its tenants share.

    python3 lab/capacity_fs.py SRC MNT READ_BYTES_PER_S

A FUSE file system that passes the files of SRC through at MNT, with every read served in
arrival order at READ_BYTES_PER_S in all, the way one disk (or one NAS link) serves
everyone who reads from it: a request waits for those before it, then for its own bytes.
The lab puts a tier's image file here and its loop device on the file, so every reader
of the tier (the job, another tenant) shares one capacity, and contention is real: beside
a tenant reading at depth the job gets a share of the capacity, not what it needs (in the
lab about a third). The loop device's own counters see it as the kernel sees a busy disk
(reads take long, the queue is deep).

Why not the kernel's own tools on the reference host: null_blk (its `mbps=` limit) is not
built into that kernel and modules cannot be loaded there, and cgroup v1's blkio throttle
is not hierarchical (a limit on a parent cgroup did not slow its children's reads: 3.9 MB
read at 58 MB/s under a 4 MB/s parent limit), so it cannot make one capacity for two
cgroups. Writes are passed through at full speed (only the read capacity is modelled:
the lab's faults are about reading).

Runs under the system Python with Debian's python3-fusepy (module `fusepy`; PyPI's
`fusepy` is the same file named `fuse`). It stays in the foreground until unmounted
(`umount MNT`) or sent SIGTERM/SIGINT.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

try:
    import fusepy as fuse  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # PyPI's name for the same module
    import fuse  # type: ignore[import-not-found,no-redef,unused-ignore]


class Capacity:
    """Serves requests in arrival order at `rate` bytes per second in all."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.free_at = 0.0  # when the device has served every request admitted so far

    def take(self, nbytes: int) -> None:
        with self.lock:
            start = max(time.monotonic(), self.free_at)
            self.free_at = start + nbytes / self.rate
            done = self.free_at
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class Passthrough(fuse.Operations):  # type: ignore[misc]
    def __init__(self, src: str, capacity: Capacity) -> None:
        self.src = src
        self.capacity = capacity

    def _path(self, path: str) -> str:
        return os.path.join(self.src, path.lstrip("/"))

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.lstat(self._path(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime")
        return {k: getattr(st, k) for k in (*keys, "st_ctime")}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._path(path))]

    def open(self, path: str, flags: int) -> int:
        return os.open(self._path(path), flags & ~os.O_DIRECT)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self.capacity.take(size)
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        os.truncate(self._path(path), length)

    def flush(self, path: str, fh: int) -> None:
        pass

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        os.fsync(fh)

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {k: getattr(sv, k) for k in (*keys, "f_frsize", "f_namemax")}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: capacity_fs.py SRC MNT READ_BYTES_PER_S", file=sys.stderr)
        return 2
    src, mnt, rate = argv[0], argv[1], float(argv[2])
    if rate <= 0:
        print(f"capacity_fs: READ_BYTES_PER_S must be positive, got {argv[2]}", file=sys.stderr)
        return 2
    # direct_io: no page cache in front of the file (the loop device reads every block
    # through here); allow_other: the job and the tenant are other users' processes too
    fuse.FUSE(
        Passthrough(src, Capacity(rate)), mnt, foreground=True, direct_io=True, allow_other=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
