"""JSON that every parser accepts: Python's json writes NaN and Infinity, which are not JSON
(browsers, jq and Go reject the whole document). A value that is not a finite number is
written as null: absent, not zero."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float (in dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Compact, strict JSON (raises ValueError should a non-finite number slip through)."""
    return json.dumps(finite(value), allow_nan=False, separators=(",", ":"))
