"""The job level on parallel jobs slow from their first step (issue 24): culprits are ranks,
not nodes; a pipeline stage slower on every replica and a rotating slowest data-parallel
rank are the job's own imbalances (`straggler` with `straggler_reason`, no culprit).
Traces: bench/multinode_scenarios.py's PARALLEL_SCENARIOS (the figures at 8-128 ranks are
bench/parallel_culprit.py's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import multinode_scenarios as mn
from correlator_helpers import analyze_text
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.correlator.job.frontier import Frontier, by_turns
from gpufeed.trace.reader import read_trace


def _joined(
    kind: str, tmp_path: Path, coords: bool = True, **layout: int
) -> tuple[mn.ParallelTrace, list[Window]]:
    shape = {"dp": 2, "pp": 2, "tp": 2, "gpus": 4, **layout}
    tr = mn.build_parallel(kind, seed=2, step_seconds=2.0, duration=600.0, coords=coords, **shape)
    windows = analyze_text(tr.text, tmp_path)
    nodes = read_trace(os.path.join(str(tmp_path), "trace.om")).nodes
    return tr, correlate_jobs(nodes.values(), windows)


def _covered(tr: mn.ParallelTrace, windows: list[Window], ok: object) -> float:
    """The labelled GPU-time inside straggler windows for which ok(window, label) holds,
    over all labelled time."""
    got = total = 0.0
    for lab in tr.labels:
        total += lab.end - lab.start
        for w in windows:
            if (w.instance, w.gpu) != (lab.instance, lab.gpu) or w.cause.value != "straggler":
                continue
            if ok(w, lab):  # type: ignore[operator]
                got += max(0.0, min(w.end_seconds, lab.end) - max(w.start_seconds, lab.start))
    return got / total


def test_a_slow_worker_is_its_ranks_and_its_node_neighbours_are_victims(tmp_path: Path) -> None:
    """One replica's stage (2 of its node's 4 GPUs) is 2.4x slower from the first step: the
    culprit is those GPUs and ranks, and the node's other 2 GPUs, which wait like every
    victim, are `straggler` naming them (0.2.0 named the node and left those 2 alone)."""
    tr, windows = _joined("slow_worker", tmp_path)
    culprit = tr.labels[0].culprit_instance, tr.labels[0].culprit_gpu
    assert "," in culprit[1]  # several GPUs of one node, not the node
    share = _covered(
        tr,
        windows,
        lambda w, lab: w.culprit is not None and (w.culprit.instance, w.culprit.gpu) == culprit,
    )
    assert share >= 0.9, share
    neighbours = [lab for lab in tr.labels if lab.instance == culprit[0]]
    assert neighbours  # the node holds another replica's ranks
    for lab in neighbours:
        mine = [w for w in windows if (w.instance, w.gpu) == (lab.instance, lab.gpu)]
        assert mine and all(w.cause.value == "straggler" and w.culprit for w in mine), mine
    some = next(w for w in windows if w.culprit is not None)
    ranks = some.culprit.rank.split(",")  # type: ignore[union-attr]
    assert len(ranks) == len(culprit[1].split(",")) and all(r.isdigit() for r in ranks)
    assert f"GPUs {culprit[1]}" in some.summary
    # the frontier's additive account: nearly all of the job's exposed wait is theirs
    share = dict(some.evidence)["culprit_wait_share"]
    assert isinstance(share, float) and share >= 0.9, share


def test_a_stage_slower_on_every_replica_is_a_stage_imbalance(tmp_path: Path) -> None:
    """The last stage computes 1.6x longer on every replica; with coordinates the other
    stages' windows say so, with the stage and its factor, and blame no node (without
    them its ranks, all on one node here, are that node: the old answer)."""
    tr, windows = _joined("slow_stage", tmp_path)
    right = _covered(
        tr,
        windows,
        lambda w, lab: (
            w.culprit is None and dict(w.evidence).get("straggler_reason") == "stage_imbalance"
        ),
    )
    assert right >= 0.9, right
    assert not any(w.culprit for w in windows)
    w = next(w for w in windows if dict(w.evidence).get("straggler_reason"))
    ev = dict(w.evidence)
    assert ev["pipeline_stage"] == 1
    assert 1.4 <= float(ev["stage_factor"]) <= 1.8, ev  # type: ignore[arg-type]
    assert "pipeline stage 1 is the bottleneck on every replica" in w.summary
    assert "rebalance its layers" in w.summary
    (tmp_path / "bare").mkdir()
    _tr, bare = _joined("slow_stage", tmp_path / "bare", coords=False)
    assert not any(dict(w.evidence).get("straggler_reason") for w in bare)


def test_a_rotating_slowest_replica_is_an_input_imbalance(tmp_path: Path) -> None:
    tr, windows = _joined("rotating_imbalance", tmp_path, dp=4, pp=1, tp=1, gpus=2)
    right = _covered(
        tr,
        windows,
        lambda w, lab: (
            w.culprit is None and dict(w.evidence).get("straggler_reason") == "input_imbalance"
        ),
    )
    inside = _covered(tr, windows, lambda w, lab: True)
    assert inside > 0 and right >= 0.9 * inside, (right, inside)
    assert not any(w.culprit for w in windows)
    w = next(w for w in windows if dict(w.evidence).get("straggler_reason"))
    assert "the slowest data-parallel rank changes every step" in w.summary


@pytest.mark.parametrize(
    ("gates", "groups", "persistent", "turns"),
    [
        # the same two ranks gate every step: persistent, no rotation
        ([{"a", "b"}] * 6, {"a": 0, "b": 0, "c": 1}, {"a", "b"}, 0),
        # replicas 0, 1, 2 take turns: a rotation of 3
        ([{"a"}, {"c"}, {"e"}, {"a"}, {"e"}, {"c"}], {"a": 0, "c": 1, "e": 2}, set(), 3),
        # two replicas alternating: a rotation of 2
        ([{"a"}, {"c"}] * 4, {"a": 0, "c": 1}, set(), 2),
        # one replica gates 4 of 6 steps: neither persistent nor rotating enough
        ([{"a"}, {"a"}, {"a"}, {"a"}, {"c"}, {"c"}], {"a": 0, "c": 1}, {("n", "a")}, 0),
        # too few steps decide nothing
        ([{"a"}, {"c"}], {"a": 0, "c": 1}, set(), 0),
        # two replicas by turns, one gating 6 of 9 (over PERSISTENT_SHARE, as turns at
        # random give 25% of the time): still a rotation of 2
        (
            [{"a"}, {"c"}, {"a"}, {"a"}, {"c"}, {"a"}, {"c"}, {"a"}, {"a"}],
            {"a": 0, "c": 1},
            {("n", "a")},
            2,
        ),
        # one of two replicas gates every one of 8 steps: no rotation
        ([{"a"}] * 8, {"a": 0, "c": 1}, {("n", "a")}, 0),
    ],
)
def test_the_frontier_tells_persistent_from_rotating_gates(
    gates: list[set[str]], groups: dict[str, int], persistent: set[object], turns: int
) -> None:
    keyed = tuple(frozenset(("n", r) for r in g) for g in gates)
    fr = Frontier(len(gates), len(gates), 1.0, keyed, {}, {})
    want = {k if isinstance(k, tuple) else ("n", k) for k in persistent}
    assert set(fr.persistent()) == want
    assert fr.rotating({("n", r): g for r, g in groups.items()}) == turns


@pytest.mark.parametrize(
    ("gated", "slices", "groups", "turns"),
    [
        (6, 9, 2, True),  # 25% of the time by chance
        (5, 5, 2, False),  # 3%: a culprit
        (9, 9, 2, False),
        (3, 9, 8, True),  # 3 of 9 for one of 8 replicas: 5.3%
        (5, 9, 8, False),
        (4, 4, 1, False),  # one replica: no turns to take
    ],
)
def test_a_share_turns_give_is_no_persistent_gate(
    gated: int, slices: int, groups: int, turns: bool
) -> None:
    assert by_turns(gated, slices, groups) is turns


def test_the_fleet_tells_the_jobs_owner_of_a_stage_imbalance_once(tmp_path: Path) -> None:
    """The fleet's report of a stage-imbalanced job: one gpufeed_fleet_job_imbalance_info
    (the stage named), no culprit to page on-call with (GpuJobHeldBack stays quiet)."""
    from gpufeed.correlator.engine.engine import WindowParams
    from gpufeed.correlator.feeds.analyze import analyze_nodes
    from gpufeed.fleet.cycle import report
    from gpufeed.fleet.metrics import Progress, render
    from gpufeed.fleet.state import FleetState
    from gpufeed.fleet.timing import CycleTiming

    tr = mn.build_parallel("slow_stage", seed=2, dp=2, pp=2, tp=2, gpus=4, duration=600.0)
    path = tmp_path / "job.om"
    path.write_text(tr.text)
    nodes = list(read_trace(str(path)).nodes.values())
    params = WindowParams()
    windows = analyze_nodes(nodes, params, jobs=1)
    timing = CycleTiming(60.0, 3600.0, 5.0, 0.0, params.merge_gap_seconds)
    boundary = timing.first_after(tr.end - 120.0)
    result = report(nodes, [], windows, boundary, timing, params)
    assert result.held_back == ()
    assert [(x.job_id, x.reason, x.pipeline_stage) for x in result.imbalanced] == [
        (tr.job_id, "stage_imbalance", "1")
    ]
    assert result.imbalanced[0].waiting_gpus == 4  # stage 0's GPUs; stage 1 computes
    page = render(FleetState(), result, Progress(0.0, 1, 0, 0, None), None).decode()
    lines = [x for x in page.splitlines() if x.startswith("gpufeed_fleet_job_")]
    assert not any(x.startswith("gpufeed_fleet_job_culprit_info{") for x in lines)
    line = next(x for x in lines if x.startswith("gpufeed_fleet_job_imbalance_info{"))
    assert 'reason="stage_imbalance"' in line and 'pipeline_stage="1"' in line


@pytest.mark.parametrize("guise", ["spin", "compute_only"])
def test_steps_near_the_sample_interval_put_the_victims_waits_inside_windows(
    tmp_path: Path, guise: str
) -> None:
    """Steps of ~9 s, samples every 5 s: the step counter moves at sample instants only,
    so two adjacent moves read a 5 s step and the next pair 10 s, and the victims were
    judged per sample half the time, reading 0.2-1.0 as the step beat with the sampling
    (0.30 of their waiting time inside windows); the step is read over moves several
    samples apart and judged over whole steps now."""
    from bench.parallel_culprit import score

    tr = mn.build_parallel(
        "slow_stage", seed=2, dp=2, pp=2, tp=2, gpus=4, step_seconds=6.0, duration=900.0,
        guise=guise,
    )  # fmt: skip
    s = score(tr, analyze_text(tr.text, tmp_path))
    assert s.truth_s > 0 and s.windowed_s / s.truth_s >= 0.95, s


@pytest.mark.parametrize("guise", ["spin", "compute_only"])
def test_long_steps_put_the_victims_waits_inside_windows(tmp_path: Path, guise: str) -> None:
    """46 s steps, the last stage 1.6x slower: the other stages work ~58% of every step and
    wait the rest. Judged over their job's steps (engine._over_step) their whole waiting
    time is inside windows, in both guises; the generator once wrote one node-level step
    count for the job's 4 ranks there, read as steps 4x as long, so the step rule never
    applied and those GPUs, low 58% of each minute, opened no window at all."""
    from bench.parallel_culprit import score

    tr = mn.build_parallel(
        "slow_stage", seed=2, dp=2, pp=2, tp=2, gpus=4, step_seconds=46.0, duration=1840.0,
        guise=guise,
    )  # fmt: skip
    s = score(tr, analyze_text(tr.text, tmp_path))
    assert s.truth_s > 0 and s.windowed_s / s.truth_s >= 0.95, s


def test_parallel_jobs_spin_by_default_and_name_their_guise() -> None:
    """NCCL's reading is the default for a multi-node job (issue 24): a waiting GPU reads
    busy while its SM activity stays low; compute_only reads the compute share."""
    spin = mn.build_parallel("slow_stage", seed=2, dp=2, pp=2, tp=2, gpus=4, duration=200.0)
    flat = mn.build_parallel(
        "slow_stage", seed=2, dp=2, pp=2, tp=2, gpus=4, duration=200.0, guise="compute_only"
    )

    def victims_mean(text: str) -> float:
        got = [
            float(ln.rsplit(" ", 2)[1])
            for ln in text.splitlines()
            if ln.startswith("gpufeed_gpu_utilization_ratio")
            and 'instance="node-00:9842"' in ln
            and ('gpu="0"' in ln or 'gpu="1"' in ln)  # stage 0: victims
        ]
        return sum(got) / len(got)

    assert victims_mean(spin.text) >= 0.9
    assert victims_mean(flat.text) < 0.8
    with pytest.raises(ValueError, match="unknown guise"):
        mn.build_parallel("slow_stage", guise="spinning")


def test_the_frontiers_step_is_the_jobs_step_not_its_counters(tmp_path: Path) -> None:
    """`gpufeed_job_steps_total` sums the steps of the job's processes on a node (4 ranks
    here): the frontier's slices are one step of the job long, not a quarter of one."""
    from gpufeed.correlator.job.frontier import step_seconds

    tr = mn.build_parallel(
        "slow_worker", seed=2, dp=2, pp=2, tp=2, gpus=4, step_seconds=20.0, duration=800.0
    )
    path = tmp_path / "job.om"
    path.write_text(tr.text)
    nodes = read_trace(str(path)).nodes
    got = step_seconds(nodes, tr.job_id, tr.start + 100.0, tr.end - 100.0)
    assert 35.0 <= got <= 60.0, got  # 2.4 x 0.9 x 20 s of the slow worker plus the rest


