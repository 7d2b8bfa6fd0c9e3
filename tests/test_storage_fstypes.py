"""Which filesystem types are storage without tiers."""

from __future__ import annotations

import pytest

from gpufeed.storage.fstypes import is_excluded_by_default, is_network


@pytest.mark.parametrize(
    ("fstype", "network", "excluded"),
    [
        ("nfs4", True, False),
        ("cifs", True, False),
        ("lustre", True, False),
        ("fuse.s3fs", True, False),
        ("fuse.mountpoint-s3", True, False),
        ("fuse.lxcfs", False, False),
        ("fuse", False, False),
        ("ext4", False, False),
        ("xfs", False, False),
        ("tmpfs", False, True),
        ("overlay", False, True),
        ("squashfs", False, True),
        ("proc", False, True),
        ("cgroup2", False, True),
    ],
)
def test_classification(fstype: str, network: bool, excluded: bool) -> None:
    assert is_network(fstype) is network
    assert is_excluded_by_default(fstype) is excluded
