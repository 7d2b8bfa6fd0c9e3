"""The live descendants of a job's processes: its DataLoader workers, its launcher's ranks.

Only the processes that speak to the SDK are known by pid, but a training job's input
pipeline runs in processes it forks (PyTorch DataLoader workers): their reads, CPU time and
run-queue wait are the job's. The kernel adds a child's I/O to its parent's /proc/PID/io
only when the parent reaps it, so until a worker exits its reads are nobody's unless the
worker itself is summed.

Two ways to find children, the cheaper first:
- /proc/PID/task/TID/children (kernels with CONFIG_PROC_CHILDREN, most distributions):
  a few reads per known process each time;
- otherwise one scan of every /proc/PID/stat for its parent pid. That costs milliseconds
  on a busy node, so its result is kept for `rescan_seconds` (a worker forked since is
  summed that much later; its bytes are not lost, its first reading holds them).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpufeed.jobs.identity import parse_proc_stat, read_text

MAX_PROCESSES_PER_JOB = 4096  # a fork bomb must not make every tick walk it
RESCAN_SECONDS = 10.0
# Four collectors (job_io, job_cpu, job_cache, fabric) ask for the same jobs' processes in
# one tick: within this the walk is done once and its answer shared.
REUSE_SECONDS = 0.5


def parse_children(text: str) -> list[int]:
    """/proc/PID/task/TID/children: the pids of that thread's children, space-separated."""
    return [int(word) for word in text.split() if word.isdigit()]


class ProcessTree:
    """Expands each job's known pids with their live descendants, from `procfs`."""

    def __init__(
        self,
        procfs: Path,
        rescan_seconds: float = RESCAN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._procfs = procfs
        self._rescan_seconds = rescan_seconds
        self._clock = clock
        self._per_thread: bool | None = None  # None: not known yet
        self._children_of: dict[int, list[int]] = {}
        self._scanned_at: float | None = None
        self._expanded: tuple[float, tuple[tuple[str, tuple[int, ...]], ...], dict[str, list[int]]]
        self._expanded = (-math.inf, (), {})

    def expand(self, pids_by_job: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        """Each job's pids followed by their descendants (each pid once, the known first);
        the same jobs asked again within REUSE_SECONDS get the same answer, not a new walk."""
        now = self._clock()
        key = tuple((job, tuple(pids)) for job, pids in sorted(pids_by_job.items()))
        at, last_key, last = self._expanded
        if key == last_key and now - at < REUSE_SECONDS:
            return {job: list(pids) for job, pids in last.items()}
        got = {job: self.with_descendants(pids) for job, pids in pids_by_job.items()}
        self._expanded = (now, key, got)
        return {job: list(pids) for job, pids in got.items()}

    def with_descendants(self, roots: Sequence[int]) -> list[int]:
        if not roots:
            return []
        children = self._children_reader(roots[0])
        seen = dict.fromkeys(roots)
        queue = list(roots)
        while queue and len(seen) < MAX_PROCESSES_PER_JOB:
            for child in children(queue.pop()):
                if child not in seen:
                    seen[child] = None
                    queue.append(child)
        return list(seen)[:MAX_PROCESSES_PER_JOB]

    def _children_reader(self, probe_pid: int) -> Callable[[int], Iterable[int]]:
        if self._per_thread is None:
            task = self._procfs / str(probe_pid) / "task" / str(probe_pid)
            if not task.is_dir():
                return lambda _pid: ()  # the probe is gone: ask again next time
            self._per_thread = (task / "children").exists()
        if self._per_thread:
            return self._thread_children
        self._rescan_if_due()
        return lambda pid: self._children_of.get(pid, ())

    def _thread_children(self, pid: int) -> list[int]:
        try:
            tids = os.listdir(self._procfs / str(pid) / "task")
        except OSError:
            return []  # exited
        found: list[int] = []
        for tid in tids:
            text = read_text(self._procfs / str(pid) / "task" / tid / "children")
            if text is not None:
                found.extend(parse_children(text))
        return found

    def _rescan_if_due(self) -> None:
        now = self._clock()
        if self._scanned_at is not None and now - self._scanned_at < self._rescan_seconds:
            return
        self._scanned_at = now
        children_of: dict[int, list[int]] = {}
        try:
            entries = os.listdir(self._procfs)
        except OSError:
            entries = []
        for name in entries:
            if not name.isdigit():
                continue
            text = read_text(self._procfs / name / "stat")
            stat = parse_proc_stat(text) if text is not None else None
            if stat is not None:
                children_of.setdefault(stat.ppid, []).append(stat.pid)
        self._children_of = children_of
