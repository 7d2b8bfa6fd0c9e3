"""Config files that are not UTF-8 or use YAML 1.2 numbers, long SDK socket paths, and
SIGHUP/SIGUSR1 sent to a real agent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd, wait_for_metrics
from gpufeed.config import ConfigError, load_config, parse_config
from gpufeed.jobs.sdk_server import MAX_SOCKET_PATH_BYTES, SdkServer
from procports import wait_listening


def test_a_config_that_is_not_utf8_is_one_line_naming_the_line(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_bytes(b"interval_seconds: 1\n# caf\xe9\n")
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    assert str(exc.value) == f"{cfg}: line 2: not UTF-8 text (byte 0xe9)"
    res = subprocess.run(
        gpufeed_cmd("agent", "--config", str(cfg)),
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == f"gpufeed agent: error: {cfg}: line 2: not UTF-8 text (byte 0xe9)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("interval_seconds: 1e1", 10.0),
        ("interval_seconds: 5E-1", 0.5),
        ("interval_seconds: 1e308", "interval_seconds: must be between 0.05 and 3600"),
        ("interval_seconds: 1e999", "interval_seconds: expected a finite number, got '1e999'"),
        ("interval_seconds: .nan", "interval_seconds: expected a finite number, got '.nan'"),
        ("interval_seconds: '1e1'", "interval_seconds: expected a number, got '1e1'"),
    ],
)
def test_numbers_are_read_as_yaml_1_2_writes_them(text: str, expected: float | str) -> None:
    if isinstance(expected, float):
        assert parse_config(text).interval_seconds == expected
        return
    with pytest.raises(ConfigError) as exc:
        parse_config(text)
    assert str(exc.value) == f"<config>: line 1: {expected}"


def _server(path: str) -> SdkServer:
    return SdkServer(path, max_jobs=4, max_messages_per_second=100, grace_seconds=10)


def test_the_longest_legal_socket_path_is_accepted(tmp_path: Path) -> None:
    base = str(tmp_path) + "/"
    for length in (99, MAX_SOCKET_PATH_BYTES):
        d = base + "d" * (length - len(base) - len("/sdk.sock"))
        os.makedirs(d, exist_ok=True)
        path = d + "/sdk.sock"
        assert len(path) == length
        server = _server(path)
        server.start()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as c:
                c.sendto(b"x", path)  # a client reaches it under its real name
            assert sorted(os.listdir(d)) == ["sdk.sock"]  # no temporary name left
        finally:
            server.stop()
    too_long = base + "e" * (MAX_SOCKET_PATH_BYTES + 1 - len(base))
    with pytest.raises(OSError, match=r"allow 107"):
        _server(too_long).start()


class _Agent:
    """A real agent whose stderr is collected line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            gpufeed_cmd("agent", *args), env=agent_env(), stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if text in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} in {''.join(self.lines)}")


def test_sighup_and_sigusr1_are_answered_and_the_agent_keeps_serving(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"interval_seconds: 0.5\ncorrelator:\n  windows_log: {tmp_path / 'w.jsonl'}\n")
    sock, trace = tmp_path / "sdk.sock", tmp_path / "trace.om"
    agent = _Agent(
        "--config",
        str(cfg),
        "--web.listen-address",
        "127.0.0.1:0",
        "--sdk.socket",
        str(sock),
        "--record",
        str(trace),
    )
    try:
        # Port 0 and the port read from the agent's own sockets: a port bound, closed and
        # handed to the agent could be taken by a concurrent test run in between.
        port = wait_listening(agent.proc)
        wait_for_metrics(f"http://127.0.0.1:{port}/metrics", agent.proc)
        agent.proc.send_signal(signal.SIGHUP)
        agent.wait_for("SIGHUP: " + str(cfg) + " is unchanged")
        cfg.write_text("interval_seconds: 2\n")
        agent.proc.send_signal(signal.SIGHUP)
        assert "restart the agent to apply it" in agent.wait_for("changed and is valid")
        cfg.write_text("interval_seconds: fast\n")
        agent.proc.send_signal(signal.SIGHUP)
        agent.wait_for("the config file is invalid; the agent keeps running as it is")
        agent.proc.send_signal(signal.SIGUSR1)
        line = agent.wait_for("SIGUSR1: up")
        assert "last sample" in line and "write_errors_total=0" in line
        assert agent.proc.poll() is None
        wait_for_metrics(f"http://127.0.0.1:{port}/metrics", agent.proc)
        assert sock.exists()
    finally:
        agent.proc.terminate()
        assert agent.proc.wait(30) == 0
    assert not sock.exists()  # the SDK socket and the spool are gone, the trace finished
    assert not list(tmp_path.glob("trace.om.spool*"))
    assert trace.read_text().endswith("# EOF\n")
