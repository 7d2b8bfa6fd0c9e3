"""`gpufeed analyze --prometheus` against a real Prometheus (Debian package), loaded from a
trace by `promtool tsdb create-blocks-from openmetrics`: the same windows as the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from correlator_helpers import scenarios
from procports import refused_port
from prometheus_trace import prometheus_serving, run_analyze

pytestmark = pytest.mark.slow


@pytest.fixture
def prometheus(tmp_path: Path):  # type: ignore[no-untyped-def]
    # two nodes, different causes, one of them without SDK signals
    a, _ = scenarios.single("data_loading", "contended", seed=2, minutes=40)
    b, _ = scenarios.single("network", "congested", seed=3, sdk=False, minutes=40)
    # and two jobs: renamed alone, both nodes ran job node-t-a0, one job whose GPUs on
    # either node were each other's peers (SM activity against the job's busiest GPU), so
    # the windows of node-u alone (--match) differed from node-u's beside node-t
    b = b.replace('instance="node-t:9400"', 'instance="node-u:9400"')
    b = b.replace('job_id="node-t-', 'job_id="node-u-')
    body = [x for x in (a + b).splitlines() if x != "# EOF"]
    trace = tmp_path / "trace.om"
    trace.write_text("\n".join([*body, "# EOF"]) + "\n")
    with prometheus_serving(trace, tmp_path) as url:
        yield url, trace


def test_range_query_gives_the_same_windows_as_the_file(prometheus, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, trace = prometheus
    file_out = tmp_path / "file.jsonl"
    prom_out = tmp_path / "prom.jsonl"
    assert run_analyze(str(trace), "--output", str(file_out)) == 0
    start = 1_760_000_005
    end = start + 40 * 60
    assert (
        run_analyze(
            "--prometheus",
            url,
            "--start",
            str(start),
            "--end",
            str(end),
            "--step",
            "5",
            "--output",
            str(prom_out),
        )
        == 0
    )
    from_file = [json.loads(x) for x in file_out.read_text().splitlines()]
    from_prom = [json.loads(x) for x in prom_out.read_text().splitlines()]
    assert {d["instance"] for d in from_file} == {"node-t:9400", "node-u:9400"}
    assert {(d["instance"], d["cause"]) for d in from_file} == {
        ("node-t:9400", "data_loading"),
        ("node-u:9400", "network"),
    }
    assert from_prom == from_file
    # --match narrows to one node; RFC 3339 times work
    only = tmp_path / "only.jsonl"
    assert (
        run_analyze(
            "--prometheus",
            url,
            "--start",
            "2025-10-09T08:53:25Z",
            "--end",
            str(end),
            "--step",
            "5",
            "--match",
            '{instance="node-u:9400"}',
            "--output",
            str(only),
        )
        == 0
    )
    got = [json.loads(x) for x in only.read_text().splitlines()]
    assert got == [d for d in from_file if d["instance"] == "node-u:9400"]


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        assert (
            run_analyze("--prometheus", url, "--start", "0", "--end", "100", "--retries", "1") == 1
        )
    err = capsys.readouterr().err
    assert err.startswith("gpufeed analyze: finding the instances: ")
    assert "gave up after 2 tries" in err


def test_a_partial_answer_is_an_error_not_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Thanos (a store down) and Mimir answer "success" with warnings when data is missing;
    analyze must not write windows from that. The server here answers like such a query
    layer does; a real Thanos is not installed."""
    import http.server
    import threading

    class Partial(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data: object = ["node-a:9400"] if "/label/" in self.path else {"result": []}
            body = {"status": "success", "data": data, "warnings": ["store 10.0.0.7 down"]}
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Partial)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    out = tmp_path / "w.jsonl"
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert run_analyze("--prometheus", url, "--start", "0", "--end", "100", "-o", str(out)) == 1
    finally:
        srv.shutdown()
        srv.server_close()
    err = capsys.readouterr().err
    assert "may be incomplete" in err and "store 10.0.0.7 down" in err
    assert not out.exists()
