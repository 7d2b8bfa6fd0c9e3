"""Domain facts, each stated once: everything else imports them or is tested against them.

The causes a window can be tagged with, the fatal XIDs, the clock event (throttle) reasons
and the correlator's window defaults. The correlator, the simulator, the alerts, the
dashboards and the docs' tables import these or are tested against them
(tests/test_vocabulary.py; tests/test_cause_checklist.py names what a new cause still lacks).

## Causes

`Cause` values are the stable `cause` label values of the live metrics, the windows log,
`gpufeed analyze` and the alerts. Adding one: the enum here, its rules
(correlator/engine/rules.py) and its runbook (docs/runbooks.md); the checklist test names every
other piece that is still missing (summary headline, dashboard colour, alert hint,
Alertmanager route, docs table, simulator phase).

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

from enum import StrEnum
from types import MappingProxyType
from typing import Final


class Cause(StrEnum):
    DATA_LOADING = "data_loading"
    PREPROCESSING = "preprocessing"
    CHECKPOINTING = "checkpointing"
    NETWORK = "network"
    THROTTLING = "throttling"
    STARTUP = "startup"
    IDLE = "idle"
    GPU_ERROR = "gpu_error"
    # waits for a peer: another rank of the job (on another node, or a GPU here) arrives
    # last at the collectives; the job-level correlation names the culprit and its cause
    STRAGGLER = "straggler"
    # an inference server's GPU underused while no request waits in its queue: demand is
    # below what the GPU can serve, nothing is stalled (does not page; docs/serving.md)
    LOW_DEMAND = "low_demand"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


class NetworkReason(StrEnum):
    """Why a `network` window's GPUs wait (its `network_reason`), decided from the counters:

    - `saturated`: a link (or NVLink) runs at its speed: the job asks more than it carries.
    - `congestion`: the fabric cannot deliver although the link is not full: InfiniBand
      transmit-wait, RoCE ECN marks / CNPs, discards.
    - `link_errors`: the link itself is faulty or flapping: link downs, carrier changes,
      symbol / CRC / sequence errors, a port that is down.
    - `peer`: this node's links are fine and the job waits in its collectives: another
      rank holds it back (the job-level view names it and calls the victims `straggler`).
    """

    SATURATED = "saturated"
    CONGESTION = "congestion"
    LINK_ERRORS = "link_errors"
    PEER = "peer"

    def __str__(self) -> str:
        return self.value


class DataSource(StrEnum):
    """Where a `data_loading` window's wait is (its evidence's `data_source`, and the
    `data_source` label of gpufeed_gpu_underutilization_cause, which routes its alert):

    - `storage` (the label left out): the job's data tier is slow or its reads pile up;
      the storage owners' to fix.
    - `input_pipeline`: the job says it waits for its input most of the time and no node
      signal explains it (a remote fetch, a lock, a single-threaded decode, a sleep in its
      loader): the job's own code, its owner's to fix; no tier is named.
    """

    STORAGE = "storage"
    INPUT_PIPELINE = "input_pipeline"

    def __str__(self) -> str:
        return self.value


class StragglerReason(StrEnum):
    """Why a `straggler` window's job waits where no rank or node is at fault (its
    evidence's `straggler_reason`), found by the job-level join from the ranks' collective
    waits and their parallelism coordinates; a finding for the job's owner, never a node's:

    - `stage_imbalance`: one pipeline stage arrives last on every data-parallel replica
      (its layers are heavier than the other stages'): rebalance the pipeline partition.
    - `input_imbalance`: the data-parallel rank that arrives last changes from step to
      step (sequence lengths, sample sizes): bucket or pack the batches.
    """

    STAGE_IMBALANCE = "stage_imbalance"
    INPUT_IMBALANCE = "input_imbalance"

    def __str__(self) -> str:
        return self.value


# The parallelism dimensions a rank may report its coordinates in (data, pipeline: the
# stage, tensor, context, expert parallel), in the SDK's wire order; each is the label
# `<dim>_rank` of gpufeed_job_rank_info (a small int: at most the dimension's size).
PARALLEL_DIMENSIONS: Final[tuple[str, ...]] = ("dp", "pp", "tp", "cp", "ep")
PARALLEL_LABELS: Final[tuple[str, ...]] = tuple(f"{d}_rank" for d in PARALLEL_DIMENSIONS)


# The fault counters (gpufeed_network_link_errors_total's `counter`) that count a link going
# down (link_downed) or changing state (carrier_changes: down and up, two per flap); the
# others count errors on a link that stays up.
LINK_FLAP_COUNTERS: Final[tuple[str, ...]] = ("link_downed", "carrier_changes")


# The causes that evidence can decide; `unknown` is what is left when none does.
DECIDABLE_CAUSES: Final[tuple[Cause, ...]] = tuple(c for c in Cause if c is not Cause.UNKNOWN)

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


# ## Clock event reasons
#
# nvml.h's bit for each reason, the same for the "ClocksEventReasons" call and its
# deprecated "ClocksThrottleReasons" predecessor. The names are the `reason` label values
# of gpufeed_gpu_clock_event_active (lower snake case of NVML's names).
CLOCK_EVENT_REASON_BITS: Final[tuple[tuple[str, int], ...]] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
    # newer drivers (R550+); exported only where the GPU's supported mask has them
    ("board_limit", 0x200),
    ("reliability", 0x400),
)
CLOCK_EVENT_REASONS: Final[tuple[str, ...]] = tuple(r for r, _ in CLOCK_EVENT_REASON_BITS)
# The reasons a simulated GPU reports: NVML's first eight bits (up to the power brake).
# The simulated node's layout keeps one slot per reason, in this order, so a change here
# changes its traces.
SIMULATED_CLOCK_EVENT_REASONS: Final[tuple[str, ...]] = tuple(
    r for r, bit in CLOCK_EVENT_REASON_BITS if bit <= 0x80
)
# Reasons that slow a busy GPU down (the correlator's `throttling`): heat, power, a
# hardware slowdown. sync_boost, gpu_idle and the clock settings do not.
SLOWDOWN_REASONS: Final[tuple[str, ...]] = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
)
# The ones worth an alert (GpuClockThrottled): sw_power_cap is left out on purpose, a GPU
# working at its power limit is a busy GPU, not an incident.
ALERTING_THROTTLE_REASONS: Final[tuple[str, ...]] = tuple(
    r for r in SLOWDOWN_REASONS if r != "sw_power_cap"
)

# ## Storage tiers
#
# The `tier` of a job's bytes that no device names: /proc/PID/io (an SDK job under no
# scheduler, or a job whose cgroup has no io accounting) counts bytes, not devices.
UNATTRIBUTED_TIER: Final = "unattributed"
# The `tier` of mounts in no configured tier: the host's own disks and every other
# tenant's mounts in one bag, no evidence of which device a job's data is on.
UNASSIGNED_TIER: Final = "unassigned"

# ## Correlator window defaults
#
# The agent's `correlator:` settings, `gpufeed analyze`'s flags and the engine share these;
# the GpuUtilizationLow alert's threshold defaults to the same ratio.
DEFAULT_THRESHOLD_RATIO: Final = 0.8  # a GPU below this utilization is underutilized
DEFAULT_MIN_WINDOW_SECONDS: Final = 60.0  # underutilized this long before a window opens
DEFAULT_MERGE_GAP_SECONDS: Final = 30.0  # shorter recoveries stay inside the window
DEFAULT_SPLIT_SECONDS: Final = 30.0  # another cause holds this long: the window splits

# ## Fleet service defaults
#
# `gpufeed fleet --fleet.queries`: range queries in flight at once (why 2: FleetEngines in
# fleet/carry.py).
DEFAULT_FLEET_QUERIES_IN_FLIGHT: Final = 2
