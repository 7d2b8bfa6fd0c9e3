"""The rate an interface is shaped to, from its root queueing discipline (rtnetlink).

A link's `speed` is what the wire (or a veth: always 10 Gbit/s) can carry; a token bucket
or an HTB tree on the interface (`tc qdisc add dev eth0 root tbf rate 8mbit ...`, a pod's
bandwidth annotation, a host's egress policy) caps what it does carry. A link running at
its shaped rate is saturated although it is far below its speed, so the collector exports
the shaped rate beside the speed and the correlator uses the smaller one.

What is read, from one RTM_GETQDISC dump of the agent's own network namespace (and an
RTM_GETTCLASS dump of each interface with an htb root) (what `tc -s qdisc show` / `tc class show` ask; no `tc` binary needed):
- a root `tbf`: its rate (TCA_TBF_PARMS' tc_ratespec.rate, or TCA_TBF_RATE64 when the rate
  does not fit 32 bits). The peak rate only bounds bursts; the sustained rate is `rate`.
- a root `htb`: the sum of the ceilings of its top-level classes (those whose parent is the
  root): the most its tree lets through when every class borrows all it may
  (TCA_HTB_PARMS' ceil, or TCA_HTB_CEIL64).
Anything else (fq_codel, mq, noqueue, a classless root without a rate) shapes nothing and
is left out: absent, not "unlimited". Ingress policing is not a root qdisc and is not read.

`parse_tc_dump(data)` is pure (netlink messages in, typed values out); `read_shaped_rates()`
is the thin reader around one netlink socket.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

from gpufeed.netlink.messages import NLMSG_ERROR, align, error_code, request, split_messages

TCMSG = struct.Struct("=BxxxiIII")  # family, pad, ifindex, handle, parent, info
RTA_HDR = struct.Struct("=HH")  # len, type
RATESPEC = struct.Struct("=BBHhHI")  # cell_log, linklayer, overhead, cell_align, mpu, rate

RTM_NEWQDISC, RTM_GETQDISC = 36, 38
RTM_NEWTCLASS, RTM_GETTCLASS = 40, 42
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_TBF_PARMS, TCA_TBF_RATE64 = 1, 4
TCA_HTB_PARMS, TCA_HTB_CEIL64 = 1, 7
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER


class NetlinkError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class TcEntry:
    """One qdisc or class of a dump: where it hangs and the rate it sets, if any."""

    is_class: bool
    ifindex: int
    handle: int
    parent: int
    kind: str
    rate_bytes_per_second: float | None = None  # tbf: its rate; htb class: its ceiling


@dataclass(frozen=True, slots=True)
class TcDump:
    entries: tuple[TcEntry, ...]
    done: bool  # NLMSG_DONE seen: the dump is complete


def dump_request(msg_type: int, seq: int, ifindex: int = 0) -> bytes:
    """An RTM_GETQDISC dump request (every interface) or RTM_GETTCLASS (one interface:
    the kernel dumps classes of the interface named only)."""
    return request(msg_type, seq, TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, 0, 0))


def parse_attrs(data: bytes) -> dict[int, bytes]:
    """Netlink attributes (type -> payload); the last one wins, as the kernel's parser."""
    out: dict[int, bytes] = {}
    off = 0
    while off + RTA_HDR.size <= len(data):
        length, kind = RTA_HDR.unpack_from(data, off)
        if length < RTA_HDR.size or off + length > len(data):
            raise NetlinkError(f"attribute of length {length} at offset {off} overruns")
        out[kind & NLA_TYPE_MASK] = data[off + RTA_HDR.size : off + length]
        off += align(length)
    return out


def _u64(b: bytes | None) -> int | None:
    return struct.unpack("=Q", b[:8])[0] if b is not None and len(b) >= 8 else None


def _ratespec_rate(b: bytes, offset: int) -> int | None:
    if len(b) < offset + RATESPEC.size:
        return None
    return int(RATESPEC.unpack_from(b, offset)[5])


