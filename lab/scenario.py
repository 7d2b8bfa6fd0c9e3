"""Lab scenarios are data: one YAML file each in lab/scenarios/ (the schema is in
docs/lab.md). This module reads one into frozen dataclasses and rejects anything it does
not understand with one line that names the file and the key, so a typo in a scenario a
user added is an error, not a fault that silently never runs.

Times in a scenario (`start_s`, `stop_s`) are seconds from the scenario's start; the
runner turns them into unix time when it starts the workload.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpufeed.vocabulary import Cause

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
# "s3": a bucket on the lab's S3 server (lab.faults.s3), not a loop-mounted filesystem
TIER_NAMES = ("gpu_direct", "hot", "warm", "cold", "s3")
LAUNCHERS = ("run", "sdk")
WORKLOAD_KINDS = ("train", "dlio", "ddp")
# Background work: not a fault of the job (no `expect` entry is about it), the host the job
# runs on. `busy_host` (lab/faults/busy.py): unrelated work that keeps the host's CPUs AND
# its disk busy at once, as package installs and test suites do. Every setting and its
# default; the kind's injector reads them from here, filled in by the reader.
BACKGROUND_DEFAULTS: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "busy_host": MappingProxyType(
            {
                "spinners": 2,  # CPU-bound processes, each in its own session
                "spinner_nice": 10,  # at low priority, like `nice make -j`
                "procs_per_s": 20,  # fork/exec of short-lived processes (a test run)
                "disk_mib_per_s": 16,  # buffered writes + fsync, read back from the disk
                "scratch_mib": 256,  # its own loop-mounted scratch tier, which the job never reads
            }
        )
    }
)


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message is one line naming file and key."""


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    every_steps: int = 0  # 0: no checkpoints (a fault can still add some)
    tier: str = "warm"


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str = "train"
    launcher: str = "run"
    device_seconds_per_step: float = 0.05  # the device stand-in: the host waits per step
    data_tier: str = "hot"
    batch_size: int = 8
    num_workers: int = 2
    sample_kib: int = 64  # one sample = one file read with O_DIRECT
    samples: int = 512
    # per-sample CPU work in the input workers (decode/augment stand-in), milliseconds
    preprocess_ms: float = 2.0
    checkpoint: CheckpointSpec = CheckpointSpec()
    weights_tier: str = ""  # "": no start-up load; else read weights_mib from it first
    weights_mib: int = 0
    end_s: float = 0.0  # 0: run to the end; else the job ends here (what `idle` needs)
    extra: tuple[tuple[str, Any], ...] = ()  # knobs another workload kind reads


@dataclass(frozen=True, slots=True)
class TierSpec:
    name: str
    size_mib: int
    # > 0: the tier's device reads at most this many bytes per second for all its readers
    # together (lab/capacity_fs.py); 0: the host disk's own capacity
    read_capacity_bytes_per_s: int = 0


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    start_s: float
    stop_s: float
    node: int = 0
    params: tuple[tuple[str, Any], ...] = ()  # the kind's own settings (bytes_per_s, ...)

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclass(frozen=True, slots=True)
class Expect:
    start_s: float
    stop_s: float
    cause: Cause
    node: int = 0
    evidence: tuple[tuple[str, str], ...] = ()  # e.g. (("tier", "hot"),)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    workload: Workload
    tiers: tuple[TierSpec, ...]
    faults: tuple[Fault, ...] = ()
    expect: tuple[Expect, ...] = ()
    # the host's other work (BACKGROUND_DEFAULTS' kinds); run like faults, never expected
    background: tuple[Fault, ...] = ()
    nodes: int = 1
    settle_s: float = 0.0  # not scored: the workload warming up
    suites: tuple[str, ...] = ("lab",)  # `make lab` runs "lab"; `make test`'s short form "short"
    path: str = ""
    extra: tuple[tuple[str, Any], ...] = field(default=())  # top-level keys for other lanes

    def tier(self, name: str) -> TierSpec:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


