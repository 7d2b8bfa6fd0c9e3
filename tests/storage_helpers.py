"""Shared helpers for the storage tests: fixture paths and reading collector output."""

from __future__ import annotations

from pathlib import Path

from gpufeed.hostpaths import HostPaths
from gpufeed.model import Family

FIXTURES = Path(__file__).parent / "fixtures" / "storage"
NODE1 = FIXTURES / "node1"
PARSERS = FIXTURES / "parsers"


def node_paths(root: Path = NODE1) -> HostPaths:
    return HostPaths(procfs=root / "proc", sysfs=root / "sys", rootfs=root / "root")


def series(families: list[Family]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels)): s.value for f in families for s in f.samples}


def by_mount(families: list[Family], name: str) -> dict[str, float]:
    """metric `name` keyed by mountpoint (fails if a mount point appears twice)."""
    out: dict[str, float] = {}
    for f in families:
        for s in f.samples:
            if s.name == name:
                mp = s.label("mountpoint")
                assert mp not in out, f"{name} has two series for {mp}"
                out[mp] = s.value
    return out


def labels_of(families: list[Family], name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for f in families for s in f.samples if s.name == name]
