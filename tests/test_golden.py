"""The golden end-to-end test: the whole agent on fixture trees and the simulated GPU backend.

The fixture trees of the host, network and storage collectors are laid into one node
(procfs, sysfs, rootfs), the agent runs on it with `--gpu.backend=simulated`, and its
/metrics page is linted with promtool and diffed against tests/fixtures/golden/agent.prom.

Dropped or masked before the diff, because they are not functions of the fixtures:
- per-collector durations and the build info (Python version);
- capacity and free bytes (a real statvfs of the checkout's filesystem);
- the simulated GPUs' values, which follow the wall clock, and the snapshot's timestamp:
  their series and labels stay in the diff, their values become `<v>`.

Regenerate with GPUFEED_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

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
"""
DROPPED = (
    "gpufeed_collector_duration_seconds",
    "gpufeed_build_info",
    "gpufeed_storage_capacity_bytes",
    "gpufeed_storage_free_bytes",
)
MASKED = ("gpufeed_snapshot_timestamp_seconds ",)
SAMPLE = re.compile(r"^(?P<series>[a-z_:]+(?:\{.*\})?) (?P<value>\S+)$")


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
    lines = []
    for line in body.splitlines():
        if line.startswith("#") or line.startswith(DROPPED):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        series = m["series"]
        gpu_value = series.startswith("gpufeed_gpu_") and not series.startswith("gpufeed_gpu_info")
        if gpu_value or line.startswith(MASKED):
            line = f"{series} <v>"
        lines.append(line)
    return sorted(lines)


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
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, (
        f"missing from /metrics: {missing[:20]}\nunexpected: {extra[:20]}"
    )
