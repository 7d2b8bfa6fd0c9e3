"""Scenarios for the simulated node: frozen dataclasses, and their YAML reader.

A scenario says what the node is made of (GPUs, storage tiers, fabric ports, CPUs) and what
happens on it: which job holds which GPUs, which tier it reads from and checkpoints to, and
the phases it goes through (compute, a data-loading stall, a checkpoint, ...). Confounder
events (a busy archive tier, a short dip, thermal throttling at full load) are things that
look alarming but must not open an underutilization window.

Errors name the key and the line, in the same style as the agent's config file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpufeed import vocabulary
from gpufeed.config import ConfigError, _Reader, _show, compose_yaml, read_yaml_text

# Phase names are the correlator's causes (every cause evidence can decide); `compute` is
# healthy. The order is the simulator's (its generator draws from it at fixed seeds).
_C = vocabulary.Cause
PHASES: tuple[str, ...] = (
    "compute",
    *(
        c.value
        for c in (
            _C.STARTUP,
            _C.DATA_LOADING,
            _C.PREPROCESSING,
            _C.CHECKPOINTING,
            _C.NETWORK,
            _C.THROTTLING,
            _C.GPU_ERROR,
            _C.IDLE,
            _C.STRAGGLER,
            _C.LOW_DEMAND,
        )
    ),
)
GUISES: dict[str, tuple[str, ...]] = {
    "data_loading": ("saturated", "contended"),
    "network": ("saturated", "congested"),
}
# The reasons a throttling phase and a thermal event pick from: all of them slowdown
# reasons (gpufeed.vocabulary.SLOWDOWN_REASONS), so the correlator sees them as throttling.
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_power_cap")
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")
# Every clock event reason the simulated GPUs report (NVML's names, lower snake case).
CLOCK_EVENT_REASONS = vocabulary.SIMULATED_CLOCK_EVENT_REASONS
EVENT_KINDS = ("busy_tier", "dip", "thermal")
FABRICS = ("ethernet", "infiniband", "roce")
SCHEDULERS = ("slurm", "kubernetes", "process")
# How a job's GPUs read while its ranks wait in a collective (`collectives:` of a job): NCCL's
# kernel spins, so NVML counts the GPU busy and only SM activity (GPM) shows the compute
# (the default), or the GPU reads the compute share alone (gloo, or collectives that do not
# spin). A job of one GPU has no peer to wait for: it reads the compute share either way.
COLLECTIVE_GUISES = ("spin", "compute_only")
# An inference server's stack (`serving:` of a job): its queue is exported as the serving
# collector's families; only a serving job can have a low_demand phase.
SERVING_STACKS = ("vllm", "triton", "tgi")
MAX_DIP_SECONDS = 45.0  # a dip is a confounder only while it is shorter than a window


class ScenarioError(ConfigError):
    """A scenario file problem, with the file, key and line in its message."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    gpus: int = 8
    gpu_name: str = "NVIDIA H100 80GB HBM3"
    gpu_memory_bytes: float = 85_520_809_984.0
    gpu_max_sm_clock_hertz: float = 1.98e9
    gpu_power_limit_watts: float = 700.0
    gpu_idle_power_watts: float = 70.0
    nvlink_bytes_per_second: float = 450e9  # per direction
    pcie_bytes_per_second: float = 55e9
    sm_active: bool = True  # GPM available (Hopper and newer)
    driver_version: str = "550.90.07"
    cpus: int = 128
    memory_bytes: float = 2_199_023_255_552.0


@dataclass(frozen=True, slots=True)
class TierSpec:
    name: str
    mountpoint: str
    device: str | None  # None: a network filesystem (NFS), no block-device busy time
    read_bytes_per_second: float
    write_bytes_per_second: float
    read_latency_seconds: float
    write_latency_seconds: float
    request_bytes: float
    capacity_bytes: float
    free_ratio: float
    background_read_bytes_per_second: float
    background_write_bytes_per_second: float
    # an object-storage tier (an S3 bucket; `mountpoint` is its s3:// URL): exported as the
    # SDK collector's gpufeed_object_storage_* (requests as operations), with no mount,
    # device, capacity or busy time, and drawing no noise (the other tiers' values are the
    # same with or without it)
    object_store: bool = False


