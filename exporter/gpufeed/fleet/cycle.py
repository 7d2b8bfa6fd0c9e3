"""One fleet cycle: load the range from the TSDB, run every node's engine, join each job's
nodes, and cut out what the cycle reports (its closed windows, the ledger of its slice, the
jobs held back at its end)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace

from gpufeed.correlator.engine.engine import NodeCorrelator, WindowParams
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.view import Timing
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds import promql
from gpufeed.correlator.feeds.analyze import estimate_interval
from gpufeed.correlator.feeds.promql import Retry
from gpufeed.correlator.feeds.stream import DEFAULT_BATCH_INSTANCES, StreamConfig, plan
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.fleet.ledger import LedgerKey, LedgerSlice, ledger_slice
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


def node_windows(node: NodeSeries, params: WindowParams) -> tuple[list[Window], list[Window]]:
    """(closed, open) windows of one node over its columns: the engine run to the data's
    end without closing what is still open there (the live edge)."""
    corr = NodeCorrelator(node, Timing(estimate_interval(node)), params)
    corr.refresh_units()
    for t in corr.timeline():
        corr.step(t)
    return corr.windows, corr.open_windows()


def job_level(nodes: Sequence[NodeSeries], windows: list[Window], threshold: float) -> list[Window]:
    """The job-level correlation (issue 13): every node of every job is here at once, so a
    multi-node job's victims become `straggler` with their culprit."""
    return correlate_jobs(nodes, windows, threshold)


def evaluate(
    base: str,
    boundary: float,
    timing: CycleTiming,
    params: WindowParams,
    match: str = "",
    pool: Executor | None = None,
    batch_instances: int = DEFAULT_BATCH_INSTANCES,
) -> CycleResult:
    """The cycle at `boundary`, in batches of whole jobs (the streamed analysis's plan:
    every node of a job in one batch, where the job-level join sees them all), so memory
    is bounded by a batch whatever the fleet; batches run in `pool` when given."""
    start, end = timing.query_range(boundary)
    cfg = StreamConfig(
        base,
        start,
        end,
        timing.step_seconds,
        match,
        params,
        QUERY_RETRY,
        batch_instances,
    )
    batches = plan(cfg)
    work = [(cfg, b.instances, boundary, timing) for b in batches]
    parts = list(
        pool.map(_evaluate_batch, work) if pool is not None else map(_evaluate_batch, work)
    )
    return merge_results(boundary, parts, discovery_queries=2)


def _evaluate_batch(
    task: tuple[StreamConfig, tuple[str, ...], float, CycleTiming],
) -> CycleResult:
    cfg, instances, boundary, timing = task
    nodes: dict[str, NodeSeries] = {}
    queries = 0
    with ThreadPoolExecutor(max_workers=promql.THREADS) as threads:
        for span in promql.chunks(cfg.start_seconds, cfg.end_seconds, cfg.step_seconds):
            q, _ = promql.fetch_chunk(
                threads, cfg.url, instances, span, cfg.step_seconds, cfg.match, nodes, cfg.retry
            )
            queries += q
    result = evaluate_nodes(list(nodes.values()), boundary, timing, cfg.params)
    return replace(result, queries=queries)


def merge_results(
    boundary: float, parts: Sequence[CycleResult], discovery_queries: int = 0
) -> CycleResult:
    """One cycle's result from its batches' (a job is in one batch: nothing overlaps)."""
    gpu_seconds: dict[LedgerKey, float] = {}
    allocated: dict[str, float] = {}
    for p in parts:
        gpu_seconds.update(p.ledger.gpu_seconds)
        allocated.update(p.ledger.allocated_gpu_seconds)
    return CycleResult(
        boundary_seconds=boundary,
        closed=tuple(sorted((w for p in parts for w in p.closed), key=_report_order)),
        range_closed=tuple(sorted((w for p in parts for w in p.range_closed), key=_node_order)),
        open=tuple(sorted((w for p in parts for w in p.open), key=_node_order)),
        ledger=LedgerSlice(gpu_seconds, allocated),
        held_back=tuple(sorted(h for p in parts for h in p.held_back)),
        underutilized_gpus=tuple(sorted(u for p in parts for u in p.underutilized_gpus)),
        jobs=tuple(sorted({j for p in parts for j in p.jobs})),
        queries=discovery_queries + sum(p.queries for p in parts),
        points=sum(p.points for p in parts),
    )


def _report_order(w: Window) -> tuple[float, str, str, str, float]:
    return (w.end_seconds, w.instance, w.gpu, w.job_id, w.start_seconds)


def _node_order(w: Window) -> tuple[str, str, str, float]:
    return (w.instance, w.gpu, w.job_id, w.start_seconds)


def evaluate_nodes(
    nodes: Sequence[NodeSeries], boundary: float, timing: CycleTiming, params: WindowParams
) -> CycleResult:
    closed: list[Window] = []
    open_: list[Window] = []
    for node in sorted(nodes, key=lambda n: n.instance):
        c, o = node_windows(node, params)
        closed.extend(c)
        open_.extend(o)
    joined = job_level(nodes, closed + open_, params.threshold_ratio)
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
        points=sum(len(s) for n in nodes for s in n.all_series()),
    )


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


def _underutilized(at_end: Iterable[Window]) -> tuple[tuple[str, str, int], ...]:
    count: dict[tuple[str, str], int] = {}
    for w in at_end:
        if w.job_id:
            key = (w.job_id, w.cause.value)
            count[key] = count.get(key, 0) + 1
    return tuple((j, c, n) for (j, c), n in sorted(count.items()))
