"""A stopped rank (SIGSTOP: a hang) is the culprit (issue 13).

Its peers block in a collective that never returns, so no rank finishes a step and no
phase moves anywhere; what tells them apart is the wait in flight, which `gpufeed run` and
the SDK report each second while a collective blocks (sdk.Job.collective_begin): the
victims' collective wait grows at one second per second, the stopped rank's stands still.
So the victims are `straggler` (waiting, not stopped), the job-level join names the rank
that waits least, and the stopped rank's own node says its job stopped working (`idle`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from correlator_helpers import T0, trace_text
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.trace.reader import read_trace

NODES = ("node-0:9400", "node-1:9400")
STOP = (120.0, 170.0)  # node 1's rank stopped
END = 240.0
PARAMS = WindowParams(min_window_seconds=15.0, merge_gap_seconds=10.0)  # the lab's


def job(in_flight: bool) -> Callable[[float], Iterable[tuple[str, float | None]]]:
    """One rank per node, 10 steps a second, 0.9 of the time computing (0.2 of it in the
    gradient all-reduce). While node 1's rank is stopped: nothing moves on node 1, and
    node 0's rank waits in its all-reduce (reported as it grows with `in_flight`)."""
    acc = {(n, k): 0.0 for n in range(2) for k in ("compute", "data_wait", "wait", "steps")}
    last = [T0]

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s, dt = t - T0, t - last[0]
        last[0] = t
        stopped = STOP[0] <= s < STOP[1]
        for n, inst in enumerate(NODES):
            if not stopped:
                acc[n, "compute"] += 0.9 * dt
                acc[n, "data_wait"] += 0.1 * dt
                acc[n, "wait"] += 0.2 * dt
                acc[n, "steps"] += 10 * dt
            elif n == 0 and in_flight:
                acc[n, "wait"] += dt
            jl = f'job_id="j1",name="ddp",instance="{inst}"'
            rl = f'job_id="j1",rank="{n}",instance="{inst}"'
            for phase in ("compute", "data_wait"):
                yield f'gpufeed_job_phase_seconds_total{{{jl},phase="{phase}"}}', acc[n, phase]
            yield f'gpufeed_job_phase_seconds_total{{{jl},phase="startup"}}', 2.0
            yield (
                f'gpufeed_job_rank_phase_seconds_total{{{rl},phase="collective_wait"}}',
                acc[n, "wait"],
            )
            yield f'gpufeed_job_rank_info{{{rl},world_size="2"}}', 1.0
            yield f"gpufeed_job_steps_total{{{jl}}}", float(int(acc[n, "steps"]))
            yield f"gpufeed_job_processes{{{jl}}}", 1.0

    return gen


def _windows(in_flight: bool, tmp_path: object) -> list[tuple[str, str, float, float, str]]:
    path = f"{tmp_path}/trace.om"
    with open(path, "w") as f:
        f.write(trace_text(job(in_flight), END, interval=1.0))
    nodes = read_trace(path).nodes
    ws = correlate_jobs(nodes.values(), analyze_nodes(nodes.values(), PARAMS), 0.8)
    return [
        (
            w.instance,
            w.cause.value,
            w.start_seconds - T0,
            w.end_seconds - T0,
            f"{w.culprit.instance}/{w.culprit.rank}/{w.culprit.cause.value}" if w.culprit else "",
        )
        for w in ws
    ]


def test_the_stopped_rank_is_named_by_the_rank_that_waits(tmp_path: object) -> None:
    ws = _windows(True, tmp_path)
    victim = [w for w in ws if w[0] == NODES[0]]
    assert len(victim) == 1, ws
    _, cause, start, end, culprit = victim[0]
    assert cause == "straggler", ws
    assert abs(start - STOP[0]) <= 5 and abs(end - STOP[1]) <= 8, ws
    assert culprit.startswith(f"{NODES[1]}/1/"), ws
    # the stopped rank's node: its job holds on and does not step
    own = [w for w in ws if w[0] == NODES[1]]
    assert [w[1] for w in own] == [Cause.IDLE.value], ws
    assert culprit == f"{NODES[1]}/1/idle", ws


def test_without_the_wait_in_flight_every_rank_looks_stopped(tmp_path: object) -> None:
    """The control: with waits reported only when a collective returns (before), both
    nodes' jobs stand still alike, both read `idle`, and nobody is named."""
    ws = _windows(False, tmp_path)
    assert {w[1] for w in ws} == {"idle"} and not any(w[4] for w in ws), ws