@dataclass(frozen=True, slots=True)
class PortSpec:
    device: str
    fabric: str
    port: str | None
    speed_bytes_per_second: float
    counts_transmit_wait: bool
    # a root qdisc's rate on an Ethernet port (tc tbf/htb); None: not shaped
    shaped_rate_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    phase: str
    seconds: float
    guise: str = ""  # data_loading: saturated|contended; network: saturated|congested
    tier: str = ""  # overrides the job's data tier (data_loading) or checkpoint tier
    gpu: int = -1  # gpu_error: the GPU that is lost (default: the job's last GPU)
    reason: str = ""  # throttling: the clock event reason


@dataclass(frozen=True, slots=True)
class JobSpec:
    job_id: str
    name: str
    scheduler: str
    gpus: tuple[int, ...]
    data_tier: str
    checkpoint_tier: str
    sdk: bool
    data_read_bytes_per_second: float
    steps_per_second: float
    steps_per_epoch: int
    phases: tuple[PhaseSpec, ...]
    serving: str = ""  # an inference server's stack (SERVING_STACKS); "" = not serving
    collectives: str = COLLECTIVE_GUISES[0]  # how its GPUs read in a collective wait

    @property
    def spins(self) -> bool:
        """Whether its GPUs read busy while its ranks wait in a collective (a job of
        several GPUs on NCCL, COLLECTIVE_GUISES)."""
        return len(self.gpus) > 1 and self.collectives == "spin"

    @property
    def period_seconds(self) -> float:
        return sum(p.seconds for p in self.phases)


@dataclass(frozen=True, slots=True)
class EventSpec:
    kind: str  # busy_tier | dip | thermal
    at_seconds: float
    seconds: float
    tier: str = ""  # busy_tier
    job_id: str = ""  # dip, thermal (all the job's GPUs)
    gpus: tuple[int, ...] = ()  # thermal on given GPUs
    reason: str = "hw_thermal_slowdown"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str = "unnamed"
    repeat: bool = True
    node: NodeSpec = field(default_factory=NodeSpec)
    tiers: tuple[TierSpec, ...] = ()
    ports: tuple[PortSpec, ...] = ()
    jobs: tuple[JobSpec, ...] = ()
    events: tuple[EventSpec, ...] = ()

    @property
    def cycle_seconds(self) -> float:
        """How long before the whole scenario repeats (the longest job or event)."""
        spans = [j.period_seconds for j in self.jobs]
        spans += [e.at_seconds + e.seconds for e in self.events]
        return max(spans, default=60.0)

    def tier(self, name: str) -> TierSpec:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


def default_tiers() -> tuple[TierSpec, ...]:
    """A typical training node: NVMe for GPUDirect, local NVMe, shared NFS, and an HDD archive."""
    return (
        TierSpec("gpu_direct", "/mnt/gds", "nvme0n1", 25e9, 12e9, 1.5e-4, 6e-5, 4 << 20, 3.0e13, 0.55, 1e8, 5e7),
        TierSpec("hot", "/mnt/hot", "nvme1n1", 6.5e9, 3.2e9, 2.5e-4, 8e-5, 1 << 20, 7.68e12, 0.6, 5e7, 2e7),
        TierSpec("warm", "/mnt/warm", None, 2.2e9, 1.1e9, 2e-3, 3e-3, 1 << 20, 5e14, 0.35, 2e7, 5e6),
        TierSpec("cold", "/mnt/cold", "sda", 2.5e8, 2.0e8, 8e-3, 9e-3, 1 << 20, 1.8e13, 0.4, 2e6, 1e6),
        # other tenants' light reads from a dataset bucket, 8 MiB objects at 30 ms each
        TierSpec("object", "s3://sim-datasets", None, 5e9, 2e9, 0.03, 0.05, 8 << 20, 1e15, 1.0, 5e5, 5e4, True),
    )  # fmt: skip


