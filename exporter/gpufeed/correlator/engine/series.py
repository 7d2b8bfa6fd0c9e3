"""Columnar time series with as-of lookups and reset-safe rates.

The correlator reads every signal through `Series`: the offline parser fills the columns in
one go, the live processor appends a point per sample. Rates are computed here, from raw
counter values, so the same code serves a trace file, a Prometheus range query and a live
snapshot: counter resets (an agent restart) count as a restart from zero, as in PromQL's
`rate`, and a gap longer than `gap_seconds` is never bridged by a rate.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from itertools import islice
from operator import lt


class Series:
    """One series: increasing timestamps `ts` (unix seconds) and values `vs`."""

    __slots__ = ("ts", "vs")

    def __init__(self) -> None:
        self.ts: array[float] = array("d")
        self.vs: array[float] = array("d")

    def __len__(self) -> int:
        return len(self.ts)

    def append(self, t: float, v: float) -> None:
        ts = self.ts
        if ts and t <= ts[-1]:
            if t == ts[-1]:
                self.vs[-1] = v  # a duplicate timestamp: the later sample wins
            return  # out of order in a live feed: ignore rather than corrupt the columns
        ts.append(t)
        self.vs.append(v)

    def extend_sorted(self, ts: array[float], vs: array[float]) -> None:
        """Adds parsed columns; sorts and de-duplicates if they are not strictly increasing."""
        # the columns are strictly increasing already: only the new points and the one
        # before them need checking (a fleet cycle adds a few points to long columns)
        first = max(len(self.ts) - 1, 0)
        self.ts.extend(ts)
        self.vs.extend(vs)
        t = self.ts
        if not all(map(lt, islice(t, first, None), islice(t, first + 1, None))):
            merged = dict(zip(t, self.vs, strict=True))  # later duplicates win
            keys = sorted(merged)
            self.ts = array("d", keys)
            self.vs = array("d", (merged[k] for k in keys))

    def trim_before(self, t: float) -> None:
        """Drops points older than `t` (keeps one before it, for rates)."""
        i = bisect_right(self.ts, t) - 1
        if i > 0:
            # new arrays, not `del` in place: the fleet shares one timestamp column among
            # many series (fleet/carry.py), which a trim of one must not shorten
            self.ts = self.ts[i:]
            self.vs = self.vs[i:]

    def index_at(self, t: float) -> int:
        return bisect_right(self.ts, t) - 1

    def value_at(self, t: float, stale_seconds: float) -> float | None:
        i = bisect_right(self.ts, t) - 1
        if i < 0 or t - self.ts[i] > stale_seconds:
            return None
        return self.vs[i]

    def first_time(self) -> float | None:
        return self.ts[0] if self.ts else None

    def increase(self, t0: float, t1: float) -> float | None:
        """How much a counter grew from `t0` to `t1`: from the last point at or before `t0`
        (or the first after it) to the last at or before `t1`, resets counting from zero.
        None when fewer than two points lie in reach."""
        ts, vs = self.ts, self.vs
        i = bisect_right(ts, t1) - 1
        j = max(bisect_right(ts, t0) - 1, 0)
        if i <= j:
            return None
        inc = 0.0
        prev = vs[j]
        for n in range(j + 1, i + 1):
            v = vs[n]
            inc += v - prev if v >= prev else v
            prev = v
        return inc

    def rate_at(
        self, t: float, window_seconds: float, stale_seconds: float, gap_seconds: float
    ) -> float | None:
        """Per-second increase over about the last `window_seconds` before `t`.

        None when the series is stale at `t` or fewer than two points lie within reach.
        """
        ts, vs = self.ts, self.vs
        i = bisect_right(ts, t) - 1
        if i < 1 or t - ts[i] > stale_seconds:
            return None
        j = bisect_right(ts, ts[i] - window_seconds) - 1
        if j < 0:
            j = 0
        if j >= i:
            j = i - 1
        if ts[i] - ts[j] > gap_seconds:
            # never bridge a gap: start after the last long hole inside the window
            k = i
            while k > j:
                if ts[k] - ts[k - 1] > gap_seconds:
                    break
                k -= 1
            if k > j:
                j = k
                if j >= i:
                    return None
        dt = ts[i] - ts[j]
        if dt <= 0:
            return None
        if i - j == 1:
            inc = vs[i] - vs[j]
            if inc < 0:
                inc = vs[i]  # a reset restarts from zero
        else:
            inc = 0.0
            prev = vs[j]
            for n in range(j + 1, i + 1):
                v = vs[n]
                inc += v - prev if v >= prev else v  # a reset restarts from zero
                prev = v
        return inc / dt
