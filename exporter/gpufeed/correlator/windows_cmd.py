"""`gpufeed windows`: the agent's recent and open windows as a table."""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

from gpufeed.correlator.engine.window import Window

# The agent's default listen port (gpufeed.agent.command.DEFAULT_PORT; not imported, to keep this
# command light; a test checks that the two agree).
DEFAULT_AGENT = "http://localhost:9842"
DEADLINE_SECONDS = 10.0  # for the whole exchange with the agent
MAX_REPLY_BYTES = 64 * 1024 * 1024  # /api/windows at its largest limit is a few MB


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
    p.add_argument(
        "--timeout",
        type=float,
        default=DEADLINE_SECONDS,
        metavar="SECONDS",
        help=f"give up on the agent after this long, all told (default {DEADLINE_SECONDS:g})",
    )
    p.add_argument("--limit", type=int, default=50, help="closed windows to show (default 50)")
    p.add_argument(
        "--format",
        choices=("table", "jsonl"),
        default="table",
        help="table (default), or one JSON object per window as `gpufeed analyze` writes",
    )
    p.set_defaults(func=run)


class ReplyError(ValueError):
    """The agent's reply is not what /api/windows returns; the message says how."""


def fetch(
    agent: str, limit: int, deadline_seconds: float = DEADLINE_SECONDS
) -> tuple[list[Window], list[Window], bool]:
    """Closed and open windows from an agent, and whether the agent is a simulated node.

    The whole exchange has one deadline (a server that trickles a byte at a time never
    trips a per-read timeout), and the reply is read up to MAX_REPLY_BYTES. Raises
    OSError (no answer) or ReplyError (a malformed one)."""
    url = agent.rstrip("/") + f"/api/windows?limit={limit}"
    done: dict[str, Any] = {}

    def work() -> None:
        try:
            done["body"] = _get(url, deadline_seconds)
        except BaseException as e:  # handed to the waiting thread
            done["error"] = e

    t = threading.Thread(target=work, name="gpufeed-windows-fetch", daemon=True)
    t.start()
    t.join(deadline_seconds)
    if t.is_alive():
        raise TimeoutError(f"{url}: no complete answer within {deadline_seconds:g}s")
    if "error" in done:
        raise done["error"]
    return parse_reply(done["body"])


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            data: bytes = r.read(MAX_REPLY_BYTES + 1)
            expected = r.headers.get("Content-Length", "")
    except http.client.HTTPException as e:  # a broken status line or headers
        raise ReplyError(f"{url}: broken reply ({type(e).__name__})") from None
    if expected.isdigit() and len(data) < int(expected):
        raise ReplyError(f"{url}: short reply ({len(data)} of {expected} bytes)")
    if len(data) > MAX_REPLY_BYTES:
        raise ReplyError(f"{url}: reply larger than {MAX_REPLY_BYTES} bytes")
    return data


def parse_reply(data: bytes) -> tuple[list[Window], list[Window], bool]:
    try:
        body = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise ReplyError("reply nested too deeply") from None
    except ValueError as e:  # not UTF-8 or not JSON
        raise ReplyError(f"reply is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise ReplyError(f"reply is a JSON {type(body).__name__}, not an object")
    closed = _windows(body, "windows", open_=False)
    open_ = _windows(body, "open", open_=True)
    return closed, open_, body.get("simulated") is True


def _windows(body: dict[str, Any], key: str, *, open_: bool) -> list[Window]:
    items = body.get(key, [])
    if not isinstance(items, list):
        raise ReplyError(f"reply's {key!r} is not a list")
    out = []
    for i, d in enumerate(items):
        try:
            if not isinstance(d, dict):
                raise TypeError
            w = Window.from_json(d, open_=open_)
        except (KeyError, ValueError, TypeError, AttributeError):
            raise ReplyError(f"reply's {key}[{i}] is not a window") from None
        if not (math.isfinite(w.start_seconds) and math.isfinite(w.end_seconds)):
            raise ReplyError(f"reply's {key}[{i}] has no finite start and end")
        out.append(w)
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def run(args: argparse.Namespace) -> int:
    from gpufeed.correlator.outputs.output import render

    try:
        if args.log:
            from gpufeed.correlator.outputs.windowlog_read import scan_log

            if not os.path.exists(args.log):  # reading skips missing files: say so here
                raise FileNotFoundError(f"{args.log}: no such windows log")
            scan = scan_log(args.log, simulated=None, keep=max(args.limit, 0))
            closed = list(scan.windows) if args.limit > 0 else []
            open_: list[Window] = []
            simulated = scan.simulated_seen > 0
        else:
            if not (math.isfinite(args.timeout) and args.timeout > 0):
                print("gpufeed windows: --timeout must be a positive number", file=sys.stderr)
                return 2
            closed, open_, simulated = fetch(args.agent, args.limit, args.timeout)
    except (urllib.error.URLError, OSError, ReplyError) as e:
        print(f"gpufeed windows: cannot read windows: {e}", file=sys.stderr)
        return 1
    if simulated:
        print("SIMULATED NODE: these windows come from generated data.", file=sys.stderr)
    sys.stdout.write(render([*closed, *open_], args.format))
    return 0
