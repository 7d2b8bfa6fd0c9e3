"""Filesystem calls that may hang, run under a time bound.

statvfs() or stat() on an NFS mount whose server is gone blocks in the kernel, possibly
forever, and no signal or timeout can interrupt it from Python. So the calls run in a
daemon thread and the caller waits only so long. A call that does not answer in time is
"stuck": its key stays in flight until the kernel lets the thread go, and no second call
on the same key starts meanwhile, so a dead mount costs one blocked thread, not one per
interval.

One worker thread runs a whole batch in order (one thread per collect, not per mount);
when it hangs on one item, the rest go to a fresh worker, within an overall deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

T = TypeVar("T")

Status = Literal["ok", "error", "stuck", "skipped"]


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    status: Status  # skipped: not reached before the overall deadline, try again next time
    value: T | None = None
    error: BaseException | None = None
    stuck_seconds: float = 0.0  # how long the call in flight has been running (stuck only)


@dataclass(slots=True)
class _Batch(Generic[T]):
    items: Sequence[tuple[str, Callable[[], T]]]
    cond: threading.Condition
    index: int = -1
    started: float = 0.0
    finished: bool = False
    abandoned: bool = False
    results: dict[str, Outcome[T]] = field(default_factory=dict)


class BoundedCalls:
    """Runs keyed calls with a per-call timeout and remembers which keys are stuck."""

    def __init__(self, timeout_seconds: float, overall_seconds: float | None = None) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.timeout_seconds = timeout_seconds
        self.overall_seconds = overall_seconds if overall_seconds else 2 * timeout_seconds
        self._lock = threading.Lock()
        self._in_flight: dict[str, float] = {}  # key -> monotonic start of the running call

    def in_flight(self) -> dict[str, float]:
        """Keys whose call is still running, with how long it has run (seconds)."""
        now = time.monotonic()
        with self._lock:
            return {k: now - t for k, t in self._in_flight.items()}

    def run(
        self, calls: Sequence[tuple[str, Callable[[], T]]], deadline: float | None = None
    ) -> dict[str, Outcome[T]]:
        """Runs each (key, call); every key gets an outcome by `deadline` (time.monotonic;
        default: overall_seconds from now). Several runs can share one deadline."""
        results: dict[str, Outcome[T]] = {}
        pending: list[tuple[str, Callable[[], T]]] = []
        busy = self.in_flight()
        for key, fn in calls:
            if key in busy:
                results[key] = Outcome("stuck", stuck_seconds=busy[key])
            elif key not in results and all(key != k for k, _ in pending):
                pending.append((key, fn))
        if deadline is None:
            deadline = time.monotonic() + self.overall_seconds
        while pending:
            if time.monotonic() >= deadline:
                for key, _ in pending:
                    results[key] = Outcome("skipped")
                break
            pending = self._run_batch(pending, deadline, results)
        return results

    def _run_batch(
        self,
        items: Sequence[tuple[str, Callable[[], T]]],
        deadline: float,
        results: dict[str, Outcome[T]],
    ) -> list[tuple[str, Callable[[], T]]]:
        """Runs items in one worker; returns those the worker did not get to."""
        batch: _Batch[T] = _Batch(items, threading.Condition())
        worker = threading.Thread(
            target=self._work, args=(batch,), name="gpufeed-fs-call", daemon=True
        )
        worker.start()
        with batch.cond:
            while not batch.finished:
                now = time.monotonic()
                limit = min(batch.started + self.timeout_seconds, deadline)
                if batch.index >= 0 and now >= limit:
                    batch.abandoned = True
                    break
                if batch.index < 0 and now >= deadline:
                    batch.abandoned = True
                    break
                batch.cond.wait(max(0.001, limit - now) if batch.index >= 0 else deadline - now)
            results.update(batch.results)
            index = batch.index
            finished = batch.finished
        if finished:
            return []
        rest: list[tuple[str, Callable[[], T]]] = []
        for i, (key, fn) in enumerate(items):
            if key in results:
                continue
            if i == index:
                results[key] = Outcome("stuck", stuck_seconds=time.monotonic() - batch.started)
            else:
                rest.append((key, fn))
        return rest

    def _work(self, batch: _Batch[T]) -> None:
        for i, (key, fn) in enumerate(batch.items):
            with batch.cond:
                if batch.abandoned:
                    break
                batch.index = i
                batch.started = time.monotonic()
                with self._lock:
                    self._in_flight[key] = batch.started
                batch.cond.notify_all()  # the waiter times this item from now
            try:
                outcome: Outcome[T] = Outcome("ok", value=fn())
            except Exception as exc:  # the caller decides what an error means for this key
                outcome = Outcome("error", error=exc)
            finally:
                with self._lock:
                    self._in_flight.pop(key, None)
            with batch.cond:
                if not batch.abandoned:
                    batch.results[key] = outcome
                batch.cond.notify_all()
        with batch.cond:
            batch.finished = True
            batch.cond.notify_all()
