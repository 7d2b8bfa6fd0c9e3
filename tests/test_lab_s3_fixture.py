"""The fault lab's S3 scenario, recorded (tests/fixtures/lab/s3-slow/: `python -m lab.run
--launcher run s3-slow`, the trace the agent recorded, filtered to the families the
correlator reads, and what it said live): the real training program under `gpufeed run`
read its dataset with boto3 from a bucket on moto's S3 server, through a proxy that
answered 250 ms slower from 150 s to 215 s. `make lab` runs the scenario live; this is
its short form in `make test` (a live run needs the correlator's 2 minutes of healthy
baseline, far beyond this lane's share of the suite's time).

Checked: the fault is in the recording (the S3 tier's mean request latency rises with it,
the bytes the job read from the tier count in its per-tier family), and `gpufeed analyze`
over it names data_loading for most of the fault with the S3 tier named, in the evidence
and the summary, by its own read latency against its healthy median.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

from correlator_helpers import analyze_text
from gpufeed.correlator.engine.causes import Cause
from gpufeed.correlator.engine.names import Context as Ctx
from gpufeed.correlator.engine.names import Feature as F

FIXTURE = Path(__file__).parent / "fixtures" / "lab" / "s3-slow"


def _run() -> dict[str, Any]:
    return json.loads((FIXTURE / "run.json").read_text())


def _trace() -> str:
    return gzip.decompress((FIXTURE / "trace.om.gz").read_bytes()).decode()


def _counter(text: str, name: str, t0: float) -> list[tuple[float, float]]:
    pat = re.compile(rf'^{name}\{{operation="read",tier="s3",[^}}]*\}} (\S+) (\S+)$', re.M)
    return [(float(t) - t0, float(v)) for v, t in pat.findall(text)]


def _mean_latency(text: str, t0: float, start: float, stop: float) -> float:
    def at(series: list[tuple[float, float]], t: float) -> float:
        return min(series, key=lambda p: abs(p[0] - t))[1]

    secs = _counter(text, "gpufeed_object_storage_request_seconds_total", t0)
    reqs = _counter(text, "gpufeed_object_storage_requests_total", t0)
    return (at(secs, stop) - at(secs, start)) / (at(reqs, stop) - at(reqs, start))


def test_the_recording_holds_the_slow_endpoint() -> None:
    run = _run()
    text = _trace()
    assert text.rstrip().endswith("# EOF")
    fault = run["fault"]
    healthy = _mean_latency(text, run["t0"], 20.0, 140.0)
    slow = _mean_latency(text, run["t0"], fault["start_s"] + 10, fault["stop_s"] - 5)
    # the proxy's 250 ms on top of the healthy latency, in every request
    assert slow - healthy >= 0.8 * fault["delay_ms"] / 1000, (healthy, slow)
    assert re.search(r'^gpufeed_job_storage_read_bytes_total\{job_id="\d+",tier="s3"', text, re.M)


def test_analyze_names_data_loading_from_the_s3_tier(tmp_path: Path) -> None:
    run = _run()
    t0, fault = run["t0"], run["fault"]
    windows = analyze_text(_trace(), tmp_path)
    start, stop = fault["start_s"], fault["stop_s"]
    hits = [w for w in windows if w.cause is Cause.DATA_LOADING]
    covered = sum(
        max(0.0, min(w.end_seconds - t0, stop) - max(w.start_seconds - t0, start)) for w in hits
    )
    assert covered >= 0.8 * (stop - start), [(w.cause, w.start_seconds - t0) for w in windows]
    for w in hits:
        ev = dict(w.evidence)
        assert ev.get(Ctx.DATA_TIER) == "s3", ev
        assert "s3 tier" in w.summary, w.summary
        assert float(ev[F.DATA_TIER_READ_LATENCY_X_BASELINE]) >= 2.5, ev
    # what the agent said live, recorded with the fixture, agrees
    live = [x for x in run["live_windows"] if x["cause"] == "data_loading"]
    assert live and all(x["evidence"]["data_tier"] == "s3" for x in live)
