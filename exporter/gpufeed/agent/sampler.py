"""Background sampling: every collector on the interval, each under a time bound.

Each collector has its own worker thread. On every tick the sampler triggers every worker
that is idle and waits until the deadline; a collector that has not answered by then is
marked failed for that tick, and is not triggered again until its stuck call returns, so a
hung NFS mount costs one thread, never a pile of them, and never delays the other
collectors or the scrape. A collector that needs another's reading (a `Consumer`, see
collectors.base) is triggered after its producers have answered in the same tick, with
their `TickData`; it waits for them at most half the time bound, so a hung producer leaves
it time to run without that data. Processors (the correlator) then derive their families, the
snapshot is rendered once, and sinks (the recorder) receive it.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufeed import __version__
from gpufeed.catalogue import spec
from gpufeed.collectors.base import (
    Collector,
    Consumer,
    PartialCollectionError,
    Producer,
    TickData,
)
from gpufeed.exposition import merge_families, render_text
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family
from gpufeed.snapshot import CollectorStatus, Processor, Sink, Snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Rendered:
    """The latest snapshot and its exposition, swapped atomically for the scrape path."""

    snapshot: Snapshot
    text: bytes
    finished_at_seconds: float


class _Worker:
    """Runs one collector's `collect()` on its own thread, one call at a time."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.name = collector.name
        self._go = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._stop = False
        self._data = TickData()
        self.result: list[Family] = []
        self.error = ""
        self.duration_seconds = 0.0
        self._thread = threading.Thread(
            target=self._run, name=f"collector-{self.name}", daemon=True
        )
        self._thread.start()

    @property
    def busy(self) -> bool:
        return not self._done.is_set()

    def trigger(self, data: TickData | None = None) -> None:
        """`data`: the producers' readings of this tick, for a `Consumer`."""
        self._data = data or TickData()
        self._done.clear()
        self._go.set()

    def wait(self, timeout_seconds: float) -> bool:
        return self._done.wait(max(0.0, timeout_seconds))

    def stop(self) -> None:
        self._stop = True
        self._go.set()

    def _run(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            started = time.perf_counter()
            try:
                c = self.collector
                self.result = c.collect_with(self._data) if isinstance(c, Consumer) else c.collect()
                self.error = ""
            except PartialCollectionError as exc:
                # Failed, but what it did read is still published.
                self.result = exc.families
                self.error = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a collector's failure must not end the agent
                self.result = []
                self.error = f"{type(exc).__name__}: {exc}"
            self.duration_seconds = time.perf_counter() - started
            self._done.set()


class Sampler:
    def __init__(
        self,
        collectors: Sequence[Collector],
        *,
        interval_seconds: float,
        timeout_seconds: float,
        processors: Sequence[Processor] = (),
        sinks: Sequence[Sink] = (),
        static_families: Callable[[], list[Family]] | None = None,
        banner: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._workers = [_Worker(c) for c in collectors]
        self._trigger_order = _producers_first(self._workers)
        self._interval = interval_seconds
        self._timeout = min(timeout_seconds, interval_seconds * 5)
        if self._timeout < timeout_seconds:
            log.warning(
                "collector time bound %.2fs capped at 5 intervals: %.2fs",
                timeout_seconds,
                self._timeout,
            )
        self._timed_out = f"timed out after {self._timeout:.2f}s"
        self._processors = list(processors)
        self._sinks = list(sinks)
        self._static = static_families
        self._banner = banner
        self._clock = clock
        self._latest: Rendered | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # a collector's failure is logged when it starts or changes, not on every tick
        self._failures = LogOnce(log)
        self._closed = False
        self._unrenderable = LogOnce(log)  # families left out of /metrics, once each

    @property
    def latest(self) -> Rendered | None:
        return self._latest

    @property
    def interval_seconds(self) -> float:
        return self._interval

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops sampling and closes every part once; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout + self._interval + 1)
        for w in self._workers:
            w.stop()
        for p in self._processors:
            close = getattr(p, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("closing processor %s failed", p.name)
        for sink in self._sinks:
            try:
                sink.close()
            except Exception:
                log.exception("closing %s failed", sink.name)
        for w in self._workers:
            try:
                w.collector.close()
            except Exception:
                log.exception("closing collector %s failed", w.name)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stale_after_seconds(self) -> float:
        """Age past which the latest sample means sampling is stuck (several missed ticks)."""
        return max(10.0, 5 * self._interval)

    def stall_reason(self, now_seconds: float) -> str:
        """Why sampling is not making progress, "" while it is: for /healthz and the
        systemd watchdog, which must agree on what a stalled agent is."""
        if not self.alive():
            return "sampler not running"
        latest = self._latest
        if latest is None:
            return "no sample taken yet"
        age = now_seconds - latest.finished_at_seconds
        if age > self.stale_after_seconds:
            return f"last sample is {age:.1f}s old"
        return ""

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # never let one bad tick end sampling
                log.exception("sampling failed")
            next_tick += self._interval
            now = time.monotonic()
            if next_tick < now:  # we fell behind: skip the missed ticks, don't burst
                next_tick = now + self._interval - ((now - next_tick) % self._interval)
            self._stop.wait(next_tick - now)

    def sample_once(self) -> Rendered:
        timestamp = self._clock()
        started = time.monotonic()
        deadline = started + self._timeout
        triggered: list[_Worker] = []
        handoff_deadline = started + self._timeout / 2
        for w in self._trigger_order:
            if w.busy:
                continue
            if isinstance(w.collector, Consumer):
                needs = w.collector.needs
                w.trigger(self._tick_data(needs, triggered, handoff_deadline))
            else:
                w.trigger()
            triggered.append(w)
        families: list[Family] = []
        statuses: list[CollectorStatus] = []
        failures: list[str] = []
        for w in self._workers:
            if w not in triggered:
                # Its call from an earlier tick has not returned: it has used the whole bound
                # again (docs/metrics.md: the duration is the time bound when it timed out).
                statuses.append(CollectorStatus(w.name, False, self._timeout, "still hung"))
                # the time-out that left it hung stays the logged problem: not logged again
                failures.append(f"collector {w.name} failed: {self._timed_out}")
                continue
            if not w.wait(deadline - time.monotonic()):
                statuses.append(CollectorStatus(w.name, False, self._timeout, self._timed_out))
                failures.append(f"collector {w.name} failed: {self._timed_out}")
                continue
            if w.error:
                failures.append(f"collector {w.name} failed: {w.error}")
                statuses.append(CollectorStatus(w.name, False, w.duration_seconds, w.error))
                families.extend(w.result)  # partial results; empty for ordinary failures
                continue
            statuses.append(CollectorStatus(w.name, True, w.duration_seconds))
            families.extend(w.result)
        self._failures.report(logging.WARNING, failures)
        snapshot = Snapshot(timestamp, tuple(families), tuple(statuses))
        derived: list[Family] = []
        for p in self._processors:
            try:
                derived.extend(p.process(snapshot))
            except Exception:
                log.exception("processor %s failed", p.name)
        own = self._self_metrics(statuses, timestamp)
        full = Snapshot(timestamp, (*families, *derived, *own), snapshot.statuses)
        rendered = Rendered(full, self._render(full.families), time.time())
        self._latest = rendered
        for sink in self._sinks:
            try:
                sink.write(full)
            except Exception:
                log.exception("sink %s failed", sink.name)
        return rendered

    def _tick_data(self, needs: Sequence[str], triggered: list[_Worker], until: float) -> TickData:
        """What the producers named in `needs` read in this tick: only those triggered in
        this tick that answer by `until` without error add theirs."""
        data = TickData()
        for w in triggered:
            if w.name not in needs or not isinstance(w.collector, Producer):
                continue
            if w.wait(until - time.monotonic()) and not w.error:
                data = w.collector.produce(data)
        return data

    def _render(self, families: Sequence[Family]) -> bytes:
        try:
            return render_text(families, self._banner)
        except Exception:
            pass
        # One family the text format cannot carry (a label value that is not valid UTF-8,
        # say) must not take the whole page down: find it, leave it out, say so once.
        good: list[Family] = []
        for fam in merge_families(families):
            try:
                render_text([fam])
            except Exception as exc:
                self._unrenderable.log(
                    logging.ERROR,
                    fam.name,
                    "%s left out of /metrics: %s: %s",
                    fam.name,
                    type(exc).__name__,
                    exc,
                )
                continue
            good.append(fam)
        return render_text(good, self._banner)

    def _self_metrics(self, statuses: list[CollectorStatus], timestamp: float) -> list[Family]:
        f = Families()
        # /metrics serves the last rendered snapshot however old it is, so a stalled sampler
        # would look healthy to Prometheus: the snapshot's own time travels with it, and
        # `time() - gpufeed_snapshot_timestamp_seconds` is its age at evaluation time.
        f.put(spec("gpufeed_snapshot_timestamp_seconds"), {}, timestamp)
        for st in statuses:
            labels = {"collector": st.name}
            f.put(spec("gpufeed_collector_success"), labels, 1.0 if st.success else 0.0)
            f.put(spec("gpufeed_collector_duration_seconds"), labels, st.duration_seconds)
        build = {"version": __version__, "python_version": platform.python_version()}
        f.put(spec("gpufeed_build_info"), build, 1.0)
        if self._static is not None:
            f.extend(self._static())
        return f.build()


def _producers_first(workers: list[_Worker]) -> list[_Worker]:
    """Workers in an order where every consumer comes after the producers it needs (those
    present); a cycle of needs is a wiring error."""
    by_name = {w.name: w for w in workers}
    ordered: list[_Worker] = []
    placing: set[str] = set()

    def place(w: _Worker) -> None:
        if w in ordered:
            return
        if w.name in placing:
            raise ValueError(f"collector {w.name!r} needs itself through {sorted(placing)}")
        placing.add(w.name)
        if isinstance(w.collector, Consumer):
            for need in w.collector.needs:
                if need in by_name:
                    place(by_name[need])
        placing.discard(w.name)
        ordered.append(w)

    for w in sorted(workers, key=lambda w: isinstance(w.collector, Consumer)):
        place(w)
    return ordered
