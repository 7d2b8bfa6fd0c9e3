"""The network collector on a real link: a veth pair between two network namespaces.

The collector runs inside namespace A (`ip netns exec` mounts that namespace's /sys, and
/proc/net is the reading process's namespace), so it reads the real kernel files of `gfa*`;
namespace B holds the peer. The link is flapped from B (`ip link set down/up`: A's carrier
really drops, carrier_changes really moves), and saturated with a TCP stream under a
`tc tbf` rate limit on A's egress. Unique names (pid + random suffix) keep parallel runs
apart; everything is torn down in a finally. Needs root and iproute2: in CI a host without
them fails the test (tests/host_needs.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from host_needs import missing
from procports import stop

# One collect() per line read on stdin, answered with one JSON line of the samples.
COLLECTOR_LOOP = """
import json, sys
from gpufeed.collectors.network import NetworkCollector
from gpufeed.netlink.qdisc import read_shaped_rates
c = NetworkCollector(include_virtual=True, shaped_rates=read_shaped_rates)
for _ in sys.stdin:
    out = [[s.name, dict(s.labels), s.value] for f in c.collect() for s in f.samples]
    print(json.dumps(out), flush=True)
"""
RECEIVER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
while c.recv(1 << 16):
    pass
"""
SENDER = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
end = time.monotonic() + float(sys.argv[3])
buf = b"x" * (1 << 16)
while time.monotonic() < end:
    s.sendall(buf)
"""
RATE_BITS = 40_000_000  # the tbf limit: far below what a veth carries unlimited


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@dataclass(frozen=True, slots=True)
class Link:
    ns_a: str
    ns_b: str
    dev_a: str
    dev_b: str


@pytest.fixture
def link() -> Iterator[Link]:
    if os.geteuid() != 0:
        missing("needs root for network namespaces")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        missing("needs iproute2 (ip, tc)")
    tag = f"{os.getpid()}{secrets.token_hex(2)}"
    lk = Link(f"gfnet-a{tag}", f"gfnet-b{tag}", f"gfa{tag}"[:15], f"gfb{tag}"[:15])
    try:
        ip("netns", "add", lk.ns_a)
        ip("netns", "add", lk.ns_b)
        ip("link", "add", lk.dev_a, "netns", lk.ns_a, "type", "veth", "peer", "name", lk.dev_b,
           "netns", lk.ns_b)  # fmt: skip
        ip("-n", lk.ns_a, "addr", "add", "10.77.0.1/30", "dev", lk.dev_a)
        ip("-n", lk.ns_b, "addr", "add", "10.77.0.2/30", "dev", lk.dev_b)
        ip("-n", lk.ns_a, "link", "set", lk.dev_a, "up")
        ip("-n", lk.ns_b, "link", "set", lk.dev_b, "up")
        yield lk
    finally:
        for ns in (lk.ns_a, lk.ns_b):  # deleting a namespace deletes its end of the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


class Collector:
    """A NetworkCollector running inside one namespace, read one collect() at a time."""

    def __init__(self, ns: str) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", COLLECTOR_LOOP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def collect(self, device: str) -> tuple[float, dict[tuple[str, str], float]]:
        """(when, {(family, counter label or ""): value}) for `device`."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        t = time.monotonic()
        assert line, f"the collector in the namespace exited ({self.proc.poll()})"
        out: dict[tuple[str, str], float] = {}
        for name, labels, value in json.loads(line):
            if labels.get("device") == device:
                out[(name, labels.get("counter", ""))] = value
        return t, out

    def close(self) -> None:
        stop(self.proc)


CHANGES = ("gpufeed_network_link_errors_total", "carrier_changes")
UP = ("gpufeed_network_link_up", "")
TX = ("gpufeed_network_transmit_bytes_total", "")
SPEED = ("gpufeed_network_speed_bytes_per_second", "")
SHAPED = ("gpufeed_network_shaped_rate_bytes_per_second", "")


