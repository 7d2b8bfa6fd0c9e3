"""The live correlator over hours of agent time: its memory stays flat.

A GPU whose dips are shorter than the minimum window and whose recoveries are shorter
than the merge gap never opens a window and never closes its run; before 0.2.0 the run
kept every sample it had seen (about 1.5 MB/h for one GPU at 1 Hz). Driven by a fake
clock (the snapshots' timestamps) under tracemalloc, so two hours take seconds.
"""

from __future__ import annotations

import gc
import tracemalloc

from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine.engine import RUN_HISTORY_SECONDS
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.model import Family, Sample, label_pairs
from gpufeed.snapshot import Snapshot

T0 = 1_700_000_000.0
GPU = label_pairs({"gpu": "0", "uuid": "GPU-flap"})


def _snapshot(t: float, util: float) -> Snapshot:
    return Snapshot(
        t,
        (
            Family("gpufeed_gpu_up", "gauge", "", (Sample("gpufeed_gpu_up", GPU, 1.0),)),
            Family(
                "gpufeed_gpu_utilization_ratio",
                "gauge",
                "",
                (Sample("gpufeed_gpu_utilization_ratio", GPU, util),),
            ),
        ),
    )


def _flapping(proc: CorrelatorProcessor, start: float, seconds: int) -> float:
    """One GPU stalling 20 s of every 40 s, sampled at 1 Hz; returns the next instant."""
    t = start
    for i in range(seconds):
        proc.process(_snapshot(t, 0.1 if i % 40 < 20 else 0.95))
        t += 1.0
    return t


def _traced_bytes() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_flapping_gpu_memory_is_flat_over_two_hours() -> None:
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), interval_seconds=1.0)
    tracemalloc.start()
    try:
        t = _flapping(proc, T0, 1800)  # warm-up: the 900 s column history fills
        warm = _traced_bytes()
        t = _flapping(proc, t, 5400)
        grown = _traced_bytes() - warm
    finally:
        tracemalloc.stop()
    # 1.5 h more of the same must not cost memory (the leak was ~2 MB here); the margin
    # covers allocator noise, not a per-sample record
    assert grown < 64 * 1024, f"grew {grown} bytes over 1.5 h of agent time"
    # the flapping never reached the 3/4-low needed to open a window, and still does not
    assert proc.windows(10) == ([], [])
    u = proc._corr.units["0"]
    assert u.run_start is not None and t - u.run_start <= 2 * RUN_HISTORY_SECONDS


def _churning(proc: CorrelatorProcessor, start: float, seconds: int, first_job: int) -> float:
    """Each 1 s snapshot brings 64 SDK jobs never seen before (a new job id per message)."""
    t = start
    for i in range(seconds):
        samples = []
        for k in range(64):
            job = label_pairs({"job_id": f"churn-{first_job + 64 * i + k}", "phase": "compute"})
            samples.append(Sample("gpufeed_job_phase_seconds_total", job, 0.1))
        phases = Family("gpufeed_job_phase_seconds_total", "counter", "", tuple(samples))
        snap = _snapshot(t, 0.95)
        proc.process(Snapshot(t, (*snap.families, phases)))
        t += 1.0
    return t


def test_job_churn_memory_is_flat() -> None:
    """Before 0.2.0 every job stayed for 15 minutes after its last sample: 57,600 jobs
    (about 200 MB) at this rate. Now at most MAX_JOBS are kept, whatever the churn."""
    from gpufeed.correlator.feeds.live import MAX_JOBS

    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), interval_seconds=1.0)
    tracemalloc.start()
    try:
        t = _churning(proc, T0, 300, 0)
        warm = _traced_bytes()
        _churning(proc, t, 600, 64 * 300)
        grown = _traced_bytes() - warm
    finally:
        tracemalloc.stop()
    assert len(proc.node.jobs) <= MAX_JOBS
    assert len(proc._routes) < 2 * MAX_JOBS
    assert grown < 256 * 1024, f"grew {grown} bytes over 10 min of churn"
