"""A raw NVML reader for the truth check: pynvml calls only, no gpufeed code, so that it is an
independent witness of what the agent exports.

Writes JSON lines: {"t", "kind": "fields", "tx", "rx"} every --fast seconds (the raw PCIe
fields 197/198, read often enough that a 32-bit counter's wraps can be seen and undone), and
{"t", "kind": "state", ...} every --slow seconds (utilization, power, energy, SM clock,
memory v1 and v2, GPM SM activity and PCIe rates). The first line is {"kind": "facts", ...}:
what this driver supports. Runs as its own process so the load's Python loop does not delay
it. Stops after --seconds or at SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from typing import Any

FIELD_PCIE_TX, FIELD_PCIE_RX, FIELD_NVLINK_COUNT = 197, 198, 91
GPM_SM_ACTIVE, GPM_PCIE_TX, GPM_PCIE_RX = 2, 20, 21
MIB = 2**20


def facts(nv: Any, h: Any) -> dict[str, object]:
    def attempt(fn: Any) -> object:
        try:
            value = fn()
        except nv.NVMLError as exc:
            return f"error: {exc}"
        except Exception as exc:
            return f"error: {type(exc).__name__}: {exc}"
        return value.decode() if isinstance(value, bytes) else value

    out: dict[str, object] = {
        "driver": attempt(nv.nvmlSystemGetDriverVersion),
        "nvml_version": attempt(nv.nvmlSystemGetNVMLVersion),
        "cuda_driver_version": attempt(nv.nvmlSystemGetCudaDriverVersion_v2),
        "name": attempt(lambda: nv.nvmlDeviceGetName(h)),
        "uuid": attempt(lambda: nv.nvmlDeviceGetUUID(h)),
        "pcie_gen_max": attempt(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        "pcie_gen_current": attempt(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        "pcie_width_current": attempt(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
        "temperature_v": attempt(lambda: nv.nvmlDeviceGetTemperatureV(h, nv.NVML_TEMPERATURE_GPU)),
        "temperature_deprecated_call": attempt(
            lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        ),
        "clock_events_supported_mask": attempt(
            lambda: hex(nv.nvmlDeviceGetSupportedClocksEventReasons(h))
        ),
        "clock_events_now": attempt(lambda: hex(nv.nvmlDeviceGetCurrentClocksEventReasons(h))),
        "memory_v2": attempt(lambda: str(nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))),
        "gpm_supported": attempt(lambda: bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)),
        "mig_mode": attempt(lambda: list(nv.nvmlDeviceGetMigMode(h))),
        "power_limit_mw": attempt(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)),
    }
    try:
        got = nv.nvmlDeviceGetFieldValues(
            h, [(FIELD_PCIE_TX, 0), (FIELD_PCIE_RX, 0), (FIELD_NVLINK_COUNT, 0)]
        )
        out["fields_197_198_91"] = [
            {"return": int(v.nvmlReturn), "type": int(v.valueType), "value": int(v.value.ullVal)}
            for v in got
        ]
    except nv.NVMLError as exc:
        out["fields_197_198_91"] = f"error: {exc}"
    return out


class Gpm:
    def __init__(self, nv: Any, h: Any) -> None:
        self.nv, self.h = nv, h
        self.a = nv.nvmlGpmSampleAlloc()
        self.b = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(h, self.a)
        self.req = nv.c_nvmlGpmMetricsGet_t()
        self.req.version = 1
        self.req.numMetrics = 3
        for i, m in enumerate((GPM_SM_ACTIVE, GPM_PCIE_TX, GPM_PCIE_RX)):
            self.req.metrics[i].metricId = m

    def read(self) -> dict[str, float]:
        nv = self.nv
        nv.nvmlGpmSampleGet(self.h, self.b)
        self.req.sample1, self.req.sample2 = self.a, self.b
        nv.nvmlGpmMetricsGet(self.req)
        self.a, self.b = self.b, self.a
        out: dict[str, float] = {}
        names = ("gpm_sm_active", "gpm_pcie_tx_bytes_per_second", "gpm_pcie_rx_bytes_per_second")
        for i, name in enumerate(names):
            m = self.req.metrics[i]
            if int(m.nvmlReturn) == 0:
                out[name] = float(m.value) / 100.0 if i == 0 else float(m.value) * MIB
        return out


def state(nv: Any, h: Any, gpm: Gpm | None) -> dict[str, float]:
    out: dict[str, float] = {}

    def put(name: str, fn: Any) -> None:
        with contextlib.suppress(nv.NVMLError):
            out[name] = float(fn())

    util = None
    with contextlib.suppress(nv.NVMLError):
        util = nv.nvmlDeviceGetUtilizationRates(h)
    if util is not None:
        out["utilization"] = util.gpu / 100.0
    put("power_watts", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
    put("energy_joules", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)
    put("sm_clock_hertz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) * 1e6)
    put("used_v1", lambda: nv.nvmlDeviceGetMemoryInfo(h).used)
    try:
        m2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        out["used_v2"], out["reserved_v2"] = float(m2.used), float(m2.reserved)
    except (nv.NVMLError, TypeError):
        pass
    if gpm is not None:
        with contextlib.suppress(nv.NVMLError):
            out.update(gpm.read())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--uuid", default="", help="GPU to read (default: index 0)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--fast", type=float, default=0.02)
    ap.add_argument("--slow", type=float, default=0.25)
    args = ap.parse_args()
    import pynvml as nv

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByUUID(args.uuid) if args.uuid else nv.nvmlDeviceGetHandleByIndex(0)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps({"t": time.time(), "kind": "facts", **facts(nv, h)}) + "\n")
        gpm: Gpm | None = None
        try:
            if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                gpm = Gpm(nv, h)
        except nv.NVMLError:
            gpm = None
        end = time.monotonic() + args.seconds
        next_slow = time.monotonic() + args.slow
        while not stop["now"] and time.monotonic() < end:
            t = time.time()
            try:
                got = nv.nvmlDeviceGetFieldValues(h, [(FIELD_PCIE_TX, 0), (FIELD_PCIE_RX, 0)])
                line: dict[str, object] = {"t": t, "kind": "fields"}
                for key, v in zip(("tx", "rx"), got, strict=True):
                    if int(v.nvmlReturn) == 0:
                        line[key] = int(v.value.ullVal)
                f.write(json.dumps(line) + "\n")
            except nv.NVMLError:
                pass
            if time.monotonic() >= next_slow:
                next_slow += args.slow
                f.write(json.dumps({"t": time.time(), "kind": "state", **state(nv, h, gpm)}) + "\n")
            time.sleep(max(0.0, args.fast - (time.time() - t)))
    nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
