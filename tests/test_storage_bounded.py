"""BoundedCalls: hung calls are cut off, remembered as stuck, and never started twice."""

from __future__ import annotations

import threading
import time

import pytest

from gpufeed.storage.bounded import BoundedCalls


def test_results_errors_and_order() -> None:
    def boom() -> int:
        raise OSError(5, "Input/output error")

    out = BoundedCalls(0.5).run([("a", lambda: 1), ("b", boom), ("c", lambda: 3)])
    assert (out["a"].status, out["a"].value) == ("ok", 1)
    assert out["b"].status == "error" and isinstance(out["b"].error, OSError)
    assert (out["c"].status, out["c"].value) == ("ok", 3)


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
def test_hung_calls_are_stuck_later_ones_skipped_then_answered() -> None:
    release = threading.Event()
    started: list[str] = []

    def hang(key: str) -> str:
        started.append(key)
        release.wait(30)
        return key

    calls = BoundedCalls(0.1, overall_seconds=0.2)
    batch = [
        ("h1", lambda: hang("h1")),
        ("h2", lambda: hang("h2")),
        ("ok", lambda: "fine"),
    ]
    try:
        t0 = time.monotonic()
        first = calls.run(batch)
        elapsed = time.monotonic() - t0
        assert 0.15 < elapsed < 0.6
        # h1 hung past its 0.1 s; h2 took the rest of the 0.2 s budget; "ok" was not reached
        assert [first[k].status for k in ("h1", "h2", "ok")] == ["stuck", "stuck", "skipped"]
        t0 = time.monotonic()
        second = calls.run(batch)
        assert time.monotonic() - t0 < 0.1  # the stuck keys are not waited on again
        assert [second[k].status for k in ("h1", "h2", "ok")] == ["stuck", "stuck", "ok"]
        assert second["h1"].stuck_seconds >= 0.15
        assert started == ["h1", "h2"]  # no second call on a key still in flight
        assert set(calls.in_flight()) == {"h1", "h2"}
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while calls.in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    third = calls.run(batch)
    assert [third[k].value for k in ("h1", "h2", "ok")] == ["h1", "h2", "fine"]


def test_duplicate_keys_run_once() -> None:
    n = []
    out = BoundedCalls(0.5).run([("k", lambda: n.append(1)), ("k", lambda: n.append(2))])
    assert n == [1] and out["k"].status == "ok"


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        BoundedCalls(0)
