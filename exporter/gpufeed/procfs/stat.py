"""/proc/stat: CPU time by mode and the number of online CPUs.

The aggregate `cpu` line holds, in USER_HZ ticks summed over all CPUs:
user nice system idle iowait irq softirq steal guest guest_nice.
Older kernels print fewer fields (steal arrived in 2.6.11, guest in 2.6.24, guest_nice in
2.6.33); a mode the kernel does not print is absent from the result, never zero.

`guest` and `guest_nice` are already included in `user` and `nice` (the kernel adds a vCPU's
time to both, see account_guest_time() in kernel/sched/cputime.c), so they are not modes of
their own here: summing every field would count guest time twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The modes of the contract, in the order the kernel prints them.
CPU_MODES: tuple[str, ...] = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
)

_PER_CPU = re.compile(r"cpu\d+")


@dataclass(frozen=True, slots=True)
class CpuStat:
    """`cpu_seconds` maps each mode the kernel reports to seconds summed over all CPUs."""

    cpu_seconds: dict[str, float]
    online_cpus: int


def parse_stat(text: str, ticks_per_second: float) -> CpuStat:
    """Parses /proc/stat. Raises ValueError when the aggregate cpu line is missing or broken."""
    if ticks_per_second <= 0:
        raise ValueError(f"ticks_per_second must be positive, got {ticks_per_second}")
    total: dict[str, float] | None = None
    cpus = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        key = fields[0]
        if key == "cpu":
            total = _cpu_line(fields[1:], ticks_per_second, lineno)
        elif _PER_CPU.fullmatch(key):
            cpus += 1
    if total is None:
        raise ValueError("no aggregate 'cpu' line (truncated or not a /proc/stat file)")
    if cpus == 0:
        raise ValueError("no per-CPU 'cpuN' lines (truncated or not a /proc/stat file)")
    return CpuStat(total, cpus)


def _cpu_line(values: list[str], ticks_per_second: float, lineno: int) -> dict[str, float]:
    # user, nice, system and idle have been there since the first kernels: fewer is garbage.
    if len(values) < 4:
        raise ValueError(f"line {lineno}: the cpu line has {len(values)} fields, expected >= 4")
    out: dict[str, float] = {}
    for mode, raw in zip(CPU_MODES, values, strict=False):
        try:
            ticks = int(raw)
        except ValueError:
            raise ValueError(f"line {lineno}: cpu {mode} is not an integer: {raw!r}") from None
        if ticks < 0:
            raise ValueError(f"line {lineno}: cpu {mode} is negative: {ticks}")
        out[mode] = ticks / ticks_per_second
    return out
