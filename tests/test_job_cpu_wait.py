"""The job's own run-queue wait ("job_cpu" collector): schedstat and cgroup v2 cpu.pressure
parsers on fixtures, the monotonic sum over threads that come and go, the job's threads
found through its cgroup (v1 `tasks`, v2 `cgroup.threads`) or its SDK processes, and a real
CPU-bound process that waits for a CPU it shares with others."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.job_cpu import JobCpuCollector
from gpufeed.hostpaths import HostPaths
from gpufeed.jobs.cpu_wait import (
    RunQueueSum,
    ThreadCpu,
    parse_cgroup_pressure_some,
    parse_ids,
    parse_schedstat,
)
from gpufeed.model import iter_samples

FIXTURES = Path(__file__).parent / "fixtures" / "cpu_wait"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1000000000 250000000 40\n", ThreadCpu(1_000_000_000, 250_000_000)),
        ("0 41414 1\n", ThreadCpu(0, 41414)),
        ("5 6\n", ThreadCpu(5, 6)),  # older kernels: no timeslice count
        ("", None),  # a thread that exited while it was read
        ("12 x 3\n", None),
        ("-1 5 3\n", None),
    ],
)
def test_parse_schedstat(text: str, expected: ThreadCpu | None) -> None:
    assert parse_schedstat(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\n", 2.5),
        ("some avg10=1.00 avg60=0.50 avg300=0.10 total=7\nfull avg10=0 avg60=0 avg300=0 total=3\n", 7e-6),
        ("full avg10=0 avg60=0 avg300=0 total=3\n", None),  # no `some` line
        ("garbage\n", None),
    ],
)  # fmt: skip
def test_parse_cgroup_pressure_some(text: str, expected: float | None) -> None:
    assert parse_cgroup_pressure_some(text) == expected


def test_parse_ids() -> None:
    assert parse_ids("7002\n7003\n\n x\n") == [7002, 7003]


def test_run_queue_sum_keeps_what_gone_threads_had() -> None:
    """A worker that exits leaves its last reading; a reused thread id whose counters went
    down is a new thread; the totals never go down."""
    s = RunQueueSum()
    assert not s.seen
    assert s.update({1: ThreadCpu(10, 20), 2: ThreadCpu(5, 5)}) == ThreadCpu(15, 25)
    # thread 2 exits; thread 3 (a new worker) appears
    assert s.update({1: ThreadCpu(15, 20), 3: ThreadCpu(1, 2)}) == ThreadCpu(21, 27)
    # id 1 reused by a new thread (its counters restart)
    assert s.update({1: ThreadCpu(2, 1), 3: ThreadCpu(1, 2)}) == ThreadCpu(23, 28)
    # every thread gone: the totals stay
    assert s.update({}) == ThreadCpu(23, 28)
    assert s.seen


def series(c: JobCpuCollector) -> dict[tuple[str, str], float]:
    return {
        (s.name.removeprefix("gpufeed_job_cpu_"), s.label("job_id")): round(s.value, 9)
        for s in iter_samples(c.collect())
    }


def collector(root: Path, sdk: dict[str, list[int]] | None = None) -> JobCpuCollector:
    paths = HostPaths(procfs=root / "proc", sysfs=root / "sys")
    return JobCpuCollector(CollectorContext(paths=paths), (lambda: sdk) if sdk else None)


def test_v1_job_threads_from_its_cgroup_tasks_and_sdk_job_from_its_processes() -> None:
    """cgroup v1 (cpu and cpuacct apart): Slurm job 7's threads are the `tasks` of its
    cgroup and of its step below it (7009 exited before it was read: left out); the
    `gpufeed run` job's threads are those of its processes (900: two threads; 950, a
    DataLoader worker: one). No cpu.pressure on v1: that family is absent."""
    got = series(collector(FIXTURES / "v1", {"r-900": [900, 950], "r-gone": [12345]}))
    assert got == {
        ("usage_seconds_total", "7"): 3.0,
        ("running_seconds_total", "7"): 3.5,
        ("waiting_seconds_total", "7"): 8.0,
        ("running_seconds_total", "r-900"): 7.0,
        ("waiting_seconds_total", "r-900"): 4.0,
    }


def test_v2_job_cpu_pressure_and_threads() -> None:
    """cgroup v2: job 8's cgroup's cpu.pressure `some` total, and its threads' schedstat
    (cgroup.threads); no quota (cpu.max "max"): no throttling series."""
    got = series(collector(FIXTURES / "v2"))
    assert got == {
        ("usage_seconds_total", "8"): 4.0,
        ("running_seconds_total", "8"): 3.0,
        ("waiting_seconds_total", "8"): 9.0,
        ("pressure_waiting_seconds_total", "8"): 2.5,
    }


def test_a_job_whose_threads_are_all_gone_keeps_its_totals(tmp_path: Path) -> None:
    """The job's worker process exits between two scrapes: its threads' time stays counted
    (a counter that went down would read as a reset and a huge rate)."""
    proc = tmp_path / "proc"
    for tid, text in ((40, "2000000000 1000000000 9\n"), (41, "1000000000 3000000000 9\n")):
        (proc / "40" / "task" / str(tid)).mkdir(parents=True)
        (proc / "40" / "task" / str(tid) / "schedstat").write_text(text)
        (proc / str(tid)).mkdir(exist_ok=True)
        (proc / str(tid) / "schedstat").write_text(text)
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)
    (tmp_path / "sys" / "fs" / "cgroup" / "cgroup.controllers").write_text("cpu\n")
    c = collector(tmp_path, {"r-40": [40]})
    assert series(c) == {
        ("running_seconds_total", "r-40"): 3.0,
        ("waiting_seconds_total", "r-40"): 4.0,
    }
    for tid in (40, 41):
        (proc / "40" / "task" / str(tid) / "schedstat").unlink()
        (proc / str(tid) / "schedstat").unlink()
    assert series(c) == {
        ("running_seconds_total", "r-40"): 3.0,
        ("waiting_seconds_total", "r-40"): 4.0,
    }


# -- a real CPU-bound process that waits for its CPU -------------------------------------


BUSY = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 30: pass\n"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat): the kernel's other account of its CPU."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_real_busy_process_sharing_one_cpu_waits_most_of_the_time() -> None:
    """Four busy loops pinned to the same CPU: each runs about a quarter of the time and
    waits in the run queue for the rest (more where other work shares that CPU too). The
    job is one of them (an SDK job, found through its pid): over 1.5 s its threads were
    runnable all the time, waited for most of it, and the time they ran is the CPU time
    /proc/PID/stat counts for the process."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(4)]
    try:
        for p in procs:
            os.sched_setaffinity(p.pid, {cpu})
        job = procs[0].pid
        c = JobCpuCollector(CollectorContext(), lambda: {"r-busy": [job]})
        time.sleep(0.2)  # past the interpreter's start-up
        first, cpu0 = series(c), cpu_seconds(job)
        time.sleep(1.5)
        second, cpu1 = series(c), cpu_seconds(job)
        key = "r-busy"
        run = second[("running_seconds_total", key)] - first[("running_seconds_total", key)]
        wait = second[("waiting_seconds_total", key)] - first[("waiting_seconds_total", key)]
        share = wait / (wait + run)
        print(
            f"ran {run:.3f} s (stat: {cpu1 - cpu0:.3f} s), waited {wait:.3f} s, share {share:.2f}"
        )
        assert run + wait > 1.2  # runnable all the time (a busy loop never sleeps)
        assert share > 0.6
        assert abs(run - (cpu1 - cpu0)) < 0.05 + 0.2 * run
    finally:
        for p in procs:
            p.kill()
            p.wait()
