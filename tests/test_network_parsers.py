"""Table-driven tests of the network parsers, on the checked-in fixture tree."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufeed.hostpaths import HostPaths
from gpufeed.procfs.netdev import NetDevCounters, parse_netdev
from gpufeed.sysfs.infiniband import (
    parse_counter,
    parse_link_layer,
    parse_rate,
    parse_state,
    read_rdma_ports,
)
from gpufeed.sysfs.netclass import (
    parse_carrier,
    parse_net_counter,
    parse_net_speed,
    parse_net_type,
    parse_operstate_down,
    read_net_interface,
)

FIX = Path(__file__).parent / "fixtures" / "network"
PATHS = HostPaths(procfs=FIX / "proc", sysfs=FIX / "sys", rootfs=FIX)


@pytest.mark.parametrize(
    ("interface", "rx", "tx"),
    [
        ("lo", 8801234567, 8801234567),
        ("eno1", 918273645501, 401928374655),
        ("eno2", 0, 0),
        ("eno3", 73400320, 10485760),
        ("ens1f0np0", 51234567890, 48765432109),
        ("ib0", 2234567890123, 1987654321098),
        ("veth3f2a1b0", 123456789, 987654321),
        ("docker0", 1234567, 7654321),
        ("tailscale0", 55555, 66666),
    ],
)
def test_parse_netdev_fixture(interface: str, rx: int, tx: int) -> None:
    parsed = parse_netdev((FIX / "proc/net/dev").read_text())
    assert parsed.bad_lines == ()
    by_name = {c.interface: c for c in parsed.interfaces}
    assert len(by_name) == 9
    assert by_name[interface] == NetDevCounters(interface, rx, tx)


HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
    "drop fifo colls carrier compressed\n"
)
GOOD = "  eth0: 100 1 0 0 0 0 0 0 200 2 0 0 0 0 0 0\n"


@pytest.mark.parametrize(
    ("body", "good", "bad_fragment"),
    [
        (GOOD + "  eth1: 100 1 0 0 0 0 0 0 2", ["eth0"], "16 counters"),  # truncated line
        (GOOD + "garbage without colon\n", ["eth0"], "16 counters"),
        (GOOD + "  eth1: 1 x 0 0 0 0 0 0 2 2 0 0 0 0 0 0\n", ["eth0"], None),  # only rx/tx read
        (GOOD + "  eth1: ab 1 0 0 0 0 0 0 2 2 0 0 0 0 0 0\n", ["eth0"], "not integers"),
        (GOOD + "  eth1: -5 1 0 0 0 0 0 0 2 2 0 0 0 0 0 0\n", ["eth0"], "negative"),
        (GOOD + "\n\n", ["eth0"], None),
        ("", [], None),
    ],
)
def test_parse_netdev_bad_lines_are_reported_not_guessed(
    body: str, good: list[str], bad_fragment: str | None
) -> None:
    parsed = parse_netdev(HEADER + body)
    assert [c.interface for c in parsed.interfaces] == good + (
        ["eth1"] if bad_fragment is None and "eth1" in body else []
    )
    if bad_fragment is None:
        assert parsed.bad_lines == ()
    else:
        assert len(parsed.bad_lines) == 1
        assert bad_fragment in parsed.bad_lines[0]
        assert parsed.bad_lines[0].startswith("line 4:")


@pytest.mark.parametrize("text", ["", "eth0: 1 2 3\n", "just one line|\n"])
def test_parse_netdev_rejects_a_file_without_its_header(text: str) -> None:
    with pytest.raises(ValueError, match="header"):
        parse_netdev(text)


@pytest.mark.parametrize(
    ("text", "bytes_per_second"),
    [
        ("400 Gb/sec (4X NDR)\n", 50e9),
        ("200 Gb/sec (4X HDR)\n", 25e9),
        ("100 Gb/sec (4X EDR)\n", 12.5e9),
        ("56 Gb/sec (4X FDR)\n", 7e9),
        ("2.5 Gb/sec (1X SDR)\n", 312.5e6),
        ("0 Gb/sec (1X SDR)\n", None),
    ],
)
def test_parse_rate(text: str, bytes_per_second: float | None) -> None:
    assert parse_rate(text) == bytes_per_second


@pytest.mark.parametrize("text", ["", "fast\n", "400 Mb/sec\n", "Gb/sec 400\n"])
def test_parse_rate_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE\n", (4, "ACTIVE")),
        ("1: DOWN\n", (1, "DOWN")),
        ("1: CA\n", (1, "CA")),
        ("5: LinkUp\n", (5, "LinkUp")),
        ("7: Phy Test\n", (7, "Phy Test")),  # phys_state names may hold a space
    ],
)
def test_parse_state(text: str, expected: tuple[int, str]) -> None:
    assert parse_state(text) == expected


@pytest.mark.parametrize("text", ["", "ACTIVE\n", "4 ACTIVE\n", "x: ACTIVE\n"])
def test_parse_state_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_state(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0\n", 0), ("1234567890123\n", 1234567890123), ("N/A (no PMA)\n", None)],
)
def test_parse_counter(text: str, expected: int | None) -> None:
    assert parse_counter(text) == expected


@pytest.mark.parametrize("text", ["", "abc\n", "-1\n", "1.5\n"])
def test_parse_counter_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_counter(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("InfiniBand\n", "InfiniBand"), ("Ethernet\n", "Ethernet")]
)
def test_parse_link_layer(text: str, expected: str) -> None:
    assert parse_link_layer(text) == expected


@pytest.mark.parametrize("text", ["", "\n", "Infini Band\n", "x" * 40])
def test_parse_link_layer_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_link_layer(text)


@pytest.mark.parametrize(
    ("text", "bytes_per_second"),
    [
        ("25000\n", 3.125e9),
        ("400000\n", 50e9),
        ("10\n", 1.25e6),
        ("-1\n", None),
        ("0\n", None),
        ("65535\n", None),
        ("4294967295\n", None),
    ],
)
def test_parse_net_speed(text: str, bytes_per_second: float | None) -> None:
    assert parse_net_speed(text) == bytes_per_second


@pytest.mark.parametrize(("text", "expected"), [("1\n", 1), ("32\n", 32), ("772\n", 772)])
def test_parse_net_type(text: str, expected: int) -> None:
    assert parse_net_type(text) == expected


@pytest.mark.parametrize("text", ["", "ether\n", "-1\n"])
def test_parse_net_type_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_net_type(text)


@pytest.mark.parametrize(
    ("name", "arphrd", "has_device", "speed"),
    [
        ("lo", 772, False, None),
        ("eno1", 1, True, 3.125e9),
        ("eno2", 1, True, None),  # no speed file (EINVAL on a real down link)
        ("eno3", 1, True, None),  # speed -1
        ("ens1f0np0", 1, True, 25e9),
        ("ib0", 32, True, 50e9),
        ("veth3f2a1b0", 1, False, 1.25e9),
        ("docker0", 1, False, None),
    ],
)
def test_read_net_interface_fixture(
    name: str, arphrd: int, has_device: bool, speed: float | None
) -> None:
    iface = read_net_interface(PATHS, name)
    assert iface is not None
    assert (iface.arphrd_type, iface.has_device, iface.speed_bytes_per_second) == (
        arphrd,
        has_device,
        speed,
    )


@pytest.mark.parametrize("name", ["tailscale0", "../../etc", "a/b", "", ".", "x" * 16])
def test_read_net_interface_unknown_or_unsafe_names(name: str) -> None:
    assert read_net_interface(PATHS, name) is None


def test_read_net_interface_real_loopback_speed_is_einval() -> None:
    # The real kernel answers EINVAL when reading lo's speed: that must read as "unknown".
    with pytest.raises(OSError):
        Path("/sys/class/net/lo/speed").read_text()
    iface = read_net_interface(HostPaths(), "lo")
    assert iface is not None
    assert iface.arphrd_type == 772
    assert iface.speed_bytes_per_second is None


@pytest.mark.parametrize(
    ("device", "node_type", "link_layer", "state", "rate", "rx", "tx", "wait", "problem"),
    [
        ("irdma0", "RNIC", "Ethernet", "ACTIVE", 12.5e9, None, None, None, None),
        (
            "mlx4_0",
            "CA",
            "InfiniBand",
            "ACTIVE",
            7e9,
            123456789012345 * 4,
            23456789012345 * 4,
            None,
            "port_xmit_wait is saturated",
        ),
        (
            "mlx5_0",
            "CA",
            "InfiniBand",
            "ACTIVE",
            50e9,
            1234567890123 * 4,
            987654321012 * 4,
            1500000000,
            None,
        ),
        ("mlx5_1", "CA", "Ethernet", "ACTIVE", 25e9, 5000000000 * 4, 6000000000 * 4, 0, None),
        ("mlx5_2", "CA", "InfiniBand", "DOWN", 1.25e9, 0, 0, 0, None),
    ],
)
def test_read_rdma_ports_fixture(
    device: str,
    node_type: str,
    link_layer: str,
    state: str,
    rate: float,
    rx: int | None,
    tx: int | None,
    wait: int | None,
    problem: str | None,
) -> None:
    ports = {p.device: p for p in read_rdma_ports(PATHS)}
    assert sorted(ports) == ["irdma0", "mlx4_0", "mlx5_0", "mlx5_1", "mlx5_2"]
    p = ports[device]
    assert p.port == "1"
    assert (p.node_type, p.link_layer, p.state, p.rate_bytes_per_second) == (
        node_type,
        link_layer,
        state,
        rate,
    )
    assert (p.receive_bytes, p.transmit_bytes, p.transmit_wait_ticks) == (rx, tx, wait)
    if problem is None:
        assert p.problems == ()
    else:
        assert len(p.problems) == 1 and problem in p.problems[0]


def test_read_rdma_ports_without_infiniband_class_is_empty(tmp_path: Path) -> None:
    assert read_rdma_ports(HostPaths(sysfs=tmp_path)) == []


@pytest.mark.parametrize(
    ("device", "phys_state", "errors", "congestion"),
    [
        ("irdma0", "LinkUp", {}, {}),  # iWARP: no PMA counters, other hw_counters names
        ("mlx5_2", "Disabled", {"link_downed": 0, "local_ack_timeout_err": 3}, {}),
        (
            "mlx5_0",
            "LinkUp",
            {"symbol_error": 27, "link_error_recovery": 2, "link_downed": 1, "port_rcv_errors": 5},
            {"port_xmit_discards": 12},
        ),
        (
            "mlx5_1",
            "LinkUp",
            {"out_of_sequence": 17},
            {"np_ecn_marked_roce_packets": 3400, "np_cnp_sent": 1200, "rp_cnp_handled": 1100},
        ),
    ],
)
def test_read_rdma_ports_fault_and_congestion_counters(
    device: str, phys_state: str, errors: dict[str, int], congestion: dict[str, int]
) -> None:
    p = {p.device: p for p in read_rdma_ports(PATHS)}[device]
    assert p.phys_state == phys_state
    got_errors, got_congestion = dict(p.errors), dict(p.congestion)
    for name, value in errors.items():
        assert got_errors[name] == value
    for name, value in congestion.items():
        assert got_congestion[name] == value
    if device == "irdma0":
        assert p.errors == () and p.congestion == ()
    # mlx5_0 is an InfiniBand port: no RoCE congestion counters in its hw_counters
    if device == "mlx5_0":
        assert set(got_congestion) == {"port_xmit_discards"}
    assert "lifespan" not in got_errors  # a hw_counters setting, not a counter


@pytest.mark.parametrize(
    ("name", "value", "saturated"),
    [
        ("link_downed", "254", False),
        ("link_downed", "255", True),  # 8-bit PMA field
        ("local_link_integrity_errors", "15", True),  # 4-bit
        ("symbol_error", "65534", False),
        ("symbol_error", "65535", True),  # 16-bit
    ],
)
def test_saturated_pma_error_counters_are_left_out(
    tmp_path: Path, name: str, value: str, saturated: bool
) -> None:
    shutil.copytree(FIX / "sys", tmp_path / "sys", symlinks=True)
    (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters" / name).write_text(value + "\n")
    p = {p.device: p for p in read_rdma_ports(HostPaths(sysfs=tmp_path / "sys"))}["mlx5_0"]
    assert (name in dict(p.errors)) is not saturated
    assert any(f"counters/{name} is saturated" in m for m in p.problems) is saturated


@pytest.mark.parametrize(("text", "up"), [("1\n", True), ("0\n", False)])
def test_parse_carrier(text: str, up: bool) -> None:
    assert parse_carrier(text) is up


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_carrier, ""),
        (parse_carrier, "2\n"),
        (parse_carrier, "up\n"),
        (parse_net_counter, ""),
        (parse_net_counter, "x\n"),
        (parse_net_counter, "-3\n"),
    ],
)
def test_netclass_parsers_reject_garbage(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)


@pytest.mark.parametrize(
    ("text", "down"),
    [
        ("up\n", False),
        ("down\n", True),
        ("lowerlayerdown\n", True),
        ("notpresent\n", True),
        ("unknown\n", None),  # loopback, tun: the state says nothing
        ("dormant\n", None),
    ],
)
def test_parse_operstate_down(text: str, down: bool | None) -> None:
    assert parse_operstate_down(text) is down


@pytest.mark.parametrize(
    ("name", "link_up", "errors"),
    [
        ("eno1", True, {"carrier_changes": 4, "rx_errors": 3, "tx_errors": 0, "rx_crc_errors": 2}),
        ("eno2", False, {"carrier_changes": 7}),  # administratively down: no carrier file
        ("eno3", False, {"carrier_changes": 9, "rx_errors": 0, "tx_errors": 0, "rx_crc_errors": 0}),
        ("ib0", True, {"carrier_changes": 2, "rx_errors": 0, "tx_errors": 1}),  # no CRC file
        ("lo", None, {}),  # operstate unknown, no carrier file in the fixture
    ],
)
def test_read_net_interface_link_state_and_errors(
    name: str, link_up: bool | None, errors: dict[str, int]
) -> None:
    iface = read_net_interface(PATHS, name)
    assert iface is not None
    assert iface.link_up is link_up
    assert dict(iface.errors) == errors


def test_read_net_interface_real_loopback_counters() -> None:
    # The real kernel's files, in the shapes the parsers expect: lo has carrier_changes and
    # statistics/ like any interface.
    iface = read_net_interface(HostPaths(), "lo")
    assert iface is not None
    assert iface.link_up is True
    assert {"carrier_changes", "rx_errors", "tx_errors", "rx_crc_errors"} == set(dict(iface.errors))
