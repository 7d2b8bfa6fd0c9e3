"""Wiring: the one place the agent's collectors are built, from one registration table.

`COLLECTORS` lists every collector the agent has, in the order it runs and reports them;
each entry's name is its `--collector.NAME` switch. To add a collector: write it (one file
under collectors/), add its families to the catalogue, add one `CollectorSpec` here.

Collectors never hold references to each other. What one needs from another (the GPU
processes for "jobs", the storage tiers' devices for "job_io") flows through the sampler's
tick (`collectors.base.TickData`). The one thing shared is the SDK socket server: "jobs"
and "job_io" ask it which SDK job a process speaks for, so `Wiring` builds it once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpufeed.collectors.base import Collector, CollectorContext
from gpufeed.gpu.backend import GpuBackend
from gpufeed.gpu.select import BackendKind

if TYPE_CHECKING:
    from gpufeed.collectors.sdk import SdkCollector

log = logging.getLogger("gpufeed.agent.wiring")


@dataclass(slots=True)
class Wiring:
    """What building the collectors needs: the host, the config and the agent's options."""

    context: CollectorContext = field(default_factory=CollectorContext)
    gpu_backend: BackendKind = "auto"
    simulated_gpus: Callable[[], GpuBackend] | None = None  # --gpu.backend=simulated
    sdk_socket: str | None = None  # --sdk.socket, over the config's sdk.socket_path
    _sdk: SdkCollector | None = None

    def sdk(self) -> SdkCollector:
        """The SDK collector "sdk", "jobs" and "job_io" share (built once, not started)."""
        if self._sdk is None:
            from gpufeed.collectors.sdk import SdkCollector

            self._sdk = SdkCollector(self.context, self.sdk_socket)
        return self._sdk


@dataclass(frozen=True, slots=True)
class CollectorSpec:
    """One collector: its switch, and how it is built (None: nothing to collect here)."""

    name: str
    help: str
    build: Callable[[Wiring], Collector | None]
    default_enabled: bool = True


def _network(w: Wiring) -> Collector:
    from gpufeed.collectors.network import NetworkCollector
    from gpufeed.hostpaths import HostPaths
    from gpufeed.netlink.qdisc import read_shaped_rates

    cfg = w.context.config.network
    # Shaping is read over netlink from the agent's own namespace: only where the sysfs
    # read is that namespace's too (not a fixture tree or another root's /sys).
    own_sysfs = w.context.paths.sysfs == HostPaths().sysfs
    return NetworkCollector(
        w.context.paths,
        include_virtual=cfg.include_virtual,
        xmit_wait_tick_bytes=cfg.xmit_wait_tick_bytes,
        shaped_rates=read_shaped_rates if own_sysfs else None,
    )


def _host(w: Wiring) -> Collector:
    from gpufeed.collectors.host import HostCollector

    return HostCollector(w.context.paths)


def _storage(w: Wiring) -> Collector:
    from gpufeed.collectors.storage import StorageCollector

    return StorageCollector(w.context)


def _gpu(w: Wiring) -> Collector | None:
    """Raises gpu.nvml.NvmlUnavailable only for --gpu.backend=nvml without NVML."""
    from gpufeed.collectors.gpu import build_gpu_collector

    collector, reason = build_gpu_collector(w.gpu_backend, simulated=w.simulated_gpus)
    log.info("%s", reason)
    return collector


def _sdk(w: Wiring) -> Collector:
    sdk = w.sdk()
    try:
        sdk.start()
    except OSError as exc:
        # The rest of the agent is still worth serving; the SDK series are just absent.
        log.error("SDK socket: %s; SDK metrics are off", exc)
    return sdk


def _jobs(w: Wiring) -> Collector:
    from gpufeed.collectors.jobs import JobsCollector

    return JobsCollector(w.context, w.sdk().job_for_pid)


def _job_io(w: Wiring) -> Collector:
    from gpufeed.collectors.job_io import JobIoCollector

    sdk = w.sdk()
    return JobIoCollector(w.context, sdk.pids_by_job, sdk.final_io_by_job, sdk.object_bytes_by_job)


def _job_cache(w: Wiring) -> Collector:
    from gpufeed.collectors.job_cache import JobCacheCollector

    return JobCacheCollector(w.context, w.sdk().pids_by_job)


