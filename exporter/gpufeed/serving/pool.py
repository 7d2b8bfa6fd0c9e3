"""The threads serving fetches run on: lanes of daemon threads that nothing waits for.

The serving collector gives the administrator's endpoints and the jobs' endpoints a lane
each, so a job's endpoints, however slow, never hold a thread the administrator's need.
A lane runs its tasks in the order given (the collector puts the endpoints that answered
last time first). Every task has a deadline: one still queued at it is not run (its fetch
would start too late to finish in its tick).

The threads are daemon threads and `close()` joins none of them: it aborts the fetches in
flight (their sockets are shut down) and drops the queued ones. A ThreadPoolExecutor's
threads are joined when the interpreter exits, so one fetch that never ended kept a
stopped agent up (issue 26: 11.5 minutes after SIGTERM).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from gpufeed.serving.fetch import Abort

log = logging.getLogger(__name__)

T = TypeVar("T")


class Task(Generic[T]):
    """One piece of work for a lane: `run(abort)` on a worker thread, started before
    `deadline_monotonic` or not at all. `done` is set once it ran, expired or was dropped;
    `outcome` is what `run` returned (None: it did not run, or it raised)."""

    __slots__ = ("abort", "deadline_monotonic", "done", "outcome", "run")

    def __init__(self, run: Callable[[Abort], T], deadline_monotonic: float) -> None:
        self.run = run
        self.deadline_monotonic = deadline_monotonic
        self.abort = Abort()
        self.done = threading.Event()
        self.outcome: T | None = None


class Lane(Generic[T]):
    """At most `workers` daemon threads (started as work arrives) running the tasks in the
    order given."""

    def __init__(self, name: str, workers: int) -> None:
        self._name = name
        self._workers = workers
        self._cond = threading.Condition()
        self._queue: deque[Task[T]] = deque()
        self._active: list[Task[T]] = []
        self._threads = 0
        self._idle = 0
        self._closed = False

    def submit(self, task: Task[T]) -> None:
        with self._cond:
            if self._closed:
                task.done.set()
                return
            self._queue.append(task)
            if len(self._queue) > self._idle and self._threads < self._workers:
                self._threads += 1
                name = f"gpufeed-{self._name}-{self._threads}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
            self._cond.notify()

    def close(self) -> None:
        """Aborts what runs, drops what waits, and returns at once."""
        with self._cond:
            self._closed = True
            dropped, self._queue = self._queue, deque()
            active = list(self._active)
            self._cond.notify_all()
        for t in active:
            t.abort.abort()
        for t in dropped:
            t.done.set()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._queue and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if self._closed:
                    self._threads -= 1
                    return
                task = self._queue.popleft()
                self._active.append(task)
            try:
                if time.monotonic() < task.deadline_monotonic:
                    task.outcome = task.run(task.abort)
            except Exception:  # a bug in one task must not end the lane's thread
                log.exception("serving task failed")
            finally:
                with self._cond:
                    self._active.remove(task)
                task.done.set()
