"""The fleet's engines, carried from cycle to cycle: a cycle fetches and evaluates only the
samples since the last one, not its whole range again.

The cycle at boundary `T` analyses `[A, T]` (`CycleTiming.anchors`): `A`, the anchor, is a
multiple of the lookback, the same for every replica, so consecutive cycles with one
anchor continue one set of engines (an *epoch*: per node its columns and `NodeRun`, as the
streamed analysis carries them from chunk to chunk). The next epoch's engines start at
their own anchor, `A + lookback`, before the cycles move to them, so a replica always runs
two: every interval steps every node twice over the new instants, but only the reporting
epoch's steps are on the cycle's path (the other is stepped once the cycle's results are
durable, in the time the service waits for the next boundary). A new replica (or one after a
restart, or after an engine failed) builds both from their anchors: its first cycle reads
up to twice the lookback.

Fetching: one range query per used metric over the new instants, for every instance at
once (no instance list: the answers name them), plus the cluster scheduler's families
(shared by every node, as the offline feed shares them), in chunks of at most `CHUNK_STEPS`
instants; a chunk is routed into the columns only when every answer of it has arrived, so
a failed query leaves every epoch consistent at its last chunk, and the retried cycle goes
on from there. The result equals `gpufeed analyze --prometheus --start A --end T` with the
windows still open at `T` left open (tested against VictoriaMetrics and Prometheus).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpufeed import vocabulary
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.engine.node import CLUSTER_METRICS, USED_METRICS, NodeSeries, cluster_key
from gpufeed.correlator.engine.peers import JobPeers
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds import matrix, promql
from gpufeed.correlator.feeds.clock import (
    SNAPSHOT_METRIC,
    Clock,
    clock_of,
    restamped_instants,
)
from gpufeed.correlator.feeds.matrix import Matrix
from gpufeed.correlator.feeds.stream import NodeRun
from gpufeed.fleet.timing import CycleTiming

LabelKey = int
# (label key, the label set's text as answered or None where every epoch the chunk goes to
# has routed it, timestamps, values)
Parsed = tuple[LabelKey, matrix.Labels | None, "array[float]", "array[float]"]
# per instance, every instant any answer of its series holds, ascending
Instants = dict[str, "array[float]"]
# per instance with a snapshot clock (feeds/clock.py): the grid instants of the chunk that
# hold a snapshot, and that snapshot's instant
Held = dict[str, tuple["array[float]", "array[float]"]]
# (its last instant, parsed answers, instants, the instance of each node series, the
# snapshots its grid held); the cluster's series are under ""
Chunk = tuple[float, list[tuple[str, list[Parsed]]], Instants, Mapping[LabelKey, str], Held]
NO_INSTANTS = array("d")
# one answer parsed: (its series, the points it held, the instance of each series whose
# labels were decoded, per instance the snapshot clock: only SNAPSHOT_METRIC's has one)
Asked = tuple[list[Parsed], int, dict[LabelKey, str], dict[str, Clock]]

CHUNK_STEPS = 10  # instants per query: bounds an answer (the whole fleet) in a cold start
# A node's engine starts once it has this many utilization samples: its sampling interval
# is estimated from them (on the query grid, the step)
FIRST_SAMPLES = 3


@dataclass(slots=True)
class Epoch:
    """Every node's columns and engine from one anchor on; `done_seconds` is the last
    instant fetched, routed and stepped."""

    anchor_seconds: float
    done_seconds: float
    nodes: dict[str, NodeSeries] = field(default_factory=dict)
    runs: dict[str, NodeRun] = field(default_factory=dict)
    # metric -> label key (the hash of the label set's text as answered) -> its column, or
    # None for a series the engine does not read: routing a label set is done once per
    # epoch, not once per cycle
    columns: dict[str, dict[LabelKey, Series | None]] = field(default_factory=dict)
    # the cluster scheduler's series (CLUSTER_METRICS), shared by every node, as the
    # offline PromQL feed shares them (feeds/promql.py)
    cluster: dict[str, Series] = field(default_factory=dict)
    # Per node, one timestamp column for every series of it that has a point at every
    # instant of the node routed so far (nearly all): `Series.ts is grids[instance]`, so
    # the timestamps are held once, not once per series (they were half the columns'
    # memory). The instants are the node's own: its agent's snapshot instants where it
    # serves them (feeds/clock.py), else the query grid's. Such a series gets only its
    # values in `route`; `commit` then extends the node's grid, after giving every series
    # that missed one of the chunk's instants a copy of its own.
    grids: dict[str, array[float]] = field(default_factory=dict)
    sharing: dict[str, list[Series]] = field(default_factory=dict)
    # label key -> the instance of its series, for a series whose labels are not decoded
    # again (`_parse`): its instants are its node's
    owners: dict[LabelKey, str] = field(default_factory=dict)
    # per node, its last instant routed (a snapshot's, where the node serves them)
    last_instant: dict[str, float] = field(default_factory=dict)
    # every node's GPUs of a job at the same instant, for each node's engine (engine/peers.py)
    peers: JobPeers = field(init=False)

    def __post_init__(self) -> None:
        self.peers = JobPeers(self.nodes)

    def cuts(self, held: Held) -> dict[str, float]:
        """Per node read at its snapshots' instants, the instant after which a chunk's
        points are new to the epoch (the others are cut at `done_seconds`).

        The chunk is cut on the query grid: the epoch has had every grid point up to
        `done_seconds`. A point re-stamped at the snapshot it holds may lie before that
        (a snapshot taken before a grid instant and scraped after it is on the next grid
        point), so its own instant says nothing of which grid point held it. New are
        the snapshots held by the grid points after `done_seconds` (from the first one's
        on) that the epoch does not have yet (after its last instant of the node)."""
        done = self.done_seconds
        out: dict[str, float] = {}
        for inst, (grid, snaps) in held.items():
            j = bisect_right(grid, done)
            first = snaps[j] if j < len(snaps) else math.inf
            seen = self.last_instant.get(inst, -math.inf)
            out[inst] = max(math.nextafter(first, -math.inf), seen)
        return out

    def route(
        self,
        metric: str,
        items: list[Parsed],
        instants: Instants,
        owner_of: Mapping[LabelKey, str],
        cuts: Mapping[str, float],
    ) -> None:
        """Appends an answer's points that are new to the epoch (after `cuts` of their
        node, else after `done_seconds`) to their columns; `instants`, each node's new
        instants of the chunk, are what a series sharing its node's grid must have;
        `owner_of`, the instance of each of the chunk's node series."""
        done = self.done_seconds
        cols = self.columns.setdefault(metric, {})
        shared = metric in CLUSTER_METRICS
        owners, grids = self.owners, self.grids
        # (answer timestamps, from, instance) -> all of the node's instants?
        full: dict[tuple[int, int, str], bool] = {}
        for key, labels, ts, vs in items:
            if shared:
                i = bisect_right(ts, done)
                if i >= len(ts):
                    continue
                assert labels is not None  # the cluster's answers keep their labels
                ckey = cluster_key(metric, matrix.labels(labels))
                self.cluster.setdefault(ckey, Series()).extend_sorted(ts[i:], vs[i:])
                continue
            i = bisect_right(ts, cuts.get(owner_of[key], done))
            if i >= len(ts):
                continue
            if key in cols:
                series = cols[key]
            else:  # first sight of this series: find (or make) its column once
                if labels is None:
                    raise RuntimeError(f"{metric}: an unrouted series came without its labels")
                named = matrix.labels(labels)  # decoded here, one series at a time (_parse)
                inst = named["instance"]
                node = self.nodes.get(inst)
                if node is None:
                    node = self.nodes[inst] = NodeSeries(inst)
                    node.cluster = self.cluster
                    self.runs[inst] = NodeRun(node, self.peers)
                rest = {k: v for k, v in named.items() if k not in ("instance", "__name__")}
                series = cols[key] = node.route(metric, rest)
                owners[key] = node.instance
            if series is None:
                continue
            inst = owners[key]
            grid = grids.get(inst)
            if grid is None:
                grid = grids[inst] = array("d")
            n = len(grid)
            if not series.ts and not n:  # the node's first points: it starts on the grid
                series.ts = grid
                self.sharing.setdefault(inst, []).append(series)
            if series.ts is grid:
                node_instants = instants.get(inst, NO_INSTANTS)
                same = full.get((id(ts), i, inst))  # answers share their timestamp arrays
                if same is None:
                    same = full[id(ts), i, inst] = (ts[i:] if i else ts) == node_instants
                if same and len(series.vs) == n:
                    series.vs.extend(vs[i:] if i else vs)
                    continue
                # off the grid from now on: its own copy of the timestamps it has
                series.ts = array("d", grid)
                if len(series.vs) > n:  # a second answer for this column in the chunk
                    series.ts.extend(node_instants)
            series.extend_sorted(ts[i:] if i else ts, vs[i:] if i else vs)

    def commit(self, instants: Instants) -> None:
        """Extends each node's grid by its instants of the chunk, once every answer is
        routed: a series on it that did not get all of them gets its own timestamps first."""
        for inst, sharing in self.sharing.items():
            grid = self.grids[inst]
            n = len(grid)
            keep = []
            for series in sharing:
                if series.ts is not grid:
                    continue  # left the grid (in route, or a trim)
                if len(series.vs) == n:  # no points in this chunk
                    series.ts = array("d", grid)
                else:
                    keep.append(series)
            sharing[:] = keep
            grid.extend(instants.get(inst, NO_INSTANTS))
        for inst, ts in instants.items():
            if ts:
                self.last_instant[inst] = ts[-1]

    def advance(self, until: float, params: WindowParams) -> None:
        for inst in sorted(self.runs):
            self.runs[inst].advance(params, False, FIRST_SAMPLES)
        self.done_seconds = until

    def windows(self) -> tuple[list[Window], list[Window]]:
        """(closed, open) windows since the anchor, node by node."""
        closed: list[Window] = []
        open_: list[Window] = []
        for inst in sorted(self.runs):
            corr = self.runs[inst].corr
            if corr is not None:
                closed.extend(corr.windows)
                open_.extend(corr.open_windows())
        return closed, open_


