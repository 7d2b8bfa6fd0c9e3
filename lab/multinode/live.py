"""The live, central reading of a multi-node run: a real Prometheus scraping every node's
agent each second, the real `gpufeed fleet` service on it, and a poller that records, each
second, which culprit the fleet names (its /api/windows, open windows included).

All three run in the run's bridge namespace, which gets an address on the bridge
(`BRIDGE_ADDRESS`), so that they reach every node's agent (listening on all of its
namespace's addresses) and nothing of the run is visible from the host. The fleet's cycle
is shortened for a one-minute fault (`FLEET_ARGS`); its correlator gets the agents'
settings. What it writes lands in `<results>/<scenario>/fleet/`:

  sightings.jsonl   one line a poll: {"t": unix time, "named": [straggler windows naming
                    a culprit: instance, start, end, open, culprit]}
  fleet.log, prometheus.log, windows.jsonl (the fleet's own windows log)

`naming_times` turns the sightings into the figures: seconds from the fault's onset, and
from the window's opening (its start as the fleet reports it), to the first poll in which
the fleet named the right culprit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import yaml

from lab.multinode import procs
from lab.multinode.fabric import SUBNET, in_ns

BRIDGE_ADDRESS = f"{SUBNET}.254"
SCRAPE_INTERVAL = "1s"
# a 1 s cycle over a 1 s grid, 2 s for the scrapes to land; the lookback is the least the
# fleet accepts for that cycle (interval + the time a window needs to be known closed).
# The cycle is 1 s, not 5: a window the engines know waits for the next cycle boundary, up
# to a whole interval, before anyone is told; a cycle over 2-4 nodes that carries its
# engines costs 0.06 s (median; 0.74 s at most at load 12-18 on 2 cores), so a 1 s cycle
# takes about 6% of a core and turns that wait of up to 5 s into one of up to 1 s.
FLEET_ARGS = (
    "--fleet.interval",
    "1",
    "--fleet.step",
    "1",
    "--fleet.lookback",
    "120",
    "--fleet.settle",
    "2",
)
POLL_SECONDS = 1.0
# Each poll also reads the fleet's /metrics: the boundary of its last cycle (its cursor) and
# how long that cycle took, so that a naming time splits into the engine's part (the data
# time at which the window was known), the wait for the cycle boundary after it, and the
# fleet's part (settle, the cycle itself, the poll).
_POLLER = """
import json, sys, time, urllib.request
url, out, period = sys.argv[1], sys.argv[2], float(sys.argv[3])
base = url.split("/api/")[0]
def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None
with open(out, "a") as f:
    while True:
        t = time.time()
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.loads(r.read())
            with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
                metrics = r.read().decode()
        except Exception as exc:
            f.write(json.dumps({"t": t, "error": str(exc)}) + "\\n")
        else:
            named = [
                {"instance": w["instance"], "start": w["start"], "end": w.get("end"),
                 "open": w in body.get("open", []),
                 "culprit": (w.get("evidence") or {}).get("culprit") or w.get("culprit")}
                for w in body.get("windows", []) + body.get("open", [])
                if w.get("cause") == "straggler"
            ]
            cursor = gauge(metrics, "gpufeed_fleet_cursor_timestamp_seconds")
            took = gauge(metrics, "gpufeed_fleet_cycle_duration_seconds")
            f.write(json.dumps({"t": t, "named": named, "cursor": cursor, "cycle_s": took})
                    + "\\n")
        f.flush()
        time.sleep(max(0.0, period - (time.time() - t)))
