"""The fleet's cycle loop: catch up on every due cycle in order, write its windows and state,
render /metrics; a failed cycle (TSDB slow or down) is retried, never skipped."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpufeed import vocabulary
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.promql import PromError
from gpufeed.correlator.outputs.windowlog import WindowLog, read_log
from gpufeed.fleet.carry import FleetEngines
from gpufeed.fleet.cycle import QUERY_RETRY, CycleResult, evaluate
from gpufeed.fleet.memory import freeze_survivors
from gpufeed.fleet.metrics import Price, Progress, render
from gpufeed.fleet.state import FleetState, load_state, save_state, state_path
from gpufeed.fleet.timing import CycleTiming

RECENT_WINDOWS = 10_000  # closed windows /api/windows can show
RETRY_SECONDS = (1.0, 30.0)  # a failed cycle is tried again after 1 s, doubling up to 30 s
LEDGER_RETENTION_SECONDS = 7 * 24 * 3600.0  # a job's ledger outlives it by a week

WindowKey = tuple[str, str, str, float, float]


def window_key(w: Window) -> WindowKey:
    return (w.instance, w.gpu, w.job_id, round(w.start_seconds, 3), round(w.end_seconds, 3))


@dataclass(frozen=True, slots=True)
class FleetSettings:
    url: str  # a feeds.access.ServerUrl where credentials are needed
    match: str
    timing: CycleTiming
    params: WindowParams
    windows_log: str
    price: Price | None = None
    start_seconds: float | None = None  # first run without a cursor: backfill from here
    until_seconds: float | None = None  # stop after the cycle at this boundary (a backfill)
    queries_in_flight: int = vocabulary.DEFAULT_FLEET_QUERIES_IN_FLIGHT


class FleetService:
    def __init__(self, settings: FleetSettings, clock: Callable[[], float] = time.time) -> None:
        self.s = settings
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.state: FleetState = load_state(state_path(settings.windows_log))
        self.log = WindowLog(settings.windows_log)
        self._recent: deque[Window] = deque(maxlen=RECENT_WINDOWS)
        self._recent.extend(read_log(settings.windows_log))
        self._last: CycleResult | None = None
        self._ok = 0
        self._failed = 0
        self._written = 0
        self._duration: float | None = None
        self._error = ""
        self.generation = 0  # /api/windows re-renders when this changes
        self.engines = FleetEngines(
            settings.url,
            settings.timing,
            settings.params,
            settings.match,
            QUERY_RETRY,
            settings.queries_in_flight,
        )
        self.page = self._render(0.0)

    # ---- what the HTTP side reads ------------------------------------------------------------
    def windows(self, limit: int) -> tuple[list[Window], list[Window]]:
        with self._lock:
            closed = list(self._recent)[-limit:] if limit > 0 else []
            open_ = list(self._last.open) if self._last is not None else []
        return closed, open_

    def healthy(self) -> str:
        """ "" when the last cycle worked, else why not (for /healthz)."""
        return self._error

    # ---- the loop -------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        backoff = RETRY_SECONDS[0]
        while not self._stop.is_set():
            now = self._clock()
            due = self.s.timing.due(now)
            nxt = self._next_boundary(due)
            if self.s.until_seconds is not None and nxt > self.s.until_seconds:
                return  # the backfill is done
            if nxt > due:
                self._publish(0.0)
                self._stop.wait(max(0.05, nxt + self.s.timing.settle_seconds - self._clock()))
                continue
            try:
                cpu = time.process_time()
                result = self.run_cycle(nxt)
                cpu = time.process_time() - cpu
                backoff = RETRY_SECONDS[0]
                self._error = ""
                if self.s.until_seconds is not None:  # a backfill says how it goes
                    print(
                        f"gpufeed fleet: cycle {nxt:.0f}: {len(result.closed)} windows closed, "
                        f"{result.queries} queries, {result.points} points, "
                        f"{self._duration or 0.0:.2f} s ({cpu:.2f} s of CPU)",
                        file=sys.stderr,
                        flush=True,
                    )
                # the next epoch's engines, off the cycle's path (see fleet/carry.py)
                self.engines.warm_up()
                freeze_survivors(self.engines.take_dropped())  # see fleet/memory.py
            except Exception as e:  # the service outlives any one cycle
                self._failed += 1
                if not isinstance(e, PromError):
                    # not the TSDB: the engines may be half-way through a step; rebuild
                    # them (a TSDB failure leaves them at their last whole chunk)
                    self.engines.reset()
                msg = f"gpufeed fleet: cycle {nxt:.0f} failed, retrying: {e}"
                if msg != self._error:  # one line per new problem, not one per retry
                    print(msg, file=sys.stderr, flush=True)
                self._error = msg
                self._publish(due - (nxt - self.s.timing.interval_seconds))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RETRY_SECONDS[1])

    def _next_boundary(self, due: float) -> float:
        cursor = self.state.cursor_seconds
        if cursor is not None:
            return cursor + self.s.timing.interval_seconds
        if self.s.start_seconds is not None:
            return self.s.timing.first_after(self.s.start_seconds)
        return due

    def run_cycle(self, boundary: float) -> CycleResult:
        """Evaluates one cycle and makes it durable: its windows in the log (those the log
        does not hold yet: a cycle redone after a kill), then the state with the cursor."""
        began = time.monotonic()
        result = evaluate(self.engines, boundary)
        lo, _ = self.s.timing.report_slice(boundary)
        have = {window_key(w) for w in self._recent if w.end_seconds > lo}
        new = [w for w in result.closed if window_key(w) not in have]
        for w in new:
            err = self.log.append(w)
            if err is not None:
                raise err  # not durable: the cycle is done again (its windows are skipped)
        self.state.add(boundary, result.ledger, LEDGER_RETENTION_SECONDS)
        save_state(state_path(self.s.windows_log), self.state)
        with self._lock:
            self._recent.extend(new)
            self._last = result
        self._written += len(new)
        self._ok += 1
        self._duration = time.monotonic() - began
        due = self.s.timing.due(self._clock())
        self._publish(max(0.0, due - boundary))
        return result

    def _publish(self, lag: float) -> None:
        page = self._render(lag)
        with self._lock:
            self.page = page
            self.generation += 1

    def _render(self, lag: float) -> bytes:
        progress = Progress(lag, self._ok, self._failed, self._written, self._duration)
        return render(self.state, self._last, progress, self.s.price)

    def close(self) -> None:
        self.log.close()
