"""/sys/class/net/<interface>: link type, link speed and whether a device backs it.

- `type` is the ARPHRD_* number: 1 for Ethernet, 32 for InfiniBand (IPoIB), 772 loopback.
- `speed` is in Mb/s. Reading it on a link that is down (or on a virtual interface) fails
  with EINVAL; some drivers print -1 (SPEED_UNKNOWN) instead, and kernels before 4.x that
  printed it unsigned showed 65535 or 4294967295. Every one of those means "unknown".
- `device` is a symlink to the bus device (PCI, virtio, ...). Virtual interfaces (veth, bridges,
  bonds, VLANs, tun/tap, ifb, docker0) have none.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufeed.hostpaths import HostPaths

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772

_UNKNOWN_SPEEDS_MBPS = frozenset({65535, 4294967295})


@dataclass(frozen=True, slots=True)
class NetInterface:
    name: str
    arphrd_type: int | None
    has_device: bool
    speed_bytes_per_second: float | None


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
    return NetInterface(name, arphrd, has_device, speed)