_UNROUTED: Any = object()  # not in an epoch's column cache (None: routed, not read)


def _parse(
    result: Matrix,
    nodes: bool = True,
    known: Sequence[Mapping[LabelKey, Series | None]] = (),
    owners: dict[LabelKey, str] | None = None,
) -> tuple[list[Parsed], int]:
    """An answer's series as (label key, label text as answered, timestamps, values), parsed
    once for every epoch; series without an instance are not a node's (`nodes`: the
    cluster's series are nobody's). The key, the hash of the label set's text as the
    answer wrote it (feeds/matrix.py), is what the epochs' column caches hold: a 64-bit
    hash, and two label sets of one metric in one replica hash alike with a chance of about
    n^2 / 2^65 (n = 8,000 series: 2e-12).

    `known`: the column caches of the epochs the chunk goes to. A series all of them have
    routed keeps no labels, and its labels' text is never decoded (a chunk held 1.3 M label
    dictionaries at 1,000 nodes, half a steady cycle's memory); one none of them reads is
    left out. A series an epoch has not routed keeps its labels as the answer's text, and
    `Epoch.route` decodes them as it routes it: a chunk's 80,000 label dictionaries at 256
    nodes, held until it was routed, were 1 KiB a series (a cold cycle's peak heap, which
    pymalloc's arenas keep: the checked dictionary here is freed at once).

    `owners`, when given, receives the instance of each series whose labels are decoded."""
    out: list[Parsed] = []
    points = 0
    distinct: dict[bytes, array[float]] = {}
    for text, ts, vs in result:
        key = hash(text)
        labels: matrix.Labels | None = None
        routed = bool(known)
        reads = False
        for cache in known:  # one or two epochs: no generator per series
            col = cache.get(key, _UNROUTED)
            if col is _UNROUTED:
                routed = False
                break
            reads = reads or col is not None
        if not routed:
            if nodes:
                inst = matrix.labels(text).get("instance")
                if not inst:
                    continue
                if owners is not None:
                    owners[key] = inst
            labels = text
        points += len(vs)  # what the TSDB sent, read or not
        if routed and not reads:
            continue
        # one array per distinct list of timestamps (on a query grid, nearly every
        # series has them all): the epochs compare and share it once (Epoch.grid)
        ts = distinct.setdefault(ts.tobytes(), ts)
        out.append((key, labels, ts, vs))
    return out, points


