"""`lab.run --jobs N` deals scenarios to N lanes that run side by side (make lab's track A):
longest first, each to the lane that ends soonest; with one lane, the suite's order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


_SPLICE = """
import sys, threading
from lab.run import say
def w(tag):
    for i in range(3000):
        say(f"  [{tag}] {i:6d} s  start cpu_hog")
ts = [threading.Thread(target=w, args=(t,)) for t in ("run", "sdk", "abc", "def")]
[t.start() for t in ts]
[t.join() for t in ts]
"""


def test_runs_printing_side_by_side_never_splice_a_line() -> None:
    """The runs of a scenario print their fault lines from threads side by side (into a
    pipe, as `make lab` and the tests read them): every line arrives whole. print(), which
    writes the text and its newline apart, spliced 500 to 1,400 of these 12,000 lines."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", _SPLICE],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        # unbuffered, as CI's environment runs the lab (each write goes out at once)
        env={"PYTHONPATH": f"{root}:{root / 'exporter'}", "PYTHONUNBUFFERED": "1"},
    ).stdout.splitlines()
    line = re.compile(r"^  \[[a-z]{3}\] +\d+ s  start cpu_hog$")
    assert len(out) == 12000
    assert [s for s in out if not line.match(s)] == []
