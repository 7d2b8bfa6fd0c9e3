"""Table-driven tests of the /proc/stat, PSI and meminfo parsers on three kernels' files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.procfs.meminfo import parse_meminfo
from gpufeed.procfs.pressure import Pressure, parse_pressure
from gpufeed.procfs.stat import CPU_MODES, parse_stat

FIX = Path(__file__).parent / "fixtures" / "host"


@pytest.mark.parametrize(
    ("tree", "seconds", "cpus"),
    [
        (
            "modern",
            {
                "user": 10112.34,
                "nice": 23.45,
                "system": 4567.89,
                "idle": 987654.32,
                "iowait": 123.45,
                "irq": 0.0,
                "softirq": 345.67,
                "steal": 8.90,
            },
            4,
        ),
        (
            "kernel-5.4",
            {
                "user": 47.05,
                "nice": 3.56,
                "system": 5.84,
                "idle": 36991.76,
                "iowait": 11.50,
                "irq": 0.0,
                "softirq": 0.41,
                "steal": 0.0,
            },
            2,
        ),
        (
            "kernel-2.6.32",
            {
                "user": 798.74,
                "nice": 12.34,
                "system": 243.17,
                "idle": 89367.01,
                "iowait": 54.37,
                "irq": 0.11,
                "softirq": 9.87,
                "steal": 0.0,
            },
            2,
        ),
    ],
)
def test_parse_stat_fixtures(tree: str, seconds: dict[str, float], cpus: int) -> None:
    stat = parse_stat((FIX / tree / "proc/stat").read_text(), 100)
    # guest (45678 ticks in `modern`) is inside user already: it is no mode of its own.
    assert list(stat.cpu_seconds) == list(CPU_MODES)
    assert stat.cpu_seconds == pytest.approx(seconds)
    assert stat.online_cpus == cpus


@pytest.mark.parametrize(
    ("text", "modes"),
    [
        ("cpu 1 2 3 4\ncpu0 1 2 3 4\n", ["user", "nice", "system", "idle"]),  # Linux 2.4
        ("cpu 1 2 3 4 5 6 7\ncpu0 1 2 3 4 5 6 7\n", list(CPU_MODES[:7])),  # before steal
    ],
)
def test_parse_stat_old_kernels_leave_missing_modes_out(text: str, modes: list[str]) -> None:
    assert list(parse_stat(text, 100).cpu_seconds) == modes


def test_parse_stat_uses_the_given_tick_rate() -> None:
    stat = parse_stat("cpu 250 0 0 0\ncpu0 250 0 0 0\n", 250)
    assert stat.cpu_seconds["user"] == 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no aggregate 'cpu' line"),
        ("cpu0 1 2 3 4\n", "no aggregate 'cpu' line"),
        ("cpu 1 2 3 4\n", "no per-CPU"),
        ("cpu 1 2 x 4\ncpu0 1 2 3 4\n", "cpu system is not an integer"),
        ("cpu  1011234 2345 45", "3 fields"),  # truncated
        ("cpu 1 2 -3 4\ncpu0 1 2 3 4\n", "negative"),
    ],
)
def test_parse_stat_garbage(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_stat(text, 100)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("modern/proc/pressure/cpu", Pressure(123.456789, 0.0)),
        ("modern/proc/pressure/io", Pressure(98.765432, 87.654321)),
        ("modern/proc/pressure/memory", Pressure(4.56789, 3.456789)),
        ("kernel-5.4/proc/pressure/cpu", Pressure(2.514981, None)),
        ("kernel-5.4/proc/pressure/io", Pressure(1.297403, 1.103887)),
        ("kernel-5.4/proc/pressure/memory", Pressure(0.0, 0.0)),
    ],
)
def test_parse_pressure_fixtures(path: str, expected: Pressure) -> None:
    got = parse_pressure((FIX / path).read_text())
    assert got.some_total_seconds == pytest.approx(expected.some_total_seconds)
    if expected.full_total_seconds is None:
        assert got.full_total_seconds is None
    else:
        assert got.full_total_seconds == pytest.approx(expected.full_total_seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'some' line"),
        ("full avg10=0.00 avg60=0.00 avg300=0.00 total=5\n", "no 'some' line"),
        ("bogus avg10=0.00 total=5\n", "expected 'some' or 'full'"),
        ("some avg10=0.00 avg60=0.00 avg300=0.00\n", "no total"),
        ("some avg10=0.00 total=12x\n", "not an integer"),
        ("some avg10=0.00 avg60\n", "key=value"),
        ("some avg10=0.00 avg60=0.00 avg300=0.00 tot", "key=value"),  # truncated
    ],
)
def test_parse_pressure_garbage(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_pressure(text)


@pytest.mark.parametrize(
    ("tree", "key", "value"),
    [
        ("modern", "MemAvailable", 251234568 * 1024),
        ("modern", "MemTotal", 527958256 * 1024),
        ("modern", "HugePages_Total", 0),
        ("modern", "Hugepagesize", 2048 * 1024),
        ("kernel-5.4", "MemAvailable", 7319856 * 1024),
        ("kernel-2.6.32", "MemAvailable", None),
    ],
)
def test_parse_meminfo_fixtures(tree: str, key: str, value: int | None) -> None:
    info = parse_meminfo((FIX / tree / "proc/meminfo").read_text())
    assert info.bad_lines == ()
    assert info.values.get(key) == value


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("MemAvailable 123 kB", "expected 'Name: value [kB]'"),
        ("MemAvailable: lots kB", "not an integer"),
        ("MemAvailable: 123 MB", "unknown unit"),
        ("MemAvailable:", "expected 'Name: value [kB]'"),
        ("MemAvail", "expected 'Name: value [kB]'"),  # truncated
    ],
)
def test_parse_meminfo_bad_lines_are_reported(line: str, message: str) -> None:
    info = parse_meminfo(f"MemTotal: 100 kB\n{line}\nMemFree: 50 kB\n")
    assert info.values == {"MemTotal": 102400, "MemFree": 51200}
    assert len(info.bad_lines) == 1
    assert info.bad_lines[0].startswith("line 2:") and message in info.bad_lines[0]
