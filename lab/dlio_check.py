"""DLIO against the real agent: does gpufeed's view agree with DLIO's own summary?

    python -m lab.dlio_check [--out DIR] [--venv .venv-dlio] [SCENARIO]

SCENARIO (default dlio-agreement) is a lab scenario with `workload.kind: dlio`. On
loop-mounted tiers (lab.host.LoopTier) the dataset is generated on the data tier by DLIO
itself (not under gpufeed: that is set-up), then the real agent (lab.agent.Agent: port 0,
the run's tiers, its own SDK socket) watches one training epoch of DLIO run unmodified
under `gpufeed run`, checkpoints to the checkpoint tier. When DLIO has exited and the
job's counters stop moving, the agent's /metrics are compared with DLIO's output
(lab.workloads.dlio.agreement). Writes OUT/dlio/agreement.json and agreement.md.

Every part is undone on exit, also on an error or a signal (agent stopped, tiers
unmounted, loop devices detached, the run directory removed).

Exit status: 0 when all four checks agree, 1 when one does not, 2 when the run could not
be made (the DLIO venv missing, DLIO failing: its last lines are printed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

from lab.agent import Agent
from lab.host import LoopTier
from lab.run import host_problem, signals_raise
from lab.scenario import ScenarioError, find
from lab.workloads.dlio import (
    DLIO_VENV,
    JOB_NAME,
    DlioRun,
    agreement,
    dlio_account,
    dlio_command,
    gpufeed_account,
    markdown,
)

SETTLE_SECONDS = 20.0  # at most this long for the job's last reports to reach the agent


class DlioError(RuntimeError):
    """The run could not be made (one line)."""


def _run(argv: list[str], what: str, timeout_s: float, cwd: Path) -> None:
    """`cwd`: the run directory, where DLIO's hydra writes its logs (not the checkout)."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    if out.returncode != 0:
        tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-5:])
        raise DlioError(f"{what} exited with {out.returncode}: {tail}")


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text: str = r.read().decode()
    return text


def check(scenario: str, out_root: Path, venv: Path) -> int:
    s = find(scenario)
    run = DlioRun.of(s)
    dlio = dlio_command(venv)
    if not dlio.exists():
        raise DlioError(f"{dlio} not found: make dlio-venv")
    base = Path(tempfile.mkdtemp(prefix="gpufeed-dlio-"))
    tiers = {t.name: LoopTier(t.name, base, t.size_mib) for t in s.tiers}
    agent: Agent | None = None
    try:
        for t in tiers.values():
            t.open()
        data = tiers[s.workload.data_tier].mnt / "data"
        ckpt = tiers[s.workload.checkpoint.tier].mnt / "checkpoints"
        output = base / "dlio-output"
        print(f"DLIO: generating {run.files} files on the {s.workload.data_tier} tier", flush=True)
        _run([str(dlio), *run.overrides(data, ckpt, base / "gen-output", True)], "DLIO", 600, base)
        agent = Agent(base, tiers, "dlio-lab")
        agent.start([])
        print(f"DLIO: training {run.steps} steps under gpufeed run", flush=True)
        gpufeed_run = [sys.executable, "-m", "gpufeed", "run", "--socket", str(agent.socket)]
        gpufeed_run += ["--name", JOB_NAME, "--", str(dlio)]
        _run([*gpufeed_run, *run.overrides(data, ckpt, output, False)], "DLIO", s.duration_s, base)
        seen = gpufeed_account(_metrics(agent.url))
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:  # until the job's last reports are in
            time.sleep(2.0)
            now = gpufeed_account(_metrics(agent.url))
            if now == seen and now.steps:
                break
            seen = now
        theirs = dlio_account(output, ckpt)
    finally:
        if agent is not None:
            agent.stop()
        for t in reversed(list(tiers.values())):
            t.close()
        subprocess.run(["rm", "-rf", str(base)], capture_output=True)
    checks = agreement(theirs, seen)
    out = out_root / "dlio"
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "scenario": s.name,
        "dlio": asdict(theirs),
        "gpufeed": asdict(seen),
        "checks": [asdict(c) for c in checks],
    }
    (out / "agreement.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "agreement.md").write_text(markdown(checks))
    print(markdown(checks), flush=True)
    return 0 if all(c.ok for c in checks) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.dlio_check", description=__doc__)
    ap.add_argument("scenario", nargs="?", default="dlio-agreement")
    ap.add_argument("--out", type=Path, default=Path("lab-results"))
    ap.add_argument("--venv", type=Path, default=DLIO_VENV)
    args = ap.parse_args(argv)
    problem = host_problem()
    if problem is not None:
        print(f"lab.dlio_check: {problem}", file=sys.stderr)
        return 2
    try:
        with signals_raise():
            return check(args.scenario, args.out, args.venv.resolve())
    except (DlioError, ScenarioError, subprocess.TimeoutExpired, RuntimeError) as exc:
        print(f"lab.dlio_check: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
