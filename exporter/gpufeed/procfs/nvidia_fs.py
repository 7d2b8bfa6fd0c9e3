"""/proc/driver/nvidia-fs/stats: the GPUDirect Storage driver's (nvidia-fs.ko) statistics.

The format (NVFS statistics ver 4, nvfs-stat.c in NVIDIA's gds-nvidia-fs; a sample is in the
GDS troubleshooting guide, "Displaying GDS NVIDIA FS Driver Statistics"):

    Reads    : n=12 ok=12 err=0 readMiB=48 io_state_err=0
    Reads    : Bandwidth(MiB/s)=812 Avg-Latency(usec)=41
    Writes   : n=3 ok=3 err=0 writeMiB=6 io_state_err=0 pg-cache=0 pg-cache-fail=0 ...
    Writes   : Bandwidth(MiB/s)=0 Avg-Latency(usec)=0
    GPU 0000:be:00.0 uuid:87e5c586-... : Registered_MiB=2 Cache_MiB=0 max_pinned_MiB=4 ...

A line that starts with white space continues the one before it (the guide's sample wraps
long lines). With IO stats disabled (`IO stats: Disabled`) the Reads/Writes lines carry only
`err=` and `io_state_err=`: counts, bytes and latency are then absent, not zero. Byte
counts are whole MiB (the driver divides before printing). The bandwidth and latency are the
driver's own averages over its last second of I/O; per GPU the driver reports pinned (BAR)
and bounce-buffer memory, not I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpufeed.hostpaths import HostPaths

MIB = 1 << 20
_KV = re.compile(r"([A-Za-z_\-]+(?:\([^)]*\))?)=(\d+)")
_GPU = re.compile(r"^GPU\s+(\S+)\s+uuid:(\S+)\s*:(.*)$")


@dataclass(frozen=True, slots=True)
class GdsOp:
    """Reads or writes: counts where IO stats are enabled (None otherwise)."""

    ops: int | None
    ok: int | None
    errors: int
    io_state_errors: int
    bytes: int | None  # whole MiB, in bytes
    latency_seconds: float | None  # the driver's average over its last second
    bandwidth_bytes_per_second: float | None


@dataclass(frozen=True, slots=True)
class GdsGpu:
    pci_bus_id: str
    uuid: str
    registered_bytes: int  # GPU memory pinned for GDS through BAR1 now
    bounce_buffer_bytes: int  # GPU bounce buffers in use now (Cache_MiB)


@dataclass(frozen=True, slots=True)
class GdsStats:
    reads: GdsOp
    writes: GdsOp
    gpus: tuple[GdsGpu, ...]


def _logical_lines(text: str) -> list[str]:
    out: list[str] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        if raw[0] in " \t" and out:
            out[-1] += " " + raw.strip()
        else:
            out.append(raw.strip())
    return out


def _op(fields: dict[str, int], size_key: str) -> GdsOp:
    lat = fields.get("Avg-Latency(usec)")
    bw = fields.get("Bandwidth(MiB/s)")
    size = fields.get(size_key)
    return GdsOp(
        ops=fields.get("n"),
        ok=fields.get("ok"),
        errors=fields["err"],
        io_state_errors=fields.get("io_state_err", 0),
        bytes=None if size is None else size * MIB,
        latency_seconds=None if lat is None else lat / 1e6,
        bandwidth_bytes_per_second=None if bw is None else float(bw * MIB),
    )


def parse_nvidia_fs_stats(text: str) -> GdsStats:
    """Parses the stats file; ValueError when it has no Reads or Writes line with err=."""
    ops: dict[str, dict[str, int]] = {"Reads": {}, "Writes": {}}
    gpus: list[GdsGpu] = []
    for line in _logical_lines(text):
        head, sep, rest = line.partition(":")
        name = head.strip()
        if sep and name in ops:
            ops[name].update((k, int(v)) for k, v in _KV.findall(rest))
            continue
        m = _GPU.match(line)
        if m:
            kv = {k: int(v) for k, v in _KV.findall(m.group(3))}
            if "Registered_MiB" in kv:
                gpus.append(
                    GdsGpu(
                        m.group(1),
                        m.group(2),
                        kv["Registered_MiB"] * MIB,
                        kv.get("Cache_MiB", 0) * MIB,
                    )
                )
    for name, fields in ops.items():
        if "err" not in fields:
            raise ValueError(f"no '{name} : ... err=N' line (not an nvidia-fs stats file?)")
    return GdsStats(_op(ops["Reads"], "readMiB"), _op(ops["Writes"], "writeMiB"), tuple(gpus))


def nvidia_fs_stats_path(paths: HostPaths) -> Path:
    return paths.proc("driver", "nvidia-fs", "stats")


def read_nvidia_fs_stats(paths: HostPaths) -> GdsStats | None:
    """The driver's statistics; None where the driver is not loaded (no stats file)."""
    try:
        text = nvidia_fs_stats_path(paths).read_text(errors="replace")
    except FileNotFoundError:
        return None
    return parse_nvidia_fs_stats(text)
