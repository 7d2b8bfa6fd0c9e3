"""The correlator inside the agent: exact families, the durable windows log (kill -9,
rotation), /api/windows on a real aiohttp server and `gpufeed windows`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from correlator_helpers import T0, analyze_text, scenarios, snapshots_of
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator import windows_cmd
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.feeds.live import CAUSE, SECONDS, WINDOWS, CorrelatorProcessor
from gpufeed.correlator.outputs.windowlog import WindowLog, read_log
from procports import refused_port

REPO = Path(__file__).resolve().parent.parent


def _values(families: list[object], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    for f in families:
        if f.name == name:  # type: ignore[attr-defined]
            return {s.labels: s.value for s in f.samples}  # type: ignore[attr-defined]
    raise AssertionError(f"no family {name}")


def test_live_families_match_offline_windows(tmp_path: Path) -> None:
    text, _labels = scenarios.single("checkpointing", "hot_tier", seed=8, minutes=30)
    offline = analyze_text(text, tmp_path)
    assert {w.cause for w in offline} == {Cause.CHECKPOINTING}
    log = tmp_path / "windows.jsonl"
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(log)), interval_seconds=5.0)
    seen_open = False
    last_seconds: dict[tuple[tuple[str, str], ...], float] = {}
    fams: list[object] = []
    for snap in snapshots_of(text):
        fams = proc.process(snap)  # type: ignore[arg-type]
        names = [f.name for f in fams]  # type: ignore[attr-defined]
        assert names[:3] == [SECONDS, CAUSE, WINDOWS]
        assert [f.type for f in fams][:3] == ["counter", "gauge", "counter"]  # type: ignore[attr-defined]
        assert all(n.startswith("gpufeed_windows_log_") for n in names[3:])  # the log's health
        cause = _values(fams, CAUSE)
        if cause:
            seen_open = True
            for key, v in cause.items():
                assert v == 1.0
                assert dict(key)["cause"] == "checkpointing"
                assert [k for k, _ in key] == ["cause", "gpu", "job_id", "uuid"]
        for key, v in _values(fams, SECONDS).items():
            assert v >= last_seconds.get(key, 0.0) - 1e-9  # a counter never goes back
            last_seconds[key] = v
    assert seen_open
    assert _values(fams, CAUSE) == {}
    windows = _values(fams, WINDOWS)
    assert sum(windows.values()) == len(offline)
    total = sum(w.duration_seconds for w in offline)
    assert sum(_values(fams, SECONDS).values()) == pytest.approx(total)
    logged = list(read_log(str(log)))

    def key(w: Window) -> tuple[str, float, float, Cause]:
        return (w.gpu, w.start_seconds, w.end_seconds, w.cause)

    assert sorted(map(key, logged)) == sorted(map(key, offline))
    # live windows name the host (Prometheus adds `instance` to the metrics instead)
    assert {w.instance for w in logged} == {socket.gethostname()}
    proc.close()
    # a restarted agent shows the logged windows again
    again = CorrelatorProcessor(CorrelatorConfig(windows_log=str(log)), interval_seconds=5.0)
    closed, open_ = again.windows(limit=1000)
    assert len(closed) == len(offline) and open_ == []
    again.close()


def test_an_ended_job_is_forgotten(tmp_path: Path) -> None:
    """Once a job's series stop, its correlator series, columns and baselines go after
    ENDED_JOB_SECONDS: nothing grows with every job a node has ever run."""
    import dataclasses

    from gpufeed.correlator.feeds.live import ENDED_JOB_SECONDS, TRIM_EVERY_SECONDS
    from gpufeed.model import Sample

    text, _labels = scenarios.single("checkpointing", "hot_tier", seed=8, minutes=30)
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), interval_seconds=5.0)
    snaps = snapshots_of(text)
    for snap in snaps:
        fams = proc.process(snap)  # type: ignore[arg-type]
    jobs = {dict(k)["job_id"] for k in _values(fams, WINDOWS)} - {""}
    assert jobs and set(proc.node.jobs) >= jobs  # the job is known while it runs

    # the job ends: its series stop, its GPUs run flat out for someone else's work
    last = snaps[-1]
    rest = []
    for f in last.families:  # type: ignore[attr-defined]
        if f.name.startswith("gpufeed_job_"):
            continue
        if f.name == "gpufeed_gpu_utilization_ratio":
            f = dataclasses.replace(
                f, samples=tuple(Sample(s.name, s.labels, 1.0) for s in f.samples)
            )
        rest.append(f)
    t = last.timestamp_seconds  # type: ignore[attr-defined]
    end = t + ENDED_JOB_SECONDS + 2 * TRIM_EVERY_SECONDS
    while t < end:
        t += 5.0
        fams = proc.process(dataclasses.replace(last, timestamp_seconds=t, families=tuple(rest)))  # type: ignore[arg-type]
    exported = {dict(s.labels).get("job_id") for f in fams for s in f.samples}  # type: ignore[attr-defined]
    assert not exported & jobs
    assert not set(proc.node.jobs) & jobs
    assert not {j for j, _ in proc.node.job_info} & jobs
    assert not [k for k in proc._routes if dict(k[1]).get("job_id") in jobs]
    proc.close()


def test_forgetting_a_job_keeps_other_baselines_with_the_same_name() -> None:
    """A job called "0" goes with its own read baselines only, not GPU 0's clock baseline."""
    from gpufeed.correlator.engine.baseline import Baselines, Kind

    JOB_READ = Kind.JOB_READ

    b = Baselines()
    for v in (1.0, 2.0, 3.0, 4.0):
        b.observe((JOB_READ, "0", "hot"), v)
        b.observe((Kind.SM_CLOCK, "0"), v)
        b.observe((JOB_READ, "00", "hot"), v)
    b.forget_prefix((JOB_READ, "0"))
    assert b.median((JOB_READ, "0", "hot")) is None
    assert b.median((Kind.SM_CLOCK, "0")) == 2.5 and b.median((JOB_READ, "00", "hot")) == 2.5


