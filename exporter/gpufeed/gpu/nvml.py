"""The NVML backend. This is the only module in gpufeed that imports `pynvml` (nvidia-ml-py).

How NVML's failures map to what the agent exports:
- NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND for a reading: that value is absent, logged
  once, and never asked for again on that GPU (so an unsupported call costs nothing per sample).
- GPU_IS_LOST from any call, or XID 79 from the event watcher: that GPU's `up` is False and
  its other values are absent; the other GPUs keep reporting. The backend then tries to
  re-initialise NVML on an exponential back-off and brings the GPU back once it answers.
- Any other error (TIMEOUT, UNKNOWN, ...): that value is absent for this sample only.
- No library or driver: the constructor raises `NvmlUnavailable` with a one-line reason.

Readings of one GPU are one pass; counters that come from NVML field values (PCIe and NVLink
traffic) are fetched in one `nvmlDeviceGetFieldValues` call per GPU. The 20 ms-blocking
`nvmlDeviceGetPcieThroughput` is never called.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufeed.gpu.backend import BackendName, GpuIdentity, GpuProcess, GpuSample
from gpufeed.gpu.nvml_xid import XidCounts, XidWatcher

log = logging.getLogger("gpufeed.gpu.nvml")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host: no driver, no library, or no GPU. One-line message."""


# Clock event reasons: bit values from nvml.h, the same for the "ClocksEventReasons" call and
# its deprecated "ClocksThrottleReasons" predecessor. The names are the `reason` label values.
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

# nvml.h: "A scopeId of UINT_MAX returns aggregate value summed up across all links".
ALL_NVLINKS = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One NVML field value read as a counter. Field ids are nvml.h's, a stable ABI."""

    sample_attr: str
    field_id: int
    scope_id: int
    bytes_per_unit: float


COUNTER_FIELDS: tuple[FieldSpec, ...] = (
    # NVML_FI_DEV_PCIE_COUNT_TX_BYTES / RX_BYTES: bytes since driver load (TX = device to host).
    FieldSpec("pcie_transmit_bytes_total", 197, 0, 1.0),
    FieldSpec("pcie_receive_bytes_total", 198, 0, 1.0),
    # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / RX: data payload (no protocol overhead) in KiB,
    # a running counter; scope ALL_NVLINKS sums the links.
    FieldSpec("nvlink_transmit_bytes_total", 138, ALL_NVLINKS, 1024.0),
    FieldSpec("nvlink_receive_bytes_total", 139, ALL_NVLINKS, 1024.0),
)

# c_nvmlValue_t member for each NVML_VALUE_TYPE_* (0..6).
_VALUE_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

_CLOCK_EVENT_CALLS = (
    "nvmlDeviceGetCurrentClocksEventReasons",  # R535 and newer
    "nvmlDeviceGetCurrentClocksThrottleReasons",  # older drivers
)
_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)

# nvmlGpmMetricsGet: "Percentage of SMs that were busy", 0..100 (DCGM's SM_ACTIVE).
_GPM_SM_UTIL = 2
_GPM_METRICS_GET_VERSION = 1


class _GpuLost(Exception):
    """Raised inside one GPU's reading pass when NVML says the GPU is lost."""