def default_ports() -> tuple[PortSpec, ...]:
    """One 100 GbE port for control and NFS; four 400 Gb/s InfiniBand rails, one per GPU pair.
    eth0 carries a host egress policy (an htb root) at its line rate: the shaped-rate family
    is there, and it limits nothing the link would not."""
    ports = [PortSpec("eth0", "ethernet", None, 12.5e9, False, 12.5e9)]
    ports += [PortSpec(f"mlx5_{i}", "infiniband", "1", 50e9, True) for i in range(4)]
    return tuple(ports)


def default_scenario() -> Scenario:
    """The built-in scenario (package data `gpufeed/scenarios/default.yaml`)."""
    text = resources.files("gpufeed").joinpath("scenarios/default.yaml").read_text("utf-8")
    return parse_scenario(text, "<built-in default.yaml>")


def load_scenario(path: str | Path | None) -> Scenario:
    """Reads and validates a scenario file; None gives the built-in default."""
    if path is None:
        return default_scenario()
    return parse_scenario(*read_yaml_text(path, "scenario file", ScenarioError))


Entry = tuple[yaml.Node, yaml.Node]
Mapping_ = dict[str, Entry]


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    root = compose_yaml(text, source, ScenarioError)
    if root is None:
        raise ScenarioError(f"{source}: empty scenario (expected at least `jobs:`)")
    return _ScenarioReader(source).scenario(root)


