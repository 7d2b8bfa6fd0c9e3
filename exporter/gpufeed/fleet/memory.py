"""One malloc arena for the fleet service (glibc), set before its first thread starts.

A cycle reads its answers in worker threads (fleet/carry.py), and glibc gives each thread
its own heap (up to 8 per core): the answers' bodies and lists land there, and what a
thread frees stays in its heap. Measured at 64 nodes x 8 GPUs, a steady cycle's process
grew 78 MiB above its base with 8 fetch threads, 54 MiB with one arena (1 GiB at 1,000
nodes is the target), for no measurable change in CPU time: the threads mostly wait for
the TSDB, and the engines run in one thread anyway. Elsewhere (musl, macOS) nothing is
changed. Equivalent to MALLOC_ARENA_MAX=1 in the service's environment.
"""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """True when glibc took the setting; False where there is no glibc `mallopt`."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))
