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
- The error counters in `counters/` are the IBA PortCounters attribute's, each as wide as
  the attribute's field (drivers/infiniband/core/sysfs.c): `symbol_error`,
  `port_rcv_errors`, `port_rcv_remote_physical_errors`, `port_xmit_discards` 16 bits,
  `link_error_recovery`, `link_downed` 8 bits, `local_link_integrity_errors`,
  `excessive_buffer_overrun_errors` 4 bits. They saturate at all ones like the others, so a
  link that went down 255 times reads 255 for ever (until `perfquery -R`).
- `hw_counters/` (per port; mlx5 and other drivers that implement rdma_hw_stats): the
  driver's own counters, plain integers, names as the driver declares them (mlx5:
  drivers/infiniband/hw/mlx5/counters.c). `lifespan` there is a setting, not a counter.
  Which of them exist depends on the HCA's capabilities (the congestion counters only on
  RoCE ports of firmware that has them): a file that is not there is not exported.
- `phys_state`: `5: LinkUp` (1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining,
  5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test).
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
_STATE = re.compile(r"\s*(\d+)\s*:\s*(\S(?:.*\S)?)\s*")  # `7: Phy Test` has a space
_NO_PMA = "N/A"

# The port counters that count link faults: (file in counters/, bits of its PMA field).
# port_xmit_discards is not here: the port drops what it cannot send "because the port is
# down or congested" (IBA 16.1.3.5), which is congestion far more often than a fault.
IB_ERROR_COUNTERS: tuple[tuple[str, int], ...] = (
    ("symbol_error", 16),
    ("link_error_recovery", 8),
    ("link_downed", 8),
    ("port_rcv_errors", 16),
    ("port_rcv_remote_physical_errors", 16),
    ("local_link_integrity_errors", 4),
    ("excessive_buffer_overrun_errors", 4),
)
IB_CONGESTION_COUNTERS: tuple[tuple[str, int], ...] = (("port_xmit_discards", 16),)
# hw_counters (64-bit, mlx5 names): packets lost on the way, seen as sequence errors and
# retransmission timeouts. duplicate_request, rnr_nak_retry_err and out_of_buffer are left
# out: they count a receiver that was not ready (the host), not the fabric.
ROCE_ERROR_COUNTERS: tuple[str, ...] = (
    "out_of_sequence",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
)
# ECN-marked packets received (the switch marked them), CNPs this port sent back, and CNPs
# that made this port slow down (DCQCN): RoCE's congestion signals.
ROCE_CONGESTION_COUNTERS: tuple[str, ...] = (
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rp_cnp_handled",
)


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
    phys_state: str | None = None  # "LinkUp", "Polling", "Disabled", ...
    # (counter name, value) of the fault and congestion counters this port has; a counter
    # it does not have (or a saturated one) is not in the tuple.
    errors: tuple[tuple[str, int], ...] = ()
    congestion: tuple[tuple[str, int], ...] = ()


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

    def pma_counters(self, table: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
        """The PMA counters of `table` this port has; a saturated one is left out (warned)."""
        out: list[tuple[str, int]] = []
        for name, bits in table:
            value = self.counter("counters", name)
            if value is None:
                continue
            if value >= (1 << bits) - 1:
                self.problems.append(
                    f"{self.where}: counters/{name} is saturated at 2^{bits}-1 (its PMA field "
                    "is that narrow); it is left out until the counter is reset"
                )
                continue
            out.append((name, value))
        return tuple(out)

    def hw_counters(self, names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
        out: list[tuple[str, int]] = []
        for name in names:
            value = self.counter("hw_counters", name)
            if value is not None:
                out.append((name, value))
        return tuple(out)

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
    phys = r.parsed("phys_state")
    errors = r.pma_counters(IB_ERROR_COUNTERS) + r.hw_counters(ROCE_ERROR_COUNTERS)
    congestion = r.pma_counters(IB_CONGESTION_COUNTERS) + r.hw_counters(ROCE_CONGESTION_COUNTERS)
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
        phys_state=phys[1] if phys else None,
        errors=errors,
        congestion=congestion,
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
