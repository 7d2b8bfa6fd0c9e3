"""What every collector is: a name and a `collect()` that returns fresh families.

Collectors are called from the sampler's worker threads, one call at a time per collector,
under a time bound. A collector may keep private state between calls (a previous reading
for a rate, a file handle), but what it returns is always built anew from current data.
Raising from `collect()` marks the collector failed for that interval; returning an empty
list is "no data", which is not a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpufeed.config import AgentConfig
from gpufeed.model import Family


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


@dataclass(frozen=True, slots=True)
class CollectorContext:
    paths: HostPaths = field(default_factory=HostPaths)
    config: AgentConfig = field(default_factory=AgentConfig)


class Collector(Protocol):
    name: str

    def collect(self) -> list[Family]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """A collector the CLI can switch with --collector.NAME / --no-collector.NAME."""

    name: str
    help: str
    default_enabled: bool
    factory: Callable[[CollectorContext], Collector]
