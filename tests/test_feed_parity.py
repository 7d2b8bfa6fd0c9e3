"""The same windows from every feed of the correlator, on recorded REAL runs (issue 23).

Each recording (tests/fixtures/lab/parity/: lab.parity's CPU-only PyTorch job under `gpufeed
run`, a sleep in `__getitem__` and CPU-burning loader workers; and the lab's multi-node
and S3 recordings, one node at a time) goes through the live processor (trace replay),
`gpufeed analyze` of the file, a real Prometheus holding it as a scrape would (5 s for
lab.parity's runs, the agent's 1 s for the lab's), `analyze --prometheus` and `gpufeed
fleet --fleet.once` (tests/feed_parity.py). They must agree:
the same number of windows per (GPU, job), the same causes, and each edge within the bound
docs/correlator.md gives (one sample interval between the agent and its trace; one scrape
interval for a TSDB reading the agent's snapshot instants, a scrape plus a query step for
an agent without them). The two TSDB feeds read the same grid and must agree exactly.

Recorded once with `python -m lab.parity --keep-trace tests/fixtures/lab/parity`; the
run's own four feeds (a real scrape) are in each run.json and docs/benchmarks.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import pytest

from correlator_helpers import T0, analyze_text, snapshots_of, trace_text
from feed_parity import (
    FLEET_INTERVAL,
    Windowing,
    all_feeds,
    fleet_backfill,
    fleet_once,
    joined,
    live_windows,
    on_grid,
    read_text,
    scraped,
    span_of,
    thinned,
)
from gpufeed import vocabulary
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.feeds import promql
from gpufeed.correlator.feeds.clock import SNAPSHOT_METRIC
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.correlator.outputs.windowlog import read_log
from gpufeed.fleet.carry import FleetEngines
from gpufeed.fleet.cycle import QUERY_RETRY
from gpufeed.fleet.timing import CycleTiming
from lab.parity_check import agreement, differences, pair_differences
from prometheus_trace import prometheus_serving, run_analyze
from test_correlator_evidence import Counters, healthy_host

FIXTURES = Path(__file__).parent / "fixtures" / "lab"
SCRAPE = 5.0  # lab.parity's Prometheus
LAB_SCRAPE = 1.0  # the multi-node lab's live fleet (lab/multinode/live.py)


def _bounds(scrape: float, snapshot_instants: bool) -> dict[str, float]:
    """One sample interval between the agent and its trace. A TSDB feed reads an agent that
    serves its snapshots' instants at those instants (feeds/clock.py): an edge moves only
    to a snapshot the scrape kept, within one scrape interval. An agent without them (the
    S3 recording's) is read on the query grid, which sees a scrape up to one step after it
    was taken: a scrape interval plus a step (docs/correlator.md, "The same run through
    every feed")."""
    tsdb = scrape if snapshot_instants else 2 * scrape
    return {"live": 1.0, "file": 1.0, "promql": tsdb, "fleet": tsdb}


# Recordings where a 1 s query grid misses snapshots that change an edge: the agent samples
# every ~1 s with jitter (x.096 and x.972 of one second), the grid holds the last snapshot
# of each step, and the earlier one is on no grid point (docs/correlator.md, "The same run
# through every feed"). There the TSDB feeds give the windows the agent gives on the
# snapshots the grid holds, and the same windows and causes as the agent.
GRID_MISSES = {"loaded/mn2-link-tbf/node-0"}
# A node that alone holds no window: mn2-slow-from-start's victim, whose gloo rank waits in
# its `compute` phase from the first step, with no healthy past and no other node to
# compare that wait with (the job-level view, tests/test_lab_multinode_culprit.py, names
# it). Every feed must agree on that too: no window.
QUIET_ALONE = {"mn2-slow-from-start/node-0"}


def _holds_a_stall(trace: Path, windows: Iterable[object]) -> None:
    if _name(trace) in QUIET_ALONE:
        assert not any(windows), "a node alone that sees nothing says nothing"
    else:
        assert any(windows), "every recording holds a stall"


def _all_recordings() -> list[Path]:
    parity = sorted((FIXTURES / "parity").glob("*/trace.om.gz"))
    single = sorted(p for p in FIXTURES.glob("*/trace.om.gz") if p.parent.name != "parity")
    nodes = sorted(FIXTURES.glob("**/node-*/trace.om.gz"))
    return parity + single + nodes


def _name(p: Path) -> str:
    return str(p.parent.relative_to(FIXTURES))


def _settings(trace: Path) -> tuple[float, Windowing]:
    """(scrape seconds, window settings) the recording was made with."""
    run = trace.parent / "run.json"
    if not run.exists():
        run = trace.parent.parent / "run.json"  # a multi-node run's
    d = json.loads(run.read_text())
    agent = d.get("agent_correlator")
    if agent is None:
        # the single-node lab's runs had no Prometheus: one scraping at the agent's interval
        return float(d.get("scrape_seconds", LAB_SCRAPE)), Windowing()
    w = Windowing(float(agent["min_window_seconds"]), float(agent["merge_gap_seconds"]))
    return LAB_SCRAPE, w


@pytest.mark.slow
@pytest.mark.parametrize("trace", _all_recordings(), ids=_name)
def test_every_feed_gives_the_windows_of_the_live_agent(trace: Path, tmp_path: Path) -> None:
    scrape, windowing = _settings(trace)
    feeds = all_feeds(trace, tmp_path, scrape, windowing)
    for f, ws in feeds.items():
        print(f, [(w["cause"], w["start"], w["end"]) for w in ws])
    _holds_a_stall(trace, feeds.values())
    bounds = _bounds(scrape, SNAPSHOT_METRIC in read_text(trace))
    if _name(trace) in GRID_MISSES:
        # the same windows and causes; the edges are those of the snapshots on the grid
        shares = agreement(feeds)
        assert all(shares[f]["windows"] == len(feeds["live"]) for f in shares), shares
        assert all(shares[f]["same_cause_share"] >= 0.99 for f in shares), shares
        start = math.floor(span_of(read_text(trace))[0] / scrape) * scrape
        (tmp_path / "held").mkdir()
        text = on_grid(read_text(trace), scrape, start)
        held = live_windows(text, tmp_path / "held", windowing)
        assert not pair_differences(held, feeds["promql"], 1e-3)
        feeds = {**feeds, "live": held, "file": held}
    assert not differences(feeds, bounds), "\n".join(differences(feeds, bounds))
    # the fleet's cycle and `analyze --prometheus` from a --start on the step's grid query
    # the same instants of one TSDB
    assert not pair_differences(feeds["promql"], feeds["fleet"], 1e-6)
    if trace.parent.parent.name == "parity":
        _loader_stall_verdicts(trace, feeds)


def _loader_stall_verdicts(trace: Path, feeds: dict[str, list[dict[str, object]]]) -> None:
    """The recorded loader stalls come after the job's healthy steps: no feed calls them
    `startup` (issue 23: `analyze` of the agent's trace and `--prometheus` did); the
    CPU-burning loader is `preprocessing` in every one, and so was the run's real scrape
    (its four feeds' windows are in run.json)."""
    causes = {f: [w["cause"] for w in ws] for f, ws in feeds.items()}
    recorded = json.loads((trace.parent / "run.json").read_text())["windows"]
    causes.update({f"recorded {f}": [w["cause"] for w in ws] for f, ws in recorded.items()})
    assert all(ws and "startup" not in ws for ws in causes.values()), causes
    if trace.parent.name == "cpu-loader":
        assert all(ws == ["preprocessing"] for ws in causes.values()), causes
    if trace.parent.name.startswith("sleep-loader"):
        _sleep_is_the_input_pipeline(feeds)


def _sleep_is_the_input_pipeline(feeds: dict[str, list[dict[str, object]]]) -> None:
    """A sleep in `__getitem__` is the job's own input pipeline in every feed (issue 23):
    `data_loading` with no tier, whatever the host's other work did to its CPUs (the
    busy-cpus run: load 8 on 2 cores, CPUs 99.6% busy, the main thread's few wakeups
    waiting 60% of their runnable time, called `preprocessing` in all four feeds of the
    run itself) or disks (the plain run: "unassigned tier" latency, `data_loading` from
    storage in all four)."""
    for feed, ws in feeds.items():
        for w in ws:
            ev = w["evidence"]
            assert isinstance(ev, dict)
            got = (w["cause"], ev.get("data_source"), ev.get("data_tier"))
            assert got == ("data_loading", vocabulary.DataSource.INPUT_PIPELINE, None), (feed, w)


BUSY_DISK = FIXTURES / "parity" / "sleep-loader-busy-disk" / "trace.om.gz"


def test_a_sleep_beside_other_works_disk_load_needs_the_agents_worker_count(
    tmp_path: Path,
) -> None:
    """The busy-disk run (a sleep in `__getitem__` while another tenant's direct reads and
    writes held the host's I/O pressure near 50%): its agent summed the job's workers and
    said so (`gpufeed_job_io_processes`), and all four feeds call it the input pipeline
    (`_sleep_is_the_input_pipeline`, above). The same samples without that gauge, as an
    agent that counted no workers would give them, show no job reading nothing: the
    host's I/O stall then keeps the wait from being told as the pipeline's (`unknown`,
    as every feed said on 0.2.0 and before this gauge), and never names a tier."""
    text = "\n".join(
        line for line in read_text(BUSY_DISK).splitlines() if "gpufeed_job_io_processes" not in line
    )
    assert text != read_text(BUSY_DISK).rstrip("\n"), "the recording has no worker count"
    plain = tmp_path / "older.om"
    plain.write_text(text + "\n")
    out = tmp_path / "older.jsonl"
    assert run_analyze(str(plain), "--output", str(out)) == 0
    ws = [json.loads(x) for x in out.read_text().splitlines()]
    assert ws, "no window for the stall"
    for w in ws:
        assert w["evidence"].get("data_tier") is None, w
        assert w["evidence"].get("data_source") != vocabulary.DataSource.INPUT_PIPELINE, w


@pytest.mark.parametrize("trace", _all_recordings(), ids=_name)
def test_the_agent_and_its_trace_give_the_same_windows(trace: Path, tmp_path: Path) -> None:
    """The live processor and `analyze` read the same samples: the same windows, edges
    within a millisecond. On 0.2.0 the agent stepped at every snapshot, also where one
    lacked the job's series, and learned the job's usual wait a sample sooner (the loaded
    two-node run: `startup` live, `straggler` in the file); and it logged a window still
    open when it stopped as ending at its last low sample, past the recovery the analysis
    ends it at (the S3 run: 3 s)."""
    _, windowing = _settings(trace)
    text = read_text(trace)
    live = live_windows(text, tmp_path, windowing)
    plain = tmp_path / "trace.om"
    plain.write_text(text)
    out = tmp_path / "file.jsonl"
    assert run_analyze(str(plain), "--output", str(out), *windowing.flags()) == 0
    file = [json.loads(x) for x in out.read_text().splitlines()]
    _holds_a_stall(trace, live)
    assert not pair_differences(live, file, 1e-3), pair_differences(live, file, 1e-3)
    # and the same verdict in full: confidence, mean utilization, evidence (the agent's
    # window cut short by its stop says so; its confidence had left out the disagreement
    # `finish` counts: 0.899 against 0.739 on the CPU-starve run)
    for a, b in zip(live, file, strict=True):
        ev = {k: v for k, v in a["evidence"].items() if k != "interrupted"}
        if "interrupted" in a["evidence"]:
            ev["summary"] = ev["summary"].removesuffix(" (cut short: the agent stopped)")
        got = (a["confidence"], a["mean_utilization"], ev)
        assert got == (b["confidence"], b["mean_utilization"], b["evidence"]), (a, b)


# ---- the state behind the startup verdict, on a hand-made trace ------------------------------

JOB = 'job_id="r-77"'
INST = 'instance="n1:9400"'
STALL = (400.0, 600.0)


def _hung_first_checkpoint() -> str:
    """A CPU-only SDK job that appears 60 s into the trace, steps 20 times a second, then
    hangs 200 s in its first checkpoint: no step, and a `checkpoint` phase series that only
    appears then (it sorts before `compute`)."""
    c = Counters()

    def job(s: float) -> dict[str, float]:
        ph = "gpufeed_job_phase_seconds_total"
        if s < 60:
            return {}
        rates = {
            f'{ph}{{{JOB},phase="compute",{INST}}}': 0.95,
            f'{ph}{{{JOB},phase="data_wait",{INST}}}': 0.05,
            f"gpufeed_job_steps_total{{{JOB},{INST}}}": 20.0,
        }
        if STALL[0] <= s < STALL[1]:
            rates = {k: 0.0 for k in rates}
            rates[f'{ph}{{{JOB},phase="checkpoint",{INST}}}'] = 1.0
        return rates

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        yield from c.advance(s, {**job(s), **healthy_host(s)})

    return trace_text(gen, 900, interval=1.0)


def test_a_late_phase_series_does_not_make_a_stepped_job_new(tmp_path: Path) -> None:
    """Offline, when the job was first seen came from whichever of its phase series sorts
    first: the checkpoint phase, born at the stall, so the job that had made 6,800 steps
    was `startup` there; the live agent (which notes the first sample of any) was not.
    The job's own step count decides in every feed."""
    text = _hung_first_checkpoint()
    offline = analyze_text(text, tmp_path)
    log = tmp_path / "live.jsonl"
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(log)), interval_seconds=1.0)
    for snap in snapshots_of(text):
        proc.process(snap)  # type: ignore[arg-type]
    proc.close()
    live = list(read_log(str(log)))
    got = {
        "file": [(w.cause.value, w.start_seconds - T0) for w in offline],
        "live": [(w.cause.value, w.start_seconds - T0) for w in live],
    }
    assert got["file"] and all(c != "startup" for c, _ in got["file"]), got
    assert [c for c, _ in got["file"]] == [c for c, _ in got["live"]], got


