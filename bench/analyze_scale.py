"""`python -m bench.analyze_scale`: streamed `gpufeed analyze --prometheus` over a simulated
fleet in a real VictoriaMetrics (Debian's `victoria-metrics`, started here on an ephemeral
port with its own storage): peak memory, wall time per fleet size, the TSDB's cost, and
the windows checked against per-node file analysis.

The fleet: `--base-nodes` distinct simulated nodes (`gpufeed.simulate.tracegen`, every
cause in several guises), each `--hours` long; a larger fleet repeats them under new
instance names, keeping their job ids, so node i and node i + base run one multi-node job
(the engine's work per node is the same as for a distinct node; the TSDB stores every
series separately); jobs span at most 4 nodes (further copies get new job ids). Only the series the correlator reads are loaded (`USED_METRICS`: 28
families, about 200 series per 8-GPU node), through `/api/v1/import` (JSON lines, one
series with all its points per line: the values' text is built once per base series).

The reference, in the same run: each base node written to its own trace file and
analysed by `gpufeed analyze FILE`. A fleet's expected windows are those, renamed; the
streamed output must equal them byte for byte, else the benchmark fails (exit 1).
Figures: peak PSS of the analysing process tree (main + workers, sampled every 0.2 s),
wall time, seconds per node, and queries and points fetched (from `--progress`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from gpufeed.correlator.engine.node import USED_METRICS
from gpufeed.simulate.tracegen import DEFAULT_START_UNIX, NodeData, instance_name, simulate_node
from gpufeed.trace.format import EOF_LINE, om_labels, om_timestamp
from tests.victoria import data_bytes, import_lines, victoria
from tests.window_match import window_differences

USED = frozenset(USED_METRICS)
JOB_NODES = 4  # nodes a replicated job spans
GPUFEED = [sys.executable, "-m", "gpufeed"]


@dataclass(frozen=True, slots=True)
class SizeResult:
    nodes: int
    hours: float
    load_seconds: float  # importing the nodes this size added
    samples_loaded: int  # in the TSDB for this size
    wall_seconds: float
    seconds_per_node: float
    peak_pss_mib: float
    queries: int
    points: int
    windows: int
    same_bytes_as_file: bool
    same_windows_as_file: bool  # numbers to the TSDB's precision (tests/window_match.py)


@dataclass(frozen=True, slots=True)
class _Base:
    """One base node's used series: (sample name, labels, JSON tail of values+timestamps)."""

    instance: str
    series: list[tuple[str, tuple[tuple[str, str], ...], str, int]]


def _base(node: NodeData, step_s: float) -> _Base:
    out = []
    for d, vals in zip(node.defs, node.values, strict=True):
        if d.sample not in USED:
            continue
        pts = [(k, v) for k, v in enumerate(vals) if v == v]
        if not pts:
            continue
        ts = ",".join(str(int((DEFAULT_START_UNIX + k * step_s) * 1000)) for k, _ in pts)
        vs = ",".join(repr(v) for _, v in pts)
        out.append((d.sample, d.labels, f'"values":[{vs}],"timestamps":[{ts}]}}\n', len(pts)))
    return _Base(node.instance, out)


JOB_ID = re.compile(r"\b(job-\d+-\d+)\b")


def _job_suffix(node: int, base_nodes: int) -> str:
    """Replicas keep their base node's job ids in groups of JOB_NODES nodes (node i and
    i + base_nodes ... run one multi-node job); further copies get new ids."""
    k = node // (base_nodes * JOB_NODES)
    return f"-g{k}" if k else ""


def _lines(
    base: _Base, instance: str, group: str, job_suffix: str, part: str = ""
) -> Iterator[str]:
    """`part`, when given, is a `fleet_part` label on every series of the node: what a
    cluster's scrape config sets per target (cluster, rack), for a split with `--match`."""
    extra = {"fleet_part": part} if part else {}
    for sample, labels, tail, _ in base.series:
        metric = {
            "__name__": sample,
            **dict(labels),
            "instance": instance,
            "scale_set": group,
            **extra,
        }
        if job_suffix and "job_id" in metric:
            metric["job_id"] += job_suffix
        yield '{"metric":' + json.dumps(metric, separators=(",", ":")) + "," + tail


