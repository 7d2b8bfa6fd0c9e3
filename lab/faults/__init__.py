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

from lab.host import JobCgroup, LoopTier
from lab.scenario import Fault

if TYPE_CHECKING:
    from lab.faults.s3 import LabS3


def dies_with_runner(argv: list[str]) -> list[str]:
    """argv that the kernel kills (SIGKILL) when the runner thread that started it ends
    (util-linux setpriv --pdeathsig; kept across the exec of a cgroup-entering shell). The
    runner's traps stop every fault, but no trap sees SIGKILL: seen here, two CPU hogs and a
    competing reader ran on for 1.5 hours after their runner was killed that way."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]


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
