"""How a streamed Prometheus analysis splits its instances: job groups, shards, batches.

The unit of work is a **job group**: the instances that share a job (a `job_id` in
`gpufeed_job_info` on each of them), joined transitively, so that every instance of a
multi-node job lands in one batch and one shard, where a job-level view can join them. An
instance without a job is a group of its own. Everything here is a pure function of the
discovered (instance, job) pairs: every process of a sharded run, given the same range and
selector, computes the same plan, with no coordination.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Batch:
    """Instances fetched and analysed together: whole job groups, sorted."""

    index: int  # 1-based, within the shard
    instances: tuple[str, ...]

    def describe(self, of: int) -> str:
        """'batch 3/16 (16 instances, node-033:9842 .. node-048:9842)' for messages."""
        first, last = self.instances[0], self.instances[-1]
        span = first if first == last else f"{first} .. {last}"
        n = len(self.instances)
        return f"batch {self.index}/{of} ({n} instance{'s' * (n != 1)}, {span})"


def job_groups(instances: Iterable[str], jobs: Iterable[tuple[str, str]]) -> list[tuple[str, ...]]:
    """Connected groups of instances, linked by the jobs they share; `jobs` holds
    (instance, job_id) pairs. Each group is sorted; groups are sorted by first instance."""
    parent: dict[str, str] = {i: i for i in instances}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving keeps the trees flat
            x = parent[x]
        return x

    first_of_job: dict[str, str] = {}
    for inst, job in sorted(jobs):
        if not job or inst not in parent:
            continue
        other = first_of_job.setdefault(job, inst)
        a, b = root(inst), root(other)
        if a != b:
            parent[max(a, b)] = min(a, b)
    groups: dict[str, list[str]] = {}
    for inst in parent:
        groups.setdefault(root(inst), []).append(inst)
    return sorted(tuple(sorted(g)) for g in groups.values())


def shard_groups(
    groups: Sequence[tuple[str, ...]], shard: int, shards: int
) -> list[tuple[str, ...]]:
    """The groups shard `shard` (1-based) of `shards` analyses. Largest groups first, each
    to the shard with the fewest instances so far (ties: the lowest shard), so shards are
    balanced in instances and every group is in exactly one shard."""
    if not 1 <= shard <= shards:
        raise ValueError(f"shard {shard}/{shards}: K must be between 1 and N")
    load = [0] * shards
    mine: list[tuple[str, ...]] = []
    for g in sorted(groups, key=lambda g: (-len(g), g)):
        k = min(range(shards), key=lambda i: (load[i], i))
        load[k] += len(g)
        if k == shard - 1:
            mine.append(g)
    return sorted(mine)


def pack_batches(groups: Sequence[tuple[str, ...]], batch_instances: int) -> list[Batch]:
    """Consecutive groups packed into batches of at most `batch_instances` instances; a
    group larger than that is a batch of its own (a job is never split)."""
    if batch_instances < 1:
        raise ValueError("a batch holds at least one instance")
    out: list[list[str]] = []
    for g in sorted(groups):
        if out and len(out[-1]) + len(g) <= batch_instances:
            out[-1].extend(g)
        else:
            out.append(list(g))
    return [Batch(i + 1, tuple(sorted(b))) for i, b in enumerate(out)]


def parse_shard(text: str) -> tuple[int, int]:
    """'2/4' -> (2, 4); ValueError with the reason otherwise."""
    k, sep, n = text.partition("/")
    try:
        kk, nn = int(k), int(n)
    except ValueError:
        kk = nn = 0
    if not sep or nn < 1 or not 1 <= kk <= nn:
        raise ValueError(f"--shard {text!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return kk, nn
