"""Rolling baselines: what is normal for this node while its jobs run well.

The engine feeds one value per signal per bucket (30 s) of healthy time; the baseline is
the median of the last hour of those (120 buckets), which one bad stretch cannot move.
Peaks (for "throughput at its ceiling") are tracked over all time, healthy or not.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from statistics import median
from typing import Final

BUCKET_SECONDS = 30.0
HOUR_BUCKETS = 120
MIN_POINTS = 4  # fewer healthy buckets than this: no baseline yet (two minutes)


class Kind:
    """What a baseline is of: the first element of its key, e.g. (Kind.READ_LATENCY, tier).
    The correlator learns them (features.observe_healthy, the engine's per-GPU ones) and
    reads them (features.py, classify.py) by these names only."""

    READ_LATENCY: Final = "lat"  # (kind, tier)
    BUSY: Final = "busy"  # (kind, tier)
    QUEUE_DEPTH: Final = "qd"  # (kind, tier)
    READ_BYTES: Final = "rd"  # (kind, tier); its peak too
    WRITE_BYTES: Final = "wr"  # (kind, tier)
    TRANSMIT_WAIT: Final = "txw"  # (kind, network device)
    NETWORK_BYTES: Final = "nbps"  # (kind, network device)
    NETWORK_UTILIZATION: Final = "nutil"  # (kind, network device)
    LINK_UP: Final = "lup"  # (kind, network device)
    LINK_ERRORS: Final = "lerr"  # (kind, network device)
    CONGESTION_PACKETS: Final = "cong"  # (kind, network device)
    CPU_BUSY: Final = "cpu"  # (kind,)
    IOWAIT: Final = "iowait"  # (kind,)
    PRESSURE: Final = "psi"  # (kind, resource)
    SM_CLOCK: Final = "clock"  # (kind, gpu)
    NVLINK: Final = "nvl"  # (kind, gpu); its peak too
    # A job's read rate per tier: (kind, job_id, tier). An ended job's are forgotten by
    # the prefix (kind, job_id).
    JOB_READ: Final = "jrd"
    # A job's collective wait per rank here: (kind, job_id); forgotten like JOB_READ.
    COLLECTIVE_WAIT: Final = "cwait"
    # A CPU-only job's collective-wait share of its phase time: (kind, job_id). Fed every
    # healthy sample (not per bucket; see Engine._cpu_share); forgotten like JOB_READ.
    CPU_JOB_WAIT: Final = "cjwait"
    SM_ACTIVE: Final = "smact"  # (kind, gpu): SM activity of a busy GPU (GPM)
    # A job's page-cache hit ratio: (kind, job_id); forgotten like JOB_READ.
    JOB_CACHE_HIT: Final = "jcache"
    # The share of a tier's reads that are not a job's: (kind, job_id, tier); forgotten
    # like JOB_READ.
    FOREIGN_READ: Final = "jfrd"
    # The share of the time a job's threads waited for a CPU: (kind, job_id); forgotten
    # like JOB_READ.
    JOB_CPU_WAIT: Final = "jcpuw"
    # How much CPU a job's threads want (run + run-queue wait, s/s): (kind, job_id).
    JOB_CPU_RUNNABLE: Final = "jcpur"
    # A job's seconds per step while healthy: (kind, job_id); how long it may stand still
    # before it counts as stopped (engine/progress.py); forgotten like JOB_READ.
    STEP_SECONDS: Final = "stepsec"


class Baselines:
    __slots__ = ("_cache", "_hist", "_peak")

    def __init__(self) -> None:
        # the buckets as doubles, not a deque of float objects: a fleet replica holds one
        # per signal of every node it watches, and boxed floats were 4x the memory
        self._hist: dict[Hashable, array[float]] = {}
        self._cache: dict[Hashable, float] = {}
        self._peak: dict[Hashable, float] = {}

    def observe(self, key: Hashable, value: float | None) -> None:
        if value is None:
            return
        h = self._hist.get(key)
        if h is None:
            h = self._hist[key] = array("d")
        h.append(value)
        if len(h) > HOUR_BUCKETS:  # the oldest bucket leaves (120 doubles move: cheap)
            del h[0]
        self._cache.pop(key, None)

    def median(self, key: Hashable) -> float | None:
        m = self._cache.get(key)
        if m is not None:
            return m
        h = self._hist.get(key)
        if h is None or len(h) < MIN_POINTS:
            return None
        m = self._cache[key] = median(h)
        return m

    def early(self, key: Hashable) -> float | None:
        """The median of what healthy time has shown so far, before `median` would answer
        (None while no bucket was seen): enough to say whether a signal was there at all."""
        h = self._hist.get(key)
        return median(h) if h else None

    def peak(self, key: Hashable, value: float | None) -> float | None:
        """Updates and returns the all-time peak of `key` (None while nothing was seen)."""
        p = self._peak.get(key)
        if value is not None and (p is None or value > p):
            p = self._peak[key] = value
        return p

    def forget_prefix(self, prefix: tuple[str, ...]) -> None:
        """Drops every baseline whose key starts with `prefix` (an ended job's, say)."""
        n = len(prefix)
        for d in (self._hist, self._cache, self._peak):
            for key in [k for k in d if isinstance(k, tuple) and k[:n] == prefix]:
                del d[key]
