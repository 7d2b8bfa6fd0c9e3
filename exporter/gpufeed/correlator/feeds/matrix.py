"""A range query's answer decoded for `gpufeed fleet`'s cycles (fleet/carry.py), where
decoding was half of a steady cycle's CPU: every answer repeats each series' labels for a
few new points.

With msgspec (a pinned dependency) the answer is split into its series in one pass, each
series' label set and values left as the answer's own JSON text (`Labels`, bytes): a series
the cycles have routed before is found by the hash of that text, and its labels are never
made into a dictionary; only a new series' are (`labels`). A series' values text
(`[[t,"v"],...]`) is read into two arrays in one go, each number by `float` of its text, as
the offline feeds read it (`+Inf`, `NaN`, `-0` included): no object per point, which kept
the pools of Python's allocator that an answer's 80,000 points had spread over from being
reused (a replica's memory grew by a sixth). Text that is not that plain shape is read by
`json` instead. Without msgspec the standard library decodes the same answers into the same
shape, 3x slower.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Sequence
from typing import Any

Labels = bytes  # a series' label set as JSON text: `{"__name__":"...","gpu":"0",...}`
Matrix = list[tuple[Labels, "array[float]", "array[float]"]]  # labels, timestamps, values
# the answer's top level with `data` replaced by the matrix, read by promql._get_once
Decoder = Callable[[bytes], dict[str, Any]]


def labels(text: Labels) -> dict[str, str]:
    """A series' label set as a dictionary (for a series seen for the first time)."""
    return {str(k): str(v) for k, v in json.loads(text).items()}


def _columns(points: Sequence[Sequence[Any]]) -> tuple[array[float], array[float]]:
    ts = array("d", [p[0] for p in points])  # numbers in the answer already
    return ts, array("d", [float(p[1]) for p in points])


def values(text: bytes) -> tuple[array[float], array[float]]:
    """`[[1700000000,"0.5"],[1700000015,"NaN"]]` as (timestamps, values)."""
    try:
        flat = text[2:-2].replace(b'"', b"").replace(b"],[", b",").split(b",")
        nums = array("d", map(float, flat))
        if len(nums) % 2 == 0:
            return nums[0::2], nums[1::2]
    except ValueError:  # `[]`, white space, another layout: the JSON parser reads it
        pass
    return _columns(json.loads(text))


def decode_stdlib(body: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(body)
    data = doc.get("data")
    if isinstance(data, dict):
        matrix: Matrix = []
        for d in data.get("result", []):
            text = json.dumps(d.get("metric", {}), separators=(",", ":")).encode()
            matrix.append((text, *_columns(d.get("values", []))))
        doc["data"] = matrix
    return doc


def _msgspec_decoder() -> Decoder | None:
    try:
        import msgspec
    except ImportError:
        return None

    # defstruct, not class statements: the module's annotations are strings, which msgspec
    # resolves in the module's namespace, not this function's. Not tracked by the cyclic
    # collector (gc=False: they hold no cycles), which an answer's 8,000 series would wake.
    empty = msgspec.Raw(b"[]")
    series = msgspec.defstruct(
        "Series",
        [("metric", msgspec.Raw, msgspec.Raw(b"{}")), ("values", msgspec.Raw, empty)],
        gc=False,
    )
    data = msgspec.defstruct("Data", [("result", list[series], [])])  # type: ignore[valid-type]
    answer = msgspec.defstruct(
        "Answer",
        [
            ("status", str, ""),
            ("error", str, ""),
            ("warnings", list[str], []),
            ("data", data | None, None),
        ],
    )
    decoder = msgspec.json.Decoder(answer)

    def decode(body: bytes) -> dict[str, Any]:
        a: Any = decoder.decode(body)  # msgspec.DecodeError is a ValueError
        matrix = None
        if a.data is not None:
            matrix = [(bytes(s.metric), *values(bytes(s.values))) for s in a.data.result]
        return {"status": a.status, "error": a.error, "warnings": a.warnings, "data": matrix}

    return decode


def decoder() -> Decoder:
    """msgspec's decoder where it is installed, else the standard library's."""
    return _msgspec_decoder() or decode_stdlib
