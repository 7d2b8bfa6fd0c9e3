"""Host collector: CPU time by mode, logical CPUs, pressure stall information, MemAvailable.

Sources are read independently: a missing or garbled /proc/meminfo does not take the CPU
series with it (see PartialCollectionError). PSI missing altogether (kernel < 4.20, or booted
with psi=0) is not an error: the pressure series are simply absent.
"""

from __future__ import annotations

import errno
import logging
import os

from gpufeed.catalogue import spec
from gpufeed.collectors.base import collect_sources
from gpufeed.hostpaths import HostPaths
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family
from gpufeed.procfs.meminfo import parse_meminfo
from gpufeed.procfs.pressure import PSI_RESOURCES, parse_pressure
from gpufeed.procfs.stat import parse_stat

log = logging.getLogger(__name__)

CPU_SECONDS = "gpufeed_host_cpu_seconds_total"
CPUS = "gpufeed_host_cpus"
PRESSURE_WAITING = "gpufeed_host_pressure_waiting_seconds_total"
PRESSURE_STALLED = "gpufeed_host_pressure_stalled_seconds_total"
MEMORY_AVAILABLE = "gpufeed_host_memory_available_bytes"

FAMILIES = tuple(
    spec(name) for name in (CPU_SECONDS, CPUS, PRESSURE_WAITING, PRESSURE_STALLED, MEMORY_AVAILABLE)
)  # HELP: the catalogue

# The contract exports PSI "full" for io and memory only; the system-wide cpu "full" line
# (Linux >= 5.13) is always zero outside cgroups and is not exported.
_FULL_RESOURCES = frozenset({"io", "memory"})
# Errors that mean "this kernel has no PSI here", not "something is broken".
_NO_PSI_ERRNOS = frozenset({errno.ENOENT, errno.EOPNOTSUPP, errno.ENOTSUP})


def user_hz() -> float:
    """USER_HZ, the unit of /proc/stat (100 on every mainstream architecture)."""
    try:
        value = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100.0
    return float(value) if value > 0 else 100.0


class HostCollector:
    name = "host"

    def __init__(self, paths: HostPaths | None = None, *, ticks_per_second: float | None = None):
        self._paths = paths or HostPaths()
        self._ticks = ticks_per_second if ticks_per_second is not None else user_hz()
        self._warn = LogOnce(log)
        # The last CPU seconds exported per mode: the kernel's idle and iowait can step back
        # a little (Documentation/filesystems/proc.rst, "iowait ... will decrease in certain
        # conditions"), and rate() reads any step back as a reset, i.e. a huge burst.
        self._cpu_seconds: dict[str, float] = {}

    def collect(self) -> list[Family]:
        sources = (("stat", self._cpu), ("pressure", self._pressure), ("meminfo", self._memory))
        return collect_sources(FAMILIES, sources, self._warn)

    def close(self) -> None:
        pass

    def _cpu(self, fams: Families, problems: list[str]) -> None:
        path = self._paths.proc("stat")
        try:
            stat = parse_stat(path.read_text(errors="replace"), self._ticks)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        for mode, seconds in stat.cpu_seconds.items():
            # Hold a counter that stepped back at its last value, as node_exporter does.
            seconds = max(seconds, self._cpu_seconds.get(mode, seconds))
            self._cpu_seconds[mode] = seconds
            fams.put(spec(CPU_SECONDS), {"mode": mode}, seconds)
        fams.put(spec(CPUS), {}, stat.online_cpus)

    def _pressure(self, fams: Families, problems: list[str]) -> None:
        bad: list[str] = []
        for resource in PSI_RESOURCES:
            path = self._paths.proc("pressure", resource)
            try:
                text = path.read_text(errors="replace")
            except OSError as exc:
                if exc.errno in _NO_PSI_ERRNOS:
                    continue  # no PSI on this kernel: absent, not an error
                bad.append(f"{path}: {exc.strerror or exc}")
                continue
            try:
                psi = parse_pressure(text)
            except ValueError as exc:
                bad.append(f"{path}: {exc}")
                continue
            labels = {"resource": resource}
            fams.put(spec(PRESSURE_WAITING), labels, psi.some_total_seconds)
            if resource in _FULL_RESOURCES:
                fams.put(spec(PRESSURE_STALLED), labels, psi.full_total_seconds)
        if bad:
            # The other resources were still exported; the interval is marked failed.
            raise ValueError("; ".join(bad))

    def _memory(self, fams: Families, problems: list[str]) -> None:
        path = self._paths.proc("meminfo")
        info = parse_meminfo(path.read_text(errors="replace"))
        problems.extend(f"{path}: {msg}" for msg in info.bad_lines)
        # Absent before Linux 3.14: left out, never estimated.
        fams.put(spec(MEMORY_AVAILABLE), {}, info.values.get("MemAvailable"))
