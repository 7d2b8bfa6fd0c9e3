"""A node's storage tiers: each an ext4 image on its own loop device, mounted under the run's
directory, so that a read limit on one node's data tier (its loop device) touches no other
node's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab.multinode.fabric import sh


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    mountpoint: Path
    loop_device: str  # /dev/loopN
    device: str  # MAJ:MIN of the mounted filesystem


def make_tier(
    base: Path, name: str, size_mib: int, on_undo: Callable[[Callable[[], object]], object]
) -> Tier:
    """Makes, attaches and mounts one tier; each undo step is handed over as soon as the thing
    it undoes exists."""
    image = base / f"{name}.img"
    mnt = base / name
    mnt.mkdir(parents=True)
    with open(image, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    on_undo(lambda: image.unlink(missing_ok=True))
    sh("mkfs.ext4", "-q", "-F", "-E", "nodiscard", str(image))
    loop = sh("losetup", "--find", "--show", "--direct-io=on", str(image))
    on_undo(lambda: subprocess.run(["losetup", "-d", loop], capture_output=True, check=False))
    sh("mount", "-o", "noatime", loop, str(mnt))
    on_undo(lambda: _umount(mnt))
    st = os.stat(mnt)
    return Tier(name, mnt, loop, f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}")


def _umount(mnt: Path) -> None:
    for args in (["umount", str(mnt)], ["umount", "-l", str(mnt)]):
        if subprocess.run(args, capture_output=True, check=False).returncode == 0:
            break
    if mnt.exists() and not any(mnt.iterdir()):
        mnt.rmdir()


def fill(directory: Path, files: int, file_bytes: int) -> None:
    """Writes the dataset: `files` files of random bytes, synced to the device."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (directory / f"{i:05d}.bin").write_bytes(os.urandom(file_bytes))
    os.sync()
