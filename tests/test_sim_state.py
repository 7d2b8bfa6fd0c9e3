"""A simulated node never writes where a real agent keeps its state (issue 9, defect 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd
from gpufeed.agent.command import build_parts, close_parts
from gpufeed.cli import build_parser
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.statepaths import is_production_path


def _correlator(parts: object) -> CorrelatorProcessor:
    return next(p for p in parts.processors if isinstance(p, CorrelatorProcessor))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "flags",
    [
        ["--simulate"],
        ["--gpu.backend", "simulated", "--sdk.socket", "/run/gpufeed/sdk.sock"],
    ],
)
def test_a_simulated_node_keeps_its_state_in_a_directory_of_its_own(
    flags: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # read TMPDIR again
    try:
        args = build_parser().parse_args(
            ["agent", *flags, "--path.procfs", str(tmp_path), "--path.sysfs", str(tmp_path)]
        )
        parts = build_parts(args, 9842)
    finally:
        tempfile.tempdir = None
    try:
        log = _correlator(parts)._log
        assert log is not None and log.simulated
        assert not is_production_path(log.path)
        assert Path(log.path).parent.parent == tmp_path
        assert not is_production_path(parts.config.sdk.socket_path)
        if args.sdk_socket:
            assert not is_production_path(args.sdk_socket)
        run_dir = Path(log.path).parent
    finally:
        close_parts(parts)
    assert not run_dir.exists()  # this run's state goes with it


def test_a_real_agent_still_uses_the_production_default() -> None:
    args = build_parser().parse_args(["agent", "--collector.correlator"])
    from gpufeed.config import load_config
    from gpufeed.statepaths import RunStateDir, simulated_config

    config = load_config(None)
    assert config.correlator.windows_log == "/var/lib/gpufeed/windows.jsonl"
    assert args.simulate is None
    moved = simulated_config(config, RunStateDir())
    assert moved.correlator.windows_log != config.correlator.windows_log
    explicit = config.correlator.__class__(windows_log="/srv/demo/w.jsonl")
    kept = simulated_config(config.__class__(correlator=explicit), RunStateDir())
    assert kept.correlator.windows_log == "/srv/demo/w.jsonl"


def test_two_agents_on_one_log_the_second_says_who_holds_it(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\n")
    cmd = ["agent", "--simulate", "--config", str(cfg), "--web.listen-address"]
    first = subprocess.Popen(
        gpufeed_cmd(*cmd, "127.0.0.1:0"),
        env=agent_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert first.stderr is not None
        for line in first.stderr:
            if b"listening on" in line:
                break
        else:
            raise AssertionError("the first agent did not start")
        res = subprocess.run(
            gpufeed_cmd(*cmd, "127.0.0.1:0"),
            env=agent_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        first.terminate()
        first.wait(15)
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert err[-1] == (
        f"gpufeed agent: error: windows log {tmp_path / 'w.jsonl'} is in use by another "
        f"process (pid {first.pid}); give each agent its own correlator.windows_log"
    )
    assert "Traceback" not in res.stderr


def test_a_real_agent_does_not_serve_the_windows_of_a_simulated_one(tmp_path: Path) -> None:
    """A simulated run wrote into a log (an explicit path); a real agent started on that log
    later shows none of its windows."""
    from gpufeed.config import CorrelatorConfig
    from gpufeed.correlator.outputs.windowlog import WindowLog
    from windowlog_helpers import seq_window

    path = tmp_path / "w.jsonl"
    sim = WindowLog(str(path), simulated=True)
    for i in range(42):
        sim.append(seq_window(i))
    sim.close()
    code = (
        "import json, sys; from gpufeed.config import CorrelatorConfig; "
        "from gpufeed.correlator.feeds.live import CorrelatorProcessor; "
        f"p = CorrelatorProcessor(CorrelatorConfig(windows_log={str(path)!r})); "
        "print(json.dumps([w.job_id for w in p.windows()[0]])); p.close()"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "exporter")}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == []
    assert "simulated: 42" in res.stderr
    assert CorrelatorConfig().windows_log  # the real default is still on
