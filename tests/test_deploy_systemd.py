"""The systemd unit, checked by the real systemd-analyze: it verifies, its sandbox keeps an
exposure score of 3.0 or less, and it asks for what the agent does (notify + watchdog)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from stack_support import REPO_ROOT

UNIT = REPO_ROOT / "deploy" / "systemd" / "gpufeed-agent.service"
EXEC_START = "/usr/local/bin/gpufeed agent --config /etc/gpufeed/agent.yaml"


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    assert path, "systemd-analyze not found (Debian package systemd; `make test` installs it)"
    return path


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_unit_verifies_with_systemd_analyze(tmp_path: Path) -> None:
    # verify checks that ExecStart's binary exists: point it at this checkout's entry point.
    gpufeed = Path(sys.executable).with_name("gpufeed")
    assert gpufeed.is_file(), f"{gpufeed} missing: the package is not installed in this venv"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/gpufeed", str(gpufeed)))
    result = subprocess.run(
        [systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Unknown or misspelt settings are only warnings: there must be none.
    assert str(unit) not in result.stderr, result.stderr


def test_unit_exposure_is_at_most_3() -> None:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) <= 3.0, result.stdout


def test_unit_runs_the_agent_as_a_watched_notify_service() -> None:
    d = directives(UNIT.read_text())
    assert d["ExecStart"] == [EXEC_START]
    assert d["Type"] == ["notify"]
    # The agent pings every half WatchdogSec while the sampler is fresh (10 s at most at
    # the default interval), so a stalled sampler is restarted within about 40 s.
    assert d["WatchdogSec"] == ["30s"]
    assert d["Restart"] == ["always"]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # README: SIGHUP checks the config
    assert int(d["LimitNOFILE"][0]) >= 65536
    assert d["RuntimeDirectory"] == ["gpufeed"] and d["StateDirectory"] == ["gpufeed"]
    assert "AF_UNIX" in d["RestrictAddressFamilies"][0]  # the SDK socket and sd_notify
    caps = set(d["CapabilityBoundingSet"][0].split())
    assert caps == {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}


def test_install_steps_match_the_unit() -> None:
    """README's install steps put the binary and the config where ExecStart looks."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Install on a node", 1)[1].split("\n## ", 1)[0]
    assert "ln -s /opt/gpufeed/bin/gpufeed /usr/local/bin/gpufeed" in section
    assert "/etc/gpufeed/agent.yaml" in section
    assert "deploy/agent.example.yaml" in section
    assert "systemctl enable --now gpufeed-agent" in section


def test_docs_name_the_unit_the_repository_ships() -> None:
    """`systemctl status gpufeed` finds nothing: the unit is gpufeed-agent."""
    unit = UNIT.stem
    pattern = re.compile(r"(?:systemctl|journalctl)[^`\n]*?\s(gpufeed[\w.-]*)")
    wrong = []
    for page in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            wrong += [
                f"{page.name}:{n}: {m.group(0)}"
                for m in pattern.finditer(line)
                if m.group(1).removesuffix(".service") != unit
            ]
    assert wrong == []
