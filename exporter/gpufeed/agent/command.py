"""`gpufeed agent`: the node agent. Flags, wiring, and the serve loop.

Wiring order: config -> collectors (real host ones, or the simulated node) -> sampler
(with the correlator as a processor and the recorder as a sink) -> HTTP server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpufeed.agent.sampler import Sampler
from gpufeed.agent.sdnotify import ServiceNotifier
from gpufeed.agent.signals import early_handlers, on_hup, on_usr1
from gpufeed.agent.wiring import (
    COLLECTORS,
    Wiring,
    build_collectors,
    simulated_gpus,
    simulated_node_collectors,
)
from gpufeed.collectors.base import Collector, CollectorContext
from gpufeed.config import (
    DEFAULT_SDK_SOCKET,
    AgentConfig,
    ConfigError,
    SdkConfig,
    load_config,
)
from gpufeed.gpu.select import BACKEND_KINDS
from gpufeed.hostpaths import HostPaths
from gpufeed.snapshot import Processor, Sink
from gpufeed.statepaths import RunStateDir, is_production_path, simulated_config
from gpufeed.web.flags import (
    ListenError,
    WebFlagError,
    WebSettings,
    add_web_flags,
    bind_listen_socket,
    web_settings,
)

log = logging.getLogger("gpufeed.agent.command")

DEFAULT_PORT = 9842
SIMULATED_BANNER = "SIMULATED NODE: every value on this page is generated, not measured."


class UsageError(Exception):
    """Bad flags or config: printed as one line, exit status 2."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default, except "None" (the help text says what no value means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "agent",
        help="run the node agent (serves /metrics)",
        description=(
            "Run the gpufeed node agent. It samples GPUs (NVML), storage tiers, network "
            "fabric, host CPU/pressure and jobs every interval in the background and serves "
            "the latest snapshot on /metrics for Prometheus, plus /healthz."
        ),
        formatter_class=_HelpFormatter,
    )
    _add_config_flag(p)
    add_web_flags(
        p,
        default_port=DEFAULT_PORT,
        listen_help=f"address to serve /metrics on; {DEFAULT_PORT} is used by no well-known exporter",
    )
    _add_node_flags(p)
    _add_gpu_flags(p)
    _add_output_flags(p)
    _add_collector_switches(p)
    p.set_defaults(func=run)


def _add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help=(
            "YAML config file (every key, its default and meaning: docs/configuration.md, "
            "or `python -m gpufeed.config_reference`); without it, the defaults"
        ),
    )


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    """This node's name, where its host filesystems are, and how much it logs."""
    p.add_argument(
        "--instance",
        metavar="NAME",
        help=(
            "this node's name in recorded traces, windows (log and /api/windows) and OTLP "
            "(service.instance.id); default: the config's instance, else HOSTNAME:PORT of "
            "the listen address, as a static Prometheus target names it (docs/correlator.md)"
        ),
    )
    p.add_argument(
        "--path.procfs", dest="procfs", default="/proc", metavar="DIR", help="procfs mount point"
    )
    p.add_argument(
        "--path.sysfs", dest="sysfs", default="/sys", metavar="DIR", help="sysfs mount point"
    )
    p.add_argument(
        "--path.rootfs",
        dest="rootfs",
        default="/",
        metavar="DIR",
        help=(
            "host root filesystem, under which mount points are statfs'd and tier paths "
            "resolved (a container mounts the host's / here)"
        ),
    )
    p.add_argument(
        "--log.level",
        dest="log_level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity",
    )


def _add_gpu_flags(p: argparse.ArgumentParser) -> None:
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
        "--simulate",
        nargs="?",
        const="",
        default=None,
        metavar="SCENARIO.yaml",
        help=(
            "run a SIMULATED GPU node instead of reading this host (the built-in scenario "
            "when no file is given); every page then carries a SIMULATED banner"
        ),
    )
    p.add_argument(
        "--simulate.pace",
        dest="simulate_pace",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="run the scenario's timeline this many times faster than real time",
    )
    p.add_argument(
        "--simulate.seed",
        dest="simulate_seed",
        type=int,
        default=1,
        metavar="N",
        help="seed of the simulated node's noise: the same seed gives the same values",
    )


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--record",
        metavar="FILE.om",
        help=(
            "also write every sample to FILE.om as OpenMetrics with timestamps (the trace "
            "format `gpufeed analyze` reads); finalized on clean shutdown; off without it"
        ),
    )
    p.add_argument(
        "--sdk.socket",
        dest="sdk_socket",
        metavar="PATH",
        help=(
            "Unix datagram socket for the training-loop SDK (default: the config's "
            f"sdk.socket_path, {DEFAULT_SDK_SOCKET})"
        ),
    )
    p.add_argument(
        "--otlp.endpoint",
        dest="otlp_endpoint",
        metavar="URL",
        help=(
            "also push every metric as OTLP/HTTP to this URL "
            "(e.g. http://collector:4318/v1/metrics); off without it"
        ),
    )
    p.add_argument(
        "--otlp.interval",
        dest="otlp_interval",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how often to push OTLP",
    )


