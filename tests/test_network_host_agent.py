"""The real agent on the network and host fixtures: scraped over HTTP, checked by promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import FIXTURES, wait_for_metrics

PORT = 19150


@pytest.mark.slow
def test_agent_serves_network_and_host_series_that_promtool_accepts(
    run_agent: Any, tmp_path: Path
) -> None:
    root = tmp_path / "node"
    shutil.copytree(FIXTURES / "network", root, symlinks=True)
    shutil.copytree(FIXTURES / "host/modern/proc", root / "proc", dirs_exist_ok=True)
    proc = run_agent(
        "--web.listen-address",
        f"127.0.0.1:{PORT}",
        "--path.procfs",
        str(root / "proc"),
        "--path.sysfs",
        str(root / "sys"),
        "--path.rootfs",
        str(root),
    )
    body = wait_for_metrics(f"http://127.0.0.1:{PORT}/metrics", proc).decode()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }
    ib = (("device", "mlx5_0"), ("fabric", "infiniband"), ("port", "1"))
    expected = {
        ("gpufeed_collector_success", (("collector", "network"),)): 1,
        ("gpufeed_collector_success", (("collector", "host"),)): 1,
        ("gpufeed_network_receive_bytes_total", ib): 1234567890123 * 4,
        (
            "gpufeed_network_transmit_bytes_total",
            (("device", "mlx5_1"), ("fabric", "roce"), ("port", "1")),
        ): 6000000000 * 4,
        (
            "gpufeed_network_speed_bytes_per_second",
            (("device", "eno1"), ("fabric", "ethernet")),
        ): 25000e6 / 8,
        ("gpufeed_network_transmit_wait_seconds_total", ib): 0.24,
        ("gpufeed_host_cpus", ()): 4,
        ("gpufeed_host_pressure_stalled_seconds_total", (("resource", "io"),)): 87.654321,
        ("gpufeed_host_memory_available_bytes", ()): 251234568 * 1024,
    }
    for key, value in expected.items():
        assert got.get(key) == pytest.approx(value), key
    devices = {dict(labels).get("device") for name, labels in got if "_network_" in name}
    assert devices == {"eno1", "eno2", "eno3", "ens1f0np0", "ib0", "mlx4_0", "mlx5_0"} | {
        "mlx5_1",
        "mlx5_2",
    }
    stalled = {dict(labels)["resource"] for name, labels in got if "stalled" in name}
    assert stalled == {"io", "memory"}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 0, res.stdout + res.stderr
