"""One recorded real run through every feed of the correlator (issue 23): what
tests/test_feed_parity.py replays and compares (lab.parity_check).

  live     the trace's samples as the agent's snapshots, through the live processor
  file     `gpufeed analyze TRACE`
  promql   `gpufeed analyze --prometheus` of a real Prometheus loaded (promtool) with the
           trace thinned to one sample every `scrape` seconds: what a Prometheus scraping
           the agent at that interval holds (each kept sample at the instant the agent took it)
  fleet    `gpufeed fleet --fleet.once`, one cycle over the whole recording, on the same
           Prometheus
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufeed import vocabulary
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.correlator.outputs.windowlog import read_log
from gpufeed.trace.replay import snapshots_from_trace
from lab.parity import FLEET_INTERVAL, fleet_args

__all__ = [
    "FLEET_INTERVAL",
    "Windowing",
    "all_feeds",
    "fleet_backfill",
    "fleet_once",
    "joined",
    "live_windows",
    "scraped",
]
from prometheus_trace import prometheus_serving, run_analyze


@dataclass(frozen=True, slots=True)
class Windowing:
    """The window settings a run's agent had (the multi-node lab's are shorter)."""

    min_window_seconds: float = vocabulary.DEFAULT_MIN_WINDOW_SECONDS
    merge_gap_seconds: float = vocabulary.DEFAULT_MERGE_GAP_SECONDS

    def flags(self) -> list[str]:
        return [
            "--min-window",
            f"{self.min_window_seconds:g}",
            "--merge-gap",
            f"{self.merge_gap_seconds:g}",
        ]


def read_text(trace: Path) -> str:
    if trace.suffix == ".gz":
        with gzip.open(trace, "rt") as f:
            return f.read()
    return trace.read_text()


def span_of(text: str) -> tuple[float, float]:
    ts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and line[0] != "#"]
    return min(ts), max(ts)


def thinned(text: str, scrape: float) -> str:
    """The trace as a TSDB scraping every `scrape` seconds holds it: of the agent's samples
    (one per interval, all series of one instant together), those of every `scrape`-th
    second since the first."""
    t0 = span_of(text)[0]
    every = round(scrape)
    out = []
    for line in text.splitlines():
        if line and line[0] != "#" and round(float(line.rsplit(" ", 1)[1]) - t0) % every:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def scraped(text: str, scrape: float) -> str:
    """The trace as a real Prometheus scraping the agent every `scrape` seconds holds it:
    each scrape, half a scrape after a query grid instant (k * scrape), holds the agent's
    last snapshot taken before it, stamped at the scrape's instant, not the snapshot's
    (`thinned` keeps the snapshot's). The page's `gpufeed_snapshot_timestamp_seconds` still
    says when the snapshot was taken: a snapshot taken just before a grid instant is on the
    grid point after it, as in the lab's real scrapes (0.8 s after their snapshots)."""
    instants = sorted({float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x[:1] not in "#"})
    held: dict[float, list[float]] = {}
    tau = (math.floor(instants[0] / scrape) + 0.5) * scrape
    k = 0
    while tau <= instants[-1] + scrape:
        while k + 1 < len(instants) and instants[k + 1] < tau:
            k += 1
        if instants[k] < tau:
            held.setdefault(instants[k], []).append(tau)
        tau += scrape
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            out.append(line)
            continue
        sample, t = line.rsplit(" ", 1)
        out.extend(f"{sample} {s:.3f}" for s in held.get(float(t), []))
    return "\n".join(out) + "\n"


def joined(texts: list[str]) -> str:
    """Several nodes' traces as one OpenMetrics text (one TSDB holding every node): each
    metric family once, with every node's samples of it."""
    families: dict[str, list[str]] = {}
    for text in texts:
        name = ""
        for line in text.splitlines():
            if not line or line == "# EOF":
                continue
            if line[0] == "#":  # HELP, TYPE or UNIT: once per family
                name = line.split(" ", 3)[2]
                if line in families.setdefault(name, []):
                    continue
            families.setdefault(name, []).append(line)
    return "\n".join([*(x for lines in families.values() for x in lines), "# EOF"]) + "\n"


def on_grid(text: str, step: float, start: float) -> str:
    """The trace's snapshots a query grid (start + k * step, each point holding the last
    sample in the step before it: feeds/promql.py) holds: where two fall in one step, the
    earlier is never on the grid, whatever the TSDB feed does with the points it gets."""
    instants = sorted({float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x[:1] not in "#"})
    last: dict[int, float] = {}
    for t in instants:
        last[math.ceil(round((t - start) / step, 6))] = t  # in (g - step, g]
    held = {f"{t:.3f}" for t in last.values()}
    out = [
        x
        for x in text.splitlines()
        if x and (x[0] == "#" or f"{float(x.rsplit(' ', 1)[1]):.3f}" in held)
    ]
    return "\n".join(out) + "\n"


def live_windows(text: str, workdir: Path, windows: Windowing) -> list[dict[str, Any]]:
    log = workdir / "live-windows.jsonl"
    cfg = CorrelatorConfig(
        windows_log=str(log),
        min_window_seconds=windows.min_window_seconds,
        merge_gap_seconds=windows.merge_gap_seconds,
    )
    proc = CorrelatorProcessor(cfg, interval_seconds=1.0)  # the agent's, in every recording
    for snap in snapshots_from_trace(text):
        proc.process(snap)
    proc.close()  # the windows still open are logged, closed at the last sample
    return [w.to_json() for w in read_log(str(log))]


def _analyze(workdir: Path, name: str, *argv: str) -> list[dict[str, Any]]:
    out = workdir / f"{name}.jsonl"
    assert run_analyze(*argv, "--output", str(out)) == 0
    return [json.loads(x) for x in out.read_text().splitlines() if x.strip()]


def fleet_once(
    url: str, span: tuple[float, float], step: float, windows: Windowing
) -> list[dict[str, Any]]:
    """One fleet cycle whose range holds `span` (lab.parity.fleet_args)."""
    argv = fleet_args(url, *span, step, windows.merge_gap_seconds) + windows.flags()
    r = subprocess.run(
        [sys.executable, "-m", "gpufeed", "fleet", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [
        {k: v for k, v in json.loads(x).items() if k != "open"}
        for x in r.stdout.splitlines()
        if x.strip()
    ]


def all_feeds(
    trace: Path, workdir: Path, scrape: float, windows: Windowing | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The windows of every feed; `windows`: the agent's settings the run was recorded with."""
    w = windows or Windowing()
    text = read_text(trace)
    plain = workdir / "trace.om"
    plain.write_text(text)
    t0, t1 = span_of(text)
    feeds = {
        "live": live_windows(text, workdir, w),
        "file": _analyze(workdir, "file", str(plain), *w.flags()),
    }
    thin = workdir / "scraped.om"
    thin.write_text(thinned(text, scrape))
    tsdb = workdir / "tsdb"
    tsdb.mkdir()
    with prometheus_serving(thin, tsdb) as url:
        # --start on the step's grid: the instants the fleet's cycles query
        start = math.floor(t0 / scrape) * scrape
        rng = ["--start", f"{start:.0f}", "--end", f"{math.ceil(t1):.0f}"]
        feeds["promql"] = _analyze(
            workdir, "promql", "--prometheus", url, *rng, "--step", f"{scrape:g}", *w.flags()
        )
        feeds["fleet"] = fleet_once(url, (math.floor(t0), math.ceil(t1)), scrape, w)
    return feeds


def fleet_backfill(
    url: str,
    span: tuple[float, float],
    step: float,
    lookback: float,
    workdir: Path,
    windows: Windowing | None = None,
) -> tuple[int, str, list[dict[str, Any]]]:
    """`gpufeed fleet` cycles over `span` as the service runs them (--fleet.start/until, a
    10 s interval): (exit status, stderr, the windows log)."""
    log = workdir / f"fleet-{lookback:g}.jsonl"
    until = math.ceil((span[1] + 200) / FLEET_INTERVAL) * FLEET_INTERVAL
    argv = [
        *("--prometheus.url", url, "--fleet.interval", f"{FLEET_INTERVAL:g}"),
        *("--fleet.step", f"{step:g}", "--fleet.lookback", f"{lookback:g}"),
        *("--fleet.settle", "0", "--fleet.start", f"{span[0]:.0f}"),
        *("--fleet.until", f"{until:.0f}", "--fleet.windows-log", str(log)),
        *("--web.listen-address", "127.0.0.1:0"),
        *(windows.flags() if windows else ()),
    ]
    r = subprocess.run(
        [sys.executable, "-m", "gpufeed", "fleet", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    got = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return r.returncode, r.stderr, got
