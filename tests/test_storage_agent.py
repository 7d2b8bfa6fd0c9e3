"""End to end: the agent on the fixture node with tiers, scraped, diffed against a golden file.

Capacity and free space come from a real statvfs of the fixture's root directories (the
checkout's filesystem), so those two series are dropped before the diff; everything else
is deterministic. Regenerate with GPUFEED_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import wait_for_metrics
from storage_helpers import NODE1

PORT = 19101
GOLDEN = Path(__file__).parent / "fixtures" / "storage" / "node1-tiers.golden.prom"
CONFIG = """\
interval_seconds: 0.5
tiers:
  hot: [/mnt/scratch, /var/cache/scratch]
  gpu_direct: ["/mnt/fast scratch"]
  warm: [/mnt/datasets/imagenet, /mnt/typo]
  cold: [/mnt/raid, /data/archive]
"""
NONDETERMINISTIC = ("gpufeed_storage_capacity_bytes", "gpufeed_storage_free_bytes")


def storage_lines(body: str) -> list[str]:
    return sorted(
        line
        for line in body.splitlines()
        if line.startswith("gpufeed_storage_") and not line.startswith(NONDETERMINISTIC)
    )


@pytest.mark.slow
def test_agent_on_fixture_node_matches_golden(run_agent: Any, tmp_path: Path) -> None:
    node = tmp_path / "node"
    shutil.copytree(NODE1, node, symlinks=True)
    cfg = tmp_path / "gpufeed.yaml"
    cfg.write_text(CONFIG)
    proc = run_agent(
        "--config",
        str(cfg),
        "--web.listen-address",
        f"127.0.0.1:{PORT}",
        "--path.procfs",
        str(node / "proc"),
        "--path.sysfs",
        str(node / "sys"),
        "--path.rootfs",
        str(node / "root"),
        "--no-collector.network",
        "--no-collector.host",
    )
    body = wait_for_metrics(f"http://127.0.0.1:{PORT}/metrics", proc).decode()
    assert 'gpufeed_collector_success{collector="storage"} 1.0' in body

    if shutil.which("promtool"):
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=body, capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr

    got = storage_lines(body)
    if os.environ.get("GPUFEED_UPDATE_GOLDEN"):
        GOLDEN.write_text("\n".join(got) + "\n")
    assert got == GOLDEN.read_text().splitlines()
