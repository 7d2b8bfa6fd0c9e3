"""/sys/class/infiniband/<hca>/ports/<n>: RDMA port state, rate and data counters.

Formats (Documentation/ABI/stable/sysfs-class-infiniband, drivers/infiniband/core/sysfs.c):
- `link_layer`: `InfiniBand` or `Ethernet` (RoCE, and also iWARP on RNICs).
- `state`: `4: ACTIVE` (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER).
- `rate`: `400 Gb/sec (4X NDR)`, `2.5 Gb/sec (1X SDR)`, `53.125 Gb/sec (1X HDR)`; the read
  fails with EINVAL when the port has no valid width.
- `counters/port_rcv_data`, `counters/port_xmit_data`: data octets divided by 4, i.e. in
  4-byte words, on all VLs. The kernel fills the file from the 64-bit PortCountersExtended
  attribute where the HCA supports it and from the 32-bit PortCounters attribute otherwise.
  IB performance counters saturate at all ones rather than wrap, so a 32-bit value of
  0xFFFFFFFF is stuck and no longer counts anything.
- `counters_ext/port_rcv_data_64`, `counters_ext/port_xmit_data_64`: the 64-bit counters on
  kernels before 4.5 (and Mellanox OFED), preferred when present.
- `counters/port_xmit_wait`: 32-bit, saturating, in "ticks" during which the port had data to
  send but sent nothing for the whole tick (no credits, or lost arbitration).
- A counter the port's management agent cannot answer reads `N/A (no PMA)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpufeed.hostpaths import HostPaths

SATURATED_32 = 0xFFFFFFFF
# The data counters count octets divided by 4 (IBA PortXmitData/PortRcvData units).
DATA_WORD_BYTES = 4

_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s+Gb/sec\b")
_STATE = re.compile(r"\s*(\d+)\s*:\s*(\S+)\s*")
_NO_PMA = "N/A"


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """One port of one HCA. A field the hardware or kernel does not give is None."""

    device: str
    port: str
    node_type: str | None  # "CA", "RNIC", "switch", ...
    link_layer: str | None  # "InfiniBand", "Ethernet"
    state: str | None  # "ACTIVE", "DOWN", ...
    rate_bytes_per_second: float | None
    receive_bytes: int | None
    transmit_bytes: int | None
    transmit_wait_ticks: int | None
    problems: tuple[str, ...] = ()


def parse_rate(text: str) -> float | None:
    """`400 Gb/sec (4X NDR)` -> 5e10 bytes per second; a zero rate is unknown (None)."""
    m = _RATE.match(text)
    if m is None:
        raise ValueError(f"expected 'N Gb/sec (...)', got {text.strip()[:40]!r}")
    gbps = float(m.group(1))
    return gbps * 1e9 / 8 if gbps > 0 else None


def parse_state(text: str) -> tuple[int, str]:
    """`4: ACTIVE` -> (4, "ACTIVE"). Also used for `phys_state` and `node_type` (`1: CA`)."""
    m = _STATE.fullmatch(text)
    if m is None:
        raise ValueError(f"expected 'N: NAME', got {text.strip()[:40]!r}")
    return int(m.group(1)), m.group(2)


def parse_counter(text: str) -> int | None:
    """A counter file: an unsigned integer, or `N/A (no PMA)` (None: not provided)."""
    s = text.strip()
    if s.startswith(_NO_PMA):
        return None
    value = int(s)
    if value < 0:
        raise ValueError(f"negative counter {value}")
    return value


def parse_link_layer(text: str) -> str:
    s = text.strip()
    if not s or len(s) > 32 or not s.isalnum():
        raise ValueError(f"expected a link layer name, got {s[:40]!r}")
    return s


class _PortReader:
    """Reads the files of one port; every problem is kept as a message, never raised."""

    def __init__(self, device: str, port: str, base: Path) -> None:
        self.where = f"{device} port {port}"
        self.base = base
        self.problems: list[str] = []

    def text(self, *parts: str) -> str | None:
        path = self.base.joinpath(*parts)
        try:
            # Undecodable bytes become U+FFFD and then fail parsing with a message naming
            # the file, instead of raising out of the reader.
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            # EINVAL on `rate` of a port without a valid width is "unknown", not a problem.
            if parts != ("rate",):
                self.problems.append(f"{self.where}: cannot read {'/'.join(parts)}: {exc}")
            return None

    def counter(self, *parts: str) -> int | None:
        raw = self.text(*parts)
        if raw is None:
            return None
        try:
            return parse_counter(raw)
        except ValueError as exc:
            self.problems.append(f"{self.where}: {'/'.join(parts)}: {exc}")
            return None

    def data_bytes(self, name: str) -> int | None:
        """port_{rcv,xmit}_data in bytes: the 64-bit counters_ext file when there is one."""
        words = self.counter("counters_ext", f"{name}_64")
        if words is None:
            words = self.counter("counters", name)
            if words == SATURATED_32:
                self.problems.append(
                    f"{self.where}: counters/{name} is saturated at 2^32-1 (a 32-bit PMA "
                    "counter); the value no longer moves and is left out"
                )
                return None
        return None if words is None else words * DATA_WORD_BYTES

    def parsed(self, name: str) -> tuple[int, str] | None:
        raw = self.text(name)
        if raw is None:
            return None
        try:
            return parse_state(raw)
        except ValueError as exc:
            self.problems.append(f"{self.where}: {name}: {exc}")
            return None


def read_rdma_port(device: str, port: str, base: Path, node_type: str | None) -> RdmaPort:
    r = _PortReader(device, port, base)
    link_layer: str | None = None
    raw = r.text("link_layer")
    if raw is not None:
        try:
            link_layer = parse_link_layer(raw)
        except ValueError as exc:
            r.problems.append(f"{r.where}: link_layer: {exc}")
    state = r.parsed("state")
    rate: float | None = None
    raw = r.text("rate")
    if raw is not None:
        try:
            rate = parse_rate(raw)
        except ValueError as exc:
            r.problems.append(f"{r.where}: rate: {exc}")
    wait = r.counter("counters", "port_xmit_wait")
    if wait == SATURATED_32:
        r.problems.append(
            f"{r.where}: counters/port_xmit_wait is saturated at 2^32-1; it is left out "
            "until the counter is reset"
        )
        wait = None
    return RdmaPort(
        device=device,
        port=port,
        node_type=node_type,
        link_layer=link_layer,
        state=state[1] if state else None,
        rate_bytes_per_second=rate,
        receive_bytes=r.data_bytes("port_rcv_data"),
        transmit_bytes=r.data_bytes("port_xmit_data"),
        transmit_wait_ticks=wait,
        problems=tuple(r.problems),
    )


def read_rdma_ports(paths: HostPaths) -> list[RdmaPort]:
    """Every port of every HCA, in name and port order. No /sys/class/infiniband: no ports.

    Raises OSError only when the class directory exists but cannot be listed.
    """
    root = paths.sys("class", "infiniband")
    if not root.is_dir():
        return []
    out: list[RdmaPort] = []
    for dev in sorted(root.iterdir(), key=lambda p: p.name):
        ports_dir = dev.joinpath("ports")
        if not ports_dir.is_dir():
            continue
        node_type = _node_type(dev)
        ports = [p for p in ports_dir.iterdir() if p.name.isdigit()]
        for port in sorted(ports, key=lambda p: int(p.name)):
            out.append(read_rdma_port(dev.name, port.name, port, node_type))
    return out


def _node_type(dev: Path) -> str | None:
    try:
        return parse_state(dev.joinpath("node_type").read_text(errors="replace"))[1]
    except (OSError, ValueError):
        return None
