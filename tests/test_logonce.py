"""The agent's one log-once helper: one behaviour for conditions and for floods."""

from __future__ import annotations

import logging

import pytest

from gpufeed.logonce import MAX_REMEMBERED, LogOnce


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_condition_is_logged_once_while_it_lasts_and_again_after_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    once = LogOnce(logging.getLogger("test.once"))
    with caplog.at_level(logging.INFO, "test.once"):
        for _ in range(100):
            once.log(logging.WARNING, "diskstats", "cannot read %s", "/proc/diskstats")
        once.clear("diskstats", "%s readable again", "/proc/diskstats")
        once.clear("diskstats", "said only once: %s", "x")  # no longer active: no line
        once.clear("never-logged", "not said: %s", "x")
        once.log(logging.WARNING, "diskstats", "cannot read %s", "/proc/diskstats")
    assert lines(caplog) == [
        "cannot read /proc/diskstats",
        "/proc/diskstats readable again",
        "cannot read /proc/diskstats",
    ]


def test_a_flood_gets_one_line_per_interval_that_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    once = LogOnce(logging.getLogger("test.flood"), repeat_after_seconds=10.0, clock=clock)
    with caplog.at_level(logging.INFO, "test.flood"):
        for _ in range(300):
            once.log(logging.ERROR, "accept", "cannot accept")
        clock.now = 9.9
        once.log(logging.ERROR, "accept", "cannot accept")
        clock.now = 10.0
        once.log(logging.ERROR, "accept", "cannot accept")
        clock.now = 25.0
        once.log(logging.ERROR, "accept", "cannot accept")
    assert lines(caplog) == [
        "cannot accept",
        "cannot accept (300 more like this since the last such line, not logged)",
        "cannot accept",
    ]


def test_report_logs_new_problems_and_forgets_those_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    once = LogOnce(logging.getLogger("test.report"))
    with caplog.at_level(logging.INFO, "test.report"):
        once.report(logging.WARNING, ["a broken", "b broken"])
        once.report(logging.WARNING, ["b broken", "a broken"])
        once.report(logging.WARNING, ["b broken"])
        once.report(logging.WARNING, ["a broken", "b broken"])  # a is back
    assert lines(caplog) == ["a broken", "b broken", "a broken"]


def test_a_disabled_level_writes_nothing_and_remembers_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    once = LogOnce(logging.getLogger("test.level"))
    with caplog.at_level(logging.WARNING, "test.level"):
        assert not once.log(logging.DEBUG, "k", "debug only")
        assert once.log(logging.WARNING, "k", "now it shows")
    assert lines(caplog) == ["now it shows"]


def test_memory_stays_bounded_under_ever_new_keys(caplog: pytest.LogCaptureFixture) -> None:
    once = LogOnce(logging.getLogger("test.bound"))
    with caplog.at_level(logging.ERROR, "test.bound"):
        for i in range(5 * MAX_REMEMBERED):
            once.log(logging.ERROR, i, "garbage %d", i)
    assert len(once._active) <= MAX_REMEMBERED
    assert len(caplog.records) == 5 * MAX_REMEMBERED
