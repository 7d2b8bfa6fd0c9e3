"""DLIO (MLPerf Storage's `dlio_benchmark`) as a lab workload nobody here wrote.

DLIO runs unmodified under `gpufeed run` from its own virtual environment (`.venv-dlio`,
`make dlio-venv`: torch==2.13.0 CPU first, then DLIO without its dependency list, see
lab/dlio-requirements.txt for why). Its PyTorch path reads the dataset through a
DataLoader with persistent workers, stands in for the accelerator with a sleep of
`computation_time` per step and checkpoints with torch.save, so what gpufeed sees is what
any PyTorch job under `gpufeed run` shows.

This module is the pure part: the DLIO command line for a scenario, DLIO's own account of
the run (its output folder), gpufeed's account (the agent's /metrics for the job) and the
agreement between them. lab/dlio_check.py runs it against the real agent.

What is compared, and how each side counts it:
- steps: DLIO's per-step records (`0_output.json`: one `compute` entry per step) against
  `gpufeed_job_steps_total`: exactly equal;
- compute: the sum of DLIO's `computation_time` per step against gpufeed's `compute`
  phase, which also holds DLIO's per-step bookkeeping (its logging, an MPI barrier):
  within 5%;
- accelerator utilization: DLIO's `train_au_mean_percentage` (compute over the time of
  the steps, the first step of each block left out) against gpufeed's compute share of
  the time of the steps, compute / (compute + data_wait) (the first batch's wait is
  start-up, docs/jobs.md): within 2 points;
- checkpoint bytes: the bytes of DLIO's checkpoint folder against
  `gpufeed_job_checkpoint_written_bytes_total`: within 1%.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from lab.scenario import Scenario

REPO = Path(__file__).resolve().parents[2]
DLIO_VENV = REPO / ".venv-dlio"
JOB_NAME = "dlio"

COMPUTE_TOLERANCE_RATIO = 0.05
AU_TOLERANCE_POINTS = 2.0
CHECKPOINT_TOLERANCE_RATIO = 0.01


def dlio_command(venv: Path = DLIO_VENV) -> Path:
    return venv / "bin" / "dlio_benchmark"


@dataclass(frozen=True, slots=True)
class DlioRun:
    """One DLIO run's settings, from a scenario's `workload` (kind: dlio)."""

    files: int
    record_bytes: int
    batch_size: int
    read_threads: int
    computation_time_seconds: float
    checkpoint_every_steps: int  # 0: none

    @property
    def steps(self) -> int:
        return self.files // self.batch_size

    @staticmethod
    def of(s: Scenario) -> DlioRun:
        w = s.workload
        if w.kind != "dlio":
            raise ValueError(f"{s.name}: workload.kind is {w.kind!r}, not dlio")
        extra = dict(w.extra)
        return DlioRun(
            files=w.samples,
            record_bytes=w.sample_kib * 1024,
            batch_size=w.batch_size,
            read_threads=w.num_workers,
            computation_time_seconds=float(extra.get("computation_time_s", 0.2)),
            checkpoint_every_steps=w.checkpoint.every_steps,
        )

    def overrides(self, data: Path, checkpoints: Path, output: Path, generate: bool) -> list[str]:
        """DLIO's hydra overrides: generate the dataset, or train one epoch on it."""
        w = "++workload."
        out = [
            "workload=default",
            f"{w}framework=pytorch",
            f"{w}reader.data_loader=pytorch",
            f"{w}dataset.data_folder={data}",
            f"{w}dataset.format=npz",
            f"{w}dataset.num_files_train={self.files}",
            f"{w}dataset.num_samples_per_file=1",
            f"{w}dataset.record_length={self.record_bytes}",
            f"{w}dataset.num_subfolders_train=0",
            f"{w}dataset.num_files_eval=0",
            f"{w}dataset.num_subfolders_eval=0",
            f"{w}reader.batch_size={self.batch_size}",
            f"{w}reader.read_threads={self.read_threads}",
            f"{w}train.epochs=1",
            f"{w}train.computation_time={self.computation_time_seconds}",
            f"{w}workflow.evaluation=False",
            f"{w}workflow.generate_data={generate}",
            f"{w}workflow.train={not generate}",
            f"{w}output.folder={output}",
        ]
        if not generate and self.checkpoint_every_steps:
            out += [
                f"{w}workflow.checkpoint=True",
                f"{w}checkpoint.checkpoint_folder={checkpoints}",
                f"{w}checkpoint.steps_between_checkpoints={self.checkpoint_every_steps}",
            ]
        return out


