"""`python -m lab.multinode.run [--suite lab] [SCENARIO.yaml ...] [--results DIR]`: runs
multi-node lab scenarios (the given files, else every `nodes` > 1 scenario of the suite in
lab/scenarios/) one after another and writes what each node's agent said (see harness.py) plus a
markdown report (report.md) under the results directory.

SIGTERM, SIGHUP and SIGINT end the run through its cleanup (faults lifted, processes ended,
namespaces, mounts, loop devices and cgroups removed). Exit status: 0 when every scenario
ran (whatever the agents said: the cross-node reading is judged elsewhere), 1 when one
failed to run, 2 for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from lab.multinode import culprit, report
from lab.multinode.harness import run_scenario
from lab.multinode.host import host_problem
from lab.multinode.scenario import load, plan
from lab.scenario import ScenarioError, load_all


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
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, _raise)
    failed = 0
    runs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    culprits: dict[str, dict[str, Any]] = {}
    for sc in scenarios:
        try:
            done = run_scenario(sc, args.results, args.live_fleet)
            runs.append((done, report.score_run(sc, args.results, done)))
            culprits[sc.name] = culprit.evaluate(sc, args.results, done)
        except Interrupted as exc:
            print(f"lab: {sc.name}: interrupted ({exc}); cleaned up", file=sys.stderr)
            return 130
        except Exception as exc:
            print(f"lab: {sc.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed += 1
            with contextlib.suppress(OSError, ValueError):
                runs.append((json.loads((args.results / sc.name / "run.json").read_text()), None))
    (args.results / "report.md").write_text(report.markdown(args.results, runs, culprits))
    (args.results / "culprit-totals.json").write_text(
        json.dumps(culprit.totals(list(culprits.values())), indent=1) + "\n"
    )
    print(f"lab: report in {args.results / 'report.md'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
