"""When each job last made progress, and whether it has stopped: what `idle` means for a
job that still holds its devices.

A job's progress is anything its own counters say it did: a step, phase time (a checkpoint,
an eval, a data wait that ended), bytes read or written on a tier, and a rank's wait in a
collective as it grows (`gpufeed run` and the SDK report a collective in flight each
second: a rank blocked on a peer that never arrives waits, it has not stopped). A job whose counters
have all stood still for much longer than it takes to make a step, while its processes are
alive, has stopped working: its loop ended and the process sleeps, or waits for something
that never comes. Judged only for a job that has stepped at least once (before that it is
starting up).

The engine updates the tracker once per instant, in time order, before it classifies
(cheap: one value per series per job); what it keeps per job is two numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufeed.correlator.engine.baseline import Baselines, Kind
from gpufeed.correlator.engine.node import JobColumns, NodeSeries
from gpufeed.correlator.engine.view import COLLECTIVE_WAIT

# A job quiet this long (or for this many of its usual steps, if longer) has stopped: long
# enough that a slow step, a pause of a loaded host or a short eval is not mistaken for it.
QUIET_MIN_SECONDS = 10.0
QUIET_STEPS = 3.0


@dataclass(slots=True)
class Progress:
    """Per job: the sum of its counters at the last instant, and when it last changed."""

    last: dict[str, tuple[float, float]] = field(default_factory=dict)

    def update(self, node: NodeSeries, t: float, stale_seconds: float) -> None:
        for job_id, j in node.jobs.items():
            if j.steps is None:
                continue  # no SDK series: its progress is not known
            total = _counters_sum(j, t, stale_seconds)
            prev = self.last.get(job_id)
            if prev is None or total != prev[0]:
                self.last[job_id] = (total, t)

    def forget(self, job_id: str) -> None:
        self.last.pop(job_id, None)

    def quiet_seconds(self, job_id: str, t: float) -> float | None:
        """Seconds since the job's counters last moved; None where that is not known."""
        prev = self.last.get(job_id)
        return None if prev is None else max(0.0, t - prev[1])

    def stopped_for(
        self, node: NodeSeries, baselines: Baselines, job_id: str, t: float, stale_seconds: float
    ) -> float | None:
        """Seconds the job has stood still if it has stepped before and stands still longer
        than it may (QUIET_MIN_SECONDS, or QUIET_STEPS of its healthy step time), else 0.0;
        None when its progress is not known (no SDK series)."""
        j = node.jobs.get(job_id)
        quiet = self.quiet_seconds(job_id, t)
        if j is None or j.steps is None or quiet is None:
            return None
        steps = j.steps.value_at(t, stale_seconds)
        if not steps:
            return 0.0  # has not stepped yet: starting up, not stopped
        step_s = baselines.median((Kind.STEP_SECONDS, job_id))
        allowed = max(QUIET_MIN_SECONDS, QUIET_STEPS * step_s if step_s else 0.0)
        return quiet if quiet >= allowed else 0.0


def _counters_sum(j: JobColumns, t: float, stale_seconds: float) -> float:
    total = 0.0
    series = [j.steps, *j.phases.values(), *j.tier_read.values(), *j.tier_written.values()]
    series += [s for (_, phase), s in j.rank_phases.items() if phase == COLLECTIVE_WAIT]
    series += [*j.load_seconds.values(), *j.load_bytes.values()]
    for s in series:
        if s is not None:
            v = s.value_at(t, stale_seconds)
            if v is not None:
                total += v
    return total
