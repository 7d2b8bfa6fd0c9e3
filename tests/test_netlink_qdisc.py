"""The shaped rate of an interface from its root qdisc (gpufeed.netlink.qdisc): real kernel
dumps (tests/fixtures/netlink/README.md says how they were made), broken ones, and what the
network collector and the correlator make of a shaped link."""

from __future__ import annotations

import logging
import shutil
import struct
from pathlib import Path

import pytest

from gpufeed.collectors.network import NetworkCollector
from gpufeed.hostpaths import HostPaths
from gpufeed.netlink import qdisc as q
from gpufeed.netlink.messages import NLMSG_DONE, NLMSG_HDR, align

FIX = Path(__file__).parent / "fixtures" / "netlink"
NET_FIX = Path(__file__).parent / "fixtures" / "network"


def dumps() -> tuple[q.TcDump, q.TcDump]:
    return (
        q.parse_tc_dump((FIX / "qdiscs.bin").read_bytes()),
        q.parse_tc_dump((FIX / "htb-classes.bin").read_bytes()),
    )


def test_real_dumps_give_tbf_rates_and_htb_top_level_ceilings() -> None:
    qdiscs, classes = dumps()
    assert qdiscs.done and classes.done
    roots = {(e.ifindex, e.kind) for e in qdiscs.entries if e.parent == q.TC_H_ROOT}
    assert roots == {(1, "noqueue"), (2, "htb"), (3, "tbf"), (4, "noqueue"), (5, "tbf")}
    # 8 Mbit/s; 40 Gbit/s does not fit tc_ratespec's 32 bits: TCA_TBF_RATE64;
    # htb: the top-level classes' ceilings 40 + 8 Mbit/s (1:10 is a child of 1:1: not added)
    assert q.shaped_rates(qdiscs, classes) == {3: 1e6, 5: 5e9, 2: 6e6}


def test_without_class_dump_an_htb_root_is_not_guessed() -> None:
    qdiscs, _ = dumps()
    assert q.shaped_rates(qdiscs, q.TcDump((), True)) == {3: 1e6, 5: 5e9}


def test_truncated_dump_is_an_error_and_an_unfinished_one_says_so() -> None:
    data = (FIX / "qdiscs.bin").read_bytes()
    with pytest.raises(q.NetlinkError, match="overruns"):
        q.parse_tc_dump(data[:40])
    first_len = struct.unpack_from("=I", data)[0]
    assert not q.parse_tc_dump(data[:first_len]).done


def test_netlink_error_message_raises_with_its_errno() -> None:
    err = struct.pack("=i", -1) + q.dump_request(q.RTM_GETQDISC, 7)
    msg = NLMSG_HDR.pack(NLMSG_HDR.size + len(err), q.NLMSG_ERROR, 0, 7, 0) + err
    with pytest.raises(q.NetlinkError, match="not permitted"):
        q.parse_tc_dump(msg)


def test_collector_exports_the_shaped_rate_of_the_interfaces_that_have_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    shutil.copytree(NET_FIX, root, symlinks=True)
    for name, index in (("eno1", 2), ("eno2", 3)):
        (root / "sys/class/net" / name / "ifindex").write_text(f"{index}\n")
    paths_ = HostPaths(procfs=root / "proc", sysfs=root / "sys", rootfs=root)
    got = {
        dict(s.labels)["device"]: s.value
        for f in NetworkCollector(
            paths_, shaped_rates=lambda: q.ShapedRates({2: 1e6, 9: 5e6})
        ).collect()
        for s in f.samples
        if s.name == "gpufeed_network_shaped_rate_bytes_per_second"
    }
    assert got == {"eno1": 1e6}  # eno2 is not shaped; ifindex 9 is no interface here

    def broken() -> q.ShapedRates:
        raise OSError(1, "Operation not permitted")

    # netlink refused (a sandbox without AF_NETLINK): the rest is still collected, the
    # shaped rate is absent and the reason is logged once
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.network"):
        rest = NetworkCollector(paths_, shaped_rates=broken).collect()
    names = {s.name for f in rest for s in f.samples}
    assert "gpufeed_network_speed_bytes_per_second" in names
    assert "gpufeed_network_shaped_rate_bytes_per_second" not in names
    assert any("rtnetlink" in r.getMessage() for r in caplog.records)


