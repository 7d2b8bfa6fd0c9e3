"""The fabric collector's parts: the sock_diag message parser (on messages laid out as the
kernel lays them out, struct by struct), which sockets are a job's (/proc/PID/fd links in a
fixture tree), and the aggregation per peer node with its cap. The real kernel and a real
queue: tests/test_fabric_real.py."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.fabric import MAX_PEERS, FabricCollector, fabric_families, socket_inodes
from gpufeed.gpu.backend import GpuIdentity, GpuProcess, GpuSample
from gpufeed.hostpaths import HostPaths
from gpufeed.model import iter_samples
from gpufeed.netlink.messages import NLMSG_DONE, NLMSG_ERROR
from gpufeed.netlink.sockdiag import (
    SOCK_DIAG_BY_FAMILY,
    SockDiagError,
    TcpConnection,
    parse_dump,
    request,
)


def nlmsg(mtype: int, body: bytes) -> bytes:
    msg = struct.pack("=IHHII", 16 + len(body), mtype, 2, 1, 0) + body
    return msg + bytes(-len(msg) % 4)


def diag_msg(src: str, sport: int, dst: str, dport: int, inode: int, rtt_us: int, var_us: int,
             family: int = socket.AF_INET) -> bytes:  # fmt: skip
    """An inet_diag_msg with an INET_DIAG_INFO attribute holding a tcp_info."""

    def raw(a: str) -> bytes:
        return ipaddress.ip_address(a).packed.ljust(16, b"\0")

    sockid = struct.pack(">HH16s16s", sport, dport, raw(src), raw(dst)) + bytes(12)  # if, cookie[2]
    head = struct.pack("=BBBB", family, 1, 0, 0) + sockid + struct.pack("=IIIII", 0, 0, 0, 0, inode)
    info = bytearray(104)  # struct tcp_info up to tcpi_total_retrans
    struct.pack_into("=II", info, 68, rtt_us, var_us)
    attr = struct.pack("=HH", 4 + len(info), 2) + bytes(info)
    return head + attr


def test_request_asks_for_established_tcp_with_tcp_info() -> None:
    req = request(socket.AF_INET6, seq=7)
    length, mtype, flags, seq, _ = struct.unpack_from("=IHHII", req)
    assert (length, mtype, seq) == (len(req), SOCK_DIAG_BY_FAMILY, 7) and len(req) == 72
    assert flags & 0x300 == 0x300  # a dump
    family, proto, ext, states = struct.unpack_from("=BBBxI", req, 16)
    assert (family, proto, ext, states) == (socket.AF_INET6, socket.IPPROTO_TCP, 2, 2)


def test_parse_dump_reads_addresses_inode_and_rtt() -> None:
    data = nlmsg(SOCK_DIAG_BY_FAMILY, diag_msg("10.0.0.1", 40000, "10.0.0.2", 29500, 77, 1500, 400))
    data += nlmsg(SOCK_DIAG_BY_FAMILY, diag_msg("::ffff:10.0.0.1", 40001, "fd00::2", 29500, 78,
                                                 90, 10, family=socket.AF_INET6))  # fmt: skip
    data += nlmsg(NLMSG_DONE, struct.pack("=i", 0))
    conns, done = parse_dump(data)
    assert done
    assert conns == [
        TcpConnection(77, "10.0.0.1", 40000, "10.0.0.2", 29500, 0.0015, 0.0004),
        TcpConnection(78, "10.0.0.1", 40001, "fd00::2", 29500, 90e-6, 10e-6),
    ]


def test_parse_dump_errors_are_clear() -> None:
    with pytest.raises(SockDiagError, match="refused the dump: errno 1"):
        parse_dump(nlmsg(NLMSG_ERROR, struct.pack("=i", -1) + bytes(16)))
    whole = nlmsg(SOCK_DIAG_BY_FAMILY, diag_msg("10.0.0.1", 1, "10.0.0.2", 2, 3, 4, 5))
    with pytest.raises(SockDiagError, match="cut short"):
        parse_dump(whole[:-20])


def conn(peer: str, rtt_ms: float, var_ms: float, inode: int = 1) -> TcpConnection:
    return TcpConnection(inode, "10.0.0.1", 1000, peer, 2000, rtt_ms / 1e3, var_ms / 1e3)


def samples(conns: list[TcpConnection]) -> dict[tuple[str, str], float]:
    return {(s.name, s.label("peer")): s.value for s in iter_samples(fabric_families(conns))}


def test_aggregation_per_peer_and_node_without_loopback() -> None:
    got = samples([conn("10.0.0.2", 1.0, 0.2), conn("10.0.0.2", 3.0, 0.6), conn("10.0.0.3", 2.0, 1.0),
                   conn("127.0.0.1", 50.0, 50.0)])  # fmt: skip
    assert got[("gpufeed_fabric_rtt_seconds", "10.0.0.2")] == pytest.approx(0.002)
    assert got[("gpufeed_fabric_rtt_jitter_seconds", "10.0.0.2")] == pytest.approx(0.0004)
    assert got[("gpufeed_fabric_connections", "10.0.0.2")] == 2
    assert got[("gpufeed_fabric_rtt_seconds", "")] == pytest.approx(0.002)  # (1+3+2)/3 ms
    assert got[("gpufeed_fabric_connections", "")] == 3
    assert not [k for k in got if k[1] == "127.0.0.1"]


def test_peers_are_capped_and_the_node_counts_them_all() -> None:
    conns = [conn(f"10.1.{i // 250}.{i % 250 + 1}", 1.0, 0.1, i) for i in range(MAX_PEERS + 10)]
    conns += [conn("10.9.9.9", 1.0, 0.1, 999), conn("10.9.9.9", 1.0, 0.1, 1000)]
    got = samples(conns)
    peers = {p for (n, p) in got if n == "gpufeed_fabric_connections" and p}
    assert len(peers) == MAX_PEERS and "10.9.9.9" in peers  # the busiest peer is kept
    assert got[("gpufeed_fabric_connections", "")] == MAX_PEERS + 12


def test_nothing_to_measure_is_absent_not_zero() -> None:
    assert samples([]) == {}
    assert samples([TcpConnection(1, "10.0.0.1", 1, "10.0.0.2", 2, None, None)]) == {}


def test_only_the_jobs_sockets_count(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, links in ((100, ["socket:[11]", "pipe:[5]", "/dev/null"]), (200, ["socket:[22]"]),
                       (300, ["socket:[33]"])):  # fmt: skip
        fd = proc / str(pid) / "fd"
        fd.mkdir(parents=True)
        for i, target in enumerate(links):
            os.symlink(target, fd / str(i))
    assert socket_inodes(proc, [100, 200, 404]) == {11, 22}
    dumped = [conn("10.0.0.2", 1.0, 0.1, 11), conn("10.0.0.3", 9.0, 0.1, 22),
              conn("10.0.0.4", 5.0, 0.1, 33)]  # fmt: skip
    ctx = CollectorContext(paths=HostPaths(procfs=proc))
    ident = GpuIdentity(0, "GPU-0", "NVIDIA H100", "550.54", "0000:00:00.0")
    gpu = GpuSample(ident, processes=(GpuProcess(100),))
    c = FabricCollector(ctx, lambda: {"job": [200]}, dump=lambda: dumped)
    got = {(s.name, s.label("peer")): s.value
           for s in iter_samples(c.collect_with(TickData(gpu_samples=(gpu,))))}  # fmt: skip
    assert got[("gpufeed_fabric_connections", "")] == 2  # 300's socket is no job's
    assert ("gpufeed_fabric_connections", "10.0.0.4") not in got
