"""Offline analysis: run the window engine over whole nodes of recorded data."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from statistics import median

from gpufeed.correlator.engine import NodeCorrelator, WindowParams
from gpufeed.correlator.node import NodeSeries
from gpufeed.correlator.view import Timing
from gpufeed.correlator.window import Window


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


def analyze_node(node: NodeSeries, params: WindowParams) -> list[Window]:
    corr = NodeCorrelator(node, Timing(estimate_interval(node)), params)
    corr.refresh_units()
    step = corr.step
    for t in corr.timeline():
        step(t)
    corr.finish()
    return corr.windows


# The nodes being analysed, inherited by forked workers instead of pickled to them.
_SHARED: list[NodeSeries] = []


def _analyze_shared(args: tuple[int, WindowParams]) -> list[Window]:
    return analyze_node(_SHARED[args[0]], args[1])


def _analyze_packed(args: tuple[NodeSeries, WindowParams]) -> list[Window]:
    return analyze_node(*args)


def analyze_nodes(nodes: Iterable[NodeSeries], params: WindowParams, jobs: int = 1) -> list[Window]:
    """Windows of every node, sorted by instance, GPU and start; nodes in parallel."""
    todo = list(nodes)
    out: list[Window] = []
    if jobs > 1 and len(todo) > 1:
        if "fork" in multiprocessing.get_all_start_methods():
            _SHARED[:] = todo
            try:
                ctx = multiprocessing.get_context("fork")
                with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
                    for ws in pool.map(_analyze_shared, [(i, params) for i in range(len(todo))]):
                        out.extend(ws)
            finally:
                _SHARED.clear()
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for ws in pool.map(_analyze_packed, [(n, params) for n in todo]):
                    out.extend(ws)
    else:
        for n in todo:
            out.extend(analyze_node(n, params))
    out.sort(key=lambda w: (w.instance, _gpu_key(w.gpu), w.job_id, w.start_seconds))
    return out


def _gpu_key(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
