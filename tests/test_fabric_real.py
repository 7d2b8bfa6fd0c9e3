"""Fabric RTT and jitter from the kernel's socket diagnostics, on a real TCP connection over
a veth pair between two network namespaces (tests/test_network_real.py's `link`).

The "job" is a sender in namespace A streaming to a receiver in B; the fabric collector
runs inside A (netlink answers for the namespace of the reading socket) with the sender's
pid as the job's. First the link is unlimited (RTT of a veth: well under a millisecond);
then `tc tbf` on A's egress limits it to 4 Mbit/s with up to 100 ms of queue, which the
stream fills (netem is not in this kernel: the queue is the delay). The RTT gpufeed reads
is compared with what the test measures through the same queue at the same time (a second
connection that sends one byte and times its echo, as ping would; no ICMP tool needed),
and with what `ss` (iproute2, its own netlink reader) prints for the connection.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time

import pytest

from procports import stop
from test_network_real import RECEIVER, Link, link  # noqa: F401 (the fixture)

PEER = "10.77.0.2"
# One collect() per line on stdin; the job's pid is argv[1].
COLLECTOR_LOOP = """
import json, sys
from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.fabric import FabricCollector
c = FabricCollector(CollectorContext(), lambda: {"job": [int(sys.argv[1])]})
for _ in sys.stdin:
    out = [[s.name, dict(s.labels), s.value] for f in c.collect() for s in f.samples]
    print(json.dumps(out), flush=True)
"""
# Echoes one byte per round trip; prints the port, then serves one connection.
ECHO = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while b := c.recv(1):
    c.sendall(b)
"""
# N round trips, 0.1 s apart; prints each one's seconds.
PINGER = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(int(sys.argv[3])):
    t = time.monotonic()
    s.sendall(b"p")
    s.recv(1)
    print(time.monotonic() - t, flush=True)
    time.sleep(0.1)
"""
# 16 KiB every 8 ms: 16 Mbit/s, four times what the limit lets through.
PACED_SENDER = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
buf = b"x" * 16384
while True:
    s.sendall(buf)
    time.sleep(0.008)
"""


class Fabric:
    def __init__(self, ns: str, pid: int) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", COLLECTOR_LOOP, str(pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def read(self) -> dict[tuple[str, str], float]:
        """{(family, peer or ""): value}"""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the collector in the namespace exited ({self.proc.poll()})"
        return {(n, labels.get("peer", "")): v for n, labels, v in json.loads(line)}


def ss_rtt_ms(ns: str, port: str) -> float:
    """`ss`'s smoothed RTT of the connection to PEER:port only: with the pinger's connection
    to the same peer, the first `rtt:` of `ss ... dst PEER` was either connection, in the
    order of the host's socket table (read 1.3x apart in one CI run)."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "ss", "-tni", "dst", f"{PEER}:{port}"],
        capture_output=True, text=True, timeout=20, check=True,
    ).stdout  # fmt: skip
    m = re.search(r"\brtt:([\d.]+)/", out)
    assert m, out
    return float(m.group(1))


def server(ns: str, code: str, procs: list[subprocess.Popen[str]]) -> str:
    """Starts a server in `ns` on port 0; returns the port it printed."""
    p = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code, PEER],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    port = p.stdout.readline().strip() if p.stdout else ""
    assert port.isdigit(), f"a server in {ns} did not start ({p.poll()})"
    return port


@pytest.mark.serial  # compares round-trip times: runs alone, after the parallel pass
def test_rtt_and_jitter_follow_a_real_queue(link: Link) -> None:  # noqa: F811
    procs: list[subprocess.Popen[str]] = []
    try:
        port = server(link.ns_b, RECEIVER, procs)
        echo_port = server(link.ns_b, ECHO, procs)
        send = subprocess.Popen(
            ["ip", "netns", "exec", link.ns_a, sys.executable, "-c", PACED_SENDER, PEER, port],
            text=True,
        )
        procs.append(send)
        fabric = Fabric(link.ns_a, send.pid)
        procs.append(fabric.proc)
        time.sleep(0.5)
        idle = fabric.read()
        assert idle[("gpufeed_fabric_connections", PEER)] == 1
        assert (
            idle[("gpufeed_fabric_connections", "")] == 1
        )  # the node: only the job's (not the echo)
        assert idle[("gpufeed_fabric_rtt_seconds", PEER)] < 0.005  # an unlimited veth
        subprocess.run(
            ["tc", "-n", link.ns_a, "qdisc", "add", "dev", link.dev_a, "root", "tbf",
             "rate", "4mbit", "burst", "8kb", "latency", "100ms"],
            check=True, capture_output=True, timeout=20,
        )  # fmt: skip
        time.sleep(1.5)  # the stream fills the queue; the smoothed RTT follows
        ping = subprocess.Popen(
            ["ip", "netns", "exec", link.ns_a, sys.executable, "-c", PINGER, PEER, echo_port,
             "12"],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        procs.append(ping)
        rtts, jitters, ss, to_ss = [], [], [], []
        while ping.poll() is None:
            before = ss_rtt_ms(link.ns_a, port) / 1e3
            got = fabric.read()
            after = ss_rtt_ms(link.ns_a, port) / 1e3
            rtts.append(got[("gpufeed_fabric_rtt_seconds", PEER)])
            jitters.append(got[("gpufeed_fabric_rtt_jitter_seconds", PEER)])
            ss += [before, after]
            # the queue's delay moves from one instant to the next: each reading is held
            # against what `ss` read just before and just after it
            to_ss.append(rtts[-1] / ((before + after) / 2))
            time.sleep(0.2)
        out = ping.stdout.read() if ping.stdout else ""
        pings = [float(x) for x in out.split()]
        assert len(pings) == 12, out
        measured, read = statistics.median(pings), statistics.median(rtts)
        print(
            f"round trips through the queue {measured * 1e3:.1f} ms (median of {len(pings)}); "
            f"gpufeed {read * 1e3:.1f} ms (median of {len(rtts)}), jitter "
            f"{statistics.median(jitters) * 1e3:.1f} ms; ss {statistics.median(ss) * 1e3:.1f} ms"
        )
        assert read > 20 * idle[("gpufeed_fabric_rtt_seconds", PEER)]
        assert 0.6 * measured < read < 1.6 * measured
        assert 0.8 < statistics.median(to_ss) < 1.25, to_ss
        assert statistics.median(jitters) > 0.0
    finally:
        for p in reversed(procs):
            stop(p)
