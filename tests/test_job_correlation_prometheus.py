"""`gpufeed analyze --prometheus` writes the job-level results too: a multi-node job loaded
into a real Prometheus (Debian package, `promtool tsdb create-blocks-from openmetrics`)
gives the same windows, culprits included, as the trace file."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import multinode_scenarios as mn
from gpufeed.correlator import analyze_cmd
from procports import owned_server

pytestmark = pytest.mark.slow


def _run(*argv: str) -> int:
    p = argparse.ArgumentParser()
    analyze_cmd.register(p.add_subparsers())
    args = p.parse_args(["analyze", *argv])
    return int(args.func(args))


def test_prometheus_gives_the_culprits_of_the_file(tmp_path: Path) -> None:
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        pytest.fail("Debian's prometheus package is not installed (make promtool)")
    tr = mn.build("cpu_starved", seed=3, nodes=4, gpus=4)
    trace = tmp_path / "job.om"
    trace.write_text(tr.text)
    first = float(tr.text.split("\n", 1)[0].rsplit(" ", 1)[1])
    last = float(tr.text.rsplit("\n", 3)[-3].rsplit(" ", 1)[1])
    data = tmp_path / "data"
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(trace), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1h\n")
    args = [
        "prometheus",
        f"--config.file={cfg}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=100y",
        "--web.listen-address=127.0.0.1:0",
    ]
    file_out, prom_out = tmp_path / "file.jsonl", tmp_path / "prom.jsonl"
    assert _run(str(trace), "--output", str(file_out)) == 0
    with owned_server(args, "/-/ready") as (_, url):
        assert (
            _run(
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
