"""What a node gets: `make runtime` (what `make run` uses) and the wheel install the runtime
dependencies only, and the installed agent runs with its package data (scenarios, the
`gpufeed run` injection modules). Real venvs, real pip, a real agent serving /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

from gpufeed.config import load_config, parse_config
from procports import wait_listening
from stack_support import REPO_ROOT


def pyproject_test_extras() -> set[str]:
    """The test extras (pyproject [project.optional-dependencies].test), which must never
    reach a node: read from pyproject so a new test dependency is checked without a second
    list to keep in step."""
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    return {normalized(match_name(req)) for req in extras}


def match_name(requirement: str) -> str:
    """The distribution name a PEP 508 requirement starts with ("torch==2.13.0" -> "torch")."""
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert found, f"pyproject test extra {requirement!r} does not start with a package name"
    return found.group(0)


def normalized(name: str) -> str:
    """A distribution name as `pip list` spells it here (lower case, "-" for "_" and ".")."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_test_extras_are_read_from_pyproject() -> None:
    only = pyproject_test_extras()
    assert {"torch", "mypy", "grafanalib", "pytest", "ruff", "types-pyyaml"} <= only
    assert "prometheus-client" not in only


def installed(python: Path) -> set[str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return {normalized(str(p["name"])) for p in json.loads(out)}


def serve_simulated(gpufeed: Path, tmp_path: Path) -> str:
    """Starts the installed agent on a simulated node; returns its first /metrics page."""
    config = tmp_path / "agent.yaml"
    config.write_text(f"correlator:\n  windows_log: {tmp_path / 'windows.jsonl'}\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    listen = "127.0.0.1:0"
    proc = subprocess.Popen(
        [
            str(gpufeed),
            "agent",
            "--simulate",
            "--config",
            str(config),
            "--web.listen-address",
            listen,
        ],
        env=env,
        cwd=tmp_path,  # not the checkout: the installed package must be what runs
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        port = wait_listening(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return str(r.read().decode())
            except OSError:
                time.sleep(0.2)
        raise AssertionError("the installed agent did not serve /metrics in 30 s")
    finally:
        proc.terminate()
        proc.wait(15)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.xdist_group("builds-this-checkout")  # one at a time: same build/ dir
@pytest.mark.slow
def test_make_runtime_installs_runtime_dependencies_only(tmp_path: Path) -> None:
    venv = tmp_path / "run-venv"
    result = subprocess.run(
        ["make", "-C", str(REPO_ROOT), "runtime", f"RUN_VENV={venv}", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    packages = installed(venv / "bin" / "python")
    assert "gpufeed" in packages and "prometheus-client" in packages
    assert packages & pyproject_test_extras() == set()
    help_ = subprocess.run(
        [str(venv / "bin" / "gpufeed"), "agent", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert help_.returncode == 0 and "--web.listen-address" in help_.stdout
    # `make run` starts the agent from that venv, not from the test venv.
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO_ROOT), "run", f"RUN_VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"{venv}/bin/gpufeed agent" in dry.stdout and ".venv/bin" not in dry.stdout


@pytest.mark.xdist_group("builds-this-checkout")  # one at a time: same build/ dir
@pytest.mark.slow
def test_wheel_installs_on_a_bare_venv_and_serves_metrics(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("gpufeed-*-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("gpufeed/scenarios/default.yaml", "gpufeed/inject/sitecustomize.py"):
        assert needed in names, sorted(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    venv = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert installed(venv / "bin" / "python") & pyproject_test_extras() == set()
    page = serve_simulated(venv / "bin" / "gpufeed", tmp_path)
    assert "gpufeed_gpu_utilization_ratio{" in page
    assert 'backend="simulated"' in page


def test_license_is_the_apache_license_pyproject_names() -> None:
    text = (REPO_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'license = "Apache-2.0"' in pyproject


def test_example_agent_config_is_accepted_by_the_validator() -> None:
    config = load_config(REPO_ROOT / "deploy" / "agent.example.yaml")
    assert [t.name for t in config.tiers] == ["gpu_direct", "hot", "warm", "cold"]
    assert config.correlator.windows_log == "/var/lib/gpufeed/windows.jsonl"


def test_kubernetes_config_map_is_accepted_by_the_validator() -> None:
    for doc in yaml.safe_load_all((REPO_ROOT / "deploy/kubernetes/daemonset.yaml").read_text()):
        if doc and doc["kind"] == "ConfigMap":
            parse_config(doc["data"]["agent.yaml"], "daemonset.yaml ConfigMap")
            return
    raise AssertionError("no ConfigMap with agent.yaml in deploy/kubernetes/daemonset.yaml")
