"""A recorded two-node lab run (tests/fixtures/lab/mn2-tier-throttle/: node 1's data tier
read-limited, see its run.json) is the multi-node test bed's data for issue 13: what each
node's agent recorded (`--record` traces, gzipped) and said live (/api/windows), and the
ranks' own step timings.

Checked here: the recording is whole (every node's trace ends in `# EOF` and carries its own
instance and the job's one id), the fault is in it (the ranks' steps slow down during the
schedule's fault interval), and `gpufeed analyze` over node 1's trace (the culprit's), with
the agents' correlator settings, names that node's own cause for most of the fault.
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


def test_offline_analysis_names_the_culprit_nodes_own_cause(tmp_path: Path) -> None:
    """Node 1's trace alone, analysed offline with the agents' settings, names its own cause
    (data_loading on the hot tier) for most of the fault: a regression test of the per-node
    reading the job-level one builds on (the victims are issue 13's to name)."""
    run = _run()
    (start,) = [e["t"] for e in run["events"] if e["event"] == "fault apply"]
    (stop,) = [e["t"] for e in run["events"] if e["event"] == "fault lift"]
    trace = tmp_path / "trace.om"
    trace.write_bytes(gzip.decompress((FIXTURE / "node-1" / "trace.om.gz").read_bytes()))
    settings = run["agent_correlator"]
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
    windows = [json.loads(line) for line in done.stdout.splitlines()]
    named = sum(
        max(0.0, min(w["end"], stop) - max(w["start"], start))
        for w in windows
        if w["cause"] == "data_loading" and w["evidence"].get("data_tier") == "hot"
    )
    print(windows)
    assert named >= 0.8 * (stop - start), f"data_loading on hot for {named:.1f} s"
    assert all(w["instance"] == run["nodes"][1]["instance"] for w in windows)
