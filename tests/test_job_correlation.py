"""The job-level correlation (issue 13): for each stall of a multi-node job, the culprit
(instance, GPU, rank) and its own cause; the victims get `straggler` with the culprit in
evidence and summary. Traces: bench/multinode_scenarios.py, 4 nodes x 4 GPUs (the 16 x 8
figures are `make bench-correlator`'s bench/culprit_accuracy.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench import multinode_scenarios as mn
from correlator_helpers import analyze_text
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.trace.reader import read_trace


def _joined(
    kind: str, tmp_path: object, ranks: bool = True
) -> tuple[mn.MultiNodeTrace, list[Window]]:
    tr = mn.build(kind, seed=3, nodes=4, gpus=4, ranks=ranks)
    windows = analyze_text(tr.text, tmp_path)
    nodes = read_trace(os.path.join(str(tmp_path), "trace.om")).nodes
    return tr, correlate_jobs(nodes.values(), windows)


def _check_victims(tr: mn.MultiNodeTrace, windows: list[Window]) -> None:
    """Every labelled GPU is covered by windows of its true cause, and a straggler's
    window names the true culprit."""
    for lab in tr.labels:
        mine = [
            w
            for w in windows
            if (w.instance, w.gpu) == (lab.instance, lab.gpu)
            and w.end_seconds > lab.start
            and w.start_seconds < lab.end
        ]
        right = [w for w in mine if w.cause.value == lab.cause]
        covered = sum(min(w.end_seconds, lab.end) - max(w.start_seconds, lab.start) for w in right)
        assert covered > 0.85 * (lab.end - lab.start), (
            lab,
            [(w.cause.value, w.summary) for w in mine],
        )
        for w in right:
            if lab.cause == "straggler":
                assert w.culprit is not None, w
                assert w.culprit.instance == lab.culprit_instance, (lab, w.culprit)
                assert w.culprit.gpu == lab.culprit_gpu, (lab, w.culprit)


@pytest.mark.parametrize(
    ("kind", "ranks"),
    [
        ("data_tier_slow", True),
        ("data_tier_slow", False),  # no per-rank signals: the one node with a reason
        ("clock_limited", True),
        ("slow_gpu", True),
        ("rank_hung", True),
        ("rank_killed", True),  # named by its loss; its own GPU `idle`, saying how it ended
        ("gpu_lost_before", True),
    ],
)
def test_victims_name_the_culprit_and_its_cause(kind: str, ranks: bool, tmp_path: object) -> None:
    tr, windows = _joined(kind, tmp_path, ranks)
    _check_victims(tr, windows)
    stall = tr.stalls[-1]
    victims = [w for w in windows if w.cause.value == "straggler"]
    assert victims
    for w in victims:
        assert w.culprit is not None and w.culprit.cause.value == stall.cause, w.culprit
    healthy = [
        w for w in windows if w.end_seconds < stall.start - 60 and w.cause.value != "gpu_error"
    ]
    assert healthy == []


def test_the_summary_says_who_and_why(tmp_path: object) -> None:
    tr, windows = _joined("data_tier_slow", tmp_path)
    culprit = tr.instances[tr.stalls[0].node]
    w = next(w for w in windows if w.cause.value == "straggler")
    assert w.summary.endswith(f"job {tr.job_id} waits on {culprit}, which waits for the warm tier")
    d = w.to_json()
    assert d["evidence"]["culprit"] == {
        "instance": culprit,
        "gpu": "",
        "uuid": "",
        "rank": "",
        "cause": "data_loading",
    }
    assert d["evidence"]["culprit_signal"] == "last_to_arrive"
    assert Window.from_json(json.loads(json.dumps(d))) == w
    slow = [w for w in windows if w.cause.value == "straggler" and w.culprit and w.culprit.gpu]
    assert not slow


def test_a_culprit_gpu_is_named_with_its_rank(tmp_path: object) -> None:
    tr, windows = _joined("clock_limited", tmp_path)
    st = tr.stalls[0]
    w = next(w for w in windows if w.cause.value == "straggler")
    assert w.culprit is not None
    assert (w.culprit.instance, w.culprit.gpu) == (tr.instances[st.node], str(st.gpu))
    assert w.culprit.rank == str(st.node * tr.gpus_per_node + st.gpu)
    assert w.culprit.uuid.startswith("GPU-")
    assert f"GPU {st.gpu} (rank {w.culprit.rank}), which is slowed by clock throttling" in w.summary


def test_a_culprit_node_without_a_reason_is_said_so(tmp_path: object) -> None:
    _tr, windows = _joined("slow_gpu", tmp_path)
    w = next(w for w in windows if w.cause.value == "straggler")
    assert w.culprit is not None and w.culprit.cause.value == "unknown"
    assert "shows no reason on its node (a slow GPU or an imbalanced shard)" in w.summary


@pytest.mark.parametrize("kind", ["congestion_everywhere", "healthy"])
def test_no_culprit_when_every_node_has_its_own_reason_or_none_stalls(
    kind: str, tmp_path: object
) -> None:
    tr, windows = _joined(kind, tmp_path)
    assert not [w for w in windows if w.culprit is not None or w.cause.value == "straggler"]
    if kind == "congestion_everywhere":
        _check_victims(tr, windows)
    else:
        assert windows == []


def test_analyze_writes_job_level_results(tmp_path: object) -> None:
    """`gpufeed analyze` over one trace holding every node of the job."""
    tr = mn.build("cpu_starved", seed=3, nodes=4, gpus=4)
    path = os.path.join(str(tmp_path), "job.om")
    with open(path, "w") as f:
        f.write(tr.text)
    out = subprocess.run(
        [sys.executable, "-m", "gpufeed", "analyze", path],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    got = [json.loads(line) for line in out.splitlines()]
    culprit = tr.instances[tr.stalls[0].node]
    stragglers = [d for d in got if d["cause"] == "straggler"]
    assert len(stragglers) == 12
    assert {d["evidence"]["culprit"]["instance"] for d in stragglers} == {culprit}
    assert {d["evidence"]["culprit"]["cause"] for d in stragglers} == {"preprocessing"}
    assert {d["cause"] for d in got if d["instance"] == culprit} == {"preprocessing"}


def test_cpu_only_jobs_are_joined_too() -> None:
    """A CPU-only job (SDK phases, no GPU: the fault lab's gloo jobs) on two nodes: one
    node's data stall is the culprit of the other's unexplained one."""
    from gpufeed.correlator.engine.causes import Cause
    from gpufeed.correlator.engine.node import NodeSeries

    nodes = []
    for inst in ("a:1", "b:1"):
        n = NodeSeries(inst)
        n.job("lab1").phases["compute"] = Series()
        nodes.append(n)

    def window(inst: str, cause: Cause) -> Window:
        return Window(inst, "", "", "lab1", 100.0, 200.0, cause, 0.8, 0.3, (), "s")

    got = correlate_jobs(nodes, [window("a:1", Cause.DATA_LOADING), window("b:1", Cause.UNKNOWN)])
    assert [w.cause for w in got] == [Cause.DATA_LOADING, Cause.STRAGGLER]
    assert got[1].culprit is not None
    assert (got[1].culprit.instance, got[1].culprit.cause) == ("a:1", Cause.DATA_LOADING)
    assert got[1].summary == (
        "CPU job (job lab1) waits for a slower peer of its job: job lab1 waits on a:1,"
        " which waits for the data tier"
    )


def test_a_peer_network_window_is_a_victim() -> None:
    """A `network` window whose reason is `peer` (its links are fine, the job waits in its
    collectives) is a victim; a `congestion` one is its node's own reason."""
    from gpufeed.correlator.engine.causes import Cause
    from gpufeed.correlator.engine.node import NodeSeries

    nodes = []
    for inst in ("a:1", "b:1", "c:1", "d:1"):
        n = NodeSeries(inst)
        n.job("j").phases["compute"] = Series()
        nodes.append(n)

    def window(inst: str, cause: Cause, reason: str = "") -> Window:
        return Window(inst, "", "", "j", 100.0, 200.0, cause, 0.8, 0.3, (), "s",
                      network_reason=reason)  # fmt: skip

    got = correlate_jobs(
        nodes,
        [
            window("a:1", Cause.NETWORK, "link_errors"),
            window("b:1", Cause.NETWORK, "peer"),
            window("c:1", Cause.UNKNOWN),
            window("d:1", Cause.NETWORK, "peer"),
        ],
    )
    assert [(w.cause.value, w.network_reason) for w in got] == [
        ("network", "link_errors"),
        ("straggler", ""),
        ("straggler", ""),
        ("straggler", ""),
    ]
    assert {w.culprit.instance for w in got[1:] if w.culprit} == {"a:1"}
    assert "network_reason" not in got[1].to_json()
