"""The lab's report: report.json (every run's score), report.md (a table per run and the
targets), and one timeline PNG per run, because that is what a person looks at first:
the workload's compute share (the utilization stand-in, on its own clock), the agent's
windows coloured by cause, the faults as grey bands and the expected causes under them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.score import (
    TARGET_DETECT_SECONDS,
    TARGET_HEALTHY_IN_WINDOW,
    TARGET_RECALL,
    ScenarioScore,
    Step,
    score,
)

if TYPE_CHECKING:
    from lab.run import RunResult

# Grafana's colour names (dashboards/presets.CAUSE_COLOURS, one colour per cause
# everywhere) in matplotlib's words.
_MPL = {
    "text": "grey",
    "dark-red": "darkred",
    "dark-orange": "darkorange",
    "light-blue": "lightblue",
    "yellow": "gold",
}
BIN_SECONDS = 5.0


def cause_colour(cause: str) -> str:
    from dashboards.presets import CAUSE_COLOURS

    c = CAUSE_COLOURS.get(cause, "black")
    return _MPL.get(c, c)


def compute_share(steps: Sequence[Step], until: float) -> tuple[list[float], list[float]]:
    """(bin centres, compute share per bin): the stand-in for utilization, on the job's
    own clock; a bin with no step ending in it is 0 (the job made no progress)."""
    n = max(1, int(until // BIN_SECONDS) + 1)
    busy = [0.0] * n
    total = [0.0] * n
    for st in steps:
        i = int(st.end_s // BIN_SECONDS)
        if 0 <= i < n:
            busy[i] += st.compute_s
            total[i] += st.seconds
    xs = [(i + 0.5) * BIN_SECONDS for i in range(n)]
    return xs, [b / t if t > 0 else 0.0 for b, t in zip(busy, total, strict=True)]


def timeline_png(r: RunResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    s = r.scenario
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for f in s.faults:
        ax.axvspan(f.start_s, f.stop_s, ymin=0, ymax=1, color="0.88", zorder=0)
        ax.text(f.start_s + 1, 1.32, f.kind, fontsize=7, va="top")
    for e in s.expect:
        ax.axvspan(e.start_s, e.stop_s, ymin=0.0, ymax=0.05, color=cause_colour(e.cause.value))
    for w in r.run.windows:
        ax.axvspan(w.start_s, w.end_s, ymin=0.83, ymax=0.9, color=cause_colour(w.cause))
    xs, ys = compute_share(r.run.steps, s.duration_s)
    ax.plot(xs, ys, color="black", linewidth=1)
    ax.axhline(0.8, color="black", linestyle=":", linewidth=0.8)
    ax.set_xlim(0, s.duration_s)
    ax.set_ylim(0, 1.35)
    ax.set_yticks([0, 0.4, 0.8, 1.0])
    ax.set_xlabel("seconds from the scenario's start")
    ax.set_ylabel("compute share")
    host = f"; the host's other work: {', '.join(b.kind for b in s.background)}"
    ax.set_title(
        f"{s.name} ({r.launcher}): windows (upper band), expected (bottom band)"
        + (host if s.background else ""),
        fontsize=9,
    )
    causes = sorted({w.cause for w in r.run.windows} | {e.cause.value for e in s.expect})
    handles = [Patch(color=cause_colour(c), label=c) for c in causes]
    handles.append(Patch(color="0.88", label="fault"))
    ax.legend(handles=handles, fontsize=7, loc="lower right", ncol=len(handles))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _run_md(r: RunResult, sc: ScenarioScore, png: str) -> list[str]:
    j = sc.to_json()
    lines = [
        f"### {r.scenario.name} ({r.launcher})",
        "",
        f"{r.scenario.description}. Targets {'MET' if sc.passed() else 'MISSED'}; healthy time "
        f"inside a window {_pct(sc.healthy_in_window)} of {sc.healthy_s:.0f} s; "
        f"workload exit {r.workload_rc}; windows of other units {r.other_windows}; "
        f"wall time {_timing(r)}.",
        "",
        f"![{r.scenario.name} {r.launcher}]({png})",
        "",
        "| interval | expected | bit (throughput) | named for | detected after | said instead | evidence |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in j["expect"]:
        other = {k: v for k, v in e["caused_as"].items() if k != e["cause"]}
        ev = "; ".join(
            f"{k}={v['want']}: evidence {_pct(v['in_evidence'])}, summary {_pct(v['in_summary'])}"
            + (f" (said {', '.join(v['said'])})" if v["said"] else "")
            for k, v in e["evidence"].items()
        )
        det = (
            "-"
            if e["detect_s"] is None
            else f"{e['detect_s']:.0f} s" + ("*" if e["detect_estimated"] else "")
        )
        lines.append(
            f"| {e['start_s']:g}-{e['stop_s']:g} s | {e['cause']} | "
            f"{'yes' if e['bit'] else 'NO'} ({_pct(e['throughput_ratio'])}) | "
            f"{_pct(e['recall'])} | {det} | "
            f"{', '.join(f'{k} {v:.0f} s' for k, v in other.items()) or '-'} | {ev or '-'} |"
        )
    lines += ["", "| cause | precision | recall | F1 |", "|---|---|---|---|"]
    for c, v in j["causes"].items():
        lines.append(f"| {c} | {_pct(v['precision'])} | {_pct(v['recall'])} | {_pct(v['f1'])} |")
    return [*lines, ""]


def _timing(r: RunResult) -> str:
    t = r.timing
    return (
        f"{t.total_s:.0f} s (setup {t.setup_s:.0f} s, scenario and tail {t.scenario_s:.0f} s, "
        f"teardown {t.teardown_s:.0f} s)"
    )


def _time_md(results: Sequence[RunResult], wall_s: float | None) -> list[str]:
    """The lab's time budget, per run and in all: what a new scenario costs stays visible."""
    lines = [
        "## Time",
        "",
        "Runs of one scenario under both launchers run at the same time (lab.run), and "
        "with --jobs N scenarios run in N lanes side by side, so the total is less than "
        "the sum.",
        "",
        "| run | setup | scenario + tail | teardown | total |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        t = r.timing
        lines.append(
            f"| {r.scenario.name} ({r.launcher}) | {t.setup_s:.0f} s | {t.scenario_s:.0f} s | "
            f"{t.teardown_s:.0f} s | {t.total_s:.0f} s |"
        )
    if wall_s is not None:
        lines.append(f"| **all (wall clock)** | | | | **{wall_s:.0f} s** |")
    return [*lines, ""]


def write_report(results: Sequence[RunResult], out: Path, wall_s: float | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    md = [
        "# gpufeed fault lab report",
        "",
        f"Targets: each cause named for >= {TARGET_RECALL:.0%} of its fault time, the right "
        f"cause within {TARGET_DETECT_SECONDS:g} s of onset, <= {TARGET_HEALTHY_IN_WINDOW:.0%} "
        "of healthy time inside a window. A fault that did not slow the workload (its "
        "throughput > 80% of healthy) is reported, not scored. `*`: detection time estimated "
        "from the window's start (no live sighting).",
        "",
    ]
    for r in results:
        sc = score(r.scenario, [r.run])
        png = f"{r.scenario.name}-{r.launcher}.png"
        try:
            timeline_png(r, out / png)
        except ImportError as exc:  # the report still says everything in words
            png = f"(no picture: {exc})"
        (r.out_dir / "score.json").write_text(json.dumps(sc.to_json(), indent=1))
        t = r.timing
        timing = {"setup_s": t.setup_s, "scenario_s": t.scenario_s, "teardown_s": t.teardown_s}
        runs.append({"launcher": r.launcher, "job_id": r.job_id, "timing": timing, **sc.to_json()})
        md += _run_md(r, sc, png)
    md += _time_md(results, wall_s)
    (out / "report.json").write_text(json.dumps({"runs": runs, "wall_s": wall_s}, indent=1))
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path
