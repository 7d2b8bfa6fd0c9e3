"""Offline analysis: run the window engine over whole nodes of recorded data."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.process import BaseProcess
from multiprocessing.queues import SimpleQueue
from statistics import median
from typing import Any

from gpufeed.correlator.engine.engine import NodeCorrelator, WindowParams
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.peers import JobPeers
from gpufeed.correlator.engine.view import Timing
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.outputs.merge import window_key


def estimate_interval(node: NodeSeries) -> float:
    """The node's sampling interval: the median spacing of its utilization samples."""
    best = None
    for g in node.gpus.values():
        for name in ("util", "up"):
            s = g.fields.get(name)
            if s is not None and len(s) > 2 and (best is None or len(s) > len(best)):
                best = s
    if best is None:
        for j in node.jobs.values():
            for s in j.phases.values():
                if len(s) > 2 and (best is None or len(s) > len(best)):
                    best = s
    if best is None:
        return 15.0
    ts = best.ts
    step = max(1, len(ts) // 2000)  # a sample of the spacings is enough
    diffs = [ts[i + 1] - ts[i] for i in range(0, len(ts) - 1, step)]
    return max(median(diffs), 0.05)


def analyze_node(
    node: NodeSeries, params: WindowParams, peers: JobPeers | None = None
) -> list[Window]:
    """One node's windows; `peers`, the nodes its jobs' GPUs may be compared with at the
    same instant (engine/peers.py: every node given, in `analyze_nodes`), else its own."""
    corr = NodeCorrelator(node, Timing(estimate_interval(node)), params, peers=peers)
    corr.refresh_units()
    step = corr.step
    for t in corr.timeline():
        step(t)
    corr.finish()
    return corr.windows


def _analyze_packed(args: tuple[NodeSeries, WindowParams, JobPeers]) -> list[Window]:
    return analyze_node(*args)


def _analyze_forked(
    todo: list[NodeSeries], params: WindowParams, jobs: int, peers: JobPeers
) -> list[Window]:
    """Nodes analysed in forked workers that inherit `todo` through their closure rather
    than have every node pickled to them; each worker takes node indices from a queue
    (uneven nodes balance out) and sends back each node's windows or its exception."""
    ctx = multiprocessing.get_context("fork")
    tasks: SimpleQueue[int | None] = ctx.SimpleQueue()
    results: SimpleQueue[tuple[int, list[Window] | BaseException]] = ctx.SimpleQueue()

    def work() -> None:
        while (i := tasks.get()) is not None:
            try:
                results.put((i, analyze_node(todo[i], params, peers)))
            except Exception as exc:
                results.put((i, exc))

    workers = [ctx.Process(target=work, daemon=True) for _ in range(min(jobs, len(todo)))]
    for w in workers:
        w.start()
    try:
        for i in range(len(todo)):
            tasks.put(i)
        for _ in workers:
            tasks.put(None)
        by_node: dict[int, list[Window]] = {}
        while len(by_node) < len(todo):
            _wait_for_result(results, workers)
            i, got = results.get()
            if isinstance(got, BaseException):
                raise got
            by_node[i] = got
    finally:
        for w in workers:
            w.kill()
            w.join()
    return [w for i in range(len(todo)) for w in by_node[i]]


def _wait_for_result(results: SimpleQueue[Any], workers: Sequence[BaseProcess]) -> None:
    """Blocks until a result is ready; a worker that died without sending one (killed,
    out of memory) is an error rather than a wait forever."""
    while results.empty():
        dead = [w for w in workers if w.exitcode not in (None, 0)]
        if dead and results.empty():
            raise RuntimeError(f"an analysis worker died (exit status {dead[0].exitcode})")
        time.sleep(0.01)


def analyze_nodes(nodes: Iterable[NodeSeries], params: WindowParams, jobs: int = 1) -> list[Window]:
    """Windows of every node, sorted by instance, GPU and start; nodes in parallel."""
    todo = list(nodes)
    # a job's GPUs on every node at the same instant: the reference without a healthy past
    peers = JobPeers({n.instance: n for n in todo})
    out: list[Window] = []
    if jobs > 1 and len(todo) > 1:
        if "fork" in multiprocessing.get_all_start_methods():
            out = _analyze_forked(todo, params, jobs, peers)  # the workers inherit them
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                args = [(n, params, peers) for n in todo]
                for ws in pool.map(_analyze_packed, args):
                    out.extend(ws)
    else:
        for n in todo:
            out.extend(analyze_node(n, params, peers))
    out.sort(key=window_key)
    return out
