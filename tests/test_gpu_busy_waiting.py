"""A real H200 recording (bench/gpu_busy_waiting.py, 2026-12-01): a job trained with dense
products for 150 s, then spun one thread per step for 120 s (NVML utilization 0.97, GPM SM
activity 0.008 against 0.94 healthy). Judged again with this code's `gpufeed analyze`.

The live agent of that run (older code) opened the right window but called it `startup`:
the job holds a few hundred MB of the GPU's 143 GB, so its memory always looked "not loaded
yet". The fixture keeps that run's own verdict (verdict.txt) beside the trace."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu_busy_waiting import analyze, judge

FIXTURE = Path(__file__).parent / "fixtures" / "gpu-busy-waiting-h200"


def test_real_h200_busy_but_waiting_is_a_window_and_not_startup() -> None:
    trace = FIXTURE / "trace.om.gz"  # analyze reads it compressed, as stored
    phases = json.loads((FIXTURE / "phases.json").read_text())
    windows = analyze(trace)
    lines = judge("analyze", windows, phases)
    assert [x for x in lines if x.startswith("FAIL")] == [], lines
    waiting = [w for w in windows if w["start"] < phases["waiting"][1]]
    assert len(waiting) == 1, windows
    assert waiting[0]["evidence"]["sm_active_drop_ratio"] > 0.9
    assert "SMs are not working" in waiting[0]["evidence"]["summary"]
