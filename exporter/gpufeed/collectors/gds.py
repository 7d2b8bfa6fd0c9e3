"""The "gds" collector: GPUDirect Storage I/O from the nvidia-fs driver's statistics.

Where nvidia-fs.ko is loaded, /proc/driver/nvidia-fs/stats counts every GDS read and write
on the node (cuFile I/O that went storage <-> GPU memory, whatever mount it targeted): ops,
bytes, errors, the driver's latency over its last second, and per GPU the memory pinned
for GDS and the bounce buffers in use. Where the driver is not loaded the file is absent and
so are these families (absent, not zero). See gpufeed.procfs.nvidia_fs for the format.
"""

from __future__ import annotations

import logging

from gpufeed.catalogue import spec
from gpufeed.collectors.base import collect_sources
from gpufeed.hostpaths import HostPaths
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family
from gpufeed.procfs.nvidia_fs import GdsOp, nvidia_fs_stats_path, read_nvidia_fs_stats

log = logging.getLogger(__name__)

P = "gpufeed_storage_gds_"
OPS = spec(P + "operations_total")
BYTES = spec(P + "bytes_total")
ERRORS = spec(P + "errors_total")
LATENCY = spec(P + "latency_seconds")
PINNED = spec(P + "gpu_pinned_bytes")
BOUNCE = spec(P + "gpu_bounce_buffer_bytes")
FAMILIES = (OPS, BYTES, ERRORS, LATENCY, PINNED, BOUNCE)


class GdsCollector:
    name = "gds"

    def __init__(self, paths: HostPaths | None = None) -> None:
        self._paths = paths or HostPaths()
        self._warn = LogOnce(log)

    def collect(self) -> list[Family]:
        return collect_sources(FAMILIES, (("nvidia-fs", self._stats),), self._warn)

    def close(self) -> None:
        pass

    def _stats(self, fams: Families, problems: list[str]) -> None:
        try:
            stats = read_nvidia_fs_stats(self._paths)
        except ValueError as exc:
            raise ValueError(f"{nvidia_fs_stats_path(self._paths)}: {exc}") from None
        if stats is None:
            return  # the driver is not loaded: no GDS here
        for op, o in (("read", stats.reads), ("write", stats.writes)):
            _put_op(fams, op, o)
        for g in stats.gpus:
            # nvidia-fs prints the bare UUID; NVML (and gpufeed's `uuid` label) prefixes "GPU-"
            labels = {"uuid": f"GPU-{g.uuid}", "pci_bus_id": g.pci_bus_id}
            fams.put(PINNED, labels, g.registered_bytes)
            fams.put(BOUNCE, labels, g.bounce_buffer_bytes)


def _put_op(fams: Families, op: str, o: GdsOp) -> None:
    labels = {"op": op}
    fams.put(OPS, labels, o.ops)
    fams.put(BYTES, labels, o.bytes)
    fams.put(ERRORS, {**labels, "kind": "io"}, o.errors)
    fams.put(ERRORS, {**labels, "kind": "io_state"}, o.io_state_errors)
    fams.put(LATENCY, labels, o.latency_seconds)
