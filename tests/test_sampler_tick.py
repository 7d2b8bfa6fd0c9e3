"""Data one collector needs from another flows through the sampler's tick, in order: a
consumer runs after its producers and gets the readings of the same tick, or none."""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import replace

import pytest

from gpufeed.agent.sampler import Sampler
from gpufeed.collectors.base import CollectorContext, TickData
from gpufeed.collectors.gpu import GpuCollector
from gpufeed.collectors.jobs import JobsCollector
from gpufeed.gpu.backend import GpuIdentity, GpuProcess, GpuSample
from gpufeed.model import Families, Family, iter_samples


def reading(tick: int) -> GpuSample:
    ident = GpuIdentity(tick, f"GPU-{tick}", "test", "0", "0000:00:00.0")
    return GpuSample(ident, processes=(GpuProcess(os.getpid()),))


class TickProducer:
    """Produces "its tick number", after a random delay, or fails / hangs on request."""

    name = "gpu"

    def __init__(self) -> None:
        self.tick = 0
        self.last: tuple[GpuSample, ...] = ()
        self.fail = False
        self.hang = threading.Event()
        self.hang.set()
        self.rng = random.Random(7)

    def collect(self) -> list[Family]:
        self.tick += 1
        self.hang.wait(30)
        time.sleep(self.rng.uniform(0, 0.02))
        if self.fail:
            raise OSError("NVML gone")
        self.last = (reading(self.tick),)
        f = Families()
        f.gauge("gpufeed_test_tick", "test", {}, self.tick)
        return f.build()

    def produce(self, data: TickData) -> TickData:
        return replace(data, gpu_samples=self.last)

    def close(self) -> None:
        self.hang.set()


class TickConsumer:
    name = "jobs"
    needs = ("gpu",)

    def __init__(self) -> None:
        self.seen: list[tuple[GpuSample, ...]] = []

    def collect(self) -> list[Family]:
        return self.collect_with(TickData())

    def collect_with(self, data: TickData) -> list[Family]:
        self.seen.append(data.gpu_samples)
        f = Families()
        for s in data.gpu_samples:
            f.gauge("gpufeed_test_seen_tick", "test", {}, s.identity.index)
        return f.build()

    def close(self) -> None:
        pass


def values(families: tuple[Family, ...], name: str) -> list[float]:
    return [s.value for s in iter_samples(families) if s.name == name]


def test_the_consumer_always_sees_the_same_ticks_reading() -> None:
    producer, consumer = TickProducer(), TickConsumer()
    # listed before its producer: the order comes from `needs`, not from the list
    sampler = Sampler([consumer, producer], interval_seconds=1.0, timeout_seconds=0.5)
    try:
        for _ in range(40):
            families = sampler.sample_once().snapshot.families
            (tick,) = values(families, "gpufeed_test_tick")
            assert values(families, "gpufeed_test_seen_tick") == [tick]
    finally:
        sampler.stop()


def test_a_failed_producer_hands_on_nothing_not_the_tick_before() -> None:
    producer, consumer = TickProducer(), TickConsumer()
    sampler = Sampler([producer, consumer], interval_seconds=1.0, timeout_seconds=0.5)
    try:
        sampler.sample_once()
        assert consumer.seen[-1] and consumer.seen[-1][0].identity.index == 1
        producer.fail = True
        snap = sampler.sample_once().snapshot
        assert consumer.seen[-1] == ()
        status = {s.name: s.success for s in snap.statuses}
        assert status == {"gpu": False, "jobs": True}
    finally:
        sampler.stop()


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
def test_a_hung_producer_leaves_the_consumer_time_to_run_without_it() -> None:
    producer, consumer = TickProducer(), TickConsumer()
    sampler = Sampler([producer, consumer], interval_seconds=1.0, timeout_seconds=0.4)
    producer.hang.clear()
    try:
        started = time.monotonic()
        snap = sampler.sample_once().snapshot
        took = time.monotonic() - started
        assert {s.name: s.success for s in snap.statuses} == {"gpu": False, "jobs": True}
        assert consumer.seen == [()]
        assert took < 0.4 + 0.2  # one time bound, not one per stage
        # the producer still hangs in the next tick: the consumer does not wait for it
        started = time.monotonic()
        sampler.sample_once()
        assert consumer.seen == [(), ()]
        assert time.monotonic() - started < 0.4 + 0.2
    finally:
        producer.hang.set()
        sampler.stop()


def test_needs_that_form_a_cycle_are_refused() -> None:
    class Loop(TickConsumer):
        def __init__(self, name: str, needs: str) -> None:
            super().__init__()
            self.name = name
            self.needs = (needs,)

        def produce(self, data: TickData) -> TickData:
            return data

    with pytest.raises(ValueError, match="needs itself"):
        Sampler([Loop("a", "b"), Loop("b", "a")], interval_seconds=1.0, timeout_seconds=0.5)


class Backend:
    """A GPU backend whose one GPU's index is the tick number, held by this process."""

    name = "simulated"

    def __init__(self) -> None:
        self.tick = 0
        self.rng = random.Random(3)

    def devices(self) -> list[GpuIdentity]:
        return [reading(self.tick).identity]

    def sample(self) -> list[GpuSample]:
        self.tick += 1
        time.sleep(self.rng.uniform(0, 0.02))
        return [reading(self.tick)]

    def close(self) -> None:
        pass


def test_the_real_gpu_and_jobs_collectors_agree_on_the_gpu_every_tick() -> None:
    """gpufeed_job_info names the GPU gpufeed_gpu_info shows in the same snapshot."""
    jobs = JobsCollector(_context())
    sampler = Sampler([jobs, GpuCollector(Backend())], interval_seconds=1.0, timeout_seconds=0.5)
    try:
        for _ in range(20):
            families = sampler.sample_once().snapshot.families
            gpus = {s.label("gpu") for s in iter_samples(families) if s.name == "gpufeed_gpu_info"}
            held = {s.label("gpu") for s in iter_samples(families) if s.name == "gpufeed_job_info"}
            assert held == gpus and len(gpus) == 1
    finally:
        sampler.stop()


def _context() -> CollectorContext:

    return CollectorContext()
