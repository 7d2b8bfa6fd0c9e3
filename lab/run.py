"""Runs lab scenarios against the real agent and scores what it said.

    python -m lab.run [--suite lab|short] [--launcher run|sdk|both] [--one-at-a-time]
                      [--out DIR] [NAME ...]

Per scenario and launcher: loop-mounted tiers, a Slurm-shaped job cgroup, the real agent
(live correlator, real collectors, its windows log; port 0), the training program
(lab/workloads/train.py) under `gpufeed run` or with the SDK inside the job's cgroup, and
the faults on their schedule. The runner polls /api/windows every 2 s (when the agent
first SAID each cause), and at the end reads the windows log, scores it (lab.score) and
writes OUT/<scenario>-<launcher>/ (score.json, the raw windows and steps) and, for all
runs, OUT/report.json and OUT/report.md with a timeline PNG per run (lab.report).

`--launcher both` runs a scenario's two launchers AT THE SAME TIME (one thread each, their
workloads started together), which halves `make lab`: each run has its own tiers (loop
devices), job cgroup, agent and SDK socket, and their schedules coincide, so one run's fault
falls in the other's fault time of the same kind, never in its healthy time (a few seconds
at the edges, the difference between their first steps; CPU hogs stay inside their own
job's cgroup). `--one-at-a-time` runs them one after the other. The report gives every
run's wall time (setup, scenario, teardown) and the total, so the lab's time budget stays
visible as scenarios are added.

Cleanup: every part is undone in reverse order on a normal end, on an exception, and on
SIGTERM, SIGINT or SIGHUP (turned into an exception): faults stopped (throttles lifted,
hogs and readers killed, control file removed), the workload and agent ended, the job
cgroup's processes killed and its directories removed, tiers unmounted, loop devices
detached, the run directory deleted. Only a SIGKILL of the runner itself can leave them;
the next runner removes what dead runners left when it starts (lab.sweep), and says so.

Exit status: 0 when every scenario ran and met its targets, 1 when one missed, 2 when one
could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from lab import faults as faultkit
from lab.agent import Agent
from lab.faults.s3 import CLIENT_ENV as S3_CLIENT_ENV
from lab.faults.s3 import S3_TIER, LabS3
from lab.host import JobCgroup, LoopTier, cgroup_mode
from lab.scenario import Scenario, ScenarioError, find, load_all
from lab.score import LabWindow, NodeRun, Sighting, Step, score
from lab.sweep import sweep

TRAIN = Path(__file__).resolve().parent / "workloads" / "train.py"
POLL_SECONDS = 2.0
# The workload runs on this long past the scenario's end, so that the agent closes a window
# that is still open there at its real end (recovered for the 30 s merge gap) rather than
# at the moment it is stopped; scoring stops at the scenario's end.
TAIL_SECONDS = 35.0
DEFAULT_OUT = Path("lab-results")


class LabError(RuntimeError):
    """A scenario that could not run (one line)."""


@dataclass(frozen=True, slots=True)
class Together:
    """What the runs of one scenario share when they run at the same time: their
    workloads start at once (`start`), and a signal to the runner stops all (`stop`)."""

    start: threading.Barrier
    stop: threading.Event

    @classmethod
    def alone(cls) -> Together:
        return cls(threading.Barrier(1), threading.Event())

    def check(self) -> None:
        if self.stop.is_set():
            raise LabError("stopped (the runner got a signal)")


@dataclass(frozen=True, slots=True)
class Timing:
    """Where a run's wall time went: setting up until the workload's first step (tiers,
    dataset, cgroup, agent, the workload's import and first batch), the scenario and its
    tail, and undoing everything."""

    setup_s: float
    scenario_s: float
    teardown_s: float

    @property
    def total_s(self) -> float:
        return self.setup_s + self.scenario_s + self.teardown_s


@dataclass(frozen=True, slots=True)
class RunResult:
    scenario: Scenario
    launcher: str
    t0: float
    job_id: str
    run: NodeRun
    other_windows: int  # windows for other units or jobs (none expected)
    workload_rc: int | None
    out_dir: Path
    timing: Timing


def host_problem() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the lab needs root (loop mounts, cgroups)"
    for tool in ("mkfs.ext4", "losetup", "mount", "umount", "setpriv"):
        if shutil.which(tool) is None:
            return f"the lab needs {tool} (Debian: e2fsprogs / mount / util-linux)"
    if not cgroup_mode():
        return "the lab needs cgroup v1 blkio+cpu or cgroup v2 with io and cpu enabled"
    return None


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run the way Ctrl-C does: by an exception, so that every
    cleanup step registered below runs."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _nice(n: int) -> list[str]:
    return ["nice", "-n", str(n)] if n else []


def _write_data(directory: Path, samples: int, sample_kib: int) -> None:
    directory.mkdir(parents=True)
    for i in range(samples):
        (directory / f"{i:05d}.bin").write_bytes(os.urandom(sample_kib << 10))
    os.sync()


def _write_weights(path: Path, mib: int) -> None:
    """A model's weights as torch.save writes them (random bytes: nothing compresses), then
    dropped from the page cache, so that the workload's torch.load reads them from the tier."""
    import torch  # only scenarios with a start-up load pay for the import

    torch.save(
        {"weights": torch.frombuffer(bytearray(os.urandom(mib << 20)), dtype=torch.uint8)}, path
    )
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def run_one(
    s: Scenario,
    launcher: str,
    out_root: Path,
    nice: int,
    device: str = "stand-in",
    together: Together | None = None,
) -> RunResult:
    if s.nodes != 1 or s.workload.kind != "train":
        raise LabError(
            f"{s.name}: lab.run runs single-node train scenarios (multi-node: lab.multinode)"
        )
    together = together or Together.alone()
    began = time.monotonic()
    out = out_root / f"{s.name}-{launcher}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with contextlib.ExitStack() as cleanup:
        run_dir = Path(tempfile.mkdtemp(prefix=f"gpufeed-lab-{os.getpid()}-"))
        cleanup.callback(shutil.rmtree, run_dir, True)
        tiers: dict[str, LoopTier] = {}
        store: LabS3 | None = None
        for spec in s.tiers:
            if spec.name == S3_TIER:
                store = LabS3()
                cleanup.callback(store.close)
                store.open()
                continue
            t = LoopTier(spec.name, run_dir, spec.size_mib, spec.read_capacity_bytes_per_s)
            cleanup.callback(t.close)
            tiers[spec.name] = t.open()
        w = s.workload
        if w.data_tier == S3_TIER and store is not None:
            data = store.write_data("train", w.samples, w.sample_kib)
        else:
            data = str(tiers[w.data_tier].mnt / "data")
            _write_data(Path(data), w.samples, w.sample_kib)
        ck_tier = tiers.get(w.checkpoint.tier) or next(iter(tiers.values()))
        weights = ""
        if w.weights_tier:
            wpath = tiers[w.weights_tier].mnt / "weights.pt"
            _write_weights(wpath, w.weights_mib)
            weights = str(wpath)
        os.sync()

        job_id = f"{os.getpid()}{secrets.randbelow(9000) + 1000}"
        cg = JobCgroup(job_id)
        cleanup.callback(cg.close)
        cg.open([t.dev for t in tiers.values()])
        ctx = faultkit.FaultContext(
            cg, tiers, run_dir / "control.json", run_dir, _nice(nice), store
        )
        injectors = []
        # the host's other work first: in place before the workload, like the host it runs on
        made = [(b, faultkit.make_background) for b in s.background]
        for f, maker in [*made, *((f, faultkit.make) for f in s.faults)]:
            inj = maker(f, ctx)
            cleanup.callback(inj.stop)  # registered before it can start
            inj.prepare()
            injectors.append((f, inj))
        os.sync()
        for f, inj in injectors:
            if f.start_s <= 0:  # in place before the workload starts (its start-up load)
                inj.start()

        objects = {S3_TIER: [f"{data}"]} if store is not None and data.startswith("s3:") else {}
        instance = f"lab-{s.name}-{launcher}-{os.getpid()}"
        agent = Agent(run_dir, tiers, instance, objects, gpu_job=job_id)
        cleanup.callback(_copy, agent.run_dir / "agent.log", out / "agent.log")
        cleanup.callback(agent.stop)
        agent.start(_nice(nice), record=out / "trace.om")

        steps_log = out / "steps.jsonl"
        argv = [sys.executable, str(TRAIN), "--mode", "plain" if launcher == "run" else "sdk"]
        argv += ["--data", data, "--ckpt", str(ck_tier.mnt / "ckpt")]
        if store is not None:
            argv += ["--s3-endpoint", store.endpoint_url]
        argv += ["--ckpt-every", str(w.checkpoint.every_steps)]
        argv += ["--device-seconds", str(w.device_seconds_per_step), "--device", device]
        argv += ["--batch-size", str(w.batch_size), "--workers", str(w.num_workers)]
        argv += ["--preprocess-ms", str(w.preprocess_ms)]
        argv += ["--seconds", f"{w.end_s or s.duration_s + TAIL_SECONDS:g}"]
        if w.end_s:  # the loop ends there; the process holds its devices to the end
            argv += ["--hold-seconds", f"{s.duration_s + TAIL_SECONDS - w.end_s + 5:g}"]
        argv += ["--steps-log", str(steps_log), "--control", str(ctx.control)]
        if weights:
            argv += ["--weights", weights]
        if launcher == "run":  # unmodified, under gpufeed run
            argv = agent.under_run(argv)
        env = dict(os.environ, SLURM_JOB_ID=job_id, GPUFEED_SOCKET=str(agent.socket))
        if store is not None:
            env.update(S3_CLIENT_ENV)
        env.pop("GPUFEED_JOB_ID", None)
        together.check()
        # Runs of the same scenario start their workloads together, so that their fault
        # schedules coincide; a run that failed to set up breaks the barrier and the
        # others go on alone.
        with contextlib.suppress(threading.BrokenBarrierError):
            together.start.wait(timeout=600)
        together.check()
        with open(out / "workload.log", "wb") as wlog:
            proc = subprocess.Popen(
                cg.enter_argv([*_nice(nice), *argv]),
                env=env,
                stdout=wlog,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        cleanup.callback(_kill_group, proc)
        # The scenario's clock starts at the workload's first step (importing torch and
        # starting the input workers takes 5-30 s on a loaded host, and is not the fault),
        # or, for a workload that loads weights first, where that load begins.
        t0 = _first_step(steps_log, proc, together)
        setup_s = time.monotonic() - began
        sightings = _drive(s, agent, injectors, proc, t0, f"[{launcher}]", together)
        rc = proc.poll()
        if rc is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = proc.wait(30)
        ran_s = time.time() - t0
        sightings += _poll(agent, t0)
        agent.stop()  # logs the windows still open
        raw = agent.logged_windows()
        (out / "sightings.json").write_text(json.dumps([list(x) for x in _rows(sightings)]))
        (out / "windows.jsonl").write_text("".join(json.dumps(x) + "\n" for x in raw))
        scenario_s = time.monotonic() - began - setup_s
    timing = Timing(setup_s, scenario_s, time.monotonic() - began - setup_s - scenario_s)
    mine = [LabWindow.from_json(x, t0) for x in raw if x.get("job_id") == job_id]
    steps = _steps(steps_log, t0)
    node = NodeRun(0, tuple(mine), steps, tuple(sightings), ran_s=min(ran_s, s.duration_s))
    return RunResult(s, launcher, t0, job_id, node, len(raw) - len(mine), rc, out, timing)


def _first_step(
    steps_log: Path, proc: subprocess.Popen[bytes], together: Together, timeout_s: float = 240
) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        together.check()
        with contextlib.suppress(OSError, ValueError, IndexError):
            first = json.loads(steps_log.read_text().splitlines()[0])
            return float(first["start"] if "start" in first else first["t"])
        if proc.poll() is not None:
            raise LabError(f"the workload exited with {proc.returncode} before its first step")
        time.sleep(0.2)
    raise LabError(f"the workload made no step within {timeout_s:g} s")


def _rows(sightings: list[Sighting]) -> list[tuple[float, float, str, float | None]]:
    return [(x.seen_s, x.start_s, x.cause, x.end_s) for x in sightings]


def _copy(src: Path, dst: Path) -> None:
    with contextlib.suppress(OSError):
        shutil.copyfile(src, dst)


def _poll(agent: Agent, t0: float) -> list[Sighting]:
    try:
        data = agent.windows()
    except (OSError, ValueError):
        return []
    now = time.time() - t0
    closed = [
        Sighting(now, float(x["start"]) - t0, str(x["cause"]), float(x["end"]) - t0)
        for x in data.get("windows", [])
    ]
    return closed + [
        Sighting(now, float(x["start"]) - t0, str(x["cause"])) for x in data.get("open", [])
    ]


def _drive(
    s: Scenario,
    agent: Agent,
    injectors: list[tuple[Any, Any]],
    proc: subprocess.Popen[bytes],
    t0: float,
    tag: str,
    together: Together,
) -> list[Sighting]:
    """Starts and stops the faults on schedule until the scenario's end, polling the
    agent's windows; stops early if the workload dies."""
    events = sorted(
        [(f.start_s, 1, i) for i, (f, _) in enumerate(injectors) if f.start_s > 0]
        + [(f.stop_s, 0, i) for i, (f, _) in enumerate(injectors)]
    )
    sightings: list[Sighting] = []
    next_poll = 0.0
    while True:
        together.check()
        now = time.time() - t0
        while events and events[0][0] <= now:
            _, starting, i = events.pop(0)
            f, inj = injectors[i]
            (inj.start if starting else inj.stop)()
            say(f"  {tag} {now:6.1f} s  {'start' if starting else 'stop '} {f.kind}")
        if now >= s.duration_s + TAIL_SECONDS or proc.poll() is not None:
            return sightings
        if now >= next_poll:
            sightings += _poll(agent, t0)
            next_poll = now + POLL_SECONDS
        time.sleep(0.2)


def say(line: str) -> None:
    """Prints one line with one write. print() writes the text and its newline apart, and
    the runs of a scenario print from threads side by side, so two of their lines could
    splice into one (seen in CI: "start cpu_hog  [run] ... start io_contention")."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _steps(path: Path, t0: float) -> tuple[Step, ...]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError):
                d = json.loads(line)
                out.append(Step(float(d["t"]) - t0, float(d["s"]), float(d["c"])))
    return tuple(out)


def scenarios_for(names: list[str], suite: str) -> list[Scenario]:
    if names:
        return [find(n) for n in names]
    return [s for s in load_all() if suite in s.suites and s.nodes == 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.run", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="scenario names or YAML paths (default: the suite)")
    ap.add_argument("--suite", default="lab", help="run the scenarios of this suite (default: lab)")
    ap.add_argument("--launcher", choices=("run", "sdk", "both", "scenario"), default="both")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    ap.add_argument("--nice", type=int, default=-5, help="niceness of agent and workload")
    ap.add_argument(
        "--device",
        choices=("stand-in", "cuda"),
        default="stand-in",
        help=(
            "stand-in: the workload sleeps its device seconds per step (no GPU needed); "
            "cuda: real kernels on the GPU, the agent reading it through NVML"
        ),
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="scenarios at the same time (default 1; each with its launchers at once; "
        "always 1 with --device cuda)",
    )
    ap.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="run a scenario's launchers one after the other (default: at the same time; "
        "always one at a time with --device cuda: two jobs on one GPU would share it)",
    )
    args = ap.parse_args(argv)
    problem = host_problem()
    if problem:
        print(f"lab: {problem}", file=sys.stderr)
        return 2
    for line in sweep():  # what runners killed with SIGKILL left (only dead runners')
        print(f"lab: swept {line}", file=sys.stderr, flush=True)
    try:
        chosen = scenarios_for(args.names, args.suite)
    except ScenarioError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 2
    from lab.report import write_report

    results: list[RunResult] = []
    failed = 0
    began = time.monotonic()
    apart = args.one_at_a_time or args.device != "stand-in"
    groups: list[tuple[Scenario, list[str]]] = []
    for s in chosen:
        launchers = (
            [s.workload.launcher]
            if args.launcher == "scenario"
            else ["run", "sdk"]
            if args.launcher == "both"
            else [args.launcher]
        )
        groups += [(s, [x]) for x in launchers] if apart else [(s, launchers)]
    jobs = 1 if args.device != "stand-in" else max(1, args.jobs)
    with signals_raise():
        ran = run_lanes(lanes(groups, jobs), args.out, args.nice, args.device)
        order = {s.name: i for i, s in enumerate(chosen)}  # the report in the suite's order
        for s, launcher, got in sorted(ran, key=lambda x: order[x[0].name]):
            if isinstance(got, RunResult):
                results.append(got)
                continue
            print(f"lab: {s.name} ({launcher}) could not run: {got}", file=sys.stderr)
            failed += 1
    report = write_report(results, args.out, time.monotonic() - began)
    print(report.read_text() if report.exists() else "", flush=True)
    if failed:
        return 2
    return 0 if all(score(r.scenario, [r.run]).passed() for r in results) else 1


Group = tuple[Scenario, list[str]]  # a scenario and the launchers that run it at once


def lanes(groups: list[Group], jobs: int) -> list[list[Group]]:
    """`groups` dealt to `jobs` lanes that run side by side, each lane one group after the
    other: longest first, each to the lane that ends soonest (a scenario's length is its
    fixed schedule, so this is what sets the wall time)."""
    if jobs <= 1:
        return [groups] if groups else []
    out: list[list[Group]] = [[] for _ in range(min(jobs, len(groups)))]
    ends = [0.0] * len(out)
    for g in sorted(groups, key=lambda g: g[0].duration_s, reverse=True):
        i = ends.index(min(ends))
        out[i].append(g)
        ends[i] += g[0].duration_s + TAIL_SECONDS
    return [lane for lane in out if lane]


def run_lanes(
    plan: list[list[Group]], out: Path, nice: int, device: str = "stand-in"
) -> list[tuple[Scenario, str, RunResult | Exception]]:
    """Runs each lane's groups one after the other, the lanes at the same time (one thread
    each), every group's launchers at the same time (`run_together`'s threads). What one
    run sets up is its own (tiers, job cgroup, agent, SDK socket; CPU hogs inside its own
    job's cgroup), so runs of different scenarios can share the host as the launchers of
    one do. SIGTERM, SIGHUP and SIGINT stop every run through its cleanup and are then
    raised on as SystemExit, after the last run has cleaned up: an exception that
    interrupts `Thread.join` can leave the thread marked finished while it still runs, and
    the interpreter would then exit in the middle of that run's cleanup."""
    stop = threading.Event()
    received: list[int] = []
    barriers: list[threading.Barrier] = []
    got: list[list[tuple[Scenario, str, RunResult | Exception]]] = [[] for _ in plan]

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()
        for b in list(barriers):
            b.abort()

    def lane(i: int) -> None:
        for s, launchers in plan[i]:
            if stop.is_set():
                got[i] += [(s, x, LabError("stopped (the runner got a signal)")) for x in launchers]
                continue
            say(f"lab: {s.name} ({' + '.join(launchers)}), {s.duration_s:g} s")  # lanes: threads
            together = Together(threading.Barrier(len(launchers)), stop)
            barriers.append(together.start)
            runs = run_together(s, launchers, out, nice, device, together)
            got[i] += [(s, x, r) for x, r in zip(launchers, runs, strict=True)]

    old = {x: signal.signal(x, on_signal) for x in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        threads = [
            threading.Thread(target=lane, args=(i,), name=f"lab-lane-{i}") for i in range(len(plan))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for x, h in old.items():
            signal.signal(x, h)
    if received:
        raise SystemExit(128 + received[0])
    return [x for lane_got in got for x in lane_got]


def run_together(
    s: Scenario,
    launchers: list[str],
    out: Path,
    nice: int,
    device: str = "stand-in",
    together: Together | None = None,
) -> list[RunResult | Exception]:
    """Runs `s` once per launcher, all at the same time (one thread each), their workloads
    started together; a run that could not run is its exception. Signals: `run_lanes`."""
    together = together or Together(threading.Barrier(len(launchers)), threading.Event())
    got: list[RunResult | Exception] = [LabError("did not run")] * len(launchers)

    def one(i: int, launcher: str) -> None:
        try:
            got[i] = run_one(s, launcher, out, nice, device, together)
        except Exception as exc:  # reported as "could not run"; the other runs go on
            got[i] = exc
        finally:
            together.start.abort()  # a run that ends before the barrier frees the others

    threads = [
        threading.Thread(target=one, args=(i, x), name=f"lab-{s.name}-{x}")
        for i, x in enumerate(launchers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


if __name__ == "__main__":
    sys.exit(main())
