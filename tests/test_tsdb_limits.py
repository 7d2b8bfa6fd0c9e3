"""A TSDB's per-call series limit against a real VictoriaMetrics (Debian package) started with
a low `-search.maxUniqueTimeseries` (the default, 300,000, is what a 1,000-node fleet
exceeds; 1,000 here exceeds 4 simulated nodes the same way): `analyze --prometheus` finds
the instances one family at a time, so no call matches more than one family's series, and
gives the file's windows; `gpufeed fleet` (no discovery call) runs its cycle. Below one
family's series, both fail in one line naming the server's flag and the `--match` /
`--shard` way round it."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufeed.cli import main
from gpufeed.simulate.tracegen import DEFAULT_START_UNIX, generate_trace
from tsdb_vm import RestartableVictoria
from victoria import import_trace, settle
from window_match import assert_same_windows

pytestmark = pytest.mark.slow

MINUTES = 30
START = int(DEFAULT_START_UNIX)
END = START + MINUTES * 60
LIMIT = 1000  # more than one family's series of the 4 nodes, fewer than all of them
# one family exceeds this: 4 nodes x 8 GPUs x 8 clock-event reasons
TOO_LOW = 100


def _limit(n: int) -> list[str]:
    return [f"-search.maxUniqueTimeseries={n}"]


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RestartableVictoria, Path]]:
    d = tmp_path_factory.mktemp("limits")
    trace = d / "trace.om"
    generate_trace(trace, None, nodes=4, duration_s=MINUTES * 60, step_s=15.0, seed=5)
    server = RestartableVictoria(d / "vm", _limit(LIMIT))
    server.start()  # fails (never skips) where victoria-metrics is not installed
    try:
        import_trace(server.url, trace)
        settle(server.url)
        yield server, trace
    finally:
        server.stop()


def _label_values(url: str, selector: str) -> int:
    """HTTP status of one label-values call matching `selector` over the trace's range."""
    q = urllib.parse.urlencode({"match[]": selector, "start": START, "end": END})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/label/instance/values?{q}", timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def _analyze(url: str, out: Path) -> int:
    argv = ["analyze", "--prometheus", url, "--start", str(START), "--end", str(END)]
    return main([*argv, "--step", "15", "-o", str(out)])


def _fleet_once(url: str, out: Path) -> int:
    # the last boundary of the trace: a cycle over [anchor, boundary] of every node
    boundary = math.floor(END / 60) * 60
    argv = ["fleet", f"--prometheus.url={url}", f"--fleet.once={boundary}", f"--output={out}"]
    return main(argv)


def test_discovery_above_the_series_limit_finds_every_instance(
    vm: tuple[RestartableVictoria, Path], tmp_path: Path
) -> None:
    server, trace = vm
    # the limit bites: one call over every family (what discovery was) is refused
    assert _label_values(server.url, '{__name__=~"gpufeed_.+"}') == 422
    assert _label_values(server.url, '{__name__="gpufeed_gpu_clock_event_active"}') == 200
    file_out, out = tmp_path / "file.jsonl", tmp_path / "tsdb.jsonl"
    assert main(["analyze", str(trace), "-o", str(file_out)]) == 0
    assert _analyze(server.url, out) == 0
    want = file_out.read_text()
    assert want.count("\n") > 10, "the trace has too few windows to prove anything"
    assert {json.loads(x)["instance"] for x in out.read_text().splitlines()} == {
        f"gpu-node-00{i}:9842" for i in range(4)
    }
    assert_same_windows(want, out.read_text())
    once = tmp_path / "once.jsonl"
    assert _fleet_once(server.url, once) == 0
    assert once.read_text().count("\n") > 0


def test_below_one_familys_series_both_fail_in_one_line_naming_the_flag(
    vm: tuple[RestartableVictoria, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = vm
    server.stop()
    server.extra_args = _limit(TOO_LOW)
    server.start()  # same port, same data
    try:
        capsys.readouterr()
        out = tmp_path / "w.jsonl"
        for name, run in (("analyze", _analyze), ("fleet", _fleet_once)):
            code = run(server.url, out)
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 1, name
            assert len(err) == 1, (name, err)
            assert f"gpufeed {name}: " in err[0] and "HTTP 422" in err[0], err[0]
            assert "-search.maxUniqueTimeseries" in err[0] and "--match" in err[0], err[0]
            assert not out.exists()
    finally:
        server.stop()
        server.extra_args = _limit(LIMIT)
        server.start()
