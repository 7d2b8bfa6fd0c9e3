"""A real agent-side windows log under test: starts the live correlator on a log (the
agent's start path: lock, read back, open-windows record), then closes windows numbered
from `start` through the engine's callback, and reports on stdout:
  up            the correlator started (the log was read back)
  closing N     window N is being handed to the log (said before, so that a kill right
                after the write cannot make the test hand the same number out again)
  durable N     every window up to N is on disk (nothing pending)
It runs until killed, or for `count` windows and then stops cleanly (`done`).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from windowlog_helpers import seq_window


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--start", type=int, required=True)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--max-bytes", type=int, default=4096)
    ap.add_argument("--backups", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cfg = CorrelatorConfig(
        windows_log=args.log,
        windows_log_max_bytes=args.max_bytes,
        windows_log_backups=args.backups,
    )
    proc = CorrelatorProcessor(cfg, interval_seconds=1.0)
    print("up", flush=True)
    seq = args.start
    while not args.count or seq < args.start + args.count:
        print(f"closing {seq}", flush=True)
        proc._closed(seq_window(seq, pad=rng.randrange(200)))  # the engine's on_window
        if proc._log is None:
            proc._open_log()  # what the agent does every REOPEN_EVERY_SECONDS
        elif proc._log.health().pending_windows:
            proc._log.retry()
        if proc._log is not None and not proc._log.health().pending_windows:
            print(f"durable {seq}", flush=True)
        seq += 1
        time.sleep(rng.uniform(0.002, 0.02))
    proc.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
