"""The network collector on the fixture tree, on broken copies of it, and on this machine."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import psutil
import pytest

from gpufeed.agent import wiring
from gpufeed.collectors.base import CollectorContext, PartialCollectionError
from gpufeed.collectors.network import NetworkCollector, XmitWaitClock
from gpufeed.hostpaths import HostPaths
from gpufeed.model import Family

FIX = Path(__file__).parent / "fixtures" / "network"

RX = "gpufeed_network_receive_bytes_total"
TX = "gpufeed_network_transmit_bytes_total"
SPEED = "gpufeed_network_speed_bytes_per_second"
WAIT = "gpufeed_network_transmit_wait_seconds_total"
UP = "gpufeed_network_link_up"
ERR = "gpufeed_network_link_errors_total"
CONG = "gpufeed_network_congestion_packets_total"

Key = tuple[str, tuple[tuple[str, str], ...]]


def paths(root: Path) -> HostPaths:
    return HostPaths(procfs=root / "proc", sysfs=root / "sys", rootfs=root)


def flat(families: list[Family]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for fam in families:
        for s in fam.samples:
            assert (s.name, s.labels) not in out, f"duplicate series {s.name}{s.labels}"
            out[(s.name, s.labels)] = s.value
    return out


def nd(device: str, fabric: str) -> tuple[tuple[str, str], ...]:
    return (("device", device), ("fabric", fabric))


def rd(device: str, fabric: str) -> tuple[tuple[str, str], ...]:
    return (("device", device), ("fabric", fabric), ("port", "1"))


EXPECTED: dict[Key, float] = {
    # netdev: physical interfaces only; lo, veth, docker0 and tailscale0 are not here.
    (RX, nd("eno1", "ethernet")): 918273645501,
    (TX, nd("eno1", "ethernet")): 401928374655,
    (SPEED, nd("eno1", "ethernet")): 25000e6 / 8,
    (RX, nd("eno2", "ethernet")): 0,
    (TX, nd("eno2", "ethernet")): 0,
    (RX, nd("eno3", "ethernet")): 73400320,
    (TX, nd("eno3", "ethernet")): 10485760,
    (RX, nd("ens1f0np0", "ethernet")): 51234567890,
    (TX, nd("ens1f0np0", "ethernet")): 48765432109,
    (SPEED, nd("ens1f0np0", "ethernet")): 200000e6 / 8,
    (RX, nd("ib0", "infiniband")): 2234567890123,
    (TX, nd("ib0", "infiniband")): 1987654321098,
    (SPEED, nd("ib0", "infiniband")): 400000e6 / 8,
    # RDMA ports: 4-byte words x 4; irdma0 (iWARP) is not here.
    (RX, rd("mlx4_0", "infiniband")): 123456789012345 * 4,
    (TX, rd("mlx4_0", "infiniband")): 23456789012345 * 4,
    (SPEED, rd("mlx4_0", "infiniband")): 56e9 / 8,
    (RX, rd("mlx5_0", "infiniband")): 1234567890123 * 4,
    (TX, rd("mlx5_0", "infiniband")): 987654321012 * 4,
    (SPEED, rd("mlx5_0", "infiniband")): 400e9 / 8,
    (WAIT, rd("mlx5_0", "infiniband")): 1500000000 * 8 / (400e9 / 8),
    (RX, rd("mlx5_1", "roce")): 5000000000 * 4,
    (TX, rd("mlx5_1", "roce")): 6000000000 * 4,
    (SPEED, rd("mlx5_1", "roce")): 200e9 / 8,
    (RX, rd("mlx5_2", "infiniband")): 0,
    (TX, rd("mlx5_2", "infiniband")): 0,
    (WAIT, rd("mlx5_2", "infiniband")): 0.0,
}


def cn(labels: tuple[tuple[str, str], ...], counter: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((*labels, ("counter", counter))))


def link_series() -> dict[Key, float]:
    """Link state, fault and congestion counters: only the counters each port has."""
    out: dict[Key, float] = {}
    zero_ib = (
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
    )
    roce = ("out_of_sequence", "packet_seq_err", "implied_nak_seq_err", "local_ack_timeout_err")
    ports = {
        # mlx5_0 (InfiniBand) has the mlx5 sequence-error hw_counters but no congestion ones
        rd("mlx5_0", "infiniband"): (
            1.0,
            {
                **dict.fromkeys(zero_ib, 0),
                "symbol_error": 27,
                "link_error_recovery": 2,
                "link_downed": 1,
                "port_rcv_errors": 5,
                **dict.fromkeys(roce, 0),
                "local_ack_timeout_err": 3,
            },
            {"port_xmit_discards": 12},
        ),
        rd("mlx5_1", "roce"): (
            1.0,
            {
                **dict.fromkeys(zero_ib, 0),
                **dict.fromkeys(roce, 0),
                "out_of_sequence": 17,
                "local_ack_timeout_err": 3,
            },
            {
                "port_xmit_discards": 0,
                "np_ecn_marked_roce_packets": 3400,
                "np_cnp_sent": 1200,
                "rp_cnp_handled": 1100,
            },
        ),
        rd("mlx5_2", "infiniband"): (
            0.0,
            {**dict.fromkeys(zero_ib, 0), **dict.fromkeys(roce, 0), "local_ack_timeout_err": 3},
            {"port_xmit_discards": 0},
        ),
        # ConnectX-3 on an old kernel: PMA counters only, no hw_counters
        rd("mlx4_0", "infiniband"): (1.0, dict.fromkeys(zero_ib, 0), {"port_xmit_discards": 0}),
        # netdevs: carrier (eno2 is administratively down: no carrier, operstate down)
        nd("eno1", "ethernet"): (
            1.0,
            {"carrier_changes": 4, "rx_errors": 3, "tx_errors": 0, "rx_crc_errors": 2},
            {},
        ),
        nd("eno2", "ethernet"): (0.0, {"carrier_changes": 7}, {}),
        nd("eno3", "ethernet"): (
            0.0,
            {"carrier_changes": 9, "rx_errors": 0, "tx_errors": 0, "rx_crc_errors": 0},
            {},
        ),
        nd("ens1f0np0", "ethernet"): (
            1.0,
            {"carrier_changes": 2, "rx_errors": 0, "tx_errors": 0, "rx_crc_errors": 0},
            {},
        ),
        nd("ib0", "infiniband"): (1.0, {"carrier_changes": 2, "rx_errors": 0, "tx_errors": 1}, {}),
    }
    for labels, (up, errors, congestion) in ports.items():
        out[(UP, labels)] = up
        out.update({(ERR, cn(labels, c)): v for c, v in errors.items()})
        out.update({(CONG, cn(labels, c)): v for c, v in congestion.items()})
    return out


EXPECTED.update(link_series())


def test_fixture_tree_gives_exactly_the_expected_series() -> None:
    families = NetworkCollector(paths(FIX)).collect()
    assert [(f.name, f.type) for f in families] == [
        (RX, "counter"),
        (TX, "counter"),
        (SPEED, "gauge"),
        ("gpufeed_network_shaped_rate_bytes_per_second", "gauge"),  # none shaped here
        (WAIT, "counter"),
        (UP, "gauge"),
        (ERR, "counter"),
        (CONG, "counter"),
    ]
    got = flat(families)
    assert got == pytest.approx(EXPECTED, rel=1e-12)
    assert set(got) == set(EXPECTED)


def test_include_virtual_adds_veth_and_bridge_but_never_loopback() -> None:
    got = flat(NetworkCollector(paths(FIX), include_virtual=True).collect())
    extra = set(got) - set(EXPECTED)
    veth, docker = nd("veth3f2a1b0", "ethernet"), nd("docker0", "ethernet")
    counters = ("carrier_changes", "rx_errors", "tx_errors", "rx_crc_errors")
    assert extra == {
        (RX, veth),
        (TX, veth),
        (SPEED, veth),
        (UP, veth),
        *((ERR, cn(veth, c)) for c in counters),
        (RX, docker),
        (TX, docker),
        (UP, docker),
        *((ERR, cn(docker, c)) for c in counters),
    }
    assert got[(SPEED, nd("veth3f2a1b0", "ethernet"))] == 10000e6 / 8


def test_saturated_counter_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    collector = NetworkCollector(paths(FIX))
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.network"):
        collector.collect()
        collector.collect()
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1
    assert "mlx4_0 port 1" in msgs[0] and "port_xmit_wait is saturated" in msgs[0]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(FIX, root, symlinks=True)
    return root


def port_dir(root: Path, hca: str) -> Path:
    return root / "sys/class/infiniband" / hca / "ports/1"


def test_transmit_wait_follows_rate_changes_and_counter_resets(tree: Path) -> None:
    collector = NetworkCollector(paths(tree))
    mlx5_0 = rd("mlx5_0", "infiniband")
    p = port_dir(tree, "mlx5_0")

    assert flat(collector.collect())[(WAIT, mlx5_0)] == pytest.approx(1.5e9 * 8 / 50e9)

    # The link retrains at 200 Gb/s; the next 1e9 ticks last twice as long each.
    (p / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (p / "counters/port_xmit_wait").write_text("2500000000\n")
    got = flat(collector.collect())
    assert got[(SPEED, mlx5_0)] == 25e9
    assert got[(WAIT, mlx5_0)] == pytest.approx(0.24 + 1e9 * 8 / 25e9)

    # Counter reset (perfquery -R): the new value counts from zero, the total keeps growing.
    (p / "counters/port_xmit_wait").write_text("100000000\n")
    assert flat(collector.collect())[(WAIT, mlx5_0)] == pytest.approx(0.56 + 1e8 * 8 / 25e9)

    # Port goes down: no speed; wait stays at its total (no new ticks).
    (p / "state").write_text("1: DOWN\n")
    got = flat(collector.collect())
    assert (SPEED, mlx5_0) not in got
    assert got[(WAIT, mlx5_0)] == pytest.approx(0.592)

    # A fresh collector (agent restart) converts the whole raw count at the current rate.
    (p / "state").write_text("4: ACTIVE\n")
    fresh = flat(NetworkCollector(paths(tree)).collect())
    assert fresh[(WAIT, mlx5_0)] == pytest.approx(1e8 * 8 / 25e9)


def test_xmit_wait_clock_without_rate_waits_for_one() -> None:
    clock = XmitWaitClock(tick_bytes=8)
    key = ("mlx5_0", "1")
    assert clock.update(key, 1000, None) is None  # cannot convert yet
    assert clock.update(key, 1000, 1000.0) == pytest.approx(8.0)
    assert clock.update(key, 3000, None) == pytest.approx(8.0)  # pending, not lost
    assert clock.update(key, 3000, 2000.0) == pytest.approx(16.0)
    assert clock.update(key, None, 2000.0) is None
    clock.forget_except(set())
    assert clock.update(key, 3000, None) is None
    with pytest.raises(ValueError):
        XmitWaitClock(tick_bytes=0)


def test_tick_bytes_is_a_parameter(tree: Path) -> None:
    got = flat(NetworkCollector(paths(tree), xmit_wait_tick_bytes=128).collect())
    assert got[(WAIT, rd("mlx5_0", "infiniband"))] == pytest.approx(1.5e9 * 128 / 50e9)


def test_missing_proc_net_dev_keeps_rdma_series(tree: Path) -> None:
    (tree / "proc/net/dev").unlink()
    with pytest.raises(PartialCollectionError, match="netdev") as info:
        NetworkCollector(paths(tree)).collect()
    got = flat(info.value.families)
    assert got[(RX, rd("mlx5_0", "infiniband"))] == 1234567890123 * 4
    assert not any(labels == nd("eno1", "ethernet") for _, labels in got)


def test_proc_net_dev_without_header_is_a_clear_error(tree: Path) -> None:
    (tree / "proc/net/dev").write_text("\x00\x01garbage\n")
    with pytest.raises(PartialCollectionError, match="header"):
        NetworkCollector(paths(tree)).collect()


def test_garbage_and_truncated_netdev_lines_lose_only_themselves(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dev = tree / "proc/net/dev"
    lines = dev.read_text().splitlines()
    lines[3] = "  eno1: this is not a counter line"
    dev.write_text("\n".join(lines) + "\n  eno9: 12 3")  # truncated mid-line, no newline
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.network"):
        got = flat(NetworkCollector(paths(tree)).collect())
    assert (RX, nd("eno1", "ethernet")) not in got
    assert got[(RX, nd("ib0", "infiniband"))] == 2234567890123
    text = caplog.text
    assert "line 4" in text and "line 12" in text


def test_bad_counter_files(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    p0 = port_dir(tree, "mlx5_0")
    (p0 / "counters/port_rcv_data").write_text("garbage\n")
    (p0 / "counters/port_xmit_data").write_text("N/A (no PMA)\n")
    (p0 / "rate").write_text("fast\n")
    p1 = port_dir(tree, "mlx5_1")
    (p1 / "counters/port_rcv_data").write_text("4294967295\n")  # saturated 32-bit
    (p1 / "link_layer").unlink()
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.network"):
        got = flat(NetworkCollector(paths(tree)).collect())
    mlx5_0 = rd("mlx5_0", "infiniband")
    assert (RX, mlx5_0) not in got
    assert (TX, mlx5_0) not in got  # no PMA: absent, not zero
    assert (SPEED, mlx5_0) not in got
    assert (WAIT, mlx5_0) not in got  # no rate to convert ticks with
    # mlx5_1 without link_layer cannot be classified: left out entirely.
    assert not any(dict(labels).get("device") == "mlx5_1" for _, labels in got)
    assert got[(RX, rd("mlx4_0", "infiniband"))] == 123456789012345 * 4
    assert "port_rcv_data: invalid literal" in caplog.text
    assert "rate: expected" in caplog.text
    assert "N/A" not in caplog.text  # no PMA is not a problem worth a warning


def test_saturated_32bit_data_counter_without_counters_ext_is_absent(tree: Path) -> None:
    shutil.rmtree(port_dir(tree, "mlx4_0") / "counters_ext")
    got = flat(NetworkCollector(paths(tree)).collect())
    assert (RX, rd("mlx4_0", "infiniband")) not in got
    assert (TX, rd("mlx4_0", "infiniband")) not in got
    assert got[(SPEED, rd("mlx4_0", "infiniband"))] == 7e9


def test_host_without_rdma_is_not_an_error(tree: Path) -> None:
    shutil.rmtree(tree / "sys/class/infiniband")
    got = flat(NetworkCollector(paths(tree)).collect())
    assert {dict(labels)["device"] for _, labels in got} == {
        "eno1",
        "eno2",
        "eno3",
        "ens1f0np0",
        "ib0",
    }


def test_registered_in_the_wiring_table_and_honours_context_paths() -> None:
    spec = wiring.spec("network")
    assert spec.default_enabled
    collector = spec.build(wiring.Wiring(CollectorContext(paths=paths(FIX))))
    assert collector is not None
    assert collector.name == "network"
    assert flat(collector.collect())[(RX, nd("eno1", "ethernet"))] == 918273645501


def test_real_machine_counters_are_sane_and_never_decrease() -> None:
    collector = NetworkCollector(HostPaths())
    first = flat(collector.collect())
    between = psutil.net_io_counters(pernic=True)
    second = flat(collector.collect())
    assert set(first) == set(second)
    # Every interface that a device backs (and that is Ethernet or IPoIB) is exported.
    sysnet = Path("/sys/class/net")
    physical = {
        n.name
        for n in sysnet.iterdir()
        if (n / "device").exists() and (n / "type").read_text().strip() in ("1", "32")
    }
    exported = {dict(labels)["device"] for name, labels in first if "port" not in dict(labels)}
    assert exported == physical
    for (name, labels), value in first.items():
        d = dict(labels)
        assert d["fabric"] in {"ethernet", "infiniband", "roce"}
        assert d["device"] != "lo"
        assert value >= 0
        if name.endswith("_total"):
            assert second[(name, labels)] >= value, (name, labels)
        if name in (RX, TX) and "port" not in d:
            # psutil parses /proc/net/dev on its own: its reading lies between ours.
            seen = between[d["device"]]
            mid = seen.bytes_recv if name == RX else seen.bytes_sent
            assert value <= mid <= second[(name, labels)]


def test_binary_garbage_in_sysfs_and_procfs_files(tree: Path) -> None:
    (port_dir(tree, "mlx5_0") / "counters/port_xmit_data").write_bytes(b"\xff\xfe\x00\x01")
    (tree / "sys/class/net/eno1/speed").write_bytes(b"\xff\xff\n")
    got = flat(NetworkCollector(paths(tree)).collect())
    assert (TX, rd("mlx5_0", "infiniband")) not in got
    assert got[(RX, rd("mlx5_0", "infiniband"))] == 1234567890123 * 4
    assert (SPEED, nd("eno1", "ethernet")) not in got
    assert got[(RX, nd("eno1", "ethernet"))] == 918273645501
    (tree / "proc/net/dev").write_bytes(b"\xff" * 300)
    with pytest.raises(PartialCollectionError, match="netdev"):
        NetworkCollector(paths(tree)).collect()


def test_link_faults_and_congestion_move_between_scrapes(tree: Path) -> None:
    """A port that flaps and a RoCE port under congestion, as the files would show them."""
    collector = NetworkCollector(paths(tree))
    ib, roce = rd("mlx5_0", "infiniband"), rd("mlx5_1", "roce")
    eno1 = nd("eno1", "ethernet")
    first = flat(collector.collect())
    p0, p1 = port_dir(tree, "mlx5_0"), port_dir(tree, "mlx5_1")
    (p0 / "counters/link_downed").write_text("4\n")
    (p0 / "counters/symbol_error").write_text("1027\n")
    (p0 / "state").write_text("2: INIT\n")  # retraining after the last flap
    (p0 / "phys_state").write_text("4: PortConfigurationTraining\n")
    (p1 / "hw_counters/np_ecn_marked_roce_packets").write_text("903400\n")
    (p1 / "hw_counters/rp_cnp_handled").write_text("501100\n")
    (tree / "sys/class/net/eno1/carrier").write_text("0\n")
    (tree / "sys/class/net/eno1/carrier_changes").write_text("10\n")
    second = flat(collector.collect())
    assert second[(ERR, cn(ib, "link_downed"))] - first[(ERR, cn(ib, "link_downed"))] == 3
    assert second[(ERR, cn(ib, "symbol_error"))] - first[(ERR, cn(ib, "symbol_error"))] == 1000
    assert (first[(UP, ib)], second[(UP, ib)]) == (1.0, 0.0)
    assert (SPEED, ib) not in second  # not ACTIVE: no speed
    ecn = cn(roce, "np_ecn_marked_roce_packets")
    assert second[(CONG, ecn)] - first[(CONG, ecn)] == 900000
    assert (first[(UP, eno1)], second[(UP, eno1)]) == (1.0, 0.0)
    assert second[(ERR, cn(eno1, "carrier_changes"))] == 10


def test_absent_and_unanswered_fault_counters_are_left_out(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p0 = port_dir(tree, "mlx5_0")
    (p0 / "counters/symbol_error").write_text("N/A (no PMA)\n")  # absent, not zero
    (p0 / "counters/link_downed").write_text("255\n")  # saturated 8-bit field
    (p0 / "counters/port_rcv_errors").write_text("lots\n")
    (p0 / "hw_counters/out_of_sequence").unlink()
    (tree / "sys/class/net/eno1/statistics/rx_crc_errors").unlink()
    with caplog.at_level(logging.WARNING, logger="gpufeed.collectors.network"):
        got = flat(NetworkCollector(paths(tree)).collect())
    ib = rd("mlx5_0", "infiniband")
    for name in ("symbol_error", "link_downed", "port_rcv_errors", "out_of_sequence"):
        assert (ERR, cn(ib, name)) not in got, name
    assert got[(ERR, cn(ib, "link_error_recovery"))] == 2  # the rest of the port stays
    assert (ERR, cn(nd("eno1", "ethernet"), "rx_crc_errors")) not in got
    assert got[(ERR, cn(nd("eno1", "ethernet"), "rx_errors"))] == 3
    assert "counters/link_downed is saturated at 2^8-1" in caplog.text
    assert "port_rcv_errors: invalid literal" in caplog.text
