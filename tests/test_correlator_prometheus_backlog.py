"""The scheduler exporter's series, under its own instance in a real Prometheus, reach the
windows of the nodes `gpufeed analyze --prometheus` reads (feeds/promql.py shares them with
every node): two nodes with a GPU idle while the queue shows fragmentation."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from correlator_helpers import T0, trace_text
from prometheus_trace import prometheus_serving, run_analyze

pytestmark = pytest.mark.slow


def gen(t: float) -> Iterable[tuple[str, float | None]]:
    s = t - T0
    idle = 600 <= s < 1200
    for node in ("n1:9400", "n2:9400"):
        g = f'gpu="0",uuid="GPU-{node[:2]}",instance="{node}"'
        yield f"gpufeed_gpu_up{{{g}}}", 1.0
        yield f"gpufeed_gpu_utilization_ratio{{{g}}}", 0.0 if idle else 0.95
        if not idle:
            info = f'job_id="j-{node[:2]}",gpu="0",uuid="GPU-{node[:2]}",scheduler="slurm"'
            yield f'gpufeed_job_info{{{info},name="x",instance="{node}"}}', 1.0
    sched = 'instance="slurm-ctl:9844"'
    yield f'gpufeed_scheduler_up{{scheduler="slurm",{sched}}}', 1.0
    yield f'gpufeed_scheduler_gpus{{state="free",{sched}}}', 2.0 if idle else 0.0
    yield f"gpufeed_scheduler_node_free_gpus_max{{{sched}}}", 1.0 if idle else 0.0
    yield f'gpufeed_scheduler_pending_jobs{{queue="gpu",reason="Resources",{sched}}}', 1.0
    if idle:
        yield f'gpufeed_scheduler_backlog_idle_gpus{{reason="fragmentation",{sched}}}', 2.0


def test_scheduler_backlog_reaches_every_nodes_idle_window(tmp_path: Path) -> None:
    trace = tmp_path / "trace.om"
    trace.write_text(trace_text(gen, 1500))
    out = tmp_path / "prom.jsonl"
    with prometheus_serving(trace, tmp_path) as url:
        args = ["--prometheus", url, "--start", str(T0), "--end", str(T0 + 1500)]
        assert run_analyze(*args, "--step", "5", "--output", str(out)) == 0
    windows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {(w["instance"], w["cause"]) for w in windows} == {
        ("n1:9400", "idle"),
        ("n2:9400", "idle"),
    }
    for w in windows:
        assert w["evidence"]["scheduler_backlog"] == "fragmentation"
        assert w["evidence"]["scheduler_queue"] == (
            "1 GPU job pends (1 Resources) while 2 GPUs are free, at most 1 on one node"
        )
