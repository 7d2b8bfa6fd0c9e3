"""The `gpufeed` command: one entry point, a subcommand per module.

Each module in SUBCOMMAND_MODULES exposes `register(subparsers)` and sets `func` on its
parser; modules are imported only when the CLI runs, so `import gpufeed` stays light.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpufeed import __version__

SUBCOMMAND_MODULES = [
    "gpufeed.agent.command",
    "gpufeed.run_cli",
    "gpufeed.correlator.analyze_cmd",
    "gpufeed.correlator.windows_cmd",
    "gpufeed.fleet.command",
    "gpufeed.scheduler.command",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpufeed",
        description="gpufeed: find out why your GPUs are not busy.",
    )
    parser.add_argument("--version", action="version", version=f"gpufeed {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    code = func(args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
