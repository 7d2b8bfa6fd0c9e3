import re
import socket
import subprocess
from pathlib import Path
from typing import Any

from conftest import agent_env, gpufeed_cmd, http_get, isolated_agent_args, wait_for_metrics


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpufeed_cmd(*args), env=agent_env(), capture_output=True, text=True, timeout=60
    )


def test_help_explains_flags_and_collector_switches() -> None:
    out = run("agent", "--help").stdout
    for flag in (
        "--config",
        "--web.listen-address",
        "--path.procfs",
        "--path.sysfs",
        "--path.rootfs",
        "--log.level",
        "--otlp.endpoint",
        "9842",
    ):
        assert flag in out


def test_malformed_config_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("interval_seconds: 1\ntiers:\n  hot: nvme\n")
    res = run("agent", "--config", str(cfg), "--web.listen-address", "127.0.0.1:0")
    assert res.returncode == 2
    assert f"{cfg}: line 3: tiers.hot: expected an absolute path" in res.stderr
    assert "Traceback" not in res.stderr


def test_bad_listen_address_is_rejected() -> None:
    res = run("agent", "--web.listen-address", "localhost")
    assert res.returncode == 2
    assert "expected HOST:PORT" in res.stderr


def test_port_in_use_is_a_clear_error_and_leaves_nothing_behind(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'windows.jsonl'}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run(
            "agent",
            "--config",
            str(cfg),
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--sdk.socket",
            str(state / "sdk.sock"),
            "--record",
            str(state / "trace.om"),
        )
    assert res.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr
    # The SDK socket and the recorder's spool were opened before the bind failed.
    assert sorted(p.name for p in state.iterdir()) == []


def test_unwritable_record_path_is_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = run(
        "agent",
        *isolated_agent_args(("--record", str(blocker / "trace.om")), tmp_path),
    )
    assert res.returncode == 2
    assert f"--record {blocker / 'trace.om'}: " in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "sdk.sock").exists()


def test_every_agent_flag_has_help_text() -> None:
    import argparse

    from gpufeed.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    agent = sub.choices["agent"]
    missing = [
        a.option_strings[0]
        for a in agent._actions
        if a.option_strings and (not a.help or a.help == argparse.SUPPRESS)
    ]
    assert missing == []
    assert "(default: None)" not in agent.format_help()


def test_agent_serves_metrics_and_healthz_and_stops_on_sigterm(run_agent: Any) -> None:
    agent = run_agent()
    body = wait_for_metrics(f"{agent.url}/metrics", agent.proc).decode()
    assert "gpufeed_build_info{" in body
    status, health = http_get(f"{agent.url}/healthz")
    assert status == 200 and health.startswith(b"ok")
    agent.proc.terminate()
    _, err = agent.proc.communicate(timeout=15)
    assert agent.proc.returncode == 0
    # Port 0 asks for any free port; the log names the one the agent got.
    assert f"listening on http://127.0.0.1:{agent.port}/metrics".encode() in err


def test_explicit_nvml_without_a_driver_fails_clearly() -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        import pytest

        pytest.skip("this host has an NVIDIA driver")
    res = run("agent", "--gpu.backend", "nvml", "--web.listen-address", "127.0.0.1:0")
    assert res.returncode == 2
    assert "--gpu.backend=nvml:" in res.stderr and "not found" in res.stderr


def test_simulated_node_is_labelled_on_every_page(run_agent: Any, tmp_path: Path) -> None:
    import json
    import urllib.request

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\n")
    agent = run_agent("--simulate", "--config", str(cfg))
    proc = agent.proc
    body = wait_for_metrics(f"{agent.url}/metrics", proc).decode()
    assert body.startswith("# SIMULATED NODE")
    assert body.count('backend="simulated"') == 8
    assert 'backend="nvml"' not in body
    # The simulated node replaces every real collector: nothing here was read from the host.
    collectors = set(re.findall(r'gpufeed_collector_success\{collector="([a-z_]+)"\}', body))
    assert collectors == {"gpu", "simulated"}
    for path in ("/metrics", "/healthz", "/", "/api/windows"):
        with urllib.request.urlopen(f"{agent.url}{path}", timeout=5) as resp:
            assert resp.headers["X-Gpufeed-Simulated"] == "true", path
            page = resp.read().decode()
        if path == "/":
            assert "SIMULATED NODE" in page
        if path == "/api/windows":
            assert json.loads(page)["simulated"] is True
    proc.terminate()
    _, err = proc.communicate(timeout=15)
    assert b"level=WARNING" in err and b"SIMULATED NODE" in err


def test_non_positive_otlp_interval_is_rejected(tmp_path: Path) -> None:
    otlp = ("--otlp.endpoint", "http://127.0.0.1:1/v1/metrics", "--otlp.interval", "0")
    res = run("agent", *isolated_agent_args(otlp, tmp_path))  # the endpoint is never reached
    assert res.returncode == 2
    assert "--otlp.interval 0: must be positive" in res.stderr
