"""`--record`: the trace recorder's files are valid traces, survive a crash, and promtool takes them."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, agent_env, gpufeed_cmd, http_get, wait_for_metrics
from gpufeed.agent.sampler import Sampler
from gpufeed.cli import main as gpufeed_main
from gpufeed.model import Family, Sample
from gpufeed.simulate.node import SimulatedNode, SimulatedNodeCollector
from gpufeed.simulate.scenario import default_scenario
from gpufeed.snapshot import Snapshot
from gpufeed.trace.format import DROPPED_SAMPLES, om_value
from gpufeed.trace.recorder import TraceRecorder, finalize_recording
from sim_helpers import check_trace

T0 = 1_700_000_000.0


def snapshots(count: int, step: float = 1.0, start: float = 200.0) -> list[Snapshot]:
    node = SimulatedNode(default_scenario(), seed=5, clock=lambda: 0.0)
    return [
        Snapshot(T0 + start + i * step, tuple(node.families(start + i * step)))
        for i in range(count)
    ]


def series_count(snap: Snapshot) -> int:
    return sum(len(f.samples) for f in snap.families)


def test_segments_merge_into_one_valid_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.om"
    snaps = snapshots(40)
    rec = TraceRecorder(path, segment_seconds=10, instance="node-a:9842")
    for s in snaps:
        rec.write(s)
    assert rec.segments_written == 3  # three sealed, the fourth still spooling
    rec.close()
    summary = check_trace(path)
    assert summary.samples == sum(series_count(s) for s in snaps)
    # every series has all 40 timestamps in order, across the segment boundaries
    util = summary.series[
        'gpufeed_gpu_utilization_ratio{gpu="0",uuid="'
        + snaps[0].families[0].samples[0].label("uuid")
        + '",instance="node-a:9842"}'
    ]
    assert [ts for ts, _ in util] == [s.timestamp_seconds for s in snaps]
    assert len(summary.families) == len({f.name for f in snaps[0].families})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.om"]


def test_out_of_order_snapshots_are_dropped_not_written(tmp_path: Path) -> None:
    path = tmp_path / "t.om"
    a, b, c = snapshots(3)
    rec = TraceRecorder(path)
    for s in (a, c, b, c):
        rec.write(s)
    rec.close()
    summary = check_trace(path)
    assert summary.samples == series_count(a) + series_count(c)


CRASHER = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from test_record import snapshots
from gpufeed.trace.recorder import TraceRecorder
rec = TraceRecorder(sys.argv[1], segment_seconds=10)
for s in snapshots(25):
    rec.write(s)
rec._join_assembler()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_recorder_loses_nothing_but_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.om"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    proc = subprocess.run(
        [sys.executable, "-c", CRASHER, str(path), str(Path(__file__).parent)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    parts = sorted(tmp_path.glob("trace.part-*.om"))
    assert [p.name for p in parts] == ["trace.part-000001.om", "trace.part-000002.om"]
    for part in parts:
        check_trace(part)  # each sealed segment is a complete trace on its own
    spool = tmp_path / "trace.om.spool"
    assert spool.is_dir()
    # tear the last line of one spool file, as a crash in the middle of a write would
    victim = sorted(spool.glob("*.om"))[3]
    data = victim.read_bytes()
    victim.write_bytes(data[:-7])
    snaps = snapshots(25)
    expected = sum(series_count(s) for s in snaps) - 1
    # a new recorder on the same path recovers the leftovers first, beside the new file
    rec = TraceRecorder(path)
    rec.close()
    (recovered,) = tmp_path.glob("trace.recovered-*.om")
    assert check_trace(recovered).samples == expected
    assert not list(tmp_path.glob("trace.part-*")) and not spool.exists()
    assert finalize_recording(path) is None  # nothing left over any more


def test_recorder_as_the_samplers_sink(tmp_path: Path) -> None:
    path = tmp_path / "live.om"
    node = SimulatedNode(default_scenario(), seed=1)
    rec = TraceRecorder(path)
    sampler = Sampler(
        [SimulatedNodeCollector(node)], interval_seconds=0.05, timeout_seconds=1.0, sinks=[rec]
    )
    sampler.start()
    time.sleep(0.6)
    sampler.stop()  # closes the sinks: the trace is finalized
    summary = check_trace(path)
    assert "gpufeed_storage_read_bytes" in summary.families
    assert summary.samples > 5 * 100


@pytest.mark.slow
def test_promtool_accepts_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "trace.om"
    snaps = snapshots(30, step=5.0)
    rec = TraceRecorder(path, segment_seconds=60)
    for s in snaps:
        rec.write(s)
    rec.close()
    out = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert promtool_samples(out.stdout) == sum(series_count(s) for s in snaps)


def promtool_samples(table: str) -> int:
    """Sums the NUM SAMPLES column of promtool's block table."""
    total = 0
    for line in table.splitlines()[1:]:
        cols = re.split(r"\s{2,}", line.strip())
        if len(cols) >= 5 and cols[4].isdigit():
            total += int(cols[4])
    return total


