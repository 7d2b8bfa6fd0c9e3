"""/proc/meminfo: `Name:   value kB` lines.

Values with a `kB` unit are KiB (the kernel prints pages << (PAGE_SHIFT - 10)), so they are
converted to bytes; the few unit-less lines (HugePages_Total, ...) are counts and stay as is.
MemAvailable exists since Linux 3.14; on older kernels it is simply not in the result.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MemInfo:
    """`values` in bytes (or plain counts); lines that did not parse are in `bad_lines`."""

    values: dict[str, int]
    bad_lines: tuple[str, ...]


def parse_meminfo(text: str) -> MemInfo:
    values: dict[str, int] = {}
    bad: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not name.strip() or not 1 <= len(parts) <= 2:
            bad.append(f"line {lineno}: expected 'Name: value [kB]', got {line.strip()[:80]!r}")
            continue
        try:
            number = int(parts[0])
        except ValueError:
            bad.append(f"line {lineno}: {name.strip()!r} is not an integer")
            continue
        if len(parts) == 2:
            if parts[1] != "kB":
                bad.append(f"line {lineno}: unknown unit {parts[1][:10]!r}")
                continue
            number *= 1024
        values[name.strip()] = number
    return MemInfo(values, tuple(bad))
