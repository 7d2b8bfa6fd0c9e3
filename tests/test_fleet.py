"""`gpufeed fleet` against a real VictoriaMetrics loaded with two nodes' traces moved to the
last hour: the windows it logs are the offline analysis's, its ledger sums to the
allocation, and kill -9, a second replica and a TSDB outage neither lose nor repeat a
window."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from correlator_helpers import analyze_text, scenarios
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.node import CLUSTER_METRICS
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.promql import Retry
from gpufeed.correlator.outputs.windowlog import read_log
from gpufeed.fleet.carry import Epoch, FleetEngines, _apply
from gpufeed.fleet.cycle import CycleResult
from gpufeed.fleet.ledger import PRODUCTIVE
from gpufeed.fleet.service import FleetService, FleetSettings
from gpufeed.fleet.state import FleetState
from gpufeed.fleet.timing import CycleTiming
from procports import stop, wait_listening
from tsdb_vm import RestartableVictoria, shift_trace
from victoria import import_trace, settle
from window_match import assert_same_windows

pytestmark = pytest.mark.slow

MINUTES = 40
STEP = 5.0
INTERVAL = 60.0
LOOKBACK = 3600.0  # longer than the trace: every cycle sees it from its start


@dataclass(frozen=True)
class Fleet:
    vm: RestartableVictoria
    trace: str  # as loaded, moved in time
    start: float  # the trace's first sample
    end: float


def _trace() -> str:
    a, _ = scenarios.single("data_loading", "contended", seed=2, minutes=MINUTES)
    b, _ = scenarios.single("network", "congested", seed=3, sdk=False, minutes=MINUTES)
    # a second node with a job of its own: two jobs, so the fleet can be split along them
    b = b.replace('instance="node-t:9400"', 'instance="node-u:9400"')
    b = b.replace('job_id="node-t-a0"', 'job_id="node-u-a0"')
    body = [x for x in (a + b).splitlines() if x != "# EOF"]
    return "\n".join([*body, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    raw = _trace()
    first = 1_760_000_005.0
    # the trace ends 12 minutes ago, on the minute grid (the cycles' grid)
    offset = math.floor((time.time() - 12 * 60 - MINUTES * 60 - first) / 60) * 60
    trace = shift_trace(raw, offset)
    path = tmp_path_factory.mktemp("trace") / "trace.om"
    path.write_text(trace)
    vm = RestartableVictoria(tmp_path_factory.mktemp("vm"))
    vm.start()  # fails (never skips) where victoria-metrics is not installed
    try:
        import_trace(vm.url, path)
        settle(vm.url)  # every replica and cycle reads the same stored digits
        yield Fleet(vm, trace, first + offset, first + offset + MINUTES * 60)
    finally:
        vm.stop()


def _timing() -> CycleTiming:
    return CycleTiming(INTERVAL, LOOKBACK, STEP, 0.0, WindowParams().merge_gap_seconds)


def _expected(fleet: Fleet, tmp_path: Path) -> list[Window]:
    """The offline analysis of the same trace: the windows that closed before its data
    ended (those still open then are open for the fleet too)."""
    offline = analyze_text(fleet.trace, tmp_path)
    return [w for w in offline if w.end_seconds < fleet.end - 60]


def _key(w: Window) -> tuple[object, ...]:
    return (w.instance, w.gpu, w.job_id, w.start_seconds, w.end_seconds, w.cause.value)


@dataclass(frozen=True)
class Cycled:
    """A replica's cycles from the trace's start to the newest due boundary, run in process."""

    log: str
    state: FleetState
    results: tuple[CycleResult, ...]
    after: float  # the boundary after the last cycle


def _cycle(
    fleet: Fleet, log: Path, match: str = "", first: float | None = None, last: float = 0.0
) -> Cycled:
    """Cycles from the trace's start (or the boundary `first`: a cold start there) to `last`
    (or the newest due boundary)."""
    timing = _timing()
    b = timing.first_after(fleet.start) if first is None else first
    settings = FleetSettings(
        fleet.vm.url, match, timing, WindowParams(), str(log), start_seconds=fleet.start
    )
    svc = FleetService(settings)
    last = last or timing.due(time.time())
    began = time.monotonic()
    results = []
    while b <= last:
        results.append(svc.run_cycle(b))
        b += INTERVAL
    print(f"{match or 'unsplit'}: {len(results)} cycles in {time.monotonic() - began:.1f} s")
    svc.close()
    return Cycled(str(log), svc.state, tuple(results), b)


@pytest.fixture(scope="module")
def unsplit(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Cycled:
    return _cycle(fleet, tmp_path_factory.mktemp("unsplit") / "w.jsonl")


def test_cycles_log_the_offline_windows_and_a_ledger_that_sums(
    fleet: Fleet, unsplit: Cycled, tmp_path: Path
) -> None:
    timing, b = _timing(), unsplit.after
    logged = list(read_log(unsplit.log))
    expected = _expected(fleet, tmp_path)
    assert expected, "the trace has no closed windows: the test would prove nothing"
    assert_same_windows(
        [w.to_json() for w in sorted(expected, key=_key)],
        [w.to_json() for w in sorted(logged, key=_key)],
    )
    # the ledger: every job's states sum to its allocation (within 0.1%), and the
    # underutilized GPU-seconds are the windows' time inside the reported slices
    st = unsplit.state
    assert st.allocated_gpu_seconds
    for job, alloc in st.allocated_gpu_seconds.items():
        parts = sum(v for (j, _, _), v in st.gpu_seconds.items() if j == job)
        assert abs(parts - alloc) <= 0.001 * alloc, (job, parts, alloc)
    lost = sum(v for (_, s, _), v in st.gpu_seconds.items() if s != PRODUCTIVE)
    first_slice = timing.report_slice(timing.first_after(fleet.start))[0]
    in_slices = sum(
        max(
            0.0,
            min(w.end_seconds, timing.report_slice(b - INTERVAL)[1])
            - max(w.start_seconds, first_slice),
        )
        for w in logged
        if w.job_id
    )
    assert lost >= in_slices - STEP * len(logged)


def test_two_replicas_splitting_the_fleet_by_match_add_up_to_one(
    fleet: Fleet, unsplit: Cycled, tmp_path: Path
) -> None:
    """A fleet too big for one replica is split with complementary `--match` selectors
    (docs/fleet.md; bench/fleet_cycle.py --split at 1,000 nodes): each node, and so each
    job, in exactly one part. Cycle for cycle, the parts (started cold where windows close)
    log together the unsplit replica's windows, and their ledgers are its ledger."""
    closing = [r.boundary_seconds for r in unsplit.results if r.closed]
    first, last = closing[0] - INTERVAL, closing[-1] + INTERVAL
    one = 'instance="node-t:9400"'
    parts = [
        _cycle(fleet, tmp_path / f"{k}.jsonl", "{" + sel + "}", first, last)
        for k, sel in enumerate((one, one.replace("=", "!=", 1)))
    ]
    whole = [r for r in unsplit.results if first <= r.boundary_seconds <= last]
    assert len(whole) == len(parts[0].results) == len(parts[1].results) >= 3
    for k, part in enumerate(parts):
        assert any(r.closed for r in part.results), f"part {k} closed no window: proves nothing"
    for w, a, b in zip(whole, *(p.results for p in parts), strict=True):
        assert sorted(json.dumps(x.to_json(), sort_keys=True) for x in a.closed + b.closed) == (
            sorted(json.dumps(x.to_json(), sort_keys=True) for x in w.closed)
        ), w.boundary_seconds
        jobs = (a.ledger.allocated_gpu_seconds, b.ledger.allocated_gpu_seconds)
        assert all(jobs) and not jobs[0].keys() & jobs[1].keys()  # a job in one part only
        assert {**jobs[0], **jobs[1]} == w.ledger.allocated_gpu_seconds
        assert {**a.ledger.gpu_seconds, **b.ledger.gpu_seconds} == w.ledger.gpu_seconds


