"""The GPU collector: `GpuSample`s from any backend (NVML or simulated) as contract families.

Every per-GPU series carries `gpu` (the NVML index as a string) and `uuid`. A lost GPU
(`up` False) keeps its `gpufeed_gpu_info`, `gpufeed_gpu_up` 0 and its XID counters (the
agent's own counts, which show the XID 79 that took it down); its readings are absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from gpufeed.catalogue import spec
from gpufeed.collectors.base import TickData
from gpufeed.gpu.backend import GpuBackend, GpuSample
from gpufeed.gpu.select import BackendKind, make_backend
from gpufeed.model import Families, Family

# (metric, GpuSample attribute): the gauges and counters, as tables rather than code paths.
# Type and HELP come from the catalogue (gpufeed.catalogue), the one home of every family.
GAUGES: tuple[tuple[str, str], ...] = (
    ("gpufeed_gpu_utilization_ratio", "utilization_ratio"),
    ("gpufeed_gpu_sm_active_ratio", "sm_active_ratio"),
    ("gpufeed_gpu_sm_occupancy_ratio", "sm_occupancy_ratio"),
    ("gpufeed_gpu_tensor_active_ratio", "tensor_active_ratio"),
    ("gpufeed_gpu_dram_bandwidth_utilization_ratio", "dram_bandwidth_utilization_ratio"),
    ("gpufeed_gpu_memory_bandwidth_utilization_ratio", "memory_bandwidth_utilization_ratio"),
    ("gpufeed_gpu_memory_used_bytes", "memory_used_bytes"),
    ("gpufeed_gpu_memory_reserved_bytes", "memory_reserved_bytes"),
    ("gpufeed_gpu_memory_total_bytes", "memory_total_bytes"),
    ("gpufeed_gpu_power_watts", "power_watts"),
    ("gpufeed_gpu_temperature_celsius", "temperature_celsius"),
    ("gpufeed_gpu_sm_clock_hertz", "sm_clock_hertz"),
)

COUNTERS: tuple[tuple[str, str], ...] = (
    ("gpufeed_gpu_busy_seconds_total", "busy_seconds_total"),
    ("gpufeed_gpu_energy_joules_total", "energy_joules_total"),
    ("gpufeed_gpu_pcie_transmit_bytes_total", "pcie_transmit_bytes_total"),
    ("gpufeed_gpu_pcie_receive_bytes_total", "pcie_receive_bytes_total"),
    ("gpufeed_gpu_nvlink_transmit_bytes_total", "nvlink_transmit_bytes_total"),
    ("gpufeed_gpu_nvlink_receive_bytes_total", "nvlink_receive_bytes_total"),
)

INFO = "gpufeed_gpu_info"
UP = "gpufeed_gpu_up"
CLOCK_EVENT = "gpufeed_gpu_clock_event_active"
XID = "gpufeed_gpu_xid_errors_total"
MIG = "gpufeed_gpu_mig_enabled"


def gpu_families(samples: Iterable[GpuSample], backend: str) -> list[Family]:
    """Pure: one reading of every GPU -> families. None values are left out, never zeroed."""
    f = Families()
    for name in (
        INFO,
        UP,
        *(n for n, _ in GAUGES),
        *(n for n, _ in COUNTERS),
        CLOCK_EVENT,
        XID,
        MIG,
    ):
        f.declare_spec(spec(name))
    for s in samples:
        ident = s.identity
        labels = {"gpu": str(ident.index), "uuid": ident.uuid}
        f.put(
            spec(INFO),
            {
                **labels,
                "name": ident.name,
                "driver_version": ident.driver_version,
                "pci_bus_id": ident.pci_bus_id,
                "backend": backend,
            },
            1.0,
        )
        f.put(spec(UP), labels, 1.0 if s.up else 0.0)
        for xid, count in s.xid_errors_total:
            f.put(spec(XID), {**labels, "xid": str(xid)}, count)
        if not s.up:
            continue
        for name, attr in GAUGES:
            f.put(spec(name), labels, getattr(s, attr))
        for name, attr in COUNTERS:
            f.put(spec(name), labels, getattr(s, attr))
        for reason, active in s.clock_events_active or ():
            f.put(spec(CLOCK_EVENT), {**labels, "reason": reason}, 1.0 if active else 0.0)
        if s.mig_enabled is not None:
            f.put(spec(MIG), labels, 1.0 if s.mig_enabled else 0.0)
    return f.build()


class GpuCollector:
    """Collector "gpu" over any `GpuBackend`; owns the backend and closes it."""

    name = "gpu"

    def __init__(self, backend: GpuBackend) -> None:
        self._backend = backend
        self._last: tuple[GpuSample, ...] = ()

    @property
    def backend(self) -> GpuBackend:
        return self._backend

    def produce(self, data: TickData) -> TickData:
        """The readings behind the last `collect()` (processes per GPU, for the job layer),
        so other collectors need not ask NVML a second time."""
        return replace(data, gpu_samples=self._last)

    def collect(self) -> list[Family]:
        self._last = ()  # a failed reading hands on nothing, not the one before
        samples = tuple(self._backend.sample())
        self._last = samples
        return gpu_families(samples, self._backend.name)

    def close(self) -> None:
        self._backend.close()


def build_gpu_collector(
    kind: BackendKind,
    *,
    simulated: Callable[[], GpuBackend] | None = None,
) -> tuple[GpuCollector | None, str]:
    """The agent's entry point for `--gpu.backend`: the collector (None: off) and a log line.

    Raises gpu.nvml.NvmlUnavailable only when kind is "nvml" and NVML cannot be used.
    """
    choice = make_backend(kind, simulated=simulated)
    collector = GpuCollector(choice.backend) if choice.backend is not None else None
    return collector, choice.reason
