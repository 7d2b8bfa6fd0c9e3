"""`python -m bench.tsdb_limits`: gpufeed's calls against a VictoriaMetrics at its default
limits (Debian's `victoria-metrics`, started here) holding a simulated fleet of more series
than `-search.maxUniqueTimeseries` (300,000): one call over every series, the discovery
`analyze --prometheus` made before, is refused (HTTP 422); the discovery it makes now (one
label-values call per used family, `/api/v1/series` per 64 instances) finds every instance
and job, and a fleet cycle's query of the widest family is answered. Exit 1 when any of
gpufeed's calls fails or misses an instance.

The fleet is bench/fleet_cycle.py's (`--base-nodes` distinct simulated nodes repeated under
new names, the series the correlator reads), `--minutes` long.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.analyze_scale import _base, _job_suffix, _lines
from gpufeed.correlator.feeds import matrix, promql
from gpufeed.simulate.tracegen import DEFAULT_START_UNIX, instance_name, simulate_node
from tests.victoria import import_lines, victoria

WIDEST = "gpufeed_gpu_clock_event_active"  # 8 GPUs x 8 reasons per simulated node


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--base-nodes", type=int, default=16)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--step", type=float, default=15.0)
    args = ap.parse_args(argv)
    B, dur = args.base_nodes, args.minutes * 60
    bases = [_base(simulate_node(i, duration_s=dur, step_s=args.step, seed=7), args.step)
             for i in range(B)]  # fmt: skip
    s, e = DEFAULT_START_UNIX, DEFAULT_START_UNIX + dur
    with tempfile.TemporaryDirectory(prefix="gpufeed-limits-") as tmp:
        d = Path(tmp)
        with victoria(d / "vm", d / "vm.log") as url:
            began = time.perf_counter()
            n = import_lines(
                url,
                (
                    line
                    for i in range(args.nodes)
                    for line in _lines(bases[i % B], instance_name(i), "s0", _job_suffix(i, B))
                ),
            )
            print(f"{args.nodes} nodes: {n} series loaded in {time.perf_counter() - began:.0f} s")
            q = urllib.parse.urlencode(
                {"match[]": '{__name__=~"gpufeed_.+"}', "start": s, "end": e}
            )
            try:
                with urllib.request.urlopen(f"{url}/api/v1/label/instance/values?{q}", timeout=120):
                    old = "answered (fewer series than the limit: the check proves little)"
            except urllib.error.HTTPError as err:
                old = f"HTTP {err.code}"
            print(f"one label-values call over every series (the old discovery): {old}")
            try:
                began = time.perf_counter()
                insts = promql.instances(url, s, e, "")
                t_insts = time.perf_counter() - began
                began = time.perf_counter()
                jobs = promql.instance_jobs(url, s, e, "", insts)
                t_jobs = time.perf_counter() - began
                began = time.perf_counter()
                widest = promql.query_every_instance(
                    url, WIDEST, "", (e - 4 * args.step, e), args.step, promql.DEFAULT_RETRY,
                    matrix.decoder(),
                )  # fmt: skip
                t_widest = time.perf_counter() - began
            except promql.PromError as err:
                print(f"FAILED: {err}")
                return 1
    batches = -(-len(insts) // promql.JOB_SERIES_BATCH)
    print(
        f"discovery: {len(insts)} instances in {t_insts:.1f} s ({len(promql.USED_METRICS)} "
        f"calls), {len(jobs)} (instance, job) pairs in {t_jobs:.1f} s ({batches} calls); "
        f"a fleet cycle's query of {WIDEST}: {len(widest)} series in {t_widest:.1f} s"
    )
    if len(insts) != args.nodes:
        print(f"FAILED: {len(insts)} instances found, {args.nodes} loaded")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