class _ScenarioReader(_Reader):
    def fail(self, node: yaml.Node | None, key: str, msg: str) -> ConfigError:
        line = f" line {node.start_mark.line + 1}" if node is not None else ""
        return ScenarioError(f"{self.source}:{line}: {key}: {msg}")

    def scenario(self, root: yaml.Node) -> Scenario:
        top = self.mapping(root, "scenario")
        known = {"name", "repeat", "node", "tiers", "fabric", "jobs", "events"}
        self.no_unknown(top, known, "")
        node = self.node_spec(top.get("node"))
        tiers = self.tiers_spec(top.get("tiers"))
        ports = self.ports_spec(top.get("fabric"))
        jobs = self.jobs_spec(top.get("jobs"), node, {t.name for t in tiers})
        events = self.events_spec(top.get("events"), node, {t.name for t in tiers}, jobs)
        return Scenario(
            name=self.string(top, "name", "unnamed"),
            repeat=self.boolean(top, "repeat", True),
            node=node,
            tiers=tiers,
            ports=ports,
            jobs=jobs,
            events=events,
        )

    def choice(
        self, m: Mapping_, key: str, default: str, choices: tuple[str, ...], prefix: str = ""
    ) -> str:
        value = self.string(m, key, default, prefix=prefix)
        if value not in choices and not (value == default and key not in m):
            raise self.fail(m[key][1], prefix + key, f"expected one of {', '.join(choices)}")
        return value

    def sequence(self, entry: Entry, key: str) -> list[yaml.Node]:
        node = entry[1]
        if isinstance(node, yaml.ScalarNode) and node.value in ("", "null", "~"):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, key, "expected a list")
        return list(node.value)

    def node_spec(self, entry: Entry | None) -> NodeSpec:
        d = NodeSpec()
        if entry is None:
            return d
        m = self.mapping(entry[1], "node")
        p = "node."
        self.no_unknown(m, set(NodeSpec.__slots__), p)
        return NodeSpec(
            gpus=self.integer(m, "gpus", d.gpus, minimum=0, maximum=64, prefix=p),
            gpu_name=self.string(m, "gpu_name", d.gpu_name, prefix=p),
            gpu_memory_bytes=self.number(m, "gpu_memory_bytes", d.gpu_memory_bytes, minimum=1e9, maximum=1e13, prefix=p),
            gpu_max_sm_clock_hertz=self.number(m, "gpu_max_sm_clock_hertz", d.gpu_max_sm_clock_hertz, minimum=1e8, maximum=1e10, prefix=p),
            gpu_power_limit_watts=self.number(m, "gpu_power_limit_watts", d.gpu_power_limit_watts, minimum=10, maximum=5000, prefix=p),
            gpu_idle_power_watts=self.number(m, "gpu_idle_power_watts", d.gpu_idle_power_watts, minimum=1, maximum=1000, prefix=p),
            nvlink_bytes_per_second=self.number(m, "nvlink_bytes_per_second", d.nvlink_bytes_per_second, minimum=0, maximum=1e13, prefix=p),
            pcie_bytes_per_second=self.number(m, "pcie_bytes_per_second", d.pcie_bytes_per_second, minimum=1e8, maximum=1e12, prefix=p),
            sm_active=self.boolean(m, "sm_active", d.sm_active, prefix=p),
            driver_version=self.string(m, "driver_version", d.driver_version, prefix=p),
            cpus=self.integer(m, "cpus", d.cpus, minimum=1, maximum=4096, prefix=p),
            memory_bytes=self.number(m, "memory_bytes", d.memory_bytes, minimum=1e9, maximum=1e15, prefix=p),
        )  # fmt: skip

    def tiers_spec(self, entry: Entry | None) -> tuple[TierSpec, ...]:
        defaults = {t.name: t for t in default_tiers()}
        if entry is None:
            return tuple(defaults.values())
        m = self.mapping(entry[1], "tiers")
        out: list[TierSpec] = []
        for name, (knode, vnode) in m.items():
            key = f"tiers.{name}"
            if not name or not set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_"):
                raise self.fail(knode, key, "tier names are lower-case letters, digits and '_'")
            d = defaults.get(name, defaults["hot"])
            t = self.mapping(vnode, key)
            p = key + "."
            self.no_unknown(t, set(TierSpec.__slots__) - {"name"}, p)
            device: str | None = d.device if name in defaults else f"sd{chr(97 + len(out))}"
            if "device" in t:
                dnode = t["device"][1]
                raw = self.scalar(dnode) if isinstance(dnode, yaml.ScalarNode) else 0
                if raw is not None and not isinstance(raw, str):
                    raise self.fail(dnode, p + "device", "expected a device name or null (NFS)")
                device = raw
            object_store = d.object_store if name in defaults else False
            if "object_store" in t:
                onode = t["object_store"][1]
                raw = self.scalar(onode) if isinstance(onode, yaml.ScalarNode) else None
                if not isinstance(raw, bool):
                    raise self.fail(onode, p + "object_store", "expected true or false")
                object_store = raw
            mount = self.string(
                t, "mountpoint", d.mountpoint if name in defaults else f"/mnt/{name}", prefix=p
            )
            if object_store:
                device = None
                if not mount.startswith("s3://"):
                    mount = f"s3://{name.replace('_', '-')}-sim"
            elif not mount.startswith("/"):
                raise self.fail(t["mountpoint"][1], p + "mountpoint", "expected an absolute path")
            out.append(
                TierSpec(
                    name=name,
                    mountpoint=mount,
                    device=device,
                    read_bytes_per_second=self.number(t, "read_bytes_per_second", d.read_bytes_per_second, minimum=1e5, maximum=1e13, prefix=p),
                    write_bytes_per_second=self.number(t, "write_bytes_per_second", d.write_bytes_per_second, minimum=1e5, maximum=1e13, prefix=p),
                    read_latency_seconds=self.number(t, "read_latency_seconds", d.read_latency_seconds, minimum=1e-6, maximum=10, prefix=p),
                    write_latency_seconds=self.number(t, "write_latency_seconds", d.write_latency_seconds, minimum=1e-6, maximum=10, prefix=p),
                    request_bytes=self.number(t, "request_bytes", d.request_bytes, minimum=512, maximum=1 << 30, prefix=p),
                    capacity_bytes=self.number(t, "capacity_bytes", d.capacity_bytes, minimum=1e9, maximum=1e18, prefix=p),
                    free_ratio=self.number(t, "free_ratio", d.free_ratio, minimum=0.05, maximum=1.0, prefix=p),
                    background_read_bytes_per_second=self.number(t, "background_read_bytes_per_second", d.background_read_bytes_per_second, minimum=0, maximum=1e13, prefix=p),
                    background_write_bytes_per_second=self.number(t, "background_write_bytes_per_second", d.background_write_bytes_per_second, minimum=0, maximum=1e13, prefix=p),
                    object_store=object_store,
                )
            )  # fmt: skip
        if not out:
            raise self.fail(entry[1], "tiers", "at least one tier is needed")
        return tuple(out)

    def ports_spec(self, entry: Entry | None) -> tuple[PortSpec, ...]:
        if entry is None:
            return default_ports()
        out: list[PortSpec] = []
        for i, item in enumerate(self.sequence(entry, "fabric")):
            key = f"fabric[{i}]"
            m = self.mapping(item, key)
            p = key + "."
            self.no_unknown(
                m,
                {
                    "device",
                    "fabric",
                    "port",
                    "speed_bytes_per_second",
                    "transmit_wait",
                    "shaped_rate_bytes_per_second",
                },
                p,
            )
            if "device" not in m:
                raise self.fail(item, key, "missing key: device")
            fabric = self.choice(m, "fabric", "ethernet", FABRICS, prefix=p)
            port = (
                self.string(m, "port", "1" if fabric != "ethernet" else "", prefix=p)
                if "port" in m or fabric != "ethernet"
                else ""
            )
            out.append(
                PortSpec(
                    device=self.string(m, "device", "", prefix=p),
                    fabric=fabric,
                    port=port or None,
                    speed_bytes_per_second=self.number(m, "speed_bytes_per_second", 12.5e9, minimum=1e6, maximum=1e13, prefix=p),
                    counts_transmit_wait=self.boolean(m, "transmit_wait", fabric != "ethernet", prefix=p),
                    shaped_rate_bytes_per_second=(
                        self.number(m, "shaped_rate_bytes_per_second", 0.0, minimum=1e3, maximum=1e13, prefix=p)
                        if "shaped_rate_bytes_per_second" in m else None
                    ),
                )
            )  # fmt: skip
        return tuple(out)

    def jobs_spec(
        self, entry: Entry | None, node: NodeSpec, tiers: set[str]
    ) -> tuple[JobSpec, ...]:
        if entry is None:
            return ()
        out: list[JobSpec] = []
        held: dict[int, str] = {}
        for i, item in enumerate(self.sequence(entry, "jobs")):
            key = f"jobs[{i}]"
            m = self.mapping(item, key)
            p = key + "."
            known = {"id", "name", "scheduler", "gpus", "data_tier", "checkpoint_tier", "sdk",
                     "data_read_bytes_per_second", "steps_per_second", "steps_per_epoch", "phases",
                     "serving", "collectives"}  # fmt: skip
            self.no_unknown(m, known, p)
            for required in ("id", "gpus", "phases"):
                if required not in m:
                    raise self.fail(item, key, f"missing key: {required}")
            job_id = self.string(m, "id", "", prefix=p)
            if not job_id or len(job_id) > 128:
                raise self.fail(
                    m["id"][1], p + "id", "expected a non-empty id of at most 128 characters"
                )
            if any(j.job_id == job_id for j in out):
                raise self.fail(m["id"][1], p + "id", f"job id {job_id!r} is used twice")
            gpus: list[int] = []
            for g in self.sequence(m["gpus"], p + "gpus"):
                value = self.scalar(g) if isinstance(g, yaml.ScalarNode) else None
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int)
                    or not 0 <= value < node.gpus
                ):
                    raise self.fail(
                        g, p + "gpus", f"expected a GPU index 0..{node.gpus - 1}, got {_show(g)}"
                    )
                if value in held:
                    raise self.fail(
                        g, p + "gpus", f"GPU {value} is already held by job {held[value]!r}"
                    )
                held[value] = job_id
                gpus.append(value)
            if not gpus:
                raise self.fail(m["gpus"][1], p + "gpus", "a job needs at least one GPU")
            data_tier = self.tier_ref(m, "data_tier", tiers, p)
            ckpt_tier = self.tier_ref(m, "checkpoint_tier", tiers, p)
            phases = self.phases_spec(m["phases"], p + "phases", tuple(gpus), tiers)
            serving = self.choice(m, "serving", "", ("", *SERVING_STACKS), prefix=p)
            if not serving and any(ph.phase == _C.LOW_DEMAND for ph in phases):
                raise self.fail(
                    m["phases"][1],
                    p + "phases",
                    "a low_demand phase needs a serving job (serving:)",
                )
            out.append(
                JobSpec(
                    job_id=job_id,
                    name=self.string(m, "name", job_id, prefix=p)[:128],
                    scheduler=self.choice(m, "scheduler", "slurm", SCHEDULERS, prefix=p),
                    gpus=tuple(gpus),
                    data_tier=data_tier,
                    checkpoint_tier=ckpt_tier,
                    sdk=self.boolean(m, "sdk", True, prefix=p),
                    data_read_bytes_per_second=self.number(m, "data_read_bytes_per_second", 0.0, minimum=0, maximum=1e13, prefix=p),
                    steps_per_second=self.number(m, "steps_per_second", 1.5, minimum=0.001, maximum=1e4, prefix=p),
                    steps_per_epoch=self.integer(m, "steps_per_epoch", 300, minimum=1, maximum=10**9, prefix=p),
                    phases=phases,
                    serving=serving,
                    collectives=self.choice(m, "collectives", COLLECTIVE_GUISES[0], COLLECTIVE_GUISES, prefix=p),
                )
            )  # fmt: skip
        return tuple(out)

    def tier_ref(self, m: Mapping_, key: str, tiers: set[str], p: str) -> str:
        if key not in m:
            fallback = "warm" if key == "data_tier" else "hot"
            if fallback not in tiers:
                fallback = sorted(tiers)[0]
            return fallback
        name = self.string(m, key, "", prefix=p)
        if name not in tiers:
            raise self.fail(
                m[key][1], p + key, f"unknown tier {name!r} (tiers: {', '.join(sorted(tiers))})"
            )
        return name

    def phases_spec(
        self, entry: Entry, key: str, gpus: tuple[int, ...], tiers: set[str]
    ) -> tuple[PhaseSpec, ...]:
        out: list[PhaseSpec] = []
        for i, item in enumerate(self.sequence(entry, key)):
            k = f"{key}[{i}]"
            m = self.mapping(item, k)
            p = k + "."
            self.no_unknown(m, {"phase", "seconds", "guise", "tier", "gpu", "reason"}, p)
            for required in ("phase", "seconds"):
                if required not in m:
                    raise self.fail(item, k, f"missing key: {required}")
            phase = self.choice(m, "phase", "", PHASES, prefix=p)
            guise = ""
            if phase in GUISES:
                guise = self.choice(m, "guise", GUISES[phase][0], GUISES[phase], prefix=p)
            elif "guise" in m:
                raise self.fail(m["guise"][1], p + "guise", f"phase {phase} has no guises")
            tier = ""
            if "tier" in m:
                if phase not in ("data_loading", "checkpointing", "startup"):
                    raise self.fail(
                        m["tier"][1],
                        p + "tier",
                        "only data_loading, checkpointing and startup take a tier",
                    )
                tier = self.string(m, "tier", "", prefix=p)
                if tier not in tiers:
                    raise self.fail(
                        m["tier"][1],
                        p + "tier",
                        f"unknown tier {tier!r} (tiers: {', '.join(sorted(tiers))})",
                    )
            gpu = -1
            if "gpu" in m:
                if phase != "gpu_error":
                    raise self.fail(m["gpu"][1], p + "gpu", "only gpu_error takes a gpu")
                gpu = self.integer(m, "gpu", -1, minimum=0, maximum=4096, prefix=p)
                if gpu not in gpus:
                    raise self.fail(
                        m["gpu"][1],
                        p + "gpu",
                        f"GPU {gpu} is not one of the job's GPUs {list(gpus)}",
                    )
            reason = ""
            if phase == "throttling":
                reason = self.choice(m, "reason", "hw_slowdown", THROTTLE_REASONS, prefix=p)
            elif "reason" in m:
                raise self.fail(m["reason"][1], p + "reason", "only throttling takes a reason")
            seconds = self.number(m, "seconds", 0.0, minimum=1.0, maximum=30 * 86400, prefix=p)
            out.append(PhaseSpec(phase, seconds, guise, tier, gpu, reason))
        if not out:
            raise self.fail(entry[1], key, "a job needs at least one phase")
        return tuple(out)

    def events_spec(
        self, entry: Entry | None, node: NodeSpec, tiers: set[str], jobs: tuple[JobSpec, ...]
    ) -> tuple[EventSpec, ...]:
        if entry is None:
            return ()
        out: list[EventSpec] = []
        job_ids = {j.job_id for j in jobs}
        for i, item in enumerate(self.sequence(entry, "events")):
            k = f"events[{i}]"
            m = self.mapping(item, k)
            p = k + "."
            self.no_unknown(m, {"kind", "at", "seconds", "tier", "job", "gpus", "reason"}, p)
            for required in ("kind", "at", "seconds"):
                if required not in m:
                    raise self.fail(item, k, f"missing key: {required}")
            kind = self.choice(m, "kind", "", EVENT_KINDS, prefix=p)
            at = self.number(m, "at", 0.0, minimum=0.0, maximum=30 * 86400, prefix=p)
            seconds = self.number(m, "seconds", 0.0, minimum=1.0, maximum=30 * 86400, prefix=p)
            tier = job = ""
            gpus: tuple[int, ...] = ()
            reason = "hw_thermal_slowdown"
            if kind == "busy_tier":
                if "tier" not in m:
                    raise self.fail(item, k, "missing key: tier")
                tier = self.string(m, "tier", "", prefix=p)
                if tier not in tiers:
                    raise self.fail(m["tier"][1], p + "tier", f"unknown tier {tier!r}")
            else:
                if "job" in m:
                    job = self.string(m, "job", "", prefix=p)
                    if job not in job_ids:
                        raise self.fail(m["job"][1], p + "job", f"unknown job {job!r}")
                elif kind == "dip":
                    raise self.fail(item, k, "missing key: job")
                if kind == "thermal":
                    if "gpus" in m:
                        gl: list[int] = []
                        for g in self.sequence(m["gpus"], p + "gpus"):
                            v = self.scalar(g) if isinstance(g, yaml.ScalarNode) else None
                            if (
                                isinstance(v, bool)
                                or not isinstance(v, int)
                                or not 0 <= v < node.gpus
                            ):
                                raise self.fail(
                                    g, p + "gpus", f"expected a GPU index 0..{node.gpus - 1}"
                                )
                            gl.append(v)
                        gpus = tuple(gl)
                    if not job and not gpus:
                        raise self.fail(item, k, "a thermal event needs `job` or `gpus`")
                    reason = self.choice(
                        m, "reason", "hw_thermal_slowdown", THERMAL_REASONS, prefix=p
                    )
                if kind == "dip" and seconds > MAX_DIP_SECONDS:
                    raise self.fail(
                        m["seconds"][1],
                        p + "seconds",
                        f"a dip longer than {MAX_DIP_SECONDS:g} s is not a confounder: make it a phase",
                    )
            out.append(EventSpec(kind, at, seconds, tier, job, gpus, reason))
        return tuple(out)


def describe(s: Scenario) -> dict[str, Any]:
    """A short summary (for logs): jobs, their GPUs and the cycle length."""
    return {
        "name": s.name,
        "cycle_seconds": s.cycle_seconds,
        "jobs": {j.job_id: list(j.gpus) for j in s.jobs},
        "idle_gpus": [g for g in range(s.node.gpus) if all(g not in j.gpus for j in s.jobs)],
    }
