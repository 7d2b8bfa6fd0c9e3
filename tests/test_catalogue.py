"""The metric catalogue is the contract: everything exported is in it, exactly as listed.

Checked here: the catalogue's own naming rules; the families of the real collectors (a real
agent on the fixture trees), of the simulated node over its whole built-in scenario, and of
the live correlator; docs/metrics.md against the catalogue. Each failure names the family
and the file to fix.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from catalogue_check import exposition_problems, families_problems
from conftest import agent_env, wait_for_metrics
from correlator_helpers import scenarios, snapshots_of
from gpufeed import catalogue_doc
from gpufeed.catalogue import BY_NAME, CATALOGUE, MetricSpec
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.simulate.node import SimulatedNode
from gpufeed.simulate.scenario import default_scenario
from test_golden import CONFIG, lay_node

REPO = Path(__file__).resolve().parent.parent
UNITS = ("bytes", "seconds", "ratio", "celsius", "watts", "hertz", "joules", "bytes_per_second")


def test_names_are_unique() -> None:
    assert len(BY_NAME) == len(CATALOGUE)


@pytest.mark.parametrize("m", CATALOGUE, ids=lambda m: m.name)
def test_each_family_follows_the_naming_rules(m: MetricSpec) -> None:
    assert re.fullmatch(r"gpufeed_[a-z0-9_]+", m.name)
    assert m.name.endswith("_total") == (m.type == "counter"), (
        "counters, and only they, end in _total"
    )
    base = m.name.removesuffix("_total")
    if m.unit:
        assert m.unit in UNITS
        assert base.endswith(f"_{m.unit}"), f"{m.name}: the unit {m.unit} must end the name"
    else:
        assert not base.endswith(tuple(f"_{u}" for u in UNITS)), f"{m.name}: unit not declared"
    assert len(set(m.labels)) == len(m.labels)
    assert set(m.optional_labels) <= set(m.labels)
    assert not {"instance", "job", "host", "le"} & set(m.labels), "labels Prometheus owns"
    assert m.help and m.help == m.help.strip() and "\n" not in m.help, "HELP: one line"


def test_the_checks_can_fail() -> None:
    bad = (
        "# HELP gpufeed_gpu_power_watts Power.\n# TYPE gpufeed_gpu_power_watts gauge\n"
        'gpufeed_gpu_power_watts{gpu="0",uuid="u",colour="red"} 1\n'
        "gpufeed_gpu_power_watts 2\n"
        "# HELP gpufeed_made_up Made up.\n# TYPE gpufeed_made_up gauge\ngpufeed_made_up 1\n"
        "# HELP gpufeed_gpu_energy_joules_total Energy consumed since the driver was loaded.\n"
        '# TYPE gpufeed_gpu_energy_joules_total gauge\ngpufeed_gpu_energy_joules_total{gpu="0",uuid="u"} 1\n'
    )
    problems = "\n".join(exposition_problems(bad))
    assert "gpufeed_gpu_power_watts: HELP 'Power.' differs" in problems
    assert "label(s) ['colour'] not declared" in problems
    assert "gpufeed_made_up (gauge) is exported but not in the metric catalogue" in problems
    assert "sample lacks required label(s) ['gpu', 'uuid']" in problems
    assert "gpufeed_gpu_energy_joules_total: exported as gauge" in problems


def test_simulated_node_over_its_whole_scenario() -> None:
    scenario = default_scenario()
    node = SimulatedNode(scenario, seed=3, clock=lambda: 0.0)
    seen: set[str] = set()
    problems: list[str] = []
    for t in range(0, int(scenario.cycle_seconds) + 1, 15):
        fams = node.families(float(t))
        seen |= {f.name for f in fams if f.samples}
        problems += families_problems(fams)
    assert not sorted(set(problems)), "\n".join(sorted(set(problems)))
    # the simulated node stands in for a real one: every contract family but the
    # correlator's (which the agent adds on top), the fleet service's and the cluster
    # scheduler's (gpufeed scheduler, one per cluster) appears at some point of the scenario
    node_groups = ("correlator", "fleet", "scheduler")
    want = {m.name for m in CATALOGUE if m.contract and m.group not in node_groups}
    assert want <= seen, f"never exported by the simulated node: {sorted(want - seen)}"


def test_live_correlator_families(tmp_path: Path) -> None:
    text, _ = scenarios.single("checkpointing", "hot_tier", seed=8, minutes=30)
    proc = CorrelatorProcessor(
        CorrelatorConfig(windows_log=str(tmp_path / "w.jsonl")), interval_seconds=5.0
    )
    problems: list[str] = []
    seen: set[str] = set()
    for snap in snapshots_of(text):
        fams = proc.process(snap)  # type: ignore[arg-type]
        seen |= {f.name for f in fams if f.samples}  # type: ignore[attr-defined]
        problems += families_problems(fams)  # type: ignore[arg-type]
    proc.close()
    assert not problems, "\n".join(sorted(set(problems)))
    assert seen == {m.name for m in CATALOGUE if m.group == "correlator"}


@pytest.mark.slow
def test_real_agent_on_the_fixture_trees(run_agent: Any, tmp_path: Path) -> None:
    node = lay_node(tmp_path / "node")
    cfg = tmp_path / "gpufeed.yaml"
    cfg.write_text(CONFIG + f"correlator:\n  windows_log: {tmp_path / 'windows.jsonl'}\n")
    agent = run_agent(
        "--config", str(cfg),
        "--path.procfs", str(node["proc"]),
        "--path.sysfs", str(node["sys"]),
        "--path.rootfs", str(node["root"]),
        "--gpu.backend", "simulated",
        "--sdk.socket", str(tmp_path / "sdk.sock"),
    )  # fmt: skip
    body = wait_for_metrics(f"{agent.url}/metrics", agent.proc).decode()
    problems = exposition_problems(body)
    assert not problems, "\n".join(problems)
    assert "gpufeed_storage_read_bytes_total" in body and "gpufeed_host_cpus" in body


def test_docs_metrics_md_is_generated_from_the_catalogue() -> None:
    path = REPO / "docs" / "metrics.md"
    text = path.read_text(encoding="utf-8")
    assert catalogue_doc.rewrite(text) == text, (
        "docs/metrics.md differs from the metric catalogue: run `make docs` and commit it"
    )


def test_the_docs_generator_refuses_a_file_without_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        catalogue_doc.rewrite("# no markers here\n")


def test_no_doc_links_outside_the_repository() -> None:
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        assert "../shared/" not in text, f"{path.name} links outside the repository"


def test_docs_cli_rewrites_in_place(tmp_path: Path) -> None:
    doc = tmp_path / "m.md"
    doc.write_text(f"intro\n{catalogue_doc.BEGIN}\nstale\n{catalogue_doc.END}\nend\n")
    run = subprocess.run(
        [sys.executable, "-m", "gpufeed.catalogue_doc", str(doc)],
        capture_output=True,
        text=True,
        env=agent_env(),
    )
    assert run.returncode == 0, run.stderr
    out = doc.read_text()
    assert "stale" not in out and "`gpufeed_gpu_up`" in out and out.endswith("end\n")
