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
from typing import Protocol

from gpufeed.config import AgentConfig
from gpufeed.hostpaths import HostPaths
from gpufeed.model import Family


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


class PartialCollectionError(RuntimeError):
    """collect() read some of its sources and failed on others.

    The collector counts as failed for the interval (success 0, the message says what broke),
    and `families` holds what it did read, so a sampler can still publish those: one
    unreadable file does not take the rest of the collector's metrics with it. A sampler that
    does not know this class treats it like any other exception.
    """

    def __init__(self, message: str, families: list[Family]) -> None:
        super().__init__(message)
        self.families = families
