"""The TSDB feeds read each grid point at the instant of the agent's snapshot it holds
(feeds/clock.py): the engine sees the agent's samples at their own instants, a snapshot two
grid points hold once, and an instance whose agent serves no snapshot timestamp keeps the
query grid. On 0.2.0 every point kept its grid instant."""

from __future__ import annotations

import json
from array import array

from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.node import NodeSeries
from gpufeed.correlator.feeds import promql
from gpufeed.correlator.feeds.clock import SNAPSHOT_METRIC, clock_of, restamp
from gpufeed.fleet.carry import (
    Epoch,
    _apply,
    _clocks,
    _held,
    _instants,
    _Owners,
    _restamped,
)

UTIL = "gpufeed_gpu_utilization_ratio"
T0 = 1_700_000_000.0
GRID = [T0 + k for k in range(1, 6)]
# the agent's snapshots: jittered; the grid point at T0+3 holds the snapshot T0+2 held
SNAPS = [T0 + 0.9704, T0 + 1.2, T0 + 1.2, T0 + 3.95, T0 + 4.1]


def test_a_grid_point_takes_its_snapshots_instant_and_a_repeat_is_dropped() -> None:
    clock = clock_of(GRID, SNAPS)
    ts, vs = restamp(array("d", GRID), array("d", [0.1, 0.2, 0.2, 0.4, 0.5]), clock)
    # milliseconds, as the agent and its trace keep them
    assert list(ts) == [T0 + 0.97, T0 + 1.2, T0 + 3.95, T0 + 4.1]
    assert list(vs) == [0.1, 0.2, 0.4, 0.5]
    same = array("d", GRID)
    assert restamp(same, array("d", [1.0] * 5), None)[0] is same  # no clock: the grid


def _answer(metric: str, inst: str, ts: list[float], vs: list[float]) -> dict[str, object]:
    labels = {"__name__": metric, "instance": inst, "gpu": "0", "uuid": "GPU-a"}
    return {"metric": labels, "values": [[t, repr(v)] for t, v in zip(ts, vs, strict=True)]}


def test_analyze_prometheus_routes_each_node_at_its_own_instants() -> None:
    snap = [_answer(SNAPSHOT_METRIC, "new:9400", GRID, SNAPS)]
    clocks = promql.clocks_of([snap])
    nodes: dict[str, NodeSeries] = {}
    util = [_answer(UTIL, i, GRID, [0.5] * 5) for i in ("new:9400", "old:9400")]
    promql.route_result(nodes, UTIL, util, clocks)
    new = nodes["new:9400"].gpus["0"].fields["util"]
    old = nodes["old:9400"].gpus["0"].fields["util"]
    assert list(new.ts) == [T0 + 0.97, T0 + 1.2, T0 + 3.95, T0 + 4.1]
    assert list(old.ts) == GRID  # an agent without the series: the grid, as before


def _matrix(metric: str, inst: str, ts: list[float], vs: list[float]) -> tuple[bytes, ...]:
    labels = {"__name__": metric, "instance": inst}
    if metric == UTIL:
        labels |= {"gpu": "0", "uuid": "GPU-a"}
    text = json.dumps(labels, separators=(",", ":")).encode()
    return text, array("d", ts), array("d", vs)  # type: ignore[return-value]


def test_the_fleet_keeps_one_timestamp_column_per_node_at_its_instants() -> None:
    """Two chunks of two nodes (one serving snapshot timestamps) through an epoch: each
    node's series at its own instants, sharing its node's column; the repeat that spans the
    chunks' edge (the grid's last point of the first and first of the second hold one
    snapshot) is read once."""
    epoch = Epoch(T0, T0)
    snaps = [*SNAPS, T0 + 5.02, T0 + 6.0, T0 + 6.99]  # T0+6 holds T0+5's, T0+5.02
    snaps[5] = snaps[4]
    grid = [T0 + k for k in range(1, 9)]
    for lo, hi in ((0, 5), (5, 8)):
        g = grid[lo:hi]
        clocks = _clocks([_matrix(SNAPSHOT_METRIC, "new:9400", g, snaps[lo:hi])])  # type: ignore[list-item]
        items = []
        for inst in ("new:9400", "old:9400"):
            text, ts, vs = _matrix(UTIL, inst, g, [0.5] * len(g))
            items.append((hash(text), text if lo == 0 else None, ts, vs))
        owners = _Owners({}, epoch.owners) if lo else _Owners(
            {k: json.loads(t)["instance"] for k, t, _, _ in items if t}, {}
        )  # fmt: skip
        parsed = [(UTIL, _restamped(items, owners, clocks))]  # type: ignore[arg-type]
        held = {inst: _held(clock) for inst, clock in clocks.items()}
        _apply(epoch, (g[-1], parsed, _instants(parsed, owners), owners, held), WindowParams())
    new = epoch.nodes["new:9400"].gpus["0"].fields["util"]
    old = epoch.nodes["old:9400"].gpus["0"].fields["util"]
    want = [round(s, 3) for s in snaps]
    assert list(new.ts) == sorted(set(want)) and list(old.ts) == grid
    assert new.ts is epoch.grids["new:9400"] and old.ts is epoch.grids["old:9400"]
