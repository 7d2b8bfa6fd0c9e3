"""The timeline picture of a multi-node run: one row per node with its rank's step rate
against its rate before the first fault (a CPU-only gloo rank's collective wait lies inside
its compute time, so its compute share would not show the stall), the faults shaded, and the job-level windows as a band
coloured by cause; a `straggler` window is labelled with the node it names (the culprit)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from lab import score
from lab.report import BIN_SECONDS, cause_colour


def timeline_png(
    run: dict[str, Any],
    runs: list[score.NodeRun],
    windows: list[dict[str, Any]],
    duration_s: float,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = run["t0"]
    index = {n["instance"]: n["index"] for n in run["nodes"]}
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.0 + 1.6 * len(runs)), sharex=True)
    axes = axes if len(runs) > 1 else [axes]
    applied = [e for e in run["events"] if e["event"] == "fault apply"]
    lifted = {
        (e["kind"], e["node"]): e["t_rel_s"] for e in run["events"] if e["event"] == "fault lift"
    }
    causes: set[str] = set()
    for ax, r in zip(axes, sorted(runs, key=lambda r: r.node), strict=True):
        for e in applied:
            stop = lifted.get((e["kind"], e["node"]), duration_s)
            ax.axvspan(e["t_rel_s"], stop, color="0.88", zorder=0)
            if e["node"] == r.node:
                ax.text(e["t_rel_s"] + 0.5, 1.3, f"{e['kind']} here", fontsize=7, va="top")
        xs, ys = step_rate(r.steps, duration_s, min((e["t_rel_s"] for e in applied), default=0))
        ax.plot(xs, ys, color="black", linewidth=1)
        for w in windows:
            if index.get(w.get("instance", "")) != r.node:
                continue
            a, b = float(w["start"]) - t0, float(w["end"]) - t0
            causes.add(str(w["cause"]))
            ax.axvspan(a, b, ymin=0.8, ymax=0.9, color=cause_colour(str(w["cause"])))
            c = (w.get("evidence") or {}).get("culprit") or w.get("culprit")
            if isinstance(c, dict) and c.get("instance"):
                who = index.get(c["instance"], c["instance"])
                ax.text(a + 0.5, 0.98, f"names node {who} ({c.get('cause', '?')})", fontsize=7)
        ax.set_ylim(0, 1.35)
        ax.set_yticks([0, 0.5, 1.0])
        ax.set_ylabel(f"node {r.node}", fontsize=8)
    axes[-1].set_xlim(0, duration_s)
    axes[-1].set_xlabel("seconds after the job's first step")
    axes[0].set_title(
        f"{run['scenario']}: step rate per rank / before the fault, job-level windows (band)",
        fontsize=9,
    )
    handles = [Patch(color=cause_colour(c), label=c) for c in sorted(causes)]
    handles.append(Patch(color="0.88", label="fault"))
    axes[-1].legend(handles=handles, fontsize=7, loc="lower right", ncol=len(handles))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def step_rate(
    steps: tuple[score.Step, ...], until: float, healthy_until: float
) -> tuple[list[float], list[float]]:
    """(bin centres, steps per bin / the median bin before `healthy_until`)."""
    n = max(1, int(until // BIN_SECONDS) + 1)
    count = [0] * n
    for st in steps:
        i = int(st.end_s // BIN_SECONDS)
        if 0 <= i < n:
            count[i] += 1
    before = [c for i, c in enumerate(count) if (i + 1) * BIN_SECONDS <= healthy_until]
    base = statistics.median(before) if before else max(count)
    xs = [(i + 0.5) * BIN_SECONDS for i in range(n)]
    return xs, [min(c / base, 1.25) if base else 0.0 for c in count]
