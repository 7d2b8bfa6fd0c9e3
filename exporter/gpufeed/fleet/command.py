"""`gpufeed fleet`: flags, the HTTP face (/metrics, /api/windows, /healthz) and the loop."""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import threading
from typing import Any

from gpufeed import vocabulary
from gpufeed.correlator.feeds import access

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
    a("--web.listen-address", dest="listen", default=":9843", help="HOST:PORT (port 0: any)")
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
    from gpufeed.correlator.outputs.windowlog import WindowLogInUse
    from gpufeed.fleet.memory import limit_malloc_arenas
    from gpufeed.fleet.metrics import Price
    from gpufeed.fleet.service import FleetService, FleetSettings
    from gpufeed.fleet.state import StateError
    from gpufeed.fleet.timing import CycleTiming

    def fail(msg: str, code: int = 2) -> int:
        print(f"gpufeed fleet: {msg}", file=sys.stderr)
        return code

    timing = CycleTiming(
        args.interval, args.lookback, args.step, args.settle, args.merge_gap, args.min_window
    )
    problem = timing.problem()
    if problem:
        return fail(problem)
    if args.queries < 1:
        return fail("--fleet.queries must be at least 1")
    if args.price is not None and not (math.isfinite(args.price) and args.price >= 0):
        return fail("--ledger.price must be zero or a positive number")
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        return fail(f"--web.listen-address {args.listen!r} must be HOST:PORT")
    try:
        url = access.server_url(args.url, args)
        start = parse_time(args.start) if args.start else None
        until = parse_time(args.until) if args.until else None
    except (AccessError, ValueError) as e:
        return fail(str(e))
    limit_malloc_arenas()  # before any thread: see fleet/memory.py
    if args.once:
        return _once(args.once, url, args.match, timing, args.threshold, args)
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
        service = FleetService(settings)
    except (WindowLogInUse, StateError) as e:
        return fail(str(e), 1)
    except OSError as e:
        return fail(f"--fleet.windows-log {args.windows_log}: {e.strerror or e}", 1)
    try:
        if until is not None:
            service.run()  # the backfill: no HTTP face, exits after the cycle at `until`
            return 1 if service.healthy() else 0
        return asyncio.run(_serve(service, host or "0.0.0.0", int(port)))
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


async def _serve(service: Any, host: str, port: int) -> int:
    from aiohttp import web

    from gpufeed.correlator.outputs.api import windows_routes
    from gpufeed.exposition import CONTENT_TYPE

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=service.page, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        problem = service.healthy()
        return web.Response(status=503 if problem else 200, text=(problem or "ok") + "\n")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz)])
    app.add_routes(windows_routes(service))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        print(f"gpufeed fleet: --web.listen-address {host}:{port}: {e.strerror}", file=sys.stderr)
        return 1
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    worker = threading.Thread(target=service.run, name="fleet-cycles", daemon=True)
    worker.start()
    await done.wait()
    service.stop()
    await asyncio.to_thread(worker.join)
    await runner.cleanup()
    return 0
