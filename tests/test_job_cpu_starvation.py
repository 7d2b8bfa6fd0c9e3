"""What the job's own CPU readings say without a healthy past (issue 23): a starved input
pipeline has a thread runnable all the time, most of it waiting; a loader asleep in its
`__getitem__` on a busy host wakes briefly and waits at its wakeups. The engine's feature
functions on their own, table-driven (tests/test_correlator_evidence.py plays whole runs)."""

from __future__ import annotations

import pytest

from gpufeed.correlator.engine.baseline import Baselines, Kind
from gpufeed.correlator.engine.features import (
    Evidence,
    _threads_asleep,
    job_cpu_wait_ratio,
)
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.view import JobView

JOB = "j1"


def job(waiting: float, runnable: float) -> JobView:
    return JobView(cpu_waiting_per_second=waiting, cpu_runnable_per_second=runnable)


def baselines(runnable_buckets: list[float]) -> Baselines:
    b = Baselines()
    for v in runnable_buckets:
        b.observe((Kind.JOB_CPU_RUNNABLE, JOB), v)
    return b


@pytest.mark.parametrize(
    ("waiting", "runnable", "usual", "expected"),
    [
        # the sleep loader at load 8: 0.1 s/s runnable, 60% of it waiting: no starvation
        (0.06, 0.1, [], 0.06),
        (0.3, 0.35, [], 0.3),
        # a starved worker pair: runnable all the time, most of it waiting
        (1.8, 2.0, [], 0.9),
        (0.9, 1.0, [], 0.9),
        # over the CPU the job usually wants when that is more than one thread's worth
        (0.9, 1.0, [3.0] * 4, 0.3),
        # a few context switches: nothing worth reading
        (0.01, 0.02, [], None),
    ],
)
def test_the_wait_share_is_over_at_least_one_threads_worth(
    waiting: float, runnable: float, usual: list[float], expected: float | None
) -> None:
    got = job_cpu_wait_ratio(baselines(usual), JOB, job(waiting, runnable))
    assert got == (None if expected is None else pytest.approx(expected))


def host_busy() -> Evidence:
    return Evidence(features={F.CPU_BUSY_RATIO: 0.996, F.CPU_PRESSURE_RATIO: 0.69})


@pytest.mark.parametrize(
    ("runnable", "usual", "asleep"),
    [
        # 75 s of training (two healthy buckets, no median yet) at one thread: now 0.1
        (0.1, [1.0, 0.95], True),
        # the same before any healthy bucket: only the absolute floor says asleep
        (0.1, [], False),
        (0.03, [], True),
        # a CPU-bound loader wants more, not less
        (2.1, [1.0, 0.95], False),
        # with a median (four buckets) as before
        (0.3, [1.0] * 4, True),
        (0.7, [1.0] * 4, False),
    ],
)
def test_threads_that_want_far_less_cpu_than_so_far_sleep(
    runnable: float, usual: list[float], asleep: bool
) -> None:
    ev = host_busy()
    _threads_asleep(baselines(usual), JOB, job(0.05, runnable), ev)
    host = (ev.features[F.CPU_BUSY_RATIO], ev.features[F.CPU_PRESSURE_RATIO])
    assert host == ((0.0, 0.0) if asleep else (0.996, 0.69))


def test_starved_threads_are_not_asleep_whatever_they_want() -> None:
    ev = host_busy()
    ev.features[F.JOB_CPU_THROTTLED_RATIO] = 0.9  # its quota throttles it
    _threads_asleep(baselines([1.0, 1.0]), JOB, job(0.05, 0.1), ev)
    assert ev.features[F.CPU_BUSY_RATIO] == 0.996


def test_early_is_what_healthy_buckets_said_so_far() -> None:
    b = baselines([1.0, 0.5, 0.9])
    key = (Kind.JOB_CPU_RUNNABLE, JOB)
    assert b.median(key) is None  # fewer than MIN_POINTS buckets (two minutes)
    assert b.early(key) == 0.9
    assert b.early((Kind.JOB_CPU_RUNNABLE, "other")) is None
