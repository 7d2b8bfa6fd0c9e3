"""Real storage: three loop-mounted ext4 filesystems as tiers hot/warm/cold.

O_DIRECT reads and writes of known sizes must show up in the right tier's counters (at
least the size, and not much more: ext4 adds a little journal and metadata I/O) and not in
the other tiers'. Needs root (losetup, mount); everything is unmounted and detached in
teardown, also when the test fails.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.storage import StorageCollector
from gpufeed.config import AgentConfig, TierConfig
from gpufeed.hostpaths import HostPaths
from gpufeed.model import Family
from storage_helpers import labels_of

pytestmark = [pytest.mark.slow, pytest.mark.root]

MiB = 1 << 20
IMAGE_BYTES = 64 * MiB
# Allowance over the payload for what ext4 adds on its own: journal descriptor and commit
# blocks, inode and bitmap updates, extent tree reads. Measured: about 11 KiB for 8 MiB.
SLACK = 256 * 1024
TIERS = ("hot", "warm", "cold")


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def _need_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for losetup and mount")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")


def _ensure_loop_nodes() -> None:
    """Containers often lack /dev/loop* nodes even where the loop driver works."""
    # Another test run on this host may create the same node at the same moment.
    with contextlib.suppress(FileExistsError):
        if not os.path.exists("/dev/loop-control"):
            os.mknod("/dev/loop-control", 0o660 | stat.S_IFCHR, os.makedev(10, 237))
    free = _run("losetup", "-f")  # asks loop-control for a free index
    with contextlib.suppress(FileExistsError):
        if not os.path.exists(free):
            index = int(free.removeprefix("/dev/loop"))
            os.mknod(free, 0o660 | stat.S_IFBLK, os.makedev(7, index))


@dataclass(frozen=True)
class LoopFs:
    tier: str
    mountpoint: Path
    device: str  # kernel name, e.g. loop3


@pytest.fixture
def loop_filesystems(tmp_path: Path) -> Iterator[dict[str, LoopFs]]:
    _need_tools()
    out: dict[str, LoopFs] = {}
    with ExitStack() as stack:
        for tier in TIERS:
            image = tmp_path / f"{tier}.img"
            with open(image, "wb") as f:
                f.truncate(IMAGE_BYTES)
            # Initialise inode tables and journal now, on the image file: no lazy-init
            # thread may write to the device during the test.
            _run(
                "mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(image)
            )
            _ensure_loop_nodes()
            dev = _run("losetup", "-f", "--show", str(image))
            stack.callback(subprocess.run, ["losetup", "-d", dev], check=False)
            mnt = tmp_path / tier
            mnt.mkdir()
            _run("mount", "-o", "noatime", dev, str(mnt))
            stack.callback(_umount, mnt)
            out[tier] = LoopFs(tier, mnt, Path(dev).name)
        yield out


def _umount(mnt: Path) -> None:
    if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _aligned(size: int, fill: int) -> mmap.mmap:
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT requires
    buf.write(bytes([fill]) * size)
    return buf


def direct_write(path: Path, nbytes: int) -> None:
    buf = _aligned(MiB, 0x5A)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        for _ in range(nbytes // MiB):
            assert os.write(fd, buf) == MiB
        os.fsync(fd)
    finally:
        os.close(fd)


def direct_read(path: Path, nbytes: int) -> None:
    buf = _aligned(MiB, 0)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        for _ in range(nbytes // MiB):
            assert os.readv(fd, [buf]) == MiB
    finally:
        os.close(fd)


def values(fams: list[Family], metric: str) -> dict[str, float]:
    """metric per tier, for the loop tiers."""
    return {s.label("tier"): s.value for f in fams for s in f.samples if s.name == metric}


def delta(a: list[Family], b: list[Family], metric: str) -> dict[str, float]:
    va, vb = values(a, "gpufeed_storage_" + metric), values(b, "gpufeed_storage_" + metric)
    return {t: vb[t] - va[t] for t in TIERS}


def test_direct_io_lands_in_the_right_tier(loop_filesystems: dict[str, LoopFs]) -> None:
    fs = loop_filesystems
    (fs["cold"].mountpoint / "sub").mkdir()
    tiers = (
        TierConfig("hot", (str(fs["hot"].mountpoint),)),
        TierConfig("warm", (str(fs["warm"].mountpoint),)),
        # a path inside the mount, not the mount point itself
        TierConfig("cold", (str(fs["cold"].mountpoint / "sub"),)),
    )
    c = StorageCollector(CollectorContext(HostPaths(), AgentConfig(tiers=tiers)))
    os.sync()
    base = c.collect()
    got = {
        d["tier"]: (d["mountpoint"], d["device"])
        for d in labels_of(base, "gpufeed_storage_mount_info")
    }
    assert got == {t: (str(f.mountpoint), f.device) for t, f in fs.items()}
    cap = values(base, "gpufeed_storage_capacity_bytes")
    assert all(40 * MiB < cap[t] <= IMAGE_BYTES for t in TIERS), cap

    # Writes: 8 MiB to hot, 3 MiB to warm, nothing to cold.
    direct_write(fs["hot"].mountpoint / "a.bin", 8 * MiB)
    direct_write(fs["warm"].mountpoint / "b.bin", 3 * MiB)
    after_write = c.collect()
    w = delta(base, after_write, "written_bytes_total")
    print("written deltas", w)
    assert 8 * MiB <= w["hot"] <= 8 * MiB + SLACK
    assert 3 * MiB <= w["warm"] <= 3 * MiB + SLACK
    assert w["cold"] == 0
    ops = delta(base, after_write, "writes_completed_total")
    assert ops["hot"] >= 1 and ops["warm"] >= 1 and ops["cold"] == 0
    free = delta(base, after_write, "free_bytes")
    assert free["hot"] <= -8 * MiB and free["warm"] <= -3 * MiB and free["cold"] == 0

    # Reads: 5 MiB from hot only, then 2 MiB from warm only.
    direct_read(fs["hot"].mountpoint / "a.bin", 5 * MiB)
    after_hot = c.collect()
    r = delta(after_write, after_hot, "read_bytes_total")
    print("read deltas (hot)", r)
    assert 5 * MiB <= r["hot"] <= 5 * MiB + SLACK
    assert r["warm"] == 0 and r["cold"] == 0
    assert delta(after_write, after_hot, "reads_completed_total")["hot"] >= 1
    # Read time moves with the reads: nothing on the tiers that were not read (a counter's
    # delta is never negative, so ">= 0" on hot would test nothing).
    rt = delta(after_write, after_hot, "read_time_seconds_total")
    assert rt["warm"] == 0 and rt["cold"] == 0

    direct_read(fs["warm"].mountpoint / "b.bin", 2 * MiB)
    after_warm = c.collect()
    r = delta(after_hot, after_warm, "read_bytes_total")
    print("read deltas (warm)", r)
    assert 2 * MiB <= r["warm"] <= 2 * MiB + SLACK
    assert r["hot"] == 0 and r["cold"] == 0


def test_unassigned_lists_real_mounts_once(
    loop_filesystems: dict[str, LoopFs], tmp_path: Path
) -> None:
    hot = loop_filesystems["hot"]
    (hot.mountpoint / "shared").mkdir()
    bind = tmp_path / "bind"
    bind.mkdir()
    scratch = tmp_path / "tmpfs"
    scratch.mkdir()
    with ExitStack() as stack:
        _run("mount", "--bind", str(hot.mountpoint / "shared"), str(bind))
        stack.callback(_umount, bind)
        _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(scratch))
        stack.callback(_umount, scratch)
        fams = StorageCollector(CollectorContext()).collect()
    info = [
        d
        for d in labels_of(fams, "gpufeed_storage_mount_info")
        if d["mountpoint"].startswith(str(tmp_path))
    ]
    got = sorted((d["tier"], d["mountpoint"], d["device"], d["kind"]) for d in info)
    # the bind mount of hot is the same device: exported once, at the real mount; tmpfs never
    assert got == sorted(
        ("unassigned", str(f.mountpoint), f.device, "loop") for f in loop_filesystems.values()
    )