@pytest.mark.slow
def test_a_fleet_lookback_that_would_lose_a_window_is_refused(tmp_path: Path) -> None:
    """A fleet cycle reports a window from an anchor at least one lookback back. At the
    lookback 0.2.0 accepted (the interval plus the delay, 90 s here) the cycle that
    reported the 80 s CPU-loader stall held only its last 10 s, too little to open, and
    no cycle reported it at all. Such a lookback is refused; at the least one accepted
    the fleet's windows log holds the stall as `analyze --prometheus` gives it."""
    trace = FIXTURES / "parity" / "cpu-loader" / "trace.om.gz"
    text = read_text(trace)
    t0, t1 = span_of(text)
    thin = tmp_path / "scraped.om"
    thin.write_text(thinned(text, SCRAPE))
    (tmp_path / "tsdb").mkdir()
    start = math.floor(t0 / SCRAPE) * SCRAPE
    with prometheus_serving(thin, tmp_path / "tsdb") as url:
        delay = max(vocabulary.DEFAULT_MERGE_GAP_SECONDS, 60.0) + 2 * SCRAPE
        old_least = FLEET_INTERVAL + delay
        code, err, got = fleet_backfill(url, (start, t1), SCRAPE, old_least, tmp_path)
        assert code == 2 and "--fleet.lookback must be at least" in err, (code, err, got)
        least = old_least + vocabulary.DEFAULT_MIN_WINDOW_SECONDS
        code, err, got = fleet_backfill(url, (start, t1), SCRAPE, least, tmp_path)
        assert code == 0, err
        rng = ["--start", f"{start:.0f}", "--end", f"{math.ceil(t1):.0f}"]
        out = tmp_path / "promql.jsonl"
        assert run_analyze("--prometheus", url, *rng, "--step", f"{SCRAPE:g}", "-o", str(out)) == 0
        want = [json.loads(x) for x in out.read_text().splitlines()]
    assert want and not pair_differences(want, got, 1e-6), (want, got)


