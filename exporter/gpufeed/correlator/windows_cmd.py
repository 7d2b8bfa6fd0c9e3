"""`gpufeed windows`: the agent's recent and open windows as a table."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

from gpufeed.correlator.window import Window

# The agent's default listen port (gpufeed.agent.DEFAULT_PORT; not imported, to keep this
# command light; a test checks that the two agree).
DEFAULT_AGENT = "http://localhost:9842"


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "windows",
        help="show recent and open underutilization windows of an agent",
        description="Fetches /api/windows from an agent (or reads a windows log) and prints a table.",
    )
    p.add_argument(
        "--agent", default=DEFAULT_AGENT, help=f"agent base URL (default {DEFAULT_AGENT})"
    )
    p.add_argument("--log", metavar="FILE", help="read this windows log instead of asking an agent")
    p.add_argument("--limit", type=int, default=50, help="closed windows to show (default 50)")
    p.add_argument(
        "--format",
        choices=("table", "jsonl"),
        default="table",
        help="table (default), or one JSON object per window as `gpufeed analyze` writes",
    )
    p.set_defaults(func=run)


def fetch(agent: str, limit: int) -> tuple[list[Window], list[Window], bool]:
    """Closed and open windows from an agent, and whether the agent is a simulated node."""
    url = agent.rstrip("/") + f"/api/windows?limit={limit}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    closed = [Window.from_json(d) for d in body.get("windows", [])]
    open_ = [Window.from_json(d, open_=True) for d in body.get("open", [])]
    return closed, open_, bool(body.get("simulated", False))


def run(args: argparse.Namespace) -> int:
    from gpufeed.correlator.output import render

    try:
        if args.log:
            from gpufeed.correlator.windowlog import read_log

            if not os.path.exists(args.log):  # read_log skips missing files: say so here
                raise FileNotFoundError(f"{args.log}: no such windows log")
            closed = list(read_log(args.log))[-args.limit :] if args.limit > 0 else []
            open_: list[Window] = []
            simulated = False
        else:
            closed, open_, simulated = fetch(args.agent, args.limit)
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        print(f"gpufeed windows: cannot read windows: {e}", file=sys.stderr)
        return 1
    if simulated:
        print("SIMULATED NODE: these windows come from generated data.", file=sys.stderr)
    sys.stdout.write(render([*closed, *open_], args.format))
    return 0
