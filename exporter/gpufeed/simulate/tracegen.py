"""Labelled multi-node traces for the correlator's accuracy and speed benchmarks.

`generate_trace` simulates N nodes for T seconds and writes:
- the trace, in the contract's format (OpenMetrics, a timestamp on every sample, families
  contiguous, `# EOF` at the end; nodes told apart by an `instance` label), exactly the
  series a `--simulate` agent would expose, GPU families included;
- a JSON-lines labels file: for every (instance, gpu), the intervals of constant truth
  (`cause` null when healthy; `confounder` names an alarming-but-healthy event).

Values are kept per series in float arrays (8 bytes per sample, all nodes at once, since a
family must be written for every node before the next family starts), then written
family by family. Command line: `python -m gpufeed.simulate.tracegen --help`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpufeed.catalogue import spec
from gpufeed.gpu.backend import GpuIdentity
from gpufeed.simulate.engine import Engine, mix
from gpufeed.simulate.generator import random_scenario
from gpufeed.simulate.scenario import COLLECTIVE_GUISES, Scenario, load_scenario
from gpufeed.simulate.series import (
    COUNTER,
    GAUGE,
    GPU_UP,
    JOB_PRESENT,
    NONZERO,
    SeriesDef,
    gpu_identities,
    gpu_series,
    node_series,
)
from gpufeed.trace.format import EOF_LINE, om_header, om_labels, om_timestamp

DEFAULT_START_UNIX = 1_700_000_000.0
ScenarioSource = Scenario | Callable[[int, int, float], Scenario] | None
_TruthKey = tuple[str | None, str, str, str, str]  # cause, job, phase, guise, confounder


@dataclass(frozen=True, slots=True)
class TraceStats:
    nodes: int
    series: int
    samples: int
    steps: int
    bytes: int
    seconds: float  # wall time the generation took


@dataclass
class NodeData:
    """One simulated node's series and their values, one column per series."""

    instance: str
    defs: list[SeriesDef]
    values: list[array[float]]


def instance_name(node: int) -> str:
    return f"gpu-node-{node:03d}:9842"


