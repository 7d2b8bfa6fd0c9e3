"""`gpufeed scheduler`: one exporter per cluster for the scheduler's queue and GPUs.

It runs where the scheduler can be asked: on a Slurm controller or login node (the
`squeue`, `sinfo` and `sdiag` clients and the cluster's slurm.conf), or as one Deployment
in a Kubernetes cluster with a read-only service account. Not in the node agent: every
node would ask the same controller the same question, and the answer is the cluster's,
not the node's. The scheduler is read every --scheduler.interval in the background; a
scrape returns the last page and computes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpufeed.exposition import render_text
from gpufeed.scheduler.backlog import SchedulerReading

log = logging.getLogger("gpufeed.scheduler")


class Reader(Protocol):
    def read(self, now_seconds: float) -> SchedulerReading: ...


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "scheduler",
        help="one exporter per cluster: pending GPU jobs, free GPUs, scheduler cycle time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--scheduler", dest="kind", choices=("slurm", "kubernetes"), required=True)
    a(
        "--scheduler.interval",
        dest="interval",
        type=float,
        default=30.0,
        help="seconds between reads of the scheduler (default %(default)g)",
    )
    a(
        "--scheduler.timeout",
        dest="timeout",
        type=float,
        default=10.0,
        help="seconds one command or API request may take (default %(default)g)",
    )
    a("--slurm.bin-dir", dest="bin_dir", default="", help="where squeue/sinfo/sdiag are")
    a("--slurm.conf", dest="slurm_conf", default="", help="SLURM_CONF for the clients")
    a(
        "--kubernetes.api-url",
        dest="api_url",
        default="https://kubernetes.default.svc",
        help="API server (default: in-cluster %(default)s)",
    )
    a("--kubernetes.token-file", dest="token_file", default="", help="bearer token file")
    a("--kubernetes.ca-file", dest="ca_file", default="", help="CA bundle of the API server")
    a("--web.listen-address", dest="listen", default=":9844", help="HOST:PORT (port 0: any)")
    a("--once", action="store_true", help="read once, print the page, exit (1 if it failed)")
    p.set_defaults(func=run)


def build_reader(args: argparse.Namespace) -> Reader:
    if args.kind == "slurm":
        from gpufeed.scheduler.slurm import SlurmReader

        env = {**os.environ, "SLURM_CONF": args.slurm_conf} if args.slurm_conf else None
        return SlurmReader(args.timeout, args.bin_dir, env)
    from gpufeed.scheduler.kubernetes import SA_DIR, KubernetesReader

    return KubernetesReader(
        args.api_url,
        args.token_file or f"{SA_DIR}/token",
        args.ca_file or f"{SA_DIR}/ca.crt",
        args.timeout,
    )


class Poller:
    """Reads the scheduler on a fixed period and keeps the rendered page."""

    def __init__(self, reader: Reader, scheduler: str, clock: Callable[[], float] = time.time):
        self._reader = reader
        self._scheduler = scheduler
        self._clock = clock
        self._stop = threading.Event()
        self.error = "not read yet"
        self.page = self._render(None)

    def _render(self, reading: SchedulerReading | None) -> bytes:
        from gpufeed.scheduler.collector import scheduler_families

        return render_text(scheduler_families(reading, self._scheduler))

    def poll(self) -> None:
        from gpufeed.scheduler.kubernetes import KubernetesError
        from gpufeed.scheduler.slurm import SlurmError

        try:
            reading: SchedulerReading | None = self._reader.read(self._clock())
            error = ""
        except (SlurmError, KubernetesError) as e:
            reading, error = None, str(e)
        self.error = error
        self.page = self._render(reading)

    def run(self, interval_seconds: float) -> None:
        logged = ""
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll()
            if self.error and self.error != logged:  # once per new error, not every read
                log.error("reading the scheduler failed: %s", self.error)
            logged = self.error
            self._stop.wait(max(interval_seconds - (time.monotonic() - started), 0.0))

    def stop(self) -> None:
        self._stop.set()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="gpufeed scheduler: %(message)s")
    if not args.interval > 0 or not args.timeout > 0:
        print("gpufeed scheduler: interval and timeout must be positive", file=sys.stderr)
        return 2
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        print(f"gpufeed scheduler: --web.listen-address {args.listen!r} must be HOST:PORT")
        return 2
    poller = Poller(build_reader(args), args.kind)
    if args.once:
        poller.poll()
        sys.stdout.write(poller.page.decode())
        if poller.error:
            print(f"gpufeed scheduler: {poller.error}", file=sys.stderr)
        return 1 if poller.error else 0
    return asyncio.run(_serve(poller, args.interval, host or "0.0.0.0", int(port)))


async def _serve(poller: Poller, interval: float, host: str, port: int) -> int:
    from aiohttp import web

    from gpufeed.exposition import CONTENT_TYPE

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=poller.page, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(status=503 if poller.error else 200, text=(poller.error or "ok") + "\n")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz)])
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        await runner.cleanup()
        print(f"gpufeed scheduler: --web.listen-address {host}:{port}: {e.strerror}")
        return 1
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    worker = threading.Thread(target=poller.run, args=(interval,), daemon=True)
    worker.start()
    await done.wait()
    poller.stop()
    await asyncio.to_thread(worker.join)
    await runner.cleanup()
    return 0
