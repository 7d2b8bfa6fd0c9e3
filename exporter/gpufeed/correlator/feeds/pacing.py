"""The live correlator of a paced simulated node runs on the scenario's clock.

At `--simulate.pace P` the simulated node plays P scenario seconds per wall second, while
its counters stay physical (bytes and CPU seconds per wall second: what Prometheus must
see). The correlator's time constants are scenario durations: a 60 s minimum window, a
10 s rate window, a 30 s merge gap, 5 minutes of XID lookback, baselines over minutes. On
the wall clock a 100 s stall at pace 10 lasts 10 s, shorter than the rate window, and the
causes came out wrong (0.1.0: data loading as preprocessing, network as unknown).

So the processor hands its correlator each snapshot as the scenario lived it: the
timestamp on the scenario clock (origin + (t - origin) x P), and every counter that counts
per wall second multiplied by P, so that its rate per scenario second is the physical
rate; counts of events (XIDs, and steps, which the simulated node already advances with
the scenario) are left alone. Samples then lie P x interval apart on the scenario clock:
the correlator treats them as a trace scraped that often, as it treats any other. What
comes out (window start and end, seconds underutilized) is mapped back to the wall clock,
so the API, the windows log and /metrics agree with Prometheus' clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpufeed.correlator.engine.node import USED_METRIC_SET
from gpufeed.correlator.engine.window import Window
from gpufeed.model import Family, Sample
from gpufeed.snapshot import Snapshot

# Counters that count events, not amounts per second: the same at any pace.
EVENT_COUNTERS = frozenset({"gpufeed_gpu_xid_errors_total", "gpufeed_job_steps_total"})


@dataclass(frozen=True, slots=True)
class ScenarioClock:
    """Wall and scenario time agree at `origin_seconds`; the scenario runs `pace` x faster."""

    origin_seconds: float
    pace: float

    def to_scenario(self, wall_seconds: float) -> float:
        return self.origin_seconds + (wall_seconds - self.origin_seconds) * self.pace

    def to_wall(self, scenario_seconds: float) -> float:
        return self.origin_seconds + (scenario_seconds - self.origin_seconds) / self.pace

    def snapshot(self, snap: Snapshot) -> Snapshot:
        """The snapshot on the scenario clock, with the families the correlator reads."""
        families = tuple(
            self._family(f) for f in snap.families if f.name in USED_METRIC_SET and f.samples
        )
        return Snapshot(self.to_scenario(snap.timestamp_seconds), families)

    def _family(self, f: Family) -> Family:
        if f.type != "counter" or f.name in EVENT_COUNTERS:
            return f
        pace = self.pace
        samples = tuple(Sample(s.name, s.labels, s.value * pace) for s in f.samples)
        return replace(f, samples=samples)

    def window(self, w: Window) -> Window:
        """A window found on the scenario clock, on the wall clock."""
        return replace(
            w, start_seconds=self.to_wall(w.start_seconds), end_seconds=self.to_wall(w.end_seconds)
        )
