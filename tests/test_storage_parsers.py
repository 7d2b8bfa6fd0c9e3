"""Table-driven tests of the storage parsers on checked-in fixture files."""

from __future__ import annotations

import pytest

from gpufeed.procfs.diskstats import parse_diskstats
from gpufeed.procfs.escape import unescape_octal
from gpufeed.procfs.mountinfo import parse_mountinfo
from gpufeed.procfs.mountstats import parse_mountstats
from storage_helpers import NODE1, PARSERS

# (file, (major, minor), name, reads, read bytes, read s, writes, written bytes, write s,
#  io s, weighted io s): expected values worked out by hand from the fixture lines.
DISKSTATS_CASES = [
    ("diskstats-4.14.txt", (8, 0), "sda", 224910, 9837514 * 512, 157.380, 102331,
     4712312 * 512, 983.110, 183.220, 1140.490),
    ("diskstats-4.14.txt", (253, 0), "dm-0", 226002, 9819011 * 512, 171.002, 190621,
     4712304 * 512, 2110.330, 185.002, 2281.332),
    ("diskstats-4.18.txt", (259, 1), "nvme0n1p1", 1120001, 88110200 * 512, 401.100, 2201100,
     160220000 * 512, 2210.300, 891.100, 2611.400),
    ("diskstats-5.5.txt", (259, 4), "nvme1n1", 210033441, 52231004416 * 512, 61022.113,
     88011200, 34002113280 * 512, 45011.233, 20033.001, 106033.346),
    ("diskstats-5.5.txt", (9, 0), "md0", 11019413, 5801105712 * 512, 0.0, 3202310,
     980123456 * 512, 0.0, 0.0, 0.0),
    ("../node1/proc/diskstats", (253, 0), "dm-0", 32400331, 5120098304 * 512, 8001.422,
     22233109, 4611223120 * 512, 41009.221, 4101.230, 49010.643),
    ("../node1/proc/diskstats", (259, 2), "nvme0n1p2", 32011222, 5120112328 * 512, 7012.221,
     15022109, 4611223120 * 512, 24011.021, 4023.001, 31023.242),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fname", "dev", "name", "reads", "rbytes", "rtime", "writes", "wbytes", "wtime", "io", "wio"),
    DISKSTATS_CASES,
)
def test_diskstats_variants(
    fname: str,
    dev: tuple[int, int],
    name: str,
    reads: int,
    rbytes: int,
    rtime: float,
    writes: int,
    wbytes: int,
    wtime: float,
    io: float,
    wio: float,
) -> None:
    table = parse_diskstats((PARSERS / fname).read_text())
    assert table.bad_lines == ()
    s = table.by_dev[dev]
    assert s.name == name
    assert (s.reads_completed, s.read_bytes, s.writes_completed, s.written_bytes) == (
        reads,
        rbytes,
        writes,
        wbytes,
    )
    assert s.read_time_seconds == pytest.approx(rtime)
    assert s.write_time_seconds == pytest.approx(wtime)
    assert s.io_time_seconds == pytest.approx(io)
    assert s.io_time_weighted_seconds == pytest.approx(wio)


@pytest.mark.parametrize(
    ("fname", "devices"),
    [
        ("diskstats-4.14.txt", {(8, 0), (8, 1), (253, 0)}),
        ("diskstats-4.18.txt", {(259, 0), (259, 1)}),
        ("diskstats-5.5.txt", {(9, 0), (259, 4)}),
        ("../node1/proc/diskstats", {(7, 0), (8, 0), (8, 16), (9, 0), (253, 0)}
         | {(259, i) for i in range(5)}),
    ],
)  # fmt: skip
def test_diskstats_reads_every_line(fname: str, devices: set[tuple[int, int]]) -> None:
    assert set(parse_diskstats((PARSERS / fname).read_text()).by_dev) == devices


def test_diskstats_garbage_lines_are_skipped_and_numbered() -> None:
    table = parse_diskstats((PARSERS / "diskstats-garbage.txt").read_text())
    assert set(table.by_dev) == {(8, 0), (7, 0)}
    assert table.bad_lines == (2, 3, 4, 6)
    assert table.by_dev[(7, 0)].read_bytes == 80 * 512


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/mnt/plain", "/mnt/plain"),
        (r"/mnt/with\040space", "/mnt/with space"),
        (r"/a\011b\012c", "/a\tb\nc"),
        (r"/back\134slash", "/back\\slash"),
        (r"/not\08escape", r"/not\08escape"),
    ],
)
def test_unescape_octal(raw: str, expected: str) -> None:
    assert unescape_octal(raw) == expected


# mountpoint -> (major, minor, root, fstype, source)
MOUNTINFO_NODE1 = {
    "/": (0, 33, "/@", "btrfs", "/dev/nvme0n1p3"),
    "/home": (0, 33, "/@home", "btrfs", "/dev/nvme0n1p3"),
    "/boot/efi": (259, 1, "/", "vfat", "/dev/nvme0n1p1"),
    "/mnt/scratch": (253, 0, "/", "ext4", "/dev/mapper/vg0-scratch"),
    "/mnt/fast scratch": (259, 4, "/", "xfs", "/dev/nvme1n1"),
    "/mnt/raid": (9, 0, "/", "xfs", "/dev/md0"),
    "/var/cache/scratch": (253, 0, "/cache", "ext4", "/dev/mapper/vg0-scratch"),
    "/mnt/datasets": (0, 52, "/", "nfs4", "10.0.0.5:/export/datasets"),
    "/srv/imagenet": (0, 52, "/imagenet", "nfs4", "10.0.0.5:/export/datasets"),
    "/dev/shm": (0, 24, "/", "tmpfs", "tmpfs"),
    "/var/lib/docker/overlay2/3f1c0d2b9a8e/merged": (0, 60, "/", "overlay", "overlay"),
}