def _rotating_in_windows(
    tmp_path: Path, guise: str, step: float, dp: int, pp: int = 1, tp: int = 1, gpus: int = 2
) -> float:
    from bench.parallel_culprit import score

    tr = mn.build_parallel(
        "rotating_imbalance", seed=2, dp=dp, pp=pp, tp=tp, gpus=gpus, step_seconds=step,
        duration=max(900.0, 40 * step), guise=guise,
    )  # fmt: skip
    windows = analyze_text(tr.text, tmp_path)
    nodes = read_trace(os.path.join(str(tmp_path), "trace.om")).nodes
    s = score(tr, correlate_jobs(nodes.values(), windows))
    assert s.truth_s > 0 and s.of_windowed >= 0.9 and s.blamed_s == 0, s
    return s.windowed_s / s.truth_s


def test_spinning_ranks_that_all_wait_alike_are_inside_windows(tmp_path: Path) -> None:
    """A rotating imbalance at 1 s steps sampled every 5 s, NCCL spinning: every sample
    holds five steps, each replica gated some of them, so every rank waits alike over the
    sample and the least any rank waited (the old reference) hid it: nothing opened. A
    rank's exposed wait is work it does not do, whatever the other ranks do: its waiting
    time is inside windows naming the input imbalance, as in the compute-only guise."""
    spin = _rotating_in_windows(tmp_path, "spin", 1.0, dp=4)
    assert spin >= 0.95, spin


