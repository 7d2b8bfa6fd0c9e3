"""The four-feed parity harness on a real run (issue 23): one CPU-only PyTorch job, the
user's unmodified script (lab/workloads/loader_stall.py) under `gpufeed run`, with one stall
of its input pipeline, read by every feed of the correlator at once:

  live     the real agent (its live correlator; its windows log), recording every sample
           (`--record`)
  file     `gpufeed analyze` of the trace that agent recorded
  promql   `gpufeed analyze --prometheus` of a real Prometheus that scraped the agent every
           `--scrape` seconds during the run
  fleet    `gpufeed fleet --fleet.once` on that Prometheus, one cycle over the whole run

    python -m lab.parity [--out DIR] [--scrape S] [--keep-trace DIR] [sleep-loader|cpu-loader ...]

The windows of the four are compared (lab.parity_check): a different cause, a window split
in one feed and not in another, or an edge more than one sample interval (one scrape
interval for the TSDB feeds) apart fails. OUT/<scenario>/ gets every feed's windows, the
job's own step log and parity.json (the figures docs/benchmarks.md quotes). `--keep-trace
DIR` also writes the recording as DIR/<scenario>/trace.om.gz (with run.json: the stall's instants, every feed's windows):
what tests/test_feed_parity.py replays through the same four feeds in `make test`.

Exit status: 0 when every scenario's feeds agree, 1 when one does not, 2 when one could
not run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufeed import vocabulary
from lab.agent import Agent, listening_port
from lab.host import dies_with_runner
from lab.parity_check import FEEDS, agreement, differences

LOADER = Path(__file__).resolve().parent / "workloads" / "loader_stall.py"
DEFAULT_OUT = Path("lab-results") / "parity"
TAIL_SECONDS = 45.0  # healthy training after the stall: the windows close on good samples
FLEET_INTERVAL = 10.0


@dataclass(frozen=True, slots=True)
class Stall:
    """One scenario: the loader's stall kind, healthy seconds before it and its length."""

    kind: str
    healthy_seconds: float
    stall_seconds: float


SCENARIOS = {
    "sleep-loader": Stall("sleep", 75.0, 80.0),
    "cpu-loader": Stall("burn", 75.0, 80.0),
}


def _prometheus(run_dir: Path, target: str, scrape_seconds: float) -> tuple[Any, str]:
    cfg = run_dir / "prometheus.yml"
    cfg.write_text(
        "global:\n"
        f"  scrape_interval: {scrape_seconds:g}s\n"
        f"  scrape_timeout: {min(scrape_seconds, 10.0):g}s\n"
        "scrape_configs:\n"
        "  - job_name: gpufeed\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    log = open(run_dir / "prometheus.log", "wb")  # noqa: SIM115 - the child holds it
    argv = [
        "prometheus",
        f"--config.file={cfg}",
        f"--storage.tsdb.path={run_dir / 'tsdb'}",
        "--web.listen-address=127.0.0.1:0",
    ]
    proc = subprocess.Popen(dies_with_runner(argv), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        port = listening_port(proc.pid)
        if port is not None:
            url = f"http://127.0.0.1:{port}"
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2):
                    return proc, url
            except OSError:
                pass
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}")
        time.sleep(0.2)
    raise RuntimeError("prometheus did not become ready within 60 s")


def _gpufeed(*argv: str) -> list[dict[str, Any]]:
    r = subprocess.run(
        [sys.executable, "-m", "gpufeed", *argv], capture_output=True, text=True, timeout=600
    )
    if r.returncode != 0:
        raise RuntimeError(f"gpufeed {' '.join(argv[:2])} exited {r.returncode}: {r.stderr[-400:]}")
    return [json.loads(x) for x in r.stdout.splitlines() if x.strip()]


def fleet_args(
    url: str,
    start: float,
    end: float,
    step: float,
    merge_gap: float = vocabulary.DEFAULT_MERGE_GAP_SECONDS,
) -> list[str]:
    """`gpufeed fleet` arguments for one cycle whose analysed range holds [start, end]: its
    boundary the first multiple of the interval past `end` and the window's delay, its
    lookback long enough that its anchor lies at or before `start` (the whole run)."""
    delay = max(merge_gap, max(4 * step, 60.0)) + 2 * step  # CycleTiming.delay_seconds
    boundary = math.ceil((end + delay + FLEET_INTERVAL) / FLEET_INTERVAL) * FLEET_INTERVAL
    lookback = math.ceil((boundary - start) / FLEET_INTERVAL) * FLEET_INTERVAL
    while math.floor(boundary / lookback) * lookback - lookback > start:
        lookback += FLEET_INTERVAL
    return [
        "--prometheus.url",
        url,
        "--fleet.interval",
        f"{FLEET_INTERVAL:g}",
        "--fleet.step",
        f"{step:g}",
        "--fleet.lookback",
        f"{lookback:g}",
        "--fleet.settle",
        "0",
        "--fleet.once",
        f"{boundary:.0f}",
    ]


