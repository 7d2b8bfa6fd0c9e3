"""The fleet service's heap: one malloc arena (glibc), set before its first thread starts,
and the carried engines kept out of Python's cyclic garbage collector's way.

A cycle reads its answers in worker threads (fleet/carry.py), and glibc gives each thread
its own heap (up to 8 per core): the answers' bodies and lists land there, and what a
thread frees stays in its heap. Measured at 64 nodes x 8 GPUs, when a cycle had 8 fetch
threads (`--fleet.queries` is 2 by default since), a steady cycle's process grew 78 MiB
above its base with 8 arenas, 54 MiB with one (1 GiB at 1,000 nodes is the target), for no
measurable change in CPU time: one thread at a time holds the GIL anyway, and the engines
run in one thread. Elsewhere (musl, macOS) nothing is changed. Equivalent to
MALLOC_ARENA_MAX=1 in the service's environment.

The collector: a replica carries millions of container objects (columns, engine state,
column caches: about 3,000 per node), and each of the collector's full passes, which a
cycle's own allocations trigger, walks all of them: a third of a steady cycle's CPU at 128
nodes. What survives a cycle is long-lived by construction, so after each cycle the
service freezes it (`gc.freeze`: moved where the collector does not look; refcounting
still frees it). A frozen cycle of references would never be collected: when epochs were
let go (`FleetEngines.take_dropped`, once per lookback, or a reset), everything is thawed
and collected once, after the cycle's results are durable, before it is frozen again.
"""

from __future__ import annotations

import ctypes
import gc

M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """True when glibc took the setting; False where there is no glibc `mallopt`."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))


def freeze_survivors(collect_first: bool) -> None:
    """Freezes every object alive now (see above); `collect_first`: thaws and collects all
    first (what was let go since the last freeze may hold reference cycles)."""
    if collect_first:
        gc.unfreeze()
        gc.collect()
    gc.freeze()
