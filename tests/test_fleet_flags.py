"""`gpufeed fleet`'s own flags, read before anything starts: `--fleet.queries` (range
queries in flight at once) defaults to vocabulary's, reaches the engines' pool, and fewer
than one is refused in one line (by the command, and by the engines built in code)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufeed import vocabulary
from gpufeed.cli import build_parser
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.feeds.promql import Retry
from gpufeed.fleet.carry import FleetEngines
from gpufeed.fleet.service import FleetService, FleetSettings
from gpufeed.fleet.timing import CycleTiming

URL = "http://127.0.0.1:9"  # never asked: nothing here runs a cycle
TIMING = CycleTiming(60.0, 900.0, 15.0, 0.0, WindowParams().merge_gap_seconds)


def test_the_default_is_vocabularys() -> None:
    args = build_parser().parse_args(["fleet", "--prometheus.url", URL])
    assert args.queries == vocabulary.DEFAULT_FLEET_QUERIES_IN_FLIGHT


def test_the_setting_reaches_the_engines(tmp_path: object) -> None:
    log = f"{tmp_path}/w.jsonl"
    svc = FleetService(FleetSettings(URL, "", TIMING, WindowParams(), log, queries_in_flight=3))
    try:
        assert svc.engines.queries_in_flight == 3
    finally:
        svc.close()
    with pytest.raises(ValueError, match="at least 1"):
        FleetEngines(URL, TIMING, WindowParams(), "", Retry(), queries_in_flight=0)


def test_fewer_than_one_is_refused_in_one_line() -> None:
    # a process of its own: the command sets the process's malloc arenas once it runs
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed.cli", "fleet", "--prometheus.url", URL,
         "--fleet.queries", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (
        2,
        "gpufeed fleet: --fleet.queries must be at least 1\n",
    )
