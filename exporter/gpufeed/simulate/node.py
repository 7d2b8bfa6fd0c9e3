"""A simulated node on a clock: the engine, read at elapsed wall time since start.

The GPU backend and the `simulated` collector share one `SimulatedNode`, so the GPU
utilization a scrape shows and the storage, network, host and job series next to it come
from the same instant of the same scenario.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpufeed.gpu.backend import GpuSample
from gpufeed.model import Family
from gpufeed.simulate import layout as L
from gpufeed.simulate.engine import Engine, Truth
from gpufeed.simulate.scenario import CLOCK_EVENT_REASONS, Scenario
from gpufeed.simulate.series import (
    gpu_identities,
    gpu_series,
    node_series,
    render,
    reserved_memory_bytes,
)

Clock = Callable[[], float]


class SimulatedNode:
    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int = 1,
        pace: float = 1.0,
        clock: Clock = time.monotonic,
        resolution_seconds: float = 1.0,
    ) -> None:
        self.scenario = scenario
        self.seed = seed
        self.pace = pace
        self.engine = Engine(scenario, seed, pace=pace, resolution_seconds=resolution_seconds)
        self.identities = gpu_identities(scenario, seed)
        self._node_defs = node_series(scenario, self.engine.layout, self.identities)
        self._gpu_defs = gpu_series(scenario, self.engine.layout, self.identities)
        self._clock = clock
        self.started_at_seconds = clock()
        self._latest = 0.0

    def elapsed(self) -> float:
        """Seconds since start; never goes back, so a clock stepped backwards pauses the
        simulation instead of replaying it from the start."""
        self._latest = max(self._latest, self._clock() - self.started_at_seconds)
        return self._latest

    def ground_truth(self, elapsed_seconds: float | None = None) -> dict[int, Truth]:
        """The true cause per GPU now (or at an elapsed time): for labelling, not /metrics."""
        t = self.elapsed() if elapsed_seconds is None else elapsed_seconds
        return self.engine.ground_truth(t)

    def gpu_samples(self, elapsed_seconds: float | None = None) -> list[GpuSample]:
        t = self.elapsed() if elapsed_seconds is None else elapsed_seconds
        gauges, counters, k = self.engine.values_at(t)
        up, _ = self.engine.presence(k)
        lay = self.engine.layout
        node = self.scenario.node
        out = []
        for ident in self.identities:
            g = ident.index
            xid = int(counters[lay.gc(g, L.C_XID79)])
            xids = ((79, xid),) if xid else ()
            if not up[g]:
                out.append(GpuSample(ident, up=False, xid_errors_total=xids))
                continue
            gg = lay.gg(g, 0)
            gc = lay.gc(g, 0)
            reasons = tuple(
                (r, gauges[gg + L.G_REASONS + i] > 0.5) for i, r in enumerate(CLOCK_EVENT_REASONS)
            )
            out.append(
                GpuSample(
                    identity=ident,
                    up=True,
                    utilization_ratio=gauges[gg + L.G_UTIL],
                    busy_seconds_total=counters[gc + L.C_BUSY],
                    sm_active_ratio=gauges[gg + L.G_SMACT] if node.sm_active else None,
                    sm_occupancy_ratio=gauges[gg + L.G_OCCUPANCY] if node.sm_active else None,
                    tensor_active_ratio=gauges[gg + L.G_TENSOR] if node.sm_active else None,
                    dram_bandwidth_utilization_ratio=(
                        gauges[gg + L.G_DRAM] if node.sm_active else None
                    ),
                    memory_bandwidth_utilization_ratio=gauges[gg + L.G_MEMBW],
                    memory_used_bytes=gauges[gg + L.G_MEMUSED],
                    memory_reserved_bytes=reserved_memory_bytes(node.gpu_memory_bytes),
                    memory_total_bytes=node.gpu_memory_bytes,
                    power_watts=gauges[gg + L.G_POWER],
                    energy_joules_total=counters[gc + L.C_ENERGY],
                    temperature_celsius=gauges[gg + L.G_TEMP],
                    sm_clock_hertz=gauges[gg + L.G_CLOCK],
                    clock_events_active=reasons,
                    pcie_transmit_bytes_total=counters[gc + L.C_PCIE_TX],
                    pcie_receive_bytes_total=counters[gc + L.C_PCIE_RX],
                    nvlink_transmit_bytes_total=counters[gc + L.C_NVL_TX],
                    nvlink_receive_bytes_total=counters[gc + L.C_NVL_RX],
                    xid_errors_total=xids,
                )
            )
        return out

    def node_families(self, elapsed_seconds: float | None = None) -> list[Family]:
        """Storage, network, host and job families (everything but the GPU families)."""
        t = self.elapsed() if elapsed_seconds is None else elapsed_seconds
        gauges, counters, k = self.engine.values_at(t)
        up, present = self.engine.presence(k)
        return render(self._node_defs, gauges, counters, up, present)

    def gpu_families(self, elapsed_seconds: float | None = None) -> list[Family]:
        """The GPU families as the GPU collector renders them (trace generator, tests)."""
        t = self.elapsed() if elapsed_seconds is None else elapsed_seconds
        gauges, counters, k = self.engine.values_at(t)
        up, present = self.engine.presence(k)
        return render(self._gpu_defs, gauges, counters, up, present)

    def families(self, elapsed_seconds: float | None = None) -> list[Family]:
        """Every family of the node at one instant: GPU ones first, then the rest."""
        t = self.elapsed() if elapsed_seconds is None else elapsed_seconds
        return self.gpu_families(t) + self.node_families(t)


class SimulatedNodeCollector:
    """The `simulated` collector: host, storage tiers, fabric and jobs of a simulated node."""

    name = "simulated"

    def __init__(self, node: SimulatedNode) -> None:
        self.node = node

    def collect(self) -> list[Family]:
        return self.node.node_families()

    def close(self) -> None:
        return None
