"""An inference server's GPUs: idle for lack of requests is `low_demand` (nothing else on
the node changes that), a stall with requests waiting keeps its own cause and says how
many wait; judged by the real analysis over simulated traces."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from correlator_helpers import T0, Gen, analyze_text, snapshots_of, trace_text
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.correlator.job.culprit import correlate_job
from gpufeed.correlator.outputs.windowlog import read_log
from gpufeed.simulate.scenario import default_scenario, parse_scenario
from gpufeed.simulate.tracegen import DEFAULT_START_UNIX, generate_trace
from gpufeed.trace.reader import read_trace
from gpufeed.vocabulary import Cause
from prometheus_trace import prometheus_serving, run_analyze
from window_match import assert_same_windows

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


def _serving_node(t: float) -> Iterable[tuple[str, float | None]]:
    """One node, two serving jobs; in 600-1200 s both GPUs drop: chat-a's queue is empty,
    chat-b's holds 30 requests."""
    s = t - T0
    low = 600 <= s < 1200
    node = 'instance="n1:9400"'
    for gpu, job, util, waiting in (("0", "chat-a", 0.1, 0.0), ("1", "chat-b", 0.2, 30.0)):
        g = f'gpu="{gpu}",uuid="GPU-{gpu}",{node}'
        yield f"gpufeed_gpu_up{{{g}}}", 1.0
        yield f"gpufeed_gpu_utilization_ratio{{{g}}}", util if low else 0.95
        yield f'gpufeed_job_info{{job_id="{job}",{g},scheduler="kubernetes",name="x"}}', 1.0
        sv = f'job_id="{job}",server="vllm",endpoint="127.0.0.1:800{gpu}",{node}'
        yield f"gpufeed_serving_requests_waiting{{{sv}}}", waiting if low else 4.0
        yield f"gpufeed_serving_requests_running{{{sv}}}", 1.0 if low else 24.0


@pytest.mark.slow
def test_a_tsdb_gives_the_same_serving_windows_as_the_file(tmp_path: Path) -> None:
    """`gpufeed analyze --prometheus` (the fleet's feed) reads the serving series like the
    file analysis: low_demand for the empty queue, a stall with its queue for the other."""
    trace = tmp_path / "trace.om"
    trace.write_text(trace_text(_serving_node, 1800))
    from_file, from_tsdb = tmp_path / "file.jsonl", tmp_path / "tsdb.jsonl"
    assert run_analyze(str(trace), "--output", str(from_file)) == 0
    with prometheus_serving(trace, tmp_path) as url:
        args = ["--prometheus", url, "--start", str(T0), "--end", str(T0 + 1800)]
        assert run_analyze(*args, "--step", "5", "--output", str(from_tsdb)) == 0
    windows = [json.loads(x) for x in from_file.read_text().splitlines()]
    assert [(w["gpu"], w["cause"] == "low_demand") for w in windows] == [
        ("0", True),
        ("1", False),
    ], windows
    assert windows[1]["evidence"]["serving_requests_waiting"] == 30.0
    assert_same_windows(from_file.read_text(), from_tsdb.read_text())


def _two_endpoints(first_fails: bool) -> Gen:
    """One GPU of chat-a served by two endpoints; in 600-1200 s the GPU drops and the second
    endpoint's queue is empty. The first held 30 requests before the dip; with `first_fails`
    it stops answering then (up 0, its demand absent, as the collector exports it), else it
    answers with an empty queue too."""

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        low = 600 <= t - T0 < 1200
        g = 'gpu="0",uuid="GPU-0",instance="n1:9400"'
        yield f"gpufeed_gpu_up{{{g}}}", 1.0
        yield f"gpufeed_gpu_utilization_ratio{{{g}}}", 0.1 if low else 0.95
        yield f'gpufeed_job_info{{job_id="chat-a",{g},scheduler="kubernetes",name="x"}}', 1.0
        for port, before in (("8000", 30.0), ("8001", 0.0)):
            sv = f'job_id="chat-a",server="vllm",endpoint="127.0.0.1:{port}",instance="n1:9400"'
            down = low and first_fails and port == "8000"
            yield f"gpufeed_serving_up{{{sv}}}", 0.0 if down else 1.0
            waiting = None if down else (0.0 if low else before)
            yield f"gpufeed_serving_requests_waiting{{{sv}}}", waiting
            yield f"gpufeed_serving_requests_running{{{sv}}}", None if down else 1.0

    return gen


def _live_causes(text: str, tmp_path: Path) -> list[str]:
    """The causes of the windows the agent's own correlator logs over the same samples."""
    log = tmp_path / "live.jsonl"
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(log)), interval_seconds=5.0)
    for snap in snapshots_of(text):
        proc.process(snap)  # type: ignore[arg-type]
    return [str(w.cause) for w in read_log(str(log)) if w.gpu == "0"]


def test_a_failed_endpoint_leaves_the_demand_unknown_not_low(tmp_path: Path) -> None:
    """One of the GPU's two endpoints fails (up 0, no queue) while the other is empty: the
    queue is unknown, never `low_demand`, and the evidence names the endpoint down; in the
    agent's live correlator too. Control: both answer with an empty queue: `low_demand`."""
    failed = trace_text(_two_endpoints(first_fails=True), 1800)
    ws = [w for w in analyze_text(failed, tmp_path) if w.gpu == "0"]
    assert ws and all(w.cause is not Cause.LOW_DEMAND for w in ws), [
        (w.cause, w.summary) for w in ws
    ]
    ev = evidence(ws[0])
    assert F.SERVING_NO_DEMAND not in ev
    assert ev[Ctx.SERVING_DOWN] == "127.0.0.1:8000"
    assert "endpoint 127.0.0.1:8000 down: its queue unknown" in ws[0].summary
    assert Cause.LOW_DEMAND.value not in _live_causes(failed, tmp_path)

    empty = trace_text(_two_endpoints(first_fails=False), 1800)
    ws = [w for w in analyze_text(empty, tmp_path) if w.gpu == "0"]
    assert [w.cause for w in ws] == [Cause.LOW_DEMAND], [(w.cause, w.summary) for w in ws]
    assert Ctx.SERVING_DOWN not in evidence(ws[0])
    (tmp_path / "control").mkdir()
    assert _live_causes(empty, tmp_path / "control") == [Cause.LOW_DEMAND.value]
