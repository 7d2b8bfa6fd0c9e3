"""The storage collector on the fixture node: mount selection, tiers, counters, bad input.

The fixture mount points do not exist on this machine, so capacity comes from a statvfs
table passed through the collector's `statvfs` parameter; everything else is read from the
checked-in procfs/sysfs tree.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, PartialCollectionError
from gpufeed.collectors.storage import StorageCollector
from gpufeed.config import AgentConfig, TierConfig, parse_config
from gpufeed.hostpaths import HostPaths
from storage_helpers import NODE1, by_mount, labels_of, node_paths

ROOT = NODE1 / "root"
# host mount point -> (f_blocks, f_bavail) in 4 KiB blocks
SIZES = {
    "/": (1_000_000, 400_000),
    "/boot/efi": (130_000, 120_000),
    "/mnt/scratch": (500_000_000, 125_000_000),
    "/mnt/fast scratch": (900_000_000, 850_000_000),
    "/mnt/raid": (1_900_000_000, 10),
    "/mnt/datasets": (2_000_000_000, 1_000_000_000),
    "/mnt/archive": (0, 0),  # a server that reports no size: capacity is absent, not 0
}


def table_statvfs(root: Path = ROOT) -> Callable[[str], os.statvfs_result]:
    def statvfs(path: str) -> os.statvfs_result:
        host = "/" + os.path.relpath(path, root).lstrip(".")
        host = "/" if host in ("/", "/.") else host
        if host not in SIZES:
            raise FileNotFoundError(2, "No such file or directory", path)
        blocks, avail = SIZES[host]
        return os.statvfs_result((4096, 4096, blocks, avail + 5, avail, 100, 50, 50, 0, 255))

    return statvfs


def collector(
    tiers: tuple[TierConfig, ...] = (),
    paths: HostPaths | None = None,
    statvfs: Callable[[str], os.statvfs_result] | None = None,
    timeout: float | None = None,
) -> StorageCollector:
    ctx = CollectorContext(paths or node_paths(), AgentConfig(tiers=tiers))
    return StorageCollector(ctx, statvfs=statvfs or table_statvfs(), statfs_timeout_seconds=timeout)


def test_unassigned_exports_block_and_network_mounts_once() -> None:
    fams = collector().collect()
    info = {d["mountpoint"]: d for d in labels_of(fams, "gpufeed_storage_mount_info")}
    # bind mounts (/var/cache/scratch, /srv/imagenet) and the second btrfs subvolume
    # (/home) share a device with a mount that is kept; pseudo, overlay and squashfs never.
    assert sorted(info) == [
        "/",
        "/boot/efi",
        "/mnt/archive",
        "/mnt/datasets",
        "/mnt/fast scratch",
        "/mnt/raid",
        "/mnt/scratch",
    ]
    assert {d["tier"] for d in info.values()} == {"unassigned"}
    got = {mp: (d.get("device"), d["kind"], d.get("disks"), d["fstype"]) for mp, d in info.items()}
    assert got == {
        "/": ("nvme0n1p3", "partition", "nvme0n1", "btrfs"),
        "/boot/efi": ("nvme0n1p1", "partition", "nvme0n1", "vfat"),
        "/mnt/archive": (None, "network", None, "nfs"),
        "/mnt/datasets": (None, "network", None, "nfs4"),
        "/mnt/fast scratch": ("nvme1n1", "nvme", "nvme1n1", "xfs"),
        "/mnt/raid": ("md0", "md", "sda,sdb", "xfs"),
        "/mnt/scratch": ("dm-0", "dm", "nvme0n1", "ext4"),
    }


def test_block_counters_come_from_the_backing_device_line() -> None:
    fams = collector().collect()
    read = by_mount(fams, "gpufeed_storage_read_bytes_total")
    # dm-0's own line, not its slave nvme0n1p2 (5120112328 sectors); md0, not sda+sdb.
    assert read["/mnt/scratch"] == 5120098304 * 512
    assert read["/mnt/raid"] == 5801105712 * 512
    assert read["/"] == 1200146624 * 512
    assert read["/boot/efi"] == 52224 * 512
    assert read["/mnt/fast scratch"] == 52231004416 * 512
    written = by_mount(fams, "gpufeed_storage_written_bytes_total")
    assert written["/mnt/scratch"] == 4611223120 * 512
    io = by_mount(fams, "gpufeed_storage_io_time_seconds_total")
    assert io["/mnt/scratch"] == pytest.approx(4101.230)
    weighted = by_mount(fams, "gpufeed_storage_io_time_weighted_seconds_total")
    assert weighted["/mnt/fast scratch"] == pytest.approx(106033.346)
    wtime = by_mount(fams, "gpufeed_storage_write_time_seconds_total")
    assert wtime["/mnt/scratch"] == pytest.approx(41009.221)
    devices = {
        d["mountpoint"]: d.get("device")
        for d in labels_of(fams, "gpufeed_storage_read_bytes_total")
    }
    assert devices["/mnt/scratch"] == "dm-0"


def test_nfs_counters_from_mountstats_and_no_busy_time() -> None:
    fams = collector().collect()
    assert by_mount(fams, "gpufeed_storage_read_bytes_total")["/mnt/datasets"] == 962881212416
    assert by_mount(fams, "gpufeed_storage_written_bytes_total")["/mnt/archive"] == 1073741824
    assert by_mount(fams, "gpufeed_storage_reads_completed_total")["/mnt/datasets"] == 917412
    assert by_mount(fams, "gpufeed_storage_writes_completed_total")["/mnt/archive"] == 1024
    rt = by_mount(fams, "gpufeed_storage_read_time_seconds_total")
    assert rt["/mnt/datasets"] == pytest.approx(3540.012)
    wt = by_mount(fams, "gpufeed_storage_write_time_seconds_total")
    assert wt["/mnt/archive"] == pytest.approx(211.398)
    for absent in ("io_time_seconds_total", "io_time_weighted_seconds_total"):
        assert "/mnt/datasets" not in by_mount(fams, "gpufeed_storage_" + absent)
    rtt = {
        (d["mountpoint"], d["op"]) for d in labels_of(fams, "gpufeed_storage_nfs_rtt_seconds_total")
    }
    assert rtt == {(mp, op) for mp in ("/mnt/datasets", "/mnt/archive") for op in ("read", "write")}


def test_capacity_and_free_from_statvfs_absent_when_unreported() -> None:
    fams = collector().collect()
    cap = by_mount(fams, "gpufeed_storage_capacity_bytes")
    free = by_mount(fams, "gpufeed_storage_free_bytes")
    assert cap["/mnt/scratch"] == 500_000_000 * 4096
    assert free["/mnt/scratch"] == 125_000_000 * 4096  # f_bavail, not f_bfree
    assert free["/mnt/raid"] == 10 * 4096
    assert "/mnt/archive" not in cap and "/mnt/archive" not in free
    assert set(by_mount(fams, "gpufeed_storage_mount_stuck").values()) == {0.0}


HOT_WARM_COLD = (
    TierConfig("hot", ("/mnt/scratch", "/var/cache/scratch")),
    TierConfig("gpu_direct", ("/mnt/fast scratch",)),
    TierConfig("warm", ("/mnt/datasets/imagenet", "/srv/imagenet", "/mnt/typo")),
    TierConfig("cold", ("/mnt/raid", "/data/archive")),
)


def test_tiers_map_paths_to_their_mounts() -> None:
    fams = collector(HOT_WARM_COLD).collect()
    got = sorted(
        (d["tier"], d["mountpoint"], d.get("device", ""))
        for d in labels_of(fams, "gpufeed_storage_read_bytes_total")
    )
    # hot: a bind mount of the same dm device is one series; warm: a path inside the NFS
    # mount and a bind of it are one series; cold: /data/archive is a symlink (under the
    # rootfs) into the NFS v3 mount. / and /boot/efi are in no tier, so not exported.
    assert got == [
        ("cold", "/mnt/archive", ""),
        ("cold", "/mnt/raid", "md0"),
        ("gpu_direct", "/mnt/fast scratch", "nvme1n1"),
        ("hot", "/mnt/scratch", "dm-0"),
        ("warm", "/mnt/datasets", ""),
    ]
    missing = {
        (s.label("tier"), s.label("path")): s.value
        for f in fams
        for s in f.samples
        if s.name == "gpufeed_storage_tier_path_missing"
    }
    assert missing[("warm", "/mnt/typo")] == 1.0
    assert missing[("cold", "/data/archive")] == 0.0
    assert missing[("hot", "/mnt/scratch")] == 0.0
    assert len(missing) == 8


def test_tiers_from_yaml_config() -> None:
    cfg = parse_config("tiers:\n  hot: [/mnt/scratch/cache]\n  warm: /data/imagenet-rel\n")
    c = StorageCollector(CollectorContext(node_paths(), cfg), statvfs=table_statvfs())
    got = sorted(
        (d["tier"], d["mountpoint"]) for d in labels_of(c.collect(), "gpufeed_storage_mount_info")
    )
    assert got == [("hot", "/mnt/scratch"), ("warm", "/mnt/datasets")]


def test_missing_tier_path_warns_once_and_the_rest_keep_working(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = collector((TierConfig("hot", ("/mnt/nvme-typo",)), TierConfig("warm", ("/mnt/raid",))))
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.storage"):
        for _ in range(3):
            fams = c.collect()
    warnings = [r.getMessage() for r in caplog.records if "/mnt/nvme-typo" in r.getMessage()]
    assert len(warnings) == 1
    assert "does not exist" in warnings[0] and "'hot'" in warnings[0]
    assert by_mount(fams, "gpufeed_storage_read_bytes_total") == {"/mnt/raid": 5801105712 * 512}


def test_tiers_sharing_a_device_are_both_exported_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tiers = (TierConfig("hot", ("/mnt/scratch",)), TierConfig("ckpt", ("/var/cache/scratch",)))
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.storage"):
        fams = collector(tiers).collect()
    got = sorted(
        (d["tier"], d["mountpoint"]) for d in labels_of(fams, "gpufeed_storage_read_bytes_total")
    )
    assert got == [("ckpt", "/var/cache/scratch"), ("hot", "/mnt/scratch")]
    assert any("same device 253:0" in r.getMessage() for r in caplog.records)


def copy_node(tmp_path: Path) -> Path:
    dst = tmp_path / "node"
    shutil.copytree(NODE1, dst, symlinks=True)
    return dst


def test_missing_diskstats_keeps_capacity_and_nfs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = copy_node(tmp_path)
    (node / "proc" / "diskstats").unlink()
    c = collector(paths=node_paths(node), statvfs=table_statvfs(node / "root"))
    with caplog.at_level(logging.ERROR, logger="gpufeed.collectors.storage"):
        for _ in range(2):
            with pytest.raises(PartialCollectionError, match="diskstats") as info:
                c.collect()
    fams = info.value.families
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "diskstats" in errors[0]
    read = by_mount(fams, "gpufeed_storage_read_bytes_total")
    assert read == {"/mnt/datasets": 962881212416, "/mnt/archive": 2151677952}
    assert by_mount(fams, "gpufeed_storage_capacity_bytes")["/mnt/scratch"] == 500_000_000 * 4096
    # the block mounts are still listed, with their devices
    assert len(labels_of(fams, "gpufeed_storage_mount_info")) == 7


def test_missing_mountinfo_is_a_clear_failure(tmp_path: Path) -> None:
    node = copy_node(tmp_path)
    (node / "proc" / "self" / "mountinfo").unlink()
    with pytest.raises(RuntimeError, match=r"cannot read the mount table .*mountinfo"):
        collector(paths=node_paths(node)).collect()


def test_missing_mountstats_leaves_nfs_counters_out(tmp_path: Path) -> None:
    node = copy_node(tmp_path)
    (node / "proc" / "self" / "mountstats").unlink()
    c = collector(paths=node_paths(node), statvfs=table_statvfs(node / "root"))
    with pytest.raises(PartialCollectionError, match="mountstats: NFS counters left out") as info:
        c.collect()
    fams = info.value.families
    read = by_mount(fams, "gpufeed_storage_read_bytes_total")
    assert "/mnt/datasets" not in read and read["/mnt/scratch"] == 5120098304 * 512
    assert by_mount(fams, "gpufeed_storage_capacity_bytes")["/mnt/datasets"] == 2e9 * 4096


def test_garbage_lines_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = copy_node(tmp_path)
    for name in ("diskstats", "self/mountinfo"):
        p = node / "proc" / name
        lines = p.read_text().splitlines()
        lines.insert(3, "### garbage \x00 line")
        lines.insert(5, "259 9")
        p.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.storage"):
        fams = collector(paths=node_paths(node), statvfs=table_statvfs(node / "root")).collect()
    assert len(labels_of(fams, "gpufeed_storage_mount_info")) == 7
    assert by_mount(fams, "gpufeed_storage_read_bytes_total")["/mnt/scratch"] == 5120098304 * 512
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert "2 unparsable mountinfo" in msgs and "2 unparsable diskstats" in msgs


def test_without_sysfs_devices_are_named_from_diskstats(tmp_path: Path) -> None:
    paths = HostPaths(NODE1 / "proc", tmp_path / "no-sys", ROOT)
    fams = collector(paths=paths).collect()
    info = {d["mountpoint"]: d for d in labels_of(fams, "gpufeed_storage_mount_info")}
    assert info["/mnt/scratch"]["device"] == "dm-0"
    assert info["/mnt/scratch"]["kind"] == "unknown"
    # btrfs shows an anonymous 0:33; without sysfs its device cannot be found
    assert "/" not in info


# a 0.1 s bound on every statvfs: under a loaded parallel pass a healthy mount's call can
# miss it and read stuck (seen once); runs alone, after the parallel pass
@pytest.mark.serial
def test_hung_statvfs_marks_the_mount_stuck_and_starts_no_second_call() -> None:
    release = threading.Event()
    calls: dict[str, int] = {}
    real = table_statvfs()

    def statvfs(path: str) -> os.statvfs_result:
        calls[path] = calls.get(path, 0) + 1
        if path.endswith("/mnt/datasets"):
            release.wait(30)  # a hung NFS server; released by the test
        return real(path)

    hung = str(ROOT / "mnt" / "datasets")
    c = collector(statvfs=statvfs, timeout=0.1)
    try:
        for round_ in range(2):
            t0 = time.monotonic()
            fams = c.collect()
            assert time.monotonic() - t0 < 1.0
            stuck = by_mount(fams, "gpufeed_storage_mount_stuck")
            assert stuck["/mnt/datasets"] == 1.0
            assert {v for mp, v in stuck.items() if mp != "/mnt/datasets"} == {0.0}
            cap = by_mount(fams, "gpufeed_storage_capacity_bytes")
            assert "/mnt/datasets" not in cap and cap["/mnt/scratch"] == 500_000_000 * 4096
            # counters of the stuck mount still come from mountstats
            read = by_mount(fams, "gpufeed_storage_read_bytes_total")
            assert read["/mnt/datasets"] == 962881212416
            assert calls[hung] == 1, f"round {round_}: a second statvfs started on a hung mount"
        release.set()
        deadline = time.monotonic() + 5
        while c._calls.in_flight() and time.monotonic() < deadline:
            time.sleep(0.01)
        fams = c.collect()
        assert by_mount(fams, "gpufeed_storage_mount_stuck")["/mnt/datasets"] == 0.0
        assert by_mount(fams, "gpufeed_storage_capacity_bytes")["/mnt/datasets"] == 2e9 * 4096
        assert calls[hung] == 2
    finally:
        release.set()


# a 0.1 s bound on every statvfs: under a loaded parallel pass a healthy mount's call can
# miss it and read stuck (seen once); runs alone, after the parallel pass
@pytest.mark.serial
def test_hung_tier_path_maps_by_text_and_reports_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier path inside a hung mount cannot be stat'ed; its mount is still exported, stuck."""
    from gpufeed.storage.pathresolve import resolve_in_root as real_resolve

    release = threading.Event()

    def slow_resolve(rootfs: Path, path: str) -> str:
        if path.startswith("/mnt/datasets/"):
            release.wait(30)
        return real_resolve(rootfs, path)

    monkeypatch.setattr("gpufeed.collectors.storage.resolve_in_root", slow_resolve)
    try:
        c = collector((TierConfig("warm", ("/mnt/datasets/imagenet",)),), timeout=0.1)
        fams = c.collect()
    finally:
        release.set()
    assert by_mount(fams, "gpufeed_storage_mount_stuck") == {"/mnt/datasets": 1.0}
    assert by_mount(fams, "gpufeed_storage_capacity_bytes") == {}
    assert by_mount(fams, "gpufeed_storage_read_bytes_total") == {"/mnt/datasets": 962881212416}
    assert labels_of(fams, "gpufeed_storage_tier_path_missing") == []


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
def test_hangs_in_path_checks_and_statvfs_share_one_time_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tier path and a mount that both hang cost one budget (2 x timeout), not two."""
    from gpufeed.storage.pathresolve import resolve_in_root as real_resolve

    release = threading.Event()
    real = table_statvfs()

    def slow_resolve(rootfs: Path, path: str) -> str:
        if path.startswith("/mnt/datasets/"):
            release.wait(30)
        return real_resolve(rootfs, path)

    def statvfs(path: str) -> os.statvfs_result:
        if path.endswith("/mnt/raid"):
            release.wait(30)
        return real(path)

    monkeypatch.setattr("gpufeed.collectors.storage.resolve_in_root", slow_resolve)
    tiers = (
        TierConfig("warm", ("/mnt/datasets/imagenet",)),
        TierConfig("cold", ("/mnt/raid",)),
        TierConfig("hot", ("/mnt/scratch",)),
    )
    c = collector(tiers, statvfs=statvfs, timeout=0.1)
    try:
        t0 = time.monotonic()
        first = c.collect()
        assert time.monotonic() - t0 < 0.3
        t0 = time.monotonic()
        second = c.collect()
        assert time.monotonic() - t0 < 0.1
    finally:
        release.set()
    # first collect: the path check used 0.1 s, the raid statvfs the rest of the 0.2 s
    # budget; the hot mount's statvfs (after raid in order) could not be tried in time
    assert by_mount(first, "gpufeed_storage_mount_stuck") == {
        "/mnt/datasets": 1.0,
        "/mnt/raid": 1.0,
    }
    assert by_mount(second, "gpufeed_storage_mount_stuck") == {
        "/mnt/datasets": 1.0,
        "/mnt/raid": 1.0,
        "/mnt/scratch": 0.0,
    }
    assert by_mount(second, "gpufeed_storage_capacity_bytes") == {
        "/mnt/scratch": 500_000_000 * 4096
    }


def test_missing_files_that_no_mount_needs_are_not_a_failure(tmp_path: Path) -> None:
    node = copy_node(tmp_path)
    (node / "proc" / "self" / "mountstats").unlink()
    (node / "proc" / "diskstats").unlink()
    # only a tmpfs tier: neither diskstats nor mountstats is needed
    fams = collector((TierConfig("shm", ("/dev/shm",)),), paths=node_paths(node)).collect()
    assert [d["kind"] for d in labels_of(fams, "gpufeed_storage_mount_info")] == ["other"]


def test_devices_to_tier_maps_backing_devices_and_unambiguous_parent_disks() -> None:
    c = collector(HOT_WARM_COLD)
    assert c.devices_to_tier() == {}
    c.collect()
    # dm-0, nvme1n1 and md0 as the fixture's sysfs numbers them; NFS tiers have no device.
    assert c.devices_to_tier() == {"253:0": "hot", "259:4": "gpu_direct", "9:0": "cold"}
    # A partition's I/O is accounted to its whole disk by cgroups: the disk maps too.
    boot = collector((TierConfig("hot", ("/boot/efi",)),))
    boot.collect()
    mapping = boot.devices_to_tier()
    (part,) = [k for k, v in mapping.items() if k != "259:0"]
    assert mapping == {part: "hot", "259:0": "hot"}


def test_md_without_time_accounting_leaves_its_time_counters_out() -> None:
    # The fixture's md0 did 11019413 reads and 3202310 writes with every time field 0.
    fams = collector().collect()
    assert by_mount(fams, "gpufeed_storage_reads_completed_total")["/mnt/raid"] == 11019413
    assert by_mount(fams, "gpufeed_storage_read_bytes_total")["/mnt/raid"] == 5801105712 * 512
    for name in (
        "read_time_seconds_total",
        "write_time_seconds_total",
        "io_time_seconds_total",
        "io_time_weighted_seconds_total",
    ):
        series = by_mount(fams, "gpufeed_storage_" + name)
        assert "/mnt/raid" not in series, name
        assert "/mnt/scratch" in series, name  # dm-0 counts time: still exported


def test_mount_point_that_is_not_utf8_keeps_the_page_renderable(tmp_path: Path) -> None:
    import shutil

    from gpufeed.exposition import render_text

    node = tmp_path / "node"
    shutil.copytree(NODE1, node, symlinks=True)
    mountinfo = node / "proc" / "self" / "mountinfo"
    # A directory named in Latin-1 (one 0xE9 byte), as an old tool or a user may create it.
    mountinfo.write_bytes(mountinfo.read_bytes().replace(b" /mnt/raid ", b" /mnt/caf\xe9 "))
    paths = HostPaths(node / "proc", node / "sys", node / "root")
    fams = collector(paths=paths).collect()
    text = render_text(fams).decode("utf-8")
    assert 'mountpoint="/mnt/caf\ufffd"' in text
    assert 'gpufeed_storage_read_bytes_total{device="md0",mountpoint="/mnt/caf\ufffd"' in text
