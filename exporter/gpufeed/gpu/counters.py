"""Running totals the agent keeps itself, from readings that are not safe counters as they come.

- `WrappingCounter`: NVML's PCIe byte fields (197/198) "can be wrapped" (nvml.h), with no
  width given. The total is kept 64-bit from modular deltas. The width is the field's value
  type where NVML says it (NVML_VALUE_TYPE_UNSIGNED_INT: 32 bits, which is what driver 580
  gives on an H200, where the truth check saw the field wrap 177 times in 12 s of copies);
  otherwise 32 bits until a raw value above 2**32 - 1 proves it wider. A 32-bit counter read
  less often than it wraps (every ~78 ms at the 55 GB/s an H200 copies at) loses whole turns;
  the backend therefore prefers GPM's PCIe rates where the GPU has them, and without GPM
  uses only fields shown to be wider than 32 bits (see docs/gpu.md).
- `Integral`: a rate or a ratio multiplied by the time it covers, summed (busy seconds, GPM
  PCIe bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

_WIDTH_32 = 2**32
_WIDTH_64 = 2**64


@dataclass(slots=True)
class WrappingCounter:
    """A 64-bit running total from a raw counter that wraps at an unknown width (32 or 64)."""

    total: float | None = None
    last_raw: int | None = None
    wide: bool = False  # True once a raw value showed the counter is wider than 32 bits

    def update(self, raw: int, width_bits: int | None = None) -> float:
        """Adds the delta since the last raw value; `width_bits` where the source says it."""
        if raw >= _WIDTH_32 or (width_bits is not None and width_bits > 32):
            self.wide = True
        if self.last_raw is None or self.total is None:
            self.total = float(raw)
        else:
            modulus = _WIDTH_64 if self.wide else _WIDTH_32
            self.total += float((raw - self.last_raw) % modulus)
        self.last_raw = raw
        return self.total


@dataclass(slots=True)
class Integral:
    """A running sum of increments; None until the first increment."""

    total: float | None = None

    def add(self, amount: float) -> float:
        self.total = (self.total or 0.0) + max(amount, 0.0)
        return self.total
