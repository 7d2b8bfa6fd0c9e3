"""Fair shares of the SDK socket's message rate, per sender.

Everyone in the agent's group can write to the socket, so one process must not be able to
take the whole rate (a flooding process made a real job lose 73% of its messages when the
rate was one bucket for all). The kernel says who sent each datagram (SCM_CREDENTIALS:
pid, uid); a *sender* is a uid and the job the kernel puts the pid in: the Slurm job or
Kubernetes pod of its cgroup, else its process group (see gpufeed.jobs.identity). All ranks
and DataLoader workers of a job are then one sender, and a flood from another job or
another shell is another.

Each sender has a token bucket whose rate is the agent's `sdk.max_messages_per_second`
divided by the number of senders active in the last ACTIVE_SECONDS: a sender alone gets
it all; with a flooder beside it, each gets half, and a job sending less than its half
loses nothing. A process that can create many process groups or cgroups can claim more
shares; MAX_SENDERS bounds what that costs the agent. Not thread-safe: the SDK server
serialises calls.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

SenderKey = tuple[int, str, str]  # uid, scheduler ("slurm", "process", ...), job id

# A sender silent this long no longer takes a share.
ACTIVE_SECONDS = 10.0
# The senders tracked at once; the one silent longest is forgotten first.
MAX_SENDERS = 1024
_RECOUNT_SECONDS = 1.0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    last_seconds: float


class Senders:
    """Per-sender token buckets sharing `total_rate` messages a second fairly."""

    def __init__(self, total_rate: float, now: float) -> None:
        self.total_rate = total_rate
        self._buckets: OrderedDict[SenderKey, _Bucket] = OrderedDict()  # oldest message first
        self._active = 1
        self._recount_at = now

    @property
    def share_per_second(self) -> float:
        return self.total_rate / self._active

    def has_token(self, key: SenderKey, now: float) -> bool:
        """Whether `key` may send a message now (nothing is taken): lets the server drop
        a datagram before decoding it."""
        return self._refill(key, now).tokens >= 1.0

    def take(self, key: SenderKey, now: float) -> bool:
        """Takes one message's token from `key`'s bucket; False when it has none left."""
        b = self._refill(key, now)
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return True
        return False

    def active(self) -> int:
        return self._active

    def _refill(self, key: SenderKey, now: float) -> _Bucket:
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(0.0, now)
            if len(self._buckets) > MAX_SENDERS:
                self._buckets.popitem(last=False)
            self._recount(now)  # a newcomer gets its share at once
            b.tokens = self.share_per_second  # and a full second of burst
            return b
        elapsed = max(0.0, now - b.last_seconds)
        b.last_seconds = now  # before a recount: the order below is by last message
        self._buckets.move_to_end(key)
        if now >= self._recount_at:
            self._recount(now)
        rate = self.share_per_second
        b.tokens = min(rate, b.tokens + elapsed * rate)
        return b

    def _recount(self, now: float) -> None:
        """Counts the senders heard from in the last ACTIVE_SECONDS (newest are last)."""
        n = 0
        for b in reversed(self._buckets.values()):
            if now - b.last_seconds > ACTIVE_SECONDS:
                break
            n += 1
        self._active = max(1, n)
        self._recount_at = now + _RECOUNT_SECONDS
