"""DeviceResolver: sysfs answers are reused within the TTL and refreshed after it."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpufeed.hostpaths import HostPaths
from gpufeed.procfs.diskstats import parse_diskstats
from gpufeed.procfs.mountinfo import parse_mountinfo
from gpufeed.storage.devices import DeviceResolver
from storage_helpers import NODE1, node_paths


def test_refreshes_after_ttl(tmp_path: Path) -> None:
    node = tmp_path / "node"
    shutil.copytree(NODE1, node, symlinks=True)
    now = [100.0]
    r = DeviceResolver(node_paths(node), ttl_seconds=60, clock=lambda: now[0])
    table = parse_mountinfo((node / "proc" / "self" / "mountinfo").read_text())
    scratch = next(m for m in table.mounts if m.mountpoint == "/mnt/scratch")
    first = r.for_mount(scratch, None)
    assert first is not None and first.dm_name == "vg0-scratch"
    (node / "sys" / "devices" / "virtual" / "block" / "dm-0" / "dm" / "name").write_text(
        "vg1-new\n"
    )
    now[0] += 59
    again = r.for_mount(scratch, None)
    assert again is not None and again.dm_name == "vg0-scratch"  # cached
    now[0] += 2
    fresh = r.for_mount(scratch, None)
    assert fresh is not None and fresh.dm_name == "vg1-new"


def test_btrfs_source_and_diskstats_fallback(tmp_path: Path) -> None:
    table = parse_mountinfo((NODE1 / "proc" / "self" / "mountinfo").read_text())
    by = {m.mountpoint: m for m in table.mounts}
    r = DeviceResolver(node_paths())
    root = r.for_mount(by["/"], None)
    assert root is not None and (root.name, root.major, root.minor) == ("nvme0n1p3", 259, 3)
    assert r.for_mount(by["/mnt/datasets"], None) is None
    assert r.for_mount(by["/dev/shm"], None) is None
    disk = parse_diskstats((NODE1 / "proc" / "diskstats").read_text())
    blind = DeviceResolver(HostPaths(NODE1 / "proc", tmp_path, NODE1 / "root"))
    md = blind.for_mount(by["/mnt/raid"], disk)
    assert md is not None and (md.name, md.kind) == ("md0", "unknown")
    assert blind.for_mount(by["/mnt/raid"], None) is not None  # cached from the call above
