"""`gpufeed scheduler`: one exporter per cluster for the scheduler's queue and GPUs.

It runs where the scheduler can be asked: on a Slurm controller or login node (the
`squeue`, `sinfo` and `sdiag` clients and the cluster's slurm.conf), or as one Deployment
in a Kubernetes cluster with a read-only service account. Not in the node agent: every
node would ask the same controller the same question, and the answer is the cluster's,
not the node's. The scheduler is read every --scheduler.interval in the background; a
scrape returns the last page and computes nothing. It logs where it listens at start and
one line when a read fails (again when the error changes, and when reads work again). Its
HTTP endpoints take the agent's --web.* flags: TLS, client certificates and basic auth
from --web.config.file, the connection cap and timeouts (docs/security.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpufeed.config import ConfigError
from gpufeed.exposition import render_text
from gpufeed.scheduler.backlog import SchedulerReading
from gpufeed.web.flags import (
    ListenError,
    WebFlagError,
    WebSettings,
    add_web_flags,
    bind_listen_socket,
    web_settings,
)

log = logging.getLogger("gpufeed.scheduler")

DEFAULT_PORT = 9844


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
    a("--once", action="store_true", help="read once, print the page, exit (1 if it failed)")
    add_web_flags(p, default_port=DEFAULT_PORT, listen_help="address to serve /metrics on")
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
        except Exception as e:  # what the reader did not expect (bytes that are not text, a
            # client that is not executable): a failed read too, not a dead thread that
            # leaves the last page (and /healthz "ok") up for good
            reading, error = None, f"{type(e).__name__}: {e}"
        self.error = error
        self.page = self._render(reading)

    def run(self, interval_seconds: float) -> None:
        logged, failed = "", 0
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll()
            logged, failed = self._log_outcome(logged, failed)
            self._stop.wait(max(interval_seconds - (time.monotonic() - started), 0.0))

    def _log_outcome(self, logged: str, failed: int) -> tuple[str, int]:
        """One line when a read fails with a new error (not one per read while the same
        error lasts), and one when reads work again; returns (error logged, reads failed)."""
        if not self.error:
            if failed:
                log.info("reading the scheduler works again (after %d failed reads)", failed)
            return "", 0
        if self.error != logged:
            log.error("reading the scheduler failed: %s", self.error)
        return self.error, failed + 1

    def stop(self) -> None:
        self._stop.set()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="gpufeed scheduler: %(message)s")
    if not args.interval > 0 or not args.timeout > 0:
        return _fail("interval and timeout must be positive")
    if args.once:
        poller = Poller(build_reader(args), args.kind)
        poller.poll()
        sys.stdout.write(poller.page.decode())
        if poller.error:
            print(f"gpufeed scheduler: {poller.error}", file=sys.stderr)
        return 1 if poller.error else 0
    try:
        settings = web_settings(args)
    except (WebFlagError, ConfigError) as e:
        return _fail(str(e))
    try:
        listener = bind_listen_socket(settings.host, settings.port)
    except ListenError as e:
        return _fail(str(e), 1)
    try:
        poller = Poller(build_reader(args), args.kind)
        return asyncio.run(_serve(poller, args.interval, listener, settings))
    finally:
        listener.close()


def _fail(msg: str, code: int = 2) -> int:
    print(f"gpufeed scheduler: {msg}", file=sys.stderr)
    return code


async def _serve(
    poller: Poller, interval: float, listener: socket.socket, settings: WebSettings
) -> int:
    from aiohttp import web

    from gpufeed.web.pages import page_routes
    from gpufeed.web.serve import serve

    app = web.Application()
    app.add_routes(page_routes(lambda: poller.page, lambda: poller.error))
    serving = await serve(app, [listener], limits=settings.limits, web_config=settings.web_config)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    worker = threading.Thread(
        target=poller.run, args=(interval,), name="scheduler-reads", daemon=True
    )
    worker.start()
    await done.wait()
    log.info("shutting down")
    poller.stop()
    await asyncio.to_thread(worker.join)
    await serving.close()
    return 0
