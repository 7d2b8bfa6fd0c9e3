"""Domain facts, each stated once: everything else imports them or is tested against them.

Today this holds the fatal XIDs; the correlator's causes and the throttle reasons are to
move here as well (issue 10).

## Fatal XIDs

The one list that the correlator (a fatal XID explains a stalled GPU: cause `gpu_error`)
and the paging alert `GpuFatalXid` share. An XID is fatal here when the GPU, not the
program, is at fault and the job on it cannot simply go on: NVIDIA's XID catalogue
(docs.nvidia.com/deploy/xid-errors, the "Resolution Bucket (Immediate Action)" column) asks
for a GPU reset or a node reboot, or the driver has already killed the job for a
hardware memory error. Left out on purpose, because they are the program's fault or only
a warning, so they neither explain a stall as a GPU error nor page anyone at night:
13/31/43/45/69/109 (engine exceptions, page faults, context-switch timeouts: restart the
application), 61 (a micro-controller breakpoint/warning, not a halt), 63 (a row remap
recorded and pending: applied at the next reset, the GPU keeps working), 92 (a high rate
of corrected single-bit errors: a trend to watch, nothing has failed).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

# XID code (as the `xid` label carries it) -> what it means.
FATAL_XID_MEANINGS: Final = MappingProxyType(
    {
        # Double-bit (uncorrectable) ECC error in GPU memory: reset the GPU.
        "48": "double-bit ECC error",
        # An internal micro-controller (PMU/GSP falcon) halted: the GPU needs a reset.
        "62": "internal micro-controller halt",
        # Row remapping failed (no spare rows left, or the remap could not be recorded):
        # reset, and the GPU is a candidate for replacement.
        "64": "row remapping failure",
        # NVLink error: the link (and the collectives over it) is down until a reset.
        "74": "NVLink error",
        # The GPU has fallen off the bus: it answers nothing until the node is rebooted.
        "79": "GPU fallen off the bus",
        # Contained ECC error: the driver killed the job that touched the bad memory;
        # the row is pending remapping until the next reset.
        "94": "contained ECC error (the job was killed)",
        # Uncontained ECC error: every job on the GPU was killed; reset the GPU.
        "95": "uncontained ECC error",
        # The GPU System Processor stopped answering the driver (RPC timeout): reset.
        "119": "GSP RPC timeout",
        # The GPU System Processor reported an error: reset.
        "120": "GSP error",
        # An ECC error the GPU could not recover from (Hopper and newer): reset.
        "140": "unrecovered ECC error",
    }
)
FATAL_XIDS: Final[tuple[str, ...]] = tuple(FATAL_XID_MEANINGS)
