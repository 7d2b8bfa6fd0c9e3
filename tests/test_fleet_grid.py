"""The fleet's shared timestamp column (fleet/carry.py, `Epoch.grids`: one per node): a series with a point
at every instant holds the epoch's one timestamp array; one that misses an instant, starts
late, or gets two answers in a chunk leaves it with a copy of its own; every column ends up
holding exactly the points that `Series.extend_sorted` of its answers would have given."""

from __future__ import annotations

import json
from array import array

from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.feeds import matrix
from gpufeed.fleet.carry import Epoch, Parsed, _apply

UTIL = "gpufeed_gpu_utilization_ratio"
STEP = 15.0
T0 = 1_700_000_000.0


def _item(gpu: str, ts: list[float], uuid: str = "GPU-a") -> Parsed:
    labels = {"__name__": UTIL, "instance": "n1:9400", "gpu": gpu, "uuid": uuid}
    text = json.dumps(labels, separators=(",", ":")).encode()  # as the answer wrote it
    return hash(text), text, array("d", ts), array("d", [t / 1e9 + (uuid == "GPU-b") for t in ts])


def _grid(k0: int, k1: int) -> list[float]:
    return [T0 + k * STEP for k in range(k0, k1)]


def test_series_share_the_grid_until_they_miss_an_instant() -> None:
    epoch = Epoch(T0, T0 - STEP)
    chunks = [
        # (gpu 0: every instant; 1: misses one in the second chunk; 2: starts late;
        #  3: a second label set for the same column in the last chunk, a new uuid, whose
        #  points overlap the first's (and win);
        #  4: no answer in the second chunk)
        [_item("0", _grid(0, 4)), _item("1", _grid(0, 4)), _item("3", _grid(0, 4)),
         _item("4", _grid(0, 4))],
        [_item("0", _grid(4, 8)), _item("1", _grid(4, 6) + _grid(7, 8)),
         _item("2", _grid(6, 8)), _item("3", _grid(4, 8))],
        [_item("0", _grid(8, 12)), _item("1", _grid(8, 12)), _item("2", _grid(8, 12)),
         _item("3", _grid(8, 12)), _item("3", _grid(10, 12), uuid="GPU-b"),
         _item("4", _grid(8, 12))],
    ]  # fmt: skip
    want: dict[str, Series] = {}
    for items in chunks:
        all_ts = sorted({t for _, _, ts, _ in items for t in ts})
        owners = {key: "n1:9400" for key, *_ in items}
        chunk = (max(all_ts), [(UTIL, items)], {"n1:9400": array("d", all_ts)}, owners, {})
        _apply(epoch, chunk, WindowParams())
        for _, labels, ts, vs in items:
            assert labels is not None
            want.setdefault(matrix.labels(labels)["gpu"], Series()).extend_sorted(ts, vs)
        grid = epoch.grids["n1:9400"]
        gpus = epoch.nodes["n1:9400"].gpus
        for gpu, ref in want.items():
            got = gpus[gpu].fields["util"]
            assert (list(got.ts), list(got.vs)) == (list(ref.ts), list(ref.vs)), gpu
    assert list(epoch.grids["n1:9400"]) == _grid(0, 12)
    sharing = {gpu for gpu, g in gpus.items() if g.fields["util"].ts is grid}
    assert sharing == {"0"}  # 1 missed an instant, 2 started late, 3 had two answers, 4 none


def test_the_service_limits_glibcs_malloc_arenas() -> None:
    """fleet/memory.py: on glibc (every supported Linux, CI's Debian) the setting is taken;
    its effect on memory is measured by bench/fleet_cycle.py."""
    from gpufeed.fleet.memory import limit_malloc_arenas

    assert limit_malloc_arenas() is True
