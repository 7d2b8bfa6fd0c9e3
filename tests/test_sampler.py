import logging
import re
import threading
import time

import pytest

from conftest import http_get
from gpufeed.agent.sampler import Sampler
from gpufeed.collectors.base import PartialCollectionError
from gpufeed.model import Families, Family


class Const:
    def __init__(self, name: str, value: float) -> None:
        self.name = name
        self.value = value
        self.calls = 0

    def collect(self) -> list[Family]:
        self.calls += 1
        f = Families()
        f.gauge(f"gpufeed_test_{self.name}", "test", {}, self.value)
        return f.build()

    def close(self) -> None:
        pass


class Hanging:
    name = "hang"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> list[Family]:
        self.calls += 1
        self.release.wait(30)
        return []

    def close(self) -> None:
        self.release.set()


class Partial:
    name = "partial"

    def collect(self) -> list[Family]:
        f = Families()
        f.gauge("gpufeed_test_partial", "read before the failure", {}, 7.0)
        raise PartialCollectionError("/proc/stat: No such file", f.build())

    def close(self) -> None:
        pass


def test_partial_failure_publishes_what_was_read_and_reports_failure() -> None:
    sampler = Sampler([Partial()], interval_seconds=1.0, timeout_seconds=0.5)
    text = sampler.sample_once().text.decode()
    sampler.stop()
    assert "gpufeed_test_partial 7.0" in text
    assert 'gpufeed_collector_success{collector="partial"} 0.0' in text


class Raising:
    name = "broken"

    def collect(self) -> list[Family]:
        raise FileNotFoundError("/proc/diskstats")

    def close(self) -> None:
        pass


def statuses(sampler: Sampler) -> dict[str, bool]:
    assert sampler.latest is not None
    return {s.name: s.success for s in sampler.latest.snapshot.statuses}


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
def test_hung_collector_times_out_and_others_still_report() -> None:
    good, hang = Const("good", 3.0), Hanging()
    sampler = Sampler([good, hang, Raising()], interval_seconds=1.0, timeout_seconds=0.3)
    try:
        t0 = time.monotonic()
        rendered = sampler.sample_once()
        elapsed = time.monotonic() - t0
        assert elapsed < 1.0, "sampling must not wait for a hung collector past its bound"
        text = rendered.text.decode()
        assert "gpufeed_test_good 3.0" in text
        assert 'gpufeed_collector_success{collector="hang"} 0.0' in text
        assert 'gpufeed_collector_success{collector="broken"} 0.0' in text
        assert 'gpufeed_collector_success{collector="good"} 1.0' in text
        # The hung call is not started a second time while it is still stuck.
        sampler.sample_once()
        assert hang.calls == 1
        assert good.calls == 2
        assert statuses(sampler) == {"good": True, "hang": False, "broken": False}
        # Once it returns, it is triggered again and recovers.
        hang.release.set()
        time.sleep(0.05)
        sampler.sample_once()
        assert hang.calls == 2
        assert statuses(sampler)["hang"] is True
    finally:
        hang.release.set()
        sampler.stop()


def test_processor_families_are_exposed_and_a_failing_processor_is_contained() -> None:
    class Doubler:
        name = "double"

        def process(self, snapshot):  # type: ignore[no-untyped-def]
            f = Families()
            for fam in snapshot.families:
                for s in fam.samples:
                    f.gauge("gpufeed_test_doubled", "x", {}, s.value * 2)
            return f.build()

    class Bad:
        name = "bad"

        def process(self, snapshot):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

    sampler = Sampler(
        [Const("v", 4.0)], interval_seconds=1, timeout_seconds=1, processors=[Bad(), Doubler()]
    )
    text = sampler.sample_once().text.decode()
    sampler.stop()
    assert "gpufeed_test_doubled 8.0" in text


def test_background_loop_keeps_sampling_on_the_interval() -> None:
    """It goes on sampling by itself, and no faster than its interval. Waited for by count,
    not for a fixed time: a loaded CI host can hold the thread back (3 calls in 0.55 s
    once), which says nothing about the loop."""
    c = Const("tick", 1.0)
    sampler = Sampler([c], interval_seconds=0.1, timeout_seconds=0.1)
    began = time.monotonic()
    sampler.start()
    try:
        deadline = began + 30
        while c.calls < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        took = time.monotonic() - began
    finally:
        sampler.stop()
    assert c.calls >= 6, f"only {c.calls} samples in {took:.1f} s"
    # six samples are five intervals apart at least: a loop that does not wait fails here
    assert took >= 0.5 - 0.02, f"6 samples in {took:.3f} s: faster than the 0.1 s interval"


