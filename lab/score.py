"""Scores what an agent said (its windows) against a scenario's schedule (its `expect`).

Everything is time-weighted, in seconds from the scenario's start:

- per cause precision (the share of time in windows of that cause that the schedule calls
  that cause), recall (the share of the schedule's time of that cause inside a window of
  that cause) and F1;
- the share of healthy time (scored time no `expect` entry covers) inside any window;
- per `expect` entry: its recall, the time from onset to the agent first showing a window
  with the right cause, and whether the windows name the expected tier / device / reason;
- and first of all whether the fault BIT: the workload's own step throughput during the
  entry against its throughput in healthy time. An entry whose fault did not slow the job
  is reported as `bit: false` and left out of every other figure (neither truth nor
  healthy time): a fault that did not happen cannot be missed.

The inputs are plain data (windows as the agent's JSON, the workload's step log, the
runner's polls of /api/windows), so the multi-node harness scores its nodes the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.scenario import Expect, Scenario

Interval = tuple[float, float]

# The workload is stalled when its throughput is at most this share of its healthy one:
# the same 0.8 as the correlator's utilization threshold, on the job's own clock.
BITE_THROUGHPUT_RATIO = 0.8
# Targets (issue 12): named for >= 80% of its fault time, <= 5% of healthy time inside a
# window, the right cause within 90 s of onset.
TARGET_RECALL = 0.8
TARGET_HEALTHY_IN_WINDOW = 0.05
TARGET_DETECT_SECONDS = 90.0
# Where a window's evidence names each kind of thing an `expect` entry can ask for.
EVIDENCE_KEYS: dict[str, tuple[str, ...]] = {
    "tier": ("data_tier", "checkpoint_tier", "load_tier", "tier"),
    "device": ("network_device", "device", "gpu"),
    "reason": ("reason", "throttle_reasons", "network_reason", "cpu_reason"),
}


@dataclass(frozen=True, slots=True)
class LabWindow:
    """One window as the agent reported it, in seconds from the scenario's start."""

    start_s: float
    end_s: float
    cause: str
    evidence: tuple[tuple[str, Any], ...] = ()
    summary: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any], t0: float, now: float | None = None) -> LabWindow:
        ev = dict(d.get("evidence") or {})
        summary = str(ev.pop("summary", ""))
        end = float(d["end"]) if d.get("end") is not None else (now or float(d["start"]))
        return cls(float(d["start"]) - t0, end - t0, str(d["cause"]), tuple(ev.items()), summary)


@dataclass(frozen=True, slots=True)
class Sighting:
    """The runner saw, at `seen_s`, a window (open or closed) with `cause` starting at
    `start_s`: when the agent first said it, which the log's start times cannot tell."""

    seen_s: float
    start_s: float
    cause: str
    end_s: float | None = None  # None: open when seen


@dataclass(frozen=True, slots=True)
class Step:
    """One training step on the workload's own clock: when it ended and how long it took."""

    end_s: float
    seconds: float
    compute_s: float  # device stand-in and loop body: what the GPU would be busy for


@dataclass(frozen=True, slots=True)
class NodeRun:
    """What one node's run produced."""

    node: int
    windows: tuple[LabWindow, ...]
    steps: tuple[Step, ...]
    sightings: tuple[Sighting, ...] = ()
    ran_s: float = 0.0  # how long the run lasted (a failed run ends early)


@dataclass(frozen=True, slots=True)
class ExpectScore:
    node: int
    start_s: float
    stop_s: float
    cause: str
    bit: bool
    throughput_ratio: float | None  # the entry's step rate / healthy step rate
    recall: float | None = None
    detect_s: float | None = None  # None: never named
    detect_estimated: bool = False  # no sightings: from the window's start + min window
    caused_as: dict[str, float] = field(default_factory=dict)  # seconds per cause said
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)

    def passed(self) -> bool:
        return (
            self.bit
            and (self.recall or 0.0) >= TARGET_RECALL
            and self.detect_s is not None
            and self.detect_s <= TARGET_DETECT_SECONDS
        )


@dataclass(frozen=True, slots=True)
class CauseScore:
    cause: str
    truth_s: float
    said_s: float
    agree_s: float

    @property
    def precision(self) -> float | None:
        return self.agree_s / self.said_s if self.said_s > 0 else None

    @property
    def recall(self) -> float | None:
        return self.agree_s / self.truth_s if self.truth_s > 0 else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if p is None or r is None:
            return None
        return 0.0 if p + r == 0 else 2 * p * r / (p + r)