def _window(i: int) -> Window:
    return Window(
        "n",
        str(i % 8),
        "GPU-x",
        "job",
        T0 + i,
        T0 + i + 90,
        Cause.NETWORK,
        0.9,
        0.4,
        (("network_utilization_ratio", 0.95),),
        f"window {i}",
    )


def test_log_rotates_and_keeps_backups(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = WindowLog(str(path), max_bytes=2000, backups=2)
    for i in range(40):
        log.append(_window(i))
    log.close()
    assert path.stat().st_size <= 2000
    assert (tmp_path / "w.jsonl.1").exists() and (tmp_path / "w.jsonl.2").exists()
    assert not (tmp_path / "w.jsonl.3").exists()
    got = [w.summary for w in read_log(str(path))]
    assert got == [f"window {i}" for i in range(40 - len(got), 40)]  # newest kept, in order
    assert len(got) < 40


def test_reopened_log_cuts_a_torn_line_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = WindowLog(str(path))
    log.append(_window(0))
    log.close()
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:40])  # a crash tore the next line
    log = WindowLog(str(path))
    log.append(_window(1))
    log.close()
    assert [w.summary for w in read_log(str(path))] == ["window 0", "window 1"]
    log = WindowLog(str(path))  # a clean file is left as it is
    log.close()
    assert path.read_bytes().count(b"\n") == 2


