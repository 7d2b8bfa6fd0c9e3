"""An in-process stand-in for libnvidia-ml, installed onto the real `pynvml` module.

NVML cannot run on the CI machines (no GPU), so the NVML backend's tests replace pynvml's
functions with these. Everything else is the real library: errors are real
`pynvml.NVMLError(code)` instances (which pynvml turns into its own subclasses), and return
values are pynvml's own ctypes structures, arrays and pointer types.

Each fake device is a `FakeGpu`; set `lost`, `errors` (function name -> NVML error code) or
`field_errors` (field id -> per-field return code) to drive the failure paths. `calls` counts
every call by function name, and `field_value_calls` records the field ids of each batch.

What it models of NVML's documented behaviour, so the backend's handling of each can fail:
- PCIe byte fields 197/198 that wrap at `pcie_width_bits` (nvml.h: "Value can be wrapped");
- `library_error`: every call fails with a lifecycle code (driver unloaded, upgraded);
- GPM samples stamped with `clock`: metrics over samples < 100 ms apart are garbage (100 %),
  and GPM's PCIe rates come from the same true byte counts as the fields;
- memory v1 `used` includes `mem_reserved`, v2 does not;
- `temp_deprecated`: nvmlDeviceGetTemperature answers DEPRECATED (CUDA 13+);
- `clock_supported`: the clock event reasons the GPU can report;
- NVLink link count (field 91) and per-link state (`links_down`);
- `break_event_set()`: the event set answers UNKNOWN until it is freed and rebuilt.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

ALL_LINKS = 0xFFFFFFFF
FIELD_PCIE_TX, FIELD_PCIE_RX, FIELD_NVLINK_TX, FIELD_NVLINK_RX = 197, 198, 138, 139
FIELD_NVLINK_LINK_COUNT = 91
GPM_BOGUS = 100.0  # what a GPM metric over two samples < 100 ms apart reads here


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:18:00.0"
    util_gpu: int = 97
    util_mem: int = 41
    mem_used: int = 60 * 2**30  # as nvidia-smi shows it (v2)
    mem_reserved: int = 512 * 2**20  # v1's used includes this
    mem_total: int = 80 * 2**30
    power_mw: int = 612_345
    energy_mj: int = 9_876_543_210
    temp_c: int = 64
    temp_deprecated: bool = False
    sm_mhz: int = 1980
    clock_mask: int = 0x4 | 0x10  # sw_power_cap, sync_boost
    clock_supported: int = 0x1FF
    pcie_tx: int = 111_000  # true byte counts; the fields show them modulo 2**pcie_width_bits
    pcie_rx: int = 222_000
    pcie_width_bits: int = 64
    nvlink: bool = True
    nvlink_tx_kib: int = 3_000
    nvlink_rx_kib: int = 4_000
    nvlink_links: int = 4  # per-link counters split the totals evenly
    nvlink_aggregate: bool = True  # False: the driver refuses scope UINT_MAX (older drivers)
    links_down: set[int] = field(default_factory=set)  # inactive links (state 0)
    link_errors: dict[int, int] = field(default_factory=dict)  # link -> per-field return code
    mig_mode: int = 0
    gpm_supported: bool = True
    gpm_sm_util: float = 83.0
    gpm_occupancy: float = 45.0
    gpm_tensor: float = 61.0
    gpm_dram: float = 38.0
    gpm_pcie: bool = True  # GPM PCIe rate metrics supported
    processes: list[tuple[int, int | None]] = field(default_factory=lambda: [(4242, 2**30)])
    lost: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    field_errors: dict[int, int] = field(default_factory=dict)


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _pointer(address: int, ptr_type: Any) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), ptr_type)


def _key(p: Any) -> int:
    return int(ctypes.cast(p, ctypes.c_void_p).value or 0)


# Every pynvml function the fake provides; `install` replaces exactly these.
FAKED = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)


class FakeNvml:
    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        missing: set[str] | None = None,
        driver: str = "550.54.15",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpus = gpus
        self.clock = clock
        self.library_error: int | None = None  # every call fails with it (driver gone)
        self.event_sets_created = 0
        self._broken_sets: set[int] = set()
        self.init_error = init_error
        self.missing = set(missing or ())  # C symbols absent from this "driver"
        self.driver = driver
        self.initialised = 0
        self.init_calls = 0
        self.calls: Counter[str] = Counter()
        self.field_value_calls: list[tuple[int, list[tuple[int, int]]]] = []
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.registered: set[int] = set()
        self.freed_event_sets = 0
        # Tests hold the event wait inside "the driver" by clearing `release_waits`.
        self.release_waits = threading.Event()
        self.release_waits.set()
        self.in_wait = threading.Event()
        self._gpm_next = 0x7000_0000
        self._gpm_samples: dict[int, tuple[int, float, int, int] | None] = {}
        self._handles = [
            _pointer(0x1000_0000 + 0x100 * i, pynvml.c_nvmlDevice_t) for i in range(len(gpus))
        ]
        self._index = {_key(h): i for i, h in enumerate(self._handles)}

    def install(self, setattr_fn: Callable[[Any, str, Any], Any]) -> None:
        """`setattr_fn` is pytest's monkeypatch.setattr (or anything with its signature)."""
        for name in FAKED:
            setattr_fn(pynvml, name, self._wrap(name, getattr(self, "_" + name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls[name] += 1
            if name in self.missing:
                raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if name not in ("nvmlInit", "nvmlShutdown"):
                if self.library_error is not None:
                    raise _err(self.library_error)
                if not self.initialised:
                    raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
            return fn(*args, **kw)

        return call

    def handle(self, index: int) -> Any:
        return self._handles[index]

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        gpu = self.gpus[self._index[_key(handle)]]
        if gpu.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            raise _err(gpu.errors[fn])
        return gpu

    # -- library ---------------------------------------------------------------------
    def _nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise _err(self.init_error)
        self.initialised += 1

    def _nvmlShutdown(self) -> None:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self.initialised -= 1

    def _nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def _nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    def _nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                if gpu.lost:
                    raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
                return self._handles[i]
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    # -- identity --------------------------------------------------------------------
    def _nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def _nvmlDeviceGetName(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def _nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._gpu(h, "nvmlDeviceGetPciInfo").bus_id.encode()
        return info

    def _nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        gpu = self._gpu(h, "nvmlDeviceGetMigMode")
        return [gpu.mig_mode, gpu.mig_mode]

    # -- readings --------------------------------------------------------------------
    def _nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        gpu = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        if gpu.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # what NVML does with MIG on
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def _nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        gpu = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        free = gpu.mem_total - gpu.mem_used - gpu.mem_reserved
        if not version:
            used_v1 = gpu.mem_used + gpu.mem_reserved
            return pynvml.c_nvmlMemory_t(total=gpu.mem_total, free=free, used=used_v1)
        if "nvmlDeviceGetMemoryInfo_v2" in self.missing:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert version == pynvml.nvmlMemory_v2
        return pynvml.c_nvmlMemory_v2_t(
            version=version,
            total=gpu.mem_total,
            reserved=gpu.mem_reserved,
            free=free,
            used=gpu.mem_used,
        )

    def _nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def _nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def _nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        gpu = self._gpu(h, "nvmlDeviceGetTemperature")
        if gpu.temp_deprecated:
            raise _err(pynvml.NVML_ERROR_DEPRECATED)
        return gpu.temp_c

    def _nvmlDeviceGetTemperatureV(self, h: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h, "nvmlDeviceGetTemperatureV").temp_c

    def _nvmlDeviceGetSupportedClocksEventReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetSupportedClocksEventReasons").clock_supported

    def _nvmlDeviceGetSupportedClocksThrottleReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetSupportedClocksThrottleReasons").clock_supported

    def _nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        gpu = self._gpu(h, "nvmlDeviceGetNvLinkState")
        if not gpu.nvlink:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.nvlink_links:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in gpu.links_down else 1

    def _nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        assert kind == pynvml.NVML_CLOCK_SM
        return self._gpu(h, "nvmlDeviceGetClockInfo").sm_mhz

    def _nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").clock_mask

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_mask

    def _nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        return 0

    def _nvmlDeviceGetFieldValues(self, h: Any, field_ids: list[Any]) -> Any:
        gpu = self._gpu(h, "nvmlDeviceGetFieldValues")
        index = self._index[_key(h)]
        self.field_value_calls.append((index, [tuple(f) for f in field_ids]))
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, (fid, scope) in zip(values, field_ids, strict=True):
            slot.fieldId, slot.scopeId = fid, scope
            slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            is_nvlink = fid in (FIELD_NVLINK_TX, FIELD_NVLINK_RX)
            if fid in (FIELD_PCIE_TX, FIELD_PCIE_RX) and gpu.pcie_width_bits == 32:
                # what driver 580 does on an H200: the counter comes as an unsigned int
                slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            wrap = 2**gpu.pcie_width_bits
            total = {
                FIELD_PCIE_TX: gpu.pcie_tx % wrap,
                FIELD_PCIE_RX: gpu.pcie_rx % wrap,
                FIELD_NVLINK_TX: gpu.nvlink_tx_kib,
                FIELD_NVLINK_RX: gpu.nvlink_rx_kib,
            }.get(fid)
            if fid in gpu.field_errors:
                slot.nvmlReturn = gpu.field_errors[fid]
            elif fid == FIELD_NVLINK_LINK_COUNT and scope == 0:
                slot.nvmlReturn = pynvml.NVML_SUCCESS
                slot.value.ullVal = gpu.nvlink_links if gpu.nvlink else 0
            elif total is None or (not is_nvlink and scope != 0):
                slot.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            elif is_nvlink and not gpu.nvlink:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif is_nvlink and not self._scope_ok(gpu, scope):
                slot.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            elif is_nvlink and scope in gpu.link_errors:
                slot.nvmlReturn = gpu.link_errors[scope]
            else:
                slot.nvmlReturn = pynvml.NVML_SUCCESS
                per_link = is_nvlink and scope != ALL_LINKS
                if is_nvlink and len(gpu.links_down) >= gpu.nvlink_links:
                    total = 0  # no active link: the counters never move
                number = total // gpu.nvlink_links if per_link else total
                if slot.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
                    slot.value.uiVal = number
                else:
                    slot.value.ullVal = number
        return values

    @staticmethod
    def _scope_ok(gpu: FakeGpu, scope: int) -> bool:
        if scope == ALL_LINKS:
            return gpu.nvlink_aggregate
        return scope < gpu.nvlink_links

    def _procs(self, h: Any, fn: str) -> list[Any]:
        gpu = self._gpu(h, fn)
        return [pynvml.nvmlFriendlyObject({"pid": p, "usedGpuMemory": m}) for p, m in gpu.processes]

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any) -> list[Any]:
        return self._procs(h, "nvmlDeviceGetComputeRunningProcesses_v3")

    def _nvmlDeviceGetComputeRunningProcesses_v2(self, h: Any) -> list[Any]:
        return self._procs(h, "nvmlDeviceGetComputeRunningProcesses_v2")

    def _nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return self._procs(h, "nvmlDeviceGetComputeRunningProcesses")

    # -- GPM -------------------------------------------------------------------------
    def _nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(self._gpu(h, "nvmlGpmQueryDeviceSupport").gpm_supported)
        return support

    def _nvmlGpmSampleAlloc(self) -> Any:
        self._gpm_next += 0x10
        self._gpm_samples[self._gpm_next] = None
        return _pointer(self._gpm_next, pynvml.c_nvmlGpmSample_t)

    def _nvmlGpmSampleFree(self, sample: Any) -> None:
        if self._gpm_samples.pop(_key(sample), "gone") == "gone":
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    @property
    def gpm_samples_allocated(self) -> int:
        return len(self._gpm_samples)

    def _nvmlGpmSampleGet(self, h: Any, sample: Any) -> Any:
        gpu = self._gpu(h, "nvmlGpmSampleGet")
        index = self._index[_key(h)]
        if _key(sample) not in self._gpm_samples:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_samples[_key(sample)] = (index, self.clock(), gpu.pcie_tx, gpu.pcie_rx)
        return sample

    def _nvmlGpmMetricsGet(self, request: Any) -> Any:
        first = self._gpm_samples.get(_key(request.sample1))
        second = self._gpm_samples.get(_key(request.sample2))
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if first is None or second is None or first[0] != second[0]:
                metric.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
                continue
            gpu = self.gpus[second[0]]
            seconds = second[1] - first[1]
            rates = (None, None)
            if seconds > 0 and gpu.gpm_pcie:
                rates = (
                    (second[2] - first[2]) / 2**20 / seconds,
                    (second[3] - first[3]) / 2**20 / seconds,
                )
            value = {
                pynvml.NVML_GPM_METRIC_SM_UTIL: gpu.gpm_sm_util,
                pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: gpu.gpm_occupancy,
                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: gpu.gpm_tensor,
                pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: gpu.gpm_dram,
                pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: rates[0],
                pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: rates[1],
            }.get(metric.metricId)
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = pynvml.NVML_SUCCESS
            metric.value = value if seconds >= 0.1 else GPM_BOGUS

        return request

    # -- events ----------------------------------------------------------------------
    def _nvmlEventSetCreate(self) -> Any:
        self.event_sets_created += 1
        return _pointer(0x5000_0000 + 0x10 * self.event_sets_created, pynvml.c_nvmlEventSet_t)

    def break_event_set(self) -> None:
        """The current event set answers UNKNOWN from now on (until freed and rebuilt)."""
        self._broken_sets.add(0x5000_0000 + 0x10 * self.event_sets_created)

    def _nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: Any) -> None:
        self._gpu(h, "nvmlDeviceRegisterEvents")  # raises for a lost GPU or an injected error
        assert types & pynvml.nvmlEventTypeXidCriticalError
        self.registered.add(self._index[_key(h)])

    def _nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self.in_wait.set()
        self.release_waits.wait()
        if _key(event_set) in self._broken_sets:
            time.sleep(timeout_ms / 1000.0 / 10)
            raise _err(pynvml.NVML_ERROR_UNKNOWN)
        try:
            index, xid = self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise _err(pynvml.NVML_ERROR_TIMEOUT) from None
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handles[index]
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def _nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed_event_sets += 1
        self._broken_sets.discard(_key(event_set))
