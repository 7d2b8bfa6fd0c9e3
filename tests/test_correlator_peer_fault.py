"""A peer's fault explains a stall only if the stall follows it (issue 13).

One GPU of a job faults during a healthy stretch and stays faulty (lost, slowed by a clock
event, failed with a fatal XID) while the rest of the job trains at full speed; later
stalls of the job (a data tier, a saturated fabric) are named for what they are. A peer
fault that a stall begins with is still the cause (tests/test_correlator_scenarios.py:
gpu_error-lost, throttling-thermal_peer)."""

from __future__ import annotations

from correlator_helpers import analyze_text, scenarios


def test_a_peer_fault_long_before_a_stall_is_not_its_cause(tmp_path: object) -> None:
    text, labels = scenarios.peer_fault_then_stalls(seed=5)
    windows = analyze_text(text, tmp_path)
    stalls = [lab for lab in labels if lab.cause in ("data_loading", "network")]
    assert len(stalls) == 2 * (7 + 8 + 7)  # data and network; the lost and failed GPUs sit out
    for lab in stalls:
        mine = [
            w
            for w in windows
            if w.instance == lab.instance
            and w.gpu == lab.gpu
            and w.end_seconds > lab.start
            and w.start_seconds < lab.end
        ]
        assert mine, f"no window for {lab}"
        named = sum(
            min(w.end_seconds, lab.end) - max(w.start_seconds, lab.start)
            for w in mine
            if w.cause.value == lab.cause
        )
        assert named > 0.85 * (lab.end - lab.start), (
            lab,
            [(w.cause.value, w.summary) for w in mine],
        )
    # the faulty GPUs themselves: lost and failed ones are gpu_error, before and during
    for lab in labels:
        if lab.cause == "gpu_error":
            mine = [w for w in windows if w.instance == lab.instance and w.gpu == lab.gpu]
            assert mine and all(w.cause.value == "gpu_error" for w in mine), mine
