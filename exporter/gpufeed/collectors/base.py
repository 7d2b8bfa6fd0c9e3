"""What every collector is: a name and a `collect()` that returns fresh families.

Collectors are called from the sampler's worker threads, one call at a time per collector,
under a time bound. A collector may keep private state between calls (a previous reading
for a rate, a file handle), but what it returns is always built anew from current data.
Raising from `collect()` marks the collector failed for that interval; returning an empty
list is "no data", which is not a failure.

Collectors never read each other's attributes. What one needs from another (the job layer
needs the GPU processes and the storage tiers' devices) flows through the sampler's tick: a
`Producer` adds what its last collect() read to the tick's `TickData` once that call has
returned, and a `Consumer` of it runs after its producers in the same tick and receives it,
so it always sees the same tick's data, or none (producer off, failed or late), never an
older tick's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from gpufeed.catalogue import MetricSpec
from gpufeed.config import AgentConfig
from gpufeed.gpu.backend import GpuSample
from gpufeed.hostpaths import HostPaths
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family


@dataclass(frozen=True, slots=True)
class CollectorContext:
    paths: HostPaths = field(default_factory=HostPaths)
    config: AgentConfig = field(default_factory=AgentConfig)


class Collector(Protocol):
    name: str

    def collect(self) -> list[Family]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TickData:
    """What producers read in one tick, for the consumers of the same tick; empty when the
    producer is off or did not answer in time."""

    gpu_samples: tuple[GpuSample, ...] = ()  # from "gpu": the processes on each GPU
    # from "storage": "MAJ:MIN" -> tier of the block devices behind the tiers
    devices_to_tier: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # from "storage": mount point -> tier of the block-backed tiers' mounts (local
    # filesystems: opening a job's file there cannot hang on a server)
    tier_mounts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@runtime_checkable
class Producer(Protocol):
    """A collector whose reading other collectors of the same tick need."""

    name: str

    def produce(self, data: TickData) -> TickData:
        """`data` with what the last collect() read added (called after it returned)."""
        ...


@runtime_checkable
class Consumer(Protocol):
    """A collector that needs producers' data; the sampler runs it after them."""

    name: str
    needs: tuple[str, ...]  # the producers' names

    def collect_with(self, data: TickData) -> list[Family]: ...


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


def partial_result(families: Families, failed: list[str]) -> list[Family]:
    """What a collector read; raises PartialCollectionError carrying it when a source failed.

    Success 0 for the interval, and what was read is still published.
    """
    built = families.build()
    if failed:
        raise PartialCollectionError("; ".join(failed), built)
    return built


# Reads one source (a /proc or /sys file group) into the families; appends what it could not
# make sense of (a bad line) to the problems list; raises OSError or ValueError when the
# source as a whole cannot be read.
SourceReader = Callable[[Families, list[str]], None]


def collect_sources(
    specs: Iterable[MetricSpec], sources: Sequence[tuple[str, SourceReader]], warn: LogOnce
) -> list[Family]:
    """One collect() over several independent sources: a source that fails loses only its
    own samples (the rest is published, success 0 for the interval), and its problems are
    logged once through `warn` rather than every interval."""
    fams = Families()
    for m in specs:
        fams.declare_spec(m)
    problems: list[str] = []
    failed: list[str] = []
    for source, read in sources:
        try:
            read(fams, problems)
        except (OSError, ValueError) as exc:
            failed.append(f"{source}: {exc}")
    warn.report(logging.WARNING, problems + failed)
    return partial_result(fams, failed)
