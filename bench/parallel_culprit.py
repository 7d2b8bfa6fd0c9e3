"""The job-level join on parallel jobs that are never healthy (issue 24).

Generates the dp x pp x tp jobs of bench/multinode_scenarios.py's PARALLEL_SCENARIOS (a
slow worker, a slow pipeline stage, a rotating input imbalance; slow from the first step)
for each layout and step time, runs `gpufeed analyze`'s engine and the job-level join and
scores, per scenario, over the victims' waiting time (each rank's exposed wait per step,
from the end of its own work to the end of the step's slowest rank: ParallelTrace.waits):

- `in windows`: the victims' waiting time inside any `straggler` window (what the node
  engines open decides this: their window rule is not the join's);
- `named`: waiting time inside a `straggler` window that names the truth: the culprit's
  instance and its GPUs for `slow_worker` (culprit rank top-1), the `straggler_reason` for
  the imbalances;
- `of windowed`: `named` over the waiting time inside windows (the join's own accuracy);
- `node blamed`: for the imbalances, GPU-time inside windows that name any culprit, over
  the waiting time (no node may be blamed);
- `named after`: seconds (and steps) after the job's first waiting window opened (its
  start + the minimum window) until the join, fed only the windows known then, names the
  truth (probes: PROBE_STEPS steps and PROBE_SECONDS; "-": not within them). The issue's
  target: within 3 steps or 60 s, whichever is longer.

Each row's `targets` (`meets`), exit status 1 when any is missed: the victims inside windows
for >= 95% of their waiting time, culprit top-1 >= 0.95 or the imbalance named for >= 90%
of the windowed time with no node blamed, named within 3 steps or 60 s. `--guises`: how a
GPU waiting in a collective reads (bench/multinode_scenarios.py's GUISES; both by default).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass, replace

from bench import multinode_scenarios as mn
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.job.culprit import Found, Imbalance, correlate_jobs, is_waiting, judge_stall
from gpufeed.trace.reader import read_trace

LAYOUTS = {8: (2, 2, 2, 4), 64: (4, 4, 4, 8), 128: (8, 4, 4, 8)}  # ranks -> dp, pp, tp, gpus
PROBE_STEPS = (0, 1, 2, 3, 4, 6, 8, 12)
PROBE_SECONDS = (15.0, 30.0, 45.0, 60.0, 90.0, 120.0)
CULPRIT_TARGET = 0.95
IMBALANCE_TARGET = 0.90
WINDOWED_TARGET = 0.95


@dataclass(frozen=True, slots=True)
class Score:
    truth_s: float
    windowed_s: float
    named_s: float
    blamed_s: float
    named_after_seconds: float | None = None

    @property
    def of_windowed(self) -> float:
        return self.named_s / self.windowed_s if self.windowed_s else 0.0


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _names(w: Window, lab: mn.ParallelLabel) -> bool:
    if lab.reason:
        return w.culprit is None and dict(w.evidence).get("straggler_reason") == lab.reason
    c = w.culprit
    return c is not None and c.instance == lab.culprit_instance and c.gpu == lab.culprit_gpu


def score(tr: mn.ParallelTrace, windows: list[Window]) -> Score:
    """Over each victim's waiting time (ParallelTrace.waits: its exposed wait per step)."""
    by_gpu: dict[tuple[str, str], list[Window]] = {}
    for w in windows:
        if w.cause.value == "straggler":
            by_gpu.setdefault((w.instance, w.gpu), []).append(w)
    truth = windowed = named = blamed = 0.0
    for lab in tr.labels:
        for a, b in tr.waits.get((lab.instance, lab.gpu), ()):
            a, b = max(a, lab.start), min(b, lab.end)
            if b <= a:
                continue
            truth += b - a
            for w in by_gpu.get((lab.instance, lab.gpu), ()):
                d = _overlap(w.start_seconds, w.end_seconds, a, b)
                windowed += d
                named += d if _names(w, lab) else 0.0
                blamed += d if lab.reason and w.culprit is not None else 0.0
    return Score(truth, windowed, named, blamed)