@pytest.mark.slow
@pytest.mark.root
def test_disk_full_stops_recording_cleanly_and_loses_only_a_torn_line(tmp_path: Path) -> None:
    """On a real (tmpfs) filesystem that fills up: one error, no exception, and once there
    is room again the leftovers become a valid trace of everything written before."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)], check=True)
    unmounted = False
    try:
        path = mnt / "trace.om"
        rec = TraceRecorder(path)
        written = 0
        for s in snapshots(60):
            rec.write(s)  # must never raise
            written += 1
        assert rec._failed, "96 KiB should not hold 60 snapshots"
        rec.close()  # assembling needs room too: it fails, logged, and keeps the leftovers
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        assert not path.exists()  # no room for the final trace: the leftovers are kept
        assert finalize_recording(path) == path
        summary = check_trace(path)
        per_snapshot = series_count(snapshots(1)[0])
        assert 0 < summary.samples < written * per_snapshot
        # nothing is left open on the filesystem
        unmounted = subprocess.run(["umount", str(mnt)], check=False).returncode == 0
        assert unmounted
    finally:
        if not unmounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_integer_values_are_written_as_integers() -> None:
    # Collectors hand over ints (steps, bytes): int.is_integer does not exist before 3.12.
    assert [om_value(v) for v in (0, 7, -3, 2**60, True)] == ["0", "7", "-3", str(2**60), "1"]
    assert [om_value(v) for v in (2.0, 0.5, float("nan"), float("-inf"))] == [
        "2",
        "0.5",
        "NaN",
        "-Inf",
    ]


def int_snapshot(t: float, bad: object = None) -> Snapshot:
    """Three families with int values; with `bad`, the middle one also holds a sample
    whose value cannot be written."""
    steps, epochs = "gpufeed_job_steps_total", "gpufeed_job_epochs_total"
    ckpt = "gpufeed_job_checkpoint_written_bytes_total"
    middle = [job_sample(epochs, "j1", 5)]
    if bad is not None:
        middle.append(Sample(epochs, (("job_id", "j2"),), bad))  # type: ignore[arg-type]
    return Snapshot(
        t,
        (
            Family(
                steps, "counter", "s", (job_sample(steps, "j1", 40), job_sample(steps, "j2", 2))
            ),
            Family(epochs, "counter", "e", tuple(middle)),
            Family(ckpt, "counter", "c", (job_sample(ckpt, "j1", 4096),)),
        ),
    )


def job_sample(name: str, job: str, v: int) -> Sample:
    return Sample(name, (("job_id", job),), v)


def test_integer_samples_through_the_recorder(tmp_path: Path) -> None:
    path = tmp_path / "t.om"
    rec = TraceRecorder(path, instance="node-a:9842")
    for i in range(3):
        rec.write(int_snapshot(T0 + i))
    rec.close()
    summary = check_trace(path)
    assert summary.families == [
        "gpufeed_job_steps",
        "gpufeed_job_epochs",
        "gpufeed_job_checkpoint_written_bytes",
    ]
    assert summary.samples == 3 * 4
    text = path.read_text()
    assert f'gpufeed_job_steps_total{{job_id="j1",instance="node-a:9842"}} 40 {int(T0)}\n' in text
    assert DROPPED_SAMPLES not in text  # absent, not zero, in a complete trace


def test_a_sample_that_cannot_be_written_loses_only_itself_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.om"
    rec = TraceRecorder(path, instance="node-a:9842")
    with caplog.at_level(logging.ERROR, logger="gpufeed.trace.recorder"):
        for i in range(30):  # thirty seconds of a recurring failure
            rec.write(int_snapshot(T0 + i, bad=object()))
    rec.close()
    # One error line for the whole run, no traceback.
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None, caplog.text
    assert "gpufeed_job_epochs_total" in errors[0].getMessage()
    # Every other sample is there, the family after the failing one included.
    summary = check_trace(path)
    assert summary.families[:3] == [
        "gpufeed_job_steps",
        "gpufeed_job_epochs",
        "gpufeed_job_checkpoint_written_bytes",
    ]
    assert summary.samples == 30 * 4 + 30  # + the trace's own count of what was left out
    dropped = summary.series[
        f'{DROPPED_SAMPLES}{{family="gpufeed_job_epochs_total",instance="node-a:9842"}}'
    ]
    assert [v for _, v in dropped] == list(range(1, 31))
    # The analysis says the trace is incomplete instead of passing for a complete one.
    assert gpufeed_main(["analyze", str(path)]) == 0
    err = capsys.readouterr().err
    assert "is incomplete: the recorder left out 30 samples" in err
    assert "gpufeed_job_epochs_total: 30" in err


EXPORTER = ROOT / "exporter"
SDK_JOB = """
import sys, time
sys.path.insert(0, sys.argv[2])
import gpufeed
job = gpufeed.Job("recorded", socket=sys.argv[1])
for _ in job.track(range(37)):
    time.sleep(0.001)