# --- each kind's options in its own layout -------------------------------------------------
# A host whose default qdisc is pfifo_fast (a single-queue NIC: its root; a multi-queue one:
# mq's children) dumps tc_prio_qopt, a plain struct, as TCA_OPTIONS; read as attributes,
# its `bands` 3 is "an attribute of length 3", and 0.2.0 lost every rate of the dump.


def test_real_dump_with_pfifo_fast_mq_and_fifos_keeps_the_tbf_and_htb_rates() -> None:
    qdiscs = q.parse_tc_dump((FIX / "kinds-qdiscs.bin").read_bytes())
    classes = q.parse_tc_dump((FIX / "kinds-htb-classes.bin").read_bytes())
    roots = {e.ifindex: e.kind for e in qdiscs.entries if e.parent == q.TC_H_ROOT}
    assert [roots[i] for i in (3, 5, 7, 9, 11, 13)] == [
        "pfifo_fast", "tbf", "mq", "pfifo", "bfifo", "htb"
    ]  # fmt: skip
    under_mq = [e.kind for e in qdiscs.entries if e.ifindex == 7 and e.parent != q.TC_H_ROOT]
    assert under_mq == ["pfifo_fast"] * 4
    assert qdiscs.problems == () and classes.problems == ()
    assert all(e.options_read for e in qdiscs.entries)
    # 8 Mbit/s on t0; the htb on h0: its top-level ceilings 40 + 8 Mbit/s
    assert q.read_dumps(qdiscs, [classes]) == q.ShapedRates({5: 1e6, 13: 6e6})


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes as the kernel writes it."""
    length = q.RTA_HDR.size + len(payload)
    return q.RTA_HDR.pack(length, kind) + payload + b"\0" * (align(length) - length)


def tc_message(
    ifindex: int, kind: str, options: bytes | None, *, parent: int = q.TC_H_ROOT,
    mtype: int = q.RTM_NEWQDISC,
) -> bytes:  # fmt: skip
    body = q.TCMSG.pack(0, ifindex, ifindex << 16, parent, 1) + attr(q.TCA_KIND, kind.encode())
    if options is not None:
        body += attr(q.TCA_OPTIONS | 0x8000, options)  # NLA_F_NESTED, as nla_nest_start sets
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), mtype, 2, 1, 0) + body


def dump(*messages: bytes) -> bytes:
    return b"".join(messages) + NLMSG_HDR.pack(NLMSG_HDR.size + 4, NLMSG_DONE, 2, 1, 0) + b"\0" * 4


def ratespec(rate: int) -> bytes:
    return q.RATESPEC.pack(0, 1, 0, -1, 0, rate)


def tbf(rate: int, rate64: int | None = None) -> bytes:
    parms = ratespec(rate) + ratespec(0) + struct.pack("=III", 10_000, 20_000, 0)
    out = attr(q.TCA_TBF_PARMS, parms)
    return out if rate64 is None else out + attr(q.TCA_TBF_RATE64, struct.pack("=Q", rate64))


PRIO = struct.pack("=i16B", 3, 1, 2, 2, 2, 1, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
# pkt_sched.h's attribute numbers, for kinds this host's kernel does not build
FQ_CODEL = b"".join(attr(t, struct.pack("=I", v)) for t, v in ((1, 5000), (2, 10240), (5, 1024)))
FQ = attr(1, struct.pack("=I", 10000)) + attr(7, struct.pack("=I", 125_000))  # maxrate: a flow's
NETEM_QOPT = struct.pack("=6I", 10_000, 1000, 0, 0, 0, 0)
NETEM_RATE = 6, 8  # TCA_NETEM_RATE (struct tc_netem_rate), TCA_NETEM_RATE64


def cake(rate64: int) -> bytes:
    return attr(q.TCA_CAKE_BASE_RATE64, struct.pack("=Q", rate64)) + attr(3, struct.pack("=I", 0))


def netem(rate: int | None, rate64: int | None = None) -> bytes:
    out = NETEM_QOPT + attr(1, struct.pack("=3I", 0, 0, 0))  # TCA_NETEM_CORR
    if rate is not None:
        out += attr(NETEM_RATE[0], struct.pack("=IiIi", rate, 0, 0, 0))
    if rate64 is not None:
        out += attr(NETEM_RATE[1], struct.pack("=Q", rate64))
    return out


KINDS = (
    # ifindex, kind, options, the rate it shapes its link to (bytes/s; None: nothing)
    (2, "pfifo_fast", PRIO, None),
    (3, "prio", struct.pack("=i16B", 4, *([0] * 16)), None),
    (4, "mq", None, None),
    (5, "noqueue", None, None),
    (6, "fq_codel", FQ_CODEL, None),
    (7, "fq", FQ, None),
    (8, "pfifo", struct.pack("=I", 1000), None),
    (9, "bfifo", struct.pack("=I", 10_000), None),
    (10, "cake", cake(12_500_000), 12_500_000.0),  # bandwidth 100mbit
    (11, "cake", cake(0), None),  # unlimited: shapes nothing
    (12, "netem", netem(625_000), 625_000.0),  # rate 5mbit
    (13, "netem", netem(0xFFFFFFFF, 6_250_000_000), 6.25e9),  # 50gbit: TCA_NETEM_RATE64
    (14, "netem", netem(None), None),  # delay only
    (15, "netem", NETEM_QOPT, None),  # no attributes after the struct (an old kernel)
    (16, "tbf", tbf(1_000_000), 1e6),
    (17, "tbf", tbf(0xFFFFFFFF, 5_000_000_000), 5e9),
)


def test_each_kind_is_read_in_its_own_layout_in_one_dump() -> None:
    data = dump(*(tc_message(i, kind, opts) for i, kind, opts, _ in KINDS))
    got = q.parse_tc_dump(data)
    assert got.done and got.problems == ()
    assert [(e.ifindex, e.kind, e.rate_bytes_per_second) for e in got.entries] == [
        (i, kind, rate) for i, kind, _, rate in KINDS
    ]
    want = {i: rate for i, _, _, rate in KINDS if rate is not None}
    assert q.read_dumps(got, []) == q.ShapedRates(want)


def test_an_unknown_kind_is_skipped_and_the_rest_of_the_dump_survives() -> None:
    got = q.parse_tc_dump(
        dump(
            tc_message(2, "sfq", struct.pack("=5I", 1514, 0, 127, 1024, 128)),  # a plain struct
            tc_message(3, "no_such_kind", b"\x03\x00"),  # not attributes, not a known struct
            tc_message(4, "tbf", tbf(1_000_000)),
        )
    )
    assert [(e.kind, e.rate_bytes_per_second, e.options_read) for e in got.entries] == [
        ("sfq", None, True), ("no_such_kind", None, True), ("tbf", 1e6, True)
    ]  # fmt: skip
    assert got.problems == ()  # nothing is wrong with a kind gpufeed does not read
    assert q.read_dumps(got, []).bytes_per_second == {4: 1e6}


def test_malformed_options_lose_only_their_qdisc_with_one_problem_per_kind() -> None:
    short_tbf = attr(q.TCA_TBF_PARMS, ratespec(1_000_000))  # 12 bytes of tc_tbf_qopt's 36
    got = q.parse_tc_dump(
        dump(
            tc_message(2, "pfifo_fast", PRIO[:7]),  # cut short
            tc_message(3, "pfifo_fast", struct.pack("=i16B", 99, *([0] * 16))),  # 99 bands
            tc_message(4, "tbf", short_tbf),
            tc_message(5, "tbf", b"\x03\x00\x00\x00"),  # not attributes
            tc_message(6, "tbf", tbf(1_000_000)),
            tc_message(7, "netem", NETEM_QOPT[:20]),
            tc_message(8, "pfifo_fast", PRIO),
        )
    )
    assert [(e.ifindex, e.options_read) for e in got.entries] == [
        (2, False), (3, False), (4, False), (5, False), (6, True), (7, False), (8, True)
    ]  # fmt: skip
    assert len(got.problems) == 3  # pfifo_fast, tbf, netem: one line each, not one per qdisc
    assert [p.split()[0] for p in got.problems] == ["pfifo_fast", "tbf", "netem"]
    assert "tc_prio_qopt: 7 bytes, 20 expected" in got.problems[0]
    assert "TCA_TBF_PARMS: 12 bytes, 36 expected" in got.problems[1]
    assert q.read_dumps(got, []).bytes_per_second == {6: 1e6}


def test_a_malformed_message_loses_only_itself() -> None:
    good = tc_message(3, "tbf", tbf(1_000_000))
    body = q.TCMSG.pack(0, 2, 0, q.TC_H_ROOT, 1) + q.RTA_HDR.pack(200, q.TCA_KIND) + b"tbf\0"
    bad = NLMSG_HDR.pack(NLMSG_HDR.size + len(body), q.RTM_NEWQDISC, 2, 1, 0) + body
    got = q.parse_tc_dump(dump(bad, good))
    assert [e.ifindex for e in got.entries] == [3]
    assert len(got.problems) == 1 and "overruns" in got.problems[0]


def test_an_htb_class_that_cannot_be_read_leaves_the_tree_unshaped_not_smaller() -> None:
    parms = ratespec(1_000_000) + ratespec(5_000_000) + struct.pack("=5I", 0, 0, 0, 0, 0)
    classes = q.parse_tc_dump(
        dump(
            tc_message(2, "htb", attr(q.TCA_HTB_PARMS, parms), mtype=q.RTM_NEWTCLASS),
            tc_message(2, "htb", attr(q.TCA_HTB_PARMS, parms[:20]), mtype=q.RTM_NEWTCLASS),
            tc_message(3, "htb", attr(q.TCA_HTB_PARMS, parms), mtype=q.RTM_NEWTCLASS),
        )
    )
    glob = attr(q.TCA_HTB_INIT, struct.pack("=5I", 3, 10, 0x10, 0, 0))
    qdiscs = q.parse_tc_dump(dump(tc_message(2, "htb", glob), tc_message(3, "htb", glob)))
    # the sum without the unreadable class would read 2 as shaped to 5 MB/s: saturated
    # when it is not; its rate is absent instead, and 3's is whole
    got = q.read_dumps(qdiscs, [classes])
    assert got.bytes_per_second == {3: 5e6}
    assert len(got.problems) == 1 and got.problems[0].startswith("htb class options")


def test_collector_logs_an_unreadable_kind_once_and_exports_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    shutil.copytree(NET_FIX, root, symlinks=True)
    for name, index in (("eno1", 2), ("eno2", 3)):
        (root / "sys/class/net" / name / "ifindex").write_text(f"{index}\n")
    paths_ = HostPaths(procfs=root / "proc", sysfs=root / "sys", rootfs=root)
    data = dump(
        tc_message(2, "tbf", tbf(1_000_000)),
        tc_message(3, "pfifo_fast", PRIO[:7]),
        tc_message(4, "pfifo_fast", PRIO[:9]),
    )
    col = NetworkCollector(paths_, shaped_rates=lambda: q.read_dumps(q.parse_tc_dump(data), []))
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.network"):
        for _ in range(5):
            got = {
                dict(s.labels)["device"]: s.value
                for f in col.collect()
                for s in f.samples
                if s.name == "gpufeed_network_shaped_rate_bytes_per_second"
            }
            assert got == {"eno1": 1e6}
    lines = [r.getMessage() for r in caplog.records if "pfifo_fast" in r.getMessage()]
    assert len(lines) == 1, lines  # five collects, two broken qdiscs: one line
