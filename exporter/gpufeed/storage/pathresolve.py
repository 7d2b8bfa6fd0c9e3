"""Resolving a configured host path through --path.rootfs, symlinks included.

A tier path like /data may be a symlink to /mnt/nvme/data; mapping the literal string to
the longest mount-point prefix would pick "/" instead of /mnt/nvme. Absolute link targets
are host paths, so they are re-rooted under rootfs rather than followed on the agent's
own filesystem (which is what os.path.realpath would do in a container).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_MAX_LINKS = 40  # the kernel's own limit (MAXSYMLINKS)


def resolve_in_root(rootfs: Path, path: str) -> str:
    """The host path `path` with every symlink resolved; raises OSError if it does not exist."""
    todo = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = rootfs.joinpath(*done, part)
        st = os.lstat(here)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(here))
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p] + todo
            continue
        done.append(part)
    return "/" + "/".join(done)
