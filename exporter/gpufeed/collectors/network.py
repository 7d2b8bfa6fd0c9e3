"""Network fabric collector: netdev byte counters and RDMA (InfiniBand / RoCE) port counters.

Two sources, because RDMA traffic never passes through the kernel's network stack:
- netdev (/proc/net/dev + /sys/class/net): bytes of every interface that a device backs.
  `fabric` is `ethernet` (ARPHRD 1) or `infiniband` (ARPHRD 32, IPoIB). Loopback and
  virtual interfaces (veth, bridges, bonds, VLANs, tun, ifb: no `device` link in sysfs) are
  skipped by default, so each byte is counted once, on the interface that put it on a wire.
- RDMA ports (/sys/class/infiniband/*/ports/*): `fabric` is `infiniband` or `roce` from the
  port's link layer; data counters x4 (they count 4-byte words); speed from `rate` while the
  port is ACTIVE; transmit-wait on InfiniBand ports.

A link may carry less than its speed: a root qdisc (tc tbf, htb) shapes what it sends. The
shaped rate (gpufeed.netlink.qdisc, read over rtnetlink from the agent's own network
namespace, matched to sysfs by ifindex) is exported beside the speed, so that a link running
at its shaped rate reads as saturated (a veth says 10 Gbit/s whatever its tbf allows).

Beside the bytes, what the correlator needs to say *why* the network holds a job back
(docs/correlator.md, `network_reason`): whether each link is up, its fault counters (link
downs, symbol and CRC errors, carrier changes, RoCE sequence errors) and its congestion
counters (RoCE ECN marks and CNPs, InfiniBand transmit discards), each under the kernel's
own counter name and only where the hardware has it.

On InfiniBand the port counters count everything on the wire, IPoIB included, so the `ib0`
netdev series is a subset of the HCA port's: pick series by `device`, do not sum a fabric.
On RoCE the HCA port counts RDMA traffic only and the Ethernet netdev counts the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from gpufeed.catalogue import spec
from gpufeed.collectors.base import collect_sources
from gpufeed.config import DEFAULT_XMIT_WAIT_TICK_BYTES
from gpufeed.hostpaths import HostPaths
from gpufeed.logonce import LogOnce
from gpufeed.model import Families, Family
from gpufeed.netlink.qdisc import NetlinkError, ShapedRates
from gpufeed.procfs.netdev import parse_netdev
from gpufeed.sysfs.infiniband import RdmaPort, read_rdma_ports
from gpufeed.sysfs.netclass import ARPHRD_ETHER, ARPHRD_INFINIBAND, read_net_interface

log = logging.getLogger(__name__)

RECEIVE = "gpufeed_network_receive_bytes_total"
TRANSMIT = "gpufeed_network_transmit_bytes_total"
SPEED = "gpufeed_network_speed_bytes_per_second"
SHAPED = "gpufeed_network_shaped_rate_bytes_per_second"
TRANSMIT_WAIT = "gpufeed_network_transmit_wait_seconds_total"
LINK_UP = "gpufeed_network_link_up"
LINK_ERRORS = "gpufeed_network_link_errors_total"
CONGESTION = "gpufeed_network_congestion_packets_total"

FAMILIES = tuple(
    spec(name)
    for name in (
        RECEIVE,
        TRANSMIT,
        SPEED,
        SHAPED,
        TRANSMIT_WAIT,
        LINK_UP,
        LINK_ERRORS,
        CONGESTION,
    )
)  # HELP: the catalogue

FABRIC_BY_ARPHRD = {ARPHRD_ETHER: "ethernet", ARPHRD_INFINIBAND: "infiniband"}
FABRIC_BY_LINK_LAYER = {"InfiniBand": "infiniband", "Ethernet": "roce"}


class XmitWaitClock:
    """Turns port_xmit_wait ticks into a monotonic count of seconds, port by port.

    A tick lasts as long as sending `tick_bytes` at the port's rate, so the conversion depends
    on the rate. Converting the raw total with the current rate would make the seconds jump
    (or fall) whenever a link retrains at another speed; instead each new batch of ticks is
    converted at the rate it was counted at and added to a running total.
    """

    def __init__(self, tick_bytes: float) -> None:
        if tick_bytes <= 0:
            raise ValueError(f"tick_bytes must be positive, got {tick_bytes}")
        self._tick_bytes = tick_bytes
        self._ticks: dict[tuple[str, str], int] = {}
        self._seconds: dict[tuple[str, str], float] = {}

    def update(
        self, key: tuple[str, str], ticks: int | None, rate_bytes_per_second: float | None
    ) -> float | None:
        """The port's total wait in seconds after this reading; None while unknown."""
        if ticks is None:
            return None
        prev = self._ticks.get(key)
        base = self._seconds.get(key, 0.0)
        # No previous reading, or a lower one (the counter was reset by perfquery -R or a
        # driver reload): every tick read is new.
        delta = ticks if prev is None or ticks < prev else ticks - prev
        if delta == 0:
            seconds = base  # nothing new to convert: no rate needed
        elif rate_bytes_per_second is None or rate_bytes_per_second <= 0:
            # Without a rate the new ticks cannot be converted yet: keep them pending (the
            # previous tick count stays the base) and report the total converted so far.
            return self._seconds.get(key)
        else:
            seconds = base + delta * self._tick_bytes / rate_bytes_per_second
        self._ticks[key] = ticks
        self._seconds[key] = seconds
        return seconds

    def forget_except(self, keys: set[tuple[str, str]]) -> None:
        for gone in set(self._ticks) - keys:
            del self._ticks[gone]
            del self._seconds[gone]