def _rate(kind: str, is_class: bool, options: bytes | None) -> float | None:
    if options is None:
        return None
    opts = parse_attrs(options)
    rate: int | None = None
    if kind == "tbf" and not is_class and TCA_TBF_PARMS in opts:
        rate = _u64(opts.get(TCA_TBF_RATE64)) or _ratespec_rate(opts[TCA_TBF_PARMS], 0)
    elif kind == "htb" and is_class and TCA_HTB_PARMS in opts:
        # tc_htb_opt: rate (tc_ratespec), ceil (tc_ratespec), ...
        ceil = _ratespec_rate(opts[TCA_HTB_PARMS], RATESPEC.size)
        rate = _u64(opts.get(TCA_HTB_CEIL64)) or ceil
    return float(rate) if rate else None


def parse_tc_dump(data: bytes) -> TcDump:
    """Parses the messages of a qdisc or class dump (one or more recv() buffers joined)."""
    entries: list[TcEntry] = []
    try:
        messages, done = split_messages(data)
    except ValueError as exc:
        raise NetlinkError(str(exc)) from None
    for mtype, body in messages:
        if mtype == NLMSG_ERROR:
            err = error_code(body)
            if err:
                raise NetlinkError(os.strerror(err))
            continue
        if mtype not in (RTM_NEWQDISC, RTM_NEWTCLASS) or len(body) < TCMSG.size:
            continue
        _fam, ifindex, handle, parent, _info = TCMSG.unpack_from(body)
        attrs = parse_attrs(body[TCMSG.size :])
        kind = attrs.get(TCA_KIND, b"").split(b"\0", 1)[0].decode("ascii", "replace")
        is_class = mtype == RTM_NEWTCLASS
        rate = _rate(kind, is_class, attrs.get(TCA_OPTIONS))
        entries.append(TcEntry(is_class, ifindex, handle, parent, kind, rate))
    return TcDump(tuple(entries), done)


def shaped_rates(qdiscs: TcDump, classes: TcDump) -> dict[int, float]:
    """ifindex -> bytes per second the interface's root qdisc shapes it to."""
    out: dict[int, float] = {}
    htb_roots: dict[int, int] = {}  # ifindex -> the root htb's handle
    for q in qdiscs.entries:
        if q.is_class or q.parent != TC_H_ROOT:
            continue
        if q.kind == "tbf" and q.rate_bytes_per_second:
            out[q.ifindex] = q.rate_bytes_per_second
        elif q.kind == "htb":
            htb_roots[q.ifindex] = q.handle
    for c in classes.entries:
        root = htb_roots.get(c.ifindex)
        # a top-level class: its parent is the root (or, as some kernels dump it, the qdisc)
        top = c.parent in (TC_H_ROOT, root)
        if root is None or not c.is_class or c.kind != "htb" or not top:
            continue
        if c.rate_bytes_per_second:
            out[c.ifindex] = out.get(c.ifindex, 0.0) + c.rate_bytes_per_second
    return out


def _dump(sock: socket.socket, msg_type: int, seq: int, ifindex: int = 0) -> TcDump:
    sock.send(dump_request(msg_type, seq, ifindex))
    chunks: list[bytes] = []
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        dump = parse_tc_dump(b"".join(chunks))
        if dump.done:
            return dump
    raise NetlinkError("the dump ended without NLMSG_DONE")


def read_shaped_rates(timeout_s: float = 1.0) -> dict[int, float]:
    """ifindex -> shaped rate for the interfaces of this process's network namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(timeout_s)
        sock.bind((0, 0))
        qdiscs = _dump(sock, RTM_GETQDISC, 1)
        htb = sorted(
            {q.ifindex for q in qdiscs.entries if q.kind == "htb" and q.parent == TC_H_ROOT}
        )
        classes = [_dump(sock, RTM_GETTCLASS, 2 + i, ifindex) for i, ifindex in enumerate(htb)]
        joined = TcDump(tuple(e for c in classes for e in c.entries), True)
        return shaped_rates(qdiscs, joined)
