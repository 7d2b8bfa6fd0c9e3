"""Culprit accuracy of the job-level correlation on labelled multi-node jobs (issue 13).

Generates one job per scenario of bench/multinode_scenarios.py (16 nodes x 8 GPUs by
default; one GPU clock-limited, a slow GPU, one node's data tier slow, its CPUs starved,
its link degraded, congestion on every node, a rank hung, a rank killed, a GPU lost
mid-run and a GPU lost an hour before a stall elsewhere, a healthy job), writes each as one
merged trace file, runs `gpufeed analyze`'s engine and the job-level join on it and scores:

- culprit top-1 precision (predicted `straggler` GPU-time whose culprit is the true one,
  over all predicted `straggler` time) and recall (true `straggler` GPU-time covered by a
  `straggler` window naming the true culprit); the culprit's cause against the truth;
- time to name the culprit: the join run on what was known N seconds after the stall's
  first window opened (its start + the minimum window), the first N that names it;
- healthy time without a culprit: GPU-time outside every label not inside a `straggler`
  window;
- per-cause precision/recall and macro-F1 over every GPU, as bench/correlator_accuracy.py.

Exit status 1 when a target is missed: precision and recall >= 0.95, every culprit named
within 30 s of its window opening, >= 99% of healthy time without a culprit.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass

from bench import multinode_scenarios as mn
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.job.culprit import correlate_jobs, find_culprit, is_waiting
from gpufeed.trace.reader import read_trace

NAME_WITHIN_SECONDS = 30.0
PROBE_SECONDS = (0.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0)


@dataclass(slots=True)
class Tally:
    straggler_truth_s: float = 0.0
    straggler_pred_s: float = 0.0
    recall_hit_s: float = 0.0
    precision_hit_s: float = 0.0
    cause_hit_s: float = 0.0
    healthy_s: float = 0.0
    healthy_culprit_s: float = 0.0

    def add(self, o: Tally) -> None:
        for f in self.__slots__:
            setattr(self, f, getattr(self, f) + getattr(o, f))


def _matches(w: Window, lab: mn.Label) -> bool:
    c = w.culprit
    if c is None or c.instance != lab.culprit_instance:
        return False
    return not lab.culprit_gpu or c.gpu == lab.culprit_gpu


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def score(tr: mn.MultiNodeTrace, windows: list[Window], span: tuple[float, float]) -> Tally:
    t = Tally()
    truth_cause = {s.kind: s.cause for s in tr.stalls}
    labs: dict[tuple[str, str], list[mn.Label]] = {}
    for lab in tr.labels:
        labs.setdefault((lab.instance, lab.gpu), []).append(lab)
    for lab in tr.labels:
        if lab.cause == "straggler":
            t.straggler_truth_s += lab.end - lab.start
    for w in windows:
        mine = labs.get((w.instance, w.gpu), [])
        inside = sum(_overlap(w.start_seconds, w.end_seconds, x.start, x.end) for x in mine)
        if w.cause.value == "straggler":
            t.straggler_pred_s += w.duration_seconds
            t.healthy_culprit_s += max(0.0, w.duration_seconds - inside)
        for lab in mine:
            d = _overlap(w.start_seconds, w.end_seconds, lab.start, lab.end)
            if d <= 0 or lab.cause != "straggler" or w.cause.value != "straggler":
                continue
            if _matches(w, lab):
                t.recall_hit_s += d
                t.precision_hit_s += d
                kinds = [s for s in tr.stalls if s.start <= lab.start <= s.end + 30]
                want = kinds[-1].cause if kinds else truth_cause.get("", "")
                if w.culprit is not None and w.culprit.cause.value == want:
                    t.cause_hit_s += d
    gpus = len(tr.instances) * tr.gpus_per_node
    labelled = sum(x.end - x.start for x in tr.labels)
    t.healthy_s = (span[1] - span[0]) * gpus - labelled
    return t


def time_to_name(
    tr: mn.MultiNodeTrace, nodes: dict[str, object], windows: list[Window], params: WindowParams
) -> list[float | None]:
    """Per stall with victims: seconds after its first window opened until the join, fed
    only what was known then, names the true culprit (None: not within the probes)."""
    out: list[float | None] = []
    for st in tr.stalls:
        truth = next((x for x in tr.labels if x.cause == "straggler" and x.start >= st.start), None)
        if truth is None or st.kind == "lost":
            continue
        first = [
            w
            for w in windows
            if is_waiting(w) or w.cause.value == "straggler"
            if st.start - 60 <= w.start_seconds <= st.end
        ]
        if not first:
            out.append(None)
            continue
        s0 = min(w.start_seconds for w in first)
        opened = s0 + params.min_window_seconds
        got = None
        for d in PROBE_SECONDS:
            cut = opened + d
            known = [
                _clip(w, cut)
                for w in windows
                if w.start_seconds <= cut - params.min_window_seconds and w.end_seconds >= s0
            ]
            found = find_culprit(tr.job_id, nodes, known, s0, cut)  # type: ignore[arg-type]
            if (
                found is not None
                and found.culprit.instance == truth.culprit_instance
                and (not truth.culprit_gpu or found.culprit.gpu == truth.culprit_gpu)
            ):
                got = d
                break
        out.append(got)
    return out


def _clip(w: Window, cut: float) -> Window:
    from dataclasses import replace

    return replace(w, end_seconds=min(w.end_seconds, cut))


def run(
    kinds: list[str],
    nodes: int,
    gpus: int,
    interval: float,
    seed: int,
    ranks: bool,
    guise: str = mn.GUISES[0],
) -> tuple[dict[str, dict[str, object]], Tally]:
    params = WindowParams()
    total = Tally()
    rows: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as d:
        for kind in kinds:
            tr = mn.build(
                kind, seed=seed, nodes=nodes, gpus=gpus, interval=interval, ranks=ranks,
                guise=guise,
            )  # fmt: skip
            path = os.path.join(d, f"{kind}.om")
            with open(path, "w") as f:
                f.write(tr.text)
            t0 = time.perf_counter()
            trace = read_trace(path, jobs=2)
            windows = analyze_nodes(trace.nodes.values(), params, jobs=2)
            joined = correlate_jobs(trace.nodes.values(), windows)
            secs = time.perf_counter() - t0
            first = next(iter(trace.nodes.values()))
            up = next(iter(first.gpus.values())).fields["up"]
            tally = score(tr, joined, (up.ts[0], up.ts[-1]))
            total.add(tally)
            named = time_to_name(tr, dict(trace.nodes), joined, params)
            rows[kind] = {"tally": tally, "named_s": named, "seconds": secs, "windows": joined}
    return rows, total


def _ratio(a: float, b: float) -> float:
    return a / b if b else 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-ranks", action="store_true", help="without per-rank signals")
    ap.add_argument("--scenarios", nargs="*", default=[*mn.SCENARIOS, "healthy"])
    ap.add_argument(
        "--guise", choices=mn.GUISES, default=mn.GUISES[0],
        help="how a GPU waiting in a collective reads: spin (NCCL, the default),"
        " compute_only (gloo), mixed (spinning on the GPM nodes only: 0.2.0's traces)",
    )  # fmt: skip
    a = ap.parse_args()
    rows, total = run(a.scenarios, a.nodes, a.gpus, a.interval, a.seed, not a.no_ranks, a.guise)
    print(
        f"culprit accuracy: {a.nodes} nodes x {a.gpus} GPUs, {a.interval:g} s,"
        f" per-rank signals {'off' if a.no_ranks else 'on'}, guise {a.guise}"
    )
    print(
        f"{'scenario':<24}{'precision':>10}{'recall':>8}{'cause':>7}{'named after s':>16}"
        f"{'healthy ok':>12}{'analysis s':>12}"
    )
    late = False
    for kind, row in rows.items():
        t = row["tally"]
        assert isinstance(t, Tally)
        named = row["named_s"]
        assert isinstance(named, list)
        late = late or any(x is None or x > NAME_WITHIN_SECONDS for x in named)
        print(
            f"{kind:<24}{_ratio(t.precision_hit_s, t.straggler_pred_s):>10.3f}"
            f"{_ratio(t.recall_hit_s, t.straggler_truth_s):>8.3f}"
            f"{_ratio(t.cause_hit_s, t.recall_hit_s):>7.3f}"
            f"{','.join('-' if x is None else f'{x:g}' for x in named) or 'n/a':>16}"
            f"{1 - _ratio(t.healthy_culprit_s, t.healthy_s):>12.4f}"
            f"{float(row['seconds']):>12.1f}"  # type: ignore[arg-type]
        )
    p = _ratio(total.precision_hit_s, total.straggler_pred_s)
    r = _ratio(total.recall_hit_s, total.straggler_truth_s)
    healthy = 1 - _ratio(total.healthy_culprit_s, total.healthy_s)
    print(
        f"all: culprit precision {p:.3f}, recall {r:.3f} (goal >= 0.95 each); culprit's cause"
        f" right {_ratio(total.cause_hit_s, total.recall_hit_s):.3f}; healthy time without"
        f" a culprit {healthy * 100:.2f}% (goal >= 99%); every culprit named within"
        f" {NAME_WITHIN_SECONDS:g} s of its window opening: {'no' if late else 'yes'}"
    )
    return 0 if p >= 0.95 and r >= 0.95 and healthy >= 0.99 and not late else 1


if __name__ == "__main__":
    raise SystemExit(main())
