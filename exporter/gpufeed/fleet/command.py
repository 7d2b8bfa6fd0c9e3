"""`gpufeed fleet`: flags, the HTTP face (/metrics, /api/windows, /healthz) and the loop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import socket
import sys
import threading
from typing import Any

from gpufeed import vocabulary
from gpufeed.config import ConfigError
from gpufeed.correlator.feeds import access
from gpufeed.web.flags import (
    ListenError,
    WebFlagError,
    WebSettings,
    add_web_flags,
    bind_listen_socket,
    web_settings,
)

DEFAULT_PORT = 9843

log = logging.getLogger("gpufeed.fleet")

DESCRIPTION = """\
The live, job-level view of a fleet, from the Prometheus-compatible TSDB the agents are
scraped into (Prometheus, VictoriaMetrics, Thanos, Mimir). Every cycle (--fleet.interval,
aligned to wall-clock multiples of it, so that replicas agree) it reads the last
--fleet.lookback of every node from the query API, runs the correlator over every node and
joins each job's nodes, then:
  - appends the windows that closed to its windows log (--fleet.windows-log), exactly once,
    also across restarts and kill -9 (a cursor is kept beside the log);
  - exports on /metrics the culprit of each held-back job with its cause, and each job's
    GPU-time ledger (allocated GPU-seconds by state, and in money with --ledger.price);
  - serves the windows on /api/windows.
