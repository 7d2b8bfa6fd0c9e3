"""One fleet cycle: advance every node's carried engine through the boundary (fleet/carry.py),
join each job's nodes, and cut out what the cycle reports (its closed windows, the ledger
of its slice, the jobs held back at its end)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.promql import Retry
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.fleet.carry import FleetEngines
from gpufeed.fleet.ledger import LedgerSlice, ledger_slice
from gpufeed.fleet.timing import CycleTiming
from gpufeed.vocabulary import Cause

# A query is tried twice, then the cycle fails: the service tries the whole cycle again
# (with its own backoff) and reports its lag meanwhile, rather than block in one query.
QUERY_RETRY = Retry(attempts=2, first_backoff_seconds=1.0, timeout_seconds=30.0)


@dataclass(frozen=True, slots=True, order=True)
class HeldBack:
    """A job whose GPUs wait for a culprit at the end of the reported slice."""

    job_id: str
    culprit_instance: str
    culprit_gpu: str
    culprit_rank: str
    cause: str  # the culprit's own cause
    waiting_gpus: int


@dataclass(frozen=True, slots=True, order=True)
class Imbalanced:
    """A job whose GPUs wait, at the end of the reported slice, for its own imbalance (a
    pipeline stage slower on every replica, a rotating slowest data-parallel rank): a
    finding for the job's owner, no culprit."""

    job_id: str
    reason: str  # StragglerReason
    pipeline_stage: str  # stage_imbalance: the stage; "" otherwise
    waiting_gpus: int


@dataclass(frozen=True, slots=True)
class CycleResult:
    boundary_seconds: float
    closed: tuple[Window, ...]  # windows whose end lies in the reported slice
    range_closed: tuple[Window, ...]  # every window that closed in the range
    open: tuple[Window, ...]  # windows still open at the boundary
    ledger: LedgerSlice
    held_back: tuple[HeldBack, ...]
    underutilized_gpus: tuple[tuple[str, str, int], ...]  # (job, cause, GPUs) at slice end
    jobs: tuple[str, ...]  # jobs holding GPUs in the slice
    queries: int  # what the cycle cost the TSDB
    points: int
    imbalanced: tuple[Imbalanced, ...] = ()


def evaluate(engines: FleetEngines, boundary: float) -> CycleResult:
    """The cycle at `boundary`: the carried engines advanced through it (only the instants
    since the last cycle are fetched and stepped), then the job-level join over the
    reporting epoch's windows and what the cycle reports."""
    epoch, queries, points = engines.advance(boundary)
    closed, open_ = epoch.windows()
    result = report(
        list(epoch.nodes.values()), closed, open_, boundary, engines.timing, engines.params
    )
    return replace(result, queries=queries, points=points)


def report(
    nodes: Sequence[NodeSeries],
    closed: list[Window],
    open_: list[Window],
    boundary: float,
    timing: CycleTiming,
    params: WindowParams,
) -> CycleResult:
    """What the cycle at `boundary` reports from the windows of its range (closed, and still
    open at its end): the job-level correlation (issue 13: every node of every job is here
    at once, so a multi-node job's victims become `straggler` with their culprit), the
    windows that closed in its slice, the ledger of the slice, the jobs held back."""
    nodes = sorted(nodes, key=lambda n: n.instance)
    joined = correlate_jobs(nodes, closed + open_, params.threshold_ratio)
    closed, open_ = joined[: len(closed)], joined[len(closed) :]
    lo, hi = timing.report_slice(boundary)
    reported = [w for w in closed if lo < w.end_seconds <= hi]
    reported.sort(key=_report_order)
    ledger = ledger_slice(nodes, joined, lo, hi, timing.step_seconds)
    at_end = [w for w in joined if w.start_seconds <= hi and (w.end_seconds > hi or w.open)]
    return CycleResult(
        boundary_seconds=boundary,
        closed=tuple(reported),
        range_closed=tuple(sorted(closed, key=_node_order)),
        open=tuple(sorted(open_, key=_node_order)),
        ledger=ledger,
        held_back=_held_back(at_end),
        underutilized_gpus=_underutilized(at_end),
        jobs=tuple(sorted({job for job, _, _ in ledger.gpu_seconds})),
        queries=0,
        points=0,
        imbalanced=_imbalanced(at_end),
    )


def _report_order(w: Window) -> tuple[float, str, str, str, float]:
    return (w.end_seconds, w.instance, w.gpu, w.job_id, w.start_seconds)


def _node_order(w: Window) -> tuple[str, str, str, float]:
    return (w.instance, w.gpu, w.job_id, w.start_seconds)


def _held_back(at_end: Iterable[Window]) -> tuple[HeldBack, ...]:
    """One entry per (job, culprit): the job pages once, not once per victim GPU."""
    count: dict[tuple[str, str, str, str, str], int] = {}
    for w in at_end:
        culprit = w.culprit
        if w.cause is not Cause.STRAGGLER or culprit is None:
            continue
        key = (w.job_id, culprit.instance, culprit.gpu, culprit.rank, culprit.cause.value)
        count[key] = count.get(key, 0) + 1
    return tuple(HeldBack(*k, n) for k, n in sorted(count.items()))


def _imbalanced(at_end: Iterable[Window]) -> tuple[Imbalanced, ...]:
    """One entry per (job, imbalance): the job's owner is told once, not per GPU."""
    count: dict[tuple[str, str, str], int] = {}
    for w in at_end:
        ev = dict(w.evidence)
        reason = ev.get("straggler_reason")
        if w.cause is not Cause.STRAGGLER or w.culprit is not None or not reason:
            continue
        stage = ev.get("pipeline_stage")
        key = (w.job_id, str(reason), "" if stage is None else str(stage))
        count[key] = count.get(key, 0) + 1
    return tuple(Imbalanced(*k, n) for k, n in sorted(count.items()))


def _underutilized(at_end: Iterable[Window]) -> tuple[tuple[str, str, int], ...]:
    count: dict[tuple[str, str], int] = {}
    for w in at_end:
        if w.job_id:
            key = (w.job_id, w.cause.value)
            count[key] = count.get(key, 0) + 1
    return tuple((j, c, n) for (j, c), n in sorted(count.items()))
