"""The fleet's decoding of range-query answers (feeds/matrix.py, fleet/carry.py `_parse`):
msgspec's decoder and the standard library's give the same series, keys and numbers as
`float` of the answer's text (what the offline feeds read), `+Inf`, `NaN` and `-0`
included; a series every epoch has routed comes without labels, one no epoch reads is
left out; a body that is not an answer is a ValueError (promql retries it as transient).
And the replica's heap: what survives a cycle is frozen out of the collector's walks."""

from __future__ import annotations

import gc
import json
import math
import weakref
from array import array

import pytest

from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.feeds import matrix
from gpufeed.correlator.feeds.promql import Retry
from gpufeed.fleet.carry import Epoch, FleetEngines, LabelKey, _parse
from gpufeed.fleet.memory import freeze_survivors
from gpufeed.fleet.timing import CycleTiming

UTIL = "gpufeed_gpu_utilization_ratio"
VALUES = ["0.25", "+Inf", "-Inf", "NaN", "-0", "1e-320", "0.1", "12345678901234567"]


def _body(series: list[tuple[dict[str, str], list[tuple[float, str]]]]) -> bytes:
    result = [{"metric": m, "values": [[t, v] for t, v in pts]} for m, pts in series]
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return json.dumps(doc).encode()


def _labels(gpu: str, instance: str = "n1:9400") -> dict[str, str]:
    out = {"__name__": UTIL, "gpu": gpu, "uuid": f"GPU-{gpu}"}
    if instance:
        out["instance"] = instance
    return out


BODY = _body(
    [
        (_labels("0"), [(1_700_000_000 + 15 * k, v) for k, v in enumerate(VALUES)]),
        (_labels("1"), [(1_700_000_000.5, "3"), (1_700_000_015, "4")]),
        (_labels("2", instance=""), [(1_700_000_000, "1")]),  # nobody's node
    ]
)
DECODERS = [matrix.decode_stdlib, matrix.decoder()]


def _same(a: array[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(a, b, strict=True)
    )


def test_msgspec_is_installed() -> None:
    # the pinned dependency: the fast path is the one a replica runs
    assert matrix.decoder() is not matrix.decode_stdlib
    assert matrix.decoder().__module__ == matrix.__name__


@pytest.mark.parametrize("decode", DECODERS, ids=["stdlib", "msgspec"])
def test_both_decoders_read_the_numbers_float_reads(decode: matrix.Decoder) -> None:
    doc = decode(BODY)
    assert doc["status"] == "success" and not doc.get("warnings")
    parsed, points = _parse(doc["data"])
    assert points == len(VALUES) + 2  # the instance-less series is nobody's
    (k0, l0, ts0, vs0), (k1, l1, ts1, vs1) = parsed
    assert list(ts0) == [1_700_000_000 + 15 * k for k in range(len(VALUES))]
    assert l0 is not None and l1 is not None  # as the answer wrote them, decoded when routed
    assert matrix.labels(l0) == _labels("0") and matrix.labels(l1) == _labels("1")
    assert _same(vs0, [float(v) for v in VALUES])
    assert math.copysign(1, vs0[4]) == -1  # "-0" stays negative zero
    assert list(ts1) == [1_700_000_000.5, 1_700_000_015] and list(vs1) == [3.0, 4.0]
    assert k0 != k1 and (k0, k1) == (hash(doc["data"][0][0]), hash(doc["data"][1][0]))


@pytest.mark.parametrize("decode", DECODERS, ids=["stdlib", "msgspec"])
def test_routed_series_come_without_labels_and_unread_ones_not_at_all(
    decode: matrix.Decoder,
) -> None:
    data = decode(BODY)["data"]
    (k0, *_), (k1, *_) = _parse(data)[0]
    read: dict[LabelKey, Series | None] = {k0: Series(), k1: None}  # 1 is routed, not read
    parsed, points = _parse(data, known=[read, read])
    assert points == len(VALUES) + 2  # what was sent, read or not
    assert [(k, labels) for k, labels, _, _ in parsed] == [(k0, None)]
    # an epoch that has not routed gpu 0 yet still gets its labels (as the answer's text)
    parsed, _ = _parse(data, known=[read, {k1: None}])
    assert [(k, labels) for k, labels, _, _ in parsed] == [(k0, data[0][0])]
    assert matrix.labels(data[0][0]) == _labels("0")


@pytest.mark.parametrize("decode", DECODERS, ids=["stdlib", "msgspec"])
def test_an_error_answer_and_a_broken_body(decode: matrix.Decoder) -> None:
    doc = decode(b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}')
    assert doc["status"] == "error" and doc["error"] == "parse error at char 3"
    assert not doc.get("data")
    warned = decode(b'{"status":"success","warnings":["store down"],"data":{"result":[]}}')
    assert warned["warnings"] == ["store down"] and warned["data"] == []
    with pytest.raises(ValueError):
        decode(b"<html>502 Bad Gateway</html>")
    with pytest.raises(ValueError):
        decode(b'{"status":"success","data":{"result":[{"values":[[1,"x"')


def test_epochs_let_go_thaw_and_collect_what_was_frozen() -> None:
    """fleet/memory.py: what survives a cycle is frozen; when epochs are let go, a frozen
    cycle of references among them is collected, not kept for the replica's life."""
    timing = CycleTiming(60.0, 900.0, 15.0, 0.0, 60.0)
    engines = FleetEngines("http://127.0.0.1:9", timing, WindowParams(), "", Retry())
    assert engines.take_dropped() and not engines.take_dropped()  # a new replica builds
    engines.epochs = {0.0: Epoch(0.0, -15.0), 900.0: Epoch(900.0, 885.0)}
    assert not engines.take_dropped()
    engines.reset()
    assert engines.take_dropped()

    class Held:
        other: Held | None = None

    try:
        a, b = Held(), Held()
        a.other, b.other = b, a  # a cycle: refcounting alone never frees it
        gone = weakref.ref(a)
        freeze_survivors(False)
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()
        assert gone() is not None  # frozen: the collector does not look
        freeze_survivors(True)
        assert gone() is None
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (b'[[1700000000,"0.5"],[1700000015.5,"+Inf"]]', ([1.7e9, 1.7e9 + 15.5], [0.5, math.inf])),
        (b'[[1, "2"], [3, "-0"]]', ([1.0, 3.0], [2.0, -0.0])),  # white space: json reads it
        (b"[]", ([], [])),
    ],
)
def test_values_text_read_in_one_go_or_by_json(
    text: bytes, want: tuple[list[float], list[float]]
) -> None:
    ts, vs = matrix.values(text)
    assert list(ts) == want[0] and _same(vs, want[1])
