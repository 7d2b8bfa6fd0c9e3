"""The multi-node lab's short form, with real parts: two "nodes" (network namespaces joined
by veth to a bridge), each with its own agent, loop-mounted tiers, SDK socket and rank
cgroup, one real torch.distributed (gloo) DDP job across them under `gpufeed run`, and a
real fault on one node (its link rate-limited with tc tbf).

Checked: the fault really slowed the job (a rank's own step times: a stall the lab did not
cause would make any agent reading meaningless), every node's agent ran in its own
namespace under its own instance name and heard the job under the one job id the launcher
set, its recordings are saved, and nothing of the run is left on the host (also when the
harness is stopped with SIGTERM in the middle of a fault).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from host_needs import missing
from lab.multinode import report
from lab.multinode.host import host_problem, leftovers
from lab.multinode.scenario import load
from lab.scenario import ScenarioError

REPO = Path(__file__).parents[1]
SCENARIOS = REPO / "lab" / "scenarios"
SHORT = SCENARIOS / "mn2-short.yaml"


def _needs_host() -> None:
    problem = host_problem()
    if problem is not None:
        missing(problem)


def _run(results: Path, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "lab.multinode.run", str(SHORT), "--results", str(results), *more],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_every_multinode_scenario_loads() -> None:
    names = sorted(p.stem for p in SCENARIOS.glob("mn*.yaml"))
    assert len(names) >= 7, names
    for p in SCENARIOS.glob("mn*.yaml"):
        plan = load(p)
        assert 2 <= plan.scenario.nodes <= 4
        assert plan.faults, f"{p.name}: a lab scenario without a fault"


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        ("nodes: 2", "nodes: 1"),
        ("node: 1, start_s: 8", "node: 5, start_s: 8"),
        ("stop_s: 20", "stop_s: 99"),
        ("kind: link_rate_limit", "kind: netem"),
        ("hidden: 512", "hidden: -1"),
        ("min_window_seconds: 15", "min_window: 15"),
        ("rate: 8mbit", "rate_mbit: 8"),
    ],
)
def test_bad_scenarios_are_one_line_errors(tmp_path: Path, edit: str, error: str) -> None:
    bad = tmp_path / "mn2-short.yaml"
    bad.write_text(SHORT.read_text().replace(edit, error, 1))
    with pytest.raises(ScenarioError) as exc:
        load(bad)
    assert "mn2-short.yaml" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.slow
@pytest.mark.root
def test_two_nodes_link_fault_recorded_and_cleaned_up(tmp_path: Path) -> None:
    _needs_host()
    proc = _run(tmp_path)
    _, err = proc.communicate(timeout=240)
    print(err[-3000:])
    assert proc.returncode == 0, err[-2000:]
    out = tmp_path / "mn2-short"
    run = json.loads((out / "run.json").read_text())
    assert run["ok"] and leftovers(run["prefix"], run["harness_pid"]) == []

    # the fault made the job slower on every rank: DDP waits for the slow link
    (start,) = [e["t_rel_s"] for e in run["events"] if e["event"] == "fault apply"]
    (stop,) = [e["t_rel_s"] for e in run["events"] if e["event"] == "fault lift"]
    for n in run["nodes"]:
        steps = report.read_steps(out / f"node-{n['index']}" / "steps.jsonl")
        before = report.step_times(steps, run["t0"], 0, start)
        during = report.step_times(steps, run["t0"], start + 1, stop)
        assert before and during, n
        slow = sum(during) / len(during) / (sum(before) / len(before))
        print(f"node {n['index']}: step time x{slow:.1f} under the fault")
        assert slow > 3, f"node {n['index']}: the rate limit did not slow the job ({slow:.2f}x)"
        assert n["rank_exit"] == 0

    instances = [n["instance"] for n in run["nodes"]]
    assert instances == [f"node-{i}:{instances[i].split(':')[1]}" for i in range(2)]
    for n in run["nodes"]:
        d = out / f"node-{n['index']}"
        metrics = (d / "metrics.prom").read_text()
        # the job reached this node's agent through this node's SDK socket, under one id
        assert f'gpufeed_job_steps_total{{job_id="{run["job_id"]}"' in metrics
        # the agent sees its own namespace's link (eth0), not the host's interfaces
        devices = {
            line.split('device="')[1].split('"')[0]
            for line in metrics.splitlines()
            if line.startswith("gpufeed_network_receive_bytes_total{")
        }
        assert devices == {"eth0"}, devices
        trace = (d / "trace.om").read_text()
        assert trace.rstrip().endswith("# EOF") and f'instance="{n["instance"]}"' in trace
        assert "windows" in json.loads((d / "api-windows.json").read_text())


@pytest.mark.slow
@pytest.mark.root
def test_sigterm_mid_fault_leaves_nothing_behind(tmp_path: Path) -> None:
    _needs_host()
    proc = _run(tmp_path)
    assert proc.stderr is not None
    deadline = time.monotonic() + 180
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "fault apply" in line:
            break
        assert time.monotonic() < deadline, "".join(seen)
    else:
        pytest.fail("the run ended before its fault: " + "".join(seen[-20:]))
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(seen) + rest
    run = json.loads((tmp_path / "mn2-short" / "run.json").read_text())
    assert run["ok"] is False and "SIGTERM" in run["error"]
    assert leftovers(run["prefix"], run["harness_pid"]) == []
    for n in run["nodes"]:  # the job cgroups the run made, by name
        assert n["cgroup_tops"] and not any(Path(d).exists() for d in n["cgroup_tops"])
