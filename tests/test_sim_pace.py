"""`--simulate.pace`: a paced simulated node gets the causes of its scenario right.

0.1.0 ran the live correlator on the wall clock, where a 100 s stall at pace 10 lasts 10 s
(shorter than its rate window): data loading came out as preprocessing, preprocessing and
network as unknown. The correlator now runs on the scenario's clock (gpufeed.correlator.feeds.pacing).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from conftest import http_get, wait_for_metrics
from gpufeed.collectors.gpu import build_gpu_collector
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.correlator.feeds.pacing import ScenarioClock
from gpufeed.simulate import build_simulated_node
from gpufeed.snapshot import Snapshot

T0 = 1_700_000_000.0
CYCLE_SECONDS = 480  # the built-in scenario's cycle


def paced_windows(pace: float) -> tuple[list[Window], list[str]]:
    """One cycle of the built-in scenario at `pace`, sampled every wall second through the
    live correlator: (closed windows, the true cause of each by majority over its span)."""
    clock = [0.0]
    backend, collectors, node = build_simulated_node(
        None, seed=1, pace=pace, clock=lambda: clock[0]
    )
    gpu, _ = build_gpu_collector("simulated", simulated=lambda: backend)
    assert gpu is not None
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), instance="sim", pace=pace)
    for i in range(1, int(CYCLE_SECONDS / pace) + 1):
        clock[0] = float(i)
        fams = [*gpu.collect(), *(f for c in collectors for f in c.collect())]
        proc.process(Snapshot(T0 + i, tuple(fams)))
    closed, _ = proc.windows(10_000)
    truths = []
    for w in closed:  # windows are on the wall clock: elapsed wall seconds since T0
        span = range(int(w.start_seconds - T0), int(w.end_seconds - T0) + 1)
        votes = Counter(node.ground_truth(float(k))[int(w.gpu)].cause for k in span)
        truths.append(str(votes.most_common(1)[0][0]))
    return closed, truths


@pytest.mark.parametrize("pace", [1.0, 10.0])
def test_paced_windows_carry_the_scenarios_causes(pace: float) -> None:
    closed, truths = paced_windows(pace)
    got = [w.cause.value for w in closed]
    pairs = Counter(zip(truths, got, strict=True))
    # every cause the cycle closes a window for is found, on the right GPUs
    for cause in ("startup", "preprocessing", "data_loading", "throttling", "network"):
        assert pairs[(cause, cause)] >= 1, pairs
    assert pairs[("data_loading", "data_loading")] == 4, pairs
    assert pairs[("preprocessing", "preprocessing")] == 2, pairs
    assert pairs[("network", "network")] == 2, pairs
    assert pairs[("gpu_error", "gpu_error")] == 1, pairs
    # never a wrong cause; at most the window the agent's first sample cut into is unknown
    wrong = {k: n for k, n in pairs.items() if k[0] != k[1]}
    assert set(wrong) <= {("startup", "unknown")} and sum(wrong.values()) <= 1, pairs
    # windows are reported on the wall clock: a 100 s stall lasts 100 / pace wall seconds
    loading = [w for w, t in zip(closed, truths, strict=True) if t == "data_loading"]
    assert all(abs(w.duration_seconds - 100 / pace) <= 25 / pace for w in loading), loading


def test_scenario_clock_maps_time_and_counters_both_ways() -> None:
    from gpufeed.model import Families

    clock = ScenarioClock(origin_seconds=1000.0, pace=10.0)
    assert clock.to_scenario(1001.0) == 1010.0 and clock.to_wall(1010.0) == 1001.0
    f = Families()
    f.counter("gpufeed_storage_read_bytes_total", "b", {"tier": "warm"}, 2.2e9)
    f.counter("gpufeed_gpu_xid_errors_total", "x", {"gpu": "0", "xid": "79"}, 1.0)
    f.gauge("gpufeed_gpu_utilization_ratio", "u", {"gpu": "0"}, 0.5)
    f.gauge("gpufeed_not_read_by_the_correlator", "n", {}, 1.0)
    snap = clock.snapshot(Snapshot(1001.0, tuple(f.build())))
    values = {fam.name: fam.samples[0].value for fam in snap.families}
    assert snap.timestamp_seconds == 1010.0
    assert values == {
        # bytes per wall second stay bytes per scenario second
        "gpufeed_storage_read_bytes_total": 2.2e10,
        "gpufeed_gpu_xid_errors_total": 1.0,  # one event is one event at any pace
        "gpufeed_gpu_utilization_ratio": 0.5,
    }


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_agent_at_pace_10_attributes_the_built_in_scenario(run_agent: Any, tmp_path: Any) -> None:
    """A real agent at pace 10 for 32 wall seconds: 320 scenario seconds, through the
    start-up, the preprocessing stall of GPUs 4-5, the data-loading stall of GPUs 0-3 and
    the throttling of GPU 6 (default correlator settings: nothing shortened)."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\n")
    agent = run_agent("--simulate", "--simulate.pace", "10", "--config", str(cfg))
    wait_for_metrics(f"{agent.url}/metrics", agent.proc)
    want = {(g, "data_loading") for g in "0123"} | {("4", "preprocessing")}
    want |= {("5", "preprocessing"), ("6", "throttling")}
    got: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and not want <= got:
        time.sleep(1)
        body = json.loads(http_get(f"{agent.url}/api/windows")[1])
        got = {(w["gpu"], w["cause"]) for w in body["windows"]}
    assert want <= got, sorted(got)
    # the wrong answers are gone
    assert not {(g, "preprocessing") for g in "0123"} & got, sorted(got)
    assert not {("4", "unknown"), ("5", "unknown")} & got, sorted(got)
