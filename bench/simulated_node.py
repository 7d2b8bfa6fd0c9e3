"""Cost of the simulated node: per sampling interval, and trace generation throughput.

Per interval: the 8-GPU built-in scenario, a clock stepped one second per interval (so
every call computes a new cell, as in the agent), timing GpuCollector.collect() plus the
`simulated` collector's collect(). Reference, same run: rendering those families to
Prometheus text (what every scrape costs anyway), and the 1 s sampling interval.

Trace generation: samples per second of `generate_trace` for --nodes x --hours at 15 s.
Reference, same run: reading the written file back line by line in Python.

Usage: python -m bench.simulated_node [--intervals 600] [--nodes 2] [--hours 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gpufeed.collectors.gpu import GpuCollector
from gpufeed.exposition import render_text
from gpufeed.simulate import build_simulated_node
from gpufeed.simulate.tracegen import generate_trace


def per_interval(intervals: int) -> None:
    clock = [1_700_000_000.0]
    backend, collectors, _ = build_simulated_node(None, seed=1, clock=lambda: clock[0])
    gpu = GpuCollector(backend)
    (node,) = collectors
    costs, renders = [], []
    series = 0
    for _ in range(intervals):
        clock[0] += 1.0
        t0 = time.perf_counter()
        fams = gpu.collect() + node.collect()
        t1 = time.perf_counter()
        render_text(fams)
        t2 = time.perf_counter()
        costs.append(t1 - t0)
        renders.append(t2 - t1)
        series = sum(len(f.samples) for f in fams)
    c, r = statistics.median(costs) * 1e3, statistics.median(renders) * 1e3
    print(f"simulated node, 8 GPUs, {series} series, {intervals} intervals of 1 s")
    print(f"collect (gpu + simulated)   median {c:7.3f} ms")
    print(f"reference: render_text()    median {r:7.3f} ms")
    print(f"collect / render_text       {c / r:7.2f}")
    print(f"collect / interval (1 s)    {c / 1e3:7.5f}")


def tracegen(nodes: int, hours: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.om"
        stats = generate_trace(path, Path(d) / "l.jsonl", nodes=nodes, duration_s=hours * 3600)
        t0 = time.perf_counter()
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        read_s = time.perf_counter() - t0
    print(f"trace: {nodes} nodes x {hours:g} h at 15 s, {stats.samples} samples, "
          f"{stats.bytes / 1e6:.0f} MB")  # fmt: skip
    print(f"generate_trace              {stats.seconds:7.2f} s, {stats.samples / stats.seconds:,.0f} samples/s")  # fmt: skip
    print(f"reference: read lines back  {read_s:7.2f} s, {lines / read_s:,.0f} lines/s")
    print(f"generate / read back        {stats.seconds / read_s:7.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--intervals", type=int, default=600)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--hours", type=float, default=6.0)
    args = ap.parse_args()
    per_interval(args.intervals)
    tracegen(args.nodes, args.hours)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