def fleet_once(url: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    windows = _gpufeed("fleet", *fleet_args(url, start, end, step))
    return [{k: v for k, v in w.items() if k != "open"} for w in windows]


def run_one(name: str, stall: Stall, out: Path, scrape: float, keep: Path | None) -> bool:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"gpufeed-parity-{name}-") as tmp:
        run_dir = Path(tmp)
        agent = Agent(run_dir, {}, instance=f"parity-{name}")
        trace = run_dir / "trace.om"
        steps = out / "steps.jsonl"
        agent.start([], record=trace)
        prom = None
        try:
            prom, url = _prometheus(run_dir, agent.url.removeprefix("http://"), scrape)
            time.sleep(2 * scrape)  # a few scrapes before the job starts, as in a real fleet
            seconds = stall.healthy_seconds + stall.stall_seconds + TAIL_SECONDS
            argv = agent.under_run(
                [
                    sys.executable,
                    str(LOADER),
                    "--kind",
                    stall.kind,
                    "--stall-at",
                    f"{stall.healthy_seconds:g}",
                    "--stall-seconds",
                    f"{stall.stall_seconds:g}",
                    "--seconds",
                    f"{seconds:g}",
                    "--steps-log",
                    str(steps),
                ]
            )
            t_start = time.time()
            subprocess.run(dies_with_runner(argv), check=True, timeout=seconds + 120)
            time.sleep(2 * scrape + 2)  # the last scrapes land
            t_end = time.time()
            agent.stop()
            feeds = {"live": agent.logged_windows()}
            feeds["file"] = _gpufeed("analyze", str(trace))
            # --start on the step's grid: the instants the fleet's cycles query
            grid = math.floor((t_start - 5) / scrape) * scrape
            rng = ["--start", f"{grid:.0f}", "--end", f"{t_end:.0f}"]
            feeds["promql"] = _gpufeed(
                "analyze", "--prometheus", url, *rng, "--step", f"{scrape:g}"
            )
            feeds["fleet"] = fleet_once(url, t_start - 5, t_end, scrape)
        finally:
            agent.stop()
            if prom is not None:
                prom.terminate()
                prom.wait(30)
        for feed, ws in feeds.items():
            (out / f"{feed}.jsonl").write_text("".join(json.dumps(w) + "\n" for w in ws))
        # docs/correlator.md: a TSDB feed sees an edge up to a scrape and a query step late
        tol = {"live": 1.0, "file": 1.0, "promql": 2 * scrape, "fleet": 2 * scrape}
        diffs = differences(feeds, tol)
        report = {
            "scenario": name,
            "scrape_seconds": scrape,
            "stall": _stall_of(steps),
            "windows": {f: [_brief(w) for w in feeds[f]] for f in FEEDS},
            "agreement": agreement(feeds),
            "differences": diffs,
        }
        (out / "parity.json").write_text(json.dumps(report, indent=1) + "\n")
        if keep is not None:
            dest = keep / name
            dest.mkdir(parents=True, exist_ok=True)
            with open(trace, "rb") as src, gzip.open(dest / "trace.om.gz", "wb", 9) as dst:
                shutil.copyfileobj(src, dst)
            recorded = {k: report[k] for k in ("scenario", "scrape_seconds", "stall", "windows")}
            (dest / "run.json").write_text(json.dumps(recorded, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("scenario", "agreement", "differences")}))
    return not diffs


def _brief(w: dict[str, Any]) -> dict[str, Any]:
    return {k: w.get(k) for k in ("gpu", "job_id", "start", "end", "cause", "confidence")}


def _stall_of(steps: Path) -> list[float] | None:
    for line in steps.read_text().splitlines():
        d = json.loads(line)
        if "stall" in d:
            return [float(x) for x in d["stall"]]
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.parity")
    p.add_argument("names", nargs="*", help=f"scenarios (default all: {', '.join(SCENARIOS)})")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--scrape", type=float, default=5.0, help="Prometheus scrape seconds")
    p.add_argument("--keep-trace", type=Path, help="write the recordings here (fixtures)")
    a = p.parse_args(argv)
    names = a.names or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"lab.parity: no scenario {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not shutil.which("prometheus"):
        print("lab.parity: needs Prometheus on PATH (Debian's prometheus)", file=sys.stderr)
        return 2
    ok = True
    for n in names:
        try:
            ok = run_one(n, SCENARIOS[n], a.out / n, a.scrape, a.keep_trace) and ok
        except (RuntimeError, subprocess.SubprocessError, OSError) as e:
            print(f"lab.parity: {n}: {e}", file=sys.stderr)
            return 2
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
