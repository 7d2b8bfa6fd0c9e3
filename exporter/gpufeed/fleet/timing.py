"""When a cycle runs and what it covers: pure arithmetic, so that two replicas agree.

A cycle is named by its boundary `T`, a multiple of the interval in unix seconds (wall
clock, not the replica's start time). It runs once the TSDB has had `settle_seconds` to
ingest the scrapes up to `T`, analyses `[A, T]` where the anchor `A` is the newest multiple
of the lookback at or before `T - lookback` (so one to two lookbacks of data; every cycle
with the same anchor continues the same engines, see fleet/carry.py), and *reports* only the slice
`(T - interval - delay, T - delay]`: windows that closed in it and the ledger of its GPU
time. `delay` is how long the engine needs after a window's end to be sure it ended (the
merge gap of good samples, or a hole long enough to close it), so a window is final, and
reported exactly once, by the cycle whose slice holds its end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufeed import vocabulary


@dataclass(frozen=True, slots=True)
class CycleTiming:
    interval_seconds: float
    lookback_seconds: float
    step_seconds: float
    settle_seconds: float
    merge_gap_seconds: float
    min_window_seconds: float = vocabulary.DEFAULT_MIN_WINDOW_SECONDS

    @property
    def delay_seconds(self) -> float:
        # the engine never bridges a hole longer than max(4 x interval, 60 s), and a window
        # closes after merge_gap of good samples; two steps more for the grid's rounding
        hole = max(4 * self.step_seconds, 60.0)
        return max(self.merge_gap_seconds, hole) + 2 * self.step_seconds

    def problem(self) -> str:
        """What is wrong with the settings, in one line; "" when nothing is."""
        for name in ("interval_seconds", "lookback_seconds", "step_seconds"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                return f"--fleet.{name.split('_')[0]} must be a positive number of seconds"
        if not (math.isfinite(self.settle_seconds) and self.settle_seconds >= 0):
            return "--fleet.settle must be zero or a positive number of seconds"
        for name in ("interval_seconds", "lookback_seconds"):
            ratio = getattr(self, name) / self.step_seconds
            if abs(ratio - round(ratio)) > 1e-9:
                return f"--fleet.{name.split('_')[0]} must be a multiple of --fleet.step"
        # The cycle that reports a window (its end in the slice) analyses from an anchor
        # at least `lookback` before its boundary: the window's last lookback - interval
        # - delay seconds. Shorter than the minimum window, a stall that began before the
        # anchor has too little of itself there to open, and no cycle reports it at all
        # (issue 23: an 80 s stall, absent at a 90 s lookback); from this bound on it is
        # reported, from the anchor at worst (docs/correlator.md).
        need = self.delay_seconds + self.min_window_seconds
        if self.lookback_seconds < self.interval_seconds + need:
            return (
                f"--fleet.lookback must be at least the interval plus {need:g} s "
                "(the time a window needs to open and to be known closed)"
            )
        return ""

    def due(self, now_seconds: float) -> float:
        """The newest boundary whose cycle may run at `now_seconds`."""
        i = self.interval_seconds
        return math.floor((now_seconds - self.settle_seconds) / i) * i

    def first_after(self, t_seconds: float) -> float:
        """The first boundary whose slice begins at or after `t_seconds` (a backfill start)."""
        i = self.interval_seconds
        return math.ceil((t_seconds + self.delay_seconds + i) / i) * i

    def anchors(self, boundary: float) -> tuple[float, float]:
        """(A, A + lookback): the start of the range the cycle at `boundary` analyses, and
        the start of the next one, whose engines must already run (from their own start,
        at or before `boundary`) when the cycles move to it."""
        lb = self.lookback_seconds
        a = math.floor(boundary / lb) * lb - lb
        return a, a + lb

    def report_slice(self, boundary: float) -> tuple[float, float]:
        """(lo, hi]: what the cycle at `boundary` reports."""
        hi = boundary - self.delay_seconds
        return hi - self.interval_seconds, hi
