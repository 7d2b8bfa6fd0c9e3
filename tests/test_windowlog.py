"""The windows log under faults: a disk that fills up for real (a small tmpfs), bad lines,
a kill between the renames of a rotation, one writer per log, simulated vs real lines, and
the windows open when the agent stops."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from correlator_helpers import scenarios, snapshots_of
from gpufeed.config import CorrelatorConfig
from gpufeed.correlator.feeds.live import CorrelatorProcessor
from gpufeed.correlator.outputs import openwindows
from gpufeed.correlator.outputs.loghealth import PENDING, SKIPPED, WRITE_ERRORS
from gpufeed.correlator.outputs.windowlog import RESERVE_BYTES, WindowLog, WindowLogInUse
from gpufeed.correlator.outputs.windowlog_read import read_log, scan_log
from windowlog_helpers import fill, seq_window, small_tmpfs

REPO = Path(__file__).resolve().parent.parent


def _value(families: list[object], name: str, **labels: str) -> float:
    for f in families:
        if f.name == name:  # type: ignore[attr-defined]
            for s in f.samples:  # type: ignore[attr-defined]
                if dict(s.labels) == labels:
                    return float(s.value)
    raise AssertionError(f"no {name}{labels}")


def _jobs(path: Path) -> list[str]:
    return [w.job_id for w in read_log(str(path))]


def _whole_lines(path: Path) -> list[dict[str, object]]:
    """Every line of the file parsed as JSON: raises on a partial or glued line."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "the file ends in a partial line"
    return [json.loads(line) for line in data.splitlines()]


def test_a_full_disk_leaves_no_partial_line_and_loses_no_window(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, 256) as mnt:
        path = mnt / "w.jsonl"
        log = WindowLog(str(path))
        assert (mnt / "w.jsonl.reserve").stat().st_size == RESERVE_BYTES
        assert log.append(seq_window(0)) is None
        filler = mnt / "filler"
        fill(filler)
        # the reserve takes the first windows; then writes are cut short by ENOSPC
        errors = [log.append(seq_window(i, pad=5000)) for i in range(1, 30)]
        assert errors[0] is None and log.health().write_errors_total > 1
        assert isinstance(errors[-1], OSError) and errors[-1].errno == errno.ENOSPC
        on_disk = [d["job_id"] for d in _whole_lines(path)]  # whole lines only
        assert on_disk == [f"job-{i}" for i in range(len(on_disk))] and len(on_disk) > 5
        assert log.health().pending_windows == 30 - len(on_disk)
        assert log.retry() is not None  # still full
        filler.unlink()
        assert log.retry() is None
        assert log.append(seq_window(30)) is None
        log.close()
        assert [d["job_id"] for d in _whole_lines(path)] == [f"job-{i}" for i in range(31)]
        assert (mnt / "w.jsonl.reserve").stat().st_size == RESERVE_BYTES  # taken again


def test_a_full_disk_at_start_with_a_torn_line_does_not_turn_the_log_off(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path, 64) as mnt:
        path = mnt / "w.jsonl"
        log = WindowLog(str(path))
        log.append(seq_window(0))
        log.close()
        whole = path.read_bytes()
        # a crash tore the next line, which ends on a page: ending it with a newline needs a
        # page more, which the full disk does not have
        path.write_bytes(whole + b"x" * (8192 - len(whole)))
        filler = mnt / "filler"
        fill(filler)
        proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(path)), interval_seconds=5)
        assert _jobs(path) == ["job-0"]
        proc._closed(seq_window(1))  # the engine's on_window callback
        proc._closed(seq_window(2, pad=9000))  # more than the space the torn line left
        assert [d["job_id"] for d in _whole_lines(path)] == ["job-0", "job-1"]
        filler.unlink()
        text, _ = scenarios.single("idle", "job_ended", seed=1, minutes=2)
        fams = [proc.process(s) for s in snapshots_of(text)][-1]  # type: ignore[arg-type]
        proc.close()
        assert [d["job_id"] for d in _whole_lines(path)] == ["job-0", "job-1", "job-2"]
        assert _value(fams, PENDING) == 0
        assert _value(fams, WRITE_ERRORS) >= 1
        assert _value(fams, SKIPPED, reason="torn") == 1


