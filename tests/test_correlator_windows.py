"""Window mechanics on hand-made series: threshold, minimum duration, merged gaps, splits,
lost GPUs, CPU-only jobs, and robustness (counter resets, holes, missed scrapes, unknown
metrics, histograms, two jobs on one node)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from correlator_helpers import T0, analyze_text, trace_text
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.rules import Rule, decide
from gpufeed.correlator.engine.series import Series

G = 'gpu="0",uuid="GPU-a",instance="n1:9400"'


def one_gpu(
    util: Callable[[float], float | None],
    extra: Callable[[float], Iterable[tuple[str, float | None]]] | None = None,
    job: str | None = "j1",
):
    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        u = util(s)
        yield f"gpufeed_gpu_up{{{G}}}", 1.0
        yield f"gpufeed_gpu_utilization_ratio{{{G}}}", u
        if job is not None:
            yield (
                f'gpufeed_job_info{{job_id="{job}",gpu="0",uuid="GPU-a",scheduler="slurm",name="x",instance="n1:9400"}}',
                1.0,
            )
        if extra is not None:
            yield from extra(s)

    return gen


def low_between(a: float, b: float, low: float = 0.3) -> Callable[[float], float]:
    return lambda s: low if a <= s < b else 0.95


def test_threshold_and_minimum_duration(tmp_path: object) -> None:
    text = trace_text(one_gpu(low_between(600, 900)), 1500)
    ws = analyze_text(text, tmp_path)
    assert [(w.start_seconds - T0, w.end_seconds - T0) for w in ws] == [(600, 900)]
    assert ws[0].mean_utilization_ratio == pytest.approx(0.3)
    # at 0.82 utilization the default threshold (0.8) sees nothing; a threshold of 0.9 does
    text = trace_text(one_gpu(low_between(600, 900, low=0.82)), 1500)
    assert analyze_text(text, tmp_path) == []
    ws = analyze_text(text, tmp_path, WindowParams(threshold_ratio=0.9))
    assert len(ws) == 1
    # 55 s below the threshold is not a window; 65 s is
    assert analyze_text(trace_text(one_gpu(low_between(600, 655)), 1500), tmp_path) == []
    assert len(analyze_text(trace_text(one_gpu(low_between(600, 665)), 1500), tmp_path)) == 1
    # a shorter minimum opens the short one
    ws = analyze_text(
        trace_text(one_gpu(low_between(600, 655)), 1500),
        tmp_path,
        WindowParams(min_window_seconds=30),
    )
    assert len(ws) == 1


def test_short_recoveries_merge_long_ones_do_not(tmp_path: object) -> None:
    def util_gap(gap: float) -> Callable[[float], float]:
        return lambda s: 0.2 if (600 <= s < 800 or 800 + gap <= s < 1000 + gap) else 0.95

    ws = analyze_text(trace_text(one_gpu(util_gap(20)), 1800), tmp_path)
    assert [(w.start_seconds - T0, w.end_seconds - T0) for w in ws] == [(600, 1020)]
    ws = analyze_text(trace_text(one_gpu(util_gap(60)), 1800), tmp_path)
    assert [(w.start_seconds - T0, w.end_seconds - T0) for w in ws] == [(600, 800), (860, 1060)]


def test_lost_gpu_is_underutilized_with_gpu_error(tmp_path: object) -> None:
    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        lost = 600 <= s < 1000
        yield f"gpufeed_gpu_up{{{G}}}", 0.0 if lost else 1.0
        yield f"gpufeed_gpu_utilization_ratio{{{G}}}", None if lost else 0.97
        yield (
            'gpufeed_job_info{job_id="j",gpu="0",uuid="GPU-a",scheduler="slurm",name="x",instance="n1:9400"}',
            1.0,
        )

    ws = analyze_text(trace_text(gen, 1500), tmp_path)
    assert len(ws) == 1
    w = ws[0]
    assert (w.cause, w.start_seconds - T0, w.end_seconds - T0) == (Cause.GPU_ERROR, 600, 1000)
    assert dict(w.evidence)["gpu_lost"] == 1.0
    assert w.mean_utilization_ratio == 0.0


def test_window_splits_when_the_cause_changes(tmp_path: object) -> None:
    # 600-900: no job holds the GPU (idle); 900-1200: a job holds it and the GPU is lost
    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        lost = 900 <= s < 1200
        yield f"gpufeed_gpu_up{{{G}}}", 0.0 if lost else 1.0
        yield (
            f"gpufeed_gpu_utilization_ratio{{{G}}}",
            None if lost else (0.0 if 600 <= s < 900 else 0.97),
        )
        if not 600 <= s < 900:
            yield (
                'gpufeed_job_info{job_id="j",gpu="0",uuid="GPU-a",scheduler="slurm",name="x",instance="n1:9400"}',
                1.0,
            )

    ws = analyze_text(trace_text(gen, 1600), tmp_path)
    got = [(w.cause, w.start_seconds - T0, w.end_seconds - T0, w.job_id) for w in ws]
    assert got == [(Cause.IDLE, 600, 900, ""), (Cause.GPU_ERROR, 900, 1200, "j")]


def test_nothing_stands_out_is_unknown(tmp_path: object) -> None:
    ws = analyze_text(trace_text(one_gpu(low_between(600, 900)), 1500), tmp_path)
    assert ws[0].cause is Cause.UNKNOWN
    assert "no signal stands out" in ws[0].summary
    assert decide({}).cause is Cause.UNKNOWN
    # supporting evidence alone (I/O pressure) never decides
    assert decide({"io_pressure_ratio": 0.9, "iowait_ratio": 0.5}).cause is Cause.UNKNOWN
    assert decide({"data_tier_read_latency_x_baseline": 10.0}).cause is Cause.DATA_LOADING


def test_rule_ramp() -> None:
    r = Rule(Cause.NETWORK, "x", 1.0, 3.0, 0.5)
    assert (r.strength(0.5), r.strength(2.0), r.strength(9.0)) == (0.0, 0.5, 1.0)


def _cpu_job(
    compute_share: Callable[[float], float],
) -> Callable[[float], Iterable[tuple[str, float | None]]]:
    acc = {"compute": 0.0, "data_wait": 0.0}
    last = [T0]

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        dt = t - last[0]
        last[0] = t
        c = compute_share(t - T0)
        acc["compute"] += 4 * c * dt  # four ranks add up
        acc["data_wait"] += 4 * (1 - c) * dt
        for p, v in acc.items():
            yield (
                f'gpufeed_job_phase_seconds_total{{job_id="cpu1",phase="{p}",instance="n2:9400"}}',
                v,
            )

    return gen


def test_cpu_only_job_uses_the_sdk_compute_share(tmp_path: object) -> None:
    ws = analyze_text(
        trace_text(_cpu_job(lambda s: 0.3 if 600 <= s < 900 else 0.97), 1500), tmp_path
    )
    assert len(ws) == 1
    w = ws[0]
    assert (w.gpu, w.job_id) == ("", "cpu1")
    assert abs(w.start_seconds - T0 - 600) <= 10 and abs(w.end_seconds - T0 - 900) <= 10


def _storage(reset_at: float | None) -> Callable[[float], Iterable[tuple[str, float | None]]]:
    """A warm tier whose read latency goes 10x during 600-900 s; counters reset at `reset_at`."""
    state = {"rt": 0.0, "ops": 0.0, "rb": 0.0}
    last = [0.0]

    def gen(s: float) -> Iterable[tuple[str, float | None]]:
        dt = s - last[0]
        last[0] = s
        if reset_at is not None and s == reset_at:
            state.update(rt=0.0, ops=0.0, rb=0.0)
        lat = 0.005 if 600 <= s < 900 else 0.0005
        ops = 400.0
        state["ops"] += ops * dt
        state["rt"] += ops * lat * dt
        state["rb"] += ops * 1e6 * dt
        lab = 'tier="warm",mountpoint="/data",instance="n1:9400"'
        yield f"gpufeed_storage_reads_completed_total{{{lab}}}", state["ops"]
        yield f"gpufeed_storage_read_time_seconds_total{{{lab}}}", state["rt"]
        yield f"gpufeed_storage_read_bytes_total{{{lab}}}", state["rb"]

    return gen


@pytest.mark.parametrize("reset_at", [None, 400.0, 700.0])
def test_counter_resets_do_not_confuse_rates(reset_at: float | None, tmp_path: object) -> None:
    ws = analyze_text(
        trace_text(one_gpu(low_between(600, 900), _storage(reset_at)), 1500), tmp_path
    )
    assert [w.cause for w in ws] == [Cause.DATA_LOADING]
    assert dict(ws[0].evidence)["data_tier"] == "warm"
    assert dict(ws[0].evidence)["data_tier_read_latency_x_baseline"] == pytest.approx(10, rel=0.25)


def test_reset_rate_semantics() -> None:
    s = Series()
    for t, v in [(0, 100), (10, 200), (20, 50), (30, 150)]:
        s.append(float(t), float(v))
    # 100->200 (+100), reset to 50 (+50 from zero), 50->150 (+100): 250 over 30 s
    assert s.rate_at(30.0, 30.0, 60.0, 60.0) == pytest.approx(250 / 30)
    # a hole longer than the gap limit is never bridged
    s2 = Series()
    for t, v in [(0, 0), (10, 10), (500, 20), (510, 30)]:
        s2.append(float(t), float(v))
    assert s2.rate_at(510.0, 600.0, 60.0, 60.0) == pytest.approx(1.0)
    assert s2.rate_at(500.0, 600.0, 60.0, 60.0) is None
    assert s2.value_at(400.0, 60.0) is None


def test_missed_scrapes_and_holes(tmp_path: object) -> None:
    gen = one_gpu(low_between(600, 900))
    # a few missed scrapes inside and around the window change nothing
    ws = analyze_text(trace_text(gen, 1500, skip=[595, 700, 705, 900]), tmp_path)
    assert [(w.start_seconds - T0, w.end_seconds - T0) for w in ws] == [(600, 905)]
    # a ten-minute hole ends the window at the last sample before it
    ws = analyze_text(trace_text(gen, 1800, skip=range(700, 1300, 5)), tmp_path)
    assert [(w.start_seconds - T0, w.end_seconds - T0) for w in ws] == [(600, 695)]


def test_unknown_metrics_and_histograms_are_ignored(tmp_path: object) -> None:
    def extra(s: float) -> Iterable[tuple[str, float | None]]:
        yield 'some_other_exporter_metric{a="b c",instance="n1:9400"}', 1.0
        yield 'gpufeed_job_checkpoint_seconds_bucket{job_id="j1",le="+Inf",instance="n1:9400"}', s
        yield 'gpufeed_job_checkpoint_seconds_sum{job_id="j1",instance="n1:9400"}', s
        yield 'gpufeed_future_metric_total{gpu="0",instance="n1:9400"}', s

    plain = analyze_text(trace_text(one_gpu(low_between(600, 900)), 1500), tmp_path)
    noisy = analyze_text(trace_text(one_gpu(low_between(600, 900), extra), 1500), tmp_path)
    assert plain == noisy and len(plain) == 1


def test_two_jobs_on_one_node_get_their_own_windows(tmp_path: object) -> None:
    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        for g, job in (("0", "a"), ("1", "b")):
            lab = f'gpu="{g}",uuid="GPU-{g}",instance="n1:9400"'
            yield f"gpufeed_gpu_up{{{lab}}}", 1.0
            low = (g == "0" and 600 <= s < 900) or (g == "1" and 700 <= s < 1100)
            yield f"gpufeed_gpu_utilization_ratio{{{lab}}}", 0.2 if low else 0.95
            yield (
                f'gpufeed_job_info{{job_id="{job}",gpu="{g}",uuid="GPU-{g}",scheduler="slurm",name="x",instance="n1:9400"}}',
                1.0,
            )

    ws = analyze_text(trace_text(gen, 1500), tmp_path)
    got = sorted((w.gpu, w.job_id, w.start_seconds - T0, w.end_seconds - T0) for w in ws)
    assert got == [("0", "a", 600, 900), ("1", "b", 700, 1100)]


def _job_gpus(
    util: Callable[[float, str], float | None],
    mem: Callable[[float, str], float],
    up: Callable[[float, str], float] = lambda s, g: 1.0,
):
    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        for g in ("0", "1", "2"):
            lab = f'gpu="{g}",uuid="GPU-{g}",instance="n1:9400"'
            yield f"gpufeed_gpu_up{{{lab}}}", up(s, g)
            yield f"gpufeed_gpu_utilization_ratio{{{lab}}}", None if up(s, g) == 0 else util(s, g)
            yield f"gpufeed_gpu_memory_used_bytes{{{lab}}}", mem(s, g)
            yield f"gpufeed_gpu_memory_total_bytes{{{lab}}}", 80e9
            yield (
                f'gpufeed_job_info{{job_id="j",gpu="{g}",uuid="GPU-{g}",scheduler="slurm",name="x",instance="n1:9400"}}',
                1.0,
            )

    return gen


def test_startup_seen_as_gpu_memory_filling_from_empty(tmp_path: object) -> None:
    # the trace begins while the job loads its weights: memory fills from ~0, no compute;
    # later the process restarts (memory empties) and loads again
    def mem(s: float, g: str) -> float:
        if s < 200:
            return 1e9 + s * 3e8
        if 900 <= s < 1000:
            return 4e8
        if 1000 <= s < 1150:
            return 4e8 + (s - 1000) * 4e8
        return 6e10

    def util(s: float, g: str) -> float:
        return 0.01 if s < 200 or 900 <= s < 1150 else 0.96

    ws = analyze_text(trace_text(_job_gpus(util, mem), 1500), tmp_path)
    got = {(w.gpu, w.start_seconds - T0, w.end_seconds - T0, w.cause) for w in ws}
    for g in ("0", "1", "2"):
        assert (g, 0, 200, Cause.STARTUP) in got
        assert (g, 900, 1150, Cause.STARTUP) in got
    # the same low stretch with the memory full all along is not called start-up
    ws = analyze_text(trace_text(_job_gpus(util, lambda s, g: 6e10), 1500), tmp_path)
    assert Cause.STARTUP not in {w.cause for w in ws}


def test_a_lost_gpu_stalls_its_job(tmp_path: object) -> None:
    def up(s: float, g: str) -> float:
        return 0.0 if g == "2" and 600 <= s < 900 else 1.0

    def util(s: float, g: str) -> float:
        return 0.02 if 600 <= s < 900 else 0.96

    ws = analyze_text(trace_text(_job_gpus(util, lambda s, g: 6e10, up), 1500), tmp_path)
    got = sorted((w.gpu, w.start_seconds - T0, w.end_seconds - T0, w.cause) for w in ws)
    assert got == [(g, 600, 900, Cause.GPU_ERROR) for g in ("0", "1", "2")]
    peer = next(w for w in ws if w.gpu == "0")
    assert dict(peer.evidence)["failed_peers"] == "2"
    assert "GPU 2 of the same job has failed" in peer.summary