def test_one_high_step_does_not_end_a_long_step_window(tmp_path: Path) -> None:
    """46 s steps, the slowest of 8 replicas drawn each step: a rank works flat out in the
    steps it gates and waits in the others. Judged over its trailing step, one gating step
    read high for longer than the merge gap and closed its window, and the lone waiting
    step after it was too short to open one (0.93 of the waiting time in windows); a
    recovery no longer than the step it was judged over is one step high now."""
    got = _rotating_in_windows(tmp_path, "compute_only", 46.0, dp=8)
    assert got >= 0.95, got


@pytest.mark.parametrize(
    ("guise", "step"), [("compute_only", 1.0), ("spin", 5.0), ("compute_only", 46.0)]
)
def test_two_replicas_that_gate_by_turns_are_judged_as_one_job(
    tmp_path: Path, guise: str, step: float
) -> None:
    """Two replicas, the slower drawn each step (the 8-rank row of bench.parallel_culprit):
    each rank gates about half the steps, working flat out then, and waits 40% of the
    others; it works 0.77 of its time against the 0.80 threshold, so a sample or a step
    read above it a third of the time and its windows came and went (0.47-0.86 of the
    waiting time inside them). The job's GPUs average below the threshold at every
    instant and each rank shares the job's wait over the long run (SHARED_WAIT_SECONDS):
    a rank is low through the steps it gates too."""
    got = _rotating_in_windows(tmp_path, guise, step, dp=2, pp=2, tp=2, gpus=4)
    assert got >= 0.95, got


def test_a_rank_that_gates_every_step_keeps_its_own_reading(tmp_path: Path) -> None:
    """The job-wide judgement takes in only ranks that share the job's wait: a slow
    worker's own ranks, flat out on every step, wait only their all-reduce and open no
    window of their own (the join names them from their victims' windows)."""
    tr, windows = _joined("slow_worker", tmp_path)
    own = {(lab.culprit_instance, g) for lab in tr.labels for g in lab.culprit_gpu.split(",") if g}
    assert own, "the slow worker names its GPUs"
    mine = [w for w in windows if (w.instance, w.gpu) in own]
    assert not mine, [(w.instance, w.gpu, w.cause.value, w.start_seconds) for w in mine]
