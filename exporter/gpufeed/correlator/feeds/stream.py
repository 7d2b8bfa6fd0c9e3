"""Streamed `gpufeed analyze --prometheus`: bounded memory whatever the range or the fleet.

1. **Discover** the instances (`/api/v1/label/instance/values`) and which jobs span which
   instances (`/api/v1/series` of `gpufeed_job_info`); group the instances by job, keep
   this shard's groups, pack them into batches (`feeds/batches.py`).
2. Per **batch**, fetch the range in **time chunks** (all used metrics of the batch's
   instances over one chunk), append each chunk to the nodes' columns, step every node's
   engine over the chunk's instants, then trim the columns to the history the engine can
   still look back at (`KEEP_SECONDS`). The engine's state (open runs, windows, baselines)
   is carried from chunk to chunk, exactly as the live processor carries it from sample to
   sample; the chunks are on one grid (`promql.chunks`), so every chunking of a range sees
   the same values at the same instants.
3. Each finished batch's windows go to a spool file (sorted); batches run in `jobs`
   forked workers. When every batch is done the spool files are merged in order
   (`outputs/merge.py`) into the output: the result is byte for byte that of the unsplit,
   unstreamed analysis, and nothing is written when any batch failed.

Memory per worker: the batch's instances x (chunk + `KEEP_SECONDS`) of their series, and
the answers of the queries in flight; nothing grows with the range.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from bisect import bisect_right
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from gpufeed.correlator.engine.classify import STARTUP_MAX_SECONDS
from gpufeed.correlator.engine.engine import NodeCorrelator, WindowParams
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.peers import JobPeers
from gpufeed.correlator.engine.view import COLLECTIVE_WAIT, Timing
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds import promql
from gpufeed.correlator.feeds.analyze import estimate_interval
from gpufeed.correlator.feeds.batches import Batch, job_groups, pack_batches, shard_groups
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.correlator.outputs.merge import window_key
from gpufeed.correlator.outputs.output import render

# The longest look back the engine takes through the columns is the start-up check (a job's
# step counter since it appeared, up to STARTUP_MAX_SECONDS); twice that leaves room for
# rate windows and holes. Longer-lived facts (baselines, open runs) are engine state.
KEEP_SECONDS = 2.0 * STARTUP_MAX_SECONDS
DEFAULT_CHUNK_SECONDS = 4 * 3600.0
DEFAULT_BATCH_INSTANCES = 16
# A node's sampling interval is estimated from its first samples (the unstreamed analysis
# takes the median over all of them; on a query grid both are the step).
INTERVAL_SAMPLES = 64

Progress = Callable[[str], None]


class BatchError(RuntimeError):
    """A batch could not be fetched or analysed; the message names the batch."""


@dataclass(frozen=True, slots=True)
class StreamConfig:
    url: str
    start_seconds: float
    end_seconds: float
    step_seconds: float
    match: str = ""
    params: WindowParams = field(default_factory=WindowParams)
    retry: promql.Retry = promql.DEFAULT_RETRY
    batch_instances: int = DEFAULT_BATCH_INSTANCES
    chunk_seconds: float = DEFAULT_CHUNK_SECONDS
    shard: int = 1
    shards: int = 1

    @property
    def chunk_points(self) -> int:
        return max(2, min(promql.MAX_POINTS, int(self.chunk_seconds // self.step_seconds) + 1))


def plan(cfg: StreamConfig) -> list[Batch]:
    """This shard's batches (the discovery calls: `promql.instances` and
    `promql.instance_jobs`; no data is fetched)."""
    if cfg.end_seconds <= cfg.start_seconds:
        raise ValueError("--end must be after --start")
    span = (cfg.url, cfg.start_seconds, cfg.end_seconds, cfg.match)
    insts = promql.instances(*span, cfg.retry)
    groups = job_groups(insts, promql.instance_jobs(*span, insts, cfg.retry))
    return pack_batches(shard_groups(groups, cfg.shard, cfg.shards), cfg.batch_instances)


class NodeRun:
    """One node's engine, carried across chunks (and, in `gpufeed fleet`, across cycles)."""

    __slots__ = ("corr", "done_until", "node", "oldest", "peers")

    def __init__(self, node: NodeSeries, peers: JobPeers | None = None) -> None:
        self.node = node
        # the nodes whose GPUs of the same job this one is compared with (engine/peers.py):
        # the batch's (whole jobs), else its own
        self.peers = peers
        self.corr: NodeCorrelator | None = None
        self.done_until = -float("inf")
        # no column holds a point older than this (chunks arrive in time order): until the
        # trim bound passes it there is nothing to trim (a fleet epoch, shorter than
        # KEEP_SECONDS, never trims; walking every series each cycle was 5% of its CPU)
        self.oldest: float | None = None

    def advance(
        self, params: WindowParams, last_chunk: bool, wait_samples: int = INTERVAL_SAMPLES
    ) -> None:
        node = self.node
        if self.corr is None:
            if not last_chunk and _interval_samples(node) < wait_samples:
                return  # too few samples yet to know the interval: wait for the next chunk
            timing = Timing(estimate_interval(node))
            self.corr = NodeCorrelator(node, timing, params, peers=self.peers)
        corr = self.corr
        corr.refresh_units()
        timeline = corr.timeline()
        step = corr.step
        for t in timeline[bisect_right(timeline, self.done_until) :]:
            step(t)
        if timeline:
            self.done_until = max(self.done_until, timeline[-1])
            before = self.done_until - KEEP_SECONDS
            if self.oldest is None:
                self.oldest = min((s.ts[0] for s in node.all_series() if s.ts), default=None)
            if self.oldest is not None and before >= self.oldest:
                _trim(node, before)
        if last_chunk:
            corr.finish()


