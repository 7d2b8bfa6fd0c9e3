"""The GPU-time ledger: each job's allocated GPU-seconds, split into productive time and
the time lost to each cause.

Counted on the query grid: every grid instant at which `gpufeed_job_info` says a job holds
a GPU is `step` seconds of that job's allocation, and belongs to exactly one state: the
cause of the window that covers the instant on that GPU, else `productive`. So the states
sum to the allocation by construction, whatever the windows look like. A `straggler`
instant also names the cause of the culprit it waits for (`culprit_cause`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.window import Window

PRODUCTIVE = "productive"
# (job_id, state, culprit_cause): culprit_cause is "" except for straggler time
LedgerKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class LedgerSlice:
    """What one cycle adds: GPU-seconds per (job, state, culprit cause), allocation per job."""

    gpu_seconds: Mapping[LedgerKey, float]
    allocated_gpu_seconds: Mapping[str, float]


def _culprit_cause(w: Window) -> str:
    # set by the job-level correlation (issue 13) on straggler windows
    return w.culprit.cause.value if w.culprit is not None else ""


def ledger_slice(
    nodes: Iterable[NodeSeries],
    windows: Iterable[Window],
    lo_seconds: float,
    hi_seconds: float,
    step_seconds: float,
) -> LedgerSlice:
    """The ledger of (lo, hi] from the nodes' job_info columns and the windows (closed and
    open) on their GPUs."""
    by_gpu: dict[tuple[str, str, str], list[Window]] = {}
    for w in windows:
        by_gpu.setdefault((w.instance, w.gpu, w.job_id), []).append(w)
    for ws in by_gpu.values():
        ws.sort(key=lambda w: w.start_seconds)
    gpu_seconds: dict[LedgerKey, float] = {}
    allocated: dict[str, float] = {}
    for node in nodes:
        for (job_id, gpu), series in node.job_info.items():
            if not job_id:
                continue
            ts = series.ts
            first = bisect.bisect_right(ts, lo_seconds)
            last = bisect.bisect_right(ts, hi_seconds)
            if first >= last:
                continue
            ws = by_gpu.get((node.instance, gpu, job_id), [])
            starts = [w.start_seconds for w in ws]
            for i in range(first, last):
                t = ts[i]
                key: LedgerKey = (job_id, PRODUCTIVE, "")
                # a GPU's windows do not overlap: the one that began last at or before t
                # covers t if t is before its end (an open window's end is its last low
                # sample, which it still covers)
                j = bisect.bisect_right(starts, t) - 1
                if j >= 0:
                    w = ws[j]
                    if t < w.end_seconds or (w.open and t <= w.end_seconds):
                        key = (job_id, w.cause.value, _culprit_cause(w))
                gpu_seconds[key] = gpu_seconds.get(key, 0.0) + step_seconds
                allocated[job_id] = allocated.get(job_id, 0.0) + step_seconds
    return LedgerSlice(gpu_seconds, allocated)
