"""A rank lost without closing its job (SIGKILL, a hard crash) is the culprit (issue 13).

Node 1's rank is killed at 120 s: its agent sees the pid gone (`gpufeed_job_rank_lost` 1,
and 137 from `gpufeed run` where it launched it), its job's processes there drop to 0.
Node 0's rank blocks in the all-reduce it can never finish (NCCL waits for its timeout)
and reports that wait as it grows. The job-level join names the lost rank, with how it
ended, only for a stall that follows the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from correlator_helpers import T0, trace_text
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.job.culprit import correlate_jobs, lost_rank
from gpufeed.trace.reader import read_trace

NODES = ("node-0:9400", "node-1:9400")
END = 240.0
PARAMS = WindowParams(min_window_seconds=15.0, merge_gap_seconds=10.0)  # the lab's


def job(
    killed_at: float, hang_at: float, status: float | None, victim_exit_at: float = 1e9
) -> Callable[[float], Iterable[tuple[str, float | None]]]:
    """One rank per node, 10 steps a second. Node 1's rank dies at `killed_at` (seen lost
    at the next scrape; its exit `status` where its launcher said it); node 0's rank goes
    on (an elastic job) until `hang_at`, then waits in a collective that never returns,
    or (gloo) fails and exits 1 after closing its job at `victim_exit_at`."""
    acc = {(n, k): 0.0 for n in range(2) for k in ("compute", "wait", "steps")}
    last = [T0]

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s, dt = t - T0, t - last[0]
        last[0] = t
        for n, inst in enumerate(NODES):
            dead = n == 1 and s > killed_at
            failed = n == 0 and s > victim_exit_at
            if not dead and s < hang_at:
                acc[n, "compute"] += 0.9 * dt
                acc[n, "wait"] += 0.2 * dt
                acc[n, "steps"] += 10 * dt
            elif not dead and not failed:
                acc[n, "wait"] += dt  # blocked in the all-reduce, reported in flight
            jl = f'job_id="j1",name="ddp",instance="{inst}"'
            rl = f'job_id="j1",rank="{n}",instance="{inst}"'
            yield f'gpufeed_job_phase_seconds_total{{{jl},phase="compute"}}', acc[n, "compute"]
            yield f'gpufeed_job_phase_seconds_total{{{jl},phase="startup"}}', 2.0
            yield (
                f'gpufeed_job_rank_phase_seconds_total{{{rl},phase="collective_wait"}}',
                acc[n, "wait"],
            )
            yield f'gpufeed_job_rank_info{{{rl},world_size="2"}}', 1.0
            yield f"gpufeed_job_rank_lost{{{rl}}}", 1.0 if dead else 0.0
            if dead:
                yield f"gpufeed_job_rank_exit_status{{{rl}}}", status
            if failed:
                yield f"gpufeed_job_rank_exit_status{{{rl}}}", 1.0
            yield f"gpufeed_job_steps_total{{{jl}}}", float(int(acc[n, "steps"]))
            yield f"gpufeed_job_processes{{{jl}}}", 0.0 if dead or failed else 1.0

    return gen


def _analyse(
    tmp_path: object,
    killed_at: float,
    hang_at: float,
    status: float | None = 137.0,
    victim_exit_at: float = 1e9,
) -> tuple[list[dict[str, object]], dict[str, object]]:
    path = f"{tmp_path}/trace.om"
    with open(path, "w") as f:
        f.write(trace_text(job(killed_at, hang_at, status, victim_exit_at), END, interval=1.0))
    nodes = read_trace(path).nodes
    ws = correlate_jobs(nodes.values(), analyze_nodes(nodes.values(), PARAMS), 0.8)
    return [w.to_json() for w in ws], dict(nodes)


def test_the_killed_rank_is_named_with_its_signal(tmp_path: object) -> None:
    ws, _ = _analyse(tmp_path, killed_at=120.0, hang_at=120.0)
    victim = [w for w in ws if w["instance"] == NODES[0]]
    assert len(victim) == 1, ws
    w = victim[0]
    ev = w["evidence"]
    assert isinstance(ev, dict)
    assert w["cause"] == Cause.STRAGGLER.value, ws
    assert abs(float(w["start"]) - T0 - 120.0) <= 5, ws
    assert ev["culprit"] == {
        "instance": NODES[1],
        "gpu": "",
        "uuid": "",
        "rank": "1",
        "cause": Cause.IDLE.value,
    }, w
    assert (ev["culprit_signal"], ev["culprit_exit"]) == ("rank_lost", "killed by signal 9")
    assert str(ev["summary"]).endswith(
        f"job j1 waits on {NODES[1]} (rank 1), whose rank process was killed by signal 9"
    ), ev["summary"]


def _own(ws: list[dict[str, object]], inst: str) -> list[tuple[str, str]]:
    out = []
    for w in ws:
        ev = w["evidence"]
        assert isinstance(ev, dict)
        if w["instance"] == inst:
            out.append((str(w["cause"]), str(ev["summary"])))
    return out


def test_the_killed_ranks_node_says_how_its_rank_ended(tmp_path: object) -> None:
    """Node 1 runs nothing of the job after the kill: `idle`, saying which rank and how
    (its job's series stay for the agent's grace period: the job was brought down)."""
    ws, _ = _analyse(tmp_path, killed_at=120.0, hang_at=120.0)
    assert _own(ws, NODES[1]) == [
        (
            "idle",
            "CPU job (job j1) runs nothing of its job any more: its rank 1 (killed by "
            "signal 9) here ended without closing the job",
        )
    ], ws


def test_a_peer_that_fails_with_it_is_its_victim(tmp_path: object) -> None:
    """gloo: node 0's collective fails 6 s after the kill, its rank exits 1 after closing
    its job. Its job was brought down while it waited in the collective (`straggler` on
    its own node: `job_failed_in_collective`); the join names the lost rank."""
    ws, _ = _analyse(tmp_path, killed_at=120.0, hang_at=120.0, victim_exit_at=126.0)
    mine = [w for w in ws if w["instance"] == NODES[0]]  # waiting, then brought down
    for w in mine:
        ev = w["evidence"]
        assert isinstance(ev, dict)
        assert (w["cause"], ev["culprit_signal"]) == ("straggler", "rank_lost"), w
    assert abs(float(mine[0]["start"]) - T0 - 120.0) <= 5, mine
    assert float(mine[-1]["end"]) - T0 >= END - 5, mine
    # its own node's reason: its rank failed while it waited in the collective
    last = mine[-1]["evidence"]
    assert isinstance(last, dict) and last["job_failed_in_collective"] == 1.0, last


def test_without_the_launchers_status_it_exited_without_closing(tmp_path: object) -> None:
    """The SDK in-process cannot say how it died: the agent only saw its pid gone."""
    ws, _ = _analyse(tmp_path, killed_at=120.0, hang_at=120.0, status=None)
    (w,) = [w for w in ws if w["instance"] == NODES[0]]
    ev = w["evidence"]
    assert isinstance(ev, dict)
    assert ev["culprit_exit"] == "exited without closing the job", ev
    assert "whose rank process exited without closing the job" in str(ev["summary"])


def test_a_rank_lost_long_before_the_stall_does_not_explain_it(tmp_path: object) -> None:
    """A peer's fault explains a stall only if the stall follows it: node 1's rank died at
    40 s, node 0 trained on alone (elastic) until its own hang at 150 s."""
    ws, nodes = _analyse(tmp_path, killed_at=40.0, hang_at=150.0)
    (w,) = [w for w in ws if w["instance"] == NODES[0]]
    ev = w["evidence"]
    assert isinstance(ev, dict)
    assert ev.get("culprit_signal") != "rank_lost", w
    start = float(w["start"])  # type: ignore[arg-type]
    assert lost_rank("j1", nodes, start, start + 60) is None  # type: ignore[arg-type]
    # the same loss against a stall that begins with it: named
    got = lost_rank("j1", nodes, T0 + 40.0, T0 + 100.0)  # type: ignore[arg-type]
    assert got == (NODES[1], "1", "killed by signal 9")


def test_a_rank_stopped_on_request_did_not_bring_its_job_down(tmp_path: object) -> None:
    """SIGTERM (143: a cancelled or preempted job) is a stop, not a failure: its node's job
    simply ended; a peer that still waits for it names it all the same."""
    ws, _ = _analyse(tmp_path, killed_at=120.0, hang_at=120.0, status=143.0)
    assert _own(ws, NODES[1]) == [], ws
    (w,) = [w for w in ws if w["instance"] == NODES[0]]
    ev = w["evidence"]
    assert isinstance(ev, dict)
    assert ev["culprit_exit"] == "killed by signal 15", ev


def test_a_rank_lost_again_after_a_restart_explains_the_stall_after_its_second_loss(
    tmp_path: object,
) -> None:
    """An elastic job: node 1's rank was killed at 40 s, restarted at 60 s (lost 0 again),
    killed again at 150 s. The stall that begins at 150 s follows the second loss, which
    the first (long before it) must not hide."""

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        lost = 40.0 < s <= 60.0 or s > 150.0
        rl = f'job_id="j1",rank="1",instance="{NODES[1]}"'
        yield f"gpufeed_job_rank_lost{{{rl}}}", 1.0 if lost else 0.0
        yield f"gpufeed_job_rank_exit_status{{{rl}}}", 137.0 if lost else None
        yield f'gpufeed_job_processes{{job_id="j1",name="ddp",instance="{NODES[1]}"}}', 0.0

    path = f"{tmp_path}/trace.om"
    with open(path, "w") as f:
        f.write(trace_text(gen, END, interval=1.0))
    nodes = read_trace(path).nodes
    assert lost_rank("j1", nodes, T0 + 150.0, T0 + 200.0) == (  # type: ignore[arg-type]
        NODES[1],
        "1",
        "killed by signal 9",
    )
    assert lost_rank("j1", nodes, T0 + 100.0, T0 + 115.0) is None  # type: ignore[arg-type]


def test_a_streamed_analysis_keeps_when_each_rank_was_lost() -> None:
    """`analyze --prometheus` streams a long range in chunks and trims each node's columns
    to the engine's lookback (stream.KEEP_SECONDS) before the job-level join reads the
    whole batch. A rank lost at 100 s of a 3-hour range (and lost since) must still
    explain the stall at 100 s, and not seem lost anew where the trim cut its series."""
    from gpufeed.correlator.engine.node import NodeSeries
    from gpufeed.correlator.engine.series import Series
    from gpufeed.correlator.feeds.stream import KEEP_SECONDS, _trim

    n = NodeSeries(NODES[1])
    j = n.job("j1")
    lost = j.rank_lost["1"] = Series()
    status = j.rank_exit_status["1"] = Series()
    for t in range(0, 10_800, 5):
        lost.append(T0 + t, 1.0 if t >= 100 else 0.0)
        if t >= 100:
            status.append(T0 + t, 137.0)
    cut = T0 + 10_800 - KEEP_SECONDS
    _trim(n, cut)
    nodes = {NODES[1]: n}
    assert lost_rank("j1", nodes, T0 + 100.0, T0 + 160.0) == (NODES[1], "1", "killed by signal 9")
    assert lost_rank("j1", nodes, cut, cut + 60.0) is None
