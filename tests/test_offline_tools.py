"""`gpufeed analyze` and `gpufeed windows` on bad input: one line naming the problem,
never a traceback, a hang or unbounded memory."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import agent_env, gpufeed_cmd
from correlator_helpers import scenarios
from gpufeed.correlator.outputs.windowlog import WindowLog
from gpufeed.trace.reader import MAX_LINE_BYTES
from windowlog_helpers import seq_window, small_tmpfs


def gpufeed(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpufeed_cmd(*args), env=agent_env(), capture_output=True, text=True, timeout=timeout
    )


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def trace_lines() -> list[str]:
    text, _ = scenarios.single("network", "saturated", seed=2, minutes=10)
    return text.splitlines(keepends=True)


@pytest.mark.parametrize("stamp", ["NaN", "0", "-5", "1e10", "+Inf", "1750000000000"])
def test_analyze_refuses_timestamps_that_are_not_unix_seconds(
    stamp: str, trace_lines: list[str], tmp_path: Path
) -> None:
    lines = list(trace_lines)
    n = next(i for i, line in enumerate(lines) if line.startswith("gpufeed_gpu_utilization_ratio"))
    n += len(lines) // 2  # somewhere in the middle
    while not lines[n].startswith("gpufeed_gpu_utilization_ratio"):
        n += 1
    series, value, _ = lines[n].rsplit(" ", 2)
    lines[n] = f"{series} {value} {stamp}\n"
    path = tmp_path / "trace.om"
    path.write_text("".join(lines))
    res = gpufeed("analyze", str(path))
    assert res.returncode == 1 and res.stdout == ""
    hint = " (milliseconds? traces carry seconds)" if stamp == "1750000000000" else ""
    assert _one_line(res.stderr) == (
        f"gpufeed analyze: {path}:{n + 1}: timestamp {stamp!r} is not unix seconds between "
        f"2000 and 2100{hint}"
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--min-window", "nan", "--min-window must be a positive number of seconds"),
        ("--min-window", "inf", "--min-window must be a positive number of seconds"),
        ("--merge-gap", "-5", "--merge-gap must be zero or a positive number of seconds"),
        ("--merge-gap", "nan", "--merge-gap must be zero or a positive number of seconds"),
        ("--threshold", "nan", "--threshold must be in (0, 1]"),
        ("--step", "nan", "--step must be a positive number of seconds"),
    ],
)
def test_analyze_refuses_flags_that_are_not_numbers_it_can_use(
    flag: str, value: str, message: str, tmp_path: Path
) -> None:
    res = gpufeed("analyze", str(tmp_path / "none.om"), f"{flag}={value}")
    assert res.returncode == 2
    assert _one_line(res.stderr) == f"gpufeed analyze: {message}"


def test_analyze_output_into_a_missing_or_read_only_directory(
    trace_lines: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "trace.om"
    path.write_text("".join(trace_lines))
    missing = tmp_path / "no" / "out.jsonl"
    res = gpufeed("analyze", str(path), "--output", str(missing))
    assert res.returncode == 2
    assert _one_line(res.stderr) == (
        f"gpufeed analyze: --output {missing}: directory {missing.parent} does not exist"
    )
    with small_tmpfs(tmp_path, 64) as mnt:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        out = mnt / "out.jsonl"
        res = gpufeed("analyze", str(path), "--output", str(out))
    assert res.returncode in (1, 2)
    assert _one_line(res.stderr).startswith(f"gpufeed analyze: --output {out}: ")


def test_a_200_mb_line_is_refused_with_its_line_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "trace.om"
    with open(path, "wb") as f:
        f.write(b"# TYPE gpufeed_gpu_up gauge\n")
        f.write(b'gpufeed_gpu_up{gpu="0",uuid="u"} 1 1750000000\n')
        f.write(b'gpufeed_gpu_up{gpu="0",uuid="')
        block = b"x" * (1 << 20)
        for _ in range(200):
            f.write(block)
        f.write(b'"} 1 1750000005\n# EOF\n')
    # a fresh parent, so that RUSAGE_CHILDREN is the analysis alone
    code = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(r.returncode); print(r.stderr.strip()); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, *gpufeed_cmd("analyze", str(path))],
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    rc, err, rss_kib = res.stdout.strip().splitlines()
    assert rc == "1"
    assert err == (
        f"gpufeed analyze: {path}:3: a line longer than {MAX_LINE_BYTES} bytes: not a trace"
    )
    assert int(rss_kib) < 200 * 1024, f"{int(rss_kib) // 1024} MiB"


# ---- gpufeed windows ---------------------------------------------------------------------


class _Canned(http.server.BaseHTTPRequestHandler):
    body = b""
    length: int | None = None

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(self.length or len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[type[_Canned]]:
    handler = type("Handler", (_Canned,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


WINDOW = json.dumps(seq_window(1).to_json())


@pytest.mark.parametrize(
    ("body", "length", "why"),
    [
        (b"[1, 2]", None, "reply is a JSON list, not an object"),
        (b'{"windows": null}', None, "reply's 'windows' is not a list"),
        (b'{"open": {}}', None, "reply's 'open' is not a list"),
        (b"[" * 100_000 + b"]" * 100_000, None, "reply nested too deeply"),
        (
            b'{"windows": ['
            + WINDOW.replace('"confidence": 0.9', '"confidence": NaN').encode()
            + b"]}",
            None,
            "NaN is not JSON",
        ),
        (b'{"windows": [42]}', None, "reply's windows[0] is not a window"),
        (b'{"windows": []', 100, "short reply (14 of 100 bytes)"),
        (b"\xff\xfe", None, "reply is not JSON"),
    ],
)
def test_malformed_replies_are_one_line(
    canned: type[_Canned], body: bytes, length: int | None, why: str
) -> None:
    canned.body, canned.length = body, length
    res = gpufeed("windows", "--agent", canned.url)  # type: ignore[attr-defined]
    assert res.returncode == 1 and res.stdout == ""
    line = _one_line(res.stderr)
    assert line.startswith("gpufeed windows: cannot read windows: ") and why in line, line


def test_a_trickling_agent_meets_the_total_deadline() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
                if stop.wait(0.2):
                    return
                conn.sendall(bytes([b]))

    threading.Thread(target=trickle, daemon=True).start()
    try:
        t0 = time.monotonic()
        res = gpufeed(
            "windows", "--agent", f"http://127.0.0.1:{server.getsockname()[1]}", "--timeout", "2"
        )
        took = time.monotonic() - t0
    finally:
        stop.set()
        server.close()
    assert res.returncode == 1
    assert "no complete answer within 2s" in _one_line(res.stderr)
    assert took < 15  # 2 s plus the interpreter's start, not the trickle's 5 hours


def test_windows_log_that_is_not_a_regular_file_is_refused_at_once() -> None:
    res = gpufeed("windows", "--log", "/dev/zero", timeout=30)
    assert res.returncode == 1
    assert _one_line(res.stderr) == (
        "gpufeed windows: cannot read windows: /dev/zero: not a regular file"
    )


def test_agent_supplied_strings_cannot_drive_the_terminal(tmp_path: Path) -> None:
    import dataclasses

    path = tmp_path / "w.jsonl"
    log = WindowLog(str(path))
    w = dataclasses.replace(
        seq_window(1), job_id="job\x1b[2J", summary="ok\u202edesrever\x07", instance="n\n2"
    )
    log.append(w)
    log.close()
    res = gpufeed("windows", "--log", str(path))
    assert res.returncode == 0
    for raw in ("\x1b", "\u202e", "\x07"):
        assert raw not in res.stdout
    assert "job\\x1b[2J" in res.stdout and "ok\\u202edesrever\\x07" in res.stdout
    assert len(res.stdout.splitlines()) == 2  # the newline in the instance is escaped too
    res = gpufeed("windows", "--log", str(path), "--format", "jsonl")
    assert "\x1b" not in res.stdout and json.loads(res.stdout)["job_id"] == "job\x1b[2J"
