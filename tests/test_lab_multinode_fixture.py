"""A recorded two-node lab run (tests/fixtures/lab/mn2-tier-throttle/: node 1's data tier
read-limited, see its run.json) is the multi-node test bed's data for issue 13: what each
node's agent recorded (`--record` traces, gzipped) and said live (/api/windows), and the
ranks' own step timings.

Checked here: the recording is whole (every node's trace ends in `# EOF` and carries its own
instance and the job's one id), the fault is in it (the ranks' steps slow down during the
schedule's fault interval), and `gpufeed analyze` over node 1's trace (the culprit's), with
the agents' correlator settings, names that node's own cause for most of the fault, and
the per-rank collective wait says who waited for whom.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab.multinode import report

FIXTURE = Path(__file__).parent / "fixtures" / "lab" / "mn2-tier-throttle"


def _analyze(trace: Path, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """`gpufeed analyze` of a recorded trace with the run's own window settings."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufeed",
            "analyze",
            str(trace),
            "--min-window",
            str(settings["min_window_seconds"]),
            "--merge-gap",
            str(settings["merge_gap_seconds"]),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def _run() -> dict[str, Any]:
    return json.loads((FIXTURE / "run.json").read_text())


def test_recording_is_whole_and_holds_the_fault() -> None:
    run = _run()
    assert run["ok"] and len(run["nodes"]) == 2
    (start,) = [e["t_rel_s"] for e in run["events"] if e["event"] == "fault apply"]
    (stop,) = [e["t_rel_s"] for e in run["events"] if e["event"] == "fault lift"]
    for n in run["nodes"]:
        d = FIXTURE / f"node-{n['index']}"
        trace = gzip.decompress((d / "trace.om.gz").read_bytes()).decode()
        assert trace.rstrip().endswith("# EOF")
        assert f'instance="{n["instance"]}"' in trace
        assert f'job_id="{run["job_id"]}"' in trace
        steps = report.read_steps(d / "steps.jsonl")
        before = report.step_times(steps, run["t0"], 0, start)
        during = report.step_times(steps, run["t0"], start + 1, stop)
        assert sum(during) / len(during) > 2 * sum(before) / len(before)


def test_offline_analysis_names_the_culprit_nodes_own_cause() -> None:
    """Node 1's trace alone, analysed offline with the agents' settings, names its own cause
    (data_loading on the hot tier) for most of the fault: a regression test of the per-node
    reading the job-level one builds on (the victims are issue 13's to name)."""
    run = _run()
    (start,) = [e["t"] for e in run["events"] if e["event"] == "fault apply"]
    (stop,) = [e["t"] for e in run["events"] if e["event"] == "fault lift"]
    trace = FIXTURE / "node-1" / "trace.om.gz"  # read compressed, as stored
    windows = _analyze(trace, run["agent_correlator"])
    named = sum(
        max(0.0, min(w["end"], stop) - max(w["start"], start))
        for w in windows
        if w["cause"] == "data_loading" and w["evidence"].get("data_tier") == "hot"
    )
    assert named >= 0.8 * (stop - start), f"data_loading on hot for {named:.1f} s"
    assert all(w["instance"] == run["nodes"][1]["instance"] for w in windows)


def _collective_wait_s(trace: str, t_from: float, t_to: float) -> float:
    """Seconds the node's rank spent in collectives between two unix times, from the
    trace's per-rank counter (gpufeed run's collective timing)."""
    points = []
    for line in trace.splitlines():
        if line.startswith("gpufeed_job_rank_phase_seconds_total{") and (
            'phase="collective_wait"' in line
        ):
            value, ts = line.rsplit(" ", 2)[1:]
            points.append((float(ts), float(value)))
    assert points, "no per-rank collective_wait in the trace"

    def at(t: float) -> float:
        return max((v for ts, v in points if ts <= t), default=0.0)

    return at(t_to) - at(t_from)


def test_the_victim_waits_in_collectives_the_culprit_does_not() -> None:
    """Who arrives last: during node 1's tier fault, node 0's rank (the victim) spends most
    of the time inside the all-reduce waiting for node 1, whose rank waits for its data
    instead. The recording carries that per-rank signal for the job-level reading."""
    run = _run()
    (start,) = [e["t"] for e in run["events"] if e["event"] == "fault apply"]
    (stop,) = [e["t"] for e in run["events"] if e["event"] == "fault lift"]
    waits = []
    for node in (0, 1):
        trace = gzip.decompress((FIXTURE / f"node-{node}" / "trace.om.gz").read_bytes())
        waits.append(_collective_wait_s(trace.decode(), start + 2, stop))
    print(f"collective wait during the fault: victim {waits[0]:.1f} s, culprit {waits[1]:.1f} s")
    assert waits[0] > 0.5 * (stop - start - 2) and waits[1] < 0.25 * waits[0]


def test_job_level_analysis_names_node_1_for_node_0s_stall(tmp_path: Path) -> None:
    """Both nodes' traces joined (docs/correlator.md, "The job level") and analysed offline
    with the agents' settings: the victim (node 0, a CPU-only gloo rank whose wait for the
    all-reduce lies inside its `compute` phase) gets a `straggler` window over the fault
    naming node 1 and its data_loading, because its stand-in for utilization takes off the
    collective wait above the job's healthy level (0.17 s/s healthy, 0.93 during the fault);
    node 1 keeps its own data_loading; nothing opens in the healthy time around the fault
    (the stand-in stays at 0.88 or more there)."""
    run = _run()
    (start,) = [e["t"] for e in run["events"] if e["event"] == "fault apply"]
    (stop,) = [e["t"] for e in run["events"] if e["event"] == "fault lift"]
    victim, culprit = (n["instance"] for n in sorted(run["nodes"], key=lambda n: n["index"]))
    joined = []
    for node in (0, 1):
        text = gzip.decompress((FIXTURE / f"node-{node}" / "trace.om.gz").read_bytes())
        joined += [ln for ln in text.decode().splitlines() if ln != "# EOF"]
    trace = tmp_path / "job.om"
    trace.write_text("\n".join([*joined, "# EOF", ""]))
    windows = _analyze(trace, run["agent_correlator"])

    def overlap(w: dict[str, Any]) -> float:
        return max(0.0, min(w["end"], stop) - max(w["start"], start))

    stragglers = [w for w in windows if w["instance"] == victim and w["cause"] == "straggler"]
    assert stragglers, "node 0 has no straggler window"
    assert sum(overlap(w) for w in stragglers) >= 0.8 * (stop - start)
    for w in stragglers:
        assert w["evidence"]["culprit"]["instance"] == culprit
        assert w["evidence"]["culprit"]["cause"] == "data_loading"
        assert culprit in w["evidence"]["summary"]
    named = sum(
        overlap(w) for w in windows if w["instance"] == culprit and w["cause"] == "data_loading"
    )
    assert named >= 0.8 * (stop - start), f"node 1: data_loading for {named:.1f} s"
    # healthy time: no window before the fault; after the lift only the job's recovery
    # (the 5 s share window and one step: node 1's own window ends 6 s after it too)
    for w in windows:
        assert w["start"] >= start and w["end"] <= stop + 10, w
    assert {w["instance"] for w in windows} == {victim, culprit}
