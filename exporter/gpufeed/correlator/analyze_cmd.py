"""`gpufeed analyze`: windows and causes from a recorded trace or a Prometheus server."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from gpufeed import vocabulary
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.node import NodeSeries


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "analyze",
        help="tag underutilization windows in a trace file or a Prometheus time range",
        description=(
            "Reads a trace (OpenMetrics with timestamps, ending in '# EOF') or queries a "
            "Prometheus-compatible server, and writes one JSON object per window "
            "(instance, gpu, uuid, job_id, start, end, cause, confidence, "
            "mean_utilization, evidence). The whole input is read before anything is "
            "written: a malformed or truncated trace is an error naming its line, with no "
            "output."
        ),
    )
    p.add_argument("trace", nargs="?", help="trace file (.om); omit with --prometheus")
    p.add_argument(
        "--prometheus", metavar="URL", help="Prometheus/VictoriaMetrics/Thanos/Mimir base URL"
    )
    p.add_argument("--start", help="range start: unix seconds or RFC 3339 (with --prometheus)")
    p.add_argument("--end", help="range end: unix seconds or RFC 3339 (with --prometheus)")
    p.add_argument(
        "--match",
        default="",
        help="extra selector for every query, e.g. '{cluster=\"a\"}' (with --prometheus)",
    )
    p.add_argument(
        "--step",
        type=float,
        default=15.0,
        help="query resolution in seconds (default 15; with --prometheus)",
    )
    p.add_argument(
        "--format",
        choices=("jsonl", "table"),
        default="jsonl",
        help="jsonl: one JSON object per window (default); table: for people",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=vocabulary.DEFAULT_THRESHOLD_RATIO,
        help="a GPU below this utilization (0..1) is underutilized (default %(default)g)",
    )
    p.add_argument(
        "--min-window",
        type=float,
        default=vocabulary.DEFAULT_MIN_WINDOW_SECONDS,
        help="seconds a GPU must stay underutilized before a window opens (default %(default)g)",
    )
    p.add_argument(
        "--merge-gap",
        type=float,
        default=vocabulary.DEFAULT_MERGE_GAP_SECONDS,
        help="recoveries shorter than this many seconds stay inside the window "
        "(default %(default)g)",
    )
    p.add_argument(
        "--output", "-o", metavar="FILE", help="write here (atomically) instead of stdout"
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes for reading the trace and analysing nodes (default: up to 2)",
    )
    p.set_defaults(func=run)


def warn_incomplete(trace: str, node: NodeSeries) -> None:
    """One stderr line when the recorder left samples out of the trace: the windows are
    still written, but must not pass for an analysis of complete data."""
    left_out = {fam: int(s.vs[-1]) for fam, s in node.dropped.items() if s.vs and s.vs[-1] > 0}
    if not left_out:
        return
    where = f" (instance {node.instance!r})" if node.instance else ""
    families = ", ".join(f"{fam}: {n}" for fam, n in sorted(left_out.items()))
    print(
        f"gpufeed analyze: warning: {trace}{where} is incomplete: the recorder left out "
        f"{sum(left_out.values())} samples ({families}); windows that need them may be "
        "missing or wrong",
        file=sys.stderr,
    )


def run(args: argparse.Namespace) -> int:
    from gpufeed.correlator.feeds.analyze import analyze_nodes
    from gpufeed.correlator.outputs.output import write_result

    problem = _usage_problem(args)
    if problem:
        print(f"gpufeed analyze: {problem}", file=sys.stderr)
        return 2
    params = WindowParams(args.threshold, args.min_window, args.merge_gap)
    if args.prometheus:
        from gpufeed.correlator.feeds.promql import PromError, load_range, parse_time

        if args.trace:
            print("gpufeed analyze: give a trace file or --prometheus, not both", file=sys.stderr)
            return 2
        if not args.start or not args.end:
            print("gpufeed analyze: --prometheus needs --start and --end", file=sys.stderr)
            return 2
        try:
            start, end = parse_time(args.start), parse_time(args.end)
            nodes = load_range(args.prometheus, start, end, args.step, args.match)
        except (PromError, ValueError) as e:
            print(f"gpufeed analyze: {e}", file=sys.stderr)
            return 1
    else:
        from gpufeed.trace.reader import TraceError, read_trace

        if not args.trace:
            print("gpufeed analyze: give a trace file or --prometheus URL", file=sys.stderr)
            return 2
        try:
            nodes = read_trace(args.trace, jobs=args.jobs).nodes
        except (TraceError, OSError) as e:
            print(f"gpufeed analyze: {e}", file=sys.stderr)
            return 1
        for node in nodes.values():
            warn_incomplete(args.trace, node)
    windows = analyze_nodes(nodes.values(), params, jobs=args.jobs)
    try:
        write_result(windows, args.format, args.output)
    except OSError as e:
        print(f"gpufeed analyze: --output {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _usage_problem(args: argparse.Namespace) -> str:
    """What is wrong with the flags, in one line; "" when nothing is. NaN fails every
    comparison, so each check is written to fail on it."""
    if not 0.0 < args.threshold <= 1.0:
        return "--threshold must be in (0, 1]"
    if not (math.isfinite(args.min_window) and args.min_window > 0):
        return "--min-window must be a positive number of seconds"
    if not (math.isfinite(args.merge_gap) and args.merge_gap >= 0):
        return "--merge-gap must be zero or a positive number of seconds"
    if not (math.isfinite(args.step) and args.step > 0):
        return "--step must be a positive number of seconds"
    if args.jobs < 1:
        return "--jobs must be at least 1"
    if args.output and args.output != "-":
        # checked before the analysis, which can take minutes
        d = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(d):
            return f"--output {args.output}: directory {d} does not exist"
        if not os.access(d, os.W_OK):
            return f"--output {args.output}: directory {d} is not writable"
    return ""
