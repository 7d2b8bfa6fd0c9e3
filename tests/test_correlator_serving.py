"""An inference server's GPUs: idle for lack of requests is `low_demand` (nothing else on
the node changes that), a stall with requests waiting keeps its own cause and says how
many wait; judged by the real analysis over simulated traces."""

from __future__ import annotations

from pathlib import Path

from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.job.culprit import correlate_job
from gpufeed.simulate.scenario import default_scenario, parse_scenario
from gpufeed.simulate.tracegen import DEFAULT_START_UNIX, generate_trace
from gpufeed.trace.reader import read_trace
from gpufeed.vocabulary import Cause

SERVER_WITH_A_STALL = """
name: serving-stall
repeat: true
node: {gpus: 2}
jobs:
  - id: chat-1
    scheduler: kubernetes
    gpus: [0]
    data_tier: hot
    checkpoint_tier: hot
    sdk: false
    serving: tgi
    phases:
      - {phase: compute, seconds: 150}
      - {phase: throttling, seconds: 120, reason: hw_slowdown}
      - {phase: compute, seconds: 90}
      - {phase: low_demand, seconds: 120}
      - {phase: compute, seconds: 60}
"""


def windows_of(tmp_path: Path, scenario: object, seconds: float) -> list[Window]:
    trace = tmp_path / "trace.om"
    generate_trace(trace, None, nodes=1, duration_s=seconds, step_s=5.0, seed=3,
                   scenario=scenario)  # type: ignore[arg-type]  # fmt: skip
    nodes = read_trace(str(trace)).nodes.values()
    return analyze_nodes(nodes, WindowParams())


def evidence(w: Window) -> dict[str, float | str]:
    return dict(w.evidence)


def test_the_default_scenarios_server_is_low_demand_when_its_queue_runs_empty(
    tmp_path: Path,
) -> None:
    ws = [w for w in windows_of(tmp_path, default_scenario(), 960.0) if w.gpu == "7"]
    # one window per cycle, in its quiet spell (200-320 s of each 480 s), nothing else
    assert [w.cause for w in ws] == [Cause.LOW_DEMAND] * 2, [(w.cause, w.summary) for w in ws]
    for w in ws:
        start, end = (t - DEFAULT_START_UNIX for t in (w.start_seconds, w.end_seconds))
        assert start % 480 >= 195 and end % 480 <= 330, (start, end)
        assert end - start >= 90
        ev = evidence(w)
        assert ev[F.SERVING_NO_DEMAND] == 1.0 and ev[F.SERVING_REQUESTS_WAITING] == 0.0
        assert "is idle for lack of requests (low demand): no request waiting" in w.summary
        assert w.job_id == "chat-serve-9"


def test_a_stalled_server_keeps_its_cause_and_says_how_many_requests_wait(
    tmp_path: Path,
) -> None:
    ws = [
        w for w in windows_of(tmp_path, parse_scenario(SERVER_WITH_A_STALL), 600.0) if w.gpu == "0"
    ]
    causes = [w.cause for w in ws]
    assert causes == [Cause.THROTTLING, Cause.LOW_DEMAND], [(w.cause, w.summary) for w in ws]
    stall, quiet = ws
    ev = evidence(stall)
    assert float(ev[F.SERVING_REQUESTS_WAITING]) >= 20
    assert F.SERVING_NO_DEMAND not in ev
    assert "requests waiting in its serving queue" in stall.summary
    assert quiet.start_seconds > stall.end_seconds


def test_a_low_demand_node_is_no_culprit_of_a_multi_node_server() -> None:
    """A server across two nodes: one node's GPU shows no reason (unknown), the other's is
    idle for lack of requests. An idle server holds no peer back: no culprit, no straggler,
    every window keeps its cause."""
    t0 = 1_700_000_000.0

    def window(instance: str, cause: Cause) -> Window:
        return Window(instance, "0", f"GPU-{instance}", "chat", t0, t0 + 300, cause, 0.9, 0.1,
                      (), "")  # fmt: skip

    ws = [window("n1:9842", Cause.UNKNOWN), window("n2:9842", Cause.LOW_DEMAND)]
    nodes = {w.instance: NodeSeries(w.instance) for w in ws}
    assert correlate_job("chat", nodes, ws) == ws