@dataclass(frozen=True, slots=True)
class ScenarioScore:
    scenario: str
    causes: tuple[CauseScore, ...]
    healthy_s: float
    healthy_in_window_s: float
    entries: tuple[ExpectScore, ...]

    @property
    def healthy_in_window(self) -> float | None:
        return self.healthy_in_window_s / self.healthy_s if self.healthy_s > 0 else None

    def passed(self) -> bool:
        scored = [e for e in self.entries if e.bit]
        share = self.healthy_in_window
        return (
            bool(scored)
            and all(e.passed() for e in scored)
            and (share is None or share <= TARGET_HEALTHY_IN_WINDOW)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "passed": self.passed(),
            "healthy_s": round(self.healthy_s, 1),
            "healthy_in_window_ratio": _r(self.healthy_in_window),
            "causes": {
                c.cause: {
                    "truth_s": round(c.truth_s, 1),
                    "said_s": round(c.said_s, 1),
                    "agree_s": round(c.agree_s, 1),
                    "precision": _r(c.precision),
                    "recall": _r(c.recall),
                    "f1": _r(c.f1),
                }
                for c in self.causes
            },
            "expect": [
                {
                    "node": e.node,
                    "start_s": e.start_s,
                    "stop_s": e.stop_s,
                    "cause": e.cause,
                    "bit": e.bit,
                    "throughput_ratio": _r(e.throughput_ratio),
                    "recall": _r(e.recall),
                    "detect_s": _r(e.detect_s, 1),
                    "detect_estimated": e.detect_estimated,
                    "caused_as": {k: round(v, 1) for k, v in sorted(e.caused_as.items())},
                    "evidence": e.evidence,
                    "passed": e.passed(),
                }
                for e in self.entries
            ],
        }


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None or math.isnan(v) else round(v, digits)


# ---- interval arithmetic --------------------------------------------------------------


def union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in union(intervals))


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    out = []
    for s1, e1 in union(a):
        for s2, e2 in union(b):
            s, e = max(s1, s2), min(e1, e2)
            if e > s:
                out.append((s, e))
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    out: list[Interval] = []
    cuts = union(b)
    for s, e in union(a):
        cur = s
        for cs, ce in cuts:
            if ce <= cur or cs >= e:
                continue
            if cs > cur:
                out.append((cur, cs))
            cur = max(cur, ce)
        if cur < e:
            out.append((cur, e))
    return out


# ---- the stall check ------------------------------------------------------------------


def step_rate(steps: Sequence[Step], spans: Sequence[Interval]) -> float | None:
    """Steps per second ending inside `spans` (None when the spans are empty)."""
    total = length(spans)
    if total <= 0:
        return None
    n = sum(1 for st in steps if any(s <= st.end_s < e for s, e in spans))
    return n / total


def throughput_ratio(
    steps: Sequence[Step], entry: Interval, healthy: Sequence[Interval]
) -> float | None:
    base = step_rate(steps, healthy)
    now = step_rate(steps, [entry])
    if base is None or now is None or base <= 0:
        return None
    return now / base


# ---- scoring --------------------------------------------------------------------------


def score(scenario: Scenario, runs: Sequence[NodeRun], min_window_s: float = 60.0) -> ScenarioScore:
    by_node = {r.node: r for r in runs}
    entries: list[ExpectScore] = []
    truth: dict[str, list[Interval]] = {}
    said: dict[str, list[Interval]] = {}
    healthy_total = healthy_hit = 0.0
    for node in range(scenario.nodes):
        run = by_node.get(node)
        if run is None:
            continue
        end = min(scenario.duration_s, run.ran_s) if run.ran_s > 0 else scenario.duration_s
        scored = [(scenario.settle_s, end)]
        mine = [e for e in scenario.expect if e.node == node]
        healthy = subtract(scored, [(e.start_s, e.stop_s) for e in mine])
        node_entries = [_entry(e, run, healthy, end, min_window_s) for e in mine]
        entries.extend(node_entries)
        # entries whose fault did not bite are neither truth nor healthy time
        dropped = [(e.start_s, e.stop_s) for e in node_entries if not e.bit]
        scored = subtract(scored, dropped)
        windows = [(w.start_s, w.end_s, w.cause) for w in run.windows]
        for e in node_entries:
            if e.bit:
                truth.setdefault(e.cause, []).extend(
                    (node * 1e9 + s, node * 1e9 + t)
                    for s, t in intersect([(e.start_s, e.stop_s)], scored)
                )
        for s, t, c in windows:
            said.setdefault(c, []).extend(
                (node * 1e9 + a, node * 1e9 + b) for a, b in intersect([(s, t)], scored)
            )
        all_windows = [(s, t) for s, t, _ in windows]
        healthy_total += length(healthy)
        healthy_hit += length(intersect(healthy, all_windows))
    causes = tuple(
        CauseScore(
            c,
            length(truth.get(c, [])),
            length(said.get(c, [])),
            length(intersect(truth.get(c, []), said.get(c, []))),
        )
        for c in sorted(set(truth) | set(said))
        if length(truth.get(c, [])) + length(said.get(c, [])) > 0
    )
    return ScenarioScore(scenario.name, causes, healthy_total, healthy_hit, tuple(entries))