@pytest.mark.slow
def test_log_survives_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    code = textwrap.dedent(
        f"""
        import sys, time
        from gpufeed.correlator.outputs.windowlog import WindowLog
        from gpufeed.correlator.engine.window import Window
        from gpufeed.correlator.engine.causes import Cause
        log = WindowLog({str(path)!r}, max_bytes=1 << 30)
        i = 0
        while True:
            log.append(Window("n", "0", "u", "j", i, i + 60.0, Cause.IDLE, 0.9, 0.0, (), "x" * 500))
            i += 1
            if i == 20:
                print("ready", flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == b"ready"
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    docs = path.read_bytes().split(b"\n")
    complete = [d for d in docs[:-1]]
    assert len(complete) >= 20
    for d in complete:
        json.loads(d)  # every complete line is a whole window
    ws = list(read_log(str(path)))
    assert [w.start_seconds for w in ws] == [float(i) for i in range(len(ws))]


@pytest.mark.slow
def test_api_and_windows_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from aiohttp import web

    from gpufeed.correlator.outputs.api import windows_routes

    text, _ = scenarios.single("network", "saturated", seed=2, minutes=30)
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), interval_seconds=5.0)
    snaps = snapshots_of(text)
    labels_end = max(w.end_seconds for w in analyze_text(text, tmp_path))
    open_at = None
    for snap in snaps:
        proc.process(snap)  # type: ignore[arg-type]
        if proc.windows()[1]:
            open_at = snap.timestamp_seconds  # type: ignore[attr-defined]
            break
    assert open_at is not None and open_at < labels_end

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.add_routes(windows_routes(proc))
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    th = threading.Thread(target=loop.run_forever, daemon=True)
    th.start()
    try:
        import urllib.error
        import urllib.request

        body = json.loads(urllib.request.urlopen(f"{url}/api/windows").read())
        assert body["windows"] == []
        assert {d["cause"] for d in body["open"]} == {"network"}
        assert set(body["open"][0]) >= {
            "instance",
            "gpu",
            "uuid",
            "job_id",
            "start",
            "end",
            "cause",
            "confidence",
            "mean_utilization",
            "evidence",
        }
        for snap in snaps[
            snaps.index(next(s for s in snaps if s.timestamp_seconds == open_at)) + 1 :
        ]:  # type: ignore[attr-defined]
            proc.process(snap)  # type: ignore[arg-type]
        body = json.loads(urllib.request.urlopen(f"{url}/api/windows?limit=3").read())
        assert len(body["windows"]) == 3 and body["open"] == []
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{url}/api/windows?limit=x")
        p = argparse.ArgumentParser()
        windows_cmd.register(p.add_subparsers())
        args = p.parse_args(["windows", "--agent", url, "--limit", "100"])
        assert args.func(args) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith("INSTANCE") and len(out) == 9
        assert all(" network " in line for line in out[1:])
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(5)
    p = argparse.ArgumentParser()
    windows_cmd.register(p.add_subparsers())
    with refused_port() as port:  # an agent that is gone
        args = p.parse_args(["windows", "--agent", f"http://127.0.0.1:{port}"])
        assert args.func(args) == 1
    assert "cannot read windows" in capsys.readouterr().err


def test_windows_command_defaults_to_the_agents_port_and_names_a_missing_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufeed.agent.command import DEFAULT_PORT

    p = argparse.ArgumentParser()
    windows_cmd.register(p.add_subparsers())
    assert p.parse_args(["windows"]).agent == f"http://localhost:{DEFAULT_PORT}"
    missing = tmp_path / "nope.jsonl"
    args = p.parse_args(["windows", "--log", str(missing)])
    assert args.func(args) == 1
    assert f"{missing}: no such windows log" in capsys.readouterr().err
    log = WindowLog(str(tmp_path / "w.jsonl"))
    log.append(_window(0))
    log.close()
    args = p.parse_args(["windows", "--log", str(tmp_path / "w.jsonl"), "--format", "jsonl"])
    assert args.func(args) == 0
    assert [json.loads(x)["evidence"]["summary"] for x in capsys.readouterr().out.splitlines()] == [
        "window 0"
    ]


def test_unwritable_log_does_not_stop_the_correlator(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cfg = CorrelatorConfig(windows_log=str(blocker / "windows.jsonl"))
    proc = CorrelatorProcessor(cfg, interval_seconds=5.0)
    assert "cannot be opened" in caplog.text
    text, _ = scenarios.single("idle", "job_ended", seed=1, minutes=30)
    for snap in snapshots_of(text):
        fams = proc.process(snap)  # type: ignore[arg-type]
    assert sum(_values(fams, WINDOWS).values()) > 0


def test_clock_stepping_back_is_ignored(tmp_path: Path) -> None:
    import dataclasses

    text, _ = scenarios.single("network", "congested", seed=3, minutes=30)
    snaps = snapshots_of(text)
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=""), interval_seconds=5.0)
    for snap in snaps[:300]:
        proc.process(snap)  # type: ignore[arg-type]
    before = proc.windows(1000)
    back = dataclasses.replace(snaps[300], timestamp_seconds=snaps[100].timestamp_seconds)  # type: ignore[type-var]
    fams = proc.process(back)  # type: ignore[arg-type]
    assert [f.name for f in fams] == [SECONDS, CAUSE, WINDOWS]  # type: ignore[attr-defined]
    assert proc.windows(1000) == before
    for snap in snaps[300:]:
        proc.process(snap)  # type: ignore[arg-type]
    closed, _ = proc.windows(1000)
    offline = analyze_text(text, tmp_path)

    def key(w: Window) -> tuple[str, float, Cause]:
        return (w.gpu, w.start_seconds, w.cause)

    assert sorted(map(key, closed)) == sorted(map(key, offline))
