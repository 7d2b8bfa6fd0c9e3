"""The systemd unit, checked by the real systemd-analyze: it verifies, its sandbox keeps an
exposure score of 3.0 or less, and it asks for what the agent does (notify + watchdog)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd, isolated_agent_args
from gpufeed.sdk import Job
from procports import wait_listening
from stack_support import REPO_ROOT

UNIT = REPO_ROOT / "deploy" / "systemd" / "gpufeed-agent.service"
FLEET_UNIT = REPO_ROOT / "deploy" / "systemd" / "gpufeed-fleet.service"
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


@pytest.mark.parametrize("shipped", [UNIT, FLEET_UNIT], ids=lambda p: p.stem)
def test_unit_verifies_with_systemd_analyze(tmp_path: Path, shipped: Path) -> None:
    # verify checks that ExecStart's binary exists: point it at this checkout's entry point.
    gpufeed = Path(sys.executable).with_name("gpufeed")
    assert gpufeed.is_file(), f"{gpufeed} missing: the package is not installed in this venv"
    unit = tmp_path / shipped.name
    unit.write_text(shipped.read_text().replace("/usr/local/bin/gpufeed", str(gpufeed)))
    result = subprocess.run(
        [systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Unknown or misspelt settings are only warnings: there must be none.
    assert str(unit) not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("shipped", "most"), [(UNIT, 3.0), (FLEET_UNIT, 1.5)], ids=["agent", "fleet"]
)
def test_unit_exposure_is_at_most_3(shipped: Path, most: float) -> None:
    """The agent reads the host (3.0 at most); the fleet service only talks HTTP (1.5)."""
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", "--no-pager", str(shipped)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) <= most, result.stdout


def test_fleet_unit_runs_the_fleet_service_with_its_log_in_its_state_directory() -> None:
    from gpufeed.cli import build_parser

    d = directives(FLEET_UNIT.read_text())
    (exec_start,) = d["ExecStart"]
    binary, *argv = exec_start.split()
    assert binary == "/usr/local/bin/gpufeed"
    args = build_parser().parse_args(argv)
    assert args.command == "fleet"
    (state,) = d["StateDirectory"]
    assert Path(args.windows_log).parent == Path("/var/lib") / state
    assert d["DynamicUser"] == ["yes"] and d["Restart"] == ["always"]


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
    """`systemctl status gpufeed` finds nothing: the units are gpufeed-agent and
    gpufeed-fleet."""
    units = {UNIT.stem, FLEET_UNIT.stem}
    pattern = re.compile(r"(?:systemctl|journalctl)[^`\n]*?\s(gpufeed[\w.-]*)")
    wrong = []
    for page in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            wrong += [
                f"{page.name}:{n}: {m.group(0)}"
                for m in pattern.finditer(line)
                if m.group(1).removesuffix(".service") not in units
            ]
    assert wrong == []


def expand(group: str) -> set[str]:
    """The system calls of a systemd syscall group (nested groups expanded) or one call."""
    if not group.startswith("@"):
        return {group}
    out = subprocess.run(
        [systemd_analyze(), "syscall-filter", group],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        item = line.strip()
        if item and not item.startswith("#"):
            calls |= expand(item)
    return calls


def unit_allowed_syscalls() -> set[str]:
    """What the unit's SystemCallFilter= lines allow: the first list, minus `~` lists."""
    allowed: set[str] = set()
    for entry in directives(UNIT.read_text())["SystemCallFilter"]:
        if entry.startswith("~"):
            for item in entry[1:].split():
                allowed -= expand(item)
        else:
            for item in entry.split():
                allowed |= expand(item)
    return allowed


def scrape(port: int) -> dict[str, float]:
    """Every sample of the agent's /metrics page, keyed by series."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


@pytest.mark.slow
def test_the_agent_works_under_the_units_system_call_filter(tmp_path: Path) -> None:
    """The real agent on this host's collectors, the SDK socket, the recorder and the
    correlator, run under the unit's allow-list (EPERM for the rest, as the unit says) and
    without writable-executable memory (MemoryDenyWriteExecute=), serves what the same
    agent without them serves, and stops cleanly."""
    system_python = "/usr/bin/python3"
    probe = subprocess.run([system_python, "-c", "import seccomp"], capture_output=True)
    assert probe.returncode == 0, "Debian package python3-seccomp missing (`make test` installs it)"
    allowed = unit_allowed_syscalls()
    assert {"read", "sendto", "statfs", "ioctl"} <= allowed and "chown" not in allowed
    allow_file = tmp_path / "allowed.txt"
    allow_file.write_text("\n".join(sorted(allowed)))
    wrapper = REPO_ROOT / "tests" / "helpers" / "seccomp_exec.py"

    agents = {}
    jobs: list[Job] = []
    for name, prefix in (
        ("plain", []),
        ("filtered", [system_python, str(wrapper), str(allow_file)]),
    ):
        home = tmp_path / name
        home.mkdir()
        args = isolated_agent_args(("--record", str(home / "trace.om")), home)
        proc = subprocess.Popen(
            [*prefix, *gpufeed_cmd("agent", *args)],
            env=agent_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        agents[name] = (proc, wait_listening(proc), home)
    try:
        for _, (_, _, home) in agents.items():
            # The HTTP port is bound first, the SDK socket a moment later.
            deadline = time.monotonic() + 20
            while not (home / "sdk.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            job = Job("seccomp-check", socket=str(home / "sdk.sock"))
            for _ in job.track(range(5)):
                time.sleep(0.05)  # past the SDK's 0.1 s flush: steps go while the job is open
            assert job.events_sent > 0 and job.events_dropped == 0
            jobs.append(job)
        time.sleep(3)  # a few samples, so that rates and the SDK job show
        # scraped while the jobs are open: a closed job's page-cache counters leave the
        # page when the agent forgets its processes, which one agent could do before the
        # other's scrape (1 run in 6 showed them in one page only)
        pages = {name: scrape(port) for name, (_, port, _) in agents.items()}
        for job in jobs:
            job.close()
        plain, filtered = pages["plain"], pages["filtered"]
        families = {name: {s.split("{")[0] for s in page} for name, page in pages.items()}
        assert families["filtered"] == families["plain"]
        success = {s: v for s, v in filtered.items() if s.startswith("gpufeed_collector_success")}
        assert success and all(v == 1 for v in success.values()), success
        assert any(s.startswith("gpufeed_job_steps_total{") for s in filtered), sorted(filtered)
        assert set(success) == {s for s in plain if s.startswith("gpufeed_collector_success")}
    finally:
        errors = {}
        for name, (proc, _, _) in agents.items():
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(20)
            assert proc.stderr is not None
            errors[name] = (code, proc.stderr.read().decode())
            proc.stderr.close()
    code, log = errors["filtered"]
    assert code == 0, log
    assert "Operation not permitted" not in log and "Traceback" not in log, log
    # The recorder finalized its trace under the filter too.
    assert (agents["filtered"][2] / "trace.om").read_text().endswith("# EOF\n")