def _start(fleet: Fleet, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    argv = [
        sys.executable, "-m", "gpufeed", "fleet",
        f"--prometheus.url={fleet.vm.url}",
        f"--fleet.interval={2 * INTERVAL:g}", f"--fleet.lookback={LOOKBACK:g}",
        f"--fleet.step={STEP:g}", "--fleet.settle=0", f"--fleet.start={fleet.start:.0f}",
        f"--fleet.windows-log={log}", "--web.listen-address=127.0.0.1:0",
        "--ledger.price=2.5",
    ]  # fmt: skip
    err = open(log.with_suffix(".err"), "ab")  # noqa: SIM115 - the child's stderr
    proc = subprocess.Popen(argv, stderr=err)
    err.close()
    return proc, f"http://127.0.0.1:{wait_listening(proc)}"


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        k: float(v)
        for k, _, v in (ln.rpartition(" ") for ln in text.splitlines())
        if k and not k.startswith("#")
    }


def _wait(what: str, cond: object, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def _cursor(log: Path) -> float:
    try:
        return float(json.loads(Path(f"{log}.state.json").read_text())["cursor"] or 0)
    except (OSError, ValueError):
        return 0.0


def _caught_up(url: str) -> bool:
    try:
        m = _metrics(url)
    except OSError:
        return False
    return m.get("gpufeed_fleet_lag_seconds", 1.0) == 0.0 and "gpufeed_fleet_jobs" in m


def test_kill_replica_and_tsdb_outage_lose_and_repeat_nothing(fleet: Fleet, tmp_path: Path) -> None:
    log_a, log_b = tmp_path / "a" / "w.jsonl", tmp_path / "b" / "w.jsonl"
    for p in (log_a, log_b):
        p.parent.mkdir()
    a, url_a = _start(fleet, log_a)
    b, url_b = _start(fleet, log_b)
    try:
        first = _timing().first_after(fleet.start)
        _wait("replica a completes 3 cycles", lambda: _cursor(log_a) >= first + 4 * INTERVAL)
        os.kill(a.pid, signal.SIGKILL)  # mid-run: it is catching up
        a.wait(10)
        fleet.vm.stop()  # the TSDB goes down under replica b
        _wait(
            "replica b counts failed cycles",
            lambda: _metrics(url_b).get('gpufeed_fleet_cycles_total{result="error"}', 0) > 0,
            60,
        )
        with urllib.request.urlopen(url_b + "/metrics", timeout=10):
            pass  # still serving
        assert b.poll() is None
        assert _metrics(url_b)["gpufeed_fleet_lag_seconds"] > 0
        cursor_b = _cursor(log_b)
        time.sleep(3)
        assert _cursor(log_b) == cursor_b, "a cycle passed while the TSDB was down"
        fleet.vm.start()  # same port, same data
        a, url_a = _start(fleet, log_a)
        _wait("both replicas catch up", lambda: _caught_up(url_a) and _caught_up(url_b))
        ma, mb = _metrics(url_a), _metrics(url_b)
        with urllib.request.urlopen(url_b + "/api/windows?limit=10000", timeout=10) as r:
            served = json.loads(r.read())
        with urllib.request.urlopen(url_b + "/healthz", timeout=10) as r:
            assert r.status == 200
    finally:
        stop(a)
        stop(b)
    logged_a, logged_b = list(read_log(str(log_a))), list(read_log(str(log_b)))
    assert len({_key(w) for w in logged_a}) == len(logged_a), "a repeated a window"
    assert len({_key(w) for w in logged_b}) == len(logged_b), "b repeated a window"
    expected = sorted(_expected(fleet, tmp_path), key=_key)
    a = [w.to_json() for w in sorted(logged_a, key=_key)]
    assert a == [w.to_json() for w in sorted(logged_b, key=_key)]  # replicas agree exactly
    assert_same_windows([w.to_json() for w in expected], a)
    # /api/windows serves the log's windows (and those open at the last boundary)
    assert sorted(json.dumps(d, sort_keys=True) for d in served["windows"]) == sorted(
        json.dumps(w.to_json(), sort_keys=True) for w in logged_b
    )
    # two replicas, one killed and restarted: the same ledger, to the GPU-second
    ledger = [k for k in mb if k.startswith("gpufeed_fleet_job_")]
    assert ledger and {k: ma.get(k) for k in ledger} == {k: mb[k] for k in ledger}
    costs = [k for k in mb if k.startswith("gpufeed_fleet_job_cost_total")]
    assert costs, "a price was given: the ledger is in money too"


def test_a_held_back_job_names_its_culprit_once_and_the_ledger_its_straggler_time(
    tmp_path: Path,
) -> None:
    """A 4-node job whose node's CPUs starve: the fleet's cycles name that node as the
    culprit (one entry for the job, not one per victim), log the offline analysis's
    job-level windows, and book the victims' time as straggler with the culprit's cause."""
    from bench import multinode_scenarios as mn
    from gpufeed.correlator.job.culprit import correlate_jobs
    from gpufeed.fleet.metrics import Price

    tr = mn.build("cpu_starved", seed=3, nodes=4, gpus=4)
    first = float(tr.text.split("\n", 1)[0].rsplit(" ", 1)[1])
    last = float(tr.text.rsplit("\n", 3)[-3].rsplit(" ", 1)[1])
    # moved to end 5 minutes ago, its first sample on a minute (so every sample on the grid)
    offset = math.floor((time.time() - 5 * 60 - (last - first)) / 60) * 60 - first
    trace = shift_trace(tr.text, offset)
    path = tmp_path / "job.om"
    path.write_text(trace)
    vm = RestartableVictoria(tmp_path / "vm")
    vm.start()
    try:
        import_trace(vm.url, path)
        settle(vm.url)  # every replica and cycle reads the same stored digits
        log = str(tmp_path / "w.jsonl")
        timing = _timing()
        svc = FleetService(
            FleetSettings(vm.url, "", timing, WindowParams(), log, Price(3.0, "EUR"))
        )
        culprits = set()
        b = timing.first_after(first + offset)
        while b <= timing.due(time.time()):
            result = svc.run_cycle(b)
            culprits |= {(h.job_id, h.culprit_instance, h.cause) for h in result.held_back}
            if result.held_back:
                page = svc.page.decode()
            b += INTERVAL
        svc.close()
    finally:
        vm.stop()
    culprit = tr.instances[tr.stalls[0].node]
    assert culprits == {(tr.job_id, culprit, "preprocessing")}
    line = next(x for x in page.splitlines() if x.startswith("gpufeed_fleet_job_culprit_info{"))
    assert f'culprit_instance="{culprit}"' in line and 'cause="preprocessing"' in line
    # the offline job-level analysis of the same trace, closed before the data ended
    from gpufeed.trace.reader import read_trace

    nodes = read_trace(str(path)).nodes
    offline = correlate_jobs(nodes.values(), analyze_text(trace, tmp_path))
    end = last + offset
    want = sorted((w for w in offline if w.end_seconds < end - 60), key=_key)
    got = sorted(read_log(log), key=_key)
    assert any(w.cause.value == "straggler" for w in want)
    assert_same_windows([w.to_json() for w in want], [w.to_json() for w in got])
    st = svc.state
    straggling = {k: v for k, v in st.gpu_seconds.items() if k[1] == "straggler"}
    assert straggling and {k[2] for k in straggling} == {"preprocessing"}
    alloc = st.allocated_gpu_seconds[tr.job_id]
    assert abs(sum(v for k, v in st.gpu_seconds.items() if k[0] == tr.job_id) - alloc) <= (
        0.001 * alloc
    )
    assert 'gpufeed_fleet_job_cost_total{culprit_cause="preprocessing",currency="EUR"' in page


def test_a_chunk_the_warm_up_epoch_does_not_get_brings_no_labels_already_routed(
    fleet: Fleet,
) -> None:
    """fleet/carry.py: a cold cycle fetches the reporting epoch's range chunk by chunk. The
    warm-up epoch, whose anchor is later, is not asked about the chunks before it, so a
    series the reporting epoch has routed comes without its labels. (Asked, its empty
    column cache had every series' labels decoded again, chunk after chunk: at 256 nodes
    a cold cycle's heap peaked at twice what it kept, and pymalloc kept the difference.)"""
    timing = CycleTiming(INTERVAL, 600.0, STEP, 0.0, WindowParams().merge_gap_seconds)
    engines = FleetEngines(fleet.vm.url, timing, WindowParams(), "", Retry())
    a = math.ceil(fleet.start / 600) * 600  # an anchor with data on both sides
    engines.epochs = {a: Epoch(a, a - STEP), a + 600: Epoch(a + 600, a + 600 - STEP)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        _, _, chunk = engines._fetch(pool, a, a + 9 * STEP)
        _apply(engines.epochs[a], chunk, WindowParams())
        _, _, (_, parsed, *_) = engines._fetch(pool, a + 10 * STEP, a + 19 * STEP)
    routed = engines.epochs[a].columns
    items = [(m, k, text) for m, its in parsed if m not in CLUSTER_METRICS for k, text, _, _ in its]
    seen = [(m, text) for m, k, text in items if k in routed.get(m, {})]
    assert len(seen) > 100  # both nodes' GPUs, jobs, tiers: the reporting epoch has them
    assert [x for x in seen if x[1] is not None] == []