@dataclass(slots=True)
class _Device:
    """Mutable per-GPU state of the backend (never exported as such)."""

    index: int
    handle: Any
    identity: GpuIdentity
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    fields: tuple[FieldSpec, ...] = COUNTER_FIELDS
    # (field id, link) of per-link entries that have answered: part of a running sum
    links_answered: set[tuple[int, int]] = field(default_factory=set)
    mig_enabled: bool | None = None
    gpm_prev: Any = None
    gpm_cur: Any = None
    gpm_request: Any = None


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
        self._logged: set[tuple[object, ...]] = set()
        self._clock_events = _Versioned(_CLOCK_EVENT_CALLS)
        self._processes = _Versioned(_PROCESS_CALLS)
        self._xid_counts = XidCounts()
        self._watcher: XidWatcher | None = None
        self._closed = False
        self.last_sample_seconds = 0.0
        nv = self._nv
        self._absent_codes = {
            nv.NVML_ERROR_NOT_SUPPORTED,
            nv.NVML_ERROR_NO_PERMISSION,
            nv.NVML_ERROR_FUNCTION_NOT_FOUND,
        }
        self._lost_codes = {nv.NVML_ERROR_GPU_IS_LOST}
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
            self._start_gpm(dev)
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
        out = [self._sample(dev) for dev in self._devices]
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
        return dev

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

    def _once(self, key: tuple[object, ...], level: int, msg: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    def _absent(self, dev: _Device, what: str, why: object) -> None:
        """Marks a reading unsupported on this GPU for good, with one log line."""
        dev.unsupported.add(what)
        self._once(
            ("absent", dev.index, what),
            logging.INFO,
            "GPU %d: %s not available (%s); left out from now on",
            dev.index,
            what,
            why,
        )

    def _error(self, dev: _Device, what: str, exc: Exception) -> None:
        """Classifies an NVMLError from a reading; raises _GpuLost for a lost GPU."""
        code = getattr(exc, "value", None)
        if code in self._lost_codes:
            raise _GpuLost(f"{what}: {exc}")
        if code in self._absent_codes:
            self._absent(dev, what, exc)
            return
        self._once(
            ("transient", dev.index, what, code),
            logging.WARNING,
            "GPU %d: reading %s failed (%s); left out of this sample, will retry",
            dev.index,
            what,
            exc,
        )

    def _call(self, dev: _Device, what: str, fn_name: str, *args: Any) -> Any:
        """One NVML call for one reading; None when the value is absent."""
        if what in dev.unsupported:
            return None
        nv = self._nv
        try:
            return getattr(nv, fn_name)(*args)
        except nv.NVMLError as exc:
            self._error(dev, what, exc)
        except (AttributeError, nv.NVMLLibraryMismatchError) as exc:
            self._absent(dev, what, f"function not found: {exc}")
        return None

    def _call_versioned(self, dev: _Device, what: str, api: _Versioned, *args: Any) -> Any:
        """Like `_call`, falling back to older versions of the API once, for every GPU."""
        if what in dev.unsupported:
            return None
        nv = self._nv
        while (fn_name := api.name) is not None:
            try:
                return getattr(nv, fn_name)(*args)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._error(dev, what, exc)
                    return None
            except (AttributeError, nv.NVMLLibraryMismatchError):
                pass
            api.chosen += 1
            if api.name is not None:
                log.info("%s not in this driver; using %s from now on", fn_name, api.name)
        self._absent(dev, what, "no version of the call exists in this driver")
        return None

    # -- lost GPUs and re-initialisation -------------------------------------------------

    def _mark_lost(self, dev: _Device, why: str) -> None:
        dev.lost = True
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
            self._start_gpm(dev)
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
        self._check_mig(dev)
        util = self._call(dev, "utilization", "nvmlDeviceGetUtilizationRates", h)
        mem = self._call(dev, "memory", "nvmlDeviceGetMemoryInfo", h)
        power_mw = self._call(dev, "power", "nvmlDeviceGetPowerUsage", h)
        energy_mj = self._call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        temp = self._call(
            dev, "temperature", "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU
        )
        sm_mhz = self._call(dev, "sm_clock", "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
        counters = self._field_counters(dev)
        return GpuSample(
            identity=dev.identity,
            up=True,
            utilization_ratio=_scaled(util.gpu if util is not None else None, 0.01),
            sm_active_ratio=self._gpm_sm_active(dev),
            memory_bandwidth_utilization_ratio=_scaled(
                util.memory if util is not None else None, 0.01
            ),
            memory_used_bytes=_scaled(mem.used if mem is not None else None, 1.0),
            memory_total_bytes=_scaled(mem.total if mem is not None else None, 1.0),
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

    def _check_mig(self, dev: _Device) -> None:
        modes = self._call(dev, "mig_mode", "nvmlDeviceGetMigMode", dev.handle)
        enabled = None if modes is None else bool(modes[0] == self._nv.NVML_DEVICE_MIG_ENABLE)
        if dev.mig_enabled is not None and enabled is not None and enabled != dev.mig_enabled:
            # Utilization and GPM answer differently with MIG on: probe everything again.
            log.info("GPU %d: MIG mode is now %s; probing its readings again", dev.index, enabled)
            dev.unsupported = {"mig_mode"} & dev.unsupported
            dev.fields = COUNTER_FIELDS
            dev.links_answered = set()
            self._gpm_free(dev)
            self._gpm_start(dev)
        dev.mig_enabled = enabled

    def _clock_reasons(self, dev: _Device) -> tuple[tuple[str, bool], ...] | None:
        mask = self._call_versioned(dev, "clock_events", self._clock_events, dev.handle)
        if mask is None:
            return None
        bits = int(mask)
        return tuple((name, bool(bits & bit)) for name, bit in CLOCK_EVENT_REASONS)

    def _field_counters(self, dev: _Device) -> dict[str, float]:
        """Every counter field of this GPU in one nvmlDeviceGetFieldValues call.

        A field the GPU refuses is dropped from later batches. An NVLink aggregate
        (scope ALL_NVLINKS) the driver refuses is replaced, once, by one entry per link,
        summed; a sum with a link missing in this sample is left out rather than exported
        low, because a dip in a counter reads as a reset.
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
        incomplete: set[str] = set()
        keep: list[FieldSpec] = []
        for spec, value in zip(specs, values, strict=False):
            ret = int(value.nvmlReturn)
            number = _field_number(value) if ret == nv.NVML_SUCCESS else None
            if number is not None:
                out[spec.sample_attr] = (
                    out.get(spec.sample_attr, 0.0) + number * spec.bytes_per_unit
                )
                keep.append(spec)
                if spec.scope_id not in (0, ALL_NVLINKS):
                    dev.links_answered.add((spec.field_id, spec.scope_id))
            elif ret in self._lost_codes:
                raise _GpuLost(f"field {spec.field_id}: {nv.NVMLError(ret)}")
            elif spec.scope_id == ALL_NVLINKS and ret in self._field_refused:
                links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
                keep.extend(
                    FieldSpec(spec.sample_attr, spec.field_id, link, spec.bytes_per_unit)
                    for link in range(links)
                )
                self._once(
                    ("per-link", dev.index, spec.sample_attr),
                    logging.INFO,
                    "GPU %d: %s: all-links total refused (%s); summing the links instead",
                    dev.index,
                    spec.sample_attr,
                    nv.NVMLError(ret),
                )
            elif ret in self._field_refused and (spec.field_id, spec.scope_id) in (
                dev.links_answered
            ):
                # A link that counted before and is refused now: dropping it would lower
                # the sum, which Prometheus reads as a counter reset (a false burst), so
                # the sum is left out while the link refuses.
                incomplete.add(spec.sample_attr)
                keep.append(spec)
                self._once(
                    ("link-refused", dev.index, spec.sample_attr, spec.scope_id),
                    logging.WARNING,
                    "GPU %d: %s: link %d answered before and is refused now (%s); the sum "
                    "is left out while it is",
                    dev.index,
                    spec.sample_attr,
                    spec.scope_id,
                    nv.NVMLError(ret),
                )
            elif ret in self._field_refused:
                # INVALID_ARGUMENT here means "field id (or link) unknown to this driver".
                self._once(
                    ("absent", dev.index, spec.sample_attr, spec.scope_id),
                    logging.DEBUG if spec.scope_id not in (0, ALL_NVLINKS) else logging.INFO,
                    "GPU %d: %s (scope %d) not available (%s); left out from now on",
                    dev.index,
                    spec.sample_attr,
                    spec.scope_id,
                    nv.NVMLError(ret),
                )
            else:
                incomplete.add(spec.sample_attr)
                keep.append(spec)
        dev.fields = tuple(keep)
        for attr in incomplete:
            out.pop(attr, None)
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

    # -- GPM (Hopper and newer): SM activity between two samples -------------------------

    def _start_gpm(self, dev: _Device) -> None:
        """GPM baseline outside a reading pass (start-up, re-initialisation)."""
        if dev.lost:
            return
        try:
            self._gpm_start(dev)
        except _GpuLost as exc:
            self._mark_lost(dev, str(exc))

    def _gpm_start(self, dev: _Device) -> None:
        if "gpm" in dev.unsupported or dev.gpm_prev is not None:
            return
        support = self._call(dev, "gpm", "nvmlGpmQueryDeviceSupport", dev.handle)
        if support is None:
            return
        if not support.isSupportedDevice:
            self._absent(dev, "gpm", "GPM needs a Hopper or newer GPU")
            return
        prev = self._call(dev, "gpm", "nvmlGpmSampleAlloc")
        cur = self._call(dev, "gpm", "nvmlGpmSampleAlloc")
        if prev is None or cur is None:
            self._gpm_release(prev, cur)
            return
        dev.gpm_prev, dev.gpm_cur = prev, cur
        if self._call(dev, "gpm", "nvmlGpmSampleGet", dev.handle, prev) is None:
            self._gpm_free(dev)
            return
        request = self._nv.c_nvmlGpmMetricsGet_t()
        request.version = _GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.metrics[0].metricId = _GPM_SM_UTIL
        dev.gpm_request = request

    def _gpm_sm_active(self, dev: _Device) -> float | None:
        if dev.gpm_request is None or "gpm" in dev.unsupported:
            return None
        if self._call(dev, "gpm", "nvmlGpmSampleGet", dev.handle, dev.gpm_cur) is None:
            return None
        request = dev.gpm_request
        request.sample1 = dev.gpm_prev
        request.sample2 = dev.gpm_cur
        got = self._call(dev, "gpm", "nvmlGpmMetricsGet", request)
        # The newer sample is the baseline of the next interval, whatever this one gave.
        dev.gpm_prev, dev.gpm_cur = dev.gpm_cur, dev.gpm_prev
        if got is None:
            return None
        metric = request.metrics[0]
        ret = int(metric.nvmlReturn)
        if ret != self._nv.NVML_SUCCESS:
            if ret in self._absent_codes:
                self._absent(dev, "gpm", self._nv.NVMLError(ret))
            return None
        return _scaled(metric.value, 0.01)

    def _gpm_free(self, dev: _Device) -> None:
        self._gpm_release(dev.gpm_prev, dev.gpm_cur)
        dev.gpm_prev = dev.gpm_cur = dev.gpm_request = None

    def _gpm_release(self, *samples: Any) -> None:
        for s in samples:
            if s is None:
                continue
            with contextlib.suppress(self._nv.NVMLError, AttributeError):
                self._nv.nvmlGpmSampleFree(s)


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
