"""The agent's own instants on a TSDB's query grid (issue 23).

A range query answers at the instants of its grid (start + k * step), each holding the
last scrape in the step before it, and a scrape holds the agent's last snapshot. An agent
sampling every ~1 s with jitter, scraped and queried every 1 s, puts two grid points on one
snapshot or none on another, and every rate between grid points divides the counters'
growth over the snapshots' true spacing by the grid's: a CPU-only job's share moved by up
to 0.1, enough to flip a share at the threshold that the agent and its trace did not flip.

Every page the agent serves says when its snapshot was taken
(`gpufeed_snapshot_timestamp_seconds`). Asked over the same grid, that series says which
snapshot each grid point holds: each point is re-stamped at that snapshot's instant (in
milliseconds, as the agent and its trace read it: feeds/live.py), and a grid point that
holds the snapshot the one before it held is dropped. The engine then reads the agent's own
samples at their own instants, as the live agent and its trace do; what a TSDB still
cannot give is a snapshot no scrape (or no grid point) saw. An instance without the series
(an agent older than it, or another exporter) keeps the grid's instants.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping

from gpufeed.trace.format import om_timestamp

SNAPSHOT_METRIC = "gpufeed_snapshot_timestamp_seconds"

Clock = dict[float, float]  # grid instant -> the instant of the snapshot it holds
Clocks = Mapping[str, Clock]  # per instance


def clock_of(ts: Iterable[float], vs: Iterable[float]) -> Clock:
    """One instance's snapshot-timestamp series on the grid, as a clock."""
    return {t: float(om_timestamp(v)) for t, v in zip(ts, vs, strict=True) if v == v}


def restamped_instants(ts: array[float], clock: Clock) -> tuple[array[float], list[int]]:
    """The instants of the snapshots the grid points `ts` hold, and which points they are:
    a point that repeats the snapshot before it, or that no snapshot instant is known for,
    is left out."""
    out, keep = array("d"), []
    last = -float("inf")
    get = clock.get
    for k, t in enumerate(ts):
        s = get(t)
        if s is None or s <= last:
            continue
        out.append(s)
        keep.append(k)
        last = s
    return out, keep


def restamp(
    ts: array[float], vs: array[float], clock: Clock | None
) -> tuple[array[float], array[float]]:
    """A series' grid points at the instants of the snapshots they hold
    (`restamped_instants`). Without a clock (the instance serves no snapshot timestamp)
    the grid is kept."""
    if not clock:
        return ts, vs
    out, keep = restamped_instants(ts, clock)
    return out, array("d", (vs[k] for k in keep))