job.epoch()
job.close()
"""


@pytest.mark.slow
def test_real_agent_records_a_real_sdk_job_on_this_python(run_agent: Any, tmp_path: Path) -> None:
    """0.1.0 on Python 3.11: the SDK's integer step counts made every snapshot fail from the
    first job family on, with a traceback a second, and the trace still looked complete."""
    trace = tmp_path / "trace.om"
    sock = tmp_path / "sdk.sock"
    agent = run_agent(
        "--record",
        str(trace),
        "--sdk.socket",
        str(sock),
        "--gpu.backend",
        "off",
        "--instance",
        "node-rec:9842",
    )
    wait_for_metrics(f"{agent.url}/metrics", agent.proc)
    job = subprocess.run(
        [sys.executable, "-c", SDK_JOB, str(sock), str(EXPORTER)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert job.returncode == 0, job.stderr
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        body = http_get(f"{agent.url}/metrics")[1].decode()
        if re.search(r"^gpufeed_job_steps_total\{[^}]*\} 37(\.0)?$", body, re.M):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the SDK job's 37 steps never reached /metrics")
    time.sleep(2.5)  # a few recorded snapshots with the job in them
    agent.proc.terminate()
    _, err = agent.proc.communicate(timeout=30)
    assert agent.proc.returncode == 0, err.decode()[-3000:]
    assert b"Traceback" not in err and b"left out" not in err, err.decode()[-3000:]

    summary = check_trace(trace)
    steps = [k for k in summary.series if k.startswith("gpufeed_job_steps_total{")]
    assert steps, summary.families
    assert all(summary.series[k][-1][1] == 37 for k in steps)
    # families after the job ones are there too, and every series names the node
    assert "gpufeed_host_cpu_seconds" in summary.families
    assert all('instance="node-rec:9842"' in k for k in summary.series)
    text = trace.read_text()
    assert DROPPED_SAMPLES not in text

    out = subprocess.run(
        gpufeed_cmd("analyze", str(trace)),
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "incomplete" not in out.stderr, out.stderr