def test_still_hung_collector_reports_the_time_bound_as_its_duration() -> None:
    hang = Hanging()
    sampler = Sampler([hang], interval_seconds=1.0, timeout_seconds=0.2)
    try:
        first = sampler.sample_once().snapshot.statuses[0]
        second = sampler.sample_once().snapshot.statuses[0]
        assert (first.error, first.duration_seconds) == ("timed out after 0.20s", 0.2)
        assert (second.error, second.duration_seconds) == ("still hung", 0.2)
    finally:
        sampler.stop()


def test_stop_closes_every_collector_once() -> None:
    class Counting(Const):
        closed = 0

        def close(self) -> None:
            self.closed += 1

    c = Counting("c", 1.0)
    sampler = Sampler([c], interval_seconds=0.1, timeout_seconds=0.1)
    sampler.start()
    sampler.stop()
    sampler.stop()
    assert c.closed == 1
    assert not sampler.alive()


@pytest.mark.serial  # a time bound: runs alone, after the parallel pass
@pytest.mark.slow
def test_scrape_answers_at_once_while_a_collector_hangs() -> None:
    import asyncio

    from aiohttp import web

    from gpufeed.agent.server import build_app

    hang = Hanging()
    sampler = Sampler([Const("good", 3.0), hang], interval_seconds=0.2, timeout_seconds=0.1)

    async def scrape_while_hung() -> tuple[float, int, str, int, str]:
        runner = web.AppRunner(build_app(sampler), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            sampler.start()
            await asyncio.sleep(0.7)  # a few ticks, every one with the collector hung
            metrics = await asyncio.to_thread(http_get, f"{url}/metrics")
            t0 = time.monotonic()
            health = await asyncio.to_thread(http_get, f"{url}/healthz")
            elapsed = time.monotonic() - t0
        finally:
            await runner.cleanup()
        return elapsed, metrics[0], metrics[1].decode(), health[0], health[1].decode()

    try:
        elapsed, status, body, hstatus, htext = asyncio.run(scrape_while_hung())
    finally:
        hang.release.set()
        sampler.stop()
    assert status == 200
    assert "gpufeed_test_good 3.0" in body
    assert 'gpufeed_collector_success{collector="hang"} 0.0' in body
    assert 'gpufeed_collector_duration_seconds{collector="hang"} 0.1' in body
    assert hang.calls == 1
    assert hstatus == 200 and htext == "ok (collectors failing: hang)\n"
    assert elapsed < 1.0


@pytest.mark.slow
def test_index_links_only_the_pages_served() -> None:
    import asyncio

    from aiohttp import web

    from gpufeed.agent.server import build_app

    async def windows(request: web.Request) -> web.Response:
        return web.json_response([])

    async def index(app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            status, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/")
        finally:
            await runner.cleanup()
        assert status == 200
        return body.decode()

    sampler = Sampler([Const("v", 1.0)], interval_seconds=1.0, timeout_seconds=0.5)
    sampler.sample_once()
    try:
        plain = asyncio.run(index(build_app(sampler)))
        routes = [web.get("/api/windows", windows)]
        with_windows = asyncio.run(index(build_app(sampler, extra_routes=routes)))
    finally:
        sampler.stop()
    assert '<a href="/metrics">' in plain and '<a href="/api/windows">' not in plain
    assert '<a href="/api/windows">' in with_windows
    assert "<td>v</td>" in plain


def test_a_family_the_text_format_cannot_carry_is_left_out_not_the_page(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BadLabel:
        name = "bad_label"

        def collect(self) -> list[Family]:
            f = Families()
            # A path read with surrogateescape that no one cleaned: not valid UTF-8.
            f.gauge("gpufeed_test_path", "x", {"path": "/mnt/caf\udce9"}, 1.0)
            return f.build()

        def close(self) -> None:
            pass

    sampler = Sampler([Const("good", 3.0), BadLabel()], interval_seconds=1, timeout_seconds=1)
    try:
        text = sampler.sample_once().text.decode()
        sampler.sample_once()
    finally:
        sampler.stop()
    assert "gpufeed_test_good 3.0" in text
    assert 'gpufeed_collector_success{collector="bad_label"} 1.0' in text
    assert "gpufeed_test_path" not in text
    logged = [r.getMessage() for r in caplog.records if "left out of /metrics" in r.getMessage()]
    assert len(logged) == 1 and logged[0].startswith("gpufeed_test_path left out")


def test_a_time_bound_over_five_intervals_is_capped_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampler = Sampler([Hanging()], interval_seconds=0.1, timeout_seconds=30)
    try:
        started = time.monotonic()
        status = sampler.sample_once().snapshot.statuses[0]
        assert time.monotonic() - started < 2
    finally:
        sampler.stop()
    assert status.duration_seconds == pytest.approx(0.5)
    assert any("capped at 5 intervals" in r.getMessage() for r in caplog.records)


def test_the_page_carries_the_snapshot_timestamp() -> None:
    sampler = Sampler(
        [Const("v", 1.0)], interval_seconds=1, timeout_seconds=1, clock=lambda: 1234.5
    )
    text = sampler.sample_once().text.decode()
    sampler.stop()
    assert "gpufeed_snapshot_timestamp_seconds 1234.5\n" in text


def test_a_stalled_sampler_is_visible_in_the_timestamp_it_serves() -> None:
    """/metrics keeps serving the last snapshot when sampling stalls (here a processor that
    stops returning); its timestamp stays put while the wall clock moves on, which is the
    age GpufeedSamplerStalled computes, and moves again once sampling resumes."""
    import asyncio

    from aiohttp import web

    from gpufeed.agent.server import build_app

    class Stalling:
        name = "stall"

        def __init__(self) -> None:
            self.calls = 0
            self.stalled = threading.Event()
            self.release = threading.Event()

        def process(self, snapshot):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == 3:
                self.stalled.set()
                self.release.wait(30)
            return []

    stall = Stalling()
    sampler = Sampler(
        [Const("v", 1.0)], interval_seconds=0.05, timeout_seconds=0.05, processors=[stall]
    )
    pattern = re.compile(r"^gpufeed_snapshot_timestamp_seconds (\S+)$", re.M)

    async def scrape(url: str) -> float:
        status, body = await asyncio.to_thread(http_get, url)
        assert status == 200
        m = pattern.search(body.decode())
        assert m, body[:300]
        return float(m.group(1))

    async def run() -> tuple[float, float, float, float, float]:
        runner = web.AppRunner(build_app(sampler), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            sampler.start()
            assert await asyncio.to_thread(stall.stalled.wait, 10)
            first = await scrape(url)
            await asyncio.sleep(0.6)
            second, at = await scrape(url), time.time()
            stall.release.set()
            await asyncio.sleep(0.5)
            resumed, resumed_at = await scrape(url), time.time()
        finally:
            stall.release.set()
            await runner.cleanup()
        return first, second, at, resumed, resumed_at

    try:
        first, second, at, resumed, resumed_at = asyncio.run(run())
    finally:
        stall.release.set()
        sampler.stop()
    assert first == second, "a stalled sampler must keep serving the old timestamp"
    assert at - second >= 0.6
    assert resumed > second and resumed_at - resumed < 0.5


class Flaky:
    name = "flaky"

    def __init__(self) -> None:
        self.errors = ["disk gone", "disk gone", "", "disk gone", "other"]

    def collect(self) -> list[Family]:
        error = self.errors.pop(0) if self.errors else ""
        if error:
            raise OSError(error)
        return []

    def close(self) -> None:
        pass


def test_a_collector_failure_is_logged_when_it_starts_or_changes_not_every_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hanging = Hanging()
    sampler = Sampler([Flaky(), hanging], interval_seconds=1.0, timeout_seconds=0.2)
    try:
        with caplog.at_level(logging.WARNING, "gpufeed.agent.sampler"):
            for _ in range(5):  # hang times out once, then is still hung four times
                sampler.sample_once()
    finally:
        hanging.release.set()
        sampler.stop()
    logged = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert sorted(logged) == sorted(
        [
            "collector flaky failed: OSError: disk gone",
            "collector flaky failed: OSError: disk gone",  # again after the tick it worked
            "collector flaky failed: OSError: other",
            "collector hang failed: timed out after 0.20s",  # once, not per hung tick
        ]
    )
