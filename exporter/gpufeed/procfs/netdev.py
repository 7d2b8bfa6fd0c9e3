"""/proc/net/dev: per-interface byte counters of the network stack.

The file has two header lines, then one line per interface:
`  eth0: rx_bytes rx_packets rx_errs rx_drop rx_fifo rx_frame rx_compressed rx_multicast
tx_bytes tx_packets tx_errs tx_drop tx_fifo tx_colls tx_carrier tx_compressed`.
The counters are those of the network namespace of the process that reads the file, so the
agent must run in the host's network namespace (hostNetwork in Kubernetes).
"""

from __future__ import annotations

from dataclasses import dataclass

# Receive bytes is the first field after the colon, transmit bytes the ninth.
_RX_BYTES = 0
_TX_BYTES = 8
_MIN_FIELDS = 16


@dataclass(frozen=True, slots=True)
class NetDevCounters:
    interface: str
    receive_bytes: int
    transmit_bytes: int


@dataclass(frozen=True, slots=True)
class NetDev:
    """The parsed file: good lines in `interfaces`, each line that did not parse in `bad_lines`."""

    interfaces: tuple[NetDevCounters, ...]
    bad_lines: tuple[str, ...]


def parse_netdev(text: str) -> NetDev:
    """Parses /proc/net/dev. A malformed or truncated line is reported, never guessed at."""
    lines = text.splitlines()
    if len(lines) < 2 or "|" not in lines[0] or "|" not in lines[1]:
        raise ValueError("not a /proc/net/dev file: the two header lines are missing")
    good: list[NetDevCounters] = []
    bad: list[str] = []
    for lineno, line in enumerate(lines[2:], start=3):
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        fields = rest.split()
        name = name.strip()
        if not sep or not name or len(fields) < _MIN_FIELDS:
            bad.append(f"line {lineno}: expected 'NAME: 16 counters', got {line.strip()[:80]!r}")
            continue
        try:
            rx = int(fields[_RX_BYTES])
            tx = int(fields[_TX_BYTES])
        except ValueError:
            bad.append(f"line {lineno}: counters of {name!r} are not integers")
            continue
        if rx < 0 or tx < 0:
            bad.append(f"line {lineno}: negative counter for {name!r}")
            continue
        good.append(NetDevCounters(name, rx, tx))
    return NetDev(tuple(good), tuple(bad))
