"""Streamed `gpufeed analyze --prometheus` against a real VictoriaMetrics (Debian package):
batches grouped by job, time chunks, shards and their merge give byte for byte the windows
of the unstreamed analysis of the same server, and those are the windows of the file
analysis (numbers to VictoriaMetrics' precision: tests/window_match.py); a TSDB that fails
for a while is waited out, one that stays down is one line naming the batch and no output."""

from __future__ import annotations

import http.server
import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from gpufeed.cli import main
from gpufeed.correlator.engine.engine import WindowParams
from gpufeed.correlator.feeds.analyze import analyze_nodes
from gpufeed.correlator.feeds.batches import job_groups, pack_batches, parse_shard, shard_groups
from gpufeed.correlator.feeds.promql import load_range
from gpufeed.correlator.job.culprit import correlate_jobs
from gpufeed.correlator.outputs.output import render
from gpufeed.simulate.tracegen import DEFAULT_START_UNIX, generate_trace
from victoria import import_trace, settle, victoria
from window_match import assert_same_windows

HOURS = 2.0
START = int(DEFAULT_START_UNIX)
END = START + int(HOURS * 3600)
# node 3's job is renamed to node 0's: one two-node job, which must stay in one batch/shard
SHARED_FROM, SHARED_TO = "job-13506", "job-96923"


# ---- the plan: pure functions -------------------------------------------------------------
def test_job_groups_join_instances_transitively() -> None:
    insts = ["a", "b", "c", "d", "e"]
    jobs = [("a", "j1"), ("c", "j1"), ("c", "j2"), ("e", "j2"), ("b", "j3"), ("zz", "j1")]
    assert job_groups(insts, jobs) == [("a", "c", "e"), ("b",), ("d",)]


@pytest.mark.parametrize("shards", [1, 2, 3, 7])
def test_shards_partition_the_groups_and_batches_never_split_one(shards: int) -> None:
    rng = random.Random(shards)
    insts = [f"n{i:03d}" for i in range(60)]
    jobs = [(rng.choice(insts), f"j{rng.randrange(25)}") for _ in range(40)]
    groups = job_groups(insts, jobs)
    seen: list[tuple[str, ...]] = []
    sizes = []
    for k in range(1, shards + 1):
        mine = shard_groups(groups, k, shards)
        assert mine == shard_groups(list(reversed(groups)), k, shards)  # order-free
        batches = pack_batches(mine, 4)
        assert sorted(i for b in batches for i in b.instances) == sorted(i for g in mine for i in g)
        for b in batches:
            assert len(b.instances) <= 4 or any(set(g) == set(b.instances) for g in mine)
            for g in mine:  # a group is wholly in a batch or not in it
                assert set(g) <= set(b.instances) or not set(g) & set(b.instances)
        seen += mine
        sizes.append(sum(len(g) for g in mine))
    assert sorted(seen) == sorted(groups)
    assert max(sizes) - min(sizes) <= max(len(g) for g in groups)


@pytest.mark.parametrize("bad", ["0/2", "3/2", "2", "a/b", "1/0", ""])
def test_a_bad_shard_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="K/N"):
        parse_shard(bad)
    assert main(["analyze", "--prometheus", "http://x", "--start", "0", "--end", "9",
                 "--shard", bad]) == 2  # fmt: skip
    assert "--shard" in capsys.readouterr().err


def test_merge_refuses_unsorted_and_overlapping_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def line(inst: str, start: float) -> str:
        return json.dumps({"instance": inst, "gpu": "0", "job_id": "", "start": start}) + "\n"

    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    a.write_text(line("n1", 5.0) + line("n1", 1.0))
    b.write_text(line("n2", 1.0))
    c.write_text(line("n2", 9.0))
    out = tmp_path / "out.jsonl"
    assert main(["analyze", "--merge", str(a), str(b), "-o", str(out)]) == 1
    assert "a.jsonl:2: windows are not in order" in capsys.readouterr().err
    assert main(["analyze", "--merge", str(b), str(c), "-o", str(out)]) == 1
    assert "is also in" in capsys.readouterr().err
    assert main(["analyze", "--merge", str(b), str(tmp_path / "gone.jsonl"), "-o", str(out)]) == 1
    assert "gone.jsonl: No such file or directory" in capsys.readouterr().err
    assert not out.exists()


# ---- against VictoriaMetrics -------------------------------------------------------------
class Fleet(NamedTuple):
    url: str  # VictoriaMetrics, loaded with the trace and settled
    trace: Path
    file_windows: bytes  # `gpufeed analyze` of the trace file
    tsdb_windows: bytes  # the whole range of every node from the server, in memory at once


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    d = tmp_path_factory.mktemp("fleet")
    raw = d / "raw.om"
    generate_trace(raw, None, nodes=4, duration_s=HOURS * 3600, step_s=15.0, seed=5)
    trace = d / "trace.om"
    trace.write_text(raw.read_text().replace(SHARED_FROM, SHARED_TO))
    raw.unlink()
    out = d / "file.jsonl"
    assert main(["analyze", str(trace), "-o", str(out)]) == 0
    with victoria(d / "vm") as url:
        import_trace(url, trace)
        settle(url)  # every query below reads the same stored digits
        # the unstreamed reference: the whole range of every node in memory at once
        nodes = load_range(url, START, END, 15.0)
        windows = correlate_jobs(nodes.values(), analyze_nodes(nodes.values(), WindowParams()))
        yield Fleet(url, trace, out.read_bytes(), render(windows, "jsonl").encode())