It logs where it listens at start and one line for each cycle that fails (not one per
retry). Its HTTP endpoints take the agent's --web.* flags: TLS, client certificates and
basic auth from --web.config.file, the connection cap and timeouts (docs/security.md).
A cycle reports what ended at least --fleet.settle plus the time a window needs to be known
closed (about 90 s) before now. When the TSDB is slow or down, the cycle is retried and the
service catches up afterwards; gpufeed_fleet_lag_seconds says how far behind it is.
Any number of replicas may run; each needs its own windows log. See docs/fleet.md."""


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "fleet",
        help="live job-level view of a fleet from its Prometheus-compatible TSDB",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--prometheus.url", dest="url", required=True, metavar="URL", help="query API base URL")
    access.add_flags(a)
    a("--match", default="", help="extra selector for every query, e.g. '{cluster=\"a\"}'")
    a(
        "--fleet.interval",
        dest="interval",
        type=float,
        default=60.0,
        help="seconds per cycle (default %(default)g)",
    )
    a(
        "--fleet.lookback",
        dest="lookback",
        type=float,
        default=900.0,
        help="seconds of data each cycle analyses (baselines and long windows need more; "
        "the TSDB's cost grows with it; default %(default)g)",
    )
    a(
        "--fleet.step",
        dest="step",
        type=float,
        default=15.0,
        help="query resolution, seconds (default %(default)g)",
    )
    a(
        "--fleet.queries",
        dest="queries",
        type=int,
        default=vocabulary.DEFAULT_FLEET_QUERIES_IN_FLIGHT,
        help="range queries in flight at once (answers are decoded as they arrive, which "
        "holds Python's GIL: more only helps a TSDB whose every answer waits on a slow "
        "network; default %(default)s)",
    )
    a(
        "--fleet.settle",
        dest="settle",
        type=float,
        default=30.0,
        help="seconds the TSDB gets to ingest a boundary's scrapes before its cycle runs",
    )
    a(
        "--fleet.start",
        dest="start",
        default="",
        help="on the first start (no cursor yet), evaluate from this time (unix seconds or "
        "RFC 3339) instead of from now",
    )
    a(
        "--fleet.windows-log",
        dest="windows_log",
        default="/var/lib/gpufeed/fleet-windows.jsonl",
        help="durable windows log (its cursor is LOG.state.json; default %(default)s)",
    )
    a(
        "--fleet.once",
        dest="once",
        default="",
        metavar="TIME",
        help="evaluate the one cycle whose boundary is TIME (unix seconds or RFC 3339, a "
        "multiple of the interval), write its windows (every one that closed in its range, "
        'then those open at its end with "open": true) as JSON lines to stdout, and exit; '
        "nothing is logged or served",
    )
    a(
        "--fleet.until",
        dest="until",
        default="",
        metavar="TIME",
        help="run the cycles up to the one whose boundary is TIME, then exit (a backfill: "
        "with --fleet.start, one line per cycle on stderr)",
    )
    a("--output", "-o", metavar="FILE", help="with --fleet.once: write here, not to stdout")
    a("--ledger.price", dest="price", type=float, help="price per GPU-hour (for the money)")
    a("--ledger.currency", dest="currency", default="USD", help="currency label of the price")
    add_web_flags(
        p, default_port=DEFAULT_PORT, listen_help="address to serve /metrics and /api/windows on"
    )
    a(
        "--threshold",
        type=float,
        default=vocabulary.DEFAULT_THRESHOLD_RATIO,
        help="a GPU below this utilization (0..1) is underutilized (default %(default)g)",
    )
    a(
        "--min-window",
        type=float,
        default=vocabulary.DEFAULT_MIN_WINDOW_SECONDS,
        help="seconds underutilized before a window opens (default %(default)g)",
    )
    a(
        "--merge-gap",
        type=float,
        default=vocabulary.DEFAULT_MERGE_GAP_SECONDS,
        help="recoveries shorter than this stay inside the window (default %(default)g)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufeed.correlator.engine.engine import WindowParams
    from gpufeed.correlator.feeds.access import AccessError
    from gpufeed.correlator.feeds.promql import parse_time
    from gpufeed.fleet.memory import limit_malloc_arenas
    from gpufeed.fleet.metrics import Price
    from gpufeed.fleet.service import FleetSettings
    from gpufeed.fleet.timing import CycleTiming

    timing = CycleTiming(
        args.interval, args.lookback, args.step, args.settle, args.merge_gap, args.min_window
    )
    problem = timing.problem()
    if problem:
        return _fail(problem)
    if args.queries < 1:
        return _fail("--fleet.queries must be at least 1")
    if args.price is not None and not (math.isfinite(args.price) and args.price >= 0):
        return _fail("--ledger.price must be zero or a positive number")
    try:
        url = access.server_url(args.url, args)
        start = parse_time(args.start) if args.start else None
        until = parse_time(args.until) if args.until else None
    except (AccessError, ValueError) as e:
        return _fail(str(e))
    limit_malloc_arenas()  # before any thread: see fleet/memory.py
    if args.once:
        return _once(args.once, url, args.match, timing, args.threshold, args)
    logging.basicConfig(level=logging.INFO, format="gpufeed fleet: %(message)s")
    listening: tuple[socket.socket, WebSettings] | None = None
    if until is None:  # a backfill (--fleet.until) serves nothing
        # bound before the windows log is opened: a port in use leaves it untouched
        bound = _listen(args)
        if isinstance(bound, int):
            return bound
        listening = bound
    settings = FleetSettings(
        url=url,
        match=args.match,
        timing=timing,
        params=WindowParams(args.threshold, args.min_window, args.merge_gap),
        windows_log=args.windows_log,
        price=None if args.price is None else Price(args.price, args.currency),
        start_seconds=start,
        until_seconds=until,
        queries_in_flight=args.queries,
    )
    try:
        return _run_service(settings, listening)
    finally:
        if listening is not None:
            listening[0].close()


def _fail(msg: str, code: int = 2) -> int:
    print(f"gpufeed fleet: {msg}", file=sys.stderr)
    return code


def _listen(args: argparse.Namespace) -> tuple[socket.socket, WebSettings] | int:
    """The bound listening socket and the web settings, or the exit status of a bad flag,
    web config file (2) or listen address (1)."""
    try:
        settings = web_settings(args)
    except (WebFlagError, ConfigError) as e:
        return _fail(str(e))
    try:
        return bind_listen_socket(settings.host, settings.port), settings
    except ListenError as e:
        return _fail(str(e), 1)


def _run_service(settings: Any, listening: tuple[socket.socket, WebSettings] | None) -> int:
    """Runs the cycles: behind the HTTP face until stopped, or (`listening` None, a backfill
    with --fleet.until) up to the last cycle, with no HTTP face."""
    from gpufeed.correlator.outputs.windowlog import WindowLogInUse
    from gpufeed.fleet.service import FleetService
    from gpufeed.fleet.state import StateError

    try:
        service = FleetService(settings)
    except (WindowLogInUse, StateError) as e:
        return _fail(str(e), 1)
    except OSError as e:
        return _fail(f"--fleet.windows-log {settings.windows_log}: {e.strerror or e}", 1)
    try:
        if listening is None:
            service.run()  # exits after the cycle at `until`
            return 1 if service.healthy() else 0
        return asyncio.run(_serve(service, *listening))
    finally:
        service.close()


def _once(
    when: str, url: str, match: str, timing: Any, threshold: float, args: argparse.Namespace
) -> int:
    from gpufeed import strictjson
    from gpufeed.correlator.engine.engine import WindowParams
    from gpufeed.correlator.feeds.promql import PromError, parse_time
    from gpufeed.fleet.carry import FleetEngines
    from gpufeed.fleet.cycle import QUERY_RETRY, evaluate

    try:
        boundary = parse_time(when)
    except ValueError as e:
        print(f"gpufeed fleet: --fleet.once: {e}", file=sys.stderr)
        return 2
    if boundary % timing.interval_seconds:
        print("gpufeed fleet: --fleet.once must be a multiple of the interval", file=sys.stderr)
        return 2
    params = WindowParams(threshold, args.min_window, args.merge_gap)
    try:
        engines = FleetEngines(url, timing, params, match, QUERY_RETRY, args.queries)
        result = evaluate(engines, boundary)
    except (PromError, ValueError) as e:
        print(f"gpufeed fleet: {e}", file=sys.stderr)
        return 1
    out = [w.to_json() for w in result.range_closed]
    out += [{**w.to_json(), "open": True} for w in result.open]
    text = "".join(strictjson.dumps(d) + "\n" for d in out)
    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"gpufeed fleet: --output {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


async def _serve(service: Any, listener: socket.socket, settings: WebSettings) -> int:
    from aiohttp import web

    from gpufeed.correlator.outputs.api import windows_routes
    from gpufeed.web.pages import page_routes
    from gpufeed.web.serve import serve

    app = web.Application()
    app.add_routes(page_routes(lambda: service.page, service.healthy))
    app.add_routes(windows_routes(service))
    serving = await serve(app, [listener], limits=settings.limits, web_config=settings.web_config)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    worker = threading.Thread(target=service.run, name="fleet-cycles", daemon=True)
    worker.start()
    await done.wait()
    log.info("shutting down")
    service.stop()
    await asyncio.to_thread(worker.join)
    await serving.close()
    return 0
