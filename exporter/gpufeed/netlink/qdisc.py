"""The rate an interface is shaped to, from its root queueing discipline (rtnetlink).

A link's `speed` is what the wire (or a veth: always 10 Gbit/s) can carry; a token bucket
or an HTB tree on the interface (`tc qdisc add dev eth0 root tbf rate 8mbit ...`, a pod's
bandwidth annotation, a host's egress policy) caps what it does carry. A link running at
its shaped rate is saturated although it is far below its speed, so the collector exports
the shaped rate beside the speed and the correlator uses the smaller one.

What is read, from one RTM_GETQDISC dump of the agent's own network namespace (and an
RTM_GETTCLASS dump of each interface with an htb root: what `tc -s qdisc show` and
`tc class show` ask; no `tc` binary needed):
- a root `tbf`: its rate (TCA_TBF_PARMS' tc_ratespec.rate, or TCA_TBF_RATE64 when the rate
  does not fit 32 bits). The peak rate only bounds bursts; the sustained rate is `rate`.
- a root `htb`: the sum of the ceilings of its top-level classes (those whose parent is the
  root): the most its tree lets through when every class borrows all it may
  (TCA_HTB_PARMS' ceil, or TCA_HTB_CEIL64).
- a root `cake` with a bandwidth (TCA_CAKE_BASE_RATE64), a root `netem` with a rate
  (TCA_NETEM_RATE, TCA_NETEM_RATE64): both cap what the link sends.
Anything else (fq_codel, mq, noqueue, pfifo_fast, a classless root without a rate) shapes
nothing and is left out: absent, not "unlimited". Ingress policing is not a root qdisc and
is not read.

Each kind's TCA_OPTIONS has its own layout: nested attributes (tbf, htb, fq_codel, cake),
a plain struct (pfifo_fast and prio: tc_prio_qopt; pfifo, bfifo: tc_fifo_qopt), a struct
followed by attributes (netem), or none (mq, noqueue); `QDISC_OPTIONS` reads each in its
own. A kind not listed there is skipped (its rate absent), and a malformed blob loses only
its own qdisc, with one problem per kind in `TcDump.problems`, never the whole dump.

`parse_tc_dump(data)` and `read_dumps` are pure (netlink messages in, typed values out);
`read_shaped_rates()` is the thin reader around one netlink socket.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpufeed.netlink.messages import NLMSG_ERROR, align, error_code, request, split_messages

TCMSG = struct.Struct("=BxxxiIII")  # family, pad, ifindex, handle, parent, info
RTA_HDR = struct.Struct("=HH")  # len, type
RATESPEC = struct.Struct("=BBHhHI")  # cell_log, linklayer, overhead, cell_align, mpu, rate

RTM_NEWQDISC, RTM_GETQDISC = 36, 38
RTM_NEWTCLASS, RTM_GETTCLASS = 40, 42
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_TBF_PARMS, TCA_TBF_RATE64 = 1, 4
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_CEIL64 = 1, 2, 7
TCA_CAKE_BASE_RATE64 = 2
TCA_NETEM_RATE, TCA_NETEM_RATE64 = 6, 8
TCQ_PRIO_BANDS = 16
# The plain structs' sizes (pkt_sched.h): what a blob of that kind must hold at least
PRIO_QOPT_BYTES = 4 + TCQ_PRIO_BANDS  # int bands; u8 priomap[TC_PRIO_MAX + 1]
FIFO_QOPT_BYTES = 4  # u32 limit
NETEM_QOPT_BYTES = 6 * 4  # latency, limit, loss, gap, duplicate, jitter
TBF_QOPT_BYTES = 2 * RATESPEC.size + 3 * 4  # rate, peakrate; limit, buffer, mtu
HTB_OPT_BYTES = 2 * RATESPEC.size + 5 * 4  # rate, ceil; buffer, cbuffer, quantum, level, prio
HTB_GLOB_BYTES = 5 * 4  # version, rate2quantum, defcls, debug, direct_pkts
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
    options_read: bool = True  # False: its options were malformed (its rate unknown)


@dataclass(frozen=True, slots=True)
class TcDump:
    entries: tuple[TcEntry, ...]
    done: bool  # NLMSG_DONE seen: the dump is complete
    problems: tuple[str, ...] = ()  # at most one per kind: what was left out, and why


@dataclass(frozen=True, slots=True)
class ShapedRates:
    """What one read gives the collector: the rates, and the problems to log once."""

    bytes_per_second: Mapping[int, float] = field(default_factory=dict)  # ifindex -> rate
    problems: tuple[str, ...] = ()


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


def _need(what: str, b: bytes | None, size: int) -> bytes:
    """`b`, at least `size` bytes of it, or the NetlinkError saying what was cut short."""
    if b is None or len(b) < size:
        got = "absent" if b is None else f"{len(b)} bytes"
        raise NetlinkError(f"{what}: {got}, {size} expected")
    return b


def _ratespec_rate(b: bytes, offset: int) -> int:
    return int(RATESPEC.unpack_from(b, offset)[5])


# Each kind's TCA_OPTIONS in the layout its kernel module dumps (include/uapi/linux/
# pkt_sched.h): a reader checks the layout and returns the rate the qdisc (or class)
# shapes to in bytes per second, or None where it shapes nothing. A reader raises
# NetlinkError for a blob that is not in its kind's layout.
OptionsReader = Callable[[bytes], int | None]


def _shapes_nothing(_options: bytes) -> None:
    """mq, noqueue and the like: no options of interest (mq dumps none)."""
    return None


def _prio_qopt(options: bytes) -> None:
    """pfifo_fast and prio: a plain struct tc_prio_qopt (int bands; u8 priomap[16]), not
    attributes: read as attributes, `bands` 3 is an attribute of length 3."""
    bands = struct.unpack_from("=i", _need("tc_prio_qopt", options, PRIO_QOPT_BYTES))[0]
    if not 2 <= bands <= TCQ_PRIO_BANDS:
        raise NetlinkError(f"tc_prio_qopt: {bands} bands, 2-{TCQ_PRIO_BANDS} expected")
    return None


def _fifo_qopt(options: bytes) -> None:
    """pfifo, bfifo, pfifo_head_drop: a plain struct tc_fifo_qopt (u32 limit)."""
    _need("tc_fifo_qopt", options, FIFO_QOPT_BYTES)
    return None


def _attributes_only(options: bytes) -> None:
    """fq_codel, fq, codel, pie, red...: nested attributes, none of them a rate that caps
    the link (fq's maxrate is per flow)."""
    parse_attrs(options)
    return None


def _tbf(options: bytes) -> int | None:
    """Nested: TCA_TBF_PARMS (struct tc_tbf_qopt: rate, peakrate, limit, buffer, mtu) and
    TCA_TBF_RATE64 where the rate does not fit tc_ratespec's 32 bits."""
    opts = parse_attrs(options)
    parms = _need("TCA_TBF_PARMS", opts.get(TCA_TBF_PARMS), TBF_QOPT_BYTES)
    return _u64(opts.get(TCA_TBF_RATE64)) or _ratespec_rate(parms, 0)


def _htb_qdisc(options: bytes) -> None:
    """Nested: TCA_HTB_INIT (struct tc_htb_glob) and the like; the rates are the classes'."""
    _need("TCA_HTB_INIT", parse_attrs(options).get(TCA_HTB_INIT), HTB_GLOB_BYTES)
    return None


def _htb_class(options: bytes) -> int | None:
    """Nested: TCA_HTB_PARMS (struct tc_htb_opt: rate, ceil, ...), TCA_HTB_CEIL64."""
    opts = parse_attrs(options)
    parms = _need("TCA_HTB_PARMS", opts.get(TCA_HTB_PARMS), HTB_OPT_BYTES)
    return _u64(opts.get(TCA_HTB_CEIL64)) or _ratespec_rate(parms, RATESPEC.size)


def _cake(options: bytes) -> int | None:
    """Nested: TCA_CAKE_BASE_RATE64, the shaper's bandwidth (0: unlimited)."""
    return _u64(parse_attrs(options).get(TCA_CAKE_BASE_RATE64)) or None


def _netem(options: bytes) -> int | None:
    """A plain struct tc_netem_qopt, then nested attributes after it (its own layout):
    TCA_NETEM_RATE (struct tc_netem_rate, u32 rate first; 0: no rate) and TCA_NETEM_RATE64
    where the rate does not fit 32 bits."""
    _need("tc_netem_qopt", options, NETEM_QOPT_BYTES)
    opts = parse_attrs(options[align(NETEM_QOPT_BYTES) :])
    rate64 = _u64(opts.get(TCA_NETEM_RATE64))
    rate = opts.get(TCA_NETEM_RATE)
    if rate64 or rate is None:
        return rate64 or None
    return int(struct.unpack_from("=I", _need("tc_netem_rate", rate, 4))[0]) or None


# qdisc kind -> its options' reader. A kind not here is skipped: its options are not read
# and it shapes nothing as far as the collector knows (absent, never a failed dump).
QDISC_OPTIONS: dict[str, OptionsReader] = {
    "noqueue": _shapes_nothing,
    "mq": _shapes_nothing,
    "pfifo_fast": _prio_qopt,
    "prio": _prio_qopt,
    "pfifo": _fifo_qopt,
    "bfifo": _fifo_qopt,
    "pfifo_head_drop": _fifo_qopt,
    "fq_codel": _attributes_only,
    "fq": _attributes_only,
    "codel": _attributes_only,
    "pie": _attributes_only,
    "fq_pie": _attributes_only,
    "red": _attributes_only,
    "tbf": _tbf,
    "htb": _htb_qdisc,
    "cake": _cake,
    "netem": _netem,
}
# Class options are in another layout than their qdisc's; only htb's carry a rate read here.
CLASS_OPTIONS: dict[str, OptionsReader] = {"htb": _htb_class}


def _rate(kind: str, is_class: bool, options: bytes | None) -> float | None:
    """The rate `options` set, by its kind's reader; raises NetlinkError if malformed."""
    reader = (CLASS_OPTIONS if is_class else QDISC_OPTIONS).get(kind)
    if reader is None or options is None:
        return None
    try:
        rate = reader(options)
    except struct.error as exc:  # a reader's unpack past the end: malformed too
        raise NetlinkError(str(exc)) from None
    return float(rate) if rate else None


def _entry(mtype: int, body: bytes, problems: dict[str, str]) -> TcEntry | None:
    """One RTM_NEWQDISC / RTM_NEWTCLASS message; a malformed one loses only itself (its
    problem noted once per kind in `problems`)."""
    _fam, ifindex, handle, parent, _info = TCMSG.unpack_from(body)
    is_class = mtype == RTM_NEWTCLASS
    what = "class" if is_class else "qdisc"
    try:
        attrs = parse_attrs(body[TCMSG.size :])
    except NetlinkError as exc:
        problems.setdefault(f"?{what}", f"a {what} message: {exc}: left out")
        return None
    kind = attrs.get(TCA_KIND, b"").split(b"\0", 1)[0].decode("ascii", "replace")
    try:
        rate = _rate(kind, is_class, attrs.get(TCA_OPTIONS))
    except NetlinkError as exc:
        problems.setdefault(
            f"{what} {kind}", f"{kind} {what} options unreadable ({exc}): its rate is left out"
        )
        return TcEntry(is_class, ifindex, handle, parent, kind, None, options_read=False)
    return TcEntry(is_class, ifindex, handle, parent, kind, rate)


def parse_tc_dump(data: bytes) -> TcDump:
    """Parses the messages of a qdisc or class dump (one or more recv() buffers joined).
    Raises NetlinkError only for what spoils the whole dump: a message cut short, or the
    kernel's error answer."""
    entries: list[TcEntry] = []
    problems: dict[str, str] = {}  # one per kind, however many qdiscs of it are broken
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
        entry = _entry(mtype, body, problems)
        if entry is not None:
            entries.append(entry)
    return TcDump(tuple(entries), done, tuple(problems.values()))


def shaped_rates(qdiscs: TcDump, classes: TcDump) -> dict[int, float]:
    """ifindex -> bytes per second the interface's root qdisc shapes it to."""
    out: dict[int, float] = {}
    htb_roots: dict[int, int] = {}  # ifindex -> the root htb's handle
    for q in qdiscs.entries:
        if q.is_class or q.parent != TC_H_ROOT:
            continue
        if q.kind == "htb":
            htb_roots[q.ifindex] = q.handle
        elif q.rate_bytes_per_second:  # tbf, cake, netem: the qdisc's own rate
            out[q.ifindex] = q.rate_bytes_per_second
    unknown: set[int] = set()  # an htb root with a top-level class whose ceiling is unknown
    for c in classes.entries:
        root = htb_roots.get(c.ifindex)
        # a top-level class: its parent is the root (or, as some kernels dump it, the qdisc)
        top = c.parent in (TC_H_ROOT, root)
        if root is None or not c.is_class or c.kind != "htb" or not top:
            continue
        if not c.options_read:
            unknown.add(c.ifindex)  # the sum without it would be too small: no rate at all
        elif c.rate_bytes_per_second:
            out[c.ifindex] = out.get(c.ifindex, 0.0) + c.rate_bytes_per_second
    return {i: r for i, r in out.items() if i not in unknown}


def read_dumps(qdiscs: TcDump, class_dumps: list[TcDump]) -> ShapedRates:
    """The rates of one qdisc dump and the class dumps of its htb roots, and the problems
    of all of them (one per kind)."""
    joined = TcDump(tuple(e for c in class_dumps for e in c.entries), True)
    problems = dict.fromkeys(p for d in (qdiscs, *class_dumps) for p in d.problems)
    return ShapedRates(shaped_rates(qdiscs, joined), tuple(problems))


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


def read_shaped_rates(timeout_s: float = 1.0) -> ShapedRates:
    """ifindex -> shaped rate for the interfaces of this process's network namespace, and
    the problems of the qdiscs whose options could not be read."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(timeout_s)
        sock.bind((0, 0))
        qdiscs = _dump(sock, RTM_GETQDISC, 1)
        htb = sorted(
            {q.ifindex for q in qdiscs.entries if q.kind == "htb" and q.parent == TC_H_ROOT}
        )
        classes = [_dump(sock, RTM_GETTCLASS, 2 + i, ifindex) for i, ifindex in enumerate(htb)]
        return read_dumps(qdiscs, classes)
