"""Collectors, one per file. `available()` lists those the CLI can switch on and off."""

from __future__ import annotations

from gpufeed.collectors.base import CollectorSpec


def available() -> list[CollectorSpec]:
    """Every collector the agent knows; imports are local so `import gpufeed` stays light."""
    from gpufeed.collectors.host import HostCollector
    from gpufeed.collectors.network import NetworkCollector
    from gpufeed.collectors.storage import StorageCollector

    specs: list[CollectorSpec] = [
        CollectorSpec(
            name="network",
            help="netdev bytes and link speed; InfiniBand/RoCE port bytes, speed, transmit wait",
            default_enabled=True,
            factory=lambda ctx: NetworkCollector(
                ctx.paths,
                include_virtual=ctx.config.network.include_virtual,
                xmit_wait_tick_bytes=ctx.config.network.xmit_wait_tick_bytes,
            ),
        ),
        CollectorSpec(
            name="host",
            help="CPU seconds by mode, logical CPUs, pressure stall information, MemAvailable",
            default_enabled=True,
            factory=lambda ctx: HostCollector(ctx.paths),
        ),
        CollectorSpec(
            name="storage",
            help="per-tier I/O counters (diskstats, NFS mountstats) and capacity (statfs)",
            default_enabled=True,
            factory=StorageCollector,
        ),
    ]
    return specs