@pytest.mark.slow
def test_the_fleet_gives_the_windows_of_promql_on_a_real_two_node_scrape(tmp_path: Path) -> None:
    """One datum, one answer (issues 23/24): both nodes of the two-node run in one
    Prometheus as a real scrape holds them (`scraped`: each sample at its scrape's instant,
    up to a second after the agent's snapshot), read at the agents' snapshot instants
    (feeds/clock.py). A snapshot taken just before a grid instant is on the grid point
    after it, re-stamped before that instant; the fleet cut each chunk at its last grid
    instant on the re-stamped ones and lost such a snapshot at every chunk edge (the
    lab's real scrape: node 1 kept 43 of its 85 samples, and its `preprocessing` window,
    which `analyze --prometheus` gives, was missing). One cycle over the run and cycles
    as the service runs them give `analyze --prometheus`'s windows, on every node."""
    traces = sorted((FIXTURES / "mn2-slow-from-start").glob("node-*/trace.om.gz"))
    _, windowing = _settings(traces[0])
    texts = [read_text(t) for t in traces]
    scrape = tmp_path / "scraped.om"
    scrape.write_text(joined([scraped(t, LAB_SCRAPE) for t in texts]))
    t0 = min(span_of(t)[0] for t in texts)
    t1 = max(span_of(t)[1] for t in texts) + LAB_SCRAPE  # the last snapshot's scrape
    start = math.floor(t0 / LAB_SCRAPE) * LAB_SCRAPE
    (tmp_path / "tsdb").mkdir()
    with prometheus_serving(scrape, tmp_path / "tsdb") as url:
        out = tmp_path / "promql.jsonl"
        rng = ["--start", f"{start:.0f}", "--end", f"{math.ceil(t1):.0f}", "--step", "1"]
        assert run_analyze("--prometheus", url, *rng, *windowing.flags(), "-o", str(out)) == 0
        want = [json.loads(x) for x in out.read_text().splitlines()]
        once = fleet_once(url, (math.floor(t0), math.ceil(t1)), LAB_SCRAPE, windowing)
        # a lookback whose every anchor lies before the run: the whole run, as --start
        lookback = 30 * FLEET_INTERVAL
        code, err, cycles = fleet_backfill(
            url, (start, t1), LAB_SCRAPE, lookback, tmp_path, windowing
        )
        # every 1 s cycle (a chunk of one instant) holds the columns `analyze` reads
        _every_cycle_reads_the_columns_of_promql(url, (start, math.ceil(t1)), windowing)
    assert code == 0, err
    assert len({w["instance"] for w in want}) == len(traces), want  # a window on each node
    assert not pair_differences(want, once, 1e-6), pair_differences(want, once, 1e-6)
    assert not pair_differences(want, cycles, 1e-6), pair_differences(want, cycles, 1e-6)


