"""`blkio_read_limit`: the tier's loop device read-limited in the job's cgroup (v1
blkio.throttle.read_bps_device, v2 io.max rbps): a storage tier that is slow for the job.
Settings: tier, bytes_per_s. Stop puts the unlimited rule back."""

from __future__ import annotations

from lab.faults import FaultContext, tier_of
from lab.scenario import Fault


class ReadLimit:
    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        self.ctx = ctx
        self.tier = tier_of(fault, ctx)
        self.bytes_per_s = int(fault.param("bytes_per_s", 1_000_000))
        self.on = False

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        self.ctx.cgroup.set_read_limit(self.tier.dev, self.bytes_per_s)
        self.on = True

    def stop(self) -> None:
        if self.on:
            self.ctx.cgroup.set_read_limit(self.tier.dev, None)
            self.on = False
