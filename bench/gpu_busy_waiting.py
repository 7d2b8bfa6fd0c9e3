"""Busy is not working, on a real GPU (issue 13): does gpufeed see a GPU that NVML calls
busy while it does almost nothing?

A collective kernel that spins while it waits for a slow peer keeps NVML utilization at
1.0. On Hopper and newer the agent also reads SM activity (GPM), and the correlator judges
it against the GPU's own healthy level (correlator/engine/engine.py `_working_ratio`). This
check runs the real thing: the agent on NVML (port 0, state in a temporary directory,
recording its trace), and under `gpufeed run` an unmodified PyTorch job
(bench/gpu_busy_job.py) that trains with dense matrix products (healthy), then with one
spin kernel per step (waiting: utilization 1.0, SM activity ~0.01).

Verdicts (one line each, PASS/FAIL): the healthy phase holds no window (<= 5% of it); the
waiting phase is inside a window for >= 50% of its time, and not called startup or idle
(the job has computed for minutes); judged on the live agent's windows log (what the agent
said at the time) and on `gpufeed analyze` over the recorded trace (what this code says).

Usage: python -m bench.gpu_busy_waiting --out DIR        (a GPU host with CUDA PyTorch)
       python -m bench.gpu_busy_waiting --replay DIR     (judge a recording again, no GPU)
Writes into DIR: trace.om (the agent's recording), windows.jsonl (live), phases.json,
agent.log, job.log, verdict.txt. Exit: 0 all PASS, 1 a FAIL, 2 this host cannot run it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HEALTHY_MAX_SHARE = 0.05
WAITING_MIN_SHARE = 0.5


def overlap_s(windows: list[dict[str, Any]], span: tuple[float, float]) -> float:
    """Seconds of `span` inside any window (windows of one GPU do not overlap)."""
    a, b = span
    return sum(max(0.0, min(b, float(w["end"])) - max(a, float(w["start"]))) for w in windows)


def judge(source: str, windows: list[dict[str, Any]], phases: dict[str, list[float]]) -> list[str]:
    # the check's own agent watches one host: every GPU window is about this job (whose id
    # on the GPU is its process group's: it never talks to the SDK, having no DataLoader)
    mine = [w for w in windows if w.get("gpu")]
    healthy = (phases["healthy"][0], phases["healthy"][1])
    waiting = (phases["waiting"][0], phases["waiting"][1])
    h_share = overlap_s(mine, healthy) / (healthy[1] - healthy[0])
    w_share = overlap_s(mine, waiting) / (waiting[1] - waiting[0])
    inside = [w for w in mine if float(w["end"]) > waiting[0] and float(w["start"]) < waiting[1]]
    causes = sorted({str(w.get("cause")) for w in inside})
    lines = [
        f"{'PASS' if h_share <= HEALTHY_MAX_SHARE else 'FAIL'} {source}: healthy phase "
        f"{healthy[1] - healthy[0]:.0f} s, {h_share:.1%} inside a window "
        f"(<= {HEALTHY_MAX_SHARE:.0%})",
        f"{'PASS' if w_share >= WAITING_MIN_SHARE else 'FAIL'} {source}: waiting phase "
        f"{waiting[1] - waiting[0]:.0f} s, {w_share:.1%} inside a window "
        f"(>= {WAITING_MIN_SHARE:.0%}); causes {', '.join(causes) or 'none'}",
    ]
    # the job has computed for minutes: whatever it waits for, it is not starting up or idle
    wrong = sorted(set(causes) & {"startup", "idle"})
    lines.append(
        f"{'FAIL' if wrong else 'PASS'} {source}: the waiting phase's cause is "
        f"{'wrongly ' + ', '.join(wrong) if wrong else 'neither startup nor idle'}"
    )
    for w in inside:
        opened = float(w["start"]) - waiting[0]
        lines.append(
            f"INFO {source}: window {opened:+.0f} s from the waiting phase's start, "
            f"{float(w['end']) - float(w['start']):.0f} s, cause {w.get('cause')}, "
            f"mean utilization {w.get('mean_utilization')}, summary: {summary_of(w)}"
        )
    return lines


def summary_of(w: dict[str, Any]) -> str:
    ev = w.get("evidence")
    return str(w.get("summary") or (ev.get("summary", "") if isinstance(ev, dict) else ""))


def analyze(trace: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "gpufeed", "analyze", str(trace)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"gpufeed analyze {trace} failed: {out.stderr.strip()[-400:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def evaluate(out: Path) -> list[str]:
    phases = json.loads((out / "phases.json").read_text())
    lines: list[str] = []
    if (out / "windows.jsonl").exists():
        lines += judge("live", read_jsonl(out / "windows.jsonl"), phases)
    lines += judge("analyze", analyze(out / "trace.om"), phases)
    return lines


def run(out: Path, healthy_s: float, waiting_s: float) -> int:
    from lab.agent import Agent

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpufeed-busy-") as tmp:
        agent = Agent(Path(tmp), {}, f"busy-waiting-{os.getpid()}")
        agent.start([], record=out / "trace.om")
        try:
            argv = [sys.executable, "-m", "gpufeed", "run", "--socket", str(agent.socket), "--"]
            argv += [sys.executable, str(HERE / "gpu_busy_job.py")]
            argv += ["--healthy-s", f"{healthy_s:g}", "--waiting-s", f"{waiting_s:g}"]
            argv += ["--phases", str(out / "phases.json")]
            with open(out / "job.log", "wb") as log:
                rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
            time.sleep(5)  # the agent's last samples after the job
        finally:
            agent.stop()  # logs the windows still open
            (out / "windows.jsonl").write_text(
                "".join(json.dumps(w) + "\n" for w in agent.logged_windows())
            )
            log_file = Path(tmp) / "agent.log"
            if log_file.exists():
                (out / "agent.log").write_bytes(log_file.read_bytes())
    if rc != 0:
        print(f"gpu_busy_waiting: the job exited with {rc}; see {out / 'job.log'}")
        return 1
    return report(out)


def report(out: Path) -> int:
    lines = evaluate(out)
    text = "\n".join(lines) + "\n"
    (out / "verdict.txt").write_text(text)
    print(text, end="")
    return 1 if any(x.startswith("FAIL") for x in lines) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_busy_waiting", description=__doc__)
    ap.add_argument("--out", type=Path, help="results directory (a run on this GPU host)")
    ap.add_argument("--replay", type=Path, help="judge the recording in this directory again")
    ap.add_argument("--healthy-s", type=float, default=150.0)
    ap.add_argument("--waiting-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    if args.replay:
        return report(args.replay)
    if args.out is None:
        ap.error("--out DIR is required (or --replay DIR)")
    try:
        import torch
    except ImportError:
        print("gpu_busy_waiting: needs PyTorch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_busy_waiting: PyTorch sees no CUDA GPU", file=sys.stderr)
        return 2
    return run(args.out, args.healthy_s, args.waiting_s)


if __name__ == "__main__":
    sys.exit(main())