def generate_trace(
    path: str | Path,
    labels_path: str | Path | None,
    *,
    nodes: int = 8,
    duration_s: float = 3600.0,
    step_s: float = 15.0,
    seed: int = 1,
    scenario: ScenarioSource = None,
    sdk: bool | None = None,
    start_unix: float = DEFAULT_START_UNIX,
) -> TraceStats:
    """Writes a labelled trace of `nodes` simulated nodes.

    `scenario`: None draws a random scenario per node (`generator.random_scenario`, every
    cause in several guises, with confounders; `sdk` forces the job SDK on or off); a
    `Scenario` runs that one on every node (each with its own seed); a callable
    `(node, node_seed, duration_s) -> Scenario` chooses per node.
    """
    began = time.perf_counter()
    if nodes < 1 or duration_s <= 0 or step_s <= 0:
        raise ValueError("nodes, duration_s and step_s must be positive")
    steps = int(duration_s // step_s) + 1
    data: list[NodeData] = []
    labels_out = open(labels_path, "w", encoding="utf-8") if labels_path else None  # noqa: SIM115
    try:
        for i in range(nodes):
            node, engine, ids = _simulate(i, seed, duration_s, step_s, scenario, sdk)
            data.append(node)
            if labels_out is not None:
                _write_labels(labels_out, engine, instance_name(i), ids, steps, step_s, start_unix)
    finally:
        if labels_out is not None:
            labels_out.close()
    samples, size = _write_trace(Path(path), data, steps, step_s, start_unix)
    return TraceStats(
        nodes=nodes,
        series=sum(len(d.defs) for d in data),
        samples=samples,
        steps=steps,
        bytes=size,
        seconds=time.perf_counter() - began,
    )


def random_scenarios(sdk: bool | None, collectives: str) -> ScenarioSource:
    """generate_trace's random scenarios, their jobs' collectives read as `collectives`
    (COLLECTIVE_GUISES) rather than the default."""

    def draw(_node: int, node_seed: int, duration_s: float) -> Scenario:
        return random_scenario(node_seed, duration_s, sdk=sdk, collectives=collectives)

    return draw


def simulate_node(
    node: int,
    *,
    duration_s: float,
    step_s: float = 15.0,
    seed: int = 1,
    scenario: ScenarioSource = None,
    sdk: bool | None = None,
) -> NodeData:
    """Node `node` of a `generate_trace` run with the same arguments, as columns (sample k
    at `start_unix + k * step_s`; NaN where absent): for loaders that write another format,
    such as a TSDB's import API (`bench/analyze_scale.py`)."""
    return _simulate(node, seed, duration_s, step_s, scenario, sdk)[0]


def _simulate(
    i: int,
    seed: int,
    duration_s: float,
    step_s: float,
    scenario: ScenarioSource,
    sdk: bool | None,
) -> tuple[NodeData, Engine, list[GpuIdentity]]:
    node_seed = mix(seed, 201, i) & 0x7FFFFFFF
    if scenario is None:
        sc = random_scenario(node_seed, duration_s, sdk=sdk)
    elif isinstance(scenario, Scenario):
        sc = scenario
    else:
        sc = scenario(i, node_seed, duration_s)
    engine = Engine(sc, node_seed, pace=1.0, resolution_seconds=step_s)
    ids = gpu_identities(sc, node_seed)
    defs = gpu_series(sc, engine.layout, ids) + node_series(sc, engine.layout, ids)
    steps = int(duration_s // step_s) + 1
    return NodeData(instance_name(i), defs, _values(engine, defs, steps)), engine, ids


def _values(engine: Engine, defs: Sequence[SeriesDef], steps: int) -> list[array[float]]:
    """Every series' value at every step (NaN where absent), built column by column."""
    nan = math.nan
    gauge_rows: list[list[float]] = []
    counter_rows: list[list[float]] = []
    up_rows: list[list[bool]] = []
    present_rows: list[list[bool]] = []
    for k, (gauges, counters) in enumerate(engine.iter_cells(steps)):
        # each cell's lists are fresh objects, so keeping references is safe
        gauge_rows.append(gauges)
        counter_rows.append(counters)
        up, present = engine.presence(k)
        up_rows.append(up)
        present_rows.append(present)
    cols: list[array[float]] = []
    for d in defs:
        i = d.index
        if d.source == GAUGE:
            col = [row[i] for row in gauge_rows]
        elif d.source == COUNTER:
            col = [row[i] for row in counter_rows]
            if d.integer:
                col = [float(math.floor(v)) for v in col]
            elif d.gate == NONZERO:
                col = [v if v != 0 else nan for v in col]
        else:
            col = [d.const] * steps
        if d.gate == GPU_UP:
            g = d.gate_index
            col = [v if row[g] else nan for v, row in zip(col, up_rows, strict=True)]
        elif d.gate == JOB_PRESENT:
            j = d.gate_index
            col = [v if row[j] else nan for v, row in zip(col, present_rows, strict=True)]
        cols.append(array("d", col))
    return cols


def _write_trace(
    path: Path, data: list[NodeData], steps: int, step_s: float, start_unix: float
) -> tuple[int, int]:
    suffixes = [" " + om_timestamp(start_unix + k * step_s) + "\n" for k in range(steps)]
    order: dict[str, SeriesDef] = {}
    for node in data:
        for d in node.defs:
            order.setdefault(d.family, d)
    samples = 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", buffering=1 << 22) as f:
        for fam, first in order.items():
            f.write(om_header(fam, first.type, spec(fam).help))
            for node in data:
                inst = (("instance", node.instance),)
                for d, vals in zip(node.defs, node.values, strict=True):
                    if d.family != fam:
                        continue
                    prefix = d.sample + om_labels(d.labels + inst) + " "
                    # repr is the shortest exact float text; `1.0` is valid OpenMetrics
                    lines = [
                        f"{prefix}{v!r}{s}" for v, s in zip(vals, suffixes, strict=True) if v == v
                    ]
                    samples += len(lines)
                    f.write("".join(lines))
        f.write(EOF_LINE)
    tmp.replace(path)
    return samples, path.stat().st_size


def _write_labels(
    out: IO[str], engine: Engine, instance: str, ids: Sequence[GpuIdentity], steps: int,
    step_s: float, start_unix: float,
) -> None:  # fmt: skip
    n = engine.scenario.node.gpus
    current: list[_TruthKey | None] = [None] * n
    began = [0] * n

    def emit(g: int, key: _TruthKey, k0: int, k1: int) -> None:
        cause, job_id, phase, guise, confounder = key
        rec = {
            "instance": instance,
            "gpu": str(g),
            "uuid": ids[g].uuid,
            "job_id": job_id,
            "start": start_unix + k0 * step_s,
            "end": start_unix + k1 * step_s,
            "cause": cause,
            "phase": phase,
            "guise": guise,
            "confounder": confounder,
        }
        out.write(json.dumps(rec, separators=(",", ":")) + "\n")

    for k in range(steps):
        truth = engine.ground_truth(k * step_s)
        for g in range(n):
            t = truth[g]
            key = (t.cause, t.job_id, t.phase, t.guise, t.confounder)
            prev = current[g]
            if key != prev:
                if prev is not None:
                    emit(g, prev, began[g], k)
                current[g], began[g] = key, k
    for g in range(n):
        prev = current[g]
        if prev is not None:
            emit(g, prev, began[g], steps)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpufeed.simulate.tracegen",
        description="Write a labelled multi-node trace of simulated nodes.",
    )
    p.add_argument("trace", help="output trace file (OpenMetrics with timestamps)")
    p.add_argument("--labels", help="output JSON-lines labels file")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--step", type=float, default=15.0, help="seconds between samples")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scenario", help="run this scenario file on every node (default: random)")
    p.add_argument("--sdk", choices=["yes", "no", "random"], default="random")
    p.add_argument(
        "--collectives",
        choices=COLLECTIVE_GUISES,
        default=COLLECTIVE_GUISES[0],
        help="how a random scenario's GPUs read while their ranks wait in a collective",
    )
    args = p.parse_args(argv)
    sdk = {"yes": True, "no": False, "random": None}[args.sdk]
    sc: ScenarioSource = load_scenario(args.scenario) if args.scenario else None
    if sc is None and args.collectives != COLLECTIVE_GUISES[0]:
        sc = random_scenarios(sdk, args.collectives)
    stats = generate_trace(
        args.trace,
        args.labels,
        nodes=args.nodes,
        duration_s=args.hours * 3600,
        step_s=args.step,
        seed=args.seed,
        scenario=sc,
        sdk=sdk,
    )
    print(
        f"{stats.samples} samples, {stats.series} series, {stats.nodes} nodes, "
        f"{stats.bytes / 1e6:.1f} MB in {stats.seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
