"""GPM (GPU Performance Monitoring, Hopper and newer): metrics computed between two samples.

One `nvmlGpmMetricsGet` call gives SM activity, SM occupancy, tensor activity, DRAM bandwidth
and PCIe rates over the interval between two `nvmlGpmSampleGet`s. NVML's documentation asks
for the two samples to be more than 100 ms apart: closer samples give values computed over a
sliver of time (a burst or a gap reads as 0 or 100 %). So a reading is only taken once
`MIN_INTERVAL_SECONDS` have passed since the baseline; until then the baseline is kept and the
caller re-uses the last reading. After a re-initialisation the baseline is new and no reading
exists yet, so the ratios are absent for that sample instead of bogus.

This module does not import pynvml: the backend hands it the module object, so that
`gpu/nvml.py` stays the only importer.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

# nvml.h: "the two samples ... should be at least 100 ms apart". Exactly that, no margin:
# read() takes a reading once 0.1 s or more have passed since the baseline, so an agent
# sampling every 0.1 s reads GPM at every sample.
MIN_INTERVAL_SECONDS = 0.1

# nvmlGpmMetricId_t values (nvml.h); all are percentages 0..100 except the PCIe rates (MiB/s).
GPM_SM_ACTIVE = 2  # NVML_GPM_METRIC_SM_UTIL: fraction of SMs busy (DCGM's SM_ACTIVE)
GPM_SM_OCCUPANCY = 3  # resident warps vs the theoretical maximum
GPM_TENSOR_ACTIVE = 5  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
GPM_DRAM_BANDWIDTH = 10  # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bandwidth used vs peak
GPM_PCIE_TX_MIB_PER_SECOND = 20  # from this GPU (device to host)
GPM_PCIE_RX_MIB_PER_SECOND = 21  # to this GPU (host to device)
GPM_METRICS = (
    GPM_SM_ACTIVE,
    GPM_SM_OCCUPANCY,
    GPM_TENSOR_ACTIVE,
    GPM_DRAM_BANDWIDTH,
    GPM_PCIE_TX_MIB_PER_SECOND,
    GPM_PCIE_RX_MIB_PER_SECOND,
)
_METRICS_GET_VERSION = 1
_MIB = 1024.0 * 1024.0


@dataclass(frozen=True, slots=True)
class GpmReading:
    """One GPM interval. A metric the GPU refused is None."""

    interval_seconds: float
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_bandwidth_utilization_ratio: float | None = None
    pcie_transmit_bytes: float | None = None  # bytes over the interval
    pcie_receive_bytes: float | None = None


class GpmError(Exception):
    """An NVML error from a GPM call; `code` is NVML's return code."""

    def __init__(self, code: int | None, what: str) -> None:
        super().__init__(what)
        self.code = code


class GpmSession:
    """Two GPM sample buffers of one GPU and the time of the baseline. Not thread-safe."""

    def __init__(self, nv: Any, handle: Any, now: float) -> None:
        self._nv = nv
        self._handle = handle
        self._prev: Any = None
        self._cur: Any = None
        self._prev_at = now
        self._request: Any = None
        try:
            self._prev = nv.nvmlGpmSampleAlloc()
            self._cur = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(handle, self._prev)
        except nv.NVMLError as exc:
            self.free()
            raise GpmError(getattr(exc, "value", None), f"GPM set-up: {exc}") from exc
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = _METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        for slot, metric_id in enumerate(GPM_METRICS):
            request.metrics[slot].metricId = metric_id
        self._request = request

    def read(self, now: float) -> GpmReading | None:
        """The interval since the baseline, or None while it is shorter than 100 ms.

        Raises GpmError; the baseline is then kept, so the next reading covers the gap.
        """
        elapsed = now - self._prev_at
        if elapsed < MIN_INTERVAL_SECONDS:
            return None
        nv = self._nv
        try:
            nv.nvmlGpmSampleGet(self._handle, self._cur)
            request = self._request
            request.sample1 = self._prev
            request.sample2 = self._cur
            nv.nvmlGpmMetricsGet(request)
        except nv.NVMLError as exc:
            raise GpmError(getattr(exc, "value", None), f"GPM reading: {exc}") from exc
        # The newer sample is the baseline of the next interval.
        self._prev, self._cur = self._cur, self._prev
        self._prev_at = now
        values: dict[int, float] = {}
        for slot in range(len(GPM_METRICS)):
            metric = request.metrics[slot]
            if int(metric.nvmlReturn) == nv.NVML_SUCCESS and math.isfinite(metric.value):
                values[int(metric.metricId)] = float(metric.value)

        def ratio(metric_id: int) -> float | None:
            v = values.get(metric_id)
            return None if v is None else min(max(v / 100.0, 0.0), 1.0)

        def bytes_over(metric_id: int) -> float | None:
            v = values.get(metric_id)
            return None if v is None else max(v, 0.0) * _MIB * elapsed

        if not values:
            raise GpmError(None, "GPM answered no metric")
        return GpmReading(
            interval_seconds=elapsed,
            sm_active_ratio=ratio(GPM_SM_ACTIVE),
            sm_occupancy_ratio=ratio(GPM_SM_OCCUPANCY),
            tensor_active_ratio=ratio(GPM_TENSOR_ACTIVE),
            dram_bandwidth_utilization_ratio=ratio(GPM_DRAM_BANDWIDTH),
            pcie_transmit_bytes=bytes_over(GPM_PCIE_TX_MIB_PER_SECOND),
            pcie_receive_bytes=bytes_over(GPM_PCIE_RX_MIB_PER_SECOND),
        )

    def free(self) -> None:
        for sample in (self._prev, self._cur):
            if sample is None:
                continue
            with contextlib.suppress(self._nv.NVMLError, AttributeError):
                self._nv.nvmlGpmSampleFree(sample)
        self._prev = self._cur = self._request = None
