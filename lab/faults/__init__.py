"""Fault injectors, one module per kind. Each is made from a scenario's fault entry and the
run's context, and has `prepare()` (before the workload starts: files it needs), `start()`
and `stop()`. `stop()` is idempotent and is called for every injector the runner made,
whether the fault started or not, on a normal end, an exception, SIGTERM, SIGINT or SIGHUP
(lab.run): nothing a fault did outlives the run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from lab.host import JobCgroup, LoopTier, dies_with_runner
from lab.scenario import Fault

__all__ = [
    "FaultContext",
    "Injector",
    "background_kinds",
    "dies_with_runner",
    "kinds",
    "make",
    "make_background",
    "tier_of",
]

if TYPE_CHECKING:
    from lab.faults.s3 import LabS3


@dataclass(frozen=True, slots=True)
class FaultContext:
    cgroup: JobCgroup
    tiers: Mapping[str, LoopTier]
    control: Path  # the workload's control file (lab/workloads/train.py --control)
    run_dir: Path
    nice: list[str]  # the workload's `nice -n N` prefix: hogs compete at the same niceness
    s3: LabS3 | None = None  # the scenario's object store, where it has an `s3` tier


class Injector(Protocol):
    def prepare(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


Factory = Callable[[Fault, FaultContext], Injector]


def kinds() -> Mapping[str, Factory]:
    """Fault kind -> injector. Imported here, not at module level, so that loading a
    scenario does not import every injector."""
    from lab.faults import blkio, checkpoint, contention, cpu, s3

    return MappingProxyType(
        {
            "blkio_read_limit": blkio.ReadLimit,
            "io_contention": contention.DirectReaders,
            "cpu_hog": cpu.CpuHogs,
            "cpu_quota": cpu.CpuQuota,
            "checkpoint_storm": checkpoint.CheckpointStorm,
            "s3_slow": s3.SlowS3,
        }
    )


def background_kinds() -> Mapping[str, Factory]:
    """A scenario's `background:` kind -> injector (lab.scenario.BACKGROUND_DEFAULTS: the
    host's other work, started and stopped like a fault, never expected as a cause)."""
    from lab.faults import busy

    return MappingProxyType({"busy_host": busy.BusyHost})


def make_background(entry: Fault, ctx: FaultContext) -> Injector:
    factory = background_kinds().get(entry.kind)
    if factory is None:
        known = ", ".join(sorted(background_kinds()))
        raise ValueError(f"unknown background kind {entry.kind!r} (known: {known})")
    return factory(entry, ctx)


def make(fault: Fault, ctx: FaultContext) -> Injector:
    factory = kinds().get(fault.kind)
    if factory is None:
        raise ValueError(f"unknown fault kind {fault.kind!r} (known: {', '.join(sorted(kinds()))})")
    return factory(fault, ctx)


def tier_of(fault: Fault, ctx: FaultContext) -> LoopTier:
    name = fault.param("tier")
    if name not in ctx.tiers:
        raise ValueError(f"fault {fault.kind} needs `tier:` naming one of {sorted(ctx.tiers)}")
    return ctx.tiers[name]
