"""Prometheus text exposition of families, through a private prometheus_client registry."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufeed.model import Families, Family

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _SnapshotCollector(Collector):
    """Yields the given families as prometheus_client metrics; holds nothing else."""

    def __init__(self, families: Sequence[Family]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for fam in self._families:
            if not fam.samples:
                continue  # a family with every value absent is left out, HELP and TYPE too
            base = fam.name[: -len("_total")] if fam.type == "counter" else fam.name
            metric = Metric(base, fam.help, "gauge" if fam.type == "info" else fam.type)
            for s in fam.samples:
                metric.add_sample(s.name, dict(s.labels), s.value)
            yield metric


def merge_families(families: Iterable[Family]) -> list[Family]:
    """One family per name, even when two sources contribute samples to it."""
    merged = Families()
    merged.extend(families)
    return merged.build()


def render_text(families: Iterable[Family], banner: str = "") -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(merge_families(families)))
    body = generate_latest(registry)
    if banner:
        # A plain comment line: ignored by parsers, seen by anyone who reads the page.
        body = f"# {banner}\n".encode() + body
    return body
