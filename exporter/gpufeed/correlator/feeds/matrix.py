"""A range query's answer decoded for `gpufeed fleet`'s cycles (fleet/carry.py), where
decoding was half of a steady cycle's CPU: every answer repeats each series' labels for a
few new points.

With msgspec (a pinned dependency) the answer is decoded against its shape in one pass:
each series' label set stays the answer's own JSON text (`Labels`, bytes), so a series the
cycles have routed before is found by the hash of that text and its labels are never made
into a dictionary; only a new series' are (`labels`). Values stay the answer's strings and
are converted by `float`, as the offline feeds do, so that both read the same numbers
(`+Inf`, `-0`: a schema's own string-to-float conversion reads those otherwise). Without
msgspec the standard library decodes the same answers into the same shape, 3x slower.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

Labels = bytes  # a series' label set as JSON text: `{"__name__":"...","gpu":"0",...}`
Points = Sequence[Sequence[Any]]  # [[unix seconds, "value"], ...]
Matrix = list[tuple[Labels, Points]]
# the answer's top level with `data` replaced by the matrix, read by promql._get_once
Decoder = Callable[[bytes], dict[str, Any]]


def labels(text: Labels) -> dict[str, str]:
    """A series' label set as a dictionary (for a series seen for the first time)."""
    return {str(k): str(v) for k, v in json.loads(text).items()}


def decode_stdlib(body: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(body)
    data = doc.get("data")
    if isinstance(data, dict):
        doc["data"] = [
            (json.dumps(d.get("metric", {}), separators=(",", ":")).encode(), d.get("values", []))
            for d in data.get("result", [])
        ]
    return doc


def _msgspec_decoder() -> Decoder | None:
    try:
        import msgspec
    except ImportError:
        return None

    # defstruct, not class statements: the module's annotations are strings, which msgspec
    # resolves in the module's namespace, not this function's. Not tracked by the cyclic
    # collector (gc=False: they hold no cycles), which an answer's 8,000 series would wake.
    series = msgspec.defstruct(
        "Series",
        [("metric", msgspec.Raw, msgspec.Raw(b"{}")), ("values", list[tuple[float, str]], [])],
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
        matrix = None if a.data is None else [(bytes(s.metric), s.values) for s in a.data.result]
        return {"status": a.status, "error": a.error, "warnings": a.warnings, "data": matrix}

    return decode


def decoder() -> Decoder:
    """msgspec's decoder where it is installed, else the standard library's."""
    return _msgspec_decoder() or decode_stdlib
