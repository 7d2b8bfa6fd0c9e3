"""`gpufeed analyze`: windows and causes from a recorded trace or a Prometheus server."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from gpufeed import vocabulary
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.feeds import access
from gpufeed.correlator.feeds.promql import DEFAULT_RETRY
from gpufeed.correlator.feeds.stream import DEFAULT_BATCH_INSTANCES, DEFAULT_CHUNK_SECONDS


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "analyze",
        help="tag underutilization windows in a trace file or a Prometheus time range",
        description=(
            "Reads a trace (OpenMetrics with timestamps, ending in '# EOF'; plain, or "
            "gzip- or zstd-compressed, streamed) or queries a "
            "Prometheus-compatible server, and writes one JSON object per window "
            "(instance, gpu, uuid, job_id, start, end, cause, confidence, "
            "mean_utilization, evidence). Nothing is written unless the whole input was "
            "analysed: a malformed or truncated trace is an error naming its line, a "
            "server that stays down an error naming the batch, with no output. From a "
            "server, instances are fetched and analysed in batches and time chunks "
            "(bounded memory) and can be split into shards (--shard K/N, --merge)."
        ),
    )
    p.add_argument(
        "trace",
        nargs="?",
        help="trace file (.om), or gzip- or zstd-compressed (.om.gz, .om.zst; told by its "
        "first bytes, read as a stream; zstd needs the zstandard package); omit with "
        "--prometheus",
    )
    p.add_argument(
        "--prometheus", metavar="URL", help="Prometheus/VictoriaMetrics/Thanos/Mimir base URL"
    )
    access.add_flags(p.add_argument)
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
        "--shard",
        metavar="K/N",
        default="1/1",
        help="analyse only the K-th of N shards of the instances (with --prometheus; the "
        "instances of one job stay in one shard); merge the N outputs with --merge",
    )
    p.add_argument(
        "--batch-instances",
        type=int,
        default=DEFAULT_BATCH_INSTANCES,
        help="instances fetched and analysed together (default %(default)d; with "
        "--prometheus: memory grows with it, a job's instances are never split)",
    )
    p.add_argument(
        "--chunk",
        type=float,
        default=DEFAULT_CHUNK_SECONDS,
        metavar="SECONDS",
        help="seconds of data fetched at a time per batch (default %(default)g; with "
        "--prometheus: memory grows with it, the windows do not change)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRY.attempts - 1,
        help="times a failed query (refused, timed out, 5xx, 429) is asked again, with "
        "backoff from 1 s to 16 s, before the run fails (default %(default)d)",
    )
    p.add_argument(
        "--query-timeout",
        type=float,
        default=DEFAULT_RETRY.timeout_seconds,
        metavar="SECONDS",
        help="seconds one query may take (default %(default)g)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="one line on stderr as each batch finishes (with --prometheus)",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="FILE",
        help="merge the jsonl outputs of the shards of one run (in any order) into the "
        "output of the unsplit run, byte for byte",
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
    from gpufeed.correlator.job.culprit import correlate_jobs
    from gpufeed.correlator.outputs.output import write_result

    problem = _usage_problem(args)
    if problem:
        print(f"gpufeed analyze: {problem}", file=sys.stderr)
        return 2
    params = WindowParams(args.threshold, args.min_window, args.merge_gap)
    if args.merge:
        if args.trace or args.prometheus:
            print("gpufeed analyze: --merge takes windows files only", file=sys.stderr)
            return 2
        return _merge(args.merge, args.format, args.output)
    if args.prometheus:
        if args.trace:
            print("gpufeed analyze: give a trace file or --prometheus, not both", file=sys.stderr)
            return 2
        if not args.start or not args.end:
            print("gpufeed analyze: --prometheus needs --start and --end", file=sys.stderr)
            return 2
        return _stream(args, params)
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
    # the job level: a multi-node job's victims wait for a culprit on another node
    windows = correlate_jobs(nodes.values(), windows, params.threshold_ratio)
    try:
        write_result(windows, args.format, args.output)
    except OSError as e:
        print(f"gpufeed analyze: --output {args.output}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _stream(args: argparse.Namespace, params: WindowParams) -> int:
    """The streamed Prometheus analysis (`correlator.stream`), spooled beside the output."""
    import tempfile

    from gpufeed.correlator.feeds.batches import parse_shard
    from gpufeed.correlator.feeds.promql import PromError, Retry, parse_time
    from gpufeed.correlator.feeds.stream import BatchError, StreamConfig, plan, run_batches

    def progress(line: str) -> None:
        print(f"gpufeed analyze: {line}", file=sys.stderr, flush=True)

    try:
        shard, shards = parse_shard(args.shard)
    except ValueError as e:
        print(f"gpufeed analyze: {e}", file=sys.stderr)
        return 2
    try:
        url = access.server_url(args.prometheus, args)
    except access.AccessError as e:
        print(f"gpufeed analyze: {e}", file=sys.stderr)
        return 2
    try:
        cfg = StreamConfig(
            url=url,
            start_seconds=parse_time(args.start),
            end_seconds=parse_time(args.end),
            step_seconds=args.step,
            match=args.match,
            params=params,
            retry=Retry(attempts=args.retries + 1, timeout_seconds=args.query_timeout),
            batch_instances=args.batch_instances,
            chunk_seconds=args.chunk,
            shard=shard,
            shards=shards,
        )
        batches = plan(cfg)
    except ValueError as e:
        print(f"gpufeed analyze: {e}", file=sys.stderr)
        return 1
    except PromError as e:
        print(f"gpufeed analyze: finding the instances: {e}", file=sys.stderr)
        return 1
    if args.progress:
        n = sum(len(b.instances) for b in batches)
        progress(f"shard {shard}/{shards}: {n} instances in {len(batches)} batches")
    out_dir = os.path.dirname(os.path.abspath(args.output)) if args.output else None
    with tempfile.TemporaryDirectory(prefix=".gpufeed-spool-", dir=out_dir) as spool:
        try:
            paths = run_batches(cfg, batches, spool, args.jobs, progress if args.progress else None)
        except BatchError as e:
            print(f"gpufeed analyze: {e}; nothing written", file=sys.stderr)
            return 1
        return _merge(paths, args.format, args.output)


def _merge(paths: list[str], fmt: str, output: str | None) -> int:
    import io

    from gpufeed.correlator.engine.window import Window
    from gpufeed.correlator.outputs.merge import MergeError, merge_files
    from gpufeed.correlator.outputs.output import open_result
    from gpufeed.correlator.outputs.table import format_table

    try:
        with open_result(output) as f:
            if fmt == "jsonl":
                merge_files(paths, f)
            else:
                buf = io.StringIO()
                merge_files(paths, buf)
                rows = [Window.from_json(json.loads(x)) for x in buf.getvalue().splitlines()]
                f.write(format_table(rows))
    except MergeError as e:
        print(f"gpufeed analyze: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f"--output {output}" if output else "merge"
        print(f"gpufeed analyze: {where}: {e.strerror or e}", file=sys.stderr)
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
    if args.batch_instances < 1:
        return "--batch-instances must be at least 1"
    if not (math.isfinite(args.chunk) and args.chunk >= args.step):
        return "--chunk must be a number of seconds of at least one --step"
    if args.retries < 0:
        return "--retries must be zero or more"
    if not (math.isfinite(args.query_timeout) and args.query_timeout > 0):
        return "--query-timeout must be a positive number of seconds"
    if args.output and args.output != "-":
        # checked before the analysis, which can take minutes
        d = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(d):
            return f"--output {args.output}: directory {d} does not exist"
        if not os.access(d, os.W_OK):
            return f"--output {args.output}: directory {d} is not writable"
    return ""
