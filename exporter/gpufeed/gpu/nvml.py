"""The NVML backend. This is the only module in gpufeed that imports `pynvml` (nvidia-ml-py).

How NVML's failures map to what the agent exports:
- NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, DEPRECATED for a reading: that value is
  absent, logged once, and never asked for again on that GPU (so an unsupported call costs
  nothing per sample). Where a newer call replaces a deprecated one (temperature, clock
  events, processes) the first version the driver has is found once and kept.
- GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND from any call, or XID 79 from the event watcher:
  that GPU's `up` is False and its other values are absent; the other GPUs keep reporting.
- UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH (a driver upgraded or unloaded
  under the agent): the library itself is gone, so every GPU is down.
  In both cases the backend re-initialises NVML on an exponential back-off and brings the
  GPUs back by UUID once they answer.
- Any other error (TIMEOUT, UNKNOWN, ...): that value is absent for this sample only.
- No library or driver: the constructor raises `NvmlUnavailable` with a one-line reason.

Readings of one GPU are one pass; counters that come from NVML field values (PCIe and NVLink
traffic) are fetched in one `nvmlDeviceGetFieldValues` call per GPU. The 20 ms-blocking
`nvmlDeviceGetPcieThroughput` is never called. GPM (Hopper and newer) is in `nvml_gpm.py`,
the XID event thread in `nvml_xid.py`, the running totals in `counters.py`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufeed import vocabulary
from gpufeed.gpu.backend import BackendName, GpuIdentity, GpuProcess, GpuSample
from gpufeed.gpu.counters import Integral, WrappingCounter
from gpufeed.gpu.nvml_gpm import GpmError, GpmReading, GpmSession
from gpufeed.gpu.nvml_xid import XidCounts, XidWatcher
from gpufeed.logonce import LogOnce

log = logging.getLogger("gpufeed.gpu.nvml")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host: no driver, no library, or no GPU. One-line message."""


# Clock event reasons (name, nvml.h bit): the one list is gpufeed.vocabulary's.
# Only the bits the GPU reports as supported are exported (nvmlDeviceGetSupportedClocks...).
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = vocabulary.CLOCK_EVENT_REASON_BITS
# Where the supported mask cannot be read: the bits every driver since R535 knows.
_CLASSIC_REASON_BITS = 0x1FF

# nvml.h: "A scopeId of UINT_MAX returns aggregate value summed up across all links".
ALL_NVLINKS = 0xFFFFFFFF
# NVML_FI_DEV_NVLINK_LINK_COUNT: the number of NVLinks this GPU has (not the library's maximum).
FIELD_NVLINK_LINK_COUNT = 91
FIELD_PCIE_TX_BYTES = 197
FIELD_PCIE_RX_BYTES = 198


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One NVML field value read as a counter. Field ids are nvml.h's, a stable ABI."""

    sample_attr: str
    field_id: int
    scope_id: int
    bytes_per_unit: float


COUNTER_FIELDS: tuple[FieldSpec, ...] = (
    # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES: bytes since driver load (TX = device to
    # host); R555 and newer. nvml.h: "Value can be wrapped": see counters.WrappingCounter.
    FieldSpec("pcie_transmit_bytes_total", FIELD_PCIE_TX_BYTES, 0, 1.0),
    FieldSpec("pcie_receive_bytes_total", FIELD_PCIE_RX_BYTES, 0, 1.0),
    # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / RX: data payload (no protocol overhead) in KiB,
    # a running counter; scope ALL_NVLINKS sums the links.
    FieldSpec("nvlink_transmit_bytes_total", 138, ALL_NVLINKS, 1024.0),
    FieldSpec("nvlink_receive_bytes_total", 139, ALL_NVLINKS, 1024.0),
)
_PCIE_ATTRS = ("pcie_transmit_bytes_total", "pcie_receive_bytes_total")
_FIELD_OF = {s.sample_attr: s.field_id for s in COUNTER_FIELDS}

# c_nvmlValue_t member for each NVML_VALUE_TYPE_* (0..6), and the integer types' widths.
_VALUE_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_VALUE_BITS = {1: 32, 2: 64, 3: 64, 4: 64, 5: 32, 6: 16}

