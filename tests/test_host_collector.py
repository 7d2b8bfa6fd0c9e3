"""The host collector on three kernels' /proc, on broken copies, and on this machine."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psutil
import pytest

from gpufeed.agent import wiring
from gpufeed.collectors.base import CollectorContext, PartialCollectionError
from gpufeed.collectors.host import HostCollector, user_hz
from gpufeed.hostpaths import HostPaths
from gpufeed.model import Family

FIX = Path(__file__).parent / "fixtures" / "host"

CPU = "gpufeed_host_cpu_seconds_total"
CPUS = "gpufeed_host_cpus"
WAITING = "gpufeed_host_pressure_waiting_seconds_total"
STALLED = "gpufeed_host_pressure_stalled_seconds_total"
MEM = "gpufeed_host_memory_available_bytes"

Key = tuple[str, tuple[tuple[str, str], ...]]


def flat(families: list[Family]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for fam in families:
        for s in fam.samples:
            assert (s.name, s.labels) not in out
            out[(s.name, s.labels)] = s.value
    return out


def collector(root: Path) -> HostCollector:
    # USER_HZ is 100 on every mainstream architecture; fixed here so the test is too.
    return HostCollector(HostPaths(procfs=root / "proc", rootfs=root), ticks_per_second=100)


def mode(m: str) -> Key:
    return (CPU, (("mode", m),))


def res(name: str, r: str) -> Key:
    return (name, (("resource", r),))


MODERN: dict[Key, float] = {
    mode("user"): 10112.34,
    mode("nice"): 23.45,
    mode("system"): 4567.89,
    mode("idle"): 987654.32,
    mode("iowait"): 123.45,
    mode("irq"): 0.0,
    mode("softirq"): 345.67,
    mode("steal"): 8.90,
    (CPUS, ()): 4,
    res(WAITING, "cpu"): 123.456789,
    res(WAITING, "io"): 98.765432,
    res(WAITING, "memory"): 4.56789,
    # No cpu "full" although the file has one: the contract exports full for io and memory.
    res(STALLED, "io"): 87.654321,
    res(STALLED, "memory"): 3.456789,
    (MEM, ()): 251234568 * 1024,
}


def test_modern_kernel_gives_exactly_the_expected_series() -> None:
    families = collector(FIX / "modern").collect()
    assert [(f.name, f.type) for f in families] == [
        (CPU, "counter"),
        (CPUS, "gauge"),
        (WAITING, "counter"),
        (STALLED, "counter"),
        (MEM, "gauge"),
    ]
    got = flat(families)
    assert set(got) == set(MODERN)
    assert got == pytest.approx(MODERN)


def test_kernel_5_4_psi_without_cpu_full() -> None:
    got = flat(collector(FIX / "kernel-5.4").collect())
    assert got[(CPUS, ())] == 2
    assert {k for k in got if k[0] in (WAITING, STALLED)} == {
        res(WAITING, "cpu"),
        res(WAITING, "io"),
        res(WAITING, "memory"),
        res(STALLED, "io"),
        res(STALLED, "memory"),
    }
    assert got[(MEM, ())] == 7319856 * 1024


def test_kernel_without_psi_or_memavailable_leaves_them_absent() -> None:
    families = collector(FIX / "kernel-2.6.32").collect()  # no exception: absent is not failed
    got = flat(families)
    assert set(got) == {mode(m) for m in ("user", "nice", "system", "idle")} | {
        mode(m) for m in ("iowait", "irq", "softirq", "steal")
    } | {(CPUS, ())}
    assert got[mode("user")] == pytest.approx(798.74)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(FIX / "modern", root)
    return root


def test_missing_proc_stat_keeps_the_rest(tree: Path) -> None:
    (tree / "proc/stat").unlink()
    with pytest.raises(PartialCollectionError, match="stat") as info:
        collector(tree).collect()
    got = flat(info.value.families)
    assert mode("user") not in got and (CPUS, ()) not in got
    assert got[(MEM, ())] == 251234568 * 1024
    assert got[res(STALLED, "io")] == pytest.approx(87.654321)


def test_truncated_proc_stat_is_a_clear_error(tree: Path) -> None:
    (tree / "proc/stat").write_text("cpu  1011234 2345 45")
    with pytest.raises(PartialCollectionError, match=r"proc/stat: line 1: the cpu line has 3"):
        collector(tree).collect()


def test_garbage_psi_file_loses_only_that_resource(tree: Path) -> None:
    (tree / "proc/pressure/io").write_text("some avg10=0.00 total=lots\n")
    with pytest.raises(PartialCollectionError, match=r"pressure/io: line 1") as info:
        collector(tree).collect()
    got = flat(info.value.families)
    assert res(WAITING, "io") not in got and res(STALLED, "io") not in got
    assert got[res(WAITING, "cpu")] == pytest.approx(123.456789)
    assert got[res(STALLED, "memory")] == pytest.approx(3.456789)
    assert got[mode("idle")] == pytest.approx(987654.32)


def test_psi_directory_gone_is_not_an_error(tree: Path) -> None:
    shutil.rmtree(tree / "proc/pressure")
    got = flat(collector(tree).collect())
    assert not any(k[0] in (WAITING, STALLED) for k in got)
    assert got[(CPUS, ())] == 4


def test_unreadable_psi_file_is_an_error(tree: Path) -> None:
    # A directory where the file should be: EISDIR, not "no PSI".
    (tree / "proc/pressure/memory").unlink()
    (tree / "proc/pressure/memory").mkdir()
    with pytest.raises(PartialCollectionError, match="pressure/memory"):
        collector(tree).collect()


def test_meminfo_garbage_line_is_skipped_with_a_warning(
    tree: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mi = tree / "proc/meminfo"
    mi.write_text("\x00\x00 broken\n" + mi.read_text())
    got = flat(collector(tree).collect())
    assert got[(MEM, ())] == 251234568 * 1024
    assert "meminfo: line 1" in caplog.text


def test_empty_root_fails_every_source(tmp_path: Path) -> None:
    with pytest.raises(PartialCollectionError) as info:
        collector(tmp_path).collect()
    msg = str(info.value)
    assert "stat:" in msg and "meminfo:" in msg and "pressure" not in msg
    assert flat(info.value.families) == {}


def test_registered_in_the_wiring_table_and_honours_context_paths() -> None:
    spec = wiring.spec("host")
    assert spec.default_enabled
    c = spec.build(wiring.Wiring(CollectorContext(paths=HostPaths(procfs=FIX / "modern/proc"))))
    assert c is not None
    assert c.name == "host"
    got = flat(c.collect())
    assert got[(CPUS, ())] == 4
    assert got[mode("user")] == pytest.approx(1011234 / user_hz())


def test_real_machine_values_are_sane_and_counters_never_decrease() -> None:
    c = HostCollector()
    first = flat(c.collect())
    time.sleep(0.05)
    second = flat(c.collect())
    assert set(first) == set(second)
    cpus = first[(CPUS, ())]
    assert cpus == os.cpu_count()
    assert {k for k in first if k[0] == CPU} == {mode(m) for m in MODERN_MODES}
    for key, value in first.items():
        assert value >= 0, key
        if key[0].endswith("_total"):
            assert second[key] >= value, key
    # CPU seconds summed over all modes, per CPU, are roughly the uptime: a units check
    # (a wrong USER_HZ would be off by a factor of 10 or more).
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    busy_and_idle = sum(v for k, v in first.items() if k[0] == CPU) / cpus
    assert 0.5 * uptime < busy_and_idle < 1.5 * uptime
    available_bytes = psutil.virtual_memory().available
    assert abs(first[(MEM, ())] - available_bytes) < 0.2 * available_bytes
    if Path("/proc/pressure/io").exists():
        assert res(WAITING, "io") in first and res(STALLED, "memory") in first


MODERN_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def test_binary_garbage_in_one_psi_file(tree: Path) -> None:
    (tree / "proc/pressure/cpu").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PartialCollectionError, match="pressure/cpu") as info:
        collector(tree).collect()
    got = flat(info.value.families)
    assert res(WAITING, "cpu") not in got
    assert got[res(WAITING, "io")] == pytest.approx(98.765432)


def test_cpu_seconds_that_step_back_are_held_not_exported_lower(tree: Path) -> None:
    c = collector(tree)
    first = flat(c.collect())
    stat = tree / "proc" / "stat"
    text = stat.read_text()
    # iowait 12345 -> 12340 ticks and idle 98765432 -> 98765430: the kernel stepped back.
    stat.write_text(
        text.replace(
            "cpu  1011234 2345 456789 98765432 12345", "cpu  1011300 2345 456789 98765430 12340", 1
        )
    )
    second = flat(c.collect())
    assert second[mode("iowait")] == first[mode("iowait")] == 123.45
    assert second[mode("idle")] == first[mode("idle")] == 987654.32
    assert second[mode("user")] == 10113.0  # the modes that moved on are read as they are
    # Once the kernel's count passes the held value, it is exported as read again.
    stat.write_text(
        text.replace(
            "cpu  1011234 2345 456789 98765432 12345", "cpu  1011300 2345 456789 98765500 12350", 1
        )
    )
    third = flat(c.collect())
    assert third[mode("iowait")] == 123.50 and third[mode("idle")] == 987655.00
