"""Where a CPU-only job's window begins and ends. Its stand-in for utilization is its
compute share over the last few seconds, a trailing average that crosses the threshold
seconds after the job did; in the fault lab every window of a CPU job began 2-3 s after its
stall and ended 3-6 s after its recovery, which was most of the healthy time inside a
window (5.4% and 6.0% of it, target 5%). The edges must be where the job's own samples
cross, within a sample interval, and a recovery that does not last must not end a window.
"""

from __future__ import annotations

from collections.abc import Callable

from correlator_helpers import T0, analyze_text, trace_text
from gpufeed.correlator.engine.window import Window
from test_correlator_evidence import healthy_host, job_io, node, phases

STALL = (600.0, 900.0)  # seconds into the trace
HEALTHY_READ = 12e6


def _windows(
    stalled: object, tmp_path: object, healthy_share: Callable[[float], float] = lambda s: 0.95
) -> list[Window]:
    """`healthy_share(s)`: the job's compute share at s when it is not stalled."""

    def job(s: float) -> dict[str, float]:
        if stalled(s):  # type: ignore[operator]
            return {**phases(0.4, 0.6), **job_io(5e5, 1e4)}
        share = healthy_share(s)
        return {**phases(share, 1.0 - share), **job_io(HEALTHY_READ, 1e4)}

    return analyze_text(trace_text(node(job, healthy_host), 1200, interval=1.0), tmp_path)


def test_a_cpu_jobs_window_starts_and_ends_with_its_stall(tmp_path: object) -> None:
    (w,) = _windows(lambda s: STALL[0] <= s < STALL[1], tmp_path)
    start, end = w.start_seconds - T0, w.end_seconds - T0
    print(f"stall {STALL}, window {start:.0f}..{end:.0f} ({w.cause.value})")
    # the generator's sample at s carries the interval (s-1, s]: the job's counters say it
    # stalled from 599 and was healthy again from 899; one sample interval either way
    assert STALL[0] - 1 <= start <= STALL[0] + 1, (start, end)
    assert STALL[1] - 1 <= end <= STALL[1] + 1, (start, end)


def test_a_short_recovery_stays_inside_the_window(tmp_path: object) -> None:
    """Healthy for 10 s in the middle (shorter than the 30 s merge gap): one window, which
    still ends where the stall does, not at the short recovery."""
    (w,) = _windows(lambda s: STALL[0] <= s < STALL[1] and not 700 <= s < 710, tmp_path)
    start, end = w.start_seconds - T0, w.end_seconds - T0
    assert STALL[0] - 1 <= start <= STALL[0] + 1, (start, end)
    assert STALL[1] - 1 <= end <= STALL[1] + 1, (start, end)


def test_a_dip_before_a_longer_recovery_is_not_the_start_of_the_stall(
    tmp_path: object,
) -> None:
    """Measured in the fault lab: one low second 29 s before CPU hogs bit (a dip on a loaded
    host) was joined to the hogs' run by the 30 s merge gap, and the window began 28 s
    before the fault. A recovery longer than all the low time before it ends that run."""
    dip = (STALL[0] - 31, STALL[0] - 29)
    (w,) = _windows(lambda s: dip[0] <= s < dip[1] or STALL[0] <= s < STALL[1], tmp_path)
    start, end = w.start_seconds - T0, w.end_seconds - T0
    assert STALL[0] - 1 <= start <= STALL[0] + 1, (start, end)
    assert STALL[1] - 1 <= end <= STALL[1] + 1, (start, end)


def test_one_noisy_interval_after_the_recovery_does_not_hold_the_end(
    tmp_path: object,
) -> None:
    """A healthy job's share over one second is noisy on a loaded host; in the lab one
    interval at 0.79 two seconds after the recovery held the window's end there. The end is
    where the job's intervals change sides, not the first one that is just on the old side."""
    (w,) = _windows(
        lambda s: STALL[0] <= s < STALL[1],
        tmp_path,
        healthy_share=lambda s: 0.78 if STALL[1] + 2 <= s < STALL[1] + 3 else 0.95,
    )
    start, end = w.start_seconds - T0, w.end_seconds - T0
    assert STALL[1] - 1 <= end <= STALL[1] + 1, (start, end)
