"""Tier targets in the config (tier_targets): parsed, checked against the tiers, and exported
by the storage collector as gauges the Storage dashboard and StorageTierMissesTarget read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.storage import StorageCollector
from gpufeed.config import ConfigError, TierTarget, parse_config
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.hostpaths import HostPaths
from gpufeed.model import iter_samples
from test_correlator_cache import INST, run

FIXTURES = Path(__file__).parent / "fixtures"
TIERS = "tiers:\n  gpu_direct: [/mnt/gds]\n  hot: [/mnt/hot]\n"


def test_targets_are_read_per_tier() -> None:
    cfg = parse_config(
        TIERS + "tier_targets:\n"
        "  gpu_direct: {read_latency_seconds: 50e-6, read_bytes_per_second: 20e9}\n"
        "  hot: {read_bytes_per_second: 5e9}\n"
    )
    assert cfg.tier_targets == (
        TierTarget("gpu_direct", 50e-6, 20e9),
        TierTarget("hot", None, 5e9),
    )


@pytest.mark.parametrize(
    ("targets", "error"),
    [
        ("  cold: {read_latency_seconds: 1}\n", "line 5: tier_targets.cold: no tier 'cold'"),
        ("  hot: {latency: 1}\n", "tier_targets.hot.latency: unknown key"),
        ("  hot: {read_latency_seconds: -1}\n", "tier_targets.hot.read_latency_seconds: must be"),
        ("  hot: {}\n", "tier_targets.hot: expected read_latency_seconds"),
        ("  hot: fast\n", "tier_targets.hot: expected a mapping"),
    ],
)
def test_bad_targets_name_the_key_and_line(targets: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config(TIERS + "tier_targets:\n" + targets)


def test_storage_collector_exports_the_targets() -> None:
    cfg = parse_config(
        "tiers:\n  hot: [/mnt/scratch]\ntier_targets:\n  hot: {read_latency_seconds: 0.002}\n"
    )
    node = FIXTURES / "storage" / "node1"
    paths = HostPaths(procfs=node / "proc", sysfs=node / "sys", rootfs=node / "root")
    c = StorageCollector(CollectorContext(paths=paths, config=cfg))
    got = {(s.name, s.labels): s.value for s in iter_samples(c.collect())}
    assert got[("gpufeed_storage_tier_target_read_latency_seconds", (("tier", "hot"),))] == 0.002
    # no throughput target stated: absent, not zero
    assert not [k for k in got if k[0] == "gpufeed_storage_tier_target_read_bytes_per_second"]


def test_a_data_stall_says_how_far_the_tier_is_over_its_target(tmp_path: Path) -> None:
    """The hot tier's reads take 4 ms in the stall (0.4 ms healthy) against a 0.5 ms target:
    the evidence says 8x its target beside the latency against its usual level."""
    target = (f'gpufeed_storage_tier_target_read_latency_seconds{{tier="hot",{INST}}}', 0.0005)
    summary, ev = run(tmp_path, fault_hit=0.95, fault_evicted=0.0, extra=(target,))
    assert abs(float(ev[F.TIER_READ_LATENCY_X_TARGET]) - 8.0) < 0.5, ev
    # the window's mean (its first minutes still carry healthy reads): 7.5x-8x
    assert re.search(r"hot tier read latency [78]\.\dx its target", summary), summary


def test_a_tier_within_its_target_says_nothing_of_it(tmp_path: Path) -> None:
    target = (f'gpufeed_storage_tier_target_read_latency_seconds{{tier="hot",{INST}}}', 0.01)
    summary, ev = run(tmp_path, fault_hit=0.95, fault_evicted=0.0, extra=(target,))
    assert F.TIER_READ_LATENCY_X_TARGET not in ev and "target" not in summary, summary