class FleetEngines:
    """The epochs a replica carries, advanced to each cycle's boundary. The reporting epoch
    is advanced in the cycle; the next one (warming up, reported from only when the cycles
    reach its anchor) gets the same chunks afterwards, in `warm_up`, which the service
    calls once the cycle's results are durable: a cycle waits for one engine per node."""

    def __init__(
        self,
        base: str,
        timing: CycleTiming,
        params: WindowParams,
        match: str,
        retry: promql.Retry,
        # Range queries in flight at once (`gpufeed fleet --fleet.queries`). An answer is
        # decoded in the thread that asked for it, and decoding holds the GIL: two threads
        # keep one answer decoding while the TSDB computes the next. At 1,000 nodes a steady
        # cycle took 4.36 s of CPU with 8 (5.16 s wall), 3.96 s with 3, 3.73 s with 2
        # (5.00 s; `python -m bench.fleet_cycle --sizes 1000 --queries N`): more threads
        # only took turns at the GIL, each on a cold cache. A TSDB far away (Thanos, Mimir:
        # each query waits on the network) may want more.
        queries_in_flight: int = vocabulary.DEFAULT_FLEET_QUERIES_IN_FLIGHT,
    ) -> None:
        if queries_in_flight < 1:
            raise ValueError("queries in flight must be at least 1")
        self.base = base
        self.queries_in_flight = queries_in_flight
        self.timing = timing
        self.params = params
        self.match = match
        self.retry = retry
        self.epochs: dict[float, Epoch] = {}
        self._pending: list[Chunk] = []  # fetched chunks the warm-up epoch has not had
        self._decode = matrix.decoder()
        self._dropped = True  # epochs let go since take_dropped() last asked (fleet/memory.py)

    def reset(self) -> None:
        self.epochs = {}
        self._pending = []
        self._dropped = True

    def take_dropped(self) -> bool:
        """Whether epochs were let go since the last call."""
        dropped, self._dropped = self._dropped, False
        return dropped

    def advance(self, boundary: float) -> tuple[Epoch, int, int]:
        """The epoch the cycle at `boundary` reports from, stepped through `boundary`; with
        the (queries, points) that cost."""
        step = self.timing.step_seconds
        if any(e.done_seconds > boundary for e in self.epochs.values()):
            self.reset()  # asked for an earlier cycle: start over
        self.warm_up()  # what the last cycle left for later, first: chunks stay in order
        anchors = self.timing.anchors(boundary)
        self._dropped = self._dropped or any(a not in anchors for a in self.epochs)
        self.epochs = {
            a: self.epochs.get(a) or Epoch(a, a - step) for a in anchors if a <= boundary
        }
        report = self.epochs[anchors[0]]
        queries = points = 0
        frm = min(e.done_seconds for e in self.epochs.values()) + step
        spans = list(promql.chunks(frm, boundary, step, CHUNK_STEPS))
        # a steady cycle (one chunk) leaves the warm-up epoch for later; a cold one, which
        # is slow anyway, feeds it at once rather than hold its chunks
        defer = len(spans) == 1
        with ThreadPoolExecutor(max_workers=self.queries_in_flight) as pool:
            for s, e in spans:
                q, p, chunk = self._fetch(pool, s, e)
                queries, points = queries + q, points + p
                _apply(report, chunk, self.params)
                behind = [ep for ep in self.epochs.values() if ep.done_seconds < e]
                if defer and behind:
                    self._pending.append(chunk)
                elif not defer:
                    for ep in behind:
                        _apply(ep, chunk, self.params)
                # let go of a routed chunk before the next is fetched: two chunks alive at
                # once were a third of a cold cycle's peak heap (pymalloc's arenas, once
                # touched, stay with the process)
                del chunk
        return report, queries, points

    def warm_up(self) -> None:
        """Gives the warm-up epoch the chunks it has not had yet."""
        pending, self._pending = self._pending, []
        for chunk in pending:
            for ep in self.epochs.values():
                _apply(ep, chunk, self.params)

    def _fetch(self, pool: ThreadPoolExecutor, s: float, e: float) -> tuple[int, int, Chunk]:
        step = self.timing.step_seconds
        base, match, retry, decode = self.base, self.match, self.retry, self._decode
        # every epoch the chunk will go to: not one that starts after it (a cold cycle's
        # warm-up epoch for its first chunks), whose empty column cache would have every
        # series' labels decoded, chunk after chunk (90 MB a chunk at 256 nodes)
        epochs = [ep for ep in self.epochs.values() if ep.done_seconds < e]

        def ask(metric: str) -> Asked:
            # parsed where it arrives: the answer's JSON is freed at once. The epochs'
            # caches are only read here: the cycle's thread waits for every answer
            answer = promql.query_every_instance(base, metric, match, (s, e), step, retry, decode)
            if metric == SNAPSHOT_METRIC:
                return [], sum(len(vs) for _, _, vs in answer), {}, _clocks(answer)
            if metric in CLUSTER_METRICS:
                return (*_parse(answer, nodes=False), {}, {})
            known = [ep.columns.get(metric, {}) for ep in epochs]
            seen: dict[LabelKey, str] = {}
            return (*_parse(answer, known=known, owners=seen), seen, {})

        # every answer first: a failure routes nothing, and the epochs stay at their last chunk
        metrics = (SNAPSHOT_METRIC, *USED_METRICS, *CLUSTER_METRICS)
        answers = list(pool.map(ask, metrics))
        clocks = answers[0][3]
        # a series every epoch has routed is in each one's owners; any other was decoded
        new: dict[LabelKey, str] = {}
        for _, _, seen, _ in answers[1:]:
            new.update(seen)
        owners = _Owners(new, epochs[0].owners if epochs else {})
        parsed = [
            (m, items if m in CLUSTER_METRICS else _restamped(items, owners, clocks))
            for m, (items, _, _, _) in zip(metrics[1:], answers[1:], strict=True)
        ]
        instants = _instants(parsed, owners)
        held = {inst: _held(clock) for inst, clock in clocks.items()}
        return len(metrics), sum(a[1] for a in answers), (e, parsed, instants, owners, held)