@dataclass(frozen=True, slots=True)
class Account:
    """One side's account of the run."""

    steps: int
    compute_seconds: float
    au_percent: float
    checkpoint_bytes: int


def dlio_account(output: Path, checkpoints: Path) -> Account:
    """DLIO's own numbers: its per-step records, its summary's AU, its checkpoint files."""
    summary = json.loads((output / "summary.json").read_text())
    per_rank = json.loads((output / "0_output.json").read_text())
    compute: list[float] = []
    for key, epoch in per_rank.items():
        if key.isdigit():
            for values in epoch["compute"].values():
                compute += values
    return Account(
        steps=len(compute),
        compute_seconds=sum(compute),
        au_percent=float(summary["metric"]["train_au_mean_percentage"]),
        checkpoint_bytes=tree_bytes(checkpoints),
    )


def tree_bytes(root: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def gpufeed_account(metrics: str, name: str = JOB_NAME) -> Account:
    """The agent's numbers for the job called `name` (its one job_id)."""
    phases: dict[str, float] = {}
    steps = 0.0
    checkpoint = 0.0
    for fam in text_string_to_metric_families(metrics):
        for s in fam.samples:
            if s.labels.get("name") != name:
                continue
            if s.name == "gpufeed_job_phase_seconds_total":
                phases[s.labels["phase"]] = s.value
            elif s.name == "gpufeed_job_steps_total":
                steps = s.value
            elif s.name == "gpufeed_job_checkpoint_written_bytes_total":
                checkpoint = s.value
    compute = phases.get("compute", 0.0)
    busy = compute + phases.get("data_wait", 0.0)
    return Account(
        steps=int(steps),
        compute_seconds=compute,
        au_percent=100.0 * compute / busy if busy > 0 else 0.0,
        checkpoint_bytes=int(checkpoint),
    )


@dataclass(frozen=True, slots=True)
class Check:
    what: str
    dlio: float
    gpufeed: float
    target: str
    ok: bool


def agreement(dlio: Account, gpufeed: Account) -> list[Check]:
    """The four checks against the issue's targets."""

    def rel(a: float, b: float) -> float:
        return abs(b - a) / a if a else (0.0 if a == b else float("inf"))

    return [
        Check("steps", dlio.steps, gpufeed.steps, "exactly", dlio.steps == gpufeed.steps),
        Check(
            "compute seconds",
            dlio.compute_seconds,
            gpufeed.compute_seconds,
            f"within {COMPUTE_TOLERANCE_RATIO:.0%}",
            rel(dlio.compute_seconds, gpufeed.compute_seconds) <= COMPUTE_TOLERANCE_RATIO,
        ),
        Check(
            "accelerator utilization %",
            dlio.au_percent,
            gpufeed.au_percent,
            f"within {AU_TOLERANCE_POINTS:g} points",
            abs(dlio.au_percent - gpufeed.au_percent) <= AU_TOLERANCE_POINTS,
        ),
        Check(
            "checkpoint bytes",
            dlio.checkpoint_bytes,
            gpufeed.checkpoint_bytes,
            f"within {CHECKPOINT_TOLERANCE_RATIO:.0%}",
            dlio.checkpoint_bytes > 0
            and rel(dlio.checkpoint_bytes, gpufeed.checkpoint_bytes) <= CHECKPOINT_TOLERANCE_RATIO,
        ),
    ]


def markdown(checks: list[Check]) -> str:
    rows = [
        "| check | DLIO | gpufeed | target | agrees |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        rows.append(
            f"| {c.what} | {c.dlio:.6g} | {c.gpufeed:.6g} | {c.target} | {'yes' if c.ok else 'NO'} |"
        )
    return "\n".join(rows) + "\n"
