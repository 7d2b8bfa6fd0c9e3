"""The agent's data model: metric samples and families, independent of any exposition library.

Collectors return `Family` objects built with `Families`; the exposition layer turns them
into Prometheus text, the recorder into timestamped OpenMetrics, and the correlator reads
them as plain numbers. Nothing here holds state between samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpufeed.catalogue import MetricSpec

MetricType = Literal["gauge", "counter", "histogram", "info"]
LabelPairs = tuple[tuple[str, str], ...]


def label_pairs(labels: Mapping[str, str]) -> LabelPairs:
    """Labels as a hashable, order-stable tuple (sorted by name)."""
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposed series value. `name` is the full exposition name (`..._total`, `..._bucket`)."""

    name: str
    labels: LabelPairs
    value: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family. For counters `name` carries the `_total` suffix, as the contract lists it."""

    name: str
    type: MetricType
    help: str
    samples: tuple[Sample, ...] = field(default=())


class Families:
    """Builds families sample by sample; a value of None (not provided by the hardware) is dropped.

    The contract says a value the hardware does not provide is absent, never 0 and never NaN,
    so `add` silently skips None and NaN: callers pass what they read and never invent zeros.

    The agent's own families are built from their catalogue entries (`declare_spec`, `put`,
    `put_histogram` with a `gpufeed.catalogue.MetricSpec`), so name, type and HELP are
    written once, in the catalogue; the name-and-HELP methods are for families outside it.
    """

    def __init__(self) -> None:
        self._meta: dict[str, tuple[MetricType, str]] = {}
        self._samples: dict[str, list[Sample]] = {}

    def declare(self, name: str, type_: MetricType, help_: str) -> None:
        if name not in self._meta:
            self._meta[name] = (type_, help_)
            self._samples[name] = []

    def declare_spec(self, m: MetricSpec) -> None:
        """Declares a catalogue family, so it is exported (with HELP and TYPE) even empty."""
        self.declare(m.name, m.type, m.help)

    def put(self, m: MetricSpec, labels: Mapping[str, str], value: float | None) -> None:
        """One sample of the catalogue family `m` (an info family's value is 1)."""
        if m.type == "counter":
            self.counter(m.name, m.help, labels, value)
        else:
            self.add(m.name, m.type, m.help, labels, value)

    def put_histogram(
        self,
        m: MetricSpec,
        labels: Mapping[str, str],
        buckets: Iterable[tuple[float, float]],
        sum_value: float,
        count: float,
    ) -> None:
        self.histogram(m.name, m.help, labels, buckets, sum_value, count)

    def add(
        self,
        name: str,
        type_: MetricType,
        help_: str,
        labels: Mapping[str, str],
        value: float | None,
    ) -> None:
        self.declare(name, type_, help_)
        if value is None:
            return
        v = float(value)
        if math.isnan(v):
            return
        self._samples[name].append(Sample(name, label_pairs(labels), v))

    def gauge(self, name: str, help_: str, labels: Mapping[str, str], value: float | None) -> None:
        self.add(name, "gauge", help_, labels, value)

    def counter(
        self, name: str, help_: str, labels: Mapping[str, str], value: float | None
    ) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        self.add(name, "counter", help_, labels, value)

    def info(self, name: str, help_: str, labels: Mapping[str, str]) -> None:
        """An `_info` metric: a gauge that is always 1 and carries metadata in its labels."""
        self.add(name, "gauge", help_, labels, 1.0)

    def histogram(
        self,
        name: str,
        help_: str,
        labels: Mapping[str, str],
        buckets: Iterable[tuple[float, float]],
        sum_value: float,
        count: float,
    ) -> None:
        """`buckets` are cumulative (upper bound, count) pairs; +Inf is added if missing."""
        self.declare(name, "histogram", help_)
        out = self._samples[name]
        saw_inf = False
        for le, n in buckets:
            saw_inf = saw_inf or math.isinf(le)
            out.append(Sample(name + "_bucket", label_pairs({**labels, "le": _fmt_le(le)}), n))
        if not saw_inf:
            out.append(Sample(name + "_bucket", label_pairs({**labels, "le": "+Inf"}), count))
        out.append(Sample(name + "_sum", label_pairs(labels), sum_value))
        out.append(Sample(name + "_count", label_pairs(labels), count))

    def extend(self, families: Iterable[Family]) -> None:
        for fam in families:
            self.declare(fam.name, fam.type, fam.help)
            self._samples[fam.name].extend(fam.samples)

    def build(self) -> list[Family]:
        return [
            Family(name, t, h, tuple(self._samples[name])) for name, (t, h) in self._meta.items()
        ]


def _fmt_le(le: float) -> str:
    if math.isinf(le):
        return "+Inf"
    return repr(float(le))


def iter_samples(families: Iterable[Family]) -> Iterator[Sample]:
    for fam in families:
        yield from fam.samples
