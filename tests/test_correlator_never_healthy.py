"""A job slow from its first step (issue 24): no healthy past to compare with.

Traces: bench/never_healthy.py (a data-parallel job whose slow worker computes 2.4x longer
from the first step; steps span samples), 2 nodes x 4 GPUs. The reference is the rest of
the job at the same instant (engine/peers.py), and a GPU is judged over its job's step
(engine._over_step), so a GPU that waits 58% of a 46 s step is judged like one with 1 s
steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import never_healthy as nh
from bench import never_healthy_accuracy as acc
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.names import Context
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.analyze import analyze_node
from gpufeed.trace.reader import read_trace

PARAMS = WindowParams()


def _trace(step: float, guise: str, **kw: object) -> nh.Trace:
    return nh.build(step, nodes=2, gpus=4, guise=guise, culprit_gpus=2, steps=12, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("step", "guise", "gpm"),
    [
        (46.0, "spin", True),  # NCCL: every victim reads ~100% busy; SM activity shows it
        (46.0, "spin", False),  # no GPM: the ranks' collective waits show it
        (46.0, "compute_only", True),  # the long-step cliff: low 58% of each step
        (5.0, "compute_only", True),
        (5.0, "spin", True),
    ],
)
def test_victims_of_a_job_slow_from_its_first_step_are_inside_straggler_windows(
    step: float, guise: str, gpm: bool
) -> None:
    tr = _trace(step, guise, gpm=gpm)
    windows = acc.analyse(tr, PARAMS)
    sc = acc.score(tr, windows, PARAMS)
    assert sc.in_straggler >= 0.95, sc
    assert sc.found_after_s is not None
    assert sc.found_after_s <= max(3 * tr.job_step_seconds, PARAMS.min_window_seconds) + 1.0
    # the slow worker's own GPUs compute flat out: no window
    culprit = {(tr.culprit_instance, g) for g in tr.culprit_gpus}
    assert not [w for w in windows if (w.instance, w.gpu) in culprit]
    # the same job healthy (its all-reduce 8% of each step) opens none: the references
    # and the judging over steps find waits, not the collective's own cost
    assert acc.analyse(_trace(step, guise, gpm=gpm, slow=1.0), PARAMS) == []


def test_the_evidence_names_the_reference_that_said_it_waits() -> None:
    """With 5 s steps no stretch of the job was ever healthy: nothing but the job's other
    GPUs and the ranks' own collective waits said its victims wait."""
    tr = _trace(5.0, "spin")
    windows = acc.analyse(tr, PARAMS)
    refs = {dict(w.evidence).get(Context.BUSY_REFERENCE) for w in windows}
    assert refs <= {"job_gpus", "rank_wait"} and refs, refs


def _node_alone(tr: nh.Trace, instance: str, tmp: str) -> list[Window]:
    path = os.path.join(tmp, "job.om")
    with open(path, "w") as f:
        f.write(tr.text)
    return analyze_node(read_trace(path).nodes[instance], PARAMS)


def test_a_node_alone_sees_its_ranks_wait_the_job_view_names_whom_for(tmp_path: object) -> None:
    """The live agent's view (its own node): every GPU of the job here waits alike for a
    culprit on another node and reads busy (NCCL spins; no GPM here). Its ranks' own
    collective waits say they wait, with no other node to compare with, so the node alone
    opens the same windows over the same time as the view of every node; only the
    job-level view names whom they wait for. Before, a node alone opened nothing here (its
    reference was the least any rank of the job waited, and every rank here waited)."""
    tr = _trace(46.0, "spin", gpm=False)
    victim = next(i for i in tr.instances if i != tr.culprit_instance)
    alone = _node_alone(tr, victim, str(tmp_path))
    assert {w.gpu for w in alone} == {"0", "1", "2", "3"}
    assert all(w.culprit is None for w in alone)
    joined = [w for w in acc.analyse(tr, PARAMS) if w.instance == victim]
    assert sorted((w.gpu, w.start_seconds, w.end_seconds) for w in alone) == sorted(
        (w.gpu, w.start_seconds, w.end_seconds) for w in joined
    )
    assert all(w.culprit is not None for w in joined)


def test_spinning_victims_without_gpm_are_found_by_their_ranks_waits(tmp_path: object) -> None:
    """bench/multinode_scenarios.py's default guise: NCCL spins on every node, so a victim
    on a node without GPM reads ~100% busy with nothing but its rank's collective wait
    against the culprit's to tell; it is inside a straggler window naming the culprit."""
    from bench import multinode_scenarios as mn
    from correlator_helpers import analyze_text
    from gpufeed.correlator.job.culprit import correlate_jobs

    tr = mn.build("slow_gpu", seed=3, nodes=4, gpus=4)
    windows = analyze_text(tr.text, tmp_path)
    nodes = read_trace(os.path.join(str(tmp_path), "trace.om")).nodes
    joined = correlate_jobs(nodes.values(), windows)
    no_gpm = [lab for lab in tr.labels if int(lab.instance[5:7]) % 2 == 1]
    assert no_gpm and all(lab.cause == "straggler" for lab in no_gpm)
    for lab in no_gpm:
        covered = sum(
            min(w.end_seconds, lab.end) - max(w.start_seconds, lab.start)
            for w in joined
            if (w.instance, w.gpu) == (lab.instance, lab.gpu)
            and w.cause.value == "straggler"
            and w.culprit is not None
            and w.culprit.instance == lab.culprit_instance
            and w.end_seconds > lab.start
            and w.start_seconds < lab.end
        )
        assert covered > 0.85 * (lab.end - lab.start), lab


@pytest.mark.slow
def test_prometheus_compares_with_the_job_on_every_node_as_the_file_does(
    tmp_path: Path,
) -> None:
    """`analyze --prometheus` streams batches of whole jobs in time chunks: each node's
    engine compares with the job's GPUs on the batch's other nodes, so it gives the file's
    windows (a job slow from its first step, NCCL spinning, no GPM: the ranks' waits on
    the other node are the only reference)."""
    from prometheus_trace import prometheus_serving, run_analyze

    tr = _trace(5.0, "spin", gpm=False)
    trace = tmp_path / "job.om"
    trace.write_text(tr.text)
    file_out, prom_out = tmp_path / "file.jsonl", tmp_path / "prom.jsonl"
    assert run_analyze(str(trace), "--output", str(file_out)) == 0
    with prometheus_serving(trace, tmp_path) as url:
        span = ("--start", f"{tr.start + 1:.0f}", "--end", f"{tr.end:.0f}", "--step", "1")
        assert run_analyze("--prometheus", url, *span, "--output", str(prom_out)) == 0
    from_file = [json.loads(x) for x in file_out.read_text().splitlines()]
    from_prom = [json.loads(x) for x in prom_out.read_text().splitlines()]
    assert {d["cause"] for d in from_file} == {"straggler"}
    assert from_prom == from_file