"""


def start(
    netns: str,
    out: Path,
    targets: list[tuple[str, str]],
    correlator: dict[str, float],
    on_undo: Callable[[Callable[[], object]], object],
) -> None:
    """Starts Prometheus, the fleet service and the poller in `netns`; `targets` are
    (address:port, instance) of the agents. Each is stopped by the undo step it registers."""
    out.mkdir(parents=True, exist_ok=True)
    in_ns(netns, "ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", "br0")
    in_ns(netns, "ip", "link", "set", "lo", "up")  # the fleet's own port, for the poller
    cfg = out / "prometheus.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL},
                "scrape_configs": [
                    {
                        "job_name": "gpufeed",
                        "static_configs": [
                            {"targets": [addr], "labels": {"instance": inst}}
                            for addr, inst in targets
                        ],
                    }
                ],
            }
        )
    )
    prom = _spawn(
        netns,
        [
            "prometheus",
            f"--config.file={cfg}",
            f"--storage.tsdb.path={out / 'tsdb'}",
            f"--web.listen-address={BRIDGE_ADDRESS}:0",
        ],
        out / "prometheus.log",
        on_undo,
    )
    prom_url = f"http://{BRIDGE_ADDRESS}:{procs.wait_port(prom)}"
    cmd = [sys.executable, "-m", "gpufeed", "fleet", "--prometheus.url", prom_url, *FLEET_ARGS]
    for key, flag in (("min_window_seconds", "--min-window"), ("merge_gap_seconds", "--merge-gap")):
        if key in correlator:
            cmd += [flag, str(correlator[key])]
    cmd += [
        "--fleet.windows-log",
        str(out / "windows.jsonl"),
        "--web.listen-address",
        "127.0.0.1:0",
    ]
    fleet = _spawn(netns, cmd, out / "fleet.log", on_undo)
    fleet_url = f"http://127.0.0.1:{procs.wait_port(fleet)}"
    _spawn(
        netns,
        [
            sys.executable,
            "-c",
            _POLLER,
            f"{fleet_url}/api/windows?limit=1000",
            str(out / "sightings.jsonl"),
            str(POLL_SECONDS),
        ],
        out / "poller.log",
        on_undo,
    )


def _spawn(
    netns: str, cmd: list[str], log: Path, on_undo: Callable[[Callable[[], object]], object]
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, *cmd], stdout=f, stderr=subprocess.STDOUT
        )
    on_undo(lambda: procs.stop(proc))
    return proc


def naming_times(out: Path, culprit_instance: str, onset: float, stop: float) -> dict[str, Any]:
    """When the fleet first named `culprit_instance` for a window overlapping the fault
    [onset, stop] (unix times): seconds after the onset and after that window's start,
    and how many polls saw it (None: never named)."""
    path = out / "sightings.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    polls = errors = 0
    first: tuple[float, float] | None = None
    boundary: float | None = None  # the cycle that first named it
    before: float | None = None  # the cycle before it: the window was not known yet
    cursor: float | None = None
    cycles: list[float] = []
    wrong: set[str] = set()
    for line in lines:
        try:
            poll = json.loads(line)
        except ValueError:
            continue
        polls += 1
        if "error" in poll:
            errors += 1
            continue
        if poll.get("cycle_s") is not None and poll.get("cursor") != cursor:
            cycles.append(float(poll["cycle_s"]))
        prev, cursor = cursor, poll.get("cursor")
        for w in poll["named"]:
            c = w.get("culprit") or {}
            end = w.get("end") or poll["t"]
            if w["start"] > stop or end < onset or not c.get("instance"):
                continue  # (a node's own `straggler` window, before the join named anyone)
            if c.get("instance") != culprit_instance:
                wrong.add(str(c.get("instance")))
                continue
            if first is None:
                first = (poll["t"], float(w["start"]))
                boundary = cursor
                before = prev if prev != cursor else None
    return {
        "polls": polls,
        "poll_errors": errors,
        "named_after_onset_s": None if first is None else round(first[0] - onset, 1),
        "named_after_window_opened_s": None if first is None else round(first[0] - first[1], 1),
        "window_opened_after_onset_s": None if first is None else round(first[1] - onset, 1),
        # where the time went: the window was known (data time) after the cycle `before`
        # and by `boundary`; the fleet ran that cycle after its settle time and the poller
        # saw it at most a poll later
        "known_by_boundary_after_onset_s": _after(boundary, onset),
        "not_known_at_boundary_after_onset_s": _after(before, onset),
        "named_after_boundary_s": None
        if first is None or boundary is None
        else round(first[0] - boundary, 1),
        "cycle_seconds_median": round(median(cycles), 2) if cycles else None,
        "cycle_seconds_max": round(max(cycles), 2) if cycles else None,
        "other_culprits_named": sorted(wrong),
    }


def _after(t: float | None, onset: float) -> float | None:
    return None if t is None else round(t - onset, 1)
