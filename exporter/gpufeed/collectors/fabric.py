"""The "fabric" collector: round-trip time and its variation per peer node, for the TCP
connections of the processes that hold GPUs (and of SDK/`gpufeed run` jobs, which covers
CPU-only ranks), from the kernel's socket diagnostics (gpufeed.netlink.sockdiag).

Which sockets are a job's: its processes' /proc/PID/fd links `socket:[INODE]`, matched to
the inodes of the dump. Aggregated to what a fabric panel needs: per peer address (the
peer node), capped at MAX_PEERS peers with the most connections so that a job talking to
thousands of hosts cannot blow up the series count, and for the whole node (no `peer`
label, over every connection, capped or not). Loopback connections are within the node,
not fabric, and are left out. A connection in another network namespace than the agent's
(a pod without hostNetwork) is not in the dump and not counted; RDMA traffic has no
socket at all (NCCL over InfiniBand: only its TCP bootstrap shows).
"""

from __future__ import annotations

import ipaddress
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpufeed.catalogue import spec
from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.model import Families, Family
from gpufeed.netlink.sockdiag import SockDiagError, TcpConnection, dump_tcp

RTT = spec("gpufeed_fabric_rtt_seconds")
JITTER = spec("gpufeed_fabric_rtt_jitter_seconds")
CONNECTIONS = spec("gpufeed_fabric_connections")
MAX_PEERS = 32

JobPids = Callable[[], Mapping[str, Sequence[int]]]
Dump = Callable[[], list[TcpConnection]]


def socket_inodes(procfs: Path, pids: Iterable[int]) -> set[int]:
    """Inodes of the sockets the processes hold open (processes that exited are skipped)."""
    out: set[int] = set()
    for pid in set(pids):
        fd_dir = procfs / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(fd_dir / name)
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                out.add(int(target[8:-1]))
    return out


def fabric_families(conns: Iterable[TcpConnection]) -> list[Family]:
    """The three families for these connections (loopback and RTT-less ones left out)."""
    f = Families()
    for m in (RTT, JITTER, CONNECTIONS):
        f.declare_spec(m)
    by_peer: dict[str, list[TcpConnection]] = defaultdict(list)
    for c in conns:
        if c.rtt_seconds is None or ipaddress.ip_address(c.peer).is_loopback:
            continue
        by_peer[c.peer].append(c)
    every = [c for cs in by_peer.values() for c in cs]
    if not every:
        return f.build()
    top = sorted(by_peer, key=lambda p: (-len(by_peer[p]), p))[:MAX_PEERS]
    for labels, cs in [({}, every), *(({"peer": p}, by_peer[p]) for p in sorted(top))]:
        f.put(RTT, labels, sum(c.rtt_seconds or 0.0 for c in cs) / len(cs))
        f.put(JITTER, labels, sum(c.rtt_var_seconds or 0.0 for c in cs) / len(cs))
        f.put(CONNECTIONS, labels, len(cs))
    return f.build()


class FabricCollector:
    name = "fabric"
    needs = ("gpu",)

    def __init__(
        self, context: CollectorContext, job_pids: JobPids | None = None, dump: Dump = dump_tcp
    ) -> None:
        self._procfs = context.paths.procfs
        self._job_pids = job_pids
        self._dump = dump

    def collect(self) -> list[Family]:
        return self.collect_with(TickData())

    def collect_with(self, data: TickData) -> list[Family]:
        pids = {p.pid for s in data.gpu_samples for p in s.processes}
        if self._job_pids is not None:
            for job_pids in self._job_pids().values():
                pids.update(job_pids)
        inodes = socket_inodes(self._procfs, pids) if pids else set()
        if not inodes:
            return fabric_families(())
        try:
            conns = self._dump()
        except (SockDiagError, OSError) as e:
            raise OSError(f"socket diagnostics: {e}") from None
        return fabric_families(c for c in conns if c.inode in inodes)

    def close(self) -> None:
        pass