def _gds(w: Wiring) -> Collector:
    from gpufeed.collectors.gds import GdsCollector

    return GdsCollector(w.context.paths)


def _job_cpu(w: Wiring) -> Collector:
    from gpufeed.collectors.job_cpu import JobCpuCollector

    return JobCpuCollector(w.context, w.sdk().pids_by_job)


def _fabric(w: Wiring) -> Collector:
    from gpufeed.collectors.fabric import FabricCollector

    return FabricCollector(w.context, w.sdk().pids_by_job)


def _serving(w: Wiring) -> Collector:
    from gpufeed.collectors.serving import ServingCollector

    return ServingCollector(w.context, w.sdk().serving_by_job)


COLLECTORS: tuple[CollectorSpec, ...] = (
    CollectorSpec(
        "network",
        "netdev bytes and link speed; InfiniBand/RoCE port bytes, speed, transmit wait",
        _network,
    ),
    CollectorSpec(
        "host",
        "CPU seconds by mode, logical CPUs, pressure stall information, MemAvailable",
        _host,
    ),
    CollectorSpec(
        "storage",
        "per-tier I/O counters (diskstats, NFS mountstats) and capacity (statfs)",
        _storage,
    ),
    CollectorSpec("gds", "GPUDirect Storage I/O (/proc/driver/nvidia-fs/stats)", _gds),
    CollectorSpec("gpu", "GPU metrics (NVML or simulated; see --gpu.backend)", _gpu),
    CollectorSpec("sdk", "per-job phases, steps, checkpoints and epochs from the SDK socket", _sdk),
    CollectorSpec("jobs", "which job holds which GPU (gpufeed_job_info)", _jobs),
    CollectorSpec(
        "job_io",
        "per-job bytes read and written per storage tier (cgroup io accounting)",
        _job_io,
    ),
    CollectorSpec(
        "job_cpu",
        "per-job CPU time, CPU-quota throttling (cgroup cpu.stat), run-queue wait (schedstat)",
        _job_cpu,
    ),
    CollectorSpec(
        "job_cache",
        "per-job page-cache hits (/proc/PID/io) and open files' residency (cachestat)",
        _job_cache,
    ),
    CollectorSpec(
        "fabric",
        "round-trip time and jitter per peer node of the GPU jobs' TCP connections (sock_diag)",
        _fabric,
    ),
    CollectorSpec(
        "serving",
        "inference servers' demand: requests waiting and running, KV cache (vLLM, Triton, TGI)",
        _serving,
    ),
)


def spec(name: str) -> CollectorSpec:
    """The registration of collector `name`."""
    for s in COLLECTORS:
        if s.name == name:
            return s
    raise KeyError(f"no collector {name!r} in gpufeed.agent.wiring.COLLECTORS")


def build_collectors(wiring: Wiring, enabled: Callable[[str], bool]) -> list[Collector]:
    """Every collector `enabled(name)` switches on, in table order. On an error, what was
    already built is closed before it propagates."""
    built: list[Collector] = []
    try:
        for s in COLLECTORS:
            if enabled(s.name):
                collector = s.build(wiring)
                if collector is not None:
                    built.append(collector)
    except BaseException:
        close_all(built)
        raise
    return built


def simulated_node_collectors(scenario: str | None, seed: int, pace: float) -> list[Collector]:
    """--simulate: the simulated node's GPUs and the collector of everything else it plays;
    no real collector runs. Raises ValueError / ConfigError for a bad scenario or pace."""
    from gpufeed.collectors.gpu import build_gpu_collector
    from gpufeed.simulate import build_simulated_node

    backend, node_collectors, _ = build_simulated_node(scenario, seed=seed, pace=pace)
    gpu, _ = build_gpu_collector("simulated", simulated=lambda: backend)
    return [*([gpu] if gpu is not None else []), *node_collectors]


def simulated_gpus(scenario: str | None, seed: int, pace: float) -> Callable[[], GpuBackend]:
    """--gpu.backend=simulated alone: only the GPUs of a simulated node (fixtures, demos)."""
    from gpufeed.simulate import build_simulated_node

    backend, _, _ = build_simulated_node(scenario, seed=seed, pace=pace)
    return lambda: backend


def close_all(collectors: list[Collector]) -> None:
    for c in collectors:
        try:
            c.close()
        except Exception:
            log.exception("closing collector %s failed", c.name)
