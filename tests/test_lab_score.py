"""The lab's scorer on hand-made runs whose right answers are worked out by hand."""

from __future__ import annotations

import pytest

from lab import scenario as sc
from lab.score import LabWindow, NodeRun, Sighting, Step, intersect, score, subtract, union

SCEN = sc.parse(
    {
        "name": "t",
        "duration_s": 400,
        "settle_s": 20,
        "workload": {"data_tier": "hot"},
        "tiers": {"hot": {"size_mib": 64}},
        "expect": [
            {"start_s": 100, "stop_s": 200, "cause": "data_loading", "evidence": {"tier": "hot"}},
            {"start_s": 250, "stop_s": 350, "cause": "preprocessing"},
        ],
    }
)


def steps(slow: list[tuple[float, float]], until: float = 400.0) -> tuple[Step, ...]:
    """A step every 0.1 s, every 1 s inside the `slow` spans."""
    out, t = [], 0.0
    while t < until:
        gap = 1.0 if any(s <= t < e for s, e in slow) else 0.1
        t += gap
        out.append(Step(t, gap, 0.05))
    return tuple(out)


def test_interval_arithmetic() -> None:
    assert union([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    assert intersect([(0, 10)], [(2, 3), (8, 12)]) == [(2, 3), (8, 10)]
    assert subtract([(0, 10)], [(2, 3), (8, 12)]) == [(0, 2), (3, 8)]


def test_time_weighted_scores_detection_and_evidence() -> None:
    run = NodeRun(
        0,
        windows=(
            # right cause from 110 to 210 (10 s late, 10 s over), names the tier
            LabWindow(
                110, 210, "data_loading", (("data_tier", "hot"),), "waits for data: hot tier"
            ),
            # half of the preprocessing time called data_loading, half right
            LabWindow(250, 300, "data_loading", (("data_tier", "warm"),)),
            LabWindow(300, 350, "preprocessing"),
        ),
        steps=steps([(100, 200), (250, 350)]),
        sightings=(Sighting(175.0, 110.0, "data_loading"), Sighting(340.0, 300.0, "preprocessing")),
    )
    s = score(SCEN, [run])
    causes = {c.cause: c for c in s.causes}
    dl = causes["data_loading"]
    assert (dl.truth_s, dl.said_s, dl.agree_s) == (100, 150, 90)
    assert dl.precision == pytest.approx(0.6) and dl.recall == pytest.approx(0.9)
    assert causes["preprocessing"].recall == pytest.approx(0.5)
    # healthy: 20-100, 200-250, 350-400 = 180 s; 200-210 is inside a window
    assert s.healthy_s == 180 and s.healthy_in_window == pytest.approx(10 / 180)
    e1, e2 = s.entries
    assert e1.bit and e1.throughput_ratio == pytest.approx(0.1, abs=0.01)
    assert e1.recall == pytest.approx(0.9) and e1.detect_s == 75 and not e1.detect_estimated
    assert e1.evidence["tier"]["in_evidence"] == 1.0 and e1.evidence["tier"]["in_summary"] == 1.0
    assert e1.passed()
    assert e2.recall == pytest.approx(0.5) and e2.detect_s == 90 and not e2.passed()
    assert e2.caused_as == {"data_loading": 50, "preprocessing": 50}
    assert not s.passed()
    assert s.to_json()["causes"]["data_loading"]["f1"] == pytest.approx(0.72)


def test_a_fault_that_did_not_bite_is_not_scored() -> None:
    # only the first fault slowed the job: the second entry is reported, and neither counts
    # as truth nor as healthy time (the window inside it is no false positive)
    run = NodeRun(
        0,
        windows=(LabWindow(100, 200, "data_loading"), LabWindow(260, 300, "network")),
        steps=steps([(100, 200)]),
    )
    s = score(SCEN, [run])
    e1, e2 = s.entries
    assert e1.bit and not e2.bit and e2.throughput_ratio == pytest.approx(1.0, abs=0.02)
    assert e2.recall is None and e2.caused_as == {"network": 40}
    assert {c.cause for c in s.causes} == {"data_loading"}
    assert s.healthy_in_window_s == 0 and s.healthy_s == 180
    # detection estimated from the window's start when the runner saw nothing
    assert e1.detect_s == 60 and e1.detect_estimated
    assert s.passed()


def test_a_run_that_ended_early_scores_what_ran() -> None:
    run = NodeRun(0, windows=(), steps=steps([], until=150), ran_s=150)
    s = score(SCEN, [run])
    assert s.healthy_s == 80  # 20-100 only
    e1, e2 = s.entries
    assert not e1.bit and e1.throughput_ratio == pytest.approx(1.0, abs=0.02)  # 100-150 only
    assert not e2.bit and e2.throughput_ratio is None