class NetworkCollector:
    name = "network"

    def __init__(
        self,
        paths: HostPaths | None = None,
        *,
        include_virtual: bool = False,
        xmit_wait_tick_bytes: float = DEFAULT_XMIT_WAIT_TICK_BYTES,
        shaped_rates: Callable[[], ShapedRates] | None = None,
    ) -> None:
        """`shaped_rates`: ifindex -> shaped bytes per second of this namespace's interfaces,
        and the qdiscs it could not read (gpufeed.netlink.qdisc.read_shaped_rates); None:
        not read (a sysfs tree that is not the agent's own namespace, whose ifindex numbers
        netlink would not share)."""
        self._paths = paths or HostPaths()
        self._shaped_rates = shaped_rates
        self._include_virtual = include_virtual
        self._wait = XmitWaitClock(xmit_wait_tick_bytes)
        self._warn = LogOnce(log)

    def collect(self) -> list[Family]:
        sources = (("netdev", self._collect_netdev), ("rdma", self._collect_rdma))
        return collect_sources(FAMILIES, sources, self._warn)

    def close(self) -> None:
        pass

    def _collect_netdev(self, fams: Families, problems: list[str]) -> None:
        path = self._paths.proc("net", "dev")
        netdev = parse_netdev(path.read_text(errors="replace"))
        problems.extend(f"{path}: {msg}" for msg in netdev.bad_lines)
        shaped: Mapping[int, float] = {}
        if self._shaped_rates is not None:
            try:
                read = self._shaped_rates()
            except (OSError, NetlinkError) as exc:
                problems.append(f"queueing disciplines (rtnetlink): {exc}")
            else:
                shaped = read.bytes_per_second
                # one per kind and stable from read to read: logged once while it lasts
                problems.extend(f"queueing disciplines (rtnetlink): {p}" for p in read.problems)
        for counters in netdev.interfaces:
            iface = read_net_interface(self._paths, counters.interface)
            if iface is None or iface.arphrd_type is None:
                continue  # not in this sysfs (another namespace, or gone since): cannot classify
            fabric = FABRIC_BY_ARPHRD.get(iface.arphrd_type)
            if fabric is None or not (iface.has_device or self._include_virtual):
                continue  # loopback, tunnels, and virtual interfaces
            labels = {"device": iface.name, "fabric": fabric}
            fams.put(spec(RECEIVE), labels, counters.receive_bytes)
            fams.put(spec(TRANSMIT), labels, counters.transmit_bytes)
            fams.put(spec(SPEED), labels, iface.speed_bytes_per_second)
            if iface.ifindex is not None:
                fams.put(spec(SHAPED), labels, shaped.get(iface.ifindex))
            _put_link(fams, labels, iface.link_up, iface.errors, ())

    def _collect_rdma(self, fams: Families, problems: list[str]) -> None:
        ports = read_rdma_ports(self._paths)
        live: set[tuple[str, str]] = set()
        for port in ports:
            problems.extend(port.problems)
            fabric = _rdma_fabric(port)
            if fabric is None:
                continue
            labels = {"device": port.device, "port": port.port, "fabric": fabric}
            active = port.state == "ACTIVE"
            rate = port.rate_bytes_per_second if active else None
            fams.put(spec(RECEIVE), labels, port.receive_bytes)
            fams.put(spec(TRANSMIT), labels, port.transmit_bytes)
            fams.put(spec(SPEED), labels, rate)
            up = None if port.state is None else active
            _put_link(fams, labels, up, port.errors, port.congestion)
            if fabric == "infiniband":
                key = (port.device, port.port)
                live.add(key)
                wait = self._wait.update(key, port.transmit_wait_ticks, rate)
                fams.put(spec(TRANSMIT_WAIT), labels, wait)
        self._wait.forget_except(live)


def _put_link(
    fams: Families,
    labels: dict[str, str],
    up: bool | None,
    errors: tuple[tuple[str, int], ...],
    congestion: tuple[tuple[str, int], ...],
) -> None:
    fams.put(spec(LINK_UP), labels, None if up is None else float(up))
    for family, counters in ((LINK_ERRORS, errors), (CONGESTION, congestion)):
        for name, value in counters:
            fams.put(spec(family), {**labels, "counter": name}, value)


def _rdma_fabric(port: RdmaPort) -> str | None:
    # iWARP RNICs report an Ethernet link layer too, but they are not RoCE; the contract
    # has no fabric value for them, so they are left out (their bytes are TCP, offloaded).
    if port.node_type is not None and port.node_type != "CA":
        return None
    if port.link_layer is None:
        return None
    return FABRIC_BY_LINK_LAYER.get(port.link_layer)
