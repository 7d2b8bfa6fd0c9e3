"""The interface every GPU backend implements, and the typed values it returns.

Units are in field names. A field that is None is a value the hardware or driver does not
provide: it is exported as absent, never as zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

BackendName = Literal["nvml", "simulated"]


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    driver_version: str
    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. `up` False means the GPU is lost (XID 79, off the bus)."""

    identity: GpuIdentity
    up: bool = True
    utilization_ratio: float | None = None
    # utilization summed over time by the agent (seconds busy since it started)
    busy_seconds_total: float | None = None
    # GPM (Hopper and newer), over the last interval of at least 100 ms
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_bandwidth_utilization_ratio: float | None = None
    # NVML utilization.memory: a time fraction (memory was read or written), not bandwidth
    memory_bandwidth_utilization_ratio: float | None = None
    # nvidia-smi's "used" (nvmlMemory_v2): reserved memory is not in it
    memory_used_bytes: float | None = None
    memory_reserved_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    energy_joules_total: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    # reason name (sw_power_cap, hw_slowdown, ...) -> active; absent when not supported
    clock_events_active: tuple[tuple[str, bool], ...] | None = None
    pcie_transmit_bytes_total: float | None = None
    pcie_receive_bytes_total: float | None = None
    nvlink_transmit_bytes_total: float | None = None
    nvlink_receive_bytes_total: float | None = None
    # xid code -> count since the agent started watching
    xid_errors_total: tuple[tuple[int, int], ...] = ()
    processes: tuple[GpuProcess, ...] = field(default=())
    # MIG mode of the physical GPU; None where the GPU has no MIG (pre-Ampere, consumer boards)
    mig_enabled: bool | None = None


class GpuBackend(Protocol):
    """A source of GPU readings. Implementations: gpu.nvml.NvmlBackend, simulate.gpu_backend."""

    @property
    def name(self) -> BackendName: ...

    def devices(self) -> list[GpuIdentity]: ...

    def sample(self) -> list[GpuSample]:
        """One reading of every GPU, in index order; a lost GPU has up=False."""
        ...

    def close(self) -> None: ...
