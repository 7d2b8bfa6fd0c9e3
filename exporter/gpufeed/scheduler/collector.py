"""A scheduler reading as the contract families (catalogue group "scheduler").

What failed to read is left out, never shown as zero: on a failed read only
`gpufeed_scheduler_up 0` is published, so a dashboard shows a gap rather than an empty queue.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from gpufeed.catalogue import MetricSpec, spec
from gpufeed.model import Families, Family
from gpufeed.scheduler.backlog import SchedulerReading, backlog_reason

UP = spec("gpufeed_scheduler_up")
PENDING_JOBS = spec("gpufeed_scheduler_pending_jobs")
PENDING_GPUS = spec("gpufeed_scheduler_pending_gpus")
OLDEST = spec("gpufeed_scheduler_pending_oldest_wait_seconds")
WAIT = spec("gpufeed_scheduler_pending_wait_seconds")
GPUS = spec("gpufeed_scheduler_gpus")
NODE_FREE_MAX = spec("gpufeed_scheduler_node_free_gpus_max")
BACKLOG_IDLE = spec("gpufeed_scheduler_backlog_idle_gpus")
CYCLE = spec("gpufeed_scheduler_cycle_seconds")
CYCLE_MEAN = spec("gpufeed_scheduler_cycle_mean_seconds")
SPECS: tuple[MetricSpec, ...] = (
    *(UP, PENDING_JOBS, PENDING_GPUS, OLDEST, WAIT),
    *(GPUS, NODE_FREE_MAX, BACKLOG_IDLE, CYCLE, CYCLE_MEAN),
)
# Queue waits from a minute to a day, the range a GPU queue's service level is argued in.
WAIT_BUCKETS_SECONDS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)


def scheduler_families(reading: SchedulerReading | None, scheduler: str) -> list[Family]:
    f = Families()
    for m in SPECS:
        f.declare_spec(m)
    f.put(UP, {"scheduler": scheduler}, 0.0 if reading is None else 1.0)
    if reading is None:
        return f.build()
    by_reason: Counter[tuple[str, str]] = Counter()
    gpus: Counter[str] = Counter()
    waits: dict[str, list[float]] = defaultdict(list)
    for j in reading.pending:
        by_reason[(j.queue, j.reason)] += 1
        gpus[j.queue] += j.gpus_total
        waits[j.queue].append(j.wait_seconds)
    for (queue, reason), n in sorted(by_reason.items()):
        f.put(PENDING_JOBS, {"queue": queue, "reason": reason}, n)
    for queue in sorted(waits):
        f.put(PENDING_GPUS, {"queue": queue}, gpus[queue])
        f.put(OLDEST, {"queue": queue}, max(waits[queue]))
        w = waits[queue]
        buckets = [(le, sum(1 for x in w if x <= le)) for le in WAIT_BUCKETS_SECONDS]
        f.put_histogram(WAIT, {"queue": queue}, buckets, sum(w), len(w))
    free = sum(n.free for n in reading.nodes)
    allocated = sum(min(n.allocated, n.total) for n in reading.nodes)
    unavailable = sum(max(n.total - n.allocated, 0) for n in reading.nodes if not n.schedulable)
    for state, v in (("free", free), ("allocated", allocated), ("unavailable", unavailable)):
        f.put(GPUS, {"state": state}, v)
    if reading.nodes:
        f.put(NODE_FREE_MAX, {}, max(n.free for n in reading.nodes))
    backlog = backlog_reason(reading)
    if backlog is not None:
        f.put(BACKLOG_IDLE, {"reason": backlog}, free)
    for c in reading.cycles:
        f.put(CYCLE, {"cycle": c.cycle}, c.last_seconds)
        f.put(CYCLE_MEAN, {"cycle": c.cycle}, c.mean_seconds)
    return f.build()