def _add_collector_switches(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "collectors", "switch each collector on or off (--collector.NAME / --no-collector.NAME)"
    )
    switches = [(spec.name, spec.help, spec.default_enabled) for spec in COLLECTORS]
    # not a collector: a processor of every snapshot, switched like one
    switches.append(
        ("correlator", "underutilization windows and their causes (live correlator)", True)
    )
    for name, help_, default in switches:
        group.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=default,
            help=help_,
        )


def node_instance(flag: str | None, configured: str, port: int) -> str:
    """The one name of this node everywhere the agent names it (see `--instance`).

    The default is HOSTNAME:PORT because that is how a static Prometheus target is written
    (`node-07:9842`), so out of the box live windows, traces and Prometheus' `instance`
    agree, and two agents on one host (a simulated one beside a real one) stay apart.
    """
    return flag or configured or f"{socket.gethostname()}:{port}"


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
    run_dir: RunStateDir = field(default_factory=RunStateDir)  # a simulated node's state
    loaded: AgentConfig | None = None  # the config file as read (SIGHUP compares with it)


def is_simulated(args: argparse.Namespace) -> bool:
    return args.simulate is not None or args.gpu_backend == "simulated"


def build_parts(
    args: argparse.Namespace, port: int, loaded: AgentConfig | None = None
) -> AgentParts:
    """`port`: the port the agent listens on, for the default instance name; `loaded`:
    the config file already read (run() reads it before binding the port)."""
    config = loaded = loaded if loaded is not None else load_config(args.config)
    config = replace(config, instance=node_instance(args.instance, config.instance, port))
    run_dir = RunStateDir()
    if is_simulated(args):
        # a simulated node never writes where a real agent keeps its state (statepaths)
        config = simulated_config(config, run_dir)
        if args.sdk_socket and is_production_path(args.sdk_socket):
            args.sdk_socket = config.sdk.socket_path
    paths = HostPaths(Path(args.procfs), Path(args.sysfs), Path(args.rootfs))
    ctx = CollectorContext(paths=paths, config=config)
    parts = AgentParts(config=config, run_dir=run_dir, loaded=loaded)
    try:
        _add_parts(args, ctx, parts)
    except BaseException:
        # What was already opened (NVML, the SDK socket, a spool) is released before exit.
        close_parts(parts)
        raise
    return parts


