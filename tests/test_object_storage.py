"""Object-storage tiers (issue 16): s3:// tier entries, the OBJECT datagram, and `gpufeed run`
reporting boto3's and s3fs's requests to a real S3 server (moto's, on an ephemeral port)
through a real proxy that is slow or answers 503 SlowDown; byte counts exact."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufeed.collectors.base import CollectorContext
from gpufeed.collectors.job_io import JobIoCollector
from gpufeed.collectors.sdk import SdkCollector
from gpufeed.config import ConfigError, parse_config
from gpufeed.jobs import wire
from gpufeed.model import iter_samples
from gpufeed.run_cli import instrumented_env
from gpufeed.sdk import object_location as sdk_object_location
from gpufeed.storage.objects import ObjectTierEntry, object_location, resolve_location
from lab.faults.s3 import S3Proxy, quiet_s3_server

CONFIG = """
tiers:
  hot: /mnt/hot
  s3train:
    - s3://train-data/imagenet
  s3local:
    - {url: s3://train-data, endpoint: "http://127.0.0.1:%d"}
"""


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("tiers:\n  x: s3://Bad_Bucket\n", "tiers.x: 'Bad_Bucket' is not an S3 bucket name"),
        ("tiers:\n  x: s3://ab\n", "'ab' is not an S3 bucket name"),
        ("tiers:\n  x: [{url: s3://abc, endpoint: 'ftp://h'}]\n", "tiers.x.endpoint: expected"),
        ("tiers:\n  x: [{url: s3://abc, port: 1}]\n", "tiers.x.port: unknown key"),
        ("tiers:\n  x: [{endpoint: 'http://h'}]\n", "needs url: s3://BUCKET"),
        ("tiers:\n  x: [s3://abc/p]\n  y: [s3://abc/p/]\n", "s3://abc/p is already in tier 'x'"),
        ("tiers:\n  x: s3://abc/a//b\n", "has an empty folder"),
        ("tiers:\n  x: nvme\n", "expected an absolute path or s3://BUCKET[/PREFIX]"),
    ],
)
def test_bad_s3_entries_are_one_line_errors(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as got:
        parse_config(text, "agent.yaml")
    msg = str(got.value)
    assert error in msg and "\n" not in msg and msg.startswith("agent.yaml: line ")


def test_s3_entries_parse_and_resolve_to_their_tier() -> None:
    cfg = parse_config(CONFIG % 9000)
    assert [t.name for t in cfg.tiers] == ["hot", "s3train", "s3local"]
    assert cfg.tiers[1].paths == () and cfg.tiers[0].objects == ()
    entries = cfg.object_tiers
    assert entries == (
        ("s3train", ObjectTierEntry("train-data", "imagenet/", "")),
        ("s3local", ObjectTierEntry("train-data", "", "127.0.0.1:9000")),
    )
    local = "http://127.0.0.1:9000"
    cases = {
        # the longest prefix wins over a whole-bucket entry at the same endpoint
        object_location("train-data", "imagenet/train/0001.tar", local): "s3train",
        object_location("train-data", "other/0001.tar", local): "s3local",
        # a prefix is a folder: "imagenet-old/" is not under "imagenet/"
        object_location("train-data", "imagenet-old/x", "https://s3.amazonaws.com"): (
            "s3://train-data"
        ),
        object_location("train-data", "imagenet/x", "https://s3.amazonaws.com"): "s3train",
        object_location("elsewhere", "k", local): "s3://elsewhere",
        "warm": "warm",  # the SDK's add_io naming a tier
    }
    for location, tier in cases.items():
        assert resolve_location(location, entries) == tier, location


def test_the_sdk_and_the_agent_agree_on_locations_and_the_datagram(tmp_path: Path) -> None:
    for args in (("b-1", "a/b/c.tar", "http://h:1"), ("bkt", "top.bin", ""), ("bkt", "d/", "")):
        assert sdk_object_location(*args) == object_location(*args)
    import socket

    from gpufeed import sdk

    path = str(tmp_path / "s.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(1.0)
    try:
        job = sdk.Job("obj", socket=path)
        hello = wire.decode_datagram(rx.recv(9000))  # the Job registers when it is made
        assert not isinstance(hello, str) and [m.phase for m in hello] == ["startup"]
        job.add_io("s3://bkt1/a/b/c.tar", "read", 1000, 0.5, requests=4, errors=1, throttled=1)
        job.add_io("warm", "write", 10, 0.1)
        with pytest.raises(ValueError, match="neither a tier name"):
            job.add_io("Warm Tier")
        job._flush_objects(time.perf_counter())
        got = wire.decode_datagram(rx.recv(9000))
    finally:
        rx.close()
    assert not isinstance(got, str)
    seen = {
        (m.location, m.operation, m.outcome): (m.requests, m.seconds, m.object_bytes) for m in got
    }
    assert seen == {
        ("s3://bkt1/a/b/", "read", "ok"): (2, 0.25, 1000),
        ("s3://bkt1/a/b/", "read", "error"): (1, 0.125, 0),
        ("s3://bkt1/a/b/", "read", "throttled"): (1, 0.125, 0),
        ("warm", "write", "ok"): (1, 0.1, 10),
    }
    for m in got:
        assert wire.decode_datagram(wire.encode(m)) == [m]


@pytest.mark.parametrize(
    "location",
    [b"", b"Warm", b"s3://AB/x/", b"s3://abc/x/ http://h 1", b"a\x00b", b"s3://abc/" + b"x" * 300],
)
def test_a_bad_location_spoils_the_datagram(location: bytes) -> None:
    msg = wire.Message(
        wire.KIND_OBJECT, "j", "n", location="warm", operation="read", outcome="ok", requests=1
    )
    good = wire.encode(msg)
    head = bytearray(good[: wire.HEADER.size])
    head[5] = len(location) & 0xFF  # reserved: the location's length
    data = bytes(head) + b"jn" + location
    assert isinstance(wire.decode_datagram(data), str)


# -- against a real S3 server -------------------------------------------------------------

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "gpufeed-test",
    "AWS_SECRET_ACCESS_KEY": "gpufeed-test",
    "AWS_DEFAULT_REGION": "us-east-1",
    # no aws-chunked checksum framing on uploads: the proxy forwards plain bodies
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
}
SIZES = [1000, 4096, 65536 + 7, 300_001, 12]

PROGRAM = r"""
import sys, boto3, s3fs
from s3torchconnector import S3ClientConfig, S3MapDataset
url, plain = sys.argv[1], sys.argv[2]
c = boto3.client("s3", endpoint_url=url)
got = 0
for i in range(%d):
    got += len(c.get_object(Bucket="train-data", Key=f"imagenet/train/{i}.bin")["Body"].read())
c.put_object(Bucket="train-data", Key="ckpt/model.bin", Body=b"w" * 777)
fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": url}, default_block_size=1 << 20)
with fs.open("train-data/other/readme.txt", "rb") as f:
    got += len(f.read())
config = S3ClientConfig(force_path_style=True)
data = S3MapDataset.from_prefix("s3://train-data/other/", region="us-east-1", endpoint=plain,
                                s3client_config=config)
got += sum(len(data[i].read()) for i in range(len(data)))
print(got)
"""


@pytest.fixture
def s3() -> Iterator[tuple[str, int]]:
    from moto.server import ThreadedMotoServer

    quiet_s3_server()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        import boto3

        c = boto3.client("s3", endpoint_url=f"http://{host}:{port}", **_creds())
        c.create_bucket(Bucket="train-data")
        for i, n in enumerate(SIZES):
            c.put_object(Bucket="train-data", Key=f"imagenet/train/{i}.bin", Body=os.urandom(n))
        c.put_object(Bucket="train-data", Key="other/readme.txt", Body=b"r" * 5000)
        yield host, port
    finally:
        server.stop()


def _creds() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": AWS_ENV["AWS_DEFAULT_REGION"],
    }


def _run_job(sock: str, endpoint: str, plain: str, tmp_path: Path) -> int:
    env = instrumented_env(
        {"PATH": os.environ["PATH"], **AWS_ENV, "HOME": str(tmp_path)}, sock, "s3job", "run-s3"
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [env["PYTHONPATH"], str(Path(__file__).parents[1] / "exporter")]
    )
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM % len(SIZES), endpoint, plain],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gpufeed:" not in out.stderr, out.stderr[-3000:]
    return int(out.stdout.split()[-1])


def _values(fams: list, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in iter_samples(fams) if s.name == name}


@pytest.mark.slow
def test_boto3_s3fs_and_the_s3_connector_counted_exactly_through_a_throttling_slow_endpoint(
    s3: tuple[str, int], tmp_path: Path
) -> None:
    """boto3 and s3fs read through a proxy that adds 50 ms and throttles every third
    request; the S3 connector (whose Rust client retries throttled requests out of sight)
    through one that only adds 50 ms."""
    host, port = s3
    proxy = S3Proxy(host, port).start()
    proxy.delay_s = 0.05
    proxy.throttle_every = 3
    plain = S3Proxy(host, port).start()
    plain.delay_s = 0.05
    ctx = CollectorContext(config=parse_config(CONFIG % port))
    sdk = SdkCollector(ctx, socket_path=str(tmp_path / "sdk.sock"))
    sdk.start()
    try:
        got = _run_job(sdk.server.socket_path, proxy.endpoint_url, plain.endpoint_url, tmp_path)
        time.sleep(0.3)  # the last datagrams
        fams = sdk.collect()
        job_io = JobIoCollector(ctx, sdk_object_bytes=sdk.object_bytes_by_job).collect()
    finally:
        sdk.stop()
        proxy.stop()
        plain.stop()
    assert got == sum(SIZES) + 2 * 5000
    tr = ("tier", "s3train")
    read = _values(fams, "gpufeed_object_storage_read_bytes_total")
    # the dataset's folder is the s3train tier; other/ and ckpt/ are the whole bucket's
    # entry, whose endpoint is the S3 server's, not the proxies': `s3://train-data`
    assert read == {(tr,): sum(SIZES), (("tier", "s3://train-data"),): 2 * 5000}
    written = _values(fams, "gpufeed_object_storage_written_bytes_total")
    assert written == {(("tier", "s3://train-data"),): 777}
    requests = _values(fams, "gpufeed_object_storage_requests_total")
    errors = _values(fams, "gpufeed_object_storage_errors_total")
    throttled = sum(v for k, v in errors.items() if ("reason", "throttled") in k)
    # every request the proxies saw was reported once, and every one refused as throttled
    assert sum(requests.values()) == proxy.requests + plain.requests
    assert throttled == proxy.throttled > 0
    assert sum(v for k, v in errors.items() if ("reason", "failed") in k) == 0
    key = (("operation", "read"), tr)
    seconds = _values(fams, "gpufeed_object_storage_request_seconds_total")
    assert requests[key] >= len(SIZES)
    assert seconds[key] / requests[key] >= 0.05  # the proxy's delay, in every request
    per_job = _values(fams, "gpufeed_job_object_storage_requests_total")
    assert per_job[(("job_id", "run-s3"), *key)] == requests[key]
    # reads count in the job's per-tier bytes like a mount's
    job_read = _values(job_io, "gpufeed_job_storage_read_bytes_total")
    assert job_read[(("job_id", "run-s3"), tr)] == sum(SIZES)
    assert (
        _values(job_io, "gpufeed_job_storage_written_bytes_total")[
            (("job_id", "run-s3"), ("tier", "s3://train-data"))
        ]
        == 777
    )


# -- the correlator ---------------------------------------------------------------------


def test_a_slow_s3_tier_is_data_loading_with_the_tier_named(tmp_path: Path) -> None:
    """A CPU job under `gpufeed run` reads its dataset from an S3 tier (boto3): its per-tier
    bytes and the node's object-storage families are all there is of that tier. The
    endpoint slows from 20 ms to 400 ms per request: the job waits for input."""
    from correlator_helpers import analyze_text, trace_text
    from gpufeed.correlator.engine.causes import Cause
    from gpufeed.correlator.engine.names import Context as Ctx
    from test_correlator_evidence import INST, JOB, healthy_host, in_fault, node, only_window
    from test_correlator_evidence import phases as job_phases

    tier = 'tier="s3train"'

    def s3(read: float, latency: float, throttled: float = 0.0) -> dict[str, float]:
        requests = read / 1e6  # 1 MB objects
        op = f'{tier},operation="read",{INST}'
        return {
            f"gpufeed_object_storage_read_bytes_total{{{tier},{INST}}}": read,
            f"gpufeed_object_storage_requests_total{{{op}}}": requests,
            f"gpufeed_object_storage_request_seconds_total{{{op}}}": requests * latency,
            f'gpufeed_object_storage_errors_total{{{op},reason="throttled"}}': throttled,
            f"gpufeed_job_storage_read_bytes_total{{{JOB},{tier},{INST}}}": read,
        }

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**job_phases(0.15, 0.85), **s3(1.5e6, 0.4)}
        return {**job_phases(0.93, 0.07), **s3(12e6, 0.02)}

    def host(s: float) -> dict[str, float]:
        return healthy_host(s)

    w = only_window(analyze_text(trace_text(node(job, host), 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING, w.summary
    assert dict(w.evidence).get(Ctx.DATA_TIER) == "s3train", w.evidence
    assert "s3train tier" in w.summary.split(":", 1)[0], w.summary


def test_a_throttling_s3_tier_is_data_loading_with_the_throttled_share(tmp_path: Path) -> None:
    """The endpoint answers 503 SlowDown to a third of the job's reads: each refused request
    is fast, botocore backs off and retries, so the job waits for input while the tier's
    request latency stays normal; the throttled share is what names the tier."""
    from correlator_helpers import analyze_text, trace_text
    from gpufeed.correlator.engine.causes import Cause
    from gpufeed.correlator.engine.names import Context as Ctx
    from gpufeed.correlator.engine.names import Feature as F
    from test_correlator_evidence import INST, JOB, healthy_host, in_fault, node, only_window
    from test_correlator_evidence import phases as job_phases

    tier = 'tier="s3train"'

    def s3(read: float, throttled_share: float) -> dict[str, float]:
        ok = read / 1e6
        requests = ok / (1 - throttled_share)
        op = f'{tier},operation="read",{INST}'
        return {
            f"gpufeed_object_storage_read_bytes_total{{{tier},{INST}}}": read,
            f"gpufeed_object_storage_requests_total{{{op}}}": requests,
            f"gpufeed_object_storage_request_seconds_total{{{op}}}": ok * 0.02
            + (requests - ok) * 0.002,
            f'gpufeed_object_storage_errors_total{{{op},reason="throttled"}}': requests - ok,
            f'gpufeed_object_storage_errors_total{{{op},reason="failed"}}': 0.0,
            f"gpufeed_job_storage_read_bytes_total{{{JOB},{tier},{INST}}}": read,
        }

    def job(s: float) -> dict[str, float]:
        if in_fault(s):
            return {**job_phases(0.3, 0.7), **s3(4e6, 0.33)}
        return {**job_phases(0.93, 0.07), **s3(12e6, 0.0)}

    w = only_window(analyze_text(trace_text(node(job, healthy_host), 1500), tmp_path))
    assert w.cause is Cause.DATA_LOADING, w.summary
    ev = dict(w.evidence)
    assert ev.get(Ctx.DATA_TIER) == "s3train", ev
    assert abs(float(ev[F.DATA_TIER_THROTTLED_RATIO]) - 0.33) < 0.02, ev
    assert "s3train tier throttled 33% of its requests" in w.summary, w.summary


def test_a_job_reports_into_a_bounded_number_of_tiers() -> None:
    """Every unconfigured bucket is a tier of its own: a sender naming ever new buckets
    gets MAX_OBJECT_TIERS_PER_JOB of them per job and MAX_OBJECT_TIERS on the node."""
    from gpufeed.jobs.aggregate import MAX_OBJECT_TIERS, MAX_OBJECT_TIERS_PER_JOB, JobTable

    table = JobTable(64, 60.0, lambda pid: True, lambda loc: resolve_location(loc, ()))
    for j in range(8):
        for b in range(MAX_OBJECT_TIERS_PER_JOB + 4):
            msg = wire.Message(
                wire.KIND_OBJECT, f"job{j}", "n", location=f"s3://bucket-{j}-{b}/x/",
                operation="read", outcome="ok", requests=1, object_bytes=10,
            )  # fmt: skip
            assert table.apply(msg, 100 + j, 0.0) is None
    per_job = table.object_bytes_by_job()
    assert all(len(tiers) == MAX_OBJECT_TIERS_PER_JOB for tiers in per_job.values())
    node = {
        s.labels
        for s in iter_samples(table.families())
        if s.name == "gpufeed_object_storage_read_bytes_total"
    }
    assert len(node) == MAX_OBJECT_TIERS
