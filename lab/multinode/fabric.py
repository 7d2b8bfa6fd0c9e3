"""The lab's network: one network namespace per "node", joined by veth pairs to a bridge in
a namespace of its own, so that nothing of a run is visible in the host's root namespace
and two runs on one host (names carry the harness's pid) never meet.

    node ns gfl<pid>n0: eth0 10.77.0.1/24 ─veth─ p0 ┐
    node ns gfl<pid>n1: eth0 10.77.0.2/24 ─veth─ p1 ┼─ br0 in ns gfl<pid>br
    ...                                              ┘

A node's link is rate-limited with a token bucket (`tc qdisc ... tbf`; netem is not in
every kernel) on both of its ends: eth0 (what the node sends) and its bridge port (what it
receives), because a qdisc shapes egress only.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from lab.host import sh

SUBNET = "10.77.0"  # private to the run's namespaces: it never meets the host's routes


def in_ns(ns: str, *cmd: str) -> str:
    return sh("ip", "netns", "exec", ns, *cmd)


@dataclass(frozen=True, slots=True)
class NodeLink:
    index: int
    netns: str  # the node's namespace
    address: str  # eth0's IPv4 address
    bridge_port: str  # the peer end's name inside the bridge namespace


class Fabric:
    """Namespaces, veth pairs and the bridge of one run; `close` removes them all."""

    def __init__(self, prefix: str, nodes: int, on_undo: Callable[[Callable[[], object]], object]):
        """`on_undo` receives each undo step as soon as the thing it undoes exists, so that a
        failure half-way through still removes what was made."""
        self.prefix = prefix
        self.bridge_ns = f"{prefix}br"
        sh("ip", "netns", "add", self.bridge_ns)
        on_undo(lambda: _del_netns(self.bridge_ns))
        in_ns(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge")
        in_ns(self.bridge_ns, "ip", "link", "set", "br0", "up")
        self.links: list[NodeLink] = []
        for i in range(nodes):
            ns = f"{prefix}n{i}"
            sh("ip", "netns", "add", ns)
            on_undo(functools.partial(_del_netns, ns))
            outer, inner = f"{prefix}v{i}", f"{prefix}p{i}"
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            on_undo(functools.partial(_del_link, outer))  # until it leaves the root ns
            sh("ip", "link", "set", outer, "netns", ns)
            sh("ip", "link", "set", inner, "netns", self.bridge_ns)
            in_ns(ns, "ip", "link", "set", outer, "name", "eth0")
            port = f"p{i}"
            in_ns(self.bridge_ns, "ip", "link", "set", inner, "name", port)
            in_ns(self.bridge_ns, "ip", "link", "set", port, "master", "br0")
            in_ns(self.bridge_ns, "ip", "link", "set", port, "up")
            address = f"{SUBNET}.{i + 1}"
            in_ns(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
            in_ns(ns, "ip", "link", "set", "eth0", "up")
            in_ns(ns, "ip", "link", "set", "lo", "up")
            self.links.append(NodeLink(i, ns, address, port))

    def limit_rate(self, node: int, rate: str, burst: str, latency: str) -> Callable[[], None]:
        """Rate-limits node `node`'s link both ways; returns the step that lifts it."""
        link = self.links[node]
        ends = ((link.netns, "eth0"), (self.bridge_ns, link.bridge_port))
        for ns, dev in ends:
            in_ns(
                ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                burst,
                "latency",
                latency,
            )

        def lift() -> None:
            for ns, dev in ends:
                subprocess.run(
                    ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                    capture_output=True,
                    check=False,
                )

        return lift


def _del_netns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _del_link(name: str) -> None:
    subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
