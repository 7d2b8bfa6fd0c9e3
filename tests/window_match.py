"""Windows analysed from a TSDB against the windows of the same trace file.

VictoriaMetrics stores a value as a decimal of at most 12 significant digits, and a block
that mixes magnitudes keeps fewer for its smaller values. Which values share a block depends
on how an import was split into parts and merged, i.e. on timing: two runs on the same data
can read back different last digits. A byte counter at 1e13 comes back a few bytes off, and
a rate from two such samples up to ~1e-4 relative off (a CI run read a checkpoint's
`write_burst_x_baseline` as 138.05 for the file's 138.03). Prometheus keeps float64 and
needs no tolerance; answers of one settled TSDB are compared byte for byte.

So a TSDB's windows match a file's when every window is the same (instance, GPU, job,
start, end, cause, evidence keys), every number agrees to `REL_TOL` (1e-3: ten times the
largest drift seen; a real difference in reasoning moves a window or a cause), and every
string agrees once its numbers are masked (a summary prints the evidence rounded, and a
value on a rounding edge may print one digit apart).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence

Windows = str | bytes | Sequence[Mapping[str, object]]  # JSON lines, or `Window.to_json()`s

REL_TOL = 1e-3
ABS_TOL = 1e-6  # utilization and shares near 0
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, float | int) and isinstance(b, float | int):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(a, str) and isinstance(b, str):
        return _NUMBER.sub("#", a) == _NUMBER.sub("#", b)
    return a == b


def _identity(window: Mapping[str, object]) -> tuple[object, ...]:
    return tuple(window.get(k) for k in ("instance", "gpu", "job_id", "start", "end", "cause"))


def _parsed(windows: Windows) -> list[Mapping[str, object]]:
    if isinstance(windows, bytes):
        windows = windows.decode()
    if isinstance(windows, str):
        return [json.loads(x) for x in windows.splitlines()]
    return list(windows)


def window_differences(want: Windows, got: Windows, limit: int = 3) -> list[str]:
    """What differs between two lists of windows, in order (empty: they match); at most
    `limit` differences, each naming the window and showing both."""
    a, b = _parsed(want), _parsed(got)
    out: list[str] = []
    if len(a) != len(b):
        out.append(f"{len(a)} windows wanted, {len(b)} got")
    for x, y in zip(a, b, strict=False):
        if not (_identity(x) == _identity(y) and _close(x, y)):
            out.append(f"window {_identity(x)}:\n  want {json.dumps(x)}\n  got  {json.dumps(y)}")
        if len(out) >= limit:
            break
    return out


def assert_same_windows(want: Windows, got: Windows) -> None:
    diffs = window_differences(want, got)
    assert not diffs, "\n".join(diffs)
