"""Every cause, in each of its guises, with and without SDK signals, opens windows with that
cause on exactly the GPUs that were held back; confounders open none. The traces come from
the bench's physics-based generator (bench/correlator_scenarios.py)."""

from __future__ import annotations

import pytest

from bench import nvml_reading as nvml
from correlator_helpers import analyze_text, scenarios

CASES = [
    (cause, guise)
    for cause in scenarios.CAUSES
    if cause != "startup"  # startup follows every idle episode (a new job loads its weights)
    for guise in scenarios.GUISES.get(cause, ())  # straggler: tests/test_job_correlation.py
]


def _check(text: str, labels: list[scenarios.Label], tmp_path: object) -> None:
    windows = analyze_text(text, tmp_path)
    for lab in labels:
        mine = [
            w
            for w in windows
            if w.gpu == lab.gpu and w.end_seconds > lab.start and w.start_seconds < lab.end
        ]
        assert mine, f"no window for {lab}"
        overlap = {}
        for w in mine:
            d = min(w.end_seconds, lab.end) - max(w.start_seconds, lab.start)
            overlap[w.cause.value] = overlap.get(w.cause.value, 0.0) + d
        best = max(overlap, key=lambda c: overlap[c])
        assert best == lab.cause, (lab, [(w.cause.value, w.summary) for w in mine])
        covered = overlap[lab.cause] / (lab.end - lab.start)
        assert covered > 0.85, (lab, covered)
    labelled = {lab.gpu for lab in labels}
    stray = [w for w in windows if w.gpu not in labelled]
    assert not stray, [(w.gpu, w.cause.value, w.summary) for w in stray]


# Under NCCL's spinning reading a throttled peer's victims (computing 50-62% of the time,
# spinning the rest) keep SM activity at about 0.6 of their healthy level, which the engine
# reads as working (engine.SM_WAITING_RATIO): they open no window. Open (issue 24), and
# measured in docs/benchmarks.md (throttling recall under `spin`); not tested as passing.
SPIN_GAPS = frozenset({"throttling"})
GUISED = [
    (cause, guise, collectives)
    for cause, guise in CASES
    for collectives in nvml.GUISES
    if collectives != nvml.SPIN or cause not in SPIN_GAPS
]


@pytest.mark.parametrize("sdk", [True, False], ids=["sdk", "no-sdk"])
@pytest.mark.parametrize(
    ("cause", "guise", "collectives"), GUISED, ids=[f"{c}-{g}-{n}" for c, g, n in GUISED]
)
def test_cause_opens_windows_with_that_cause(
    cause: str, guise: str, sdk: bool, collectives: str, tmp_path: object
) -> None:
    """In both readings of a GPU that waits in a collective (a network stall, a throttled
    peer's): NCCL's spinning kernel, busy with SM activity low, and compute only."""
    text, labels = scenarios.single(
        cause, guise, seed=7, sdk=sdk, minutes=35, collectives=collectives
    )
    assert labels
    _check(text, labels, tmp_path)


@pytest.mark.parametrize("cause", ["data_loading", "checkpointing"])
def test_per_job_tier_io_names_the_tier(cause: str, tmp_path: object) -> None:
    text, _labels = scenarios.single(
        cause, scenarios.GUISES[cause][0], seed=9, job_io=True, minutes=35
    )
    windows = analyze_text(text, tmp_path)
    tagged = [w for w in windows if w.cause.value == cause]
    assert tagged
    key = "data_tier" if cause == "data_loading" else "checkpoint_tier"
    tiers = {dict(w.evidence).get(key) for w in tagged}
    assert len(tiers) == 1 and tiers.pop() in {"hot", "warm", "cold"}


@pytest.mark.parametrize("confounder", scenarios.CONFOUNDERS)
def test_confounders_open_no_window(confounder: str, tmp_path: object) -> None:
    text, labels = scenarios.single(confounder, "", seed=5, minutes=35)
    assert labels == []
    windows = analyze_text(text, tmp_path)
    assert windows == [], [(w.gpu, w.cause.value, w.summary) for w in windows]


def test_evidence_and_summary_name_the_numbers(tmp_path: object) -> None:
    text, _ = scenarios.single("data_loading", "contended", seed=3, sdk=False, minutes=35)
    w = analyze_text(text, tmp_path)[0]
    doc = w.to_json()
    assert set(doc) == {
        "instance",
        "gpu",
        "uuid",
        "job_id",
        "start",
        "end",
        "cause",
        "confidence",
        "mean_utilization",
        "evidence",
    }
    ev = doc["evidence"]
    assert ev["data_tier_read_latency_x_baseline"] > 2.5
    assert "read latency" in ev["summary"] and "1-hour median" in ev["summary"]
    assert ev["summary"].startswith(f"GPU {w.gpu} (job {w.job_id}) waits for data")
    assert 0.0 < doc["confidence"] <= 1.0
    assert doc["mean_utilization"] < 0.8
