"""A job slow from its first step (issue 24): no healthy past to compare with.

Traces: bench/never_healthy.py (a data-parallel job whose slow worker computes 2.4x longer
from the first step; steps span samples), 2 nodes x 4 GPUs. The reference is the rest of
the job at the same instant (engine/peers.py), and a GPU is judged over its job's step
(engine._over_step), so a GPU that waits 58% of a 46 s step is judged like one with 1 s
steps.
"""

from __future__ import annotations

import os

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


@pytest.mark.parametrize("guise", nh.GUISES)
@pytest.mark.parametrize("step", [5.0, 46.0])
def test_a_healthy_job_with_long_steps_opens_no_window(step: float, guise: str) -> None:
    tr = _trace(step, guise, slow=1.0)
    assert acc.analyse(tr, PARAMS) == []


def test_the_evidence_names_the_reference_that_said_it_waits() -> None:
    """With 5 s steps no stretch of the job was ever healthy: nothing but the job's other
    GPUs and ranks said its victims wait."""
    tr = _trace(5.0, "spin")
    windows = acc.analyse(tr, PARAMS)
    refs = {dict(w.evidence).get(Context.BUSY_REFERENCE) for w in windows}
    assert refs <= {"job_gpus", "job_ranks"} and refs, refs


def _node_alone(tr: nh.Trace, instance: str, tmp: str) -> list[Window]:
    path = os.path.join(tmp, "job.om")
    with open(path, "w") as f:
        f.write(tr.text)
    return analyze_node(read_trace(path).nodes[instance], PARAMS)


def test_a_node_alone_cannot_see_a_culprit_elsewhere_the_job_view_does(tmp_path: object) -> None:
    """The live agent's view (its own node): every GPU of the job here waits alike for a
    culprit on another node and reads busy (NCCL spins; no GPM here), so nothing here
    tells waiting from working (the job-level view decides); with every node of the
    job, the ranks here wait far longer than the culprit's and the GPUs are in windows."""
    tr = _trace(46.0, "spin", gpm=False)
    victim = next(i for i in tr.instances if i != tr.culprit_instance)
    assert _node_alone(tr, victim, str(tmp_path)) == []
    joined = acc.analyse(tr, PARAMS)
    assert {w.gpu for w in joined if w.instance == victim} == {"0", "1", "2", "3"}
