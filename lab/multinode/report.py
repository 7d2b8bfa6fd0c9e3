"""The multi-node part of the lab report: per scenario, what the fault did to the job (each
rank's own step times before / during / after the fault), what each node's agent said (its
windows, in seconds after the job's first step), and the lab's score (`lab.score`) of the
culprit node's expected cause as its own agent said it; the job-level reading (victims
`straggler`, naming the culprit) is scored by lab/multinode/culprit.py."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from lab import score
from lab.multinode.scenario import Plan


def read_steps(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def step_times(steps: list[dict[str, Any]], t0: float, lo: float, hi: float) -> list[float]:
    """Step durations (data wait + rest) of the steps that ended in [t0+lo, t0+hi)."""
    return [s["data_wait_s"] + s["rest_s"] for s in steps if lo <= s["t"] - t0 < hi]


def phases(run: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(name, from, to) in seconds after the first step: before, during and after the faults."""
    applied = [e["at_s"] for e in run["events"] if e["event"] == "fault apply"]
    lifted = [e["at_s"] for e in run["events"] if e["event"] == "fault lift"]
    if not applied:
        return [("whole run", 0.0, float("inf"))]
    start, stop = min(applied), max(lifted) if lifted else float("inf")
    out = [("before", 0.0, start), ("fault", start, stop)]
    if stop != float("inf"):
        out.append(("after", stop, float("inf")))
    return out


def node_runs(results: Path, run: dict[str, Any]) -> list[score.NodeRun]:
    """Every node's windows and steps in the scorer's terms (seconds after the first step)."""
    t0, said_at = run["t0"], run.get("collected_at", 0.0)
    out = []
    for n, said in zip(run["nodes"], run.get("windows", []), strict=False):
        ws = [*said.get("windows", []), *said.get("open", [])]
        steps = read_steps(results / run["scenario"] / f"node-{n['index']}" / "steps.jsonl")
        out.append(
            score.NodeRun(
                node=n["index"],
                windows=tuple(score.LabWindow.from_json(w, t0, now=said_at) for w in ws),
                steps=tuple(
                    score.Step(s["t"] - t0, s["data_wait_s"] + s["rest_s"], s["rest_s"])
                    for s in steps
                ),
                ran_s=said_at - t0 if said_at else 0.0,
            )
        )
    return out


def score_run(plan: Plan, results: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The lab's score of one run (culprit expectations only), also written as score.json."""
    scored = score.score(plan.scenario, node_runs(results, run), plan.min_window_s).to_json()
    (results / plan.name / "score.json").write_text(json.dumps(scored, indent=1) + "\n")
    return scored


def _mean(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.3f}" if xs else "-"


def scenario_section(results: Path, run: dict[str, Any], scored: dict[str, Any] | None) -> str:
    name, t0 = run["scenario"], run["t0"]
    lines = [f"### {name}", ""]
    if not run.get("ok"):
        lines += [f"Did not complete: {run.get('error', 'unknown error')}", ""]
    faults = [e for e in run["events"] if e["event"].startswith("fault")]
    applied = ", ".join(
        f"{e['event'].split()[1]} {e['kind']} on node {e['node']} at {e['t_rel_s']} s"
        for e in faults
    )
    lines += [
        f"Job {run['job_id']}. Faults as applied (after the first step): {applied or 'none'}.",
        "",
    ]
    ph = phases(run)
    lines += [
        "| node | instance | rank exit | steps | "
        + " | ".join(f"mean step s, {p[0]}" for p in ph)
        + " |",
        "|---|---|---|---|" + "---|" * len(ph),
    ]
    for n in run["nodes"]:
        steps = read_steps(results / name / f"node-{n['index']}" / "steps.jsonl")
        means = [_mean(step_times(steps, t0, lo, hi)) for _, lo, hi in ph]
        lines.append(
            f"| {n['index']} | {n['instance']} | {n['rank_exit']} | {len(steps)} | "
            + " | ".join(means)
            + " |"
        )
    lines += ["", "| node | window (s after first step) | cause | summary |", "|---|---|---|---|"]
    for said in run.get("windows", []):
        ws = [(w, "") for w in said.get("windows", [])] + [
            (w, ", open") for w in said.get("open", [])
        ]
        if not ws:
            lines.append(f"| {said['instance']} | none | | |")
        for w, state in ws:
            end = f"{w['end'] - t0:.0f}" if w.get("end") else "now"
            summary = str((w.get("evidence") or {}).get("summary", "")).replace("|", "/")
            lines.append(
                f"| {said['instance']} | {w['start'] - t0:.0f}..{end}{state} | "
                f"{w.get('cause', '')} | {summary} |"
            )
    if scored is not None:
        for e in scored["expect"]:
            lines.append("")
            lines.append(
                f"Culprit node {e['node']}, expected `{e['cause']}` {e['start_s']:g}-"
                f"{e['stop_s']:g} s: fault bit {e['bit']} (throughput x{e['throughput_ratio']}), "
                f"recall {e['recall']}, detected after {e['detect_s']} s."
            )
        lines.append(f"Healthy time inside a window: {scored['healthy_in_window_ratio']}.")
    return "\n".join(lines) + "\n"


def time_table(runs: list[tuple[dict[str, Any], dict[str, Any] | None]], wall_s: float) -> str:
    """Each scenario's wall time (from the harness's start to its cleanup) and the total: the
    lab's time budget stays visible as scenarios are added."""
    lines = ["| scenario | wall time |", "|---|---|"]
    lines += [f"| {r['scenario']} | {r.get('wall_s', 0):.0f} s |" for r, _ in runs]
    lines.append(f"| **all (wall clock)** | **{wall_s:.0f} s** |")
    return "\n".join(lines) + "\n"


def markdown(
    results: Path,
    runs: list[tuple[dict[str, Any], dict[str, Any] | None]],
    culprits: dict[str, dict[str, Any]] | None = None,
    wall_s: float | None = None,
) -> str:
    head = [
        "## Multi-node on one host",
        "",
        "Each scenario: one DDP (gloo) job, one rank per node, each node a network "
        "namespace with its own agent, tiers and cgroup (docs/lab.md). Step times are the "
        "ranks' own; windows are what each node's agent said (its /api/windows).",
        "",
    ]
    from lab.multinode import culprit

    culprits = culprits or {}
    sections = []
    for r, s in runs:
        text = scenario_section(results, r, s)
        if r["scenario"] in culprits:
            text += "\n".join(culprit.markdown(culprits[r["scenario"]])) + "\n"
        sections.append(text)
    if culprits:
        t = culprit.totals(list(culprits.values()))
        head += [
            f"Culprit over {t['faults']} scored faults: top-1 precision {t['top1_precision']}, "
            f"recall {t['top1_recall']}, culprit's cause right {t['cause_right']}.",
            "",
        ]
    if wall_s is not None:
        sections.append("### Time\n\n" + time_table(runs, wall_s))
    return "\n".join(head) + "\n".join(sections)