@pytest.mark.parametrize(("mountpoint", "expected"), sorted(MOUNTINFO_NODE1.items()))
def test_mountinfo_node1(mountpoint: str, expected: tuple[int, int, str, str, str]) -> None:
    table = parse_mountinfo((NODE1 / "proc" / "self" / "mountinfo").read_text())
    assert table.bad_lines == ()
    assert len(table.mounts) == 22
    (m,) = [m for m in table.mounts if m.mountpoint == mountpoint]
    assert (m.major, m.minor, m.root, m.fstype, m.source) == expected


def test_mountinfo_garbage_lines_are_skipped() -> None:
    table = parse_mountinfo((PARSERS / "mountinfo-garbage.txt").read_text())
    assert [m.mountpoint for m in table.mounts] == ["/", "/mnt/with space\ttab"]
    assert table.bad_lines == (2, 3, 4, 5, 7)
    opt = table.mounts[1]
    assert (opt.major, opt.minor, opt.fstype, opt.source, opt.super_options) == (
        7,
        1,
        "ext4",
        "/dev/loop1",
        "rw",
    )


# mountpoint -> (server read, server written, normal read, READ ops, READ rtt s, READ exe s,
#                READ errors, WRITE ops, WRITE exe s)
MOUNTSTATS_NODE1 = {
    "/mnt/datasets": (962881212416, 25117812, 963641233612, 917412, 3528.163, 3540.012, 0,
                      613, 8.836),
    "/mnt/archive": (2151677952, 1073741824, 2147483648, 2052, 101.233, 101.402, None,
                     1024, 211.398),
    "/srv/imagenet": (962881212416, 25117812, 963641233612, 917412, 3528.163, 3540.012, 0,
                      613, 8.836),
}  # fmt: skip


@pytest.mark.parametrize(("mountpoint", "expected"), sorted(MOUNTSTATS_NODE1.items()))
def test_mountstats_node1(mountpoint: str, expected: tuple[object, ...]) -> None:
    table = parse_mountstats((NODE1 / "proc" / "self" / "mountstats").read_text())
    assert table.bad_lines == ()
    nfs = table.by_mountpoint()
    assert set(nfs) == set(MOUNTSTATS_NODE1)  # ext4, tmpfs, overlay... are not NFS
    m = nfs[mountpoint]
    assert m.bytes is not None
    read, write = m.ops["READ"], m.ops["WRITE"]
    got = (
        m.bytes.server_read_bytes,
        m.bytes.server_written_bytes,
        m.bytes.normal_read_bytes,
        read.ops,
        read.rtt_seconds,
        read.execute_seconds,
        read.errors,
        write.ops,
        write.execute_seconds,
    )
    assert got == pytest.approx(expected) if None not in expected else got == expected


def test_mountstats_nfs4_reads_every_op_and_version() -> None:
    nfs = parse_mountstats((NODE1 / "proc" / "self" / "mountstats").read_text()).by_mountpoint()
    d = nfs["/mnt/datasets"]
    assert (d.fstype, d.statvers, d.source) == ("nfs4", "1.1", "10.0.0.5:/export/datasets")
    assert len(d.ops) == 30
    assert d.ops["READ"].transmissions == 917419
    assert d.ops["READ"].major_timeouts == 1
    assert d.ops["LOOKUP"].errors == 12
    a = nfs["/mnt/archive"]
    assert (a.fstype, a.statvers) == ("nfs", "1.0")
    assert a.ops["WRITE"].transmissions == 1031


def test_mountstats_op_filter_parses_only_the_ops_asked_for() -> None:
    text = (NODE1 / "proc" / "self" / "mountstats").read_text()
    nfs = parse_mountstats(text, ops={"READ", "WRITE"}).by_mountpoint()
    assert {mp: sorted(m.ops) for mp, m in nfs.items()} == {
        mp: ["READ", "WRITE"] for mp in MOUNTSTATS_NODE1
    }
    assert nfs["/mnt/datasets"].ops == {
        k: v
        for k, v in parse_mountstats(text).by_mountpoint()["/mnt/datasets"].ops.items()
        if k in ("READ", "WRITE")
    }


def test_mountstats_garbage_lines_are_skipped() -> None:
    table = parse_mountstats((PARSERS / "mountstats-garbage.txt").read_text())
    assert table.bad_lines == (5, 6, 7, 10)
    nfs = table.by_mountpoint()
    assert set(nfs) == {"/mnt/a", "/mnt/b"}
    a, b = nfs["/mnt/a"], nfs["/mnt/b"]
    assert a.bytes is not None and a.bytes.server_read_bytes == 90
    assert set(a.ops) == {"READ"}
    assert b.bytes is None
    assert b.ops["WRITE"].execute_seconds == pytest.approx(0.009)
    assert b.ops["WRITE"].errors is None