_CLOCK_EVENT_CALLS = (
    "nvmlDeviceGetCurrentClocksEventReasons",  # R535 and newer
    "nvmlDeviceGetCurrentClocksThrottleReasons",  # older drivers; removed in CUDA 14
)
_CLOCK_SUPPORTED_CALLS = (
    "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetSupportedClocksThrottleReasons",
)
_TEMPERATURE_CALLS = (
    "nvmlDeviceGetTemperatureV",  # R555 and newer
    "nvmlDeviceGetTemperature",  # DEPRECATED from CUDA 13, removed in CUDA 14
)
_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)

# NVML error names (looked up on the module: an old pynvml may lack the newer ones).
_ABSENT = ("NOT_SUPPORTED", "NO_PERMISSION", "FUNCTION_NOT_FOUND", "DEPRECATED")
_GPU_LOST = ("GPU_IS_LOST", "RESET_REQUIRED", "GPU_NOT_FOUND")
_LIBRARY_DOWN = ("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH")


class _GpuLost(Exception):
    """Raised inside one GPU's reading pass when NVML says the GPU is lost."""


class _LibraryDown(Exception):
    """Raised inside a reading pass when NVML says the library itself no longer works."""


@dataclass(slots=True)
class _Device:
    """Mutable per-GPU state of the backend (never exported as such)."""

    index: int
    handle: Any
    identity: GpuIdentity
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    fields: tuple[FieldSpec, ...] = COUNTER_FIELDS
    # last value of each per-link field entry that answered, by (field id, link)
    link_values: dict[tuple[int, int], float] = field(default_factory=dict)
    nvlinks: tuple[int, ...] | None = None  # active links; None: the driver cannot say
    clock_supported: int | None = None
    mig_enabled: bool | None = None
    gpm: GpmSession | None = None
    gpm_last: GpmReading | None = None
    pcie_source: str | None = None  # "gpm" or "field", chosen at the first reading
    pcie_fields: dict[str, WrappingCounter] = field(default_factory=dict)
    pcie_bits: dict[str, int] = field(default_factory=dict)  # the fields' value type width
    pcie_gpm: dict[str, Integral] = field(default_factory=dict)
    busy: Integral = field(default_factory=Integral)
    busy_at: float | None = None