class _Owners(Mapping[LabelKey, str]):
    """The instance of a chunk's series: a new one's, else the epoch's that routed it."""

    __slots__ = ("new", "routed")

    def __init__(self, new: Mapping[LabelKey, str], routed: Mapping[LabelKey, str]) -> None:
        self.new, self.routed = new, routed

    def __getitem__(self, key: LabelKey) -> str:
        got = self.new.get(key)
        return self.routed[key] if got is None else got

    def __iter__(self) -> Iterator[LabelKey]:
        return iter({**self.routed, **self.new})

    def __len__(self) -> int:
        return len({**self.routed, **self.new})


def _clocks(answer: Matrix) -> dict[str, Clock]:
    """Per instance, the snapshot each grid point holds (feeds/clock.py): one series per
    node, its labels decoded every chunk (a node's instants are the node's own)."""
    out: dict[str, Clock] = {}
    for text, ts, vs in answer:
        inst = matrix.labels(text).get("instance")
        if inst:
            out.setdefault(inst, {}).update(clock_of(ts, vs))
    return out


def _held(clock: Clock) -> tuple[array[float], array[float]]:
    """A clock as (grid instants, the instants of the snapshots they hold), ascending."""
    grid = sorted(clock)
    return array("d", grid), array("d", (clock[t] for t in grid))


