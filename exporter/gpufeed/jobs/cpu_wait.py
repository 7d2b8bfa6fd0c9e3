"""How long a job's threads waited for a CPU: parsers and readers.

A job's input pipeline can starve for CPU without any quota throttling it: on a host that
other work already saturates, the workers are runnable but wait in the run queue, while the
host's CPU busy time and PSI (already high in healthy time) hardly move. Two kernel
accounts say so for the job itself:

- `/proc/PID/task/TID/schedstat`: `RUN_NS WAIT_NS TIMESLICES` per thread, where RUN_NS is
  the time it ran on a CPU and WAIT_NS the time it was runnable but waited in a run queue
  (CONFIG_SCHED_INFO; it does not depend on the cgroup version). Summed over the job's
  threads, WAIT / (WAIT + RUN) is the share of the time they wanted a CPU that they
  waited for one. A thread that sleeps adds to neither.
- cgroup v2 `cpu.pressure` of the job's cgroup: `some ... total=USEC`, the wall time in
  which at least one of its tasks waited for a CPU (the host-wide file's per-cgroup twin).

Threads come and go (DataLoader workers are new processes every epoch), and a gone
thread's counters go with it, so `RunQueueSum` keeps what the gone ones had and the job's
totals never go down.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufeed.jobs.identity import read_text
from gpufeed.procfs.pressure import parse_pressure

V1_THREADS = "tasks"  # cgroup v1: every thread of the cgroup, one TID a line
V2_THREADS = "cgroup.threads"
V2_PRESSURE = "cpu.pressure"
# A thread id whose counters went down was reused by a new thread; ids are remembered for
# at most this many gone threads (a long job starts many workers).
_MAX_THREADS = 65536


@dataclass(frozen=True, slots=True)
class ThreadCpu:
    """CPU time of one thread, or of a job's threads summed (integers: sums over
    thousands of threads stay exact)."""

    running_ns: int
    waiting_ns: int


def parse_schedstat(text: str) -> ThreadCpu | None:
    """/proc/PID/schedstat (or .../task/TID/schedstat): `RUN_NS WAIT_NS TIMESLICES`;
    None where the line is not that (an empty read of a thread that just exited)."""
    fields = text.split()
    if len(fields) < 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None
    return ThreadCpu(int(fields[0]), int(fields[1]))


def parse_cgroup_pressure_some(text: str) -> float | None:
    """cgroup v2 cpu.pressure: the `some` total in seconds; None for a malformed file."""
    try:
        return parse_pressure(text).some_total_seconds
    except ValueError:
        return None


def parse_ids(text: str) -> list[int]:
    """A cgroup's `tasks` / `cgroup.threads` / `cgroup.procs`: one id a line."""
    return [int(x) for x in text.split() if x.isdigit()]


def cgroup_threads(directory: Path, v2: bool) -> list[int]:
    """Every thread in a cgroup directory and below it (v1 `tasks`, v2 `cgroup.threads`)."""
    name = V2_THREADS if v2 else V1_THREADS
    tids: list[int] = []
    for dirpath, _dirs, files in os.walk(directory):
        if name in files:
            text = read_text(Path(dirpath, name))
            if text is not None:
                tids.extend(parse_ids(text))
    return tids


def process_threads(procfs: Path, pid: int) -> list[int]:
    """The threads of process `pid` (/proc/PID/task); [] where it is gone."""
    try:
        return [int(e.name) for e in os.scandir(procfs / str(pid) / "task") if e.name.isdigit()]
    except OSError:
        return []


def thread_schedstat(procfs: Path, tid: int) -> ThreadCpu | None:
    """One thread's counters. /proc/TID is there for every thread id, listed or not."""
    text = read_text(procfs / str(tid) / "schedstat")
    return parse_schedstat(text) if text is not None else None


def cgroup_pressure(directory: Path) -> float | None:
    """The `some` CPU pressure total of a v2 cgroup, seconds; None where not readable."""
    text = read_text(directory / V2_PRESSURE)
    return parse_cgroup_pressure_some(text) if text is not None else None


class RunQueueSum:
    """Monotonic sums of schedstat over a changing set of threads.

    A thread that is gone leaves its last reading behind (what it did after that reading
    is lost: at most one sampling interval of one thread). A thread id whose counters went
    down belongs to a new thread: the old one's last reading is kept, the new one starts
    afresh."""

    __slots__ = ("_last", "_retired_running", "_retired_waiting")

    def __init__(self) -> None:
        self._last: dict[int, ThreadCpu] = {}
        self._retired_running = 0
        self._retired_waiting = 0

    def update(self, readings: dict[int, ThreadCpu]) -> ThreadCpu:
        for tid, old in self._last.items():
            new = readings.get(tid)
            if new is None or new.running_ns < old.running_ns:
                self._retired_running += old.running_ns
                self._retired_waiting += old.waiting_ns
        self._last = dict(list(readings.items())[:_MAX_THREADS])
        return ThreadCpu(
            self._retired_running + sum(r.running_ns for r in self._last.values()),
            self._retired_waiting + sum(r.waiting_ns for r in self._last.values()),
        )

    @property
    def seen(self) -> bool:
        return bool(self._last) or self._retired_running > 0


def read_threads(procfs: Path, tids: Iterable[int]) -> dict[int, ThreadCpu]:
    """Counters of each readable thread (one that exited meanwhile is left out)."""
    out: dict[int, ThreadCpu] = {}
    for tid in tids:
        got = thread_schedstat(procfs, tid)
        if got is not None:
            out[tid] = got
    return out
