"""Accuracy on jobs that are never healthy (issue 24): a slow worker from the first step.

Generates jobs with bench/never_healthy.py (steps of 0.5-60 s, 8-128 ranks, both
utilization guises, and the same jobs healthy), runs `gpufeed analyze`'s engine over every
node of the job and the job-level join, and scores per case:

- **victims' waiting time inside a window**, any cause, and inside a `straggler` window
  (what the job level makes of it), over all their waiting time (target >= 95%);
- **culprit named**: the share of the victims' `straggler` window time whose culprit is
  the slow worker's node (its GPU too, for a one-GPU culprit);
- **found after**: seconds from a victim's first wait until its first window opened (the
  window's start plus the minimum window), the most over the victims; target: within 3
  of the job's steps or 60 s (the default minimum window), whichever is longer, plus one
  sample;
- **healthy**: the share of a healthy job's GPU time inside any window (target <= 1%).

Exit status 1 when a victim or healthy target is missed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass

from bench import never_healthy as nh
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.trace.reader import read_trace

# (step seconds, nodes, GPUs per node, culprit GPUs)
CASES: tuple[tuple[float, int, int, int], ...] = (
    (0.5, 1, 8, 1),
    (5.0, 8, 8, 4),
    (46.0, 8, 8, 4),
    (60.0, 16, 8, 1),
)
INSIDE_TARGET = 0.95
HEALTHY_TARGET = 0.01


@dataclass(frozen=True, slots=True)
class Score:
    waiting_s: float
    in_window: float  # shares of the victims' waiting time
    in_straggler: float
    culprit_named: float  # share of straggler time naming the culprit
    found_after_s: float | None  # None: some victim never opened a window
    windows: int


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def analyse(tr: nh.Trace, params: WindowParams) -> list[Window]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "job.om")
        with open(path, "w") as f:
            f.write(tr.text)
        trace = read_trace(path, jobs=1)
    windows = analyze_nodes(trace.nodes.values(), params, jobs=1)
    return correlate_jobs(trace.nodes.values(), windows, params.threshold_ratio)


def score(tr: nh.Trace, windows: list[Window], params: WindowParams) -> Score:
    by_gpu: dict[tuple[str, str], list[Window]] = {}
    for w in windows:
        by_gpu.setdefault((w.instance, w.gpu), []).append(w)
    total = inside = strag = named = strag_time = 0.0
    found: list[float | None] = []
    for key, stretches in tr.waits.items():
        mine = by_gpu.get(key, [])
        for a, b in stretches:
            total += b - a
            inside += sum(_overlap(a, b, w.start_seconds, w.end_seconds) for w in mine)
            strag += sum(
                _overlap(a, b, w.start_seconds, w.end_seconds)
                for w in mine
                if w.cause.value == "straggler"
            )
        for w in mine:
            if w.cause.value != "straggler":
                continue
            strag_time += w.duration_seconds
            c = w.culprit
            if (
                c is not None
                and c.instance == tr.culprit_instance
                and (len(tr.culprit_gpus) > 1 or c.gpu in tr.culprit_gpus)
            ):
                named += w.duration_seconds
        first = min((w.start_seconds for w in mine), default=None)
        onset = stretches[0][0]  # its first wait
        found.append(None if first is None else first + params.min_window_seconds - onset)
    after = None if not found or any(x is None for x in found) else max(found)  # type: ignore[type-var]
    return Score(
        total,
        inside / total if total else 1.0,
        strag / total if total else 1.0,
        named / strag_time if strag_time else 0.0,
        after,
        len(windows),
    )


def healthy_share(tr: nh.Trace, windows: list[Window]) -> float:
    gpu_time = len(tr.instances) * tr.gpus_per_node * (tr.end - tr.start)
    return sum(w.duration_seconds for w in windows) / gpu_time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--guises", nargs="*", default=list(nh.GUISES))
    ap.add_argument(
        "--slow", type=float, default=2.4, help="how much longer the slow worker computes"
    )
    ap.add_argument(
        "--cases", nargs="*", default=[f"{s:g}/{n}/{g}/{c}" for s, n, g, c in CASES],
        help="step_seconds/nodes/gpus/culprit_gpus",
    )  # fmt: skip
    a = ap.parse_args()
    params = WindowParams()
    print(
        f"{'step s':>7}{'ranks':>6}{'culprit':>8}{'guise':>13}{'in window':>10}"
        f"{'straggler':>10}{'named':>7}{'found s':>9}{'target s':>9}{'healthy':>9}"
    )
    ok = True
    for case in a.cases:
        s, n, g, c = case.split("/")
        step, nodes, gpus, cg = float(s), int(n), int(g), int(c)
        for guise in a.guises:
            tr = nh.build(step, nodes, gpus, guise, slow=a.slow, culprit_gpus=cg, seed=a.seed)
            sc = score(tr, analyse(tr, params), params)
            ht = nh.build(step, nodes, gpus, guise, slow=1.0, seed=a.seed)
            hs = healthy_share(ht, analyse(ht, params))
            target = max(3 * tr.job_step_seconds, params.min_window_seconds) + 1.0
            found = "never" if sc.found_after_s is None else f"{sc.found_after_s:.0f}"
            print(
                f"{step:>7g}{nodes * gpus:>6}{cg:>8}{guise:>13}{sc.in_window:>10.3f}"
                f"{sc.in_straggler:>10.3f}{sc.culprit_named:>7.3f}{found:>9}{target:>9.0f}"
                f"{hs * 100:>8.2f}%"
            )
            ok = ok and sc.in_window >= INSIDE_TARGET and hs <= HEALTHY_TARGET
            ok = ok and sc.found_after_s is not None and sc.found_after_s <= target
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