def _every_cycle_reads_the_columns_of_promql(
    url: str, span: tuple[float, float], windowing: Windowing
) -> None:
    """The fleet's carried columns, cycle after cycle at a 1 s interval, hold every node's
    points `load_range` gives for the same range, at the same instants."""
    timing = CycleTiming(LAB_SCRAPE, 120.0, LAB_SCRAPE, 0.0, windowing.merge_gap_seconds)
    params = WindowParams(
        min_window_seconds=windowing.min_window_seconds,
        merge_gap_seconds=windowing.merge_gap_seconds,
    )
    engines = FleetEngines(url, timing, params, "", QUERY_RETRY)
    first = timing.first_after(span[0])
    for k in range(round((span[1] + timing.lookback_seconds - first) / LAB_SCRAPE) + 1):
        boundary = first + k * LAB_SCRAPE
        epoch, _, _ = engines.advance(boundary)
        engines.warm_up()
        if k % 15:
            continue
        want = promql.load_range(url, epoch.anchor_seconds, boundary, LAB_SCRAPE)
        assert sorted(want) == sorted(epoch.nodes), boundary
        for inst, node in want.items():
            got = [(list(s.ts), list(s.vs)) for s in epoch.nodes[inst].all_series()]
            assert got == [(list(s.ts), list(s.vs)) for s in node.all_series()], (boundary, inst)


