"""Shared by the windows-log tests: a window per sequence number, and a real small tmpfs
to fill up (ENOSPC for real, not a mocked write)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.window import Window

T0 = 1_700_000_000.0


def seq_window(seq: int, pad: int = 0) -> Window:
    """A window that carries its sequence number in `job_id` (and `pad` bytes of summary)."""
    return Window(
        "n",
        str(seq % 8),
        "GPU-x",
        f"job-{seq}",
        T0 + seq,
        T0 + seq + 90,
        Cause.NETWORK,
        0.9,
        0.4,
        (("network_utilization_ratio", 0.95),),
        f"window {seq}" + "x" * pad,
    )


@contextlib.contextmanager
def small_tmpfs(parent: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of `size_kib` KiB mounted under `parent` (root only; a test that cannot
    mount fails, it does not skip)."""
    mnt = parent / f"tmpfs-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(mnt)],
        check=True,
        capture_output=True,
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            mnt.rmdir()


def fill(path: Path, leave_bytes: int = 0) -> int:
    """Appends to `path` until the filesystem is full (less about `leave_bytes`); the
    bytes written."""
    st = os.statvfs(path.parent)
    want = max(0, st.f_bavail * st.f_frsize - leave_bytes)
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while written < want:
            try:
                n = os.write(fd, b"\0" * min(4096, want - written))
            except OSError:
                break
            if n <= 0:
                break
            written += n
    finally:
        os.close(fd)
    return written