def _write_node_trace(path: Path, node: NodeData, step_s: float) -> None:
    """One node's used series as a trace file (the contract's format)."""
    inst = (("instance", node.instance),)
    with path.open("w", encoding="utf-8", buffering=1 << 22) as f:
        for d, vals in zip(node.defs, node.values, strict=True):
            if d.sample not in USED:
                continue
            prefix = d.sample + om_labels(d.labels + inst) + " "
            f.write(
                "".join(
                    f"{prefix}{v!r} {om_timestamp(DEFAULT_START_UNIX + k * step_s)}\n"
                    for k, v in enumerate(vals)
                    if v == v
                )
            )
        f.write(EOF_LINE)


def _peak_pss(proc: psutil.Process, stop: threading.Event, out: list[float]) -> None:
    peak = 0.0
    while not stop.wait(0.2):
        total = 0.0
        try:
            for p in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += p.memory_full_info().pss
        except psutil.NoSuchProcess:
            break
        peak = max(peak, total)
    out.append(peak)


def _measured_run(argv: Sequence[str]) -> tuple[float, float, str]:
    """(wall seconds, peak PSS bytes of the process tree, stderr) of a gpufeed command."""
    began = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*GPUFEED, *argv], stderr=err)
        ps = psutil.Process(proc.pid)
        stop, got = threading.Event(), []
        watcher = threading.Thread(target=_peak_pss, args=(ps, stop, got), daemon=True)
        watcher.start()
        code = proc.wait()
        wall = time.perf_counter() - began
        stop.set()
        watcher.join()
        err.seek(0)
        text = err.read().decode(errors="replace")
    if code != 0:
        raise SystemExit(f"analyze_scale: `gpufeed {' '.join(argv)}` failed ({code}):\n{text}")
    return wall, got[0] if got else 0.0, text


def _rename(ref: str, old: str, new: str, job_suffix: str) -> str:
    out = ref.replace(f'"instance": {json.dumps(old)}', f'"instance": {json.dumps(new)}')
    return JOB_ID.sub(lambda m: m.group(1) + job_suffix, out) if job_suffix else out