def close_parts(parts: AgentParts) -> None:
    """Closes what `build_parts` opened, for when the agent stops before its sampler exists."""
    named: list[Processor | Sink | Collector] = [*parts.processors, *parts.sinks, *parts.collectors]
    for part in named:
        close = getattr(part, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception:
            log.exception("closing %s failed", part.name)
    parts.run_dir.remove()


def _add_parts(args: argparse.Namespace, ctx: CollectorContext, parts: AgentParts) -> None:
    if args.simulate is not None:
        _add_simulated_node(args, parts)
    else:
        _add_host_collectors(args, ctx, parts)
    if args.collector_correlator:
        _add_correlator(args, parts)
    if args.record:
        _add_recorder(args.record, parts)
    if args.otlp_endpoint:
        _add_otlp(args.otlp_endpoint, args.otlp_interval, parts)


def _add_simulated_node(args: argparse.Namespace, parts: AgentParts) -> None:
    """--simulate: the simulated node replaces every real collector, and says so everywhere."""
    try:
        parts.collectors.extend(
            simulated_node_collectors(
                args.simulate or None, seed=args.simulate_seed, pace=args.simulate_pace
            )
        )
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise UsageError(str(exc)) from exc
    parts.banner = SIMULATED_BANNER
    scenario = args.simulate or "the built-in scenario"
    log.info("simulated node from %s at pace %g", scenario, args.simulate_pace)
    # the config as written (a simulated node's own socket path is not the user's setting)
    written = parts.loaded or parts.config
    if args.sdk_socket or written.sdk != SdkConfig():
        # the simulated node has no real jobs to listen to: say so rather than leave a
        # user waiting for SDK series that never come
        log.warning(
            "--simulate: the SDK socket is not opened; --sdk.socket and the sdk: config are ignored"
        )


def _add_host_collectors(
    args: argparse.Namespace, ctx: CollectorContext, parts: AgentParts
) -> None:
    """This host's collectors, as the registration table (gpufeed.agent.wiring) builds them."""
    from gpufeed.gpu.nvml import NvmlUnavailable

    wiring = Wiring(ctx, gpu_backend=args.gpu_backend, sdk_socket=args.sdk_socket)
    if args.gpu_backend == "simulated" and args.collector_gpu:
        # Only the GPUs are simulated (fixtures and demos); --simulate replaces the whole node.
        wiring.simulated_gpus = simulated_gpus(
            args.simulate or None, seed=args.simulate_seed, pace=args.simulate_pace
        )
    if args.gpu_backend == "simulated":
        parts.banner = SIMULATED_BANNER
    try:
        built = build_collectors(wiring, lambda name: bool(getattr(args, f"collector_{name}")))
    except NvmlUnavailable as exc:
        raise UsageError(f"--gpu.backend=nvml: {exc}") from exc
    parts.collectors.extend(built)


def _add_correlator(args: argparse.Namespace, parts: AgentParts) -> None:
    from gpufeed.correlator.feeds.live import CorrelatorProcessor
    from gpufeed.correlator.outputs.api import windows_routes
    from gpufeed.correlator.outputs.windowlog import WindowLogInUse

    config = parts.config
    try:
        correlator = CorrelatorProcessor(
            config.correlator,
            interval_seconds=config.interval_seconds,
            instance=config.instance,
            simulated=is_simulated(args),
            # a whole simulated node plays its scenario at this pace (see pacing)
            pace=args.simulate_pace if args.simulate is not None else 1.0,
        )
    except WindowLogInUse as exc:
        raise UsageError(str(exc)) from exc
    if parts.run_dir.path and config.correlator.windows_log:
        log.info("simulated node: windows log %s (this run only)", config.correlator.windows_log)
    parts.processors.append(correlator)
    parts.routes.extend(windows_routes(correlator, simulated=bool(parts.banner)))


def _add_recorder(path: str, parts: AgentParts) -> None:
    from gpufeed.trace.recorder import TraceRecorder

    try:
        parts.sinks.append(TraceRecorder(path, instance=parts.config.instance))
    except OSError as exc:
        raise UsageError(f"--record {path}: {exc.strerror or exc}") from exc


def _add_otlp(endpoint: str, interval_seconds: float, parts: AgentParts) -> None:
    from gpufeed.otlp import OtlpSink

    if interval_seconds <= 0:
        raise UsageError(f"--otlp.interval {interval_seconds:g}: must be positive")
    parts.sinks.append(
        OtlpSink(endpoint, push_interval_seconds=interval_seconds, instance=parts.config.instance)
    )


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    early_handlers()
    try:
        web = web_settings(args)  # bad files are reported whatever the port does
        config = load_config(args.config)
    except (WebFlagError, ConfigError) as exc:
        print(f"gpufeed agent: error: {exc}", file=sys.stderr)
        return 2
    try:
        listener = bind_listen_socket(web.host, web.port)
    except ListenError as exc:
        print(f"gpufeed agent: error: {exc}", file=sys.stderr)
        return 1
    try:
        parts = build_parts(args, listener.getsockname()[1], config)
    except (UsageError, ConfigError) as exc:
        listener.close()
        print(f"gpufeed agent: error: {exc}", file=sys.stderr)
        return 2
    except BaseException:
        listener.close()
        raise
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
        return asyncio.run(_serve(sampler, parts, listener, web, args.config))
    finally:
        # Closing removes the SDK socket file and finalizes the recording.
        sampler.stop()
        listener.close()
        parts.run_dir.remove()


async def _serve(
    sampler: Sampler,
    parts: AgentParts,
    listener: socket.socket,
    web: WebSettings,
    config_path: str | None,
) -> int:
    from gpufeed.agent.server import build_app
    from gpufeed.web.serve import serve

    app = build_app(sampler, banner=parts.banner, extra_routes=parts.routes)
    names = ", ".join(c.name for c in parts.collectors) or "none"
    serving = await serve(
        app,
        [listener],
        limits=web.limits,
        web_config=web.web_config,
        detail=f"collectors: {names}",
    )
    sampler.start()
    log.info("instance %s (traces, windows, OTLP)", parts.config.instance)
    # Type=notify and WatchdogSec= in the systemd unit; the watchdog's idea of progress is
    # the one /healthz answers with.
    systemd = ServiceNotifier.ready(lambda: not sampler.stall_reason(time.time()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # never the default action (death, leaving the SDK socket and the spool): agent_signals
    loop.add_signal_handler(signal.SIGHUP, on_hup, config_path, parts.loaded or parts.config)
    loop.add_signal_handler(signal.SIGUSR1, on_usr1, sampler, time.monotonic())
    await stop.wait()
    log.info("shutting down")
    systemd.stopping()
    await serving.close()
    return 0  # run() stops the sampler
