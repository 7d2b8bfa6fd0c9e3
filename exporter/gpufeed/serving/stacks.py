"""The demand a serving stack reports on its own Prometheus endpoint, parsed from the text.

Each stack names its queue differently; `STACKS` maps the real metric names (sources in
tests/fixtures/serving/README.md) to the four numbers gpufeed exports:

- requests waiting: admitted, not yet scheduled (vLLM `vllm:num_requests_waiting`, Triton
  `nv_inference_pending_request_count` per model, TGI `tgi_queue_size`), summed over the
  stack's series (models, engines);
- requests running: in the batch on the GPU now (vLLM `vllm:num_requests_running`, TGI
  `tgi_batch_current_size`; Triton has no such gauge: absent);
- KV-cache usage, 0..1 (vLLM `vllm:kv_cache_usage_perc`, before V1 `vllm:gpu_cache_usage_perc`,
  both already a fraction despite the name; the highest of its engines; Triton and TGI
  export none: absent);
- requests completed, a counter (vLLM `vllm:request_success_total` over its finish reasons,
  Triton `nv_inference_request_success`, TGI `tgi_request_success`).

The stack is recognised by its waiting metric; text with none of them is not a serving
endpoint gpufeed knows (None). Lines that are not samples are skipped, never guessed at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import MappingProxyType

SERVERS = ("vllm", "triton", "tgi")


@dataclass(frozen=True, slots=True)
class Stack:
    server: str
    waiting: tuple[str, ...]
    running: tuple[str, ...] = ()
    kv_cache: tuple[str, ...] = ()  # in order of preference (the newer name first)
    completed: tuple[str, ...] = ()


STACKS: tuple[Stack, ...] = (
    Stack(
        "vllm",
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
        kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        completed=("vllm:request_success_total",),
    ),
    Stack(
        "triton",
        waiting=("nv_inference_pending_request_count",),
        completed=("nv_inference_request_success",),
    ),
    Stack(
        "tgi",
        waiting=("tgi_queue_size",),
        running=("tgi_batch_current_size",),
        completed=("tgi_request_success", "tgi_request_success_total"),
    ),
)
_BY_SERVER = MappingProxyType({s.server: s for s in STACKS})


@dataclass(frozen=True, slots=True)
class Demand:
    """One reading of a serving endpoint; None: the stack does not report it."""

    server: str
    requests_waiting: float
    requests_running: float | None = None
    kv_cache_usage_ratio: float | None = None
    requests_completed: float | None = None


def parse_serving_metrics(text: str, server: str = "") -> Demand | None:
    """The demand in a serving stack's exposition text; `server` (vllm|triton|tgi) says which
    stack, else it is recognised by its queue metric. None: no known queue metric in it."""
    return parse_serving_lines(text.splitlines(), server)


def parse_serving_lines(lines: Iterable[str], server: str = "") -> Demand | None:
    """`parse_serving_metrics` over the text's lines as they arrive: only the stack's own
    metrics are kept, each as a running sum and maximum, so what a body costs in memory does
    not grow with its size (an endpoint may answer megabytes of histograms)."""
    stacks = stack_candidates(server)
    wanted = set(metric_names(server))
    values: dict[str, _Acc] = {}
    for name, value in _samples(lines):
        if name not in wanted or not math.isfinite(value) or value < 0:
            continue
        acc = values.get(name)
        if acc is None:
            values[name] = _Acc(value, value)
        else:
            acc.total += value
            acc.highest = max(acc.highest, value)
    for st in stacks:
        waiting = _first(values, st.waiting, False)
        if waiting is None:
            continue
        return Demand(
            st.server,
            waiting,
            _first(values, st.running, False),
            _first(values, st.kv_cache, True),
            _first(values, st.completed, False),
        )
    return None


def stack_candidates(server: str = "") -> tuple[Stack, ...]:
    """The stacks an endpoint's text is read as: the one named, else every one."""
    return (_BY_SERVER[server],) if server else STACKS


def metric_names(server: str = "") -> tuple[str, ...]:
    """Every metric name the stacks in question are read from (a line naming none of them
    can be skipped before it is parsed)."""
    return tuple(sorted({n for st in stack_candidates(server) for n in _names(st)}))


def _names(st: Stack) -> tuple[str, ...]:
    return st.waiting + st.running + st.kv_cache + st.completed


class _Acc:
    """The valid (finite, non-negative) samples of one metric so far: their sum and maximum."""

    __slots__ = ("highest", "total")

    def __init__(self, total: float, highest: float) -> None:
        self.total = total
        self.highest = highest


def _first(values: dict[str, _Acc], names: tuple[str, ...], highest: bool) -> float | None:
    """The first of `names` that has valid samples: their sum, or their maximum."""
    for n in names:
        acc = values.get(n)
        if acc is not None:
            return acc.highest if highest else acc.total
    return None


def _samples(lines: Iterable[str]) -> Iterator[tuple[str, float]]:
    """(name, value) of each sample line of Prometheus/OpenMetrics text; label sets are
    skipped over (label values may hold '}' or spaces inside their quotes)."""
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, end = line[:brace], _label_end(line, brace + 1)
            if end < 0:
                continue
            rest = line[end + 1 :].split()
        else:
            name, *rest = line.split()
        if not rest:
            continue
        try:
            yield name, float(rest[0])
        except ValueError:
            continue


def _label_end(line: str, i: int) -> int:
    """The index of the '}' that closes the label set opened before `i`, or -1."""
    quoted = False
    while i < len(line):
        c = line[i]
        if quoted and c == "\\":
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return i
        i += 1
    return -1
