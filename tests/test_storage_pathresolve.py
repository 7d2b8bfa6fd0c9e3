"""Tier paths are resolved under the rootfs, symlinks re-rooted there."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpufeed.storage.pathresolve import resolve_in_root
from storage_helpers import NODE1

ROOT = NODE1 / "root"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/mnt/datasets/imagenet", "/mnt/datasets/imagenet"),
        ("/data/archive", "/mnt/archive/old"),  # absolute link, followed inside the rootfs
        ("/data/imagenet-rel", "/mnt/datasets/imagenet"),  # relative link
        ("/data/archive/../../datasets", "/mnt/datasets"),
        ("/", "/"),
    ],
)
def test_resolve(path: str, expected: str) -> None:
    assert resolve_in_root(ROOT, path) == expected


def test_missing_path_raises_enoent() -> None:
    with pytest.raises(FileNotFoundError):
        resolve_in_root(ROOT, "/mnt/typo/x")


def test_symlink_loop_raises_eloop(tmp_path: Path) -> None:
    os.symlink("/b", tmp_path / "a")
    os.symlink("/a", tmp_path / "b")
    with pytest.raises(OSError) as info:
        resolve_in_root(tmp_path, "/a/x")
    assert info.value.errno == errno.ELOOP
