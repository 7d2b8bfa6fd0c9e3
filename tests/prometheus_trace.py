"""A real Prometheus serving a recorded trace, and `gpufeed analyze` run in-process: what the
tests comparing the file analysis with the PromQL analysis share."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufeed.correlator import analyze_cmd
from host_needs import missing
from procports import owned_server, stop, wait_listening


def run_analyze(*argv: str) -> int:
    """`gpufeed analyze ARGV...` in this process; its exit status."""
    p = argparse.ArgumentParser()
    analyze_cmd.register(p.add_subparsers())
    args = p.parse_args(["analyze", *argv])
    return int(args.func(args))


@contextmanager
def prometheus_serving(trace: Path, workdir: Path, web_config: Path | None = None) -> Iterator[str]:
    """Debian's Prometheus on an ephemeral port with `trace` (OpenMetrics) imported as
    blocks by promtool; yields its URL. With `web_config` (`--web.config.file`: TLS, basic
    auth) the URL is https and only its port is awaited: the caller, which holds the
    credentials, waits for it to be ready."""
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        missing("Debian's prometheus package is not installed (make promtool)")
    data = workdir / "data"
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(trace), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cfg = workdir / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1h\n")
    args = [
        "prometheus",
        f"--config.file={cfg}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=100y",  # the trace lies in the past
        "--web.listen-address=127.0.0.1:0",
    ]
    if web_config is None:
        with owned_server(args, "/-/ready") as (_, url):
            yield url
        return
    args.append(f"--web.config.file={web_config}")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"https://127.0.0.1:{wait_listening(proc)}"
    finally:
        stop(proc)
