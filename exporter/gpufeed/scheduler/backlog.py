"""What a scheduler says, in one shape for Slurm and Kubernetes, and why free GPUs stay idle.

GPUs that are free while GPU jobs pend are not plain idle. Either no node has enough free
GPUs for any pending request although the cluster has enough in total (`fragmentation`),
or some pending job would fit where GPUs are free and still waits (`stall`: the scheduler
has not placed it, a reservation or a policy holds it). Jobs that cannot start whatever is
free (held, waiting on a dependency or a start time) do not count as a stall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

BacklogReason = Literal["fragmentation", "stall"]

# Pending reasons (Slurm's names, and Kubernetes' SchedulingGated) under which a job could
# not start whatever were free: they are queue depth, but no evidence against the
# scheduler or the cluster's shape.
NOT_ELIGIBLE_REASONS = frozenset(
    {
        "JobHeldUser",
        "JobHeldAdmin",
        "Dependency",
        "DependencyNeverSatisfied",
        "BeginTime",
        "PartitionDown",
        "PartitionInactive",
        "Reservation",
        "SchedulingGated",
    }
)


@dataclass(frozen=True, slots=True)
class PendingJob:
    """One pending job (Slurm) or pod (Kubernetes) that asks for GPUs."""

    job_id: str
    queue: str  # Slurm partition, Kubernetes namespace
    reason: str  # the scheduler's word for why it waits ("Resources", "Unschedulable")
    wait_seconds: float  # since it became eligible (Slurm) or was created (Kubernetes)
    nodes: int  # nodes it needs (a pod: 1)
    gpus_per_node: int  # GPUs on each of them; 0 when only a job total is known
    gpus_total: int  # GPUs in all

    @property
    def eligible(self) -> bool:
        return self.reason not in NOT_ELIGIBLE_REASONS


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """A node's GPUs as the scheduler sees them; `schedulable` is False for a node that is
    down, drained or cordoned (its free GPUs are no use to a pending job)."""

    name: str
    total: int
    allocated: int
    schedulable: bool

    @property
    def free(self) -> int:
        return max(self.total - self.allocated, 0) if self.schedulable else 0


@dataclass(frozen=True, slots=True)
class CycleTime:
    """The scheduler's own timing of its scheduling cycles (Slurm sdiag)."""

    cycle: str  # "main" or "backfill"
    last_seconds: float
    mean_seconds: float | None


@dataclass(frozen=True, slots=True)
class SchedulerReading:
    scheduler: str  # "slurm" or "kubernetes"
    pending: tuple[PendingJob, ...]
    nodes: tuple[NodeGpus, ...]
    cycles: tuple[CycleTime, ...] = ()


def fits(job: PendingJob, free_by_node: Sequence[int]) -> bool:
    """Whether the free GPUs could start `job` now (GPUs only; CPUs and memory aside)."""
    if job.gpus_per_node > 0:
        return sum(1 for f in free_by_node if f >= job.gpus_per_node) >= job.nodes
    best = sorted(free_by_node, reverse=True)[: max(job.nodes, 1)]
    return sum(best) >= job.gpus_total


def backlog_reason(reading: SchedulerReading) -> BacklogReason | None:
    """Why free GPUs stay idle while GPU jobs pend; None when nothing is free, nothing
    eligible pends, or what pends needs more GPUs than the cluster has free."""
    free = [n.free for n in reading.nodes]
    total_free = sum(free)
    eligible = [j for j in reading.pending if j.eligible and j.gpus_total > 0]
    if total_free == 0 or not eligible:
        return None
    if any(fits(j, free) for j in eligible):
        return "stall"
    if any(j.gpus_total <= total_free for j in eligible):
        return "fragmentation"
    return None
