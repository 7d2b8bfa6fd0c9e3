"""A recorded two-node lab run (tests/fixtures/lab/mn2-tier-throttle/: node 1's data tier
read-limited, see its run.json) is the multi-node test bed's data for issue 13: what each
node's agent recorded (`--record` traces, gzipped) and said live (/api/windows), and the
ranks' own step timings.

Checked here: the recording is whole (every node's trace ends in `# EOF` and carries its own
instance and the job's one id), the fault is in it (the ranks' steps slow down during the
schedule's fault interval), and `gpufeed analyze` over each node's trace, with the agents'
correlator settings, gives the windows that node's agent reported live: the offline reading
of a real multi-node recording agrees with the live one.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.multinode import report

FIXTURE = Path(__file__).parent / "fixtures" / "lab" / "mn2-tier-throttle"


def _run() -> dict[str, Any]:
    return json.loads((FIXTURE / "run.json").read_text())


def _live(node: int) -> list[dict[str, Any]]:
    said = json.loads((FIXTURE / f"node-{node}" / "api-windows.json").read_text())
    return [*said["windows"], *said["open"]]


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


@pytest.mark.parametrize("node", [0, 1])
def test_offline_analysis_of_each_node_agrees_with_its_live_windows(
    tmp_path: Path, node: int
) -> None:
    run = _run()
    trace = tmp_path / "trace.om"
    trace.write_bytes(gzip.decompress((FIXTURE / f"node-{node}" / "trace.om.gz").read_bytes()))
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
    offline = [json.loads(line) for line in done.stdout.splitlines()]
    live = _live(node)
    assert [(round(w["start"]), w["cause"]) for w in offline] == [
        (round(w["start"]), w["cause"]) for w in live
    ]
