"""The GPU collector: `GpuSample`s from any backend (NVML or simulated) as contract families.

Every per-GPU series carries `gpu` (the NVML index as a string) and `uuid`. A lost GPU
(`up` False) keeps its `gpufeed_gpu_info`, `gpufeed_gpu_up` 0 and its XID counters (the
agent's own counts, which show the XID 79 that took it down); its readings are absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpufeed.gpu.backend import GpuBackend, GpuSample
from gpufeed.gpu.select import BackendKind, make_backend
from gpufeed.model import Families, Family

# (metric, help, GpuSample attribute): the gauges, as a table rather than code paths.
GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "gpufeed_gpu_utilization_ratio",
        "Fraction of the last sample period in which a kernel ran (NVML utilization.gpu / 100).",
        "utilization_ratio",
    ),
    (
        "gpufeed_gpu_sm_active_ratio",
        "Fraction of SMs busy over the last interval (NVML GPM, Hopper and newer).",
        "sm_active_ratio",
    ),
    (
        "gpufeed_gpu_sm_occupancy_ratio",
        "Resident warps over the theoretical maximum, last interval (NVML GPM, Hopper+).",
        "sm_occupancy_ratio",
    ),
    (
        "gpufeed_gpu_tensor_active_ratio",
        "Fraction of time the SMs ran any tensor-core instruction (NVML GPM, Hopper+).",
        "tensor_active_ratio",
    ),
    (
        "gpufeed_gpu_dram_bandwidth_utilization_ratio",
        "Device memory bandwidth used over its peak, last interval (NVML GPM, Hopper+).",
        "dram_bandwidth_utilization_ratio",
    ),
    (
        "gpufeed_gpu_memory_bandwidth_utilization_ratio",
        "Fraction of time device memory was being read or written, a time fraction and not "
        "bandwidth (NVML utilization.memory / 100).",
        "memory_bandwidth_utilization_ratio",
    ),
    (
        "gpufeed_gpu_memory_used_bytes",
        "Framebuffer memory in use, without the driver's reserved memory (as nvidia-smi).",
        "memory_used_bytes",
    ),
    (
        "gpufeed_gpu_memory_reserved_bytes",
        "Framebuffer memory the driver reserves for itself.",
        "memory_reserved_bytes",
    ),
    ("gpufeed_gpu_memory_total_bytes", "Framebuffer memory size.", "memory_total_bytes"),
    (
        "gpufeed_gpu_power_watts",
        "Power draw (on Hopper and newer NVML gives a 1 s average).",
        "power_watts",
    ),
    ("gpufeed_gpu_temperature_celsius", "GPU core temperature.", "temperature_celsius"),
    ("gpufeed_gpu_sm_clock_hertz", "SM clock.", "sm_clock_hertz"),
)

COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "gpufeed_gpu_busy_seconds_total",
        "Utilization summed over time by the agent: rate() is the mean utilization over "
        "every sample in the range, not only the last one.",
        "busy_seconds_total",
    ),
    (
        "gpufeed_gpu_energy_joules_total",
        "Energy consumed since the driver was loaded.",
        "energy_joules_total",
    ),
    (
        "gpufeed_gpu_pcie_transmit_bytes_total",
        "PCIe bytes sent by the GPU (device to host).",
        "pcie_transmit_bytes_total",
    ),
    (
        "gpufeed_gpu_pcie_receive_bytes_total",
        "PCIe bytes received by the GPU (host to device).",
        "pcie_receive_bytes_total",
    ),
    (
        "gpufeed_gpu_nvlink_transmit_bytes_total",
        "NVLink data bytes sent, summed over links.",
        "nvlink_transmit_bytes_total",
    ),
    (
        "gpufeed_gpu_nvlink_receive_bytes_total",
        "NVLink data bytes received, summed over links.",
        "nvlink_receive_bytes_total",
    ),
)

INFO = "gpufeed_gpu_info"
UP = "gpufeed_gpu_up"
CLOCK_EVENT = "gpufeed_gpu_clock_event_active"
XID = "gpufeed_gpu_xid_errors_total"
MIG = "gpufeed_gpu_mig_enabled"


def gpu_families(samples: Iterable[GpuSample], backend: str) -> list[Family]:
    """Pure: one reading of every GPU -> families. None values are left out, never zeroed."""
    f = Families()
    f.declare(INFO, "gauge", "GPU identity; backend is nvml or simulated.")
    f.declare(UP, "gauge", "1 while the GPU answers, 0 once it is lost (XID 79, off the bus).")
    for name, help_, _ in GAUGES:
        f.declare(name, "gauge", help_)
    for name, help_, _ in COUNTERS:
        f.declare(name, "counter", help_)
    f.declare(CLOCK_EVENT, "gauge", "1 while the clock event reason is active, else 0.")
    f.declare(XID, "counter", "XID error events seen since the agent started.")
    f.declare(MIG, "gauge", "1 when MIG mode is enabled on the physical GPU, else 0.")
    for s in samples:
        ident = s.identity
        labels = {"gpu": str(ident.index), "uuid": ident.uuid}
        f.info(
            INFO,
            "",
            {
                **labels,
                "name": ident.name,
                "driver_version": ident.driver_version,
                "pci_bus_id": ident.pci_bus_id,
                "backend": backend,
            },
        )
        f.gauge(UP, "", labels, 1.0 if s.up else 0.0)
        for xid, count in s.xid_errors_total:
            f.counter(XID, "", {**labels, "xid": str(xid)}, count)
        if not s.up:
            continue
        for name, _, attr in GAUGES:
            f.gauge(name, "", labels, getattr(s, attr))
        for name, _, attr in COUNTERS:
            f.counter(name, "", labels, getattr(s, attr))
        for reason, active in s.clock_events_active or ():
            f.gauge(CLOCK_EVENT, "", {**labels, "reason": reason}, 1.0 if active else 0.0)
        if s.mig_enabled is not None:
            f.gauge(MIG, "", labels, 1.0 if s.mig_enabled else 0.0)
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

    @property
    def last_samples(self) -> tuple[GpuSample, ...]:
        """The readings behind the last `collect()` (processes per GPU for the job layer),
        so other parts need not ask NVML a second time. Replaced whole, never mutated."""
        return self._last

    def collect(self) -> list[Family]:
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
