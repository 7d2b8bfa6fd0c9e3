"""TCP connections and their round-trip times from the kernel's socket diagnostics.

One NETLINK_SOCK_DIAG dump per address family (inet_diag_req_v2, established sockets only,
asking for INET_DIAG_INFO) returns, per connection, its addresses, the socket's inode and
its `struct tcp_info`, whose `tcpi_rtt` and `tcpi_rttvar` are the kernel's smoothed RTT
and mean RTT deviation in microseconds (what `ss -ti` prints as rtt:RTT/RTTVAR). Reading
them sends nothing on the network: the kernel measures RTT from the connection's own ACKs.

`parse_dump` is pure (bytes in, connections out; tests feed it recorded dumps);
`dump_tcp` is the thin reader that talks to the kernel.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from gpufeed.netlink.messages import NLMSG_ERROR, align, error_code, split_messages
from gpufeed.netlink.messages import request as netlink_request

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1

# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid
_REQ = struct.Struct("=BBBxI")
_SOCKID = struct.Struct(">HH16s16s")  # sport, dport (network order), src, dst; then if, cookie
_MSG_HEAD = struct.Struct("=BBBB")  # family, state, timer, retrans
_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
SOCKID_SIZE = 48
MSG_SIZE = _MSG_HEAD.size + SOCKID_SIZE + _MSG_TAIL.size  # 72
_RTATTR = struct.Struct("=HH")
TCP_INFO_RTT_OFFSET = 68  # struct tcp_info: tcpi_rtt, then tcpi_rttvar (u32, microseconds)


class SockDiagError(OSError):
    """The kernel refused the dump or answered something that is not inet_diag."""


@dataclass(frozen=True, slots=True)
class TcpConnection:
    inode: int
    local: str  # address, IPv4-mapped IPv6 shown as IPv4
    local_port: int
    peer: str
    peer_port: int
    rtt_seconds: float | None  # None: the kernel gave no tcp_info for it
    rtt_var_seconds: float | None


def request(family: int, seq: int = 1) -> bytes:
    """The dump request for established TCP sockets of `family`, with tcp_info."""
    body = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 1 << TCP_ESTABLISHED)
    return netlink_request(SOCK_DIAG_BY_FAMILY, seq, body + bytes(SOCKID_SIZE))


def _address(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(raw[:4]))
    addr = ipaddress.IPv6Address(raw)
    return str(addr.ipv4_mapped or addr)


def parse_dump(data: bytes) -> tuple[list[TcpConnection], bool]:
    """The connections in a run of netlink messages, and whether NLMSG_DONE was among them.
    Raises SockDiagError on an NLMSG_ERROR or a message cut short."""
    out: list[TcpConnection] = []
    try:
        messages, done = split_messages(data)
    except ValueError as exc:
        raise SockDiagError(f"sock_diag: {exc}") from None
    for mtype, body in messages:
        if mtype == NLMSG_ERROR:
            code = error_code(body)
            raise SockDiagError(code, f"sock_diag: the kernel refused the dump: errno {code}")
        if mtype != SOCK_DIAG_BY_FAMILY or len(body) < MSG_SIZE:
            continue
        out.append(_connection(body))
    return out, done


def _connection(body: bytes) -> TcpConnection:
    family = body[0]
    sport, dport, src, dst = _SOCKID.unpack_from(body, _MSG_HEAD.size)
    inode = _MSG_TAIL.unpack_from(body, _MSG_HEAD.size + SOCKID_SIZE)[4]
    rtt = var = None
    off = MSG_SIZE
    while off + _RTATTR.size <= len(body):
        alen, atype = _RTATTR.unpack_from(body, off)
        if alen < _RTATTR.size:
            break
        if atype == INET_DIAG_INFO and alen - _RTATTR.size >= TCP_INFO_RTT_OFFSET + 8:
            info = off + _RTATTR.size + TCP_INFO_RTT_OFFSET
            rtt_us, var_us = struct.unpack_from("=II", body, info)
            rtt, var = rtt_us / 1e6, var_us / 1e6
        off += align(alen)
    return TcpConnection(
        inode, _address(family, src), sport, _address(family, dst), dport, rtt, var
    )


def dump_tcp(timeout_seconds: float = 2.0) -> list[TcpConnection]:
    """Every established TCP connection of this network namespace (IPv4 and IPv6)."""
    out: list[TcpConnection] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as s:
        s.settimeout(timeout_seconds)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            s.send(request(family, seq))
            while True:
                conns, done = parse_dump(s.recv(1 << 16))
                out += conns
                if done:
                    break
    return out
