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
    kind: str, tmp_path: object, ranks: bool = True, guise: str = "mixed"
) -> tuple[mn.MultiNodeTrace, list[Window]]:
    """The join over scenario `kind`; by default in the guise these tests were written for
    (collectives spin on the GPM nodes only): without per-rank signals a GPU that spins
    and has no SM activity cannot be told from one that works, in any engine."""
    tr = mn.build(kind, seed=3, nodes=4, gpus=4, ranks=ranks, guise=guise)
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


def _lab_node(
    inst: str, rank: str, shaped: bool, wait_per_s: float, shaped_rate: float = 1e6
) -> object:
    """A fault-lab node of a two-node CPU-only gloo job, sampled each second over 0-300 s:
    its rank's collective wait (`wait_per_s` s/s over the stall 100-200 s, 0.15 outside),
    and its eth0 (a veth: 10 Gbit/s) carrying the collective's bytes, 15 MB/s outside the
    stall, 0.77 MB/s in it. `shaped`: a tbf of `shaped_rate` (1 MB/s: 8 Mbit/s) on eth0
    over the stall."""
    from gpufeed.correlator.engine.node import NodeSeries

    n = NodeSeries(inst)
    j = n.job("lab1")
    j.phases["compute"] = Series()
    wait, info = Series(), Series()
    j.rank_phases[(rank, "collective_wait")] = wait
    j.rank_info[rank] = info
    port = n.network[("eth0", "")] = {k: Series() for k in ("rx", "tx", "speed")}
    if shaped:
        port["shaped"] = Series()
    waited = moved = 0.0
    for t in range(301):
        stalled = 100 < t <= 200
        waited += wait_per_s if stalled else 0.15
        moved += 0.77e6 if stalled else 15e6
        wait.append(float(t), waited)
        info.append(float(t), 1.0)
        port["rx"].append(float(t), moved)
        port["tx"].append(float(t), moved)
        port["speed"].append(float(t), 1.25e9)
        if shaped and 100 <= t <= 200:
            port["shaped"].append(float(t), shaped_rate)
    return n


def test_a_shaped_link_under_its_bound_is_the_culprit_not_a_loaded_node() -> None:
    """The fault lab's mn2-link-tbf on a loaded host (docs/benchmarks.md): node b's link
    shaped to 8 Mbit/s carried 77% of that, under its node's saturation bound, so b's own
    window read `straggler`; node a's CPUs, busy with other work, made its window
    `preprocessing`. Both ranks waited in the slow all-reduce alike (nobody arrives last),
    and the join used to name a, the one node with a cause of its own. b's link, the
    job's busiest by far, is the culprit; a's ranks wait as long as b's, so its host-wide
    reading is not what holds the job back: a is b's victim."""
    from gpufeed.correlator.engine.causes import Cause
    from gpufeed.correlator.engine.node import NodeSeries

    a = _lab_node("node-0:1", "0", shaped=False, wait_per_s=0.88)
    b = _lab_node("node-1:1", "1", shaped=True, wait_per_s=0.88)
    assert isinstance(a, NodeSeries) and isinstance(b, NodeSeries)

    def window(inst: str, cause: Cause, start: float, end: float) -> Window:
        return Window(inst, "", "", "lab1", start, end, cause, 0.8, 0.3, (), "s")

    got = correlate_jobs(
        [a, b],
        [
            window("node-0:1", Cause.PREPROCESSING, 105.0, 195.0),
            window("node-1:1", Cause.STRAGGLER, 101.0, 201.0),
        ],
    )
    victim, culprit = got
    assert victim.cause is Cause.STRAGGLER and victim.culprit is not None
    assert (victim.culprit.instance, victim.culprit.rank, victim.culprit.cause) == (
        "node-1:1",
        "1",
        Cause.NETWORK,
    )
    ev = dict(victim.evidence)
    assert ev["culprit_signal"] == "busiest_link" and ev["node_cause"] == "preprocessing"
    assert (culprit.cause, culprit.network_reason, culprit.culprit) == (
        Cause.NETWORK,
        "saturated",
        None,
    )
    assert dict(culprit.evidence)["network_utilization_ratio"] == pytest.approx(0.77, abs=0.01)
    assert "eth0 carried 7" in culprit.summary, culprit.summary
    assert "the job's busiest link (the other nodes' at most 0.0" in culprit.summary

    # the same stall with a's ranks arriving last (a real CPU starvation on a): a's own
    # cause holds the job back, whatever b's link carries
    a = _lab_node("node-0:1", "0", shaped=False, wait_per_s=0.05)
    b = _lab_node("node-1:1", "1", shaped=False, wait_per_s=0.88)
    got = correlate_jobs(
        [a, b],
        [
            window("node-0:1", Cause.PREPROCESSING, 105.0, 195.0),
            window("node-1:1", Cause.STRAGGLER, 101.0, 201.0),
        ],
    )
    assert got[0].cause is Cause.PREPROCESSING
    assert got[1].culprit is not None and got[1].culprit.instance == "node-0:1"


@pytest.mark.parametrize(
    ("shaped", "rate", "waits"),
    [
        # the one link that stands out carries 31% of its shaped 2.5 MB/s: under half
        ((False, True), 2.5e6, (0.88, 0.88)),
        ((True, True), 1e6, (0.88, 0.88)),  # both equally busy: no link stands out
        ((False, True), 1e6, (0.1, 0.1)),  # a busy link, but the ranks do not wait for it
    ],
)
def test_the_busiest_link_names_nobody_unless_one_link_stands_out_while_ranks_wait(
    shaped: tuple[bool, bool], rate: float, waits: tuple[float, float]
) -> None:
    """The busiest-link step's three conditions, each alone: a link at half its capacity
    or more, every other node's under half of its share, the ranks waiting in collectives
    (0.25 s/s or more). Without any one, no window is made `network` by it."""
    from gpufeed.correlator.engine.causes import Cause
    from gpufeed.correlator.engine.node import NodeSeries

    nodes = [
        _lab_node(f"node-{i}:1", str(i), shaped[i], waits[i], shaped_rate=rate) for i in (0, 1)
    ]
    assert all(isinstance(n, NodeSeries) for n in nodes)
    windows = [
        Window(f"node-{i}:1", "", "", "lab1", 101.0, 201.0, Cause.STRAGGLER, 0.8, 0.3, (), "s")
        for i in (0, 1)
    ]
    got = correlate_jobs(nodes, windows)  # type: ignore[arg-type]
    for w in got:
        assert dict(w.evidence).get("culprit_signal") != "busiest_link", w
        assert w.cause is not Cause.NETWORK, w
