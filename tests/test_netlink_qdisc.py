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
from gpufeed.netlink.messages import NLMSG_HDR

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
        for f in NetworkCollector(paths_, shaped_rates=lambda: {2: 1e6, 9: 5e6}).collect()
        for s in f.samples
        if s.name == "gpufeed_network_shaped_rate_bytes_per_second"
    }
    assert got == {"eno1": 1e6}  # eno2 is not shaped; ifindex 9 is no interface here

    def broken() -> dict[int, float]:
        raise OSError(1, "Operation not permitted")

    # netlink refused (a sandbox without AF_NETLINK): the rest is still collected, the
    # shaped rate is absent and the reason is logged once
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.network"):
        rest = NetworkCollector(paths_, shaped_rates=broken).collect()
    names = {s.name for f in rest for s in f.samples}
    assert "gpufeed_network_speed_bytes_per_second" in names
    assert "gpufeed_network_shaped_rate_bytes_per_second" not in names
    assert any("rtnetlink" in r.getMessage() for r in caplog.records)
