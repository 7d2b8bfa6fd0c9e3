"""The golden end-to-end test: the whole agent on fixture trees and the simulated GPU backend.

The fixture trees of the host, network and storage collectors are laid into one node
(procfs, sysfs, rootfs), the agent runs on it with `--gpu.backend=simulated`, and its
/metrics page is linted with promtool and diffed, line for line (HELP, TYPE, series, values
and their order), against tests/fixtures/golden/agent.prom.

Masked before the diff (the series stays, its value becomes `<v>`), because they are not
functions of the fixtures:
- per-collector durations, and the snapshot's timestamp (the wall clock);
- capacity and free bytes (a real statvfs of the checkout's filesystem);
- the simulated GPUs' values that follow the simulation's clock (utilization, power,
  counters...); what a GPU is (info, up, memory total and reserved) is diffed exactly;
- the Python version label of the build info.

Regenerate with GPUFEED_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import FIXTURES, wait_for_metrics

GOLDEN = FIXTURES / "golden" / "agent.prom"
CONFIG = """\
interval_seconds: 0.5
tiers:
  hot: [/mnt/scratch, /var/cache/scratch]
  gpu_direct: ["/mnt/fast scratch"]
  warm: [/mnt/datasets/imagenet, /mnt/typo]
  cold: [/mnt/raid, /data/archive]
tier_targets:
  gpu_direct: {read_latency_seconds: 50e-6, read_bytes_per_second: 20e9}
"""
# Families whose values are not functions of the fixtures (see the module docstring).
MASKED_VALUES = frozenset(
    {
        "gpufeed_collector_duration_seconds",
        "gpufeed_snapshot_timestamp_seconds",
        "gpufeed_storage_capacity_bytes",
        "gpufeed_storage_free_bytes",
        # the simulated GPUs, on the simulation's clock
        "gpufeed_gpu_busy_seconds_total",
        "gpufeed_gpu_clock_event_active",
        "gpufeed_gpu_dram_bandwidth_utilization_ratio",
        "gpufeed_gpu_energy_joules_total",
        "gpufeed_gpu_memory_bandwidth_utilization_ratio",
        "gpufeed_gpu_memory_used_bytes",
        "gpufeed_gpu_nvlink_receive_bytes_total",
        "gpufeed_gpu_nvlink_transmit_bytes_total",
        "gpufeed_gpu_pcie_receive_bytes_total",
        "gpufeed_gpu_pcie_transmit_bytes_total",
        "gpufeed_gpu_power_watts",
        "gpufeed_gpu_sm_active_ratio",
        "gpufeed_gpu_sm_clock_hertz",
        "gpufeed_gpu_sm_occupancy_ratio",
        "gpufeed_gpu_temperature_celsius",
        "gpufeed_gpu_tensor_active_ratio",
        "gpufeed_gpu_utilization_ratio",
    }
)
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})? (?P<value>\S+)$")
PYTHON_VERSION = re.compile(r'python_version="[^"]*"')


def lay_node(dest: Path) -> dict[str, Path]:
    """One node from the collectors' fixture trees (symlinks kept, directories merged)."""
    layers = {
        "proc": [
            FIXTURES / "host/modern/proc",
            FIXTURES / "network/proc",
            FIXTURES / "storage/node1/proc",
        ],
        "sys": [FIXTURES / "network/sys", FIXTURES / "storage/node1/sys"],
        "root": [FIXTURES / "storage/node1/root"],
    }
    out = {}
    for name, sources in layers.items():
        for src in sources:
            shutil.copytree(src, dest / name, symlinks=True, dirs_exist_ok=True)
        out[name] = dest / name
    return out


def normalize(body: str) -> list[str]:
    """The page's lines, in order, with what must vary masked."""
    lines = []
    for line in body.splitlines():
        if not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            if m["name"] in MASKED_VALUES:
                line = f"{m['name']}{m['labels'] or ''} <v>"
            elif m["name"] == "gpufeed_build_info":
                line = PYTHON_VERSION.sub('python_version="<v>"', line)
        lines.append(line)
    return lines


@pytest.mark.slow
def test_agent_on_fixtures_and_simulated_gpus_matches_golden(
    run_agent: Any, tmp_path: Path
) -> None:
    node = lay_node(tmp_path / "node")
    cfg = tmp_path / "gpufeed.yaml"
    # The windows log in this test's own directory: never the host's shared state path.
    cfg.write_text(CONFIG + f"correlator:\n  windows_log: {tmp_path / 'windows.jsonl'}\n")
    agent = run_agent(
        "--config",
        str(cfg),
        "--path.procfs",
        str(node["proc"]),
        "--path.sysfs",
        str(node["sys"]),
        "--path.rootfs",
        str(node["root"]),
        "--gpu.backend",
        "simulated",
        "--sdk.socket",
        str(tmp_path / "sdk.sock"),
    )
    body = wait_for_metrics(f"{agent.url}/metrics", agent.proc).decode()

    assert body.startswith("# SIMULATED NODE"), "simulated GPUs must be labelled on the page"
    for collector in ("host", "network", "storage", "gpu", "jobs", "sdk", "job_io"):
        assert f'gpufeed_collector_success{{collector="{collector}"}} 1.0' in body, collector

    check = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr

    got = normalize(body)
    if os.environ.get("GPUFEED_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text("\n".join(got) + "\n")
    want = GOLDEN.read_text().splitlines()
    diff = "\n".join(
        difflib.unified_diff(want, got, "golden/agent.prom", "/metrics", n=2, lineterm="")
    )
    assert not diff, (
        "/metrics differs from the golden page (GPUFEED_UPDATE_GOLDEN=1 regenerates it; "
        f"review the diff):\n{diff}"
    )
