"""The job-level score of a multi-node run: was the culprit named, and its own cause?

Each node's agent judges its node alone; the job-level reading (docs/correlator.md, "The job
level") joins every node of the job. Here it runs the way `gpufeed analyze` runs it over a
multi-node trace: the nodes' recorded traces joined, analysed with the agents' correlator
settings. (The live, central form is `gpufeed fleet`; lab/multinode/live.py times it.)

The truth comes from the schedule: during each fault the faulted node is the culprit and
every other node a victim, which should be `straggler` naming the culprit's instance (and
rank where the ranks report), with the culprit's own cause (`CULPRIT_CAUSE` per fault kind,
or the scenario's `expect` entry for that node). Figures per fault (a fault that did not slow the job is reported, not scored):

- top1: the culprit named most (victim-time) during the fault is the true one; over
  scenarios, top-1 recall is the share of faults with top1, top-1 precision the share of
  faults where a culprit was named at all whose top one is right (issue 13's targets);
- coverage: the share of victim-time during the fault inside a `straggler` window naming
  the right node (time-weighted, so the seconds before the stall shows count as missed);
- precision_time: of all time any window names a culprit (outside the recovery tails), the
  share naming the right node during its fault;
- cause_right: of the victim-time naming the right node, the share with its right cause;
- culprit_own_cause_ratio: the share of the fault its own node shows its own cause;
- opens_after_s: fault onset to the first straggler window naming the culprit (offline a
  window is known once it is `min_window_s` long: named_after_s adds that);
- healthy_named_ratio: time outside every fault and its recovery tail (`RECOVERY_S` after
  the lift: the job catching up, neither fault nor healthy) in which any node names a
  culprit, as a share of that time (target <= 1%).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpufeed.trace.source import open_trace
from lab import score
from lab.multinode import live
from lab.multinode.report import node_runs
from lab.multinode.scenario import Plan

# What gpufeed should say of the culprit's node per fault kind. A stopped (SIGSTOP) rank
# makes no progress while its process lives: its node says its job stopped working
# (`idle`, "stopped stepping N s ago"), and its peers, blocked in a collective whose wait
# they report as it grows, name it as the rank that waits least. A killed rank takes the
# job down (its peers' gloo collectives fail, the peers exit 1): its agent sees it lost
# (`gpufeed run` says "killed by signal 9"), the job counts as brought down (0% busy) on
# every node while its series stay, and the join names the lost rank; its own node runs
# nothing of the job any more (`idle`).
CULPRIT_CAUSE = {
    "link_rate_limit": "network",
    "blkio_read_limit": "data_loading",
    "cpu_quota": "preprocessing",
    "rank_stop": "idle",
    "rank_kill": "idle",
}
RECOVERY_S = 10.0  # after a lift: the job's recovery (one window's merge gap), not scored
TARGET_PRECISION = 0.95
TARGET_RECALL = 0.95
TARGET_HEALTHY_NAMED = 0.01


def joined_trace(results: Path, run: dict[str, Any], out: Path) -> Path:
    """Every node's recorded trace (as recorded, or as stored: gzipped) as one multi-node
    trace (`gpufeed analyze`'s input), streamed through the reader's own opener."""
    with out.open("w", encoding="utf-8") as dst:
        for n in run["nodes"]:
            d = results / run["scenario"] / f"node-{n['index']}"
            raw = d / "trace.om"
            with open_trace(str(raw if raw.exists() else d / "trace.om.gz")) as src:
                for line in io.TextIOWrapper(src, encoding="utf-8"):
                    if line.rstrip("\n") != "# EOF":
                        dst.write(line if line.endswith("\n") else line + "\n")
        dst.write("# EOF\n")
    return out


def job_windows(results: Path, run: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    """The job-level windows of a run: `gpufeed analyze` over the joined traces, with the
    agents' correlator settings."""
    trace = joined_trace(results, run, work / f"{run['scenario']}-job.om")
    settings = run.get("agent_correlator", {})
    cmd = [sys.executable, "-m", "gpufeed", "analyze", str(trace)]
    for key, flag in (("min_window_seconds", "--min-window"), ("merge_gap_seconds", "--merge-gap")):
        if key in settings:
            cmd += [flag, str(settings[key])]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"gpufeed analyze: {done.stderr.strip()[-300:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def truth(plan: Plan) -> list[tuple[int, float, float, str]]:
    """(culprit node, from, to, its cause) per fault, in seconds after the first step."""
    out = []
    for f in plan.faults:
        cause = next(
            (
                e.cause.value
                for e in plan.scenario.expect
                if e.node == f.node and e.start_s < f.stop_s and e.stop_s > f.start_s
            ),
            CULPRIT_CAUSE[f.kind],
        )
        out.append((f.node, f.start_s, f.stop_s, cause))
    return out


def _culprit(w: dict[str, Any]) -> dict[str, Any] | None:
    c = w.get("culprit") or (w.get("evidence") or {}).get("culprit")
    return c if isinstance(c, dict) and c.get("instance") else None


def score_culprit(
    plan: Plan, results: Path, run: dict[str, Any], windows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The job-level figures of one run (see the module's doc); JSON-ready."""
    t0 = run["t0"]
    said_at = run.get("collected_at") or 0.0
    end = min(plan.scenario.duration_s, said_at - t0) if said_at else plan.scenario.duration_s
    instance = {n["index"]: n["instance"] for n in run["nodes"]}
    node_of = {v: k for k, v in instance.items()}
    steps = {r.node: r.steps for r in node_runs(results, run)}
    naming: list[tuple[int, float, float, dict[str, Any]]] = []  # (node, from, to, culprit)
    own: list[tuple[int, float, float, str]] = []
    for w in windows:
        node = node_of.get(w.get("instance", ""))
        if node is None:
            continue
        a, b = float(w["start"]) - t0, float(w["end"]) - t0
        c = _culprit(w)
        if w.get("cause") == "straggler" and c is not None:
            naming.append((node, a, b, c))
        else:
            own.append((node, a, b, str(w.get("cause"))))
    truths = truth(plan)
    # not capped at `end`: a killed rank's job stays down past stop_s, and windows that run
    # on until the agents are stopped (a few seconds after `end`) are its aftermath
    tails = [(stop, stop + RECOVERY_S) for _, _, stop, _ in truths]
    faults = [_fault(plan, instance, steps, naming, own, t, end) for t in truths]
    # time-weighted precision: every second a node names a culprit, outside recovery tails
    named_total = right_total = 0.0
    for node, a, b, c in naming:
        said = score.subtract([(a, b)], tails)
        named_total += score.length(said)
        right_total += sum(
            score.length(score.intersect(said, [(start, stop)]))
            for cnode, start, stop, _ in truths
            if node != cnode and c["instance"] == instance[cnode]
        )
    busy = [(start, min(stop + RECOVERY_S, end)) for _, start, stop, _ in truths]
    healthy = score.subtract([(plan.scenario.settle_s, end)], busy)
    healthy_total = healthy_named = 0.0
    for n in instance:
        healthy_total += score.length(healthy)
        mine = [(a, b) for node, a, b, _ in naming if node == n]
        healthy_named += score.length(score.intersect(healthy, mine))
    scored = [f for f in faults if f["bit"]]
    healthy_ratio = healthy_named / healthy_total if healthy_total > 0 else None
    precision_time = right_total / named_total if named_total > 0 else None
    return {
        "scenario": plan.name,
        "faults": faults,
        "precision_time": score._r(precision_time),
        "named_s": round(named_total, 1),
        "healthy_s": round(healthy_total, 1),
        "healthy_named_ratio": score._r(healthy_ratio),
        "passed": bool(scored)
        and all(f["top1"] and (f["cause_right"] or 0.0) >= 0.95 for f in scored)
        and (precision_time or 0.0) >= TARGET_PRECISION
        and (healthy_ratio or 0.0) <= TARGET_HEALTHY_NAMED,
    }


def _fault(
    plan: Plan,
    instance: dict[int, str],
    steps: dict[int, tuple[score.Step, ...]],
    naming: list[tuple[int, float, float, dict[str, Any]]],
    own: list[tuple[int, float, float, str]],
    fault: tuple[int, float, float, str],
    end: float,
) -> dict[str, Any]:
    cnode, start, stop, cause = fault
    span = (start, min(stop, end))
    healthy = score.subtract(
        [(plan.scenario.settle_s, end)], [(start, min(stop + RECOVERY_S, end))]
    )
    ratio = score.throughput_ratio(steps.get(cnode, ()), span, healthy)
    victims = [n for n in instance if n != cnode]
    by_culprit: dict[str, float] = {}
    right_cause = 0.0
    first: float | None = None
    ranks: set[str] = set()
    for node, a, b, c in naming:
        d = score.length(score.intersect([span], [(a, b)]))
        if node == cnode or d <= 0:
            continue
        by_culprit[c["instance"]] = by_culprit.get(c["instance"], 0.0) + d
        if c["instance"] == instance[cnode]:
            right_cause += d if c.get("cause") == cause else 0.0
            first = max(a, start) if first is None else min(first, max(a, start))
            if c.get("rank"):
                ranks.add(str(c["rank"]))
    named = by_culprit.get(instance[cnode], 0.0)
    top = max(by_culprit, key=lambda k: by_culprit[k]) if by_culprit else None
    own_s = sum(
        score.length(score.intersect([span], [(a, b)]))
        for node, a, b, c in own
        if node == cnode and c == cause
    )
    length = span[1] - span[0]
    opens = None if first is None else round(first - start, 1)
    return {
        "culprit_node": cnode,
        "culprit_instance": instance[cnode],
        "cause": cause,
        "start_s": start,
        "stop_s": stop,
        "bit": ratio is not None and ratio <= score.BITE_THROUGHPUT_RATIO,
        "throughput_ratio": score._r(ratio),
        "named_any": top is not None,
        "top1": top == instance[cnode],
        "coverage": score._r(named / (length * len(victims))) if length > 0 else None,
        "cause_right": score._r(right_cause / named) if named else None,
        "ranks_named": sorted(ranks),
        "named_s_by_culprit": {k: round(v, 1) for k, v in sorted(by_culprit.items())},
        "culprit_own_cause_ratio": score._r(own_s / length) if length > 0 else None,
        "opens_after_s": opens,
        "named_after_s": None if opens is None else round(opens + plan.min_window_s, 1),
    }


def totals(scores: list[dict[str, Any]]) -> dict[str, Any]:
    """Top-1 precision and recall over every scored fault of the given runs."""
    faults = [f for s in scores for f in s["faults"] if f["bit"]]
    said = [f for f in faults if f["named_any"]]
    right = [f for f in faults if f["top1"]]
    return {
        "faults": len(faults),
        "top1_recall": score._r(len(right) / len(faults)) if faults else None,
        "top1_precision": score._r(len(right) / len(said)) if said else None,
        "cause_right": score._r(
            sum(1 for f in right if (f["cause_right"] or 0) >= 0.95) / len(right)
        )
        if right
        else None,
    }


def evaluate(plan: Plan, results: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The job-level reading of a finished run, scored; writes job-windows.jsonl,
    culprit.json and timeline.png beside the run's run.json."""
    from lab.multinode.timeline import timeline_png

    out = results / plan.name
    windows = job_windows(results, run, out)
    (out / f"{plan.name}-job.om").unlink(missing_ok=True)  # the joined copy: the nodes' own stay
    (out / "job-windows.jsonl").write_text("".join(json.dumps(w) + "\n" for w in windows))
    scored = score_culprit(plan, results, run, windows)
    if (out / "fleet").is_dir():  # the live run: when the fleet service named the culprit
        for f in scored["faults"]:
            onset, stop = run["t0"] + f["start_s"], run["t0"] + f["stop_s"]
            f["fleet"] = live.naming_times(out / "fleet", f["culprit_instance"], onset, stop)
    (out / "culprit.json").write_text(json.dumps(scored, indent=1) + "\n")
    timeline_png(
        run, node_runs(results, run), windows, plan.scenario.duration_s, out / "timeline.png"
    )
    return scored


def markdown(scored: dict[str, Any]) -> list[str]:
    """The culprit lines of a scenario's report section."""
    lines = ["", "Job level (the nodes' traces joined, `gpufeed analyze`):", ""]
    lines += [
        "| culprit | its cause | bit | top-1 | coverage | cause right | rank | own cause | "
        "opens after s | named after s (offline) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in scored["faults"]:
        lines.append(
            f"| node {f['culprit_node']} ({f['culprit_instance']}) | {f['cause']} | {f['bit']} | "
            f"{f['top1']} | {f['coverage']} | {f['cause_right']} | "
            f"{','.join(f['ranks_named']) or '-'} | {f['culprit_own_cause_ratio']} | "
            f"{f['opens_after_s']} | {f['named_after_s']} |"
        )
    for f in scored["faults"]:
        fl = f.get("fleet")
        if fl is not None:
            lines += [
                "",
                f"Live (`gpufeed fleet` on a real Prometheus scraping every agent each second, "
                f"{fl['polls']} polls of its /api/windows): node {f['culprit_node']} named "
                f"{fl['named_after_onset_s']} s after the fault's onset, "
                f"{fl['named_after_window_opened_s']} s after its window opened "
                f"(which opened {fl['window_opened_after_onset_s']} s after the onset); "
                f"known to the engines between the cycles at "
                f"+{fl.get('not_known_at_boundary_after_onset_s')} and "
                f"+{fl.get('known_by_boundary_after_onset_s')} s, seen "
                f"{fl.get('named_after_boundary_s')} s after that boundary (cycles took "
                f"{fl.get('cycle_seconds_median')} s, at most {fl.get('cycle_seconds_max')} s); "
                f"other culprits named: {', '.join(fl['other_culprits_named']) or 'none'}.",
            ]
    lines += [
        "",
        f"Culprit precision (time): {scored['precision_time']}; healthy time with a culprit "
        f"named: {scored['healthy_named_ratio']} of {scored['healthy_s']} node-s; "
        f"passed: {scored['passed']}. ![timeline]({scored['scenario']}/timeline.png)",
    ]
    return lines
