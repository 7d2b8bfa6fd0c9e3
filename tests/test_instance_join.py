"""One node, one `instance`: the live windows, the recorded trace's analysis and the
analysis of what a real Prometheus scraped from the same agent all name the node alike.

0.1.0 gave one node three names (the host name live, none in traces, `host:port` in
Prometheus), so the three could not be joined.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import agent_env, gpufeed_cmd, http_get, wait_for_metrics
from procports import owned_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Windows open within seconds (the built-in scenario starts with the job's start-up).
CORRELATOR = {"min_window_seconds": 2, "merge_gap_seconds": 1}
WINDOW_ARGS = ["--min-window", "2", "--merge-gap", "1"]


def analyze(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        gpufeed_cmd("analyze", *args, *WINDOW_ARGS),
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_live_file_and_prometheus_windows_join_on_instance(run_agent: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    correlator = {**CORRELATOR, "windows_log": str(tmp_path / "w.jsonl")}
    cfg.write_text(yaml.safe_dump({"interval_seconds": 0.5, "correlator": correlator}))
    trace = tmp_path / "trace.om"
    agent = run_agent("--simulate", "--config", str(cfg), "--record", str(trace))
    wait_for_metrics(f"{agent.url}/metrics", agent.proc)
    # The documented default: HOSTNAME:PORT of the listen address.
    instance = f"{socket.gethostname()}:{agent.port}"

    # Prometheus scrapes the agent by address, labelled as docs/correlator.md says.
    prom_cfg = tmp_path / "prometheus.yml"
    prom_cfg.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "gpufeed",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{agent.port}"],
                                "labels": {"instance": instance},
                            }
                        ],
                    }
                ],
            }
        )
    )
    start = time.time()
    prom_args = [
        "prometheus",
        f"--config.file={prom_cfg}",
        f"--storage.tsdb.path={tmp_path / 'prom'}",
        "--web.listen-address=127.0.0.1:0",
    ]
    with owned_server(prom_args, "/-/ready") as (_, prom):
        live: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            body = json.loads(http_get(f"{agent.url}/api/windows")[1])
            live = body["windows"] + body["open"]
            if live and time.time() - start > 12:
                break
            time.sleep(0.5)
        end = time.time()
        agent.proc.terminate()
        assert agent.proc.wait(30) == 0
        from_prom = analyze(
            "--prometheus",
            prom,
            "--start",
            str(int(start)),
            "--end",
            str(int(end) + 1),
            "--step",
            "1",
        )
    from_file = analyze(str(trace))

    assert live and from_file and from_prom
    names = {
        "live": {w["instance"] for w in live},
        "file": {w["instance"] for w in from_file},
        "prometheus": {w["instance"] for w in from_prom},
    }
    assert names == {"live": {instance}, "file": {instance}, "prometheus": {instance}}
    # Joined on (instance, gpu), the three see the same GPUs.
    gpus = [{(w["instance"], w["gpu"]) for w in ws} for ws in (live, from_file, from_prom)]
    assert gpus[0] == gpus[1] == gpus[2]
    # The windows log, where windows closed meanwhile, names the node alike.
    log = tmp_path / "w.jsonl"
    logged = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    assert {w["instance"] for w in logged} <= {instance}
