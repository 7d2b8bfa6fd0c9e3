"""Every gpufeed HTTP service (the agent, the fleet, the scheduler) starts, says where it
listens, refuses bad web flags and stops the same way, through one web layer (gpufeed.web);
the fleet and the scheduler say each failed cycle in one line (issue 26: they had no log
line at all, not even the port they got for port 0, and their own listen-address parsers).

Real processes on ephemeral ports; the fleet reads a TSDB that is not there, the scheduler
runs Slurm clients that are scripts in a temp dir (tests/http_helpers.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd
from http_helpers import ERROR_PREFIX, SERVICES, Agent, get, service_process, wait_until_serving
from procports import wait_listening

WEB_FLAGS = (
    "--web.listen-address",
    "--web.config.file",
    "--web.max-connections",
    "--web.header-timeout",
    "--web.idle-timeout",
)


def _wait_for(what: str, svc: Agent, cond: Callable[[str], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond(svc.log()):
            return
        assert svc.proc.poll() is None, svc.log()
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f} s: {what}\n{svc.log()}")


def _lines(svc: Agent, needle: str) -> list[str]:
    return [ln for ln in svc.log().splitlines() if needle in ln]


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_the_start_line_names_the_port_the_kernel_gave(tmp_path: Path, kind: str) -> None:
    with service_process(kind, tmp_path) as svc:
        wait_until_serving(svc)
        port = wait_listening(svc.proc)  # what the process really listens on
        assert port != 0 and svc.port == port
        (line,) = _lines(svc, "listening on ")
        assert f"listening on http://127.0.0.1:{port}/metrics" in line, line
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(30) == 0, svc.log()
    assert _lines(svc, "shutting down"), svc.log()


@pytest.mark.slow
def test_a_failing_fleet_cycle_is_one_line_not_one_per_retry(tmp_path: Path) -> None:
    with service_process("fleet", tmp_path) as svc:
        _wait_for("a failed cycle is logged", svc, lambda log: "failed, retrying" in log)
        time.sleep(3.5)  # retried after 1 s and 2 s: still the one line
        (line,) = _lines(svc, "failed")
        assert line.startswith("gpufeed fleet: cycle ") and "Connection refused" in line, line
        status, _, body = get(svc.port, "/healthz")
        assert status == 503 and b"failed, retrying" in body


_SDIAG = "Main schedule statistics (microseconds):\n\tLast cycle:   1200\n\tMean cycle:   900\n"


def _slurm_clients(bin_dir: Path, squeue: bytes) -> None:
    """Slurm clients as scripts: `squeue` prints `squeue`, `sinfo` an empty node list,
    `sdiag` a main cycle; each replaced atomically (a read never sees half a script)."""
    bin_dir.mkdir(exist_ok=True)
    outputs = {"squeue": squeue, "sinfo": b'{"nodes": []}', "sdiag": _SDIAG.encode()}
    for name, out in outputs.items():
        data = bin_dir / f"{name}.out"
        data.write_bytes(out)
        staged = bin_dir / f".{name}"
        staged.write_text(f"#!/bin/sh\ncat '{data}'\n")
        staged.chmod(0o755)
        os.replace(staged, bin_dir / name)


@pytest.mark.slow
def test_a_failing_scheduler_read_is_one_line_and_its_recovery_another(tmp_path: Path) -> None:
    """A `squeue` that prints bytes that are not text (an error past the reader's own used
    to end the reading thread: the page of the last read stayed up for good)."""
    bin_dir = tmp_path / "slurm-bin"
    _slurm_clients(bin_dir, b"\xff\xfe\x00 not JSON, not UTF-8")
    args = ("--slurm.bin-dir", str(bin_dir), "--scheduler.interval", "0.3")
    with service_process("scheduler", tmp_path, *args) as svc:
        _wait_for("a failed read is logged", svc, lambda log: "scheduler failed" in log)
        time.sleep(1.5)  # about 5 more failed reads: still the one line
        (line,) = _lines(svc, "scheduler failed")
        assert "scheduler failed: UnicodeDecodeError: " in line, line
        status, _, body = get(svc.port, "/healthz")
        assert status == 503 and b"UnicodeDecodeError" in body
        assert b'gpufeed_scheduler_up{scheduler="slurm"} 0' in get(svc.port)[2]
        _slurm_clients(bin_dir, b'{"jobs": []}')
        _wait_for("the recovery is logged", svc, lambda log: "works again" in log)
        (line,) = _lines(svc, "works again")
        failed = int(line.split("after ")[1].split()[0])
        assert failed >= 5, line
        assert get(svc.port, "/healthz")[0] == 200
        assert b'gpufeed_scheduler_up{scheduler="slurm"} 1' in get(svc.port)[2]
        assert svc.proc.poll() is None


def _exits(kind: str, tmp_path: Path, *args: str) -> tuple[int, list[str], Path]:
    """Exit status and log lines of a service that is expected to stop at start."""
    with service_process(kind, tmp_path, *args) as svc:
        code = svc.proc.wait(30)
        return code, svc.log().strip().splitlines(), svc.log_path.parent


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("localhost", "--web.listen-address 'localhost': expected HOST:PORT"),
        ("127.0.0.1:70000", "--web.listen-address '127.0.0.1:70000': port must be 0..65535"),
        ("127.0.0.1:http", "--web.listen-address '127.0.0.1:http': expected HOST:PORT"),
    ],
)
def test_a_bad_listen_address_is_one_line_and_exit_2(
    tmp_path: Path, kind: str, address: str, message: str
) -> None:
    code, lines, _ = _exits(kind, tmp_path, "--web.listen-address", address)
    assert (code, lines) == (2, [f"{ERROR_PREFIX[kind]}{message}"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", SERVICES)
def test_a_port_in_use_is_one_line_exit_1_and_opens_nothing(tmp_path: Path, kind: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines, home = _exits(kind, tmp_path, "--web.listen-address", f"127.0.0.1:{port}")
    assert code == 1 and len(lines) == 1, (code, lines)
    assert lines[0].startswith(f"{ERROR_PREFIX[kind]}cannot listen on 127.0.0.1:{port}: "), lines
    # bound before anything else is opened: no windows log (fleet), no SDK socket (agent)
    opened = {p.name for p in home.iterdir()} - {f"{kind}.log", "agent.yaml", "bin"}
    assert opened == set(), opened


@pytest.mark.parametrize("kind", SERVICES)
def test_help_names_the_web_flags(kind: str) -> None:
    done = subprocess.run(
        gpufeed_cmd(kind, "--help"), env=agent_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps lines
    for flag in WEB_FLAGS:
        assert flag in text, flag
    assert "exporter-toolkit format (docs/security.md)" in text
    assert "(port 0: any free port, named in the start log line;" in text