class _Versioned:
    """One NVML API with several versions; the first the driver has is found once and kept."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.chosen = 0

    @property
    def name(self) -> str | None:
        return self.names[self.chosen] if self.chosen < len(self.names) else None


class NvmlBackend:
    """Reads every GPU through NVML. Construct it once; `sample()` from one thread at a time."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        reinit_initial_seconds: float = 5.0,
        reinit_max_seconds: float = 300.0,
        watch_xid: bool = True,
        event_timeout_ms: int = 250,
    ) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable(
                "the nvidia-ml-py package (module pynvml) is not installed"
            ) from exc
        self._nv: Any = pynvml
        self._clock = clock
        self._reinit_initial = reinit_initial_seconds
        self._reinit_max = reinit_max_seconds
        self._backoff = reinit_initial_seconds
        self._next_reinit: float | None = None
        self._watch_xid = watch_xid
        self._event_timeout_ms = event_timeout_ms
        self._log = LogOnce(log)  # each unsupported reading or failure once
        self._clock_events = _Versioned(_CLOCK_EVENT_CALLS)
        self._clock_supported = _Versioned(_CLOCK_SUPPORTED_CALLS)
        self._temperature = _Versioned(_TEMPERATURE_CALLS)
        self._processes = _Versioned(_PROCESS_CALLS)
        self._memory_v2 = True  # until the driver shows it has no nvmlDeviceGetMemoryInfo_v2
        self._xid_counts = XidCounts()
        self._watcher: XidWatcher | None = None
        self._closed = False
        self.last_sample_seconds = 0.0
        nv = self._nv
        self._absent_codes = _codes(nv, _ABSENT)
        self._lost_codes = _codes(nv, _GPU_LOST)
        self._down_codes = _codes(nv, _LIBRARY_DOWN)
        self._field_refused = self._absent_codes | {nv.NVML_ERROR_INVALID_ARGUMENT}
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(_init_failure(nv, exc)) from exc
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            self._shutdown()
            raise NvmlUnavailable(f"NVML initialised but cannot count GPUs: {exc}") from exc
        if count == 0:
            self._shutdown()
            raise NvmlUnavailable("NVML initialised but found no GPU on this host")
        self._driver_version = self._driver()
        self._devices = [self._open(i) for i in range(count)]
        for dev in self._devices:
            self._gpm_open_session_or_mark_lost(dev)
        self._start_watcher()

    # -- GpuBackend ----------------------------------------------------------------------

    @property
    def name(self) -> BackendName:
        return "nvml"

    def devices(self) -> list[GpuIdentity]:
        return [d.identity for d in self._devices]

    def sample(self) -> list[GpuSample]:
        if self._closed:
            return []
        started = time.perf_counter()
        for index in self._xid_counts.take_lost():
            if 0 <= index < len(self._devices) and not self._devices[index].lost:
                self._mark_lost(self._devices[index], "XID 79 (fallen off the bus)")
        if self._next_reinit is not None and self._clock() >= self._next_reinit:
            self._reinit()
        try:
            out = [self._sample(dev) for dev in self._devices]
        except _LibraryDown as exc:
            for dev in self._devices:
                if not dev.lost:
                    self._mark_lost(dev, f"NVML itself stopped working: {exc}")
            out = [self._lost_sample(dev) for dev in self._devices]
        self.last_sample_seconds = time.perf_counter() - started
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_watcher()
        for dev in self._devices:
            self._gpm_free(dev)
        self._shutdown()

    # -- introspection for tests and the benchmark ---------------------------------------

    @property
    def xid_watched(self) -> tuple[int, ...]:
        return self._watcher.watching if self._watcher is not None else ()

    @property
    def next_reinit_at(self) -> float | None:
        return self._next_reinit

    def pcie_source(self, index: int) -> str | None:
        """Where GPU `index`'s PCIe byte counters come from: "gpm", "field" or None."""
        return self._devices[index].pcie_source

    # -- set-up --------------------------------------------------------------------------

    def _driver(self) -> str:
        try:
            return _text(self._nv.nvmlSystemGetDriverVersion())
        except self._nv.NVMLError:
            return ""

    def _open(self, index: int) -> _Device:
        nv = self._nv
        blank = GpuIdentity(index, "", "", self._driver_version, "")
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            dev = _Device(index, None, blank)
            self._mark_lost(dev, f"nvmlDeviceGetHandleByIndex: {exc}")
            return dev
        dev = _Device(index, handle, blank)
        dev.identity = self._identity(dev)
        self._probe_or_lose(dev)
        return dev

    def _probe_or_lose(self, dev: _Device) -> None:
        try:
            self._probe(dev)
        except _GpuLost as exc:
            self._mark_lost(dev, str(exc))
        except _LibraryDown as exc:
            self._mark_lost(dev, f"NVML itself stopped working: {exc}")

    def _probe(self, dev: _Device) -> None:
        """What this GPU supports that does not change while it runs: its active NVLinks and
        the clock event reasons it can report. Errors here leave the value unknown."""
        dev.nvlinks = self._active_nvlinks(dev)
        if dev.nvlinks == ():
            # No active link: the aggregate would read 0 for ever; absent says the truth.
            dev.fields = tuple(s for s in dev.fields if s.sample_attr in _PCIE_ATTRS)
        mask = self._call_versioned(
            dev, "clock_events_supported", self._clock_supported, dev.handle
        )
        dev.clock_supported = None if mask is None else int(mask)

    def _active_nvlinks(self, dev: _Device) -> tuple[int, ...] | None:
        """The GPU's active links; () for none; None where the driver cannot tell."""
        nv = self._nv
        count: int | None = None
        got = self._call(
            dev,
            "nvlink_count",
            "nvmlDeviceGetFieldValues",
            dev.handle,
            [(FIELD_NVLINK_LINK_COUNT, 0)],
        )
        if got is not None and int(got[0].nvmlReturn) == nv.NVML_SUCCESS:
            count = int(_field_number(got[0]) or 0)
        active: list[int] = []
        for link in range(count if count is not None else int(nv.NVML_NVLINK_MAX_LINKS)):
            try:
                state = nv.nvmlDeviceGetNvLinkState(dev.handle, link)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code in self._lost_codes:
                    raise _GpuLost(f"nvmlDeviceGetNvLinkState: {exc}") from exc
                if code in self._down_codes:
                    raise _LibraryDown(f"nvmlDeviceGetNvLinkState: {exc}") from exc
                if code == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                    return None
                if count is None and code in self._field_refused:
                    break  # probing: the first link the GPU does not have ends the list
                continue
            except AttributeError:
                return None
            if int(state) == nv.NVML_FEATURE_ENABLED:
                active.append(link)
        return tuple(active)

    def _identity(self, dev: _Device) -> GpuIdentity:
        """UUID, name and PCI bus id; a part NVML refuses is left empty, never guessed."""
        nv = self._nv

        def text(fn: Callable[[], Any]) -> str:
            try:
                return _text(fn())
            except nv.NVMLError:
                return ""

        h = dev.handle
        return GpuIdentity(
            index=dev.index,
            uuid=text(lambda: nv.nvmlDeviceGetUUID(h)),
            name=text(lambda: nv.nvmlDeviceGetName(h)),
            driver_version=self._driver_version,
            pci_bus_id=text(lambda: nv.nvmlDeviceGetPciInfo(h).busId),
        )

    def _start_watcher(self) -> None:
        if not self._watch_xid:
            return
        handles = [(d.index, d.handle) for d in self._devices if not d.lost]
        if not handles:
            return
        self._watcher = XidWatcher(
            self._nv, handles, self._xid_counts, timeout_ms=self._event_timeout_ms
        )
        self._watcher.start()

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _shutdown(self) -> None:
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()

    # -- error handling ------------------------------------------------------------------

    def _absent(self, dev: _Device, what: str, why: object) -> None:
        """Marks a reading unsupported on this GPU for good, with one log line."""
        dev.unsupported.add(what)
        self._log.log(
            logging.INFO,
            ("absent", dev.index, what),
            "GPU %d: %s not available (%s); left out from now on",
            dev.index,
            what,
            why,
        )

    def _error(self, dev: _Device, what: str, code: int | None, exc: object) -> None:
        """Classifies an NVML error code from a reading; raises for a lost GPU or library."""
        if code in self._lost_codes:
            raise _GpuLost(f"{what}: {exc}")
        if code in self._down_codes:
            raise _LibraryDown(f"{what}: {exc}")
        if code in self._absent_codes:
            self._absent(dev, what, exc)
            return
        self._log.log(
            logging.WARNING,
            ("transient", dev.index, what, code),
            "GPU %d: reading %s failed (%s); left out of this sample, will retry",
            dev.index,
            what,
            exc,
        )

    def _call(self, dev: _Device, what: str, fn_name: str, *args: Any, **kw: Any) -> Any:
        """One NVML call for one reading; None when the value is absent."""
        if what in dev.unsupported:
            return None
        nv = self._nv
        try:
            return getattr(nv, fn_name)(*args, **kw)
        except nv.NVMLError as exc:
            self._error(dev, what, getattr(exc, "value", None), exc)
        except (AttributeError, nv.NVMLLibraryMismatchError) as exc:
            self._absent(dev, what, f"function not found: {exc}")
        return None

    def _call_versioned(self, dev: _Device, what: str, api: _Versioned, *args: Any) -> Any:
        """Like `_call`, falling back to older versions of the API once, for every GPU.

        FUNCTION_NOT_FOUND (an older driver) and DEPRECATED (a newer one that retired the
        call) both move on to the next version."""
        if what in dev.unsupported:
            return None
        nv = self._nv
        retired = _codes(nv, ("FUNCTION_NOT_FOUND", "DEPRECATED"))
        while (fn_name := api.name) is not None:
            try:
                return getattr(nv, fn_name)(*args)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code not in retired:
                    self._error(dev, what, code, exc)
                    return None
            except (AttributeError, nv.NVMLLibraryMismatchError):
                pass
            api.chosen += 1
            if api.name is not None:
                log.info("%s not usable with this driver; using %s from now on", fn_name, api.name)
        self._absent(dev, what, "no version of the call works with this driver")
        return None

    # -- lost GPUs and re-initialisation -------------------------------------------------

    def _mark_lost(self, dev: _Device, why: str) -> None:
        dev.lost = True
        dev.busy_at = None
        self._gpm_free(dev)
        log.warning(
            "GPU %d (%s) is lost: %s; reporting gpufeed_gpu_up 0 for it, the others go on",
            dev.index,
            dev.identity.uuid or "uuid unknown",
            why,
        )
        self._schedule_reinit()

    def _schedule_reinit(self) -> None:
        if self._next_reinit is None:
            self._next_reinit = self._clock() + self._backoff

    def _reinit(self) -> None:
        """Shuts NVML down and up again, and looks for the lost GPUs by UUID (indices move)."""
        nv = self._nv
        lost = [d.index for d in self._devices if d.lost]
        log.info("re-initialising NVML to look for lost GPU(s) %s", lost)
        self._stop_watcher()
        for dev in self._devices:
            self._gpm_free(dev)
        self._shutdown()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            for dev in self._devices:
                if not dev.lost:
                    self._mark_lost(dev, f"nvmlInit failed on re-initialisation: {exc}")
            self._back_off()
            return
        for dev in self._devices:
            self._reopen(dev)
        if any(d.lost for d in self._devices):
            self._back_off()
        else:
            self._backoff = self._reinit_initial
            self._next_reinit = None
        for dev in self._devices:
            self._gpm_open_session_or_mark_lost(dev)
        self._start_watcher()

    def _reopen(self, dev: _Device) -> None:
        nv = self._nv
        try:
            if dev.identity.uuid:
                handle = nv.nvmlDeviceGetHandleByUUID(dev.identity.uuid)
            else:
                handle = nv.nvmlDeviceGetHandleByIndex(dev.index)
            # Any answer, even "not supported", shows the GPU is on the bus again.
            try:
                nv.nvmlDeviceGetMemoryInfo(handle)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) not in self._absent_codes:
                    raise
        except nv.NVMLError as exc:
            if not dev.lost:
                self._mark_lost(dev, f"not found again after re-initialisation: {exc}")
            return
        dev.handle = handle
        if dev.lost:
            dev.lost = False
            if not dev.identity.uuid:
                dev.identity = self._identity(dev)
            self._probe_or_lose(dev)
            if not dev.lost:
                log.warning("GPU %d (%s) answers again; reporting it", dev.index, dev.identity.uuid)

    def _back_off(self) -> None:
        """After a failed attempt: wait twice as long as last time, up to the maximum."""
        self._backoff = min(self._backoff * 2.0, self._reinit_max)
        self._next_reinit = self._clock() + self._backoff
        log.info("next NVML re-initialisation in %.0f s", self._backoff)

    # -- one GPU's readings --------------------------------------------------------------

    def _lost_sample(self, dev: _Device) -> GpuSample:
        # XID counts are the agent's own counts, not readings of the GPU: they stay, so the
        # XID 79 that took the GPU down is visible while it is down.
        return GpuSample(
            identity=dev.identity, up=False, xid_errors_total=self._xid_counts.of(dev.index)
        )

    def _sample(self, dev: _Device) -> GpuSample:
        if dev.lost:
            return self._lost_sample(dev)
        try:
            return self._read(dev)
        except _GpuLost as exc:
            self._mark_lost(dev, str(exc))
            return self._lost_sample(dev)

    def _read(self, dev: _Device) -> GpuSample:
        nv, h = self._nv, dev.handle
        now = self._clock()
        self._check_mig(dev)
        util = self._call(dev, "utilization", "nvmlDeviceGetUtilizationRates", h)
        used, reserved, total = self._memory(dev)
        power_mw = self._call(dev, "power", "nvmlDeviceGetPowerUsage", h)
        energy_mj = self._call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        temp = self._call_versioned(
            dev, "temperature", self._temperature, h, nv.NVML_TEMPERATURE_GPU
        )
        sm_mhz = self._call(dev, "sm_clock", "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
        gpm, gpm_fresh = self._gpm_reading(dev, now)
        counters = self._field_counters(dev)
        self._pcie(dev, counters, gpm if gpm_fresh else None)
        utilization = _scaled(util.gpu if util is not None else None, 0.01)
        return GpuSample(
            identity=dev.identity,
            up=True,
            utilization_ratio=utilization,
            busy_seconds_total=self._busy(dev, utilization, now),
            sm_active_ratio=gpm.sm_active_ratio if gpm is not None else None,
            sm_occupancy_ratio=gpm.sm_occupancy_ratio if gpm is not None else None,
            tensor_active_ratio=gpm.tensor_active_ratio if gpm is not None else None,
            dram_bandwidth_utilization_ratio=(
                gpm.dram_bandwidth_utilization_ratio if gpm is not None else None
            ),
            memory_bandwidth_utilization_ratio=_scaled(
                util.memory if util is not None else None, 0.01
            ),
            memory_used_bytes=used,
            memory_reserved_bytes=reserved,
            memory_total_bytes=total,
            power_watts=_scaled(power_mw, 0.001),
            energy_joules_total=_scaled(energy_mj, 0.001),
            temperature_celsius=_scaled(temp, 1.0),
            sm_clock_hertz=_scaled(sm_mhz, 1e6),
            clock_events_active=self._clock_reasons(dev),
            pcie_transmit_bytes_total=counters.get("pcie_transmit_bytes_total"),
            pcie_receive_bytes_total=counters.get("pcie_receive_bytes_total"),
            nvlink_transmit_bytes_total=counters.get("nvlink_transmit_bytes_total"),
            nvlink_receive_bytes_total=counters.get("nvlink_receive_bytes_total"),
            xid_errors_total=self._xid_counts.of(dev.index),
            processes=self._running(dev),
            mig_enabled=dev.mig_enabled,
        )

    def _memory(self, dev: _Device) -> tuple[float | None, float | None, float | None]:
        """(used, reserved, total) bytes. The v2 call's `used` excludes the memory the driver
        reserves for itself, which v1 counts as used (v2 is what nvidia-smi shows)."""
        nv = self._nv
        if self._memory_v2 and "memory" not in dev.unsupported:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(dev.handle, version=nv.nvmlMemory_v2)
            except nv.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code not in _codes(nv, ("FUNCTION_NOT_FOUND", "DEPRECATED")):
                    self._error(dev, "memory", code, exc)
                    return None, None, None
                self._memory_v2 = False
                log.info(
                    "nvmlDeviceGetMemoryInfo_v2 not in this driver; memory used includes "
                    "reserved memory and reserved is left out"
                )
            except (AttributeError, TypeError, nv.NVMLLibraryMismatchError):
                self._memory_v2 = False
            else:
                return _scaled(mem.used, 1.0), _scaled(mem.reserved, 1.0), _scaled(mem.total, 1.0)
        mem = self._call(dev, "memory", "nvmlDeviceGetMemoryInfo", dev.handle)
        if mem is None:
            return None, None, None
        return _scaled(mem.used, 1.0), None, _scaled(mem.total, 1.0)

    def _busy(self, dev: _Device, utilization: float | None, now: float) -> float | None:
        """Seconds the GPU was busy, summed at every sample, so that rate() over a 15 s scrape
        sees every sample's utilization, not only the last one. A gap (utilization absent)
        is not counted."""
        if utilization is None:
            dev.busy_at = None
            return dev.busy.total
        elapsed = 0.0 if dev.busy_at is None else max(now - dev.busy_at, 0.0)
        dev.busy_at = now
        return dev.busy.add(utilization * elapsed)

    def _check_mig(self, dev: _Device) -> None:
        modes = self._call(dev, "mig_mode", "nvmlDeviceGetMigMode", dev.handle)
        enabled = None if modes is None else bool(modes[0] == self._nv.NVML_DEVICE_MIG_ENABLE)
        if dev.mig_enabled is not None and enabled is not None and enabled != dev.mig_enabled:
            # Utilization and GPM answer differently with MIG on: probe everything again.
            log.info("GPU %d: MIG mode is now %s; probing its readings again", dev.index, enabled)
            dev.unsupported = {"mig_mode"} & dev.unsupported
            dev.fields = COUNTER_FIELDS
            dev.link_values = {}
            self._probe(dev)
            self._gpm_free(dev)
            self._gpm_open_session(dev)
        dev.mig_enabled = enabled

    def _clock_reasons(self, dev: _Device) -> tuple[tuple[str, bool], ...] | None:
        mask = self._call_versioned(dev, "clock_events", self._clock_events, dev.handle)
        if mask is None:
            return None
        bits = int(mask)
        supported = _CLASSIC_REASON_BITS if dev.clock_supported is None else dev.clock_supported
        return tuple(
            (name, bool(bits & bit)) for name, bit in CLOCK_EVENT_REASONS if supported & bit
        )

    def _pcie(self, dev: _Device, counters: dict[str, float], gpm: GpmReading | None) -> None:
        """PCIe byte totals, in place in `counters`: from GPM's rates where the GPU has them
        (immune to the field counters' wrap), else from the fields, unwrapped."""
        read_now: list[str] = []
        for attr in _PCIE_ATTRS:
            raw = counters.pop(attr, None)
            if raw is not None:
                counter = dev.pcie_fields.setdefault(attr, WrappingCounter())
                counter.update(int(raw), dev.pcie_bits.get(attr))
                read_now.append(attr)
        if dev.pcie_source is None:
            if gpm is None and dev.gpm is not None:
                return  # GPM has not had its first 100 ms yet: wait for it before choosing
            if gpm is not None and gpm.pcie_transmit_bytes is not None:
                dev.pcie_source = "gpm"
            elif read_now and all(dev.pcie_fields[attr].wide for attr in read_now):
                dev.pcie_source = "field"
            elif read_now:
                # 32 bits (or not yet shown wider) and no GPM: read once per sample, a field
                # loses every 4 GiB turn between two samples (one turn per ~70 ms on a Gen5
                # x16 link), and an undercount looks like a plausible rate. Absent instead.
                self._log.log(
                    logging.INFO,
                    ("pcie-32-bit", dev.index),
                    "GPU %d: PCIe byte counters left out: the driver's fields are 32 bits "
                    "wide and this GPU has no GPM, so whole wraps between two samples would "
                    "be lost (docs/gpu.md)",
                    dev.index,
                )
                return
            else:
                return
            log.info("GPU %d: PCIe byte counters from %s", dev.index, dev.pcie_source)
        if dev.pcie_source == "field":
            for attr in read_now:
                total = dev.pcie_fields[attr].total
                if total is not None:
                    counters[attr] = total
            return
        if gpm is not None:
            amounts = (gpm.pcie_transmit_bytes, gpm.pcie_receive_bytes)
            for attr, amount in zip(_PCIE_ATTRS, amounts, strict=True):
                if amount is not None:
                    dev.pcie_gpm.setdefault(attr, Integral()).add(amount)
        for attr, integral in dev.pcie_gpm.items():
            if integral.total is not None:
                counters[attr] = integral.total

    def _field_counters(self, dev: _Device) -> dict[str, float]:
        """Every counter field of this GPU in one nvmlDeviceGetFieldValues call.

        A field the GPU refuses is dropped from later batches. An NVLink aggregate
        (scope ALL_NVLINKS) the driver refuses is replaced, once, by one entry per active
        link, summed. In that sum a link that stops answering (down, or refused) keeps its
        last value: its traffic stopped, and leaving it out would lower the sum, which
        Prometheus reads as a counter reset.
        """
        specs = dev.fields
        if not specs or "field_values" in dev.unsupported:
            return {}
        nv = self._nv
        ids = [(s.field_id, s.scope_id) for s in specs]
        values = self._call(dev, "field_values", "nvmlDeviceGetFieldValues", dev.handle, ids)
        if values is None:
            return {}
        out: dict[str, float] = {}
        keep: list[FieldSpec] = []
        per_link: set[str] = set()
        for spec, value in zip(specs, values, strict=False):
            ret = int(value.nvmlReturn)
            number = _field_number(value) if ret == nv.NVML_SUCCESS else None
            # one link's entry of an NVLink field (link 0 is scope 0, like the PCIe fields)
            link = spec.sample_attr not in _PCIE_ATTRS and spec.scope_id != ALL_NVLINKS
            if link:
                per_link.add(spec.sample_attr)
            if number is not None:
                keep.append(spec)
                if link:
                    dev.link_values[(spec.field_id, spec.scope_id)] = number * spec.bytes_per_unit
                else:
                    out[spec.sample_attr] = number * spec.bytes_per_unit
                    if spec.sample_attr in _PCIE_ATTRS and int(value.valueType) in _VALUE_BITS:
                        dev.pcie_bits[spec.sample_attr] = _VALUE_BITS[int(value.valueType)]
            elif ret in self._lost_codes:
                raise _GpuLost(f"field {spec.field_id}: {nv.NVMLError(ret)}")
            elif ret in self._down_codes:
                raise _LibraryDown(f"field {spec.field_id}: {nv.NVMLError(ret)}")
            elif spec.scope_id == ALL_NVLINKS and ret in self._field_refused:
                links = dev.nvlinks
                if links is None:
                    links = tuple(range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))))
                keep.extend(
                    FieldSpec(spec.sample_attr, spec.field_id, link, spec.bytes_per_unit)
                    for link in links
                )
                self._log.log(
                    logging.INFO,
                    ("per-link", dev.index, spec.sample_attr),
                    "GPU %d: %s: all-links total refused (%s); summing links %s instead",
                    dev.index,
                    spec.sample_attr,
                    nv.NVMLError(ret),
                    list(links),
                )
            elif link and (spec.field_id, spec.scope_id) in dev.link_values:
                keep.append(spec)  # counted before: its last value stays in the sum
                self._log.log(
                    logging.WARNING,
                    ("link-refused", dev.index, spec.sample_attr, spec.scope_id),
                    "GPU %d: %s: link %d answered before and does not now (%s); its last "
                    "value stays in the sum",
                    dev.index,
                    spec.sample_attr,
                    spec.scope_id,
                    nv.NVMLError(ret),
                )
            elif ret in self._field_refused:
                # INVALID_ARGUMENT here means "field id (or link) unknown to this driver".
                self._log.log(
                    logging.DEBUG if link else logging.INFO,
                    ("absent", dev.index, spec.sample_attr, spec.scope_id),
                    "GPU %d: %s (scope %d) not available (%s); left out from now on",
                    dev.index,
                    spec.sample_attr,
                    spec.scope_id,
                    nv.NVMLError(ret),
                )
            else:
                keep.append(spec)  # transient: absent from this sample only
        dev.fields = tuple(keep)
        for attr in per_link:
            fid = _FIELD_OF[attr]
            answered = [v for (f, _), v in dev.link_values.items() if f == fid]
            if answered:
                out[attr] = sum(answered)
        return out

    def _running(self, dev: _Device) -> tuple[GpuProcess, ...]:
        procs = self._call_versioned(dev, "processes", self._processes, dev.handle)
        if not procs:
            return ()
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(
                GpuProcess(pid=int(p.pid), used_memory_bytes=None if used is None else int(used))
            )
        return tuple(out)

    # -- GPM (Hopper and newer) ----------------------------------------------------------

    def _gpm_open_session_or_mark_lost(self, dev: _Device) -> None:
        """`_gpm_open_session` outside a reading pass (start-up, re-initialisation), where a
        lost GPU or library is recorded here instead of by the pass's handler."""
        if dev.lost:
            return
        try:
            self._gpm_open_session(dev)
        except _GpuLost as exc:
            self._mark_lost(dev, str(exc))
        except _LibraryDown as exc:
            self._mark_lost(dev, f"NVML itself stopped working: {exc}")

    def _gpm_open_session(self, dev: _Device) -> None:
        """A new GPM session (its baseline taken now) where the GPU has GPM and none is open;
        raises _GpuLost / _LibraryDown from the support query."""
        if "gpm" in dev.unsupported or dev.gpm is not None:
            return
        support = self._call(dev, "gpm", "nvmlGpmQueryDeviceSupport", dev.handle)
        if support is None:
            return
        if not support.isSupportedDevice:
            self._absent(dev, "gpm", "GPM needs a Hopper or newer GPU")
            return
        dev.gpm_last = None  # a new baseline: no reading until 100 ms have passed
        try:
            dev.gpm = GpmSession(self._nv, dev.handle, self._clock())
        except GpmError as exc:
            self._error(dev, "gpm", exc.code, exc)

    def _gpm_reading(self, dev: _Device, now: float) -> tuple[GpmReading | None, bool]:
        """(the latest GPM reading, whether it is new in this sample)."""
        if dev.gpm is None or "gpm" in dev.unsupported:
            return None, False
        try:
            reading = dev.gpm.read(now)
        except GpmError as exc:
            if exc.code is not None:
                self._error(dev, "gpm", exc.code, exc)
            if "gpm" in dev.unsupported:
                self._gpm_free(dev)
            return None, False
        if reading is None:
            return dev.gpm_last, False  # under 100 ms since the last one: keep showing it
        dev.gpm_last = reading
        return reading, True

    def _gpm_free(self, dev: _Device) -> None:
        if dev.gpm is not None:
            dev.gpm.free()
        dev.gpm = None
        dev.gpm_last = None


def _codes(nv: Any, names: tuple[str, ...]) -> set[int]:
    return {int(c) for n in names if (c := getattr(nv, f"NVML_ERROR_{n}", None)) is not None}


def _init_failure(nv: Any, exc: Exception) -> str:
    """The one line the agent logs (auto) or dies with (--gpu.backend=nvml)."""
    code = getattr(exc, "value", None)
    if code == nv.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this host"
    if code == nv.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA kernel driver is not loaded (nvmlInit: Driver Not Loaded)"
    if code == nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return (
            "NVML library and NVIDIA kernel driver versions differ "
            "(driver upgraded without a reboot?)"
        )
    if code == nv.NVML_ERROR_NO_PERMISSION:
        return "no permission to use NVML (cannot open /dev/nvidia*)"
    return f"nvmlInit failed: {exc}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _scaled(value: Any, factor: float) -> float | None:
    if value is None:
        return None
    v = float(value) * factor
    return v if math.isfinite(v) else None


def _field_number(value: Any) -> float | None:
    kind = int(value.valueType)
    if not 0 <= kind < len(_VALUE_MEMBER):
        return None
    return float(getattr(value.value, _VALUE_MEMBER[kind]))