def test_flapping_peer_moves_carrier_changes_and_link_state(link: Link) -> None:
    col = Collector(link.ns_a)
    try:
        _, before = col.collect(link.dev_a)
        assert before[UP] == 1.0
        assert before[("gpufeed_network_link_errors_total", "rx_errors")] == 0
        assert SHAPED not in before  # no qdisc shapes it: absent, not "unlimited"
        flaps = 3
        for _ in range(flaps):
            ip("-n", link.ns_b, "link", "set", link.dev_b, "down")
            _, down = col.collect(link.dev_a)
            assert down[UP] == 0.0  # the peer is gone: no carrier on our side
            ip("-n", link.ns_b, "link", "set", link.dev_b, "up")
        deadline = time.monotonic() + 10
        while True:
            _, after = col.collect(link.dev_a)
            if after[UP] == 1.0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert after[UP] == 1.0
        # each flap is two carrier transitions (off, on)
        assert after[CHANGES] - before[CHANGES] == 2 * flaps
    finally:
        col.close()


def test_rate_limited_link_carries_what_tbf_lets_through(link: Link) -> None:
    subprocess.run(
        ["tc", "-n", link.ns_a, "qdisc", "add", "dev", link.dev_a, "root", "tbf",
         "rate", f"{RATE_BITS}bit", "burst", "32kb", "latency", "50ms"],
        check=True, capture_output=True, timeout=20,
    )  # fmt: skip
    col = Collector(link.ns_a)
    recv = subprocess.Popen(
        ["ip", "netns", "exec", link.ns_b, sys.executable, "-c", RECEIVER, "10.77.0.2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    send: subprocess.Popen[bytes] | None = None
    try:
        assert recv.stdout is not None
        port = recv.stdout.readline().strip()
        assert port.isdigit(), f"the receiver did not start ({recv.poll()})"
        send = subprocess.Popen(
            ["ip", "netns", "exec", link.ns_a, sys.executable, "-c", SENDER, "10.77.0.2",
             port, "4"]
        )  # fmt: skip
        time.sleep(1.0)  # past TCP slow start: the stream fills the bucket
        t1, first = col.collect(link.dev_a)
        time.sleep(2.0)
        t2, second = col.collect(link.dev_a)
        rate_bits = (second[TX] - first[TX]) * 8 / (t2 - t1)
        # What the collector reads is what the limit let through: the stream wants far more
        # (an unlimited veth moves gigabits), so it runs at the limit, not below it.
        print(
            f"collector saw {rate_bits / 1e6:.1f} Mbit/s under a {RATE_BITS / 1e6:.0f} Mbit/s tbf"
        )
        assert 0.75 * RATE_BITS < rate_bits < 1.1 * RATE_BITS, rate_bits
        assert second[UP] == 1.0
        # the veth says 10 Gbit/s; its root tbf (read over rtnetlink) says what it carries,
        # so the link reads as saturated against the smaller of the two
        assert second[SPEED] == 10e9 / 8
        assert second[SHAPED] == RATE_BITS / 8
        assert rate_bits / 8 / min(second[SPEED], second[SHAPED]) > 0.75
    finally:
        if send is not None:
            stop(send)
        stop(recv)
        col.close()


def test_pfifo_fast_beside_a_tbf_keeps_the_shaped_rate(link: Link) -> None:
    """A real pfifo_fast root (a host's default qdisc: options a plain struct, not
    attributes) in the same dump as a tbf on another link: 0.2.0 lost every rate of the
    dump to it ("attribute of length 3 at offset 0 overruns")."""
    fifo, peer = f"gfp{link.dev_a[3:]}"[:15], f"gfq{link.dev_a[3:]}"[:15]
    ip("-n", link.ns_a, "link", "add", fifo, "type", "veth", "peer", "name", peer)
    ip("-n", link.ns_a, "link", "set", fifo, "up")
    tbf = ["tbf", "rate", f"{RATE_BITS}bit", "burst", "32kb", "latency", "50ms"]
    for dev, qdisc in ((fifo, ["pfifo_fast"]), (link.dev_a, tbf)):
        subprocess.run(
            ["tc", "-n", link.ns_a, "qdisc", "add", "dev", dev, "root", *qdisc],
            check=True, capture_output=True, timeout=20,
        )  # fmt: skip
    shown = subprocess.run(
        ["tc", "-n", link.ns_a, "qdisc", "show", "dev", fifo],
        check=True, capture_output=True, text=True, timeout=20,
    ).stdout  # fmt: skip
    assert "pfifo_fast" in shown and "root" in shown, shown
    col = Collector(link.ns_a)
    try:
        _, shaped = col.collect(link.dev_a)
        _, unshaped = col.collect(fifo)
    finally:
        col.close()
    assert shaped[SHAPED] == RATE_BITS / 8
    assert UP in unshaped and SHAPED not in unshaped  # pfifo_fast shapes nothing
