"""/sys/class/net/<interface>: link type, link speed and whether a device backs it.

- `type` is the ARPHRD_* number: 1 for Ethernet, 32 for InfiniBand (IPoIB), 772 loopback.
- `speed` is in Mb/s. Reading it on a link that is down (or on a virtual interface) fails
  with EINVAL; some drivers print -1 (SPEED_UNKNOWN) instead, and kernels before 4.x that
  printed it unsigned showed 65535 or 4294967295. Every one of those means "unknown".
- `device` is a symlink to the bus device (PCI, virtio, ...). Virtual interfaces (veth, bridges,
  bonds, VLANs, tun/tap, ifb, docker0) have none.
- `ifindex` is the number netlink names the interface by (its queueing disciplines).
- `carrier` is 1 or 0; reading it fails with EINVAL while the interface is administratively
  down, and then `operstate` (`up`, `down`, `lowerlayerdown`, `dormant`, `unknown`, ...) says
  whether the link is down.
- `carrier_changes` (Linux 3.15+) counts every carrier transition, up and down: a flapping
  link moves it by two per flap. `carrier_up_count` / `carrier_down_count` (4.16+) split it;
  they are left out, `carrier_changes` alone says the link changed state.
- `statistics/rx_errors`, `tx_errors`, `rx_crc_errors`: the driver's error totals (rx_errors
  includes the CRC errors). rx_dropped is left out on purpose: it counts frames the host
  dropped (full rings, unknown protocols, inactive bond slaves) and moves on healthy links.
  Pause frames are not in sysfs at all (only `ethtool -S`, driver-specific names, or the
  ethtool netlink pause statistics), so they are not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufeed.hostpaths import HostPaths

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772

_UNKNOWN_SPEEDS_MBPS = frozenset({65535, 4294967295})
# (file under /sys/class/net/<if>/, counter name as exported)
ETHERNET_ERROR_COUNTERS: tuple[str, ...] = (
    "carrier_changes",
    "statistics/rx_errors",
    "statistics/tx_errors",
    "statistics/rx_crc_errors",
)
_LINK_DOWN_OPERSTATES = frozenset({"down", "lowerlayerdown", "notpresent"})


@dataclass(frozen=True, slots=True)
class NetInterface:
    name: str
    arphrd_type: int | None
    has_device: bool
    speed_bytes_per_second: float | None
    link_up: bool | None = None  # None: neither carrier nor operstate says
    # (counter name without the statistics/ prefix, value); absent counters are left out
    errors: tuple[tuple[str, int], ...] = ()
    ifindex: int | None = None  # what netlink names the interface by (tc's qdiscs)


def parse_net_type(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError(f"negative interface type {value}")
    return value


def parse_net_speed(text: str) -> float | None:
    """Link speed in bytes per second from the `speed` file (Mb/s); None when unknown."""
    mbps = int(text.strip())
    if mbps <= 0 or mbps in _UNKNOWN_SPEEDS_MBPS:
        return None
    return mbps * 1e6 / 8


def parse_carrier(text: str) -> bool:
    value = int(text.strip())
    if value not in (0, 1):
        raise ValueError(f"carrier must be 0 or 1, got {value}")
    return value == 1


def parse_operstate_down(text: str) -> bool | None:
    """True: the link is down; False: up; None: the state says nothing (unknown, dormant)."""
    state = text.strip()
    if state == "up":
        return False
    return True if state in _LINK_DOWN_OPERSTATES else None


def parse_net_counter(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError(f"negative counter {value}")
    return value


def is_safe_interface_name(name: str) -> bool:
    """Kernel interface names never contain '/' and are at most 15 bytes; anything else is
    garbage from a broken file and must not become a path."""
    return 0 < len(name) <= 15 and "/" not in name and name not in (".", "..") and "\0" not in name


def read_net_interface(paths: HostPaths, name: str) -> NetInterface | None:
    """Reads what sysfs knows about one interface; None when it is not in sysfs at all."""
    if not is_safe_interface_name(name):
        return None
    base = paths.sys("class", "net", name)
    if not base.is_dir():
        return None
    arphrd: int | None
    try:
        arphrd = parse_net_type(base.joinpath("type").read_text(errors="replace"))
    except (OSError, ValueError):
        arphrd = None
    device = base.joinpath("device")
    has_device = device.is_symlink() or device.exists()
    speed: float | None
    try:
        speed = parse_net_speed(base.joinpath("speed").read_text(errors="replace"))
    except (OSError, ValueError):
        # EINVAL on a link that is down, ENOENT on odd drivers: the speed is unknown.
        speed = None
    ifindex: int | None
    try:
        ifindex = parse_net_counter(base.joinpath("ifindex").read_text(errors="replace"))
    except (OSError, ValueError):
        ifindex = None
    return NetInterface(
        name, arphrd, has_device, speed, _link_up(base), _errors(base), ifindex or None
    )


def _link_up(base: Path) -> bool | None:
    try:
        return parse_carrier(base.joinpath("carrier").read_text(errors="replace"))
    except (OSError, ValueError):
        pass  # EINVAL while administratively down: the operstate says so
    try:
        down = parse_operstate_down(base.joinpath("operstate").read_text(errors="replace"))
    except OSError:
        return None
    return None if down is None else not down


def _errors(base: Path) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for rel in ETHERNET_ERROR_COUNTERS:
        try:
            value = parse_net_counter(base.joinpath(rel).read_text(errors="replace"))
        except (OSError, ValueError):
            continue  # an older kernel or a driver without it: absent, not zero
        out.append((rel.rsplit("/", 1)[-1], value))
    return tuple(out)
