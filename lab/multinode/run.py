"""`python -m lab.multinode.run [--suite lab] [--jobs N] [SCENARIO.yaml ...] [--results DIR]`:
runs multi-node lab scenarios (the given files, else every `nodes` > 1 scenario of the suite
in lab/scenarios/) and writes what each node's agent said (see harness.py) plus a markdown
report (report.md, with every scenario's wall time and the total) under the results directory.

`--jobs N` runs up to N scenarios at the same time, each in a harness process of its own (its
own prefix for namespaces, links, mounts and cgroups: two runs never touch each other's
parts; the faults are per node - its veth, its loop device, its rank's cgroup, its process -
so they stay apart too). Most of a scenario's wall time is waiting (torch's import, the
rendezvous, the fixed schedule), which two runs overlap; what they share is the host's CPU:
on 2 cores the ranks of two scenarios compete, which slows healthy steps too, so `make lab`
runs them one at a time (LAB_MULTINODE_JOBS=1) and --jobs 2 is for a quick look
(docs/lab.md, "Time budget").

SIGTERM, SIGHUP and SIGINT end the run through its cleanup (faults lifted, processes ended,
namespaces, mounts, loop devices and cgroups removed). Exit status: 0 when every scenario
ran (whatever the agents said: the cross-node reading is judged elsewhere), 1 when one
failed to run, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from lab.multinode import culprit, report
from lab.multinode.harness import REPO, run_scenario
from lab.multinode.host import host_problem
from lab.multinode.scenario import Plan, load, plan
from lab.scenario import ScenarioError, load_all
from lab.sweep import sweep

Ran = tuple[dict[str, Any], dict[str, Any] | None]


class Interrupted(Exception):
    pass


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.multinode.run", description=__doc__)
    ap.add_argument("scenarios", nargs="*", type=Path)
    ap.add_argument("--suite", default="lab", help="without files: this suite's scenarios")
    ap.add_argument("--results", type=Path, default=Path("lab-results/multinode"))
    ap.add_argument(
        "--live-fleet",
        action="store_true",
        help="also scrape every agent into a real Prometheus and run `gpufeed fleet` on it; "
        "time when the fleet first names the culprit (lab/multinode/live.py)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="scenarios at the same time (default 1)")
    ap.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)  # --jobs' child
    args = ap.parse_args(argv)
    try:
        scenarios = (
            [load(p) for p in args.scenarios]
            if args.scenarios
            else [plan(s) for s in load_all() if s.nodes > 1 and args.suite in s.suites]
        )
    except ScenarioError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 2
    problem = host_problem()
    if problem is not None:
        print(f"lab: this host cannot run the multi-node lab: {problem}", file=sys.stderr)
        return 1
    if not args.no_report:  # --jobs' children: their parent has swept
        for line in sweep():  # what runners killed with SIGKILL left (only dead runners')
            print(f"lab: swept {line}", file=sys.stderr, flush=True)
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, _raise)
    began = time.monotonic()
    if args.jobs > 1 and len(scenarios) > 1:
        failed, runs = _in_parallel(scenarios, args.results, args.jobs, args.live_fleet)
        if failed < 0:
            return 130
    else:
        failed, runs = 0, []
        for sc in scenarios:
            try:
                done = run_scenario(sc, args.results, args.live_fleet)
                runs.append((done, report.score_run(sc, args.results, done)))
            except Interrupted as exc:
                print(f"lab: {sc.name}: interrupted ({exc}); cleaned up", file=sys.stderr)
                return 130
            except Exception as exc:
                print(f"lab: {sc.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                failed += 1
                runs += _ran(args.results, sc, score=False)
    if args.no_report:
        return 1 if failed else 0
    culprits: dict[str, dict[str, Any]] = {}
    scored_runs = {r["scenario"]: r for r, scored in runs if scored is not None}
    for sc in scenarios:
        ran = scored_runs.get(sc.name)
        if ran is None:
            continue
        try:
            culprits[sc.name] = culprit.evaluate(sc, args.results, ran)
        except Exception as exc:
            print(f"lab: {sc.name}: culprit: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed += 1
    wall_s = time.monotonic() - began
    (args.results / "report.md").write_text(report.markdown(args.results, runs, culprits, wall_s))
    (args.results / "culprit-totals.json").write_text(
        json.dumps(culprit.totals(list(culprits.values())), indent=1) + "\n"
    )
    print(f"lab: report in {args.results / 'report.md'} ({wall_s:.0f} s)", file=sys.stderr)
    return 1 if failed else 0


def _ran(results: Path, sc: Plan, score: bool) -> list[Ran]:
    """What a scenario's run.json says (and its score), or nothing when it has none."""
    try:
        done = json.loads((results / sc.name / "run.json").read_text())
    except (OSError, ValueError):
        return []
    return [(done, report.score_run(sc, results, done) if score and done.get("ok") else None)]


def _in_parallel(
    scenarios: list[Plan], results: Path, jobs: int, live_fleet: bool
) -> tuple[int, list[Ran]]:
    """Runs every scenario in a harness process of its own, `jobs` at a time; returns how
    many failed (-1: interrupted, every child stopped through its cleanup) and the runs in
    the scenarios' order."""
    waiting = list(scenarios)
    running: dict[str, tuple[Plan, subprocess.Popen[bytes]]] = {}
    failed = 0
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                sc = waiting.pop(0)
                argv = [sys.executable, "-m", "lab.multinode.run", sc.scenario.path]
                argv += ["--results", str(results), "--no-report"]
                argv += ["--live-fleet"] if live_fleet else []
                running[sc.name] = (sc, subprocess.Popen(argv, cwd=REPO))
            for name, (_, proc) in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    if proc.returncode != 0:
                        print(f"lab: {name}: harness exited {proc.returncode}", file=sys.stderr)
                        failed += 1
            time.sleep(0.5)
    except Interrupted as exc:
        for _, proc in running.values():  # each child cleans up on SIGTERM
            proc.send_signal(signal.SIGTERM)
        for name, (_, proc) in running.items():
            proc.wait()
            print(f"lab: {name}: interrupted ({exc}); cleaned up", file=sys.stderr)
        return -1, []
    runs: list[Ran] = []
    for sc in scenarios:
        runs += _ran(results, sc, score=True)
    return failed, runs


if __name__ == "__main__":
    sys.exit(main())
