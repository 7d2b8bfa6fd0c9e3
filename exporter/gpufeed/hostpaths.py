"""Where the host's pseudo-filesystems are (`--path.procfs`, `--path.sysfs`, `--path.rootfs`).

It lives below the parsers (procfs/, sysfs/, storage/) and the collectors that use them, so
that a parser never imports a collector to learn where to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class HostPaths:
    """Where the host's pseudo-filesystems are; moved for containers and fixture trees."""

    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")

    def proc(self, *parts: str) -> Path:
        return self.procfs.joinpath(*parts)

    def sys(self, *parts: str) -> Path:
        return self.sysfs.joinpath(*parts)

    def root(self, path: str) -> Path:
        """A host path (as mountinfo shows it) seen through --path.rootfs."""
        return self.rootfs.joinpath(path.lstrip("/"))