def _show_difference(want: str, got: str) -> None:
    a, b = want.splitlines(), got.splitlines()
    print(f"  windows: {len(a)} from the files, {len(b)} streamed; first difference:")
    insts = {json.loads(x)["instance"] for x in a} | {json.loads(x)["instance"] for x in b}
    for inst in sorted(insts):
        mine = [x for x in a if json.loads(x)["instance"] == inst]
        theirs = [x for x in b if json.loads(x)["instance"] == inst]
        if mine != theirs:
            print(f"  {inst}: {len(mine)} windows from its file, {len(theirs)} streamed")
    for x, y in zip(a, b, strict=False):
        if x != y:
            print(f"  file:     {x[:400]}\n  streamed: {y[:400]}")
            return


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="16,64,256", help="fleet sizes, ascending")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--base-nodes", type=int, default=8, help="distinct simulated nodes")
    ap.add_argument("--step", type=float, default=15.0, help="scrape interval, seconds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2, help="analyze --jobs")
    ap.add_argument("--batch-instances", type=int, default=8)
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    ap.add_argument("--rss-limit-mib", type=float, default=2048.0, help="fail above this")
    args = ap.parse_args(argv)
    sizes = sorted(int(x) for x in args.sizes.split(","))
    B = args.base_nodes
    duration = args.hours * 3600.0
    start = int(DEFAULT_START_UNIX)
    end = start + int(duration // args.step) * args.step

    with tempfile.TemporaryDirectory(prefix="gpufeed-scale-") as tmp:
        d = Path(tmp)
        # the reference: every base node generated, written as a trace, analysed from the file
        t0 = time.perf_counter()
        bases: list[_Base] = []
        refs: list[str] = []
        file_seconds = 0.0
        for i in range(B):
            node = simulate_node(i, duration_s=duration, step_s=args.step, seed=args.seed)
            bases.append(_base(node, args.step))
            trace, out = d / "node.om", d / "node.jsonl"
            _write_node_trace(trace, node, args.step)
            del node
            began = time.perf_counter()
            subprocess.run([*GPUFEED, "analyze", str(trace), "-o", str(out)], check=True)
            file_seconds += time.perf_counter() - began
            refs.append(out.read_text())
            trace.unlink()
        prep = time.perf_counter() - t0
        per_node = sum(len(b.series) for b in bases) / B
        print(
            f"{B} base nodes x {args.hours:g} h at {args.step:g} s: {per_node:.0f} used series "
            f"per node, generated and file-analysed in {prep:.0f} s; per-node file analysis "
            f"{file_seconds / B:.2f} s/node (the reference)",
            flush=True,
        )
        results: list[SizeResult] = []
        with victoria(d / "vm", d / "vm.log") as url:
            loaded = 0
            for gi, n in enumerate(sizes):
                group = f"s{gi}"
                began = time.perf_counter()
                import_lines(
                    url,
                    (
                        line
                        for i in range(loaded, n)
                        for line in _lines(bases[i % B], instance_name(i), group, _job_suffix(i, B))
                    ),
                )
                load_s = time.perf_counter() - began
                loaded = n
                samples = sum(s[3] for i in range(n) for s in bases[i % B].series)
                match = '{scale_set=~"' + "|".join(f"s{k}" for k in range(gi + 1)) + '"}'
                out = d / f"fleet-{n}.jsonl"
                wall, pss, err = _measured_run(
                    [
                        "analyze",
                        "--prometheus",
                        url,
                        "--start",
                        str(start),
                        "--end",
                        str(end),
                        "--step",
                        f"{args.step:g}",
                        "--match",
                        match,
                        "--jobs",
                        str(args.jobs),
                        "--batch-instances",
                        str(args.batch_instances),
                        "--progress",
                        "-o",
                        str(out),
                    ]
                )
                costs = re.findall(r"\((\d+) queries, (\d+) points\)", err)
                want = "".join(
                    _rename(refs[i % B], instance_name(i % B), instance_name(i), _job_suffix(i, B))
                    for i in range(n)
                )
                got = out.read_text()
                r = SizeResult(
                    nodes=n,
                    hours=args.hours,
                    load_seconds=round(load_s, 1),
                    samples_loaded=samples,
                    wall_seconds=round(wall, 1),
                    seconds_per_node=round(wall / n, 2),
                    peak_pss_mib=round(pss / 2**20, 1),
                    queries=sum(int(q) for q, _ in costs),
                    points=sum(int(p) for _, p in costs),
                    windows=got.count("\n"),
                    same_bytes_as_file=got == want,
                    same_windows_as_file=not window_differences(want, got),
                )
                results.append(r)
                if not r.same_windows_as_file:
                    _show_difference(want, got)
                print(
                    f"{n:4d} nodes: loaded {samples / 1e6:.1f} M samples in {load_s:.0f} s; "
                    f"analyze {wall:.1f} s ({wall / n:.2f} s/node, "
                    f"{wall / n / (file_seconds / B):.2f}x the per-node file analysis), peak "
                    f"PSS {r.peak_pss_mib:.0f} MiB, {r.queries} queries, "
                    f"{r.points / 1e6:.1f} M points, {r.windows} windows; as the files: "
                    f"same bytes {r.same_bytes_as_file}, same windows {r.same_windows_as_file}",
                    flush=True,
                )
            print(f"TSDB data on disk: {data_bytes(d / 'vm') / 2**20:.0f} MiB")
    if len(results) > 1:
        a, b = results[0], results[-1]
        slope = math.log(b.wall_seconds / a.wall_seconds) / math.log(b.nodes / a.nodes)
        print(f"time ~ nodes^{slope:.2f} from {a.nodes} to {b.nodes} nodes (1.00 = linear)")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    bad = [
        r.nodes
        for r in results
        if not r.same_windows_as_file or r.peak_pss_mib > args.rss_limit_mib
    ]
    if bad:
        print(f"FAILED at {bad} nodes: windows differ from the files, or memory over the limit")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
