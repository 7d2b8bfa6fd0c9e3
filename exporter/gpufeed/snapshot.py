"""A snapshot: everything the agent knows at one sampling instant.

The sampler builds one per interval from the collectors; processors (the correlator) add
families derived from it; sinks (the recorder, OTLP) consume it; `/metrics` serves its
rendering. Snapshots are immutable, so they can be handed between threads freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpufeed.model import Family


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    name: str
    success: bool
    duration_seconds: float
    error: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    timestamp_seconds: float  # unix time at which sampling started
    families: tuple[Family, ...]
    statuses: tuple[CollectorStatus, ...] = ()


class Processor(Protocol):
    """Derives more families from each snapshot (runs in the sampler thread, must be fast)."""

    name: str

    def process(self, snapshot: Snapshot) -> list[Family]: ...


class Sink(Protocol):
    """Consumes each finished snapshot (the recorder, OTLP push). Must not block for long."""

    name: str

    def write(self, snapshot: Snapshot) -> None: ...

    def close(self) -> None: ...
