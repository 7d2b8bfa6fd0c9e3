"""`gpufeed analyze --prometheus` writes the job-level results too: a multi-node job loaded
into a real Prometheus (Debian package, `promtool tsdb create-blocks-from openmetrics`)
gives the same windows, culprits included, as the trace file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import multinode_scenarios as mn
from prometheus_trace import prometheus_serving, run_analyze

pytestmark = pytest.mark.slow


def test_prometheus_gives_the_culprits_of_the_file(tmp_path: Path) -> None:
    tr = mn.build("cpu_starved", seed=3, nodes=4, gpus=4)
    trace = tmp_path / "job.om"
    trace.write_text(tr.text)
    first = float(tr.text.split("\n", 1)[0].rsplit(" ", 1)[1])
    last = float(tr.text.rsplit("\n", 3)[-3].rsplit(" ", 1)[1])
    file_out, prom_out = tmp_path / "file.jsonl", tmp_path / "prom.jsonl"
    assert run_analyze(str(trace), "--output", str(file_out)) == 0
    with prometheus_serving(trace, tmp_path) as url:
        assert (
            run_analyze(
                "--prometheus",
                url,
                "--start",
                str(first),
                "--end",
                str(last),
                "--step",
                "5",
                "--output",
                str(prom_out),
            )
            == 0
        )
    from_file = [json.loads(x) for x in file_out.read_text().splitlines()]
    from_prom = [json.loads(x) for x in prom_out.read_text().splitlines()]
    culprits = {
        json.dumps(d["evidence"].get("culprit")) for d in from_file if d["cause"] == "straggler"
    }
    assert len(culprits) == 1 and tr.instances[tr.stalls[0].node] in culprits.pop()
    assert from_prom == from_file
