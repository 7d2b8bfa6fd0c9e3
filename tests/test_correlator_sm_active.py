"""Busy is not always working (issue 13): where SM activity exists (GPM), a GPU that reads
busy while its SM activity falls far below its own healthy level is waiting; a healthy job
whose SM activity is normally low is not."""

from __future__ import annotations

import math

from correlator_helpers import T0, analyze_text, trace_text

NODE = 'instance="node-a:9400"'
STALL = (900.0, 1200.0)  # seconds after T0: GPU 0's ranks wait for a peer


def _gen(ranks: bool):  # type: ignore[no-untyped-def]
    cw = {"0": 0.0, "1": 0.0}

    def gen(t: float) -> list[tuple[str, float | None]]:
        x = t - T0
        wiggle = 0.04 * math.sin(x / 37.0)
        waiting = STALL[0] < x <= STALL[1]
        out: list[tuple[str, float | None]] = []
        for gpu, healthy_sm in (("0", 0.7), ("1", 0.35)):
            gl = f'gpu="{gpu}",uuid="GPU-{gpu}",{NODE}'
            sm = 0.06 if waiting and gpu == "0" else healthy_sm + wiggle
            out += [
                (f"gpufeed_gpu_up{{{gl}}}", 1.0),
                (f"gpufeed_gpu_utilization_ratio{{{gl}}}", 1.0 - abs(wiggle) / 4),
                (f"gpufeed_gpu_sm_active_ratio{{{gl}}}", sm),
                (f'gpufeed_job_info{{job_id="j{gpu}",gpu="{gpu}",uuid="GPU-{gpu}",{NODE}}}', 1.0),
            ]
            if ranks:
                cw[gpu] += 5.0 * (0.92 if waiting and gpu == "0" else 0.15)
                rl = f'job_id="j{gpu}",rank="{gpu}",{NODE}'
                out += [
                    (
                        f'gpufeed_job_rank_phase_seconds_total{{{rl},phase="collective_wait"}}',
                        cw[gpu],
                    ),
                    (f'gpufeed_job_rank_info{{{rl},world_size="16",uuid="GPU-{gpu}"}}', 1.0),
                ]
        return out

    return gen


def test_busy_gpu_with_sm_activity_far_below_its_own_level_is_waiting(tmp_path: object) -> None:
    windows = analyze_text(trace_text(_gen(ranks=True), 1800.0), tmp_path)
    assert [(w.gpu, w.cause.value) for w in windows] == [("0", "straggler")], windows
    w = windows[0]
    assert abs(w.start_seconds - (T0 + STALL[0] + 5)) <= 10
    assert abs(w.end_seconds - (T0 + STALL[1] + 5)) <= 10
    assert w.mean_utilization_ratio < 0.2  # what it really did, not NVML's 1.0
    ev = dict(w.evidence)
    assert float(ev["collective_wait_ratio"]) > 0.7 and float(ev["sm_active_drop_ratio"]) > 0.8
    assert "wait in collectives" in w.summary


def test_without_rank_signals_the_stall_is_still_seen(tmp_path: object) -> None:
    windows = analyze_text(trace_text(_gen(ranks=False), 1800.0), tmp_path)
    assert [(w.gpu, w.cause.value) for w in windows] == [("0", "unknown")], windows


def test_healthy_job_at_a_third_of_its_sms_is_not_paged(tmp_path: object) -> None:
    """GPU 1 keeps SM activity 0.31-0.39 throughout: no window, whatever the threshold."""
    windows = analyze_text(trace_text(_gen(ranks=True), 1800.0), tmp_path)
    assert not [w for w in windows if w.gpu == "1"]


def test_gpus_that_all_spin_from_their_first_sample_are_judged_by_the_device(
    tmp_path: object,
) -> None:
    """Issue 24's physics reference: a two-GPU job hung in a collective from its first
    sample, both GPUs at NVML 100% and SM activity 1% (a spinning kernel: 0.008 on the
    real H200 run), no per-rank signals. No healthy past, and no busier GPU of the job to
    compare with: judged against the device's own SMs, both are waiting (before: no
    window at all)."""

    def gen(t: float) -> list[tuple[str, float | None]]:
        out: list[tuple[str, float | None]] = []
        for gpu in ("0", "1"):
            gl = f'gpu="{gpu}",uuid="GPU-{gpu}",{NODE}'
            out += [
                (f"gpufeed_gpu_up{{{gl}}}", 1.0),
                (f"gpufeed_gpu_utilization_ratio{{{gl}}}", 0.99),
                (f"gpufeed_gpu_sm_active_ratio{{{gl}}}", 0.01),
                (f'gpufeed_job_info{{job_id="j",gpu="{gpu}",uuid="GPU-{gpu}",{NODE}}}', 1.0),
            ]
        return out

    windows = analyze_text(trace_text(gen, 600.0), tmp_path)
    assert sorted(w.gpu for w in windows) == ["0", "1"], windows
    for w in windows:
        assert w.mean_utilization_ratio < 0.05, w
        assert dict(w.evidence).get("busy_reference") == "device_peak", w.evidence
        assert w.start_seconds - T0 <= 90.0, w.start_seconds - T0
