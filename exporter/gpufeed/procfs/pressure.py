"""/proc/pressure/{cpu,io,memory}: pressure stall information (PSI, Linux >= 4.20).

Each file has a `some` line and, for io and memory (and for cpu since 5.13), a `full` line:
`some avg10=0.12 avg60=0.05 avg300=0.01 total=123456`, where `total` is the cumulative
stall time in microseconds. `some` is time in which at least one task waited on the
resource; `full` is time in which all non-idle tasks were stalled at once.
"""

from __future__ import annotations

from dataclasses import dataclass

PSI_RESOURCES: tuple[str, ...] = ("cpu", "io", "memory")


@dataclass(frozen=True, slots=True)
class Pressure:
    some_total_seconds: float | None
    full_total_seconds: float | None


def parse_pressure(text: str) -> Pressure:
    """Parses one PSI file. Raises ValueError on a malformed line or when `some` is missing."""
    totals: dict[str, float] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        kind = fields[0]
        if kind not in ("some", "full"):
            raise ValueError(f"line {lineno}: expected 'some' or 'full', got {kind[:20]!r}")
        values = dict(_key_value(f, lineno) for f in fields[1:])
        if "total" not in values:
            raise ValueError(f"line {lineno}: no total= field")
        try:
            micros = int(values["total"])
        except ValueError:
            raise ValueError(
                f"line {lineno}: total is not an integer: {values['total']!r}"
            ) from None
        if micros < 0:
            raise ValueError(f"line {lineno}: total is negative")
        totals[kind] = micros / 1e6
    if "some" not in totals:
        raise ValueError("no 'some' line (truncated or not a PSI file)")
    return Pressure(totals["some"], totals.get("full"))


def _key_value(field: str, lineno: int) -> tuple[str, str]:
    key, sep, value = field.partition("=")
    if not sep:
        raise ValueError(f"line {lineno}: expected key=value, got {field[:40]!r}")
    return key, value
