"""Collectors, one per file. `available()` lists those the CLI can switch on and off."""

from __future__ import annotations

from gpufeed.collectors.base import CollectorSpec


def available() -> list[CollectorSpec]:
    """Every collector the agent knows; imports are local so `import gpufeed` stays light."""
    specs: list[CollectorSpec] = []
    return specs
