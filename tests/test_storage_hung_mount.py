"""A real hung mount: the agent keeps serving, marks the mount stuck, and piles up no threads.

No NFS server can run here, but FUSE can: a FUSE mount whose daemon never answers (the
/dev/fuse descriptor is held open and never read) makes every statfs and stat on it block
in the kernel, exactly as a hard NFS mount does when its server is gone. Closing the
descriptor aborts the connection, and the blocked calls then fail with ENOTCONN.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import http_get, wait_for_metrics
from host_needs import missing

MNT_DETACH = 2


class HungMount:
    """A FUSE mount at `path` that answers nothing until `abort()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self._fd: int | None = os.open("/dev/fuse", os.O_RDWR)
        opts = f"fd={self._fd},rootmode=40000,user_id=0,group_id=0".encode()
        if self._libc.mount(b"hangfs", str(path).encode(), b"fuse.hangfs", 0, opts) != 0:
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"mount fuse on {path}: {os.strerror(err)}")

    def abort(self) -> None:
        """The 'server' goes away for good: blocked calls return ENOTCONN."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def unmount(self) -> None:
        self.abort()
        self._libc.umount2(str(self.path).encode(), MNT_DETACH)


@pytest.fixture
def hung_mount(tmp_path: Path) -> Iterator[HungMount]:
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        missing("needs root and /dev/fuse")
    mnt = tmp_path / "hung"
    mnt.mkdir()
    m = HungMount(mnt)
    try:
        yield m
    finally:
        m.unmount()


def sample_value(body: str, name: str, **labels: str) -> float | None:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in body.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    return None


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
@pytest.mark.slow
@pytest.mark.root
def test_hung_mount_is_marked_stuck_and_never_blocks_the_scrape(
    hung_mount: HungMount, run_agent: Any, tmp_path: Path
) -> None:
    ok = tmp_path / "ok"
    ok.mkdir()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        "interval_seconds: 0.5\n"
        f"tiers:\n  hot: [{ok}]\n  cold: [{hung_mount.path}]\n"
        f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\n"
    )
    agent = run_agent(
        "--config",
        str(cfg),
        "--gpu.backend",
        "off",
        "--sdk.socket",
        str(tmp_path / "sdk.sock"),
    )
    proc = agent.proc
    url = f"{agent.url}/metrics"
    wait_for_metrics(url, proc)
    mp = str(hung_mount.path)

    # Within a few intervals the hung mount is stuck; every scrape answers at once.
    deadline = time.monotonic() + 10
    stuck, slowest, body = None, 0.0, ""
    while time.monotonic() < deadline and stuck != 1.0:
        t0 = time.monotonic()
        status, raw = http_get(url)
        slowest = max(slowest, time.monotonic() - t0)
        assert status == 200
        body = raw.decode()
        stuck = sample_value(body, "gpufeed_storage_mount_stuck", tier="cold", mountpoint=mp)
        time.sleep(0.2)
    assert stuck == 1.0, body
    assert slowest < 0.5, f"a scrape took {slowest:.2f}s while a mount hung"
    # The healthy tier is still measured, capacity included.
    assert sample_value(body, "gpufeed_storage_capacity_bytes", tier="hot") is not None
    assert sample_value(body, "gpufeed_storage_capacity_bytes", tier="cold") is None
    assert http_get(f"{agent.url}/healthz")[0] == 200

    # A hung call is never started twice: the thread count does not grow with time.
    before = threads(proc.pid)
    time.sleep(3)  # six more sampling intervals
    assert threads(proc.pid) <= before + 1

    # The 'server' goes away: the blocked calls return, and the mount is no longer stuck.
    hung_mount.abort()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        body = http_get(url)[1].decode()
        if sample_value(body, "gpufeed_storage_mount_stuck", tier="cold", mountpoint=mp) == 0.0:
            break
        time.sleep(0.2)
    assert sample_value(body, "gpufeed_storage_mount_stuck", tier="cold", mountpoint=mp) == 0.0
