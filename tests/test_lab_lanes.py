"""`lab.run --jobs N` deals scenarios to N lanes that run side by side (make lab's track A):
longest first, each to the lane that ends soonest; with one lane, the suite's order."""

from __future__ import annotations

from lab.run import Group, lanes
from lab.scenario import find


def _names(plan: list[list[Group]]) -> list[list[str]]:
    return [[s.name for s, _ in lane] for lane in plan]


def test_two_lanes_put_the_longest_scenario_alone() -> None:
    groups: list[Group] = [
        (find(n), ["run", "sdk"]) for n in ("s3-slow", "single-node", "startup-idle")
    ]
    # single-node (630 s) against startup-idle (290 s) then s3-slow (220 s)
    assert _names(lanes(groups, 2)) == [["single-node"], ["startup-idle", "s3-slow"]]


def test_one_lane_keeps_the_order_and_more_lanes_than_groups_are_dropped() -> None:
    groups: list[Group] = [(find(n), ["run"]) for n in ("s3-slow", "single-node")]
    assert _names(lanes(groups, 1)) == [["s3-slow", "single-node"]]
    assert _names(lanes(groups, 4)) == [["single-node"], ["s3-slow"]]
    assert lanes([], 3) == []