def _entry(
    e: Expect, run: NodeRun, healthy: list[Interval], end: float, min_window_s: float
) -> ExpectScore:
    span = (e.start_s, min(e.stop_s, end))
    if span[1] <= span[0]:  # the run ended before the entry began: nothing to judge
        return ExpectScore(e.node, e.start_s, e.stop_s, e.cause.value, False, None)
    ratio = throughput_ratio(run.steps, span, healthy)
    bit = ratio is not None and ratio <= BITE_THROUGHPUT_RATIO
    if not run.steps and e.cause in ("startup", "idle"):
        bit = True  # no step at all: nothing ran, which is the fault
        ratio = 0.0
    caused_as: dict[str, float] = {}
    for w in run.windows:
        d = length(intersect([span], [(w.start_s, w.end_s)]))
        if d > 0:
            caused_as[w.cause] = caused_as.get(w.cause, 0.0) + d
    if not bit:
        return ExpectScore(
            e.node, e.start_s, e.stop_s, e.cause.value, False, ratio, caused_as=caused_as
        )
    right = [w for w in run.windows if w.cause == e.cause.value]
    hit = length(intersect([span], [(w.start_s, w.end_s) for w in right]))
    detect, estimated = _detect(e, right, run.sightings, min_window_s)
    return ExpectScore(
        e.node,
        e.start_s,
        e.stop_s,
        e.cause.value,
        True,
        ratio,
        recall=hit / (span[1] - span[0]),
        detect_s=detect,
        detect_estimated=estimated,
        caused_as=caused_as,
        evidence=_evidence(e, right),
    )


def _detect(
    e: Expect, right: list[LabWindow], sightings: Sequence[Sighting], min_window_s: float
) -> tuple[float | None, bool]:
    """Seconds from onset until the agent first showed a window of the right cause that
    overlaps the entry; from the runner's sightings, else the window's start plus the
    minimum window (when the live correlator can first have known it)."""
    seen = [
        s.seen_s
        for s in sightings
        if s.cause == e.cause.value
        and s.seen_s >= e.start_s
        and s.start_s < e.stop_s
        and (s.end_s is None or s.end_s > e.start_s)  # not an earlier window seen again
    ]
    if seen:
        return max(0.0, min(seen) - e.start_s), False
    known = [
        max(w.start_s, e.start_s) + min_window_s
        for w in right
        if w.start_s < e.stop_s and w.end_s > e.start_s
    ]
    if known:
        return min(known) - e.start_s, True
    return None, False


def _evidence(e: Expect, right: list[LabWindow]) -> dict[str, dict[str, Any]]:
    """For each thing the entry expects named (tier: hot): the share of the entry's
    right-cause window time whose evidence names it, and whether the summary does, with
    what the windows said instead."""
    out: dict[str, dict[str, Any]] = {}
    span = [(e.start_s, e.stop_s)]
    for key, want in e.evidence:
        fields = EVIDENCE_KEYS.get(key, (key,))
        named_s = summary_s = total = 0.0
        said: set[str] = set()
        for w in right:
            d = length(intersect(span, [(w.start_s, w.end_s)]))
            if d <= 0:
                continue
            total += d
            ev = dict(w.evidence)
            values = {str(ev[f]) for f in fields if f in ev}
            said.update(values)
            if any(_names(key, want, v) for v in values):
                named_s += d
            if want.lower() in w.summary.lower():
                summary_s += d
        out[key] = {
            "want": want,
            "in_evidence": _r(named_s / total) if total else None,
            "in_summary": _r(summary_s / total) if total else None,
            "said": sorted(said),
        }
    return out


def _names(key: str, want: str, value: str) -> bool:
    """Whether an evidence value names what is wanted: a tier or device exactly (one item
    of a list counts), a reason as a word or word stem anywhere in it ("throttl")."""
    if key == "reason":
        return want.lower() in value.lower()
    return want in {p.strip() for p in value.replace(";", ",").split(",")} | {value}
