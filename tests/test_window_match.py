"""The tolerance a TSDB's windows are compared with (tests/window_match.py) lets through
VictoriaMetrics' last digits and nothing else."""

from __future__ import annotations

import json

import pytest

from window_match import assert_same_windows, window_differences

WANT = {
    "instance": "n1:9842", "gpu": "4", "job_id": "j1", "start": 1700004575.0,
    "end": 1700004860.0, "cause": "checkpointing", "confidence": 0.676,
    "mean_utilization": 0.0035,
    "evidence": {"write_burst_x_baseline": 138.0321, "checkpoint_tier": "hot",
                 "summary": "write burst to the hot tier 138x normal"},
}  # fmt: skip


def _with(path: tuple[str, ...], value: object) -> dict[str, object]:
    w = json.loads(json.dumps(WANT))
    d = w
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return w


@pytest.mark.parametrize(
    "path, value",
    [
        (("evidence", "write_burst_x_baseline"), 138.0512),  # the drift CI saw: 1.4e-4
        (("evidence", "summary"), "write burst to the hot tier 139x normal"),  # rounding edge
        (("confidence",), 0.6761),
        (("mean_utilization",), 0.0035000001),
    ],
)
def test_last_digits_match(path: tuple[str, ...], value: object) -> None:
    assert window_differences([WANT], [_with(path, value)]) == []
    assert_same_windows(json.dumps(WANT) + "\n", (json.dumps(_with(path, value)) + "\n").encode())


@pytest.mark.parametrize(
    "path, value",
    [
        (("evidence", "write_burst_x_baseline"), 139.5),
        (("evidence", "checkpoint_tier"), "warm"),
        (("evidence", "summary"), "write burst to the warm tier 138x normal"),
        (("cause",), "data_loading"),
        (("start",), 1700004590.0),
        (("end",), 1700004845.0),
        (("confidence",), 0.7),
        (("evidence", "extra"), 1.0),
    ],
)
def test_a_real_difference_does_not(path: tuple[str, ...], value: object) -> None:
    diffs = window_differences([WANT], [_with(path, value)])
    assert len(diffs) == 1 and "checkpointing" in diffs[0]
    with pytest.raises(AssertionError, match="want"):
        assert_same_windows([WANT], [_with(path, value)])


def test_a_missing_window_does_not() -> None:
    assert window_differences([WANT, WANT], [WANT]) == ["2 windows wanted, 1 got"]
