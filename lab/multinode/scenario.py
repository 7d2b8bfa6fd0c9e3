"""What the multi-node harness reads from a lab scenario (`nodes: 2..4`).

The file is read by the lab's one loader (`lab.scenario`); this module checks what only the
multi-node harness needs and turns it into a `Plan`:
- `workload.kind: ddp` under `launcher: run`, with `hidden` (the MLP's width, which sets the
  gradient bytes all-reduced per step) as the kind's own knob;
- faults of the kinds below, each with its node and its own parameters;
- `agent:` (optional), correlator settings every node's agent gets: short scenarios need a
  shorter minimum window than the default minute.
Bad input is one line naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import scenario as lab_scenario
from lab.scenario import Scenario, ScenarioError

MAX_NODES = 4
AGENT_KEYS = ("min_window_seconds", "merge_gap_seconds", "threshold_ratio")
# kind -> {parameter: type}
FAULT_PARAMS: dict[str, dict[str, type]] = {
    "link_rate_limit": {"rate": str},  # as tc writes it: "8mbit"
    "blkio_read_limit": {"tier": str, "bytes_per_s": int},
    "cpu_quota": {"cpus": float},
    "rank_stop": {},  # SIGSTOP at start_s, SIGCONT at stop_s
    "rank_kill": {},  # SIGKILL at start_s; stop_s only ends the interval the fault is in
}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    node: int
    start_s: float
    stop_s: float
    params: tuple[tuple[str, Any], ...] = ()

    def param(self, key: str) -> Any:
        return dict(self.params)[key]


@dataclass(frozen=True, slots=True)
class Plan:
    scenario: Scenario
    hidden: int
    faults: tuple[Fault, ...]
    agent_correlator: tuple[tuple[str, float], ...]

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def min_window_s(self) -> float:
        return dict(self.agent_correlator).get("min_window_seconds", 60.0)


def load(path: Path) -> Plan:
    return plan(lab_scenario.load(path))


def plan(sc: Scenario) -> Plan:
    where = sc.path or sc.name

    def fail(key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{where}: {key}: {msg}")

    if not 2 <= sc.nodes <= MAX_NODES:
        raise fail("nodes", f"{sc.nodes}: the multi-node harness runs 2..{MAX_NODES} nodes")
    w = sc.workload
    if w.kind != "ddp" or w.launcher != "run":
        raise fail("workload", "the multi-node harness runs kind ddp under launcher run")
    extra = dict(w.extra)
    unknown = sorted(set(extra) - {"hidden"})
    if unknown:
        raise fail("workload", f"unknown key(s) {', '.join(unknown)}")
    hidden = extra.get("hidden", 512)
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        raise fail("workload.hidden", f"must be a positive integer, got {hidden!r}")
    faults = tuple(_fault(f, f"faults[{i}]", fail) for i, f in enumerate(sc.faults))
    agent = dict(sc.extra).get("agent", {})
    if not isinstance(agent, dict):
        raise fail("agent", "must be a mapping")
    bad = sorted(k for k in agent if k not in AGENT_KEYS)
    if bad:
        raise fail("agent", f"unknown key(s) {', '.join(bad)}; known: {', '.join(AGENT_KEYS)}")
    correlator = []
    for k, v in agent.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise fail(f"agent.{k}", f"must be a number >= 0, got {v!r}")
        correlator.append((k, float(v)))
    return Plan(sc, hidden, faults, tuple(correlator))


def _fault(f: lab_scenario.Fault, key: str, fail: Any) -> Fault:
    spec = FAULT_PARAMS.get(f.kind)
    if spec is None:
        raise fail(f"{key}.kind", f"{f.kind!r}: one of {', '.join(FAULT_PARAMS)}")
    params = dict(f.params)
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise fail(key, f"unknown key(s) {', '.join(unknown)} for {f.kind}")
    for p, kind in spec.items():
        v = params.get(p)
        ok = isinstance(v, (int, float)) if kind is float else isinstance(v, kind)
        if v is None or not ok or isinstance(v, bool):
            raise fail(f"{key}.{p}", f"{f.kind} needs {p} ({kind.__name__}), got {v!r}")
    return Fault(f.kind, f.node, f.start_s, f.stop_s, tuple(sorted(params.items())))
