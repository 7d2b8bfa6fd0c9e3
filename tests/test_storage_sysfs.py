"""Block-device topology read from the fixture sysfs tree (NVMe, partitions, LVM, md, loop)."""

from __future__ import annotations

import pytest

from gpufeed.sysfs.block import (
    block_device_by_dev,
    block_device_by_dm_name,
    block_device_by_name,
    parse_dev,
)
from storage_helpers import node_paths

# (major, minor) -> (name, kind, parent, dm_name, slaves, disks)
TOPOLOGY = {
    (259, 0): ("nvme0n1", "nvme", "", "", (), ("nvme0n1",)),
    (259, 1): ("nvme0n1p1", "partition", "nvme0n1", "", (), ("nvme0n1",)),
    (259, 2): ("nvme0n1p2", "partition", "nvme0n1", "", (), ("nvme0n1",)),
    (259, 4): ("nvme1n1", "nvme", "", "", (), ("nvme1n1",)),
    (253, 0): ("dm-0", "dm", "", "vg0-scratch", ("nvme0n1p2",), ("nvme0n1",)),
    (9, 0): ("md0", "md", "", "", ("sda", "sdb"), ("sda", "sdb")),
    (8, 16): ("sdb", "disk", "", "", (), ("sdb",)),
    (7, 0): ("loop0", "loop", "", "", (), ("loop0",)),
}


@pytest.mark.parametrize(("dev", "expected"), sorted(TOPOLOGY.items()))
def test_block_device_by_dev(dev: tuple[int, int], expected: tuple[object, ...]) -> None:
    d = block_device_by_dev(node_paths(), *dev)
    assert d is not None
    assert (d.name, d.kind, d.parent, d.dm_name, d.slaves, d.disks) == expected
    assert (d.major, d.minor) == dev


@pytest.mark.parametrize(("dev", "expected"), sorted(TOPOLOGY.items()))
def test_block_device_by_name_agrees(dev: tuple[int, int], expected: tuple[object, ...]) -> None:
    by_name = block_device_by_name(node_paths(), str(expected[0]))
    assert by_name == block_device_by_dev(node_paths(), *dev)


def test_unknown_devices_are_none() -> None:
    paths = node_paths()
    assert block_device_by_dev(paths, 8, 32) is None
    assert block_device_by_name(paths, "sdz") is None
    assert block_device_by_name(paths, "../../etc") is None
    assert block_device_by_dm_name(paths, "vg9-none") is None


def test_dm_name_lookup() -> None:
    d = block_device_by_dm_name(node_paths(), "vg0-scratch")
    assert d is not None and d.name == "dm-0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("259:1\n", (259, 1)), ("8:0", (8, 0)), ("x:1", None), ("259", None), ("", None)],
)
def test_parse_dev(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_dev(text) == expected