_TOP_KEYS = {
    "name",
    "description",
    "nodes",
    "duration_s",
    "settle_s",
    "workload",
    "tiers",
    "faults",
    "expect",
    "suites",
    "background",
}
# Keys another lane's runner reads (the multi-node harness); kept, not interpreted here.
_TOP_EXTRA_KEYS = {"network", "links", "ranks", "agent"}
_WORKLOAD_KEYS = {
    "kind",
    "launcher",
    "device_seconds_per_step",
    "data_tier",
    "batch_size",
    "num_workers",
    "sample_kib",
    "samples",
    "preprocess_ms",
    "checkpoint",
    "weights_tier",
    "weights_mib",
    "end_s",
}


def load(path: str | Path) -> Scenario:
    """Reads and checks one scenario file."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{p}: cannot read: {str(exc).splitlines()[0]}") from exc
    return parse(raw, str(p))


def load_all(directory: str | Path = SCENARIO_DIR) -> list[Scenario]:
    return [load(p) for p in sorted(Path(directory).glob("*.yaml"))]


def find(name: str, directory: str | Path = SCENARIO_DIR) -> Scenario:
    """A scenario by name (its file stem) or by path."""
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return load(p)
    candidate = Path(directory) / f"{name}.yaml"
    if not candidate.exists():
        known = ", ".join(sorted(q.stem for q in Path(directory).glob("*.yaml")))
        raise ScenarioError(f"no scenario {name!r} in {directory} (known: {known})")
    return load(candidate)


def parse(raw: object, where: str = "<scenario>") -> Scenario:
    r = _Reader(where)
    top = r.mapping(raw, "")
    r.only(top, _TOP_KEYS | _TOP_EXTRA_KEYS, "")
    name = r.text(top, "name", "")
    if where.endswith((".yaml", ".yml")) and Path(where).stem != name:
        raise ScenarioError(f"{where}: name {name!r} must equal the file stem {Path(where).stem!r}")
    duration = r.number(top, "duration_s", "", positive=True)
    nodes = int(r.number(top, "nodes", "", default=1, positive=True))
    tiers = _tiers(r, top.get("tiers", {}))
    tier_names = {t.name for t in tiers}
    workload = _workload(r, top.get("workload", {}), tier_names)
    faults = tuple(
        _fault(r, f, f"faults[{i}]", duration, nodes, tier_names)
        for i, f in enumerate(r.sequence(top.get("faults", []), "faults"))
    )
    expect = tuple(
        _expect(r, e, f"expect[{i}]", duration, nodes)
        for i, e in enumerate(r.sequence(top.get("expect", []), "expect"))
    )
    _no_overlap(r, expect)
    background = tuple(
        _background(r, b, f"background[{i}]", duration, nodes)
        for i, b in enumerate(r.sequence(top.get("background", []), "background"))
    )
    return Scenario(
        name=name,
        description=str(top.get("description", "")),
        duration_s=duration,
        workload=workload,
        tiers=tiers,
        faults=faults,
        expect=expect,
        background=background,
        nodes=nodes,
        settle_s=r.number(top, "settle_s", "", default=0.0),
        suites=tuple(str(x) for x in r.sequence(top.get("suites", ["lab"]), "suites")),
        path=where,
        extra=tuple((k, top[k]) for k in sorted(_TOP_EXTRA_KEYS & set(top))),
    )


class _Reader:
    """Typed access to the YAML with errors that say where."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.where}: {key or 'top level'}: {msg}")

    def mapping(self, v: object, key: str) -> Mapping[str, Any]:
        if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
            raise self.fail(key, f"must be a mapping, not {type(v).__name__}")
        return v

    def sequence(self, v: object, key: str) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(key, f"must be a list, not {type(v).__name__}")
        return v

    def only(self, m: Mapping[str, Any], allowed: set[str], key: str) -> None:
        unknown = sorted(set(m) - allowed)
        if unknown:
            raise self.fail(key, f"unknown key(s) {', '.join(unknown)}")

    def text(self, m: Mapping[str, Any], k: str, key: str, default: str | None = None) -> str:
        v = m.get(k, default)
        if not isinstance(v, str) or not v:
            raise self.fail(_join(key, k), "must be a non-empty string")
        return v

    def number(
        self,
        m: Mapping[str, Any],
        k: str,
        key: str,
        default: float | None = None,
        positive: bool = False,
    ) -> float:
        v = m.get(k, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(_join(key, k), f"must be a number, not {v!r}")
        if v < 0 or (positive and v <= 0):
            raise self.fail(_join(key, k), f"must be {'> 0' if positive else '>= 0'}, not {v}")
        return float(v)

    def tier(self, v: object, key: str, known: set[str]) -> str:
        if v not in known:
            raise self.fail(key, f"tier {v!r} is not one of the scenario's tiers {sorted(known)}")
        return str(v)


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


def _tiers(r: _Reader, raw: object) -> tuple[TierSpec, ...]:
    m = r.mapping(raw, "tiers")
    out = []
    for name, spec in m.items():
        if name not in TIER_NAMES:
            raise r.fail(f"tiers.{name}", f"must be one of {', '.join(TIER_NAMES)}")
        s = r.mapping(spec, f"tiers.{name}")
        if name == "s3":  # a bucket: nothing to size
            r.only(s, set(), f"tiers.{name}")
            out.append(TierSpec(name, 0))
            continue
        r.only(s, {"size_mib", "read_capacity_bytes_per_s"}, f"tiers.{name}")
        size = int(r.number(s, "size_mib", f"tiers.{name}", positive=True))
        cap = 0
        if "read_capacity_bytes_per_s" in s:
            cap = int(r.number(s, "read_capacity_bytes_per_s", f"tiers.{name}", positive=True))
        out.append(TierSpec(name, size, cap))
    return tuple(out)


def _workload(r: _Reader, raw: object, tiers: set[str]) -> Workload:
    m = r.mapping(raw, "workload")
    kind = str(m.get("kind", "train"))
    if kind not in WORKLOAD_KINDS:
        raise r.fail("workload.kind", f"must be one of {', '.join(WORKLOAD_KINDS)}")
    if kind == "train":  # other kinds are read by their own runners
        r.only(m, _WORKLOAD_KEYS, "workload")
    launcher = str(m.get("launcher", "run"))
    if launcher not in LAUNCHERS:
        raise r.fail("workload.launcher", f"must be one of {', '.join(LAUNCHERS)}")
    ck = r.mapping(m.get("checkpoint", {}), "workload.checkpoint")
    r.only(ck, {"every_steps", "tier"}, "workload.checkpoint")
    every = int(r.number(ck, "every_steps", "workload.checkpoint", default=0))
    ck_tier = str(ck.get("tier", "warm"))
    if every:
        r.tier(ck_tier, "workload.checkpoint.tier", tiers)
    weights_tier = str(m.get("weights_tier", ""))
    if weights_tier:
        r.tier(weights_tier, "workload.weights_tier", tiers)

    def num(k: str, default: float, positive: bool = False) -> float:
        return r.number(m, k, "workload", default=default, positive=positive)

    return Workload(
        kind=kind,
        launcher=launcher,
        device_seconds_per_step=num("device_seconds_per_step", 0.05),
        data_tier=r.tier(m.get("data_tier", "hot"), "workload.data_tier", tiers),
        batch_size=int(num("batch_size", 8, positive=True)),
        num_workers=int(num("num_workers", 2)),
        sample_kib=int(num("sample_kib", 64, positive=True)),
        samples=int(num("samples", 512, positive=True)),
        preprocess_ms=num("preprocess_ms", 2.0),
        checkpoint=CheckpointSpec(every, ck_tier),
        weights_tier=weights_tier,
        weights_mib=int(num("weights_mib", 0)),
        end_s=num("end_s", 0.0),
        extra=tuple((k, m[k]) for k in sorted(set(m) - _WORKLOAD_KEYS)),
    )


def _window(
    r: _Reader, m: Mapping[str, Any], key: str, duration: float, nodes: int
) -> tuple[float, float, int]:
    start = r.number(m, "start_s", key)
    stop = r.number(m, "stop_s", key)
    if not start < stop <= duration:
        raise r.fail(
            key, f"needs start_s < stop_s <= duration_s ({duration:g}), got {start:g}-{stop:g}"
        )
    node = int(r.number(m, "node", key, default=0))
    if node >= nodes:
        raise r.fail(f"{key}.node", f"node {node} but the scenario has {nodes} node(s)")
    return start, stop, node


def _fault(
    r: _Reader, raw: object, key: str, duration: float, nodes: int, tiers: set[str]
) -> Fault:
    m = r.mapping(raw, key)
    kind = r.text(m, "kind", key)
    start, stop, node = _window(r, m, key, duration, nodes)
    if "tier" in m:
        r.tier(m["tier"], f"{key}.tier", tiers)
    params = tuple(
        (k, v) for k, v in sorted(m.items()) if k not in ("kind", "start_s", "stop_s", "node")
    )
    return Fault(kind=kind, start_s=start, stop_s=stop, node=node, params=params)


def _background(r: _Reader, raw: object, key: str, duration: float, nodes: int) -> Fault:
    """One entry of the host's other work: its kind, its settings checked against the
    kind's own (every default filled in), and when: from before the workload starts
    (`start_s: 0`, the default) to the scenario's end unless given."""
    m = r.mapping(raw, key)
    kind = r.text(m, "kind", key)
    defaults = BACKGROUND_DEFAULTS.get(kind)
    if defaults is None:
        raise r.fail(f"{key}.kind", f"must be one of {', '.join(sorted(BACKGROUND_DEFAULTS))}")
    if nodes != 1:
        raise r.fail(key, "background work runs in single-node scenarios only (lab.run)")
    r.only(m, {"kind", "start_s", "stop_s", *defaults}, key)
    when = {"start_s": 0.0, "stop_s": duration, **m}
    start, stop, _ = _window(r, when, key, duration, nodes)
    params = []
    for k, default in sorted(defaults.items()):
        v = r.number(m, k, key, default=default, positive=k == "scratch_mib")
        if v != int(v):
            raise r.fail(_join(key, k), f"must be a whole number, not {v:g}")
        params.append((k, int(v)))
    if not 0 <= dict(params).get("spinner_nice", 0) <= 19:
        raise r.fail(_join(key, "spinner_nice"), "must be 0-19")
    return Fault(kind=kind, start_s=start, stop_s=stop, params=tuple(params))


def _expect(r: _Reader, raw: object, key: str, duration: float, nodes: int) -> Expect:
    m = r.mapping(raw, key)
    r.only(m, {"start_s", "stop_s", "node", "cause", "evidence"}, key)
    start, stop, node = _window(r, m, key, duration, nodes)
    try:
        cause = Cause(r.text(m, "cause", key))
    except ValueError:
        raise r.fail(
            f"{key}.cause", f"must be one of {', '.join(c.value for c in Cause)}"
        ) from None
    ev = r.mapping(m.get("evidence", {}), f"{key}.evidence")
    return Expect(start, stop, cause, node, tuple((k, str(v)) for k, v in sorted(ev.items())))


def _no_overlap(r: _Reader, expect: tuple[Expect, ...]) -> None:
    by_node = sorted(expect, key=lambda e: (e.node, e.start_s))
    for a, b in itertools.pairwise(by_node):
        if a.node == b.node and b.start_s < a.stop_s:
            raise r.fail("expect", f"intervals overlap on node {a.node} at {b.start_s:g} s")
