"""A job's life as the correlator sees it: registered before its first step (a model load:
`startup`, naming the tier it reads and how fast), computing, then its loop ended while its
process lives on holding its devices (`idle`), then gone. On a CPU-only node the stand-in
for utilization is the job's compute share, which is 0% (not absent) while the job's
processes are alive and it does not step; on a GPU node NVML reads 0% the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from correlator_helpers import T0, analyze_text, trace_text
from gpufeed.correlator.engine.causes import Cause

INST = 'instance="n1:9400"'
JOB = f'job_id="j1",name="train",{INST}'
REGISTER, FIRST_STEP, LOOP_END, PROCESS_END, GONE = 20.0, 140.0, 400.0, 700.0, 800.0


def lifecycle(
    processes: bool = True, step_every: float = 0.25, dip: tuple[float, float] | None = None
) -> Callable[[float], Iterable[tuple[str, float | None]]]:
    """The SDK's series of one job: registers at 20 s and reads its weights from the cold
    tier at 1 MB/s until its first step at 140 s, steps until 400 s, then sleeps (its
    process alive: gpufeed_job_processes 1) until 700 s; the agent keeps its series for the
    grace period to 800 s. `processes=False`: an agent from before that family; `dip`: a
    few seconds of waiting for input (a loaded host) while it steps."""
    acc = {"compute": 0.0, "data_wait": 0.0, "startup": 0.0}
    state = {"steps": 0.0, "read": 0.0, "last": T0}

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        dt = t - state["last"]
        state["last"] = t
        if s < REGISTER or s >= GONE:
            return
        if s < FIRST_STEP:
            state["read"] += 1e6 * dt
        elif s < LOOP_END:
            if acc["startup"] == 0.0:
                acc["startup"] = FIRST_STEP - REGISTER + 5.0  # reported at the first batch
            share = 0.1 if dip is not None and dip[0] <= s < dip[1] else 0.95
            acc["compute"] += share * dt
            acc["data_wait"] += (1 - share) * dt
            state["steps"] += dt / step_every
        for phase, v in acc.items():
            yield f'gpufeed_job_phase_seconds_total{{{JOB},phase="{phase}"}}', v
        yield f"gpufeed_job_steps_total{{{JOB}}}", float(int(state["steps"]))
        yield (
            f'gpufeed_job_storage_read_bytes_total{{job_id="j1",tier="cold",{INST}}}',
            state["read"],
        )
        if processes:
            yield f"gpufeed_job_processes{{{JOB}}}", 1.0 if s < PROCESS_END else 0.0

    return gen


def _spans(ws: list) -> list[tuple[str, float, float]]:
    return [(str(w.cause), w.start_seconds - T0, w.end_seconds - T0) for w in ws]


def test_a_cpu_only_job_starting_up_then_idle(tmp_path: object) -> None:
    ws = analyze_text(trace_text(lifecycle(), 900, interval=1.0), tmp_path)
    assert [w.cause for w in ws] == [Cause.STARTUP, Cause.IDLE], _spans(ws)
    startup, idle = ws
    # from its registration to its first step (the share is back within a second or two)
    assert abs(startup.start_seconds - T0 - REGISTER) <= 2
    assert FIRST_STEP - 2 <= startup.end_seconds - T0 <= FIRST_STEP + 3
    ev = dict(startup.evidence)
    assert ev["load_tier"] == "cold"
    assert abs(float(ev["startup_read_bytes_per_second"]) - 1e6) < 5e4
    assert "loading from the cold tier" in startup.summary
    assert "1.0 MB/s" in startup.summary
    # idle from a few of its steps (at least 10 s) after its loop ended to its end
    assert LOOP_END + 8 <= idle.start_seconds - T0 <= LOOP_END + 15
    assert PROCESS_END - 2 <= idle.end_seconds - T0 <= PROCESS_END + 3
    assert dict(idle.evidence)["job_stopped_seconds"] > 10
    assert "stopped working" in idle.summary


def test_a_dip_just_before_the_loop_ends_is_not_idle(tmp_path: object) -> None:
    """A short stall 15 s before the loop ends, then 11 s of work: the dip is not the start
    of the idle run that follows (a recovery longer than the dip restarts a run that has
    not opened), so the windows are those of the same job without the dip."""
    dip = (LOOP_END - 15, LOOP_END - 11)
    ws = analyze_text(trace_text(lifecycle(dip=dip), 900, interval=1.0), tmp_path)
    plain = analyze_text(trace_text(lifecycle(), 900, interval=1.0), tmp_path)
    assert [w.cause for w in ws] == [Cause.STARTUP, Cause.IDLE], _spans(ws)
    assert _spans(ws) == _spans(plain)


def test_without_the_processes_family_nothing_is_judged_before_or_after(
    tmp_path: object,
) -> None:
    """An older agent's trace: no sign that the job lives while it does not step, so the
    time before its first step and after its loop is not judged (as before)."""
    ws = analyze_text(trace_text(lifecycle(processes=False), 900, interval=1.0), tmp_path)
    assert ws == [], _spans(ws)


def test_slow_steps_are_not_a_stopped_job(tmp_path: object) -> None:
    """A job whose steps take 8 s reports nothing between them: quiet for less than a few
    of its own steps is a step in flight, not a stopped job."""
    ws = analyze_text(trace_text(lifecycle(step_every=8.0), 900, interval=1.0), tmp_path)
    assert [w.cause for w in ws] == [Cause.STARTUP, Cause.IDLE], _spans(ws)
    # the first window after the loop begins only once it is quiet for 3 steps (24 s)
    assert ws[1].start_seconds - T0 >= LOOP_END + 20


def test_a_gpu_whose_job_stopped_working_is_idle(tmp_path: object) -> None:
    """NVML reads 0% once the loop ends; the job still holds the GPU (job_info) and its
    process lives: idle, not unknown."""
    job = lifecycle()
    g = 'gpu="0",uuid="GPU-a",instance="n1:9400"'

    def gen(t: float) -> Iterable[tuple[str, float | None]]:
        s = t - T0
        yield f"gpufeed_gpu_up{{{g}}}", 1.0
        busy = FIRST_STEP <= s < LOOP_END
        yield f"gpufeed_gpu_utilization_ratio{{{g}}}", 0.95 if busy else 0.0
        yield f"gpufeed_gpu_memory_used_bytes{{{g}}}", 40e9 if s >= FIRST_STEP else 1e9
        yield f"gpufeed_gpu_memory_total_bytes{{{g}}}", 80e9
        if REGISTER <= s < PROCESS_END:
            yield (
                f'gpufeed_job_info{{job_id="j1",gpu="0",uuid="GPU-a",scheduler="slurm",'
                f'name="train",{INST}}}',
                1.0,
            )
        yield from job(t)

    ws = analyze_text(trace_text(gen, 900, interval=1.0), tmp_path)
    causes = [w.cause for w in ws]
    assert Cause.IDLE in causes, _spans(ws)
    idle = sorted(
        (w for w in ws if w.start_seconds - T0 >= LOOP_END - 1), key=lambda w: w.start_seconds
    )
    assert idle and all(w.cause is Cause.IDLE for w in idle), _spans(ws)
    # idle from its loop's end (NVML reads 0% at once; the first seconds are idle too once
    # the window opens) to the end of the data
    assert idle[0].start_seconds - T0 <= LOOP_END + 1
    assert "job_stopped_seconds" in dict(idle[0].evidence)