def named_after(
    tr: mn.ParallelTrace, nodes: dict[str, NodeSeries], windows: list[Window]
) -> float | None:
    """Seconds after the first waiting window opened until the join names the truth."""
    waiting = [w for w in windows if is_waiting(w)]
    if not waiting or not tr.labels:
        return None
    s0 = min(w.start_seconds for w in waiting)
    opened = s0 + WindowParams().min_window_seconds
    lab = tr.labels[0]
    for d in sorted({k * tr.step_seconds for k in PROBE_STEPS} | set(PROBE_SECONDS)):
        cut = opened + d
        known = [
            replace(w, end_seconds=min(w.end_seconds, cut))
            for w in waiting
            if w.start_seconds < cut
        ]
        got = judge_stall(tr.job_id, nodes, known, s0, cut)
        if isinstance(got, Imbalance) and got.reason.value == lab.reason:
            return d
        if isinstance(got, Found) and not lab.reason:
            c = got.culprit
            if (c.instance, c.gpu) == (lab.culprit_instance, lab.culprit_gpu):
                return d
    return None


def run_one(kind: str, ranks: int, step: float, guise: str, seed: int) -> Score:
    dp, pp, tp, gpus = LAYOUTS[ranks]
    tr = mn.build_parallel(
        kind, seed, dp, pp, tp, gpus, step_seconds=step, duration=max(1800.0, 40 * step),
        guise=guise,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{kind}.om")
        with open(path, "w") as f:
            f.write(tr.text)
        trace = read_trace(path, jobs=1)
    windows = analyze_nodes(trace.nodes.values(), WindowParams(), jobs=1)
    got = score(tr, correlate_jobs(trace.nodes.values(), windows))
    return replace(got, named_after_seconds=named_after(tr, dict(trace.nodes), windows))


def meets(kind: str, step: float, s: Score) -> bool:
    """The issue's targets: victims inside windows for WINDOWED_TARGET of their waiting
    time, the truth named (CULPRIT_TARGET / IMBALANCE_TARGET) with no node blamed for an
    imbalance, named within 3 steps of the first window or 60 s, whichever is longer."""
    t = s.truth_s or 1.0
    target = CULPRIT_TARGET if kind == "slow_worker" else IMBALANCE_TARGET
    soon = s.named_after_seconds is not None and s.named_after_seconds <= max(3 * step, 60.0)
    return (
        s.windowed_s / t >= WINDOWED_TARGET and s.of_windowed >= target and s.blamed_s == 0 and soon
    )


def _after(seconds: float | None, step: float) -> str:
    return "-" if seconds is None else f"{seconds:g} s ({seconds / step:g} steps)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", nargs="*", type=int, default=[8, 64, 128], choices=sorted(LAYOUTS))
    ap.add_argument("--steps", nargs="*", type=float, default=[1.0, 5.0, 46.0])
    ap.add_argument("--scenarios", nargs="*", default=list(mn.PARALLEL_SCENARIOS))
    ap.add_argument(
        "--guises", nargs="*", choices=mn.GUISES, default=list(mn.GUISES[:2]),
        help="how a GPU waiting in a collective reads: spin (NCCL, the default), compute_only",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print("parallel jobs never healthy; guise: how a GPU waiting in a collective reads")
    print(
        f"{'scenario':<20}{'guise':>13}{'ranks':>6}{'step s':>8}{'in windows':>12}{'named':>8}"
        f"{'of windowed':>13}{'node blamed':>13}{'named after':>20}  targets"
    )
    ok = True
    for kind in a.scenarios:
        for guise in a.guises:
            for ranks in a.ranks:
                for step in a.steps:
                    s = run_one(kind, ranks, step, guise, a.seed)
                    met = meets(kind, step, s)
                    ok = ok and met
                    t = s.truth_s or 1.0
                    print(
                        f"{kind:<20}{guise:>13}{ranks:>6}{step:>8g}{s.windowed_s / t:>12.3f}"
                        f"{s.named_s / t:>8.3f}{s.of_windowed:>13.3f}{s.blamed_s / t:>13.3f}"
                        f"  {_after(s.named_after_seconds, step):>18}  {'met' if met else 'MISSED'}"
                    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
