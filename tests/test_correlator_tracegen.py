"""A cross-check with a model the correlator was not written against: the simulated node's
labelled trace generator (gpufeed.simulate.tracegen, another helper's physics)."""

from __future__ import annotations

import json
from pathlib import Path

from correlator_helpers import analyze_text
from gpufeed.simulate.tracegen import generate_trace


def test_windows_match_the_simulated_nodes_labels(tmp_path: Path) -> None:
    trace, labels = tmp_path / "t.om", tmp_path / "t.labels.jsonl"
    generate_trace(trace, labels, nodes=2, duration_s=3 * 3600, step_s=15.0, seed=3)
    truth: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for line in labels.read_text().splitlines():
        d = json.loads(line)
        if d["cause"]:
            truth.setdefault((d["instance"], d["gpu"]), []).append(
                (d["start"], d["end"], d["cause"])
            )
    assert len({c for v in truth.values() for _, _, c in v}) >= 4  # several causes to find
    windows = analyze_text(trace.read_text(), tmp_path)
    agree = total_truth = total_windows = 0.0
    for w in windows:
        total_windows += w.duration_seconds
        for s, e, c in truth.get((w.instance, w.gpu), []):
            if c == w.cause.value:
                agree += max(0.0, min(e, w.end_seconds) - max(s, w.start_seconds))
    total_truth = sum(e - s for v in truth.values() for s, e, _ in v)
    precision, recall = agree / total_windows, agree / total_truth
    assert precision > 0.9 and recall > 0.9, (precision, recall)
