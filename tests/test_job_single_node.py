"""The job level on a job whose ranks all run on one node (issue 24): an 8-GPU job with one
rank slow from its first step names that rank as culprit, and its other ranks are victims
naming it, in every feed that computes windows (`gpufeed analyze` of the file and of a
Prometheus, `gpufeed fleet`, and the live agent, which sees every rank of such a job).
0.2.0's join ran only for jobs on two nodes or more: the victims were `straggler` with no
culprit although the node's trace held every rank. Traces: bench/never_healthy.py and
bench/multinode_scenarios.py's parallel jobs, on one node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import multinode_scenarios as mn
from bench import never_healthy as nh
from correlator_helpers import analyze_text, snapshots_of
from feed_parity import all_feeds
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.correlator.outputs.windowlog import read_log
from gpufeed.trace.reader import read_trace


def _one_node(guise: str, slow: float = 2.4) -> nh.Trace:
    return nh.build(5.0, nodes=1, gpus=8, guise=guise, slow=slow, culprit_gpus=1, min_seconds=300)


def _joined(text: str, tmp_path: Path) -> list[Window]:
    windows = analyze_text(text, tmp_path)
    nodes = read_trace(str(tmp_path / "trace.om")).nodes
    return correlate_jobs(nodes.values(), windows)


def _rank_of(tr: nh.Trace, gpu: str) -> str:
    return str(int(gpu))  # one node: rank = its GPU (bench/never_healthy.py)


def _assert_named(tr: nh.Trace, windows: list[dict[str, Any]], instance: str) -> None:
    """Every GPU but the slow one has windows, all `straggler` naming the slow rank; the
    slow rank's GPU, which computes flat out, has none."""
    (gpu,) = tr.culprit_gpus
    want = {"instance": instance, "gpu": gpu, "rank": _rank_of(tr, gpu)}
    assert not [w for w in windows if w["gpu"] == gpu], windows
    victims = {w["gpu"] for w in windows}
    assert victims == {str(g) for g in range(tr.gpus_per_node)} - {gpu}, victims
    for w in windows:
        assert w["cause"] == "straggler", w
        got = w["evidence"].get("culprit") or {}
        assert {k: got.get(k) for k in want} == want, w


@pytest.mark.parametrize("guise", nh.GUISES)
def test_the_slow_rank_of_a_single_node_job_is_its_culprit(guise: str, tmp_path: Path) -> None:
    tr = _one_node(guise)
    joined = _joined(tr.text, tmp_path)
    assert joined
    _assert_named(tr, [w.to_json() for w in joined], tr.instances[0])
    some = joined[0]
    assert f"rank {_rank_of(tr, tr.culprit_gpus[0])}" in some.summary, some.summary
    share = dict(some.evidence)["culprit_wait_share"]
    assert isinstance(share, float) and share >= 0.9, share


@pytest.mark.parametrize("guise", nh.GUISES)
def test_a_healthy_single_node_job_names_no_culprit(guise: str, tmp_path: Path) -> None:
    assert _joined(_one_node(guise, slow=1.0).text, tmp_path) == []


def test_a_slow_replica_stage_on_one_node_is_its_ranks(tmp_path: Path) -> None:
    """A 2 x 2 x 2 job on one node of 8 GPUs: one replica's stage (2 GPUs) computes 2.4x
    slower; the other 6 GPUs are `straggler` naming those 2 GPUs and their ranks."""
    tr = mn.build_parallel(
        "slow_worker", seed=2, dp=2, pp=2, tp=2, gpus=8, step_seconds=2.0, duration=600.0
    )
    windows = _joined(tr.text, tmp_path)
    culprit = tr.labels[0].culprit_instance, tr.labels[0].culprit_gpu
    assert {w.gpu for w in windows} == {lab.gpu for lab in tr.labels}
    for w in windows:
        assert w.cause.value == "straggler" and w.culprit is not None, w
        assert (w.culprit.instance, w.culprit.gpu) == culprit, w.culprit
        assert len(w.culprit.rank.split(",")) == 2, w.culprit


def _live(text: str, tmp_path: Path, world_size: bool = True) -> list[Window]:
    """The agent's windows over the trace: closed ones, and those its stop cut short."""
    if not world_size:  # ranks that do not say how many there are
        text = "".join(line.replace(',world_size="8"', "") + "\n" for line in text.splitlines())
    log = tmp_path / f"live-{world_size}.jsonl"
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(log)), instance="here")
    for snap in snapshots_of(text):
        proc.process(snap)  # type: ignore[arg-type]
    _closed, open_now = proc.windows()
    proc.close()  # the windows still open are logged, closed at the last sample
    return [*open_now, *read_log(str(log))]


def test_the_live_agent_names_the_culprit_of_a_job_it_sees_whole(tmp_path: Path) -> None:
    """The agent sees every rank of a single-node job (they report a world size of 8, all
    here): its closed windows name the slow rank as `gpufeed analyze` does. Where the ranks
    do not report their world size it cannot know it sees the whole job: its windows stay
    its node's own (`straggler` with no culprit), the job-level view decides."""
    tr = _one_node("spin")
    seen = _live(tr.text, tmp_path)
    assert seen
    _assert_named(tr, [w.to_json() for w in seen], "here")
    unsure = _live(tr.text, tmp_path, world_size=False)
    assert unsure and all(w.cause.value == "straggler" and w.culprit is None for w in unsure)


def test_every_feed_names_the_slow_rank_of_a_single_node_job(tmp_path: Path) -> None:
    """`gpufeed analyze` of the file and of a Prometheus holding it, and `gpufeed fleet`."""
    tr = _one_node("spin")
    trace = tmp_path / "in.om"
    trace.write_text(tr.text)
    feeds = all_feeds(trace, tmp_path, scrape=5.0)
    for name in ("file", "promql", "fleet"):
        assert feeds[name], name
        _assert_named(tr, feeds[name], tr.instances[0])
