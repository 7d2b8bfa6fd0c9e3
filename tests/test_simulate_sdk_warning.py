"""--simulate replaces the whole node, the SDK socket included: flags and config meant
for the socket are ignored, and the agent says so once at start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpufeed.agent.command import build_parts, close_parts
from gpufeed.cli import build_parser

WARNING = "--simulate: the SDK socket is not opened; --sdk.socket and the sdk: config are ignored"


def _sdk_warnings(caplog: pytest.LogCaptureFixture, *argv: str) -> list[str]:
    args = build_parser().parse_args(["agent", *argv])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpufeed.agent.command"):
        parts = build_parts(args, port=0)
    close_parts(parts)
    return [r.getMessage() for r in caplog.records if "SDK socket" in r.getMessage()]


def test_simulate_says_it_ignores_the_sdk_socket_flag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\n")
    sock = str(tmp_path / "sdk.sock")
    got = _sdk_warnings(caplog, "--simulate", "--config", str(cfg), "--sdk.socket", sock)
    assert got == [WARNING]
    assert [r.levelname for r in caplog.records if r.getMessage() == WARNING] == ["WARNING"]
    assert not Path(sock).exists()


def test_simulate_says_it_ignores_the_sdk_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\nsdk:\n  max_jobs: 8\n")
    assert _sdk_warnings(caplog, "--simulate", "--config", str(cfg)) == [WARNING]


def test_simulate_without_sdk_settings_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\n")
    assert _sdk_warnings(caplog, "--simulate", "--config", str(cfg)) == []
