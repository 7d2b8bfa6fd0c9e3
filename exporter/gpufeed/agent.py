"""`gpufeed agent`: the node agent. Flags, wiring, and the serve loop.

Wiring order: config -> collectors (real host ones, or the simulated node) -> sampler
(with the correlator as a processor and the recorder as a sink) -> HTTP server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufeed.collectors import available
from gpufeed.collectors.base import Collector, CollectorContext, HostPaths
from gpufeed.config import AgentConfig, ConfigError, load_config
from gpufeed.gpu.select import BACKEND_KINDS
from gpufeed.sampler import Sampler
from gpufeed.snapshot import Processor, Sink

log = logging.getLogger("gpufeed.agent")

DEFAULT_PORT = 9842
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
SIMULATED_BANNER = "SIMULATED NODE: every value on this page is generated, not measured."


class UsageError(Exception):
    """Bad flags or config: printed as one line, exit status 2."""


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "agent",
        help="run the node agent (serves /metrics)",
        description=(
            "Run the gpufeed node agent. It samples GPUs (NVML), storage tiers, network "
            "fabric, host CPU/pressure and jobs every interval in the background and serves "
            "the latest snapshot on /metrics for Prometheus, plus /healthz."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file (interval, tiers, ...)")
    p.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve /metrics on; {DEFAULT_PORT} is used by no well-known exporter",
    )
    p.add_argument("--path.procfs", dest="procfs", default="/proc", help="procfs mount point")
    p.add_argument("--path.sysfs", dest="sysfs", default="/sys", help="sysfs mount point")
    p.add_argument(
        "--path.rootfs",
        dest="rootfs",
        default="/",
        help="host root filesystem (for statfs of mounts when running in a container)",
    )
    p.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity",
    )
    p.add_argument(
        "--gpu.backend",
        dest="gpu_backend",
        choices=BACKEND_KINDS,
        default="auto",
        help=(
            "where GPU metrics come from: auto (NVML if a driver is present, else no GPU "
            "collector, one log line), nvml (NVML or exit with an error), simulated, off"
        ),
    )
    p.add_argument(
        "--otlp.endpoint",
        dest="otlp_endpoint",
        metavar="URL",
        help="also push every metric as OTLP/HTTP to this URL (e.g. http://collector:4318/v1/metrics)",
    )
    p.add_argument(
        "--otlp.interval",
        dest="otlp_interval",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how often to push OTLP",
    )
    group = p.add_argument_group(
        "collectors", "switch each collector on or off (--collector.NAME / --no-collector.NAME)"
    )
    for spec in available():
        group.add_argument(
            f"--collector.{spec.name}",
            dest=f"collector_{spec.name}",
            action=argparse.BooleanOptionalAction,
            default=spec.default_enabled,
            help=spec.help,
        )
    p.set_defaults(func=run)


def parse_listen_address(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise UsageError(f"--web.listen-address {value!r}: expected HOST:PORT, e.g. 0.0.0.0:9842")
    port = int(port_text)
    if not 0 < port < 65536:
        raise UsageError(f"--web.listen-address {value!r}: port must be 1..65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, port


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)r",
        stream=sys.stderr,
    )


@dataclass
class AgentParts:
    """Everything the agent runs, built from flags and config before anything starts."""

    config: AgentConfig
    collectors: list[Collector] = field(default_factory=list)
    processors: list[Processor] = field(default_factory=list)
    sinks: list[Sink] = field(default_factory=list)
    banner: str = ""
    routes: list[Any] = field(default_factory=list)


def build_parts(args: argparse.Namespace) -> AgentParts:
    config = load_config(args.config)
    paths = HostPaths(Path(args.procfs), Path(args.sysfs), Path(args.rootfs))
    ctx = CollectorContext(paths=paths, config=config)
    parts = AgentParts(config=config)
    for spec in available():
        if getattr(args, f"collector_{spec.name}", spec.default_enabled):
            parts.collectors.append(spec.factory(ctx))
    gpu = _gpu_collector(args)
    if gpu is not None:
        parts.collectors.append(gpu)
    if args.otlp_endpoint:
        from gpufeed.otlp import OtlpSink

        parts.sinks.append(OtlpSink(args.otlp_endpoint, push_interval_seconds=args.otlp_interval))
    return parts


def _gpu_collector(args: argparse.Namespace) -> Collector | None:
    from gpufeed.collectors.gpu import build_gpu_collector
    from gpufeed.gpu.nvml import NvmlUnavailable

    try:
        collector, reason = build_gpu_collector(args.gpu_backend)
    except NvmlUnavailable as exc:
        raise UsageError(f"--gpu.backend=nvml: {exc}") from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    log.info("%s", reason)
    return collector


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        host, port = parse_listen_address(args.listen_address)
        parts = build_parts(args)
    except (UsageError, ConfigError) as exc:
        print(f"gpufeed agent: error: {exc}", file=sys.stderr)
        return 2
    if parts.banner:
        log.warning("%s", parts.banner)
    sampler = Sampler(
        parts.collectors,
        interval_seconds=parts.config.interval_seconds,
        timeout_seconds=parts.config.effective_timeout_seconds,
        processors=parts.processors,
        sinks=parts.sinks,
        banner=parts.banner,
    )
    try:
        return asyncio.run(_serve(sampler, parts, host, port))
    except OSError as exc:
        print(f"gpufeed agent: error: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1


async def _serve(sampler: Sampler, parts: AgentParts, host: str, port: int) -> int:
    from aiohttp import web

    from gpufeed.server import build_app

    app = build_app(sampler, banner=parts.banner, extra_routes=parts.routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sampler.start()
    names = ", ".join(c.name for c in parts.collectors) or "none"
    log.info("listening on http://%s:%d/metrics, collectors: %s", host, port, names)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await runner.cleanup()
    await asyncio.to_thread(sampler.stop)
    return 0
