"""The DLIO workload's pure part (lab/workloads/dlio.py) on a real run's files: DLIO's own
output folder and the agent's /metrics of the same run (tests/fixtures/dlio/, 64 steps).
The run itself, DLIO under `gpufeed run` against the real agent, is `make lab`'s
(lab/dlio_check.py); the step-in-flight defect it found has its fast test in
tests/test_inject_torch.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lab.scenario import find
from lab.workloads.dlio import Account, DlioRun, agreement, dlio_account, gpufeed_account

FIXTURES = Path(__file__).parent / "fixtures" / "dlio"
CKPT_BYTES = 99084856  # DLIO's checkpoint folder after that run (4 x (layer + model) files)


def dlio_side(tmp_path: Path) -> Account:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "layer.pt").write_bytes(b"\0" * (CKPT_BYTES - 11817))
    (ckpt / "model.pt").write_bytes(b"\0" * 11817)
    return dlio_account(FIXTURES, ckpt)


def test_both_accounts_of_a_real_run(tmp_path: Path) -> None:
    dlio = dlio_side(tmp_path)
    assert dlio.steps == 64
    assert abs(dlio.compute_seconds - 12.8) < 1e-9
    assert abs(dlio.au_percent - 96.0618) < 1e-3
    assert dlio.checkpoint_bytes == CKPT_BYTES
    ours = gpufeed_account((FIXTURES / "metrics.prom").read_text())
    assert ours.steps == 64 and ours.checkpoint_bytes == CKPT_BYTES  # not the other job's
    assert abs(ours.compute_seconds - 13.0369) < 1e-3
    assert abs(ours.au_percent - 96.79) < 0.01
    checks = agreement(dlio, ours)
    assert [c.ok for c in checks] == [True, True, True, True], checks


def test_each_check_can_fail(tmp_path: Path) -> None:
    dlio = dlio_side(tmp_path)
    ours = gpufeed_account((FIXTURES / "metrics.prom").read_text())
    for bad, failing in (
        (replace(ours, steps=63), "steps"),  # the defect this lab found
        (replace(ours, compute_seconds=12.8 * 1.06), "compute seconds"),
        (replace(ours, au_percent=dlio.au_percent - 2.5), "accelerator utilization %"),
        (replace(ours, checkpoint_bytes=int(CKPT_BYTES * 0.98)), "checkpoint bytes"),
    ):
        assert [c.what for c in agreement(dlio, bad) if not c.ok] == [failing]
    assert not agreement(replace(dlio, checkpoint_bytes=0), replace(ours, checkpoint_bytes=0))[
        3
    ].ok  # no checkpoint written is no agreement


def test_the_scenario_is_a_dlio_run(tmp_path: Path) -> None:
    s = find("dlio-agreement")
    run = DlioRun.of(s)
    assert (run.steps, run.batch_size, run.read_threads) == (64, 4, 2)
    args = run.overrides(tmp_path / "d", tmp_path / "c", tmp_path / "o", generate=False)
    assert "++workload.train.computation_time=0.2" in args
    assert "++workload.checkpoint.steps_between_checkpoints=16" in args
    assert "++workload.workflow.generate_data=False" in args
    gen = run.overrides(tmp_path / "d", tmp_path / "c", tmp_path / "o", generate=True)
    assert not any("checkpoint" in a for a in gen)