def _analyze(url: str, out: Path, *extra: str) -> int:
    argv = ["analyze", "--prometheus", url, "--start", str(START), "--end", str(END)]
    return main([*argv, "--step", "15", "-o", str(out), *extra])


@pytest.mark.slow
def test_streamed_batches_chunks_and_shards_give_the_file_windows(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, want = fleet.url, fleet.tsdb_windows
    assert fleet.file_windows.count(b"\n") > 50
    assert {json.loads(x)["instance"] for x in fleet.file_windows.splitlines()} == {
        f"gpu-node-00{i}:9842" for i in range(4)
    }
    assert_same_windows(fleet.file_windows, want)

    whole = tmp_path / "whole.jsonl"
    assert _analyze(url, whole) == 0  # one batch, one chunk
    assert whole.read_bytes() == want

    small = tmp_path / "small.jsonl"  # 20-minute chunks (history trimmed), 1-node batches
    assert _analyze(url, small, "--chunk", "1200", "--batch-instances", "1", "--jobs", "2",
                    "--progress") == 0  # fmt: skip
    assert small.read_bytes() == want
    err = capsys.readouterr().err
    # the two-node job is one batch despite --batch-instances 1
    assert "(2 instances, gpu-node-000:9842 .. gpu-node-003:9842)" in err
    assert "3 batches" in err

    parts = []
    for k in (1, 2, 3):
        part = tmp_path / f"shard{k}.jsonl"
        assert _analyze(url, part, "--shard", f"{k}/3", "--chunk", "1800") == 0
        insts = {json.loads(x)["instance"] for x in part.read_text().splitlines()}
        assert insts and ("gpu-node-000:9842" in insts) == ("gpu-node-003:9842" in insts)
        parts.append(str(part))
    merged = tmp_path / "merged.jsonl"
    assert main(["analyze", "--merge", *reversed(parts), "-o", str(merged)]) == 0
    assert merged.read_bytes() == want
    assert not list(tmp_path.glob(".gpufeed-*"))  # no spool or temporary file left


class _Faulty(http.server.ThreadingHTTPServer):
    """A proxy in front of the TSDB: answers 503 to requests number `fail_from` to
    `fail_until` (counted from 1), forwards the others."""

    def __init__(self, upstream: str, fail_from: int, fail_until: int) -> None:
        self.upstream, self.fail_from, self.fail_until = upstream, fail_from, fail_until
        self.count = 0
        self.failed = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Faulty

    def do_GET(self) -> None:
        srv = self.server
        with srv.lock:
            srv.count += 1
            fail = srv.fail_from <= srv.count <= srv.fail_until
            srv.failed += fail
        if fail:
            self.send_error(503, "TSDB unavailable")
            return
        try:
            with urllib.request.urlopen(srv.upstream + self.path, timeout=60) as r:
                body, code = r.read(), r.status
        except urllib.error.HTTPError as e:
            body, code = e.read(), e.code
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy(request: pytest.FixtureRequest, fleet: Fleet) -> Iterator[_Faulty]:
    fail_from, fail_until = request.param
    srv = _Faulty(fleet.url, fail_from, fail_until)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
# requests 100-102 of about 200: after the discovery (67 calls for 4 nodes), mid-data
@pytest.mark.parametrize("proxy", [(100, 102)], indirect=True)
def test_a_tsdb_down_for_a_while_is_waited_out(
    proxy: _Faulty, fleet: Fleet, tmp_path: Path
) -> None:
    out = tmp_path / "w.jsonl"
    assert _analyze(proxy.url, out, "--chunk", "3600", "--jobs", "1") == 0
    assert proxy.failed == 3  # three 503s in the middle of the run, each asked again
    assert out.read_bytes() == fleet.tsdb_windows


@pytest.mark.slow
@pytest.mark.parametrize("proxy", [(100, 10**9)], indirect=True)
def test_a_tsdb_that_stays_down_is_one_line_naming_the_batch_and_no_output(
    proxy: _Faulty, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w.jsonl"
    assert _analyze(proxy.url, out, "--batch-instances", "1", "--jobs", "2", "--retries",
                    "2") == 1  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("gpufeed analyze: batch ")
    assert "HTTP 503" in err[0] and "gave up after 3 tries" in err[0]
    assert err[0].endswith("nothing written")
    assert not out.exists()
    assert not list(tmp_path.glob(".gpufeed-*"))