def _interval_samples(node: NodeSeries) -> int:
    n = [len(s) for g in node.gpus.values() for k, s in g.fields.items() if k in ("util", "up")]
    n += [len(s) for j in node.jobs.values() for s in j.phases.values()]
    return max(n, default=0)


def _trim(node: NodeSeries, before: float) -> None:
    """Drops column history the engine can no longer look back at. Job presence and phase
    series keep their first point too: the engine reads when a job began from it."""
    first = {id(s) for s in node.job_info.values()}
    first.update(id(s) for j in node.jobs.values() for s in j.phases.values())
    # the job-level join reads each rank's collective wait at the start and end of every
    # stall of the batch: those few series stay whole
    whole = {
        id(s) for j in node.jobs.values() for (_r, p), s in j.rank_phases.items()
        if p == COLLECTIVE_WAIT
    }  # fmt: skip
    whole.update(id(s) for j in node.jobs.values() for s in j.rank_info.values())
    # and when each rank was lost (and how): trimmed, a rank lost early in the range would
    # explain none of the stalls that followed, and one lost since would seem lost anew
    # where the trim cut its series
    whole.update(
        id(s) for j in node.jobs.values()
        for s in (*j.rank_lost.values(), *j.rank_exit_status.values())
    )  # fmt: skip
    for s in node.all_series():
        if id(s) in whole:
            continue
        if id(s) not in first:
            s.trim_before(before)
            continue
        i = bisect_right(s.ts, before) - 1  # as trim_before, but after the first point
        if i > 1:  # new arrays, not `del` in place: see Series.trim_before
            s.ts = s.ts[:1] + s.ts[i:]
            s.vs = s.vs[:1] + s.vs[i:]


@dataclass(frozen=True, slots=True)
class BatchResult:
    windows: int
    seconds: float
    queries: int  # range queries asked
    points: int  # points the answers held


def analyze_batch(cfg: StreamConfig, batch: Batch, cost: list[int] | None = None) -> list[Window]:
    """The windows of one batch, sorted; raises promql.PromError when the server fails.
    `cost`, when given, receives [queries, points] of the fetches."""
    queries = points = 0
    nodes: dict[str, NodeSeries] = {}
    runs: dict[str, NodeRun] = {}
    peers = JobPeers(nodes)  # the batch's nodes as they fill: whole jobs
    spans = list(
        promql.chunks(cfg.start_seconds, cfg.end_seconds, cfg.step_seconds, cfg.chunk_points)
    )
    with ThreadPoolExecutor(max_workers=promql.THREADS) as pool:
        for k, span in enumerate(spans):
            q, p = promql.fetch_chunk(
                pool, cfg.url, batch.instances, span, cfg.step_seconds, cfg.match, nodes, cfg.retry
            )
            queries, points = queries + q, points + p
            last = k == len(spans) - 1
            for inst in sorted(nodes):
                run = runs.get(inst)
                if run is None:
                    run = runs[inst] = NodeRun(nodes[inst], peers)
                run.advance(cfg.params, last)
    out = [w for r in runs.values() if r.corr is not None for w in r.corr.windows]
    # the job level: a batch holds the instances of whole jobs (see correlator/job/)
    out = correlate_jobs(nodes.values(), out, cfg.params.threshold_ratio)
    out.sort(key=window_key)
    if cost is not None:
        cost[:] = [queries, points]
    return out


def _batch_to_file(cfg: StreamConfig, batch: Batch, of: int, path: str) -> BatchResult:
    """Runs in a worker: analyses a batch and writes its windows (jsonl, sorted) to `path`."""
    began = time.monotonic()
    cost = [0, 0]
    try:
        windows = analyze_batch(cfg, batch, cost)
    except promql.PromError as e:
        raise BatchError(f"{batch.describe(of)}: {e}") from None
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(windows, "jsonl"))
    return BatchResult(len(windows), time.monotonic() - began, cost[0], cost[1])


def run_batches(
    cfg: StreamConfig,
    batches: list[Batch],
    spool_dir: str,
    jobs: int,
    progress: Progress | None = None,
) -> list[str]:
    """Analyses `batches` (in `jobs` forked workers when more than one), each into its
    own spool file in `spool_dir`; returns the files. Raises BatchError naming the first
    batch that failed; the other workers are stopped."""
    paths = [os.path.join(spool_dir, f"batch-{b.index:05d}.jsonl") for b in batches]
    n = len(batches)

    def done(b: Batch, got: BatchResult) -> None:
        if progress is not None:
            progress(
                f"{b.describe(n)}: {got.windows} windows in {got.seconds:.1f} s "
                f"({got.queries} queries, {got.points} points)"
            )

    if jobs <= 1 or n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for b, p in zip(batches, paths, strict=True):
            done(b, _batch_to_file(cfg, b, n, p))
        return paths
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, n), mp_context=multiprocessing.get_context("fork")
    )
    try:
        futures: dict[Future[BatchResult], Batch] = {
            pool.submit(_batch_to_file, cfg, b, n, p): b
            for b, p in zip(batches, paths, strict=True)
        }
        for fut in as_completed(futures):
            done(futures[fut], fut.result())
    except BaseException:
        # a worker may be waiting out a TSDB outage: stop it rather than wait for it
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        raise
    pool.shutdown(wait=True)
    return paths