BAD_LINES = {
    "not_utf8": b'{"instance": "\xff\xfe"}',
    "not_json": b"{not json",
    "not_a_window": b"[1, 2, 3]",
}


def test_bad_lines_are_skipped_and_counted_and_the_agent_starts(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = WindowLog(str(path))
    log.append(seq_window(0))
    log.close()
    good = path.read_bytes()
    path.write_bytes(
        good
        + b"\n".join(BAD_LINES.values())
        + b"\n42\nnull\n"
        + b'{"start": NaN}\n'
        + b"x" * 200_000
        + b"\n"
        + good.replace(b"job-0", b"job-1")
        + good[:30]
    )
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(path)), interval_seconds=5)
    assert [w.job_id for w in proc.windows()[0]] == ["job-0", "job-1"]
    fams = proc._families()
    proc.close()
    got = {r: _value(fams, SKIPPED, reason=r) for r in ("not_utf8", "not_json", "not_a_window")}
    assert got == {"not_utf8": 1, "not_json": 2, "not_a_window": 3}
    assert _value(fams, SKIPPED, reason="too_long") == 1
    assert _value(fams, SKIPPED, reason="torn") == 1


def test_a_real_agent_starts_on_a_log_of_garbage(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_bytes(b"\xff\xfe\n[1,2,3]\n42\n")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"correlator:\n  windows_log: {path}\n")
    code = textwrap.dedent(
        f"""
        from gpufeed.config import load_config
        from gpufeed.correlator.feeds.live import CorrelatorProcessor
        p = CorrelatorProcessor(load_config({str(cfg)!r}).correlator)
        print(len(p.windows()[0]))
        p.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0"
    assert "skipped 3 lines" in res.stderr


def test_a_kill_between_the_renames_of_a_rotation_hides_no_window(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    log = WindowLog(str(path), max_bytes=4096, backups=3)
    for i in range(80):
        log.append(seq_window(i))
    log.close()
    before = _jobs(path)
    assert (tmp_path / "w.jsonl.3").exists()
    # the kill came after `.1 -> .2`, before `w.jsonl -> .1`
    os.replace(tmp_path / "w.jsonl.2", tmp_path / "w.jsonl.3")
    os.replace(tmp_path / "w.jsonl.1", tmp_path / "w.jsonl.2")
    after_kill = _jobs(path)
    lost_by_retention = before[: len(before) - len(after_kill)]
    assert after_kill == before[len(lost_by_retention) :]
    assert len(after_kill) > len(before) * 2 // 3  # .2, .3 and the live file, not just one
    log = WindowLog(str(path), max_bytes=4096, backups=3)
    for i in range(80, 90):
        log.append(seq_window(i))
    log.close()
    jobs = _jobs(path)
    assert jobs == sorted(jobs, key=lambda j: int(j.split("-")[1]))
    assert jobs[-10:] == [f"job-{i}" for i in range(80, 90)]
    assert len(jobs) == len(set(jobs))


def test_one_writer_per_log_and_the_error_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from gpufeed.correlator.outputs.windowlog import WindowLog; "
            f"log = WindowLog({str(path)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(
            WindowLogInUse, match=rf"in use by another process \(pid {holder.pid}\)"
        ):
            WindowLog(str(path))
    finally:
        holder.kill()
        holder.wait()
    WindowLog(str(path)).close()  # the lock died with its holder


def test_lines_say_simulated_and_a_real_agent_ignores_simulated_ones(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    sim = WindowLog(str(path), simulated=True)
    sim.append(seq_window(0))
    sim.close()
    real = WindowLog(str(path))
    real.append(seq_window(1))
    real.close()
    assert [d["simulated"] for d in _whole_lines(path)] == [True, False]
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(path)), interval_seconds=5)
    assert [w.job_id for w in proc.windows()[0]] == ["job-1"]
    assert _value(proc._families(), SKIPPED, reason="simulated") == 1
    proc.close()
    proc = CorrelatorProcessor(
        CorrelatorConfig(windows_log=str(path)), interval_seconds=5, simulated=True
    )
    assert [w.job_id for w in proc.windows()[0]] == ["job-0"]
    proc.close()
    assert scan_log(str(path), simulated=None).simulated_seen == 1


def _until_open(proc: CorrelatorProcessor) -> None:
    text, _ = scenarios.single("network", "saturated", seed=2, minutes=30)
    for snap in snapshots_of(text):
        proc.process(snap)  # type: ignore[arg-type]
        if proc.windows()[1]:
            return
    raise AssertionError("no window opened")


def test_windows_open_at_a_clean_stop_are_logged_as_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(path)), interval_seconds=5)
    _until_open(proc)
    open_ = proc.windows()[1]
    proc.close()
    logged = list(read_log(str(path)))
    assert [(w.gpu, w.start_seconds, w.cause) for w in logged] == [
        (w.gpu, w.start_seconds, w.cause) for w in open_
    ]
    assert all(dict(w.evidence)["interrupted"] == "agent stopped" for w in logged)
    assert not Path(openwindows.record_path(str(path))).exists()


def test_windows_open_at_kill_9_are_logged_at_the_next_start_once(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    code = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = [{str(REPO)!r}, {str(REPO / "tests")!r}]  # bench/ and the helpers
        from correlator_helpers import scenarios, snapshots_of
        from gpufeed.config import CorrelatorConfig
        from gpufeed.correlator.feeds.live import CorrelatorProcessor
        proc = CorrelatorProcessor(CorrelatorConfig(windows_log={str(path)!r}), interval_seconds=5)
        text, _ = scenarios.single("network", "saturated", seed=2, minutes=30)
        for snap in snapshots_of(text):
            proc.process(snap)
            if proc.windows()[1]:
                break
        for w in proc.windows()[1]:
            print(w.gpu, w.start_seconds, flush=True)
        print("open", flush=True)
        sys.stdin.read()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    opened = []
    for line in p.stdout:
        if line.strip() == "open":
            break
        opened.append(line.split())
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert opened and _jobs(path) == []
    for _ in range(2):  # a second start finds the window logged and adds nothing
        proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(path)), interval_seconds=5)
        closed = proc.windows()[0]
        proc.close()
        assert [[w.gpu, str(w.start_seconds)] for w in closed] == opened
        assert all(dict(w.evidence)["interrupted"] == "agent stopped" for w in closed)
    assert len(list(read_log(str(path)))) == len(opened)


def test_rotation_with_a_relative_path_keeps_its_backups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    log = WindowLog("w.jsonl", max_bytes=4096, backups=3)
    for i in range(80):
        log.append(seq_window(i))
    log.close()
    assert sorted(p.name for p in tmp_path.glob("w.jsonl.[0-9]")) == [
        "w.jsonl.1",
        "w.jsonl.2",
        "w.jsonl.3",
    ]
    jobs = _jobs(tmp_path / "w.jsonl")
    assert jobs[-1] == "job-79" and len(jobs) > 40


def test_a_log_that_opens_late_gets_the_windows_closed_before(tmp_path: Path) -> None:
    """At start the log's directory cannot be made (a file is in the way); later another
    process holds it; when it is free, the windows closed meanwhile are written, in order."""
    blocker = tmp_path / "state"
    blocker.write_text("not a directory")
    path = blocker / "w.jsonl"
    proc = CorrelatorProcessor(CorrelatorConfig(windows_log=str(path)), interval_seconds=5)
    proc._closed(seq_window(0))  # the engine's on_window callback
    blocker.unlink()
    blocker.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from gpufeed.correlator.outputs.windowlog import WindowLog; "
            f"log = WindowLog({str(path)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
    text, _ = scenarios.single("idle", "job_ended", seed=1, minutes=3)
    snaps = snapshots_of(text)
    try:
        for snap in snaps[: len(snaps) // 2]:
            fams = proc.process(snap)  # type: ignore[arg-type]  # never raises
    finally:
        holder.kill()
        holder.wait()
    assert _value(fams, WRITE_ERRORS) >= 2 and _value(fams, PENDING) == 1
    proc._closed(seq_window(1))
    for snap in snaps[len(snaps) // 2 :]:
        fams = proc.process(snap)  # type: ignore[arg-type]
    proc.close()
    assert _jobs(path) == ["job-0", "job-1"]
    assert _value(fams, PENDING) == 0
