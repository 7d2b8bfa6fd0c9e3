"""Verified against real serving-style processes: two small HTTP servers whose request
queue the test fills with real requests (tests/helpers/serving_server.py: one worker,
requests queue behind it, vLLM's metric names), scraped by the real agent over HTTP.

The agent's GPUs are simulated (`--gpu.backend=simulated`, labelled so): the built-in
scenario's GPUs 0 and 6 are starting up, far below 80% utilization, for its first 90 s.
The mapping directory gives GPU 0 to job chat-busy, whose server has requests waiting, and
GPU 6 to job chat-idle, whose server gets none. With a 3 s minimum window:

- GPU 0 is underutilized with requests queued: a window with a cause of its own (not
  low_demand) whose evidence says how many requests wait: it pages as GpuUtilizationLow;
- GPU 6 is underutilized with an empty queue: a low_demand window, which GpuUtilizationLow
  leaves out (alerts/tests/inference_alerts_test.yml proves the rule does).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from conftest import http_get, wait_for_metrics
from gpufeed.serving.stacks import Demand, parse_serving_metrics
from procports import owned_server

SERVER = Path(__file__).parent / "helpers" / "serving_server.py"


def post(url: str) -> None:
    req = urllib.request.Request(url, data=b'{"prompt": "hi"}', method="POST")
    # the server is stopped at the end of the test with requests in flight
    with contextlib.suppress(OSError):
        urllib.request.urlopen(req, timeout=120).read()


def queue(server_url: str) -> Demand | None:
    return parse_serving_metrics(http_get(server_url + "/metrics")[1].decode())


def open_causes(agent_url: str) -> dict[str, str]:
    _, body = http_get(f"{agent_url}/metrics")
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("gpufeed_gpu_underutilization_cause{"):
            labels = dict(
                kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            out[labels["gpu"].strip('"')] = labels["cause"].strip('"')
    return out


def test_queued_requests_are_a_stall_and_an_empty_queue_is_low_demand(
    run_agent: Any, tmp_path: Path
) -> None:
    with (
        owned_server([sys.executable, str(SERVER), "60"], "/metrics") as (_, busy_url),
        owned_server([sys.executable, str(SERVER), "60"], "/metrics") as (_, idle_url),
    ):
        for _ in range(4):  # one runs, three wait behind it for the whole test
            threading.Thread(target=post, args=(busy_url + "/v1/completions",), daemon=True).start()
        deadline = time.monotonic() + 15
        while (got := queue(busy_url)) is None or got.requests_waiting < 3:
            assert time.monotonic() < deadline, got
            time.sleep(0.05)
        mapping = tmp_path / "mapping"
        mapping.mkdir()
        (mapping / "0").write_text("chat-busy\n")
        (mapping / "6").write_text("chat-idle\n")
        cfg = tmp_path / "agent.yaml"
        cfg.write_text(
            # generous time bounds: a loaded 2-core runner must not lose a scrape
            "interval_seconds: 1\ncollector_timeout_seconds: 4\n"
            f"jobs: {{mapping_dir: {mapping}}}\n"
            "serving:\n  timeout_seconds: 3\n  endpoints:\n"
            f"    - {{url: '{busy_url}/metrics', job_id: chat-busy}}\n"
            f"    - {{url: '{idle_url}/metrics', job_id: chat-idle, server: vllm}}\n"
            "correlator:\n"
            f"  windows_log: {tmp_path / 'windows.jsonl'}\n"
            "  min_window_seconds: 3\n  merge_gap_seconds: 1\n"
        )
        agent = run_agent("--config", str(cfg), "--gpu.backend", "simulated")
        body = wait_for_metrics(f"{agent.url}/metrics", agent.proc).decode()
        assert 'backend="simulated"' in body
        deadline = time.monotonic() + 40
        causes: dict[str, str] = {}
        while time.monotonic() < deadline:
            causes = open_causes(agent.url)
            if {"0", "6"} <= set(causes):
                break
            time.sleep(0.25)
        assert causes.get("6") == "low_demand", causes
        assert causes.get("0") not in (None, "low_demand"), causes
        _, body_bytes = http_get(f"{agent.url}/metrics")
        page = body_bytes.decode()
        assert 'gpufeed_serving_requests_waiting{endpoint="127.0.0.1:' in page
        _, api = http_get(f"{agent.url}/api/windows")
        windows = {w["gpu"]: w for w in json.loads(api)["open"]}
        busy, idle = windows["0"], windows["6"]
        assert busy["evidence"]["serving_requests_waiting"] == 3.0, busy
        assert busy["evidence"]["serving_requests_running"] == 1.0, busy
        summary = busy["evidence"]["summary"]
        assert "3 requests waiting in its serving queue, 1 request running" in summary, busy
        assert idle["evidence"]["serving_no_demand"] == 1.0, idle
        assert "is idle for lack of requests (low demand)" in idle["evidence"]["summary"]
        assert idle["job_id"] == "chat-idle"