def _restamped(
    items: list[Parsed], owners: Mapping[LabelKey, str], clocks: Mapping[str, Clock]
) -> list[Parsed]:
    """Each node's series at its agent's snapshot instants, where it serves them: a
    repeated snapshot left out. The series of one node that shared grid timestamps share
    the new ones (one restamping per node and distinct timestamp array)."""
    if not clocks:
        return items
    done: dict[tuple[int, str], tuple[array[float], list[int]]] = {}
    out: list[Parsed] = []
    for key, labels, ts, vs in items:
        inst = owners.get(key, "")
        clock = clocks.get(inst)
        if not clock:
            out.append((key, labels, ts, vs))
            continue
        plan = done.get((id(ts), inst))
        if plan is None:
            plan = done[id(ts), inst] = restamped_instants(ts, clock)
        new_ts, keep = plan
        out.append((key, labels, new_ts, array("d", (vs[k] for k in keep))))
    return out


def _instants(parsed: list[tuple[str, list[Parsed]]], owners: Mapping[LabelKey, str]) -> Instants:
    """Per node, every instant an answer of one of its series holds, ascending."""
    arrays: dict[str, dict[int, array[float]]] = {}
    for metric, items in parsed:
        if metric in CLUSTER_METRICS:
            continue
        for key, _, ts, _ in items:
            arrays.setdefault(owners.get(key, ""), {})[id(ts)] = ts
    unions: dict[tuple[int, ...], array[float]] = {}  # nodes on one grid share its union
    out: Instants = {}
    for inst, distinct in arrays.items():
        ids = tuple(sorted(distinct))
        union = unions.get(ids)
        if union is None:
            union = unions[ids] = array("d", sorted(set().union(*distinct.values())))
        out[inst] = union
    return out


def _apply(epoch: Epoch, chunk: Chunk, params: WindowParams) -> None:
    """Routes a chunk into an epoch that has not had it, and steps its engines through it."""
    end, parsed, instants, owners, held = chunk
    done = epoch.done_seconds
    if done >= end:
        return
    cuts = epoch.cuts(held)
    new = {inst: ts[bisect_right(ts, cuts.get(inst, done)) :] for inst, ts in instants.items()}
    for metric, items in parsed:
        epoch.route(metric, items, new, owners, cuts)
    epoch.commit(new)
    epoch.advance(end, params)