def test_the_agent_decides_at_the_instants_its_trace_keeps(tmp_path: Path) -> None:
    """The agent's clock has sub-millisecond digits; `--record` keeps milliseconds. The
    engine's decisions turn on differences of instants (a decision is reused for under
    5 s), so the agent reads its instants as its trace keeps them. Fed the recorded
    sleep-loader run with +-0.4 ms on its instants, it said confidence 0.749 where the
    analysis of the trace says 0.742 (a real run: the end 1 s apart, 0.725 for 0.742)."""
    import dataclasses

    trace = FIXTURES / "parity" / "sleep-loader" / "trace.om.gz"
    text = read_text(trace)
    log = tmp_path / "live.jsonl"
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(log)), interval_seconds=1.0)
    for k, snap in enumerate(snapshots_of(text)):
        t = snap.timestamp_seconds + (4e-4 if k % 2 else -4e-4)  # type: ignore[attr-defined]
        proc.process(dataclasses.replace(snap, timestamp_seconds=t))  # type: ignore[type-var]
    proc.close()
    live = [w.to_json() for w in read_log(str(log))]
    plain = tmp_path / "trace.om"
    plain.write_text(text)
    out = tmp_path / "file.jsonl"
    assert run_analyze(str(plain), "--output", str(out)) == 0
    file = [json.loads(x) for x in out.read_text().splitlines()]
    assert file and [(w["start"], w["end"], w["confidence"]) for w in live] == [
        (w["start"], w["end"], w["confidence"]) for w in file
    ]
