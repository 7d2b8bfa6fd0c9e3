"""Who holds a multi-rank job back: the culprit of each stall, and its victims.

A data-parallel job moves at the pace of its slowest rank: when one node's tier stalls or
one GPU slows down, every other rank waits in its collectives, and their own nodes look
healthy (`unknown`, or `straggler` where the ranks report their collective wait). This
joins every node (instance) of a job: the windows the node engines found, per stall (the
job's windows that overlap in time), and the nodes' columns. A job whose ranks all run on
one node is joined too (`multi_rank`): its reference is its other ranks, not another node.

The culprit, in order of what decides it:
0. **A lost rank** (`gpufeed_job_rank_lost`: a rank whose processes exited without closing
   the job, killed or crashed): the rank lost first, where that loss came at most
   `LOST_RANK_LEAD_SECONDS` before the stall began or during it (a peer's fault explains a
   stall only if the stall follows it: a rank lost while the job trained on does not
   explain a later stall). Its cause is its node's own cause over the stall (a GPU that
   failed under it), else `idle` (nothing of the job runs there any more); the victims'
   evidence says how it ended (`culprit_exit`: "killed by signal 9" where `gpufeed run`
   reported its exit status, else "exited without closing the job").
1. **Who arrives last** (per-rank signals, `gpufeed_job_rank_phase_seconds_total{phase=
   "collective_wait"}`): the rank that waits least in collectives over the stall, if it
   waits clearly less than the rest (under half the ranks' median, which is itself at
   least `MIN_MEDIAN_WAIT`). Ranks that had stopped reporting before the stall (an
   elastic job that went on without them) are not candidates.
2. **The busiest link**, while the job's ranks wait in collectives: a node whose link
   carried at least `LINK_BUSY_RATIO` of what it can carry (a shaped rate where a root
   qdisc shapes it) for a quarter of the stall or more while every other node's carried
   under `LINK_CLEAR_SHARE` of that share. A slow link holds the ranks at both of its ends
   inside the collective alike, so (1) cannot name it, and a collective's bursts never
   fill a shaped link, so its node's own saturation bound may not be cleared (linkuse.py).
   Its node's waiting windows become `network` / `saturated` (it is the slow peer the
   others wait for, not a victim).
3. **The one node that shows a reason**: windows of the stall with a cause of their own
   (not `unknown`, not `straggler`, not a network window whose reason is a peer) on at
   most a quarter of the job's nodes (one, or the one with most such time). More than
   half of the nodes with their own cause (congestion everywhere) is no straggler: no
   culprit, every window keeps its cause. Where the ranks report their collective wait,
   a node whose ranks wait as long as the other nodes' (at least `PEER_WAIT_SHARE` of
   their median) is not holding them back, whatever its own windows say (a host-wide
   reading such as the CPUs another tenant keeps busy); a `network` cause is exempt,
   for the reason given in (2).
4. **The busiest GPU**: one GPU of the job above the threshold while the job's median
   GPU is below it (it computes while everyone waits: a slow GPU, a heavier shard).
A culprit's cause is its node's own cause over the stall (on a GPU it names: a throttled or
failed peer), else `unknown`: its node shows no reason, which the summary says rather
than guess. Victims (the stall's windows that are `unknown`, `straggler` or a peer-network
window, except the culprit GPU's own) become `straggler` with the culprit in evidence.

`correlate_job` works on one job's instances, so a caller that analyses in batches (the
streamed `--prometheus`) passes the instances of whole jobs together, with columns that
reach back over the windows it joins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import median

from gpufeed.correlator.engine.engine import WAITING_CAUSES
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.correlator.engine.node import NodeSeries, exit_words
from gpufeed.correlator.engine.series import Series
from gpufeed.correlator.engine.summary import HEADLINES, NETWORK_REASON_WORDS
from gpufeed.correlator.engine.window import Culprit, Window
from gpufeed.correlator.job.frontier import Frontier, RankKey, by_turns, frontier
from gpufeed.correlator.job.linkuse import LinkUse, busiest_link
from gpufeed.vocabulary import DEFAULT_THRESHOLD_RATIO, Cause, NetworkReason, StragglerReason

CLUSTER_GAP_SECONDS = 60.0  # windows of a job this close in time are one stall
MIN_MEDIAN_WAIT = 0.25  # the ranks' median collective wait during a stall, seconds/second
LAST_ARRIVER_RATIO = 0.5  # the culprit waits less than this share of the median
ACTIVE_LOOKBACK_SECONDS = 300.0  # a rank that reported in this span before the stall
# A lost rank explains a stall that begins at most this long after it was seen lost (the
# agent notices at its next scrape; the peers' window opens when they stop stepping), or
# that had begun at most this long before (the peers' first low readings, up to one
# scrape before the loss is seen). A stall that begins later has a cause of its own.
LOST_RANK_LEAD_SECONDS = 30.0
# the busiest link's share of what it can carry over the stall, and the most any other
# node's may carry, as a share of that: a collective over a shaped link carried 77-90% of
# the shaped rate in the fault lab, the other nodes' links the same bytes at < 1% of theirs
LINK_BUSY_RATIO = 0.5
LINK_CLEAR_SHARE = 0.5
PEER_WAIT_SHARE = 0.8  # a node waiting this share of its peers' wait or more is no culprit
WAIT_SIGNALS = frozenset(("last_to_arrive", "busiest_link"))  # not found by own windows
# causes a node can read from what the whole host shows (CPUs busy, I/O pressure: on a
# shared host or under another tenant), which a node whose ranks wait like the others'
# does not hold the job back by
HOST_WIDE_CAUSES = frozenset((Cause.PREPROCESSING, Cause.DATA_LOADING))
# the culprit's own cause in words, for the victims' summary
CULPRIT_WORDS = {
    Cause.DATA_LOADING: "waits for the {tier} tier",
    Cause.PREPROCESSING: "waits for its CPUs (input preprocessing)",
    Cause.CHECKPOINTING: "writes a checkpoint",
    Cause.NETWORK: "is held back by its network link",
    Cause.THROTTLING: "is slowed by clock throttling",
    Cause.STARTUP: "is still starting up",
    Cause.IDLE: "is idle",
    Cause.GPU_ERROR: "has failed",
    Cause.STRAGGLER: "waits for another peer",
    Cause.LOW_DEMAND: "has no request waiting (low demand)",
    Cause.UNKNOWN: "shows no reason on its node (a slow GPU or an imbalanced shard)",
}


@dataclass(frozen=True, slots=True)
class Imbalance:
    """A stall no rank or node is at fault for (see StragglerReason): the job's own
    partition (`stage_imbalance`: the stage and how much longer it computes than the other
    stages) or its input (`input_imbalance`: how many data-parallel ranks took turns
    arriving last, over how many steps)."""

    reason: StragglerReason
    stage: int = -1  # stage_imbalance: the pipeline stage every replica waits for
    factor: float = 0.0  # stage_imbalance: its busy time over the other stages'
    groups: int = 0  # input_imbalance: the data-parallel ranks that gated a step in turn
    steps: int = 0  # the steps (slices) the frontier attributed


@dataclass(frozen=True, slots=True)
class Found:
    culprit: Culprit
    signal: str  # "rank_lost", "last_to_arrive", "busiest_link", "own_cause", "busiest_gpu"
    tier: str = ""  # the culprit's data tier, where its cause is data_loading
    exit: str = ""  # a lost rank: how it ended ("killed by signal 9", ...)
    link: LinkUse | None = None  # busiest_link: the culprit's link
    peer_link_ratio: float = 0.0  # busiest_link: the busiest other node's link share
    # instance -> its ranks' median collective wait over the stall (_node_waits), read
    # once per stall by every step that compares a node's wait with its peers'
    node_waits: Mapping[str, float] = field(default_factory=dict)
    # last_to_arrive by the per-step frontier: the share of the job's exposed wait over
    # the stall credited to the culprit's ranks (0.0: not found that way)
    wait_share: float = 0.0


def correlate_jobs(
    nodes: Iterable[NodeSeries],
    windows: Sequence[Window],
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
) -> list[Window]:
    """`windows` with the victims of every multi-rank job's stalls turned into
    `straggler` (same order): a job on several nodes, or one whose ranks (two or more)
    all run on one node (the per-step frontier needs no other node: the reference is the
    job's other ranks). A single-process job's windows are returned as they are."""
    by_inst = {n.instance: n for n in nodes}
    spans: dict[str, list[str]] = {}
    for inst, n in sorted(by_inst.items()):
        # the jobs holding GPUs here, and CPU-only jobs (SDK phases, no GPU)
        for job in {j for j, _gpu in n.job_info} | {j for j, c in n.jobs.items() if c.phases}:
            spans.setdefault(job, []).append(inst)
    out = list(windows)
    # each job's windows found in one pass, not one pass per job: jobs and windows both
    # grow with the fleet (half a second of a fleet cycle at 1,000 nodes)
    of_job: dict[str, list[int]] = {}
    for i, w in enumerate(out):
        of_job.setdefault(w.job_id, []).append(i)
    for job, insts in spans.items():
        if not job or (len(insts) < 2 and not multi_rank(by_inst[insts[0]], job)):
            continue
        mine = set(insts)
        idx = [i for i in of_job.get(job, ()) if out[i].instance in mine]
        if not idx:
            continue
        joined = correlate_job(
            job, {i: by_inst[i] for i in insts}, [out[i] for i in idx], threshold_ratio
        )
        for i, w in zip(idx, joined, strict=True):
            out[i] = w
    return out


def multi_rank(node: NodeSeries, job_id: str, known: bool = False) -> bool:
    """Whether the job runs two ranks or more on this node (the SDK or `gpufeed run`
    reports them) and none elsewhere: a single-node job that the job-level join judges
    like a multi-node one. A job whose ranks report a larger world size runs on other
    nodes too, which this node's view cannot judge. `known`: the ranks must report their
    world size (the live agent, which cannot know otherwise that it sees the whole job;
    an analysis holds every node it was given)."""
    j = node.jobs.get(job_id)
    if j is None:
        return False
    here = len(set(j.rank_info) | {rank for rank, _phase in j.rank_phases})
    if known and not j.world_size:
        return False
    return here >= 2 and j.world_size <= here


def correlate_job(
    job_id: str,
    nodes: Mapping[str, NodeSeries],
    windows: Sequence[Window],
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
) -> list[Window]:
    """One job's windows (any order) over its instances' columns; same order back."""
    out = list(windows)
    for start, end, members in stalls(windows):
        found = judge_stall(
            job_id, nodes, [windows[i] for i in members], start, end, threshold_ratio
        )
        if isinstance(found, Imbalance):
            for i in members:
                if is_waiting(windows[i]):
                    out[i] = as_imbalanced(windows[i], found)
            continue
        if found is None:
            continue
        for i in members:
            w = windows[i]
            if _is_culprit_gpu(w, found.culprit):
                if found.link is not None and is_waiting(w):
                    out[i] = as_link_culprit(w, found.link, found.peer_link_ratio)
                elif found.exit and w.cause is Cause.UNKNOWN:
                    out[i] = as_lost(w, found)
            elif is_waiting(w) or _held_anyway(w, found, start, end):
                out[i] = as_straggler(w, found)
    return out


def stalls(windows: Sequence[Window]) -> list[tuple[float, float, list[int]]]:
    """The job's stalls: spans where its waiting windows overlap (or nearly), each with
    the indices of every window that overlaps it (a GPU lost an hour ago has one long
    window: it joins each later stall, it does not make them one)."""
    order = sorted(
        (i for i, w in enumerate(windows) if is_waiting(w)),
        key=lambda i: windows[i].start_seconds,
    )
    spans: list[list[float]] = []
    for i in order:
        w = windows[i]
        if not spans or w.start_seconds > spans[-1][1] + CLUSTER_GAP_SECONDS:
            spans.append([w.start_seconds, w.end_seconds])
        spans[-1][1] = max(spans[-1][1], w.end_seconds)
    out = []
    for a, b in spans:
        members = [i for i, w in enumerate(windows) if w.start_seconds <= b and w.end_seconds >= a]
        out.append((a, b, members))
    return out


def is_waiting(w: Window) -> bool:
    """A window its own node cannot explain (or explains as a late peer)."""
    if w.cause in WAITING_CAUSES:
        return True
    return w.cause is Cause.NETWORK and w.network_reason == NetworkReason.PEER


def find_culprit(
    job_id: str,
    nodes: Mapping[str, NodeSeries],
    windows: Sequence[Window],
    start: float,
    end: float,
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
) -> Found | None:
    """The culprit of one stall of `job_id` over [start, end] (see the module's doc);
    None also where the stall is the job's own imbalance (`judge_stall` says which)."""
    found = judge_stall(job_id, nodes, windows, start, end, threshold_ratio)
    return found if isinstance(found, Found) else None


def judge_stall(
    job_id: str,
    nodes: Mapping[str, NodeSeries],
    windows: Sequence[Window],
    start: float,
    end: float,
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
) -> Found | Imbalance | None:
    """The culprit of one stall, or the imbalance of the job that explains it."""
    if not any(is_waiting(w) for w in windows):
        return None
    own = _own_causes(windows, start, end)
    if len(own) > len(nodes) / 2:
        return None  # most nodes have their own reason: a job-wide cause, not a straggler
    gpu = uuid = rank = how = ""
    link: tuple[str, LinkUse, float] | None = None
    shares = {inst: _rank_share(n, job_id, start, end) for inst, n in nodes.items()}
    waits = _node_waits(shares)
    lost = lost_rank(job_id, nodes, start, end)
    last: tuple[str, str, str, str] | None = None
    wait_share = 0.0
    if lost is None:
        fr = frontier(nodes, job_id, start, end)
        judged = _by_frontier(job_id, nodes, fr) if fr is not None else None
        if isinstance(judged, Imbalance):
            return judged
        if judged is not None and fr is not None:
            wait_share = fr.share(fr.persistent())
        last = judged or _last_to_arrive(job_id, nodes, shares)
    if lost is not None:
        inst, rank, how = lost
        uuid = nodes[inst].jobs[job_id].rank_uuid.get(rank, "")
        gpu = next((g for g, c in nodes[inst].gpus.items() if uuid and c.uuid == uuid), "")
        signal = "rank_lost"
    elif last is not None:
        inst, gpu, uuid, rank = last
        signal = "last_to_arrive"
    elif (link := _busiest_link(nodes, waits, start, end)) is not None:
        inst = link[0]
        signal = "busiest_link"
    elif (held := _holding_back(own, waits)) and len(own) <= max(1, len(nodes) // 4):
        inst = max(held, key=lambda i: sum(held[i].values()))
        signal = "own_cause"
    else:
        inst, gpu = _busiest_gpu(job_id, nodes, start, end, threshold_ratio)
        signal = "busiest_gpu"
        if not inst:
            return None
    n = nodes[inst]
    if not gpu and len(n.gpus) > 1:
        gpu = _named_gpu(windows, inst)
        if not gpu:
            gpu = _busiest_gpu(job_id, {inst: n}, start, end, threshold_ratio)[1]
    uuid = uuid or (n.gpus[gpu].uuid if gpu in n.gpus else "")
    rank = rank or _rank_of(n, job_id, uuid) or _only_rank(n, job_id, start)
    cause = Cause.NETWORK if link is not None else _cause_on(own.get(inst))
    if lost is not None and cause is Cause.UNKNOWN:
        cause = Cause.IDLE  # its node runs nothing of the job any more
    tier = next(
        (str(v) for w in windows if w.instance == inst and w.cause is Cause.DATA_LOADING
         for k, v in w.evidence if k == Ctx.DATA_TIER),
        "",
    )  # fmt: skip
    return Found(
        Culprit(inst, gpu, uuid, rank, cause),
        signal,
        tier,
        how,
        link[1] if link is not None else None,
        link[2] if link is not None else 0.0,
        waits,
        wait_share if signal == "last_to_arrive" else 0.0,
    )


def lost_rank(
    job_id: str, nodes: Mapping[str, NodeSeries], start: float, end: float
) -> tuple[str, str, str] | None:
    """(instance, rank, how it ended) of the job's rank lost first, where the stall over
    [start, end] follows its loss: seen lost within LOST_RANK_LEAD_SECONDS of the stall's
    beginning (before or after it), and not after its end."""
    best: tuple[float, str, str] | None = None
    for inst, n in sorted(nodes.items()):
        j = n.jobs.get(job_id)
        if j is None:
            continue
        lo, hi = start - LOST_RANK_LEAD_SECONDS, min(end, start + LOST_RANK_LEAD_SECONDS)
        for rank, s in j.rank_lost.items():
            # each loss, not only the first: an elastic job restarts a rank (lost 0 again),
            # and a loss long before the stall must not hide the one it follows
            at = next((t for t in _losses(s) if lo <= t <= hi), None)
            if at is not None and (best is None or (at, inst, rank) < best):
                best = (at, inst, rank)
    if best is None:
        return None
    at, inst, rank = best
    status = nodes[inst].jobs[job_id].rank_exit_status.get(rank)
    said = zip(status.ts, status.vs, strict=True) if status is not None else ()
    code = next((v for t, v in said if t >= at), None)  # reported with (or after) this loss
    return inst, rank, exit_words(code)


def _losses(s: Series) -> list[float]:
    """When the rank was seen lost: each time its series turns 1 (from 0, or at its
    first sample)."""
    out, before = [], 0.0
    for t, v in zip(s.ts, s.vs, strict=True):
        if v >= 1.0 > before:
            out.append(t)
        before = v
    return out


def _own_causes(
    windows: Sequence[Window], start: float, end: float
) -> dict[str, dict[Cause, float]]:
    """instance -> seconds, within [start, end], of windows with a cause of their own that
    began with the stall (a GPU lost an hour ago is no reason for it)."""
    own: dict[str, dict[Cause, float]] = {}
    for w in windows:
        if w.cause is Cause.LOW_DEMAND:
            continue  # a server with no request waiting holds no peer back
        d = min(w.end_seconds, end) - max(w.start_seconds, start)
        if not is_waiting(w) and d > 0 and w.start_seconds >= start - CLUSTER_GAP_SECONDS:
            per = own.setdefault(w.instance, {})
            per[w.cause] = per.get(w.cause, 0.0) + d
    return own


def _cause_on(own: dict[Cause, float] | None) -> Cause:
    if not own:
        return Cause.UNKNOWN  # the culprit's node shows no reason: said, not guessed
    return max(own, key=lambda c: own[c])


def _named_gpu(windows: Sequence[Window], inst: str) -> str:
    """A GPU the culprit node's own windows name (a throttled or failed peer), or the one
    GPU they are on."""
    named: set[str] = set()
    gpus: set[str] = set()
    for w in windows:
        if w.instance != inst or is_waiting(w):
            continue
        gpus.add(w.gpu)
        ev = dict(w.evidence)
        for key in (Ctx.THROTTLED_PEERS, Ctx.FAILED_PEERS):
            v = ev.get(key)
            if isinstance(v, str) and v:
                named.update(v.split(","))
    if len(named) == 1:
        return next(iter(named))
    if not named and len(gpus) == 1:
        return next(iter(gpus))
    return ""


def _rank_share(node: NodeSeries, job_id: str, start: float, end: float) -> dict[str, float]:
    """rank -> collective wait, seconds per second over [start, end], for the ranks of the
    job on this node that reported shortly before the stall."""
    j = node.jobs.get(job_id)
    if j is None or end <= start:
        return {}
    out: dict[str, float] = {}
    for (rank, phase), s in j.rank_phases.items():
        if phase != "collective_wait" or not len(s):
            continue
        info = j.rank_info.get(rank)
        if info is not None and info.value_at(start, ACTIVE_LOOKBACK_SECONDS) is None:
            continue  # the rank had left the job before the stall
        a, b = s.value_at(start, ACTIVE_LOOKBACK_SECONDS), s.value_at(end, ACTIVE_LOOKBACK_SECONDS)
        if a is None or b is None:
            continue
        out[rank] = max(0.0, b - a) / (end - start)
    return out


def _last_to_arrive(
    job_id: str, nodes: Mapping[str, NodeSeries], shares: Mapping[str, Mapping[str, float]]
) -> tuple[str, str, str, str] | None:
    """(instance, gpu, uuid, rank) of the ranks that wait clearly least in collectives
    (`shares`: instance -> `_rank_share`): all on one node (gpu, uuid and rank "" unless
    one rank alone arrives last)."""
    every = [(x, inst, rank) for inst, mine in shares.items() for rank, x in mine.items()]
    if len(every) < 2:
        return None
    mid = median(x for x, _, _ in every)
    late = [(inst, rank) for x, inst, rank in every if x <= LAST_ARRIVER_RATIO * mid]
    if mid < MIN_MEDIAN_WAIT or not late or len({i for i, _ in late}) > 1:
        return None  # nobody clearly last, or ranks on several nodes
    inst = late[0][0]
    return _ranks_culprit(job_id, nodes, inst, [r for _, r in late], set(shares[inst]))


def _ranks_culprit(
    job_id: str,
    nodes: Mapping[str, NodeSeries],
    inst: str,
    late: Sequence[str],
    active: Iterable[str],
) -> tuple[str, str, str, str]:
    """(instance, gpus, uuids, ranks) of the late ranks on one node, each list comma
    separated in rank order; all "" but the instance where several ranks are late and
    they are every active rank of the job on that node (the node as a whole holds the
    job back). One late rank is named with its GPU, as before, whatever else runs there."""
    ranks = sorted(set(late), key=_rank_order)
    if len(ranks) > 1 and set(active) <= set(ranks):
        return inst, "", "", ""
    n = nodes[inst]
    j = n.jobs[job_id]
    uuids = [j.rank_uuid.get(r, "") for r in ranks]
    gpus = [next((g for g, c in n.gpus.items() if u and c.uuid == u), "") for u in uuids]
    if len(ranks) > 1 and not all(gpus):
        return inst, "", "", ""  # ranks whose GPUs are not known: only their node is
    return inst, ",".join(gpus), ",".join(uuids), ",".join(ranks)


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 62, rank)


def _by_frontier(
    job_id: str, nodes: Mapping[str, NodeSeries], fr: Frontier
) -> tuple[str, str, str, str] | Imbalance | None:
    """What the stall's per-step frontier decides: the ranks on one node that gate most
    steps (the culprit), a pipeline stage that gates them on every replica, or a gating
    data-parallel rank that rotates (the job's imbalances); None: undecided."""
    gating = fr.persistent()
    coords = _coords(nodes, job_id)
    group = {k: c["dp"] for k, c in coords.items() if "dp" in c}
    if not group:  # no coordinates: every rank its own data-parallel replica
        group = {k: i for i, k in enumerate(sorted(fr.busy_share))}
    if gating and _replica_by_turns(gating, group, fr):
        gating = frozenset()
    if gating:
        stage = _stage_of(gating, coords, fr)
        if stage is not None:
            return stage
        on = {inst for inst, _ in gating}
        if len(on) == 1:
            inst = on.pop()
            active = [r for i, r in fr.busy_share if i == inst]
            return _ranks_culprit(job_id, nodes, inst, [r for _, r in gating], active)
        return None
    turns = fr.rotating(group)
    if turns:
        return Imbalance(StragglerReason.INPUT_IMBALANCE, groups=turns, steps=fr.attributed)
    return None


def _replica_by_turns(
    gating: frozenset[RankKey], group: Mapping[RankKey, int], fr: Frontier
) -> bool:
    """Whether the persistent gates are one whole data-parallel replica (every reporting
    rank of it) whose share of the slices replicas taking turns at random give often
    enough (`frontier.by_turns`): two replicas, one gating 6 of 9 slices, is a rotation
    as likely as a culprit. A slow worker that is only part of its replica (one stage of
    it) is judged as before, and a whole replica that gates every slice of enough of
    them is persistent (5 of 5 of two replicas: 3% by turns)."""
    ids = {group.get(k, -1) for k in gating}
    if len(ids) != 1 or -1 in ids:
        return False
    (replica,) = ids
    members = frozenset(k for k in fr.busy_share if group.get(k) == replica)
    if gating != members:
        return False
    return by_turns(fr.gated_by(members), fr.attributed, len(set(group.values())))


def _coords(nodes: Mapping[str, NodeSeries], job_id: str) -> dict[RankKey, dict[str, int]]:
    out: dict[RankKey, dict[str, int]] = {}
    for inst, n in nodes.items():
        j = n.jobs.get(job_id)
        if j is not None:
            out.update(((inst, r), c) for r, c in j.rank_coords.items())
    return out


def _stage_of(
    gating: frozenset[RankKey], coords: Mapping[RankKey, Mapping[str, int]], fr: Frontier
) -> Imbalance | None:
    """A stage imbalance: the gating ranks are every reporting rank of one pipeline stage,
    across two data-parallel replicas or more (one replica's stage alone is a slow worker)."""
    if not all("pp" in coords.get(k, {}) and "dp" in coords.get(k, {}) for k in gating):
        return None
    stages = {coords[k]["pp"] for k in gating}
    if len(stages) != 1:
        return None
    stage = stages.pop()
    of_stage = {k for k in fr.busy_share if coords.get(k, {}).get("pp") == stage}
    if not of_stage <= gating or len({coords[k]["dp"] for k in gating}) < 2:
        return None
    others = [x for k, x in fr.busy_share.items() if k not in gating]
    mine = [fr.busy_share[k] for k in gating if k in fr.busy_share]
    if not others or not mine or median(others) <= 0:
        return None
    factor = median(mine) / median(others)
    return Imbalance(StragglerReason.STAGE_IMBALANCE, stage, factor, steps=fr.attributed)


def _node_waits(shares: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """instance -> its ranks' median collective wait over the stall, seconds/second
    (`shares`: instance -> `_rank_share`)."""
    return {inst: median(mine.values()) for inst, mine in shares.items() if mine}


def _holding_back(
    own: Mapping[str, dict[Cause, float]], waits: Mapping[str, float]
) -> dict[str, dict[Cause, float]]:
    """The nodes with a cause of their own that may hold the job back (see (3) above)."""
    return {i: c for i, c in own.items() if not _waits_like_peers(i, c, waits)}


def _waits_like_peers(inst: str, causes: Mapping[Cause, float], waits: Mapping[str, float]) -> bool:
    """Whether `inst`'s ranks wait in collectives about as long as the other nodes' ranks
    (`waits`: `_node_waits`), so its own cause does not hold them back. A `network` cause
    never counts as that: a slow link keeps its own node's ranks in the collective as long
    as everyone's."""
    if _cause_on(dict(causes)) is Cause.NETWORK:
        return False
    others = [x for i, x in waits.items() if i != inst]
    if inst not in waits or not others:
        return False
    peers = median(others)
    return peers >= MIN_MEDIAN_WAIT and waits[inst] >= PEER_WAIT_SHARE * peers


def _busiest_link(
    nodes: Mapping[str, NodeSeries], waits: Mapping[str, float], start: float, end: float
) -> tuple[str, LinkUse, float] | None:
    """(instance, its link, the busiest other node's share) of the one node whose link
    carried far more of what it can carry than any other node's over the stall, while
    the job's ranks waited in collectives (`waits`: `_node_waits`; see the module's doc)."""
    if len(waits) < 2 or median(waits.values()) < MIN_MEDIAN_WAIT:
        return None
    uses = sorted(
        ((u.utilization_ratio, inst, u) for inst, n in nodes.items()
         if (u := busiest_link(n, start, end)) is not None),
        key=lambda x: x[0],
        reverse=True,
    )  # fmt: skip
    if len(uses) < 2:
        return None
    (top, inst, use), second = uses[0], uses[1][0]
    if top >= LINK_BUSY_RATIO and second < LINK_CLEAR_SHARE * top:
        return inst, use, second
    return None


def _busiest_gpu(
    job_id: str,
    nodes: Mapping[str, NodeSeries],
    start: float,
    end: float,
    threshold_ratio: float,
) -> tuple[str, str]:
    """(instance, gpu) of the one GPU of the job that stays busy over the stall while the
    job's median GPU does not (a slow GPU everyone waits for); ("", "") if none."""
    means: list[tuple[float, str, str]] = []
    for inst, n in nodes.items():
        for (job, gpu), _s in n.job_info.items():
            g = n.gpus.get(gpu)
            if job != job_id or g is None:
                continue
            u = _mean_working(g.fields, start, end)
            if u is not None:
                means.append((u, inst, gpu))
    if len(means) < 2:
        return "", ""
    means.sort(reverse=True)
    top, second = means[0][0], means[1][0]
    mid = median(m for m, _, _ in means)
    if top >= threshold_ratio and second < threshold_ratio and mid < threshold_ratio:
        return means[0][1], means[0][2]
    return "", ""


def _mean_working(fields: Mapping[str, Series], start: float, end: float) -> float | None:
    """Mean utilization over [start, end]; where SM activity exists, no more than SM
    activity over its median before the stall (a GPU spinning in a collective reads busy
    but is not working)."""
    util = fields.get("util")
    if util is None:
        return None
    sm = fields.get("sm_active")
    i0, i1 = util.index_at(start), util.index_at(end)
    vals = [util.vs[k] for k in range(max(i0, 0), i1 + 1) if util.ts[k] >= start]
    if not vals:
        return None
    if sm is not None and len(sm):
        base = median(sm.vs[: max(1, sm.index_at(start))])
        j0, j1 = sm.index_at(start), sm.index_at(end)
        svals = [sm.vs[k] for k in range(max(j0, 0), j1 + 1) if sm.ts[k] >= start]
        if svals and base > 0.02:
            return min(sum(vals) / len(vals), sum(svals) / len(svals) / base)
    return sum(vals) / len(vals)


def _rank_of(node: NodeSeries, job_id: str, uuid: str) -> str:
    j = node.jobs.get(job_id)
    if j is None or not uuid:
        return ""
    return next((r for r, u in j.rank_uuid.items() if u == uuid), "")


def _only_rank(node: NodeSeries, job_id: str, start: float) -> str:
    """The job's one rank on this node, where it has exactly one that reported shortly
    before the stall (a CPU-only rank has no GPU to find it by)."""
    j = node.jobs.get(job_id)
    if j is None:
        return ""
    ranks = [r for r, s in j.rank_info.items() if s.value_at(start, ACTIVE_LOOKBACK_SECONDS)]
    return ranks[0] if len(ranks) == 1 else ""


def _held_anyway(w: Window, found: Found, start: float, end: float) -> bool:
    """Whether a window with a cause of its own on another node than the culprit's is a
    victim all the same: the culprit was found by the ranks' waits or the links (not by
    a node's own windows), the window's cause may be a host-wide reading (busy CPUs, I/O
    pressure another tenant makes), its ranks wait in collectives as long as the other
    nodes' over the stall, and it lies mostly within the stall (a reason older than the
    stall stays its node's)."""
    if found.signal not in WAIT_SIGNALS or w.cause not in HOST_WIDE_CAUSES:
        return False
    inside = min(w.end_seconds, end) - max(w.start_seconds, start)
    if inside < 0.5 * w.duration_seconds:
        return False
    return _waits_like_peers(w.instance, {w.cause: inside}, found.node_waits)


def _is_culprit_gpu(w: Window, c: Culprit) -> bool:
    """The culprit's own window (any on its node when the culprit is the whole node; its
    node's other GPUs, which wait like every victim, are victims)."""
    return w.instance == c.instance and (not c.gpu or w.gpu in c.gpu.split(","))


def imbalance_words(x: Imbalance) -> str:
    """The finding for the job's owner, in words."""
    if x.reason is StragglerReason.STAGE_IMBALANCE:
        return (
            f"pipeline stage {x.stage} is the bottleneck on every replica ({x.factor:.1f}x "
            "the other stages): rebalance its layers"
        )
    return (
        f"the slowest data-parallel rank changes every step ({x.groups} ranks in turn over "
        f"{x.steps} steps): input imbalance (sequence lengths), bucket or pack the batches"
    )


def as_imbalanced(w: Window, x: Imbalance) -> Window:
    """A window of a stall the job's own imbalance explains: `straggler` with no culprit
    (no worker or node is at fault), the finding in evidence and summary."""
    who = f"GPU {w.gpu}" if w.gpu else "CPU job"
    summary = f"{who} (job {w.job_id}) {HEADLINES[Cause.STRAGGLER]}: " + imbalance_words(x)
    drop = ("culprit_signal", "culprit_exit", "straggler_reason", "pipeline_stage")
    ev = tuple(kv for kv in w.evidence if kv[0] not in drop and kv[0] != "stage_factor")
    ev = (*ev, ("straggler_reason", x.reason.value), ("culprit_signal", "frontier"))
    if x.reason is StragglerReason.STAGE_IMBALANCE:
        ev = (*ev, ("pipeline_stage", x.stage), ("stage_factor", round(x.factor, 2)))
    return replace(
        w, cause=Cause.STRAGGLER, evidence=ev, summary=summary, culprit=None, network_reason=""
    )


def culprit_words(c: Culprit, tier: str = "", how: str = "") -> str:
    many = "s" if "," in c.gpu else ""
    where = (
        c.instance
        + (f" GPU{many} {c.gpu}" if c.gpu else "")
        + (f" (rank{many} {c.rank})" if c.rank else "")
    )
    if how:  # a lost rank: how it ended says more than its node's idle GPU
        verb = "was " if how.startswith("killed") else ""
        return f"{where}, whose rank process {verb}{how}"
    return f"{where}, which " + CULPRIT_WORDS[c.cause].format(tier=tier or "data")


def as_lost(w: Window, found: Found) -> Window:
    """The lost rank's own window, which its node could not explain (its GPU just went
    quiet): `idle`, with how the rank ended in evidence and summary."""
    c = found.culprit
    who = f"GPU {w.gpu}" if w.gpu else "CPU job"
    verb = "was " if found.exit.startswith("killed") else ""
    summary = (
        f"{who} (job {w.job_id}) runs nothing of its job: its rank"
        + (f" {c.rank}" if c.rank else "")
        + f" process {verb}{found.exit}"
    )
    ev = (*w.evidence, ("culprit_signal", found.signal), ("culprit_exit", found.exit))
    return replace(w, cause=Cause.IDLE, evidence=ev, summary=summary)


def as_link_culprit(w: Window, link: LinkUse, peer_ratio: float) -> Window:
    """The culprit's own window where its link is the job's bottleneck (its node alone
    read it as waiting for a peer): `network`, `saturated`, with the link in evidence."""
    who = f"GPU {w.gpu}" if w.gpu else "CPU job"
    summary = (
        f"{who} (job {w.job_id}) {HEADLINES[Cause.NETWORK]} "
        f"({NETWORK_REASON_WORDS[NetworkReason.SATURATED]}): {link.port} carried "
        f"{_share(link.utilization_ratio)} or more of what it can carry for a quarter of the "
        "job's stall, the job's "
        f"busiest link (the other nodes' at most {_share(peer_ratio)}), while its ranks wait "
        "in collectives"
    )
    ev = tuple(kv for kv in w.evidence if kv[0] != "culprit_signal")
    return replace(
        w,
        cause=Cause.NETWORK,
        evidence=(
            *ev,
            (F.NETWORK_UTILIZATION_RATIO, round(link.utilization_ratio, 4)),
            (Ctx.NETWORK_DEVICE, link.port),
            ("culprit_signal", "busiest_link"),
        ),
        summary=summary,
        network_reason=NetworkReason.SATURATED.value,
    )


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.2%}"


def as_straggler(w: Window, found: Found) -> Window:
    """The victim's window: cause straggler, the culprit in evidence and summary."""
    c = found.culprit
    who = f"GPU {w.gpu}" if w.gpu else "CPU job"
    summary = (
        f"{who} (job {w.job_id}) {HEADLINES[Cause.STRAGGLER]}: job {w.job_id} waits on "
        + culprit_words(c, found.tier, found.exit)
    )
    drop = ("culprit_signal", "culprit_exit", "culprit_wait_share")
    ev = tuple(kv for kv in w.evidence if kv[0] not in drop)
    said = (("culprit_exit", found.exit),) if found.exit else ()
    if found.wait_share > 0:  # the frontier's account: how much of the wait is theirs
        said = (*said, ("culprit_wait_share", round(found.wait_share, 3)))
    if not is_waiting(w):  # its node's own reading, kept beside the culprit
        ev = (*ev, ("node_cause", w.cause.value))
    return replace(
        w,
        cause=Cause.STRAGGLER,
        evidence=(*ev, ("culprit_signal", found.signal), *said),
        summary=summary,
        culprit=c,
        network_reason="",  # a `peer` network window: its peer is now named
    )
